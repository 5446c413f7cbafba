//! Rolling updates of image roles and of hook roles' versions: the shell around
//! `paddock_rollout`.
//!
//! When the applied spec names a new image for an image role whose instances run another,
//! the leader's role round starts a rollout (`rollouts/current/<role>`) from the image most
//! of them run (the last stable one) to the spec's. Every round, and every second while a
//! rollout runs, it observes the role's instances from the dominator's census (on which
//! image each machine is synced, and whether its health check after the update passed),
//! steps the rollout, and carries out its effects: a machine moved to a version gets that
//! required image in the MDB and in its instance record (so the role loop keeps counting
//! it), and the notes go to the machines' timelines. An ended rollout is kept under
//! `rollouts/history/<role>/<ms>`.
//!
//! A hook role's rollout moves instances, not machines: each instance's version is
//! recorded when the role loop starts it (`roles/versions/<role>/<instance>`, [`Versioned`])
//! and moved by running its stop hook with the old version and its start hook with the new
//! one; the instance is healthy on its version once it registered `up` after that
//! ([`observe_versions`]).
//!
//! The stored rollout changes only by compare-and-swap on its revision: an operator's
//! command (any host) and the leader's step (fenced) cannot overwrite each other; the loser
//! reads again. A new leader goes on from the stored state.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_dominator::{SubState, SubStatus};
use paddock_rollout::{Command, Instance, Rollout};
use paddock_store::{Compare, Op, Revision, Store, Txn};
use paddock_wire::ApiError;
use serde::{Deserialize, Serialize};

/// `rollouts/current/<role>`: the role's rollout, running or the last one.
pub const CURRENT: &str = "rollouts/current/";
/// `rollouts/history/<role>/<ms>`: ended rollouts, the newest [`HISTORY_KEPT`] per role.
pub const HISTORY: &str = "rollouts/history/";
const HISTORY_KEPT: usize = 20;
/// `<role>/<instance>` → [`Versioned`]: the version a hook role's instance was started on.
pub const VERSIONS: &str = "roles/versions/";

/// The version a hook role's instance runs, and since when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versioned {
    pub version: String,
    #[serde(default)]
    pub host: Option<String>,
    pub since_ms: i64,
}

/// A hook role's instances as a rollout sees them, each under its instance name (a hook
/// role's rollout moves instances): its recorded version; healthy once registered `up`
/// after it started on that version (a registration from before is the old version's).
/// `registered`: the role's registrations.
pub fn observe_versions(
    versions: &[(String, Versioned)],
    registered: &[crate::census::InstanceEntry],
) -> Vec<Instance> {
    versions
        .iter()
        .map(|(id, v)| Instance {
            host: id.clone(),
            version: Some(v.version.clone()),
            healthy: registered
                .iter()
                .any(|e| e.instance == *id && e.says_up() && e.since_ms >= v.since_ms),
        })
        .collect()
}

/// A role's rollout as stored, and the revision it was read at.
#[derive(Clone, Debug)]
pub struct Stored {
    pub rollout: Rollout,
    pub revision: Revision,
}

pub async fn load(store: &dyn Store, role: &str) -> anyhow::Result<Option<Stored>> {
    let Some(kv) = store.get(&format!("{CURRENT}{role}")).await? else {
        return Ok(None);
    };
    Ok(Some(Stored {
        rollout: serde_json::from_slice(&kv.value)?,
        revision: kv.mod_revision,
    }))
}

/// Every role's rollout, by role.
pub async fn load_all(store: &dyn Store) -> anyhow::Result<BTreeMap<String, Stored>> {
    let mut all = BTreeMap::new();
    for kv in store.range(CURRENT).await? {
        let Ok(rollout) = serde_json::from_slice::<Rollout>(&kv.value) else {
            tracing::warn!(key = %kv.key, "rollouts: a record that does not parse is skipped");
            continue;
        };
        let stored = Stored {
            rollout,
            revision: kv.mod_revision,
        };
        all.insert(kv.key[CURRENT.len()..].to_string(), stored);
    }
    Ok(all)
}

/// Writes `next` over the rollout read at `read` (absent: 0), with `fence` when the leader
/// writes, keeping it in the history once it has ended. `false`: someone wrote first.
pub async fn save(
    store: &dyn Store,
    next: &Rollout,
    read: Revision,
    fence: Option<Compare>,
    now_ms: i64,
) -> anyhow::Result<bool> {
    let key = format!("{CURRENT}{}", next.role);
    let mut txn = Txn::default();
    txn.compare.extend(fence);
    txn.compare.push(Compare::ModRevision {
        key: key.clone(),
        revision: read,
    });
    let value = serde_json::to_vec(next)?;
    txn.success.push(Op::put(key, value.clone()));
    if next.phase.ended() {
        let prefix = format!("{HISTORY}{}/", next.role);
        txn.success
            .push(Op::put(format!("{prefix}{now_ms:013}"), value));
        let kept = store.range(&prefix).await?;
        let extra = (kept.len() + 1).saturating_sub(HISTORY_KEPT);
        txn.success
            .extend(kept.iter().take(extra).map(|kv| Op::delete(kv.key.clone())));
    }
    Ok(store.txn(txn).await?.succeeded)
}

/// The image a role's instances mostly run (ties: the first by name): the version a
/// rollout starts from.
pub fn stable_image<'a>(images: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for i in images {
        *counts.entry(i).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    counts
        .into_iter()
        .find(|(_, n)| *n == most)
        .map(|(i, _)| i.to_string())
}

/// Whether a rollout of the role to `wanted` must start now, and from which image: when
/// some of its instances are on another image and no rollout to `wanted` is under way (a
/// rollout to an older spec's image is replaced, going on from its last stable image).
/// After a revert the role stays on its old image until a spec is applied again
/// (`applied`, after the reverted rollout started): the operator's word to try again.
pub fn to_start(
    wanted: &str,
    images: &[&str],
    current: Option<&Rollout>,
    applied: paddock_clock::UnixMs,
) -> Option<String> {
    if images.iter().all(|i| *i == wanted) {
        return None;
    }
    match current {
        Some(r) if r.to == wanted && !r.phase.ended() => None,
        Some(r)
            if r.to == wanted
                && r.phase == paddock_rollout::Phase::Reverted
                && applied <= r.started =>
        {
            None
        }
        Some(r) if !r.phase.ended() => Some(r.from.clone()),
        _ => stable_image(images.iter().copied().filter(|i| *i != wanted))
            .or_else(|| stable_image(images.iter().copied())),
    }
}

/// The role's instances as a rollout sees them: their hosts against the dominator's census. An instance runs the image its machine is synced to; it
/// is healthy when synced with no failed health check for that image (a machine with no
/// check configured is healthy once synced).
pub fn observe(hosts: &[&str], subs: &BTreeMap<String, SubStatus>) -> Vec<Instance> {
    hosts
        .iter()
        .map(|host| {
            let sub = subs.get(*host);
            let version = sub.and_then(|s| match &s.state {
                SubState::Synced { image } => Some(image.clone()),
                _ => None,
            });
            let healthy = version.as_ref().is_some_and(|v| {
                sub.and_then(|s| s.health.as_ref())
                    .is_none_or(|h| h.image != *v || h.passed)
            });
            Instance {
                host: host.to_string(),
                version,
                healthy,
            }
        })
        .collect()
}

pub fn router(store: Arc<dyn Store>) -> Router {
    Router::new()
        .route("/api/v1/rollouts", get(list))
        .route("/api/v1/rollouts/{role}", get(status))
        .route("/api/v1/rollouts/{role}/history", get(history))
        .route("/api/v1/rollouts/{role}/promote", post(promote))
        .route("/api/v1/rollouts/{role}/pause", post(pause))
        .route("/api/v1/rollouts/{role}/resume", post(resume))
        .route("/api/v1/rollouts/{role}/revert", post(revert))
        .with_state(store)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

async fn list(State(store): State<Arc<dyn Store>>) -> Result<Json<Vec<Rollout>>, ApiError> {
    let all = load_all(store.as_ref()).await.map_err(internal)?;
    Ok(Json(all.into_values().map(|s| s.rollout).collect()))
}

async fn status(
    State(store): State<Arc<dyn Store>>,
    Path(role): Path<String>,
) -> Result<Json<Rollout>, ApiError> {
    let stored = load(store.as_ref(), &role).await.map_err(internal)?;
    stored
        .map(|s| Json(s.rollout))
        .ok_or_else(|| ApiError::not_found(format!("role {role} has had no rollout")))
}

async fn history(
    State(store): State<Arc<dyn Store>>,
    Path(role): Path<String>,
) -> Result<Json<Vec<Rollout>>, ApiError> {
    let kvs = store
        .range(&format!("{HISTORY}{role}/"))
        .await
        .map_err(internal)?;
    Ok(Json(
        kvs.iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect(),
    ))
}

pub type Commanded = Result<Json<Rollout>, ApiError>;

async fn promote(State(store): State<Arc<dyn Store>>, Path(role): Path<String>) -> Commanded {
    command(store, role, Command::Promote).await
}

async fn pause(State(store): State<Arc<dyn Store>>, Path(role): Path<String>) -> Commanded {
    command(store, role, Command::Pause).await
}

async fn resume(State(store): State<Arc<dyn Store>>, Path(role): Path<String>) -> Commanded {
    command(store, role, Command::Resume).await
}

async fn revert(State(store): State<Arc<dyn Store>>, Path(role): Path<String>) -> Commanded {
    command(store, role, Command::Revert).await
}

/// An operator's command: the rollout after it (the leader acts on it at its next step);
/// 409 when the rollout's phase does not take it.
pub async fn command(store: Arc<dyn Store>, role: String, command: Command) -> Commanded {
    // A step of the leader may land between the read and the write: read again.
    for _ in 0..5 {
        let Some(mut stored) = load(store.as_ref(), &role).await.map_err(internal)? else {
            return Err(ApiError::not_found(format!("role {role} has no rollout")));
        };
        let now = paddock_clock::now();
        let notes = stored
            .rollout
            .command(command, now)
            .map_err(|e| ApiError::new(409, e.to_string()))?;
        let saved = save(
            store.as_ref(),
            &stored.rollout,
            stored.revision,
            None,
            now.0,
        )
        .await
        .map_err(internal)?;
        if saved {
            for n in notes {
                if let paddock_rollout::Effect::Note { text, .. } = n {
                    tracing::info!(%role, "rollout: {text}");
                }
            }
            return Ok(Json(stored.rollout));
        }
    }
    Err(ApiError::new(
        409,
        "the rollout kept changing under the command: try again",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(host: &str, state: SubState, health: Option<(&str, bool)>) -> (String, SubStatus) {
        let mut s = crate::dominator::test_sub(host, state);
        s.health = health.map(|(image, passed)| paddock_dominator::SubHealth {
            image: image.into(),
            passed,
            at_ms: 1,
        });
        (host.to_string(), s)
    }

    #[test]
    fn an_instance_is_healthy_when_synced_without_a_failed_check_for_its_image() {
        let synced = |i: &str| SubState::Synced { image: i.into() };
        let subs: BTreeMap<String, SubStatus> = [
            sub("h1", synced("a"), None),
            sub("h2", synced("b"), Some(("b", false))),
            sub("h3", synced("b"), Some(("b", true))),
            sub("h4", SubState::Updating, Some(("a", true))),
            // A check for an older image says nothing of this one.
            sub("h5", synced("b"), Some(("a", false))),
        ]
        .into_iter()
        .collect();
        let hosts = ["h1", "h2", "h3", "h4", "h5", "gone"];
        let seen: Vec<(Option<String>, bool)> = observe(&hosts, &subs)
            .into_iter()
            .map(|i| (i.version, i.healthy))
            .collect();
        let v = |s: &str| Some(s.to_string());
        assert_eq!(
            seen,
            [
                (v("a"), true),
                (v("b"), false),
                (v("b"), true),
                (None, false),
                (v("b"), true),
                (None, false)
            ]
        );
    }

    #[test]
    fn a_hook_instance_is_healthy_once_registered_up_after_its_version_started() {
        let versioned = |id: &str, version: &str, since_ms: i64| {
            let v = Versioned {
                version: version.into(),
                host: None,
                since_ms,
            };
            (id.to_string(), v)
        };
        let reg = |id: &str, status: Option<&str>, since_ms: i64| crate::census::InstanceEntry {
            role: "cache".into(),
            instance: id.into(),
            host: None,
            status: status.map(str::to_string),
            metrics: Default::default(),
            since_ms,
        };
        let versions = [
            versioned("cache-1", "7.2", 100),
            versioned("cache-2", "7.2", 100),
            versioned("cache-3", "7.2", 100),
            versioned("cache-4", "7.1", 100),
            versioned("cache-5", "7.2", 100),
        ];
        let registered = [
            reg("cache-1", None, 150),
            // Still the registration of the version before.
            reg("cache-2", None, 90),
            reg("cache-3", Some("starting"), 150),
            reg("cache-4", Some("up"), 100),
        ];
        let seen: Vec<(String, Option<String>, bool)> = observe_versions(&versions, &registered)
            .into_iter()
            .map(|i| (i.host, i.version, i.healthy))
            .collect();
        let row = |id: &str, v: &str, h: bool| (id.to_string(), Some(v.to_string()), h);
        assert_eq!(
            seen,
            [
                row("cache-1", "7.2", true),
                row("cache-2", "7.2", false),
                row("cache-3", "7.2", false),
                row("cache-4", "7.1", true),
                row("cache-5", "7.2", false),
            ]
        );
    }

    #[test]
    fn a_rollout_starts_when_the_spec_names_an_image_its_instances_do_not_run() {
        let p = paddock_rollout::Policy::default();
        let at = paddock_clock::UnixMs(1_000);
        let before = paddock_clock::UnixMs(500);
        assert_eq!(
            to_start("b", &["a", "a", "b"], None, before),
            Some("a".into())
        );
        assert_eq!(to_start("b", &["b", "b"], None, before), None, "all there");
        let running = Rollout::start("db", "a", "b", p.clone(), at);
        assert_eq!(to_start("b", &["a", "b"], Some(&running), before), None);
        // The spec moved on to c mid-rollout: a new one from the last stable image.
        let c = to_start("c", &["a", "b"], Some(&running), before);
        assert_eq!(c, Some("a".into()));
        // Reverted to a: the spec still says b, and nothing starts until it is applied
        // again (or changes).
        let mut reverted = running.clone();
        reverted.phase = paddock_rollout::Phase::Reverted;
        assert_eq!(to_start("b", &["a", "a"], Some(&reverted), before), None);
        assert_eq!(to_start("b", &["a", "a"], Some(&reverted), at), None);
        let again = paddock_clock::UnixMs(2_000);
        let retried = to_start("b", &["a", "a"], Some(&reverted), again);
        assert_eq!(retried, Some("a".into()));
        let c = to_start("c", &["a", "a"], Some(&reverted), before);
        assert_eq!(c, Some("a".into()));
        // Done to b, and now c.
        let mut done = running;
        done.phase = paddock_rollout::Phase::Done;
        let c = to_start("c", &["b", "b"], Some(&done), before);
        assert_eq!(c, Some("b".into()));
        assert_eq!(stable_image(["x", "y", "y"]), Some("y".into()));
    }
}
