//! The "computing" step, pure: a sub's tree and object cache against its required image
//! (and its planned image) → the update to send, the objects to fetch, the objects to clean
//! up, and the [`PlanSummary`] the state machine decides on.

use std::collections::BTreeSet;

use paddock_image::plan::{UpdateRequest, missing_objects, plan};
use paddock_image::{FileSystem, Image, ObjectId};

use crate::sub::{PlanSummary, fetch_need};

/// What one computation produced for one sub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Computed {
    pub summary: PlanSummary,
    /// The update that makes the sub equal its image (empty when it already is).
    pub request: UpdateRequest,
    /// Objects of the required image the sub lacks (fetched before the update).
    pub fetch: Vec<ObjectId>,
    /// Objects of the planned image the sub lacks (fetched ahead, no update).
    pub preload: Vec<ObjectId>,
    /// Objects in the sub's cache neither image needs.
    pub unused: Vec<ObjectId>,
}

/// Plans `sub` (its tree and cache) against `required`, and notes what `planned` would
/// need. `free_bytes` is what the sub reported free, if it did.
pub fn compute(
    sub: &FileSystem,
    cache: &BTreeSet<ObjectId>,
    required: &Image,
    planned: Option<&Image>,
    free_bytes: Option<u64>,
) -> Computed {
    let request = plan(sub, cache, required);
    let fetch: Vec<ObjectId> = missing_objects(sub, cache, required).into_iter().collect();
    let required_objects = required.fs.objects();
    let fetch_bytes = fetch_need(
        fetch
            .iter()
            .map(|o| required_objects.get(o).copied().unwrap_or(0)),
    );
    let preload: Vec<ObjectId> = planned
        .filter(|p| p.name != required.name)
        .map(|p| {
            p.fs.objects()
                .into_keys()
                .filter(|o| !cache.contains(o) && !required_objects.contains_key(o))
                .collect()
        })
        .unwrap_or_default();
    let planned_objects = planned.map(|p| p.fs.objects()).unwrap_or_default();
    let unused: Vec<ObjectId> = cache
        .iter()
        .filter(|o| !required_objects.contains_key(o) && !planned_objects.contains_key(o))
        .cloned()
        .collect();
    let summary = PlanSummary {
        image: required.name.clone(),
        empty: request.is_empty(),
        sparse: required.filter.is_none(),
        image_inodes: count(required.fs.inodes.len()),
        sub_inodes: count(sub.inodes.len()),
        deletions: count(request.paths_to_delete.len()),
        objects_to_fetch: count(fetch.len()),
        fetch_bytes,
        free_bytes,
        unused_cache_objects: count(unused.len()),
        planned_objects_to_fetch: count(preload.len()),
    };
    Computed {
        summary,
        request,
        fetch,
        preload,
        unused,
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::file;
    use paddock_image::{Filter, Triggers};

    fn tree(files: &[(&str, &str)]) -> FileSystem {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        for (path, content) in files {
            fs.insert(path, file(content)).unwrap();
        }
        fs
    }

    fn image(name: &str, files: &[(&str, &str)], sparse: bool) -> Image {
        Image {
            name: name.into(),
            fs: tree(files),
            filter: (!sparse).then(|| Filter::parse("").unwrap()),
            triggers: Triggers::default(),
            created_on_ms: 0,
            created_by: String::new(),
            expires_at_ms: None,
        }
    }

    fn id(content: &str) -> ObjectId {
        ObjectId::of(content.as_bytes())
    }

    #[test]
    fn an_equal_sub_plans_empty_and_a_drifted_one_fetches_only_what_it_lacks() {
        let img = image("m", &[("/a", "alpha"), ("/b", "beta")], false);
        let same = compute(&img.fs, &BTreeSet::new(), &img, None, None);
        assert!(same.summary.empty, "{:?}", same.request);
        assert!(same.fetch.is_empty());

        // /b drifted to other bytes; /a is right; "beta" is nowhere on the sub.
        let sub = tree(&[("/a", "alpha"), ("/b", "drift"), ("/extra", "x")]);
        let c = compute(&sub, &BTreeSet::new(), &img, None, Some(1 << 20));
        assert!(!c.summary.empty);
        assert_eq!(c.fetch, vec![id("beta")]);
        assert_eq!(
            (c.summary.objects_to_fetch, c.summary.fetch_bytes),
            (1, 4096)
        );
        assert_eq!(c.summary.deletions, 1, "{:?}", c.request.paths_to_delete);
        assert_eq!((c.summary.image_inodes, c.summary.sub_inodes), (3, 4));
        assert_eq!(c.summary.free_bytes, Some(1 << 20));
        // Already in the cache: nothing to fetch.
        let cache = BTreeSet::from([id("beta")]);
        assert!(compute(&sub, &cache, &img, None, None).fetch.is_empty());
    }

    #[test]
    fn the_planned_image_is_preloaded_and_the_cache_cleaned_of_what_neither_needs() {
        let required = image("m", &[("/a", "alpha")], false);
        let planned = image("next", &[("/a", "alpha"), ("/n", "new")], false);
        let cache = BTreeSet::from([id("stale"), id("new")]);
        let c = compute(&required.fs, &cache, &required, Some(&planned), None);
        assert!(c.summary.empty);
        assert_eq!(c.unused, vec![id("stale")]);
        assert!(c.preload.is_empty(), "already cached");
        let c = compute(
            &required.fs,
            &BTreeSet::new(),
            &required,
            Some(&planned),
            None,
        );
        assert_eq!(c.preload, vec![id("new")]);
        assert_eq!(c.summary.planned_objects_to_fetch, 1);
    }

    #[test]
    fn a_sparse_image_keeps_extras_and_says_so() {
        let img = image("s", &[("/a", "alpha")], true);
        let sub = tree(&[("/a", "alpha"), ("/mine", "keep")]);
        let c = compute(&sub, &BTreeSet::new(), &img, None, None);
        assert!(c.summary.sparse);
        assert!(c.summary.empty, "{:?}", c.request);
        assert_eq!(c.summary.deletions, 0);
    }
}
