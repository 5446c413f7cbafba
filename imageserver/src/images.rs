//! The image index: images recorded in the store (`images/<name>`), their trees kept as
//! objects like any file's bytes, so that everything an image needs is content-addressed.
//!
//! Invariants:
//! - An image record is written only after its objects and its tree object are durable
//!   (one syncfs), and only if no record of that name ever existed (compare-and-swap on
//!   absence): a deleted image leaves a tombstone and its name is never reused.
//! - Garbage collection never runs while an add is in flight (adds hold a shared lock, GC
//!   the exclusive one), so an object written for an image being added is never collected.
//! - Expired images are removed entirely (Dominator's rule), tombstone and all.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::Arc;

use paddock_image::image::check_name;
use paddock_image::{FileSystem, Filter, Image, ObjectId, Triggers};
use paddock_store::{Compare, Op, Store, Txn};
use serde::{Deserialize, Serialize};

use crate::ingest::{IngestError, IngestStats, ingest};
use crate::objects::{ObjectError, ObjectStore};

const PREFIX: &str = "images/";

/// What the store holds per image name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    pub name: String,
    /// The tree, as a JSON object in the object store. `None` for a deleted image.
    #[serde(default)]
    pub tree: Option<ObjectId>,
    #[serde(default)]
    pub filter: Option<Filter>,
    #[serde(default)]
    pub triggers: Triggers,
    pub created_on_ms: i64,
    #[serde(default)]
    pub created_by: String,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    #[serde(default)]
    pub files: u64,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub objects: u64,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub deleted_on_ms: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Name(#[from] paddock_image::image::BadImageName),
    #[error("image {0:?} already exists")]
    Exists(String),
    #[error("image name {0:?} belonged to a deleted image and cannot be used again")]
    NameRetired(String),
    #[error("no image {0:?}")]
    NotFound(String),
    #[error(
        "image {0:?} is not a sparse image and lacks {1:?} (every full image needs /etc, /etc/passwd, /usr and /usr/bin; add a filter-less image for a sparse one)"
    )]
    MissingRequired(String, String),
    #[error("the tarball was refused: {0}")]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("store: {0}")]
    Store(#[from] paddock_store::StoreError),
    #[error("image {0:?}: its tree object is missing or damaged: {1}")]
    Damaged(String, String),
    #[error("internal: {0}")]
    Internal(String),
}

/// The outcome of an add, for the CLI's summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AddSummary {
    pub name: String,
    pub stats: IngestStats,
    pub seconds: f64,
}

/// What `show` reports beyond the record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageDetail {
    pub record: ImageRecord,
    /// Objects only this image uses, and their bytes.
    pub unique_objects: u64,
    pub unique_bytes: u64,
    /// Objects other images use too, and their bytes.
    pub shared_objects: u64,
    pub shared_bytes: u64,
    pub missing_objects: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GcReport {
    pub deleted_objects: u64,
    pub deleted_bytes: u64,
    pub kept_objects: u64,
}

pub struct ImageServer {
    store: Arc<dyn Store>,
    objects: Arc<ObjectStore>,
    /// Adds share it, garbage collection takes it alone.
    gc: tokio::sync::RwLock<()>,
    /// Garbage collections waiting for adds in flight to finish.
    gc_waiting: tokio::sync::watch::Sender<usize>,
    trees: std::sync::Mutex<BTreeMap<ObjectId, Arc<FileSystem>>>,
    /// Objects kept alive by their owners ([`ImageServer::pin`]).
    pinned: std::sync::Mutex<BTreeMap<String, BTreeSet<ObjectId>>>,
}

pub type Result<T> = std::result::Result<T, ImageError>;

/// Counts a collection out of [`ImageServer::gc_waiting`] when it stops waiting (it got
/// the lock, or it was cancelled).
struct WaitingGc<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for WaitingGc<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// A full image (one with a filter) needs `/etc`, `/etc/passwd`, `/usr` and `/usr/bin`.
fn required_paths(name: &str, fs: &FileSystem) -> Result<()> {
    for (p, dir) in [
        ("/etc", true),
        ("/etc/passwd", false),
        ("/usr", true),
        ("/usr/bin", true),
    ] {
        match fs.get(p) {
            Some(i) if i.is_dir() == dir => {}
            _ => return Err(ImageError::MissingRequired(name.to_string(), p.to_string())),
        }
    }
    Ok(())
}

impl ImageServer {
    pub fn new(store: Arc<dyn Store>, objects: Arc<ObjectStore>) -> Arc<Self> {
        Arc::new(ImageServer {
            store,
            objects,
            gc: tokio::sync::RwLock::new(()),
            gc_waiting: tokio::sync::watch::Sender::new(0),
            trees: Default::default(),
            pinned: Default::default(),
        })
    }

    /// Keeps `objects` from garbage collection on `owner`'s behalf (replacing what it kept
    /// before): objects that no image names but something serves, such as machines'
    /// computed files.
    pub fn pin(&self, owner: &str, objects: BTreeSet<ObjectId>) {
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(owner.to_string(), objects);
    }

    pub fn objects(&self) -> &Arc<ObjectStore> {
        &self.objects
    }

    /// How many garbage collections are waiting for adds in flight to finish, as it
    /// changes (a hook: a test knows a collection is held back without sleeping).
    pub fn gc_waiting(&self) -> tokio::sync::watch::Receiver<usize> {
        self.gc_waiting.subscribe()
    }

    pub async fn record(&self, name: &str) -> Result<Option<ImageRecord>> {
        match self.store.get(&format!("{PREFIX}{name}")).await? {
            None => Ok(None),
            Some(kv) => serde_json::from_slice(&kv.value)
                .map(Some)
                .map_err(|e| ImageError::Internal(format!("image record {name}: {e}"))),
        }
    }

    /// Adds an image from a tarball (a blocking reader: call from a blocking context or
    /// through [`ImageServer::add_blocking`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn add(
        self: &Arc<Self>,
        name: String,
        tarball: Box<dyn Read + Send>,
        filter: Option<Filter>,
        triggers: Triggers,
        created_by: String,
        expires_at_ms: Option<i64>,
        progress: Box<dyn FnMut(&IngestStats) + Send>,
        now_ms: i64,
    ) -> Result<AddSummary> {
        check_name(&name)?;
        match self.record(&name).await? {
            Some(r) if r.deleted => return Err(ImageError::NameRetired(name)),
            Some(_) => return Err(ImageError::Exists(name)),
            None => {}
        }
        let _shared = self.gc.read().await;
        let started = std::time::Instant::now();
        let objects = self.objects.clone();
        let f = filter.clone();
        let mut progress = progress;
        let (fs, stats) = tokio::task::spawn_blocking(move || -> Result<_> {
            let (fs, stats) = ingest(tarball, &objects, f.as_ref(), &mut *progress)?;
            Ok((fs, stats))
        })
        .await
        .map_err(|e| ImageError::Internal(e.to_string()))??;
        if filter.is_some() {
            required_paths(&name, &fs)?;
        }
        let tree_json = serde_json::to_vec(&fs).map_err(|e| ImageError::Internal(e.to_string()))?;
        let tree = ObjectId::of(&tree_json);
        let objects = self.objects.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            objects.put(tree, &tree_json)?;
            objects.sync()?;
            Ok(())
        })
        .await
        .map_err(|e| ImageError::Internal(e.to_string()))??;
        let record = ImageRecord {
            name: name.clone(),
            tree: Some(tree),
            filter,
            triggers,
            created_on_ms: now_ms,
            created_by,
            expires_at_ms,
            files: stats.files + stats.hardlinks,
            bytes: fs.total_bytes(),
            objects: stats.objects,
            deleted: false,
            deleted_on_ms: None,
        };
        let key = format!("{PREFIX}{name}");
        let value = serde_json::to_vec(&record).map_err(|e| ImageError::Internal(e.to_string()))?;
        let created = self.store.create(&key, value).await?;
        if !created {
            return Err(match self.record(&name).await? {
                Some(r) if r.deleted => ImageError::NameRetired(name),
                _ => ImageError::Exists(name),
            });
        }
        self.trees
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tree, Arc::new(fs));
        tracing::info!(image = %name, files = stats.files, new_objects = stats.new_objects, "image added");
        Ok(AddSummary {
            name,
            stats,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Every record (deleted ones included, flagged).
    pub async fn list(&self) -> Result<Vec<ImageRecord>> {
        let mut out = Vec::new();
        for kv in self.store.range(PREFIX).await? {
            out.push(
                serde_json::from_slice(&kv.value)
                    .map_err(|e| ImageError::Internal(format!("{}: {e}", kv.key)))?,
            );
        }
        Ok(out)
    }

    async fn tree(&self, rec: &ImageRecord) -> Result<Arc<FileSystem>> {
        let id = rec
            .tree
            .ok_or_else(|| ImageError::NotFound(rec.name.clone()))?;
        if let Some(t) = self
            .trees
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
        {
            return Ok(t.clone());
        }
        let objects = self.objects.clone();
        let name = rec.name.clone();
        let fs = tokio::task::spawn_blocking(move || -> Result<FileSystem> {
            let mut bytes = Vec::new();
            objects
                .open_object(&id)
                .and_then(|mut f| {
                    f.read_to_end(&mut bytes).map_err(|e| ObjectError::Io {
                        path: id.path(),
                        source: e,
                    })
                })
                .map_err(|e| ImageError::Damaged(name.clone(), e.to_string()))?;
            if ObjectId::of(&bytes) != id {
                return Err(ImageError::Damaged(name, "hash mismatch".into()));
            }
            serde_json::from_slice(&bytes).map_err(|e| ImageError::Damaged(name, e.to_string()))
        })
        .await
        .map_err(|e| ImageError::Internal(e.to_string()))??;
        let fs = Arc::new(fs);
        self.trees
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, fs.clone());
        Ok(fs)
    }

    /// The whole image (tree, filter, triggers).
    pub async fn get(&self, name: &str) -> Result<Image> {
        let rec = self
            .record(name)
            .await?
            .filter(|r| !r.deleted)
            .ok_or_else(|| ImageError::NotFound(name.into()))?;
        let fs = self.tree(&rec).await?;
        Ok(Image {
            name: rec.name,
            fs: (*fs).clone(),
            filter: rec.filter,
            triggers: rec.triggers,
            created_on_ms: rec.created_on_ms,
            created_by: rec.created_by,
            expires_at_ms: rec.expires_at_ms,
        })
    }

    /// The record plus which objects are this image's alone and which are shared.
    pub async fn show(&self, name: &str) -> Result<ImageDetail> {
        check_name(name)?;
        let rec = self
            .record(name)
            .await?
            .ok_or_else(|| ImageError::NotFound(name.into()))?;
        let mine = if rec.deleted {
            BTreeMap::new()
        } else {
            self.tree(&rec).await?.objects()
        };
        let mut others: BTreeSet<ObjectId> = BTreeSet::new();
        for r in self.list().await? {
            if r.name != rec.name && !r.deleted {
                others.extend(self.tree(&r).await?.objects().into_keys());
            }
        }
        let mut d = ImageDetail {
            record: rec,
            unique_objects: 0,
            unique_bytes: 0,
            shared_objects: 0,
            shared_bytes: 0,
            missing_objects: 0,
        };
        for (id, size) in mine {
            if !self.objects.contains(&id) {
                d.missing_objects += 1;
            }
            if others.contains(&id) {
                d.shared_objects += 1;
                d.shared_bytes += size;
            } else {
                d.unique_objects += 1;
                d.unique_bytes += size;
            }
        }
        Ok(d)
    }

    /// Changes a live image's record with one compare-and-swap.
    async fn change_record(&self, name: &str, change: impl FnOnce(&mut ImageRecord)) -> Result<()> {
        let key = format!("{PREFIX}{name}");
        let kv = self
            .store
            .get(&key)
            .await?
            .ok_or_else(|| ImageError::NotFound(name.into()))?;
        let mut rec: ImageRecord =
            serde_json::from_slice(&kv.value).map_err(|e| ImageError::Internal(e.to_string()))?;
        if rec.deleted {
            return Err(ImageError::NotFound(name.into()));
        }
        change(&mut rec);
        let value = serde_json::to_vec(&rec).map_err(|e| ImageError::Internal(e.to_string()))?;
        let ok = self
            .store
            .txn(Txn {
                compare: vec![Compare::ModRevision {
                    key: key.clone(),
                    revision: kv.mod_revision,
                }],
                success: vec![Op::put(&key, value)],
                failure: vec![],
            })
            .await?
            .succeeded;
        if ok {
            Ok(())
        } else {
            Err(ImageError::Internal(format!(
                "image {name} changed meanwhile; try again"
            )))
        }
    }

    /// Deletes an image, leaving a tombstone: the name can never be used again.
    pub async fn delete(&self, name: &str, now_ms: i64) -> Result<()> {
        self.change_record(name, |rec| {
            rec.deleted = true;
            rec.deleted_on_ms = Some(now_ms);
            rec.tree = None;
        })
        .await?;
        tracing::info!(image = %name, "image deleted");
        Ok(())
    }

    /// Sets or clears an image's expiry.
    pub async fn set_expiry(&self, name: &str, expires_at_ms: Option<i64>) -> Result<()> {
        self.change_record(name, |rec| rec.expires_at_ms = expires_at_ms)
            .await
    }

    /// Removes images whose expiry has passed (entirely: an expired name may be reused).
    pub async fn expire(&self, now_ms: i64) -> Result<Vec<String>> {
        let mut gone = Vec::new();
        for kv in self.store.range(PREFIX).await? {
            let rec: ImageRecord = match serde_json::from_slice(&kv.value) {
                Ok(r) => r,
                Err(_) => continue,
            };
            if !rec.deleted && rec.expires_at_ms.is_some_and(|t| t <= now_ms) {
                let ok = self
                    .store
                    .txn(Txn {
                        compare: vec![Compare::ModRevision {
                            key: kv.key.clone(),
                            revision: kv.mod_revision,
                        }],
                        success: vec![Op::delete(&kv.key)],
                        failure: vec![],
                    })
                    .await?
                    .succeeded;
                if ok {
                    tracing::info!(image = %rec.name, "image expired");
                    gone.push(rec.name);
                }
            }
        }
        Ok(gone)
    }

    /// Deletes every object no image refers to. Waits for adds in flight to finish and
    /// keeps new ones out until it is done.
    pub async fn collect_garbage(&self) -> Result<GcReport> {
        let _alone = match self.gc.try_write() {
            Ok(alone) => alone,
            Err(_) => {
                self.gc_waiting.send_modify(|n| *n += 1);
                let _counted = WaitingGc(&self.gc_waiting);
                self.gc.write().await
            }
        };
        let mut live: BTreeSet<ObjectId> = self
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            .copied()
            .collect();
        for r in self.list().await? {
            if r.deleted {
                continue;
            }
            if let Some(t) = r.tree {
                live.insert(t);
            }
            live.extend(self.tree(&r).await?.objects().into_keys());
        }
        let objects = self.objects.clone();
        let report = tokio::task::spawn_blocking(move || -> Result<GcReport> {
            let mut rep = GcReport::default();
            for (id, size) in objects.list()? {
                if live.contains(&id) {
                    rep.kept_objects += 1;
                } else {
                    objects.delete(&id)?;
                    rep.deleted_objects += 1;
                    rep.deleted_bytes += size;
                }
            }
            Ok(rep)
        })
        .await
        .map_err(|e| ImageError::Internal(e.to_string()))??;
        self.trees
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| self.objects.contains(id));
        tracing::info!(
            deleted = report.deleted_objects,
            bytes = report.deleted_bytes,
            "objects collected"
        );
        Ok(report)
    }

    /// Re-reads every object of an image and reports the missing and damaged ones.
    pub async fn check(&self, name: &str) -> Result<Vec<(ObjectId, &'static str)>> {
        let img = self.get(name).await?;
        let objects = self.objects.clone();
        tokio::task::spawn_blocking(move || {
            let mut bad = Vec::new();
            for id in img.fs.objects().into_keys() {
                match objects.verify(&id) {
                    Ok(true) => {}
                    Ok(false) => bad.push((id, "damaged")),
                    Err(_) => bad.push((id, "missing")),
                }
            }
            bad
        })
        .await
        .map_err(|e| ImageError::Internal(e.to_string()))
    }
}
