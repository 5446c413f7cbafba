//! Rolling updates: a role's instances moved from one version (an image, or a hook role's
//! `version`) to the next a batch at a time, each batch gated on health, never taking the
//! role below its minimum of healthy instances; with canaries, pause, resume and a revert
//! that goes straight back to the last stable version.
//!
//! [`Rollout`] is a pure state machine with time passed in. Its inputs are what the shell
//! observes of the role's instances ([`Instance`]: on which version, healthy or not) and
//! operators' [`Command`]s; its outputs are [`Effect`]s: set a host's instance to a version,
//! and notes for the timelines. The whole state is plain data (serde), kept in the store by
//! the leader after every step, so a new leader goes on where the last one was.
//!
//! The phases:
//!
//! ```text
//! canary ──healthy──▶ promoting ──promote──▶ forward ──all healthy──▶ done
//!   │                    │                     │
//!   └──── failed batch ──┴─────────────────────┴──▶ paused ──resume──▶ (where it was)
//!              │ auto_revert, revert,                  │ max_paused
//!              ▼ or paused too long                    ▼
//!          reverting ──all back and healthy──▶ reverted      (a failed revert: failed)
//! ```
//!
//! - A batch is at most `max_parallel` instances (`canary` for the canaries), and only as
//!   many healthy ones as the healthy count may lose and stay at the minimum; instances
//!   that are not healthy anyway go first. With no room, the rollout waits and says why.
//! - An updated instance counts once it reports the target version, healthy, for
//!   `min_healthy`; a batch with an instance not healthy within `healthy_deadline` of its
//!   start fails, as does a batch while no progress (a healthy batch, a promotion, a resume)
//!   was made for `progress_deadline`. A failed batch pauses the rollout, or with
//!   `auto_revert` reverts it.
//! - A rollout paused for `max_paused` reverts by itself (at that instant, not before).
//! - Reverting takes every instance not back on the last stable version back, the ones not
//!   healthy all at once (they cost no capacity), the healthy ones in batches; no canary.
//! - A host that leaves the role leaves the rollout; a host that joins is started on
//!   [`Rollout::version_for_new`], the version the rollout has reached.

use std::collections::BTreeMap;
use std::time::Duration;

use paddock_clock::UnixMs;
use serde::{Deserialize, Serialize};

/// How a role is rolled: the role spec's `update` table. The names follow Nomad's `update`
/// block; Kubernetes' equivalents are in the README.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Instances updated at once (Kubernetes: `maxUnavailable`).
    pub max_parallel: u32,
    /// Instances updated first, alone, then held for promotion (0: none).
    pub canary: u32,
    /// How long an updated instance must stay healthy to count (Kubernetes:
    /// `minReadySeconds`).
    pub min_healthy_secs: u64,
    /// An updated instance not healthy this long after its batch started fails the batch.
    pub healthy_deadline_secs: u64,
    /// A batch in flight this long after the last progress fails (Kubernetes:
    /// `progressDeadlineSeconds`).
    pub progress_deadline_secs: u64,
    /// A failed batch reverts the rollout instead of pausing it.
    pub auto_revert: bool,
    /// Healthy canaries are promoted without an operator.
    pub auto_promote: bool,
    /// A rollout paused this long reverts by itself.
    pub max_paused_secs: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_parallel: 1,
            canary: 0,
            min_healthy_secs: 10,
            healthy_deadline_secs: 300,
            progress_deadline_secs: 600,
            auto_revert: true,
            auto_promote: false,
            max_paused_secs: 3_600,
        }
    }
}

impl Policy {
    /// What is wrong with it, if anything (each problem names its field).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.max_parallel == 0 {
            p.push("max_parallel: must be at least 1".to_string());
        }
        if self.healthy_deadline_secs <= self.min_healthy_secs {
            p.push(format!(
                "healthy_deadline_secs: {} must be longer than min_healthy_secs ({})",
                self.healthy_deadline_secs, self.min_healthy_secs
            ));
        }
        if self.progress_deadline_secs == 0 || self.max_paused_secs == 0 {
            p.push("progress_deadline_secs and max_paused_secs: must be at least 1".to_string());
        }
        p
    }

    fn min_healthy(&self) -> Duration {
        Duration::from_secs(self.min_healthy_secs)
    }

    fn healthy_deadline(&self) -> Duration {
        Duration::from_secs(self.healthy_deadline_secs)
    }

    fn progress_deadline(&self) -> Duration {
        Duration::from_secs(self.progress_deadline_secs)
    }

    fn max_paused(&self) -> Duration {
        Duration::from_secs(self.max_paused_secs)
    }
}

/// One of the role's instances as the shell sees it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub host: String,
    /// The version it runs (an image role: the image its machine is synced to); `None`
    /// when unknown.
    pub version: Option<String>,
    /// Registered up, and (an image role) its machine's health check passed.
    pub healthy: bool,
}

/// Where a paused rollout goes on when resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resume {
    Canary,
    Promoting,
    Forward,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// The canaries are being updated and watched.
    Canary,
    /// The canaries are healthy: waiting for `promote`.
    Promoting,
    /// The rest, a batch at a time.
    Forward,
    /// Held since `since` by an operator or, `failed`, by a failed batch.
    Paused {
        since: UnixMs,
        resume: Resume,
        failed: bool,
    },
    /// Back to the last stable version, a batch at a time.
    Reverting,
    /// Every instance on the new version, healthy.
    Done,
    /// Every instance back on the last stable version, healthy.
    Reverted,
    /// The revert itself failed: an operator must act (`revert` tries again).
    Failed,
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Canary => "canary",
            Phase::Promoting => "promoting",
            Phase::Forward => "forward",
            Phase::Paused { .. } => "paused",
            Phase::Reverting => "reverting",
            Phase::Done => "done",
            Phase::Reverted => "reverted",
            Phase::Failed => "failed",
        }
    }

    /// Whether the rollout has ended (nothing more happens by itself).
    pub fn ended(&self) -> bool {
        matches!(self, Phase::Done | Phase::Reverted)
    }
}

/// What an operator asks of a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    Promote,
    Pause,
    Resume,
    Revert,
}

/// What the shell is to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Move the instance on `host` to `version` (an image role: the machine's required
    /// image; a hook role: its hooks run again with the version). Repeated on every step
    /// until the host reports the version: applying it must be idempotent.
    Set { host: String, version: String },
    /// A line for the role's timeline, and the host's when it names one.
    Note { host: Option<String>, text: String },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    #[error("cannot {command} a rollout that is {phase}")]
    NotNow {
        command: &'static str,
        phase: &'static str,
    },
}

/// One role's rollout from `from` (its last stable version) to `to`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    pub role: String,
    pub from: String,
    pub to: String,
    pub policy: Policy,
    pub phase: Phase,
    pub started: UnixMs,
    /// The batch in flight: each host, and since when it has been healthy on the target.
    pub batch: BTreeMap<String, Option<UnixMs>>,
    /// When the batch in flight started.
    pub batch_started: Option<UnixMs>,
    /// Healthy batches so far, canaries and revert batches included.
    pub batches: u32,
    /// The last progress: the start, a healthy batch, a promotion, a resume, a revert.
    pub progress_at: UnixMs,
    /// Why it waits, paused or failed, for operators.
    pub why: Option<String>,
    /// The role's timeline of this rollout: every note, oldest first, the newest
    /// [`LOG_KEPT`].
    #[serde(default)]
    pub log: Vec<LogEntry>,
}

/// Notes a rollout keeps in its log.
pub const LOG_KEPT: usize = 200;

/// One note of a rollout's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub at: UnixMs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub text: String,
}

impl Rollout {
    pub fn start(role: &str, from: &str, to: &str, policy: Policy, now: UnixMs) -> Rollout {
        let phase = if policy.canary > 0 {
            Phase::Canary
        } else {
            Phase::Forward
        };
        Rollout {
            role: role.to_string(),
            from: from.to_string(),
            to: to.to_string(),
            policy,
            phase,
            started: now,
            batch: BTreeMap::new(),
            batch_started: None,
            batches: 0,
            progress_at: now,
            why: None,
            log: vec![LogEntry {
                at: now,
                host: None,
                text: format!("started: from {from} to {to}"),
            }],
        }
    }

    /// Keeps the notes of `effects` in the log.
    fn log_notes(&mut self, now: UnixMs, effects: &[Effect]) {
        for e in effects {
            if let Effect::Note { host, text } = e {
                self.log.push(LogEntry {
                    at: now,
                    host: host.clone(),
                    text: text.clone(),
                });
            }
        }
        let extra = self.log.len().saturating_sub(LOG_KEPT);
        self.log.drain(..extra);
    }

    /// The version the instances are being moved to now.
    pub fn target(&self) -> &str {
        match self.phase {
            Phase::Reverting | Phase::Reverted | Phase::Failed => &self.from,
            _ => &self.to,
        }
    }

    /// The version a host that joins the role now is started on: the new one once the
    /// canaries are promoted, the last stable one before and when going back.
    pub fn version_for_new(&self) -> &str {
        match &self.phase {
            Phase::Forward | Phase::Done => &self.to,
            Phase::Paused {
                resume: Resume::Forward,
                ..
            } => &self.to,
            _ => &self.from,
        }
    }

    /// Takes what the shell sees of the role's instances at `now`, and `min`, the fewest
    /// healthy instances the role may have: moves the rollout on, as far as it can now.
    pub fn step(&mut self, now: UnixMs, instances: &[Instance], min: u32) -> Vec<Effect> {
        let out = self.advance(now, instances, min);
        self.log_notes(now, &out);
        out
    }

    fn advance(&mut self, now: UnixMs, instances: &[Instance], min: u32) -> Vec<Effect> {
        let mut out = Vec::new();
        let seen: BTreeMap<&str, &Instance> =
            instances.iter().map(|i| (i.host.as_str(), i)).collect();
        let lost: Vec<String> = self
            .batch
            .keys()
            .filter(|h| !seen.contains_key(h.as_str()))
            .cloned()
            .collect();
        for host in lost {
            self.batch.remove(&host);
            note(&mut out, Some(&host), "left the role during its update");
        }
        match &self.phase {
            Phase::Paused { since, .. } => {
                if now.since(*since) < self.policy.max_paused() {
                    return out;
                }
                let why = format!(
                    "paused for {} s (max_paused_secs)",
                    self.policy.max_paused_secs
                );
                self.revert(now, &why, &mut out);
            }
            Phase::Promoting | Phase::Done | Phase::Reverted | Phase::Failed => return out,
            Phase::Canary | Phase::Forward | Phase::Reverting => {}
        }
        let target = self.target().to_string();
        for (host, since) in &mut self.batch {
            let on_target = seen
                .get(host.as_str())
                .is_some_and(|i| i.healthy && i.version.as_deref() == Some(target.as_str()));
            if on_target {
                since.get_or_insert(now);
            } else {
                *since = None;
            }
        }
        if !self.batch.is_empty() && !self.watch_batch(now, &target, &mut out) {
            return out;
        }
        if matches!(
            self.phase,
            Phase::Canary | Phase::Forward | Phase::Reverting
        ) {
            self.next_batch(now, instances, min, &mut out);
        }
        out
    }

    /// Whether the batch in flight is settled (healthy, or failed) so that the next may
    /// be chosen; re-asks for the hosts not yet on the target.
    fn watch_batch(&mut self, now: UnixMs, target: &str, out: &mut Vec<Effect>) -> bool {
        let min_healthy = self.policy.min_healthy();
        if self
            .batch
            .values()
            .all(|s| s.is_some_and(|t| now.since(t) >= min_healthy))
        {
            self.batches += 1;
            self.progress_at = now;
            let hosts: Vec<&str> = self.batch.keys().map(String::as_str).collect();
            let text = format!(
                "batch {} healthy on {target}: {}",
                self.batches,
                hosts.join(", ")
            );
            note(out, None, &text);
            self.batch.clear();
            self.batch_started = None;
            if self.phase == Phase::Canary {
                if self.policy.auto_promote {
                    self.phase = Phase::Forward;
                    note(out, None, "canaries healthy: promoted (auto_promote)");
                } else {
                    self.phase = Phase::Promoting;
                    self.why = Some("canaries healthy: waiting for promote".into());
                    note(out, None, "canaries healthy: waiting for promote");
                    return false;
                }
            }
            return true;
        }
        let started = self.batch_started.unwrap_or(now);
        let late = now.since(started) >= self.policy.healthy_deadline();
        let stalled = now.since(self.progress_at) >= self.policy.progress_deadline();
        if late || stalled {
            let unhealthy: Vec<&str> = self
                .batch
                .iter()
                .filter(|(_, s)| s.is_none_or(|t| now.since(t) < min_healthy))
                .map(|(h, _)| h.as_str())
                .collect();
            let why = format!(
                "{} not healthy on {target} within {} ({} s)",
                unhealthy.join(", "),
                if late {
                    "healthy_deadline_secs"
                } else {
                    "progress_deadline_secs"
                },
                if late {
                    self.policy.healthy_deadline_secs
                } else {
                    self.policy.progress_deadline_secs
                },
            );
            self.fail(now, &why, out);
            // A revert begins at once; a pause waits.
            return self.phase == Phase::Reverting;
        }
        for (host, _) in self.batch.iter().filter(|(_, s)| s.is_none()) {
            out.push(Effect::Set {
                host: host.clone(),
                version: target.to_string(),
            });
        }
        false
    }

    /// The next batch (none is in flight), or the end.
    fn next_batch(&mut self, now: UnixMs, instances: &[Instance], min: u32, out: &mut Vec<Effect>) {
        let target = self.target().to_string();
        let done = |i: &Instance| i.healthy && i.version.as_deref() == Some(target.as_str());
        let mut pending: Vec<&Instance> = instances
            .iter()
            .filter(|i| !done(i) && !self.batch.contains_key(&i.host))
            .collect();
        if pending.is_empty() {
            if self.batch.is_empty() {
                self.finish(out);
            }
            return;
        }
        // The ones down anyway first: they cost no capacity.
        pending.sort_by(|a, b| (a.healthy, &a.host).cmp(&(b.healthy, &b.host)));
        let healthy = instances.iter().filter(|i| i.healthy).count();
        let reverting = self.phase == Phase::Reverting;
        let size = match self.phase {
            Phase::Canary => self.policy.canary,
            _ => self.policy.max_parallel,
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let min = usize::try_from(min).unwrap_or(usize::MAX);
        let mut room = healthy.saturating_sub(min);
        let mut chosen = Vec::new();
        for i in pending {
            // Going back, every instance not healthy goes at once: none may stay bad.
            let free = !i.healthy && reverting;
            if !free && chosen.len() >= size {
                continue;
            }
            if i.healthy {
                if room == 0 {
                    continue;
                }
                room -= 1;
            }
            chosen.push(i.host.clone());
        }
        if chosen.is_empty() {
            let why = format!(
                "waiting: {healthy} healthy, and the role's minimum is {min}: \
                 updating one more would go below it"
            );
            if self.why.as_deref() != Some(why.as_str()) {
                note(out, None, &why);
            }
            self.why = Some(why);
            return;
        }
        // Going back, the reason stays (it is why the rollout is going back).
        if !reverting {
            self.why = None;
        }
        let phase = self.phase.name();
        for host in chosen {
            note(out, Some(&host), &format!("{phase}: to {target}"));
            out.push(Effect::Set {
                host: host.clone(),
                version: target.clone(),
            });
            self.batch.insert(host, None);
        }
        self.batch_started = Some(now);
    }

    fn finish(&mut self, out: &mut Vec<Effect>) {
        self.phase = match self.phase {
            Phase::Reverting => Phase::Reverted,
            _ => {
                self.why = None;
                Phase::Done
            }
        };
        let text = format!(
            "{}: every instance healthy on {}",
            self.phase.name(),
            self.target()
        );
        note(out, None, &text);
    }

    /// A failed batch: pause, or revert with `auto_revert`; a failed revert stops.
    fn fail(&mut self, now: UnixMs, why: &str, out: &mut Vec<Effect>) {
        match self.phase {
            Phase::Reverting => {
                self.phase = Phase::Failed;
                self.why = Some(format!("the revert failed: {why}"));
                note(out, None, &format!("failed: the revert failed: {why}"));
            }
            _ if self.policy.auto_revert => self.revert(now, why, out),
            _ => {
                self.pause(now, true);
                self.why = Some(format!("paused: {why}"));
                note(out, None, &format!("paused: {why}"));
            }
        }
    }

    fn pause(&mut self, now: UnixMs, failed: bool) {
        let resume = match self.phase {
            Phase::Canary => Resume::Canary,
            Phase::Promoting => Resume::Promoting,
            _ => Resume::Forward,
        };
        self.phase = Phase::Paused {
            since: now,
            resume,
            failed,
        };
    }

    fn revert(&mut self, now: UnixMs, why: &str, out: &mut Vec<Effect>) {
        self.phase = Phase::Reverting;
        self.batch.clear();
        self.batch_started = None;
        self.progress_at = now;
        self.why = Some(format!("reverting to {}: {why}", self.from));
        note(out, None, &format!("reverting to {}: {why}", self.from));
    }

    /// An operator's command at `now`; what it changed is on the next [`Rollout::step`].
    pub fn command(&mut self, command: Command, now: UnixMs) -> Result<Vec<Effect>, RolloutError> {
        let mut out = Vec::new();
        let refuse = |name| RolloutError::NotNow {
            command: name,
            phase: self.phase.name(),
        };
        match (command, &self.phase) {
            (Command::Promote, Phase::Promoting) => {
                self.phase = Phase::Forward;
                self.progress_at = now;
                self.why = None;
                note(&mut out, None, "promoted");
            }
            (Command::Pause, Phase::Canary | Phase::Promoting | Phase::Forward) => {
                self.pause(now, false);
                self.why = Some("paused by an operator".into());
                note(&mut out, None, "paused by an operator");
            }
            (Command::Resume, Phase::Paused { resume, .. }) => {
                self.phase = match resume {
                    Resume::Canary => Phase::Canary,
                    Resume::Promoting => Phase::Promoting,
                    Resume::Forward => Phase::Forward,
                };
                // A fresh start for the batch in flight (a failed one is tried again).
                self.progress_at = now;
                if !self.batch.is_empty() {
                    self.batch_started = Some(now);
                }
                self.why = None;
                note(&mut out, None, "resumed");
            }
            (
                Command::Revert,
                Phase::Canary
                | Phase::Promoting
                | Phase::Forward
                | Phase::Paused { .. }
                | Phase::Failed,
            ) => self.revert(now, "asked by an operator", &mut out),
            (Command::Promote, _) => return Err(refuse("promote")),
            (Command::Pause, _) => return Err(refuse("pause")),
            (Command::Resume, _) => return Err(refuse("resume")),
            (Command::Revert, _) => return Err(refuse("revert")),
        }
        self.log_notes(now, &out);
        Ok(out)
    }

    /// When [`Rollout::step`] next has something to do by the clock alone (a batch's
    /// healthy time, a deadline, the pause's end); `None` when only observations or
    /// commands move it.
    pub fn next_wake(&self) -> Option<UnixMs> {
        let p = &self.policy;
        match &self.phase {
            Phase::Paused { since, .. } => Some(since.after(p.max_paused())),
            Phase::Canary | Phase::Forward | Phase::Reverting if !self.batch.is_empty() => {
                let started = self.batch_started.unwrap_or(self.progress_at);
                let healthy = self
                    .batch
                    .values()
                    .filter_map(|s| s.map(|t| t.after(p.min_healthy())))
                    .max();
                [
                    Some(started.after(p.healthy_deadline())),
                    Some(self.progress_at.after(p.progress_deadline())),
                    healthy,
                ]
                .into_iter()
                .flatten()
                .min()
            }
            _ => None,
        }
    }
}

fn note(out: &mut Vec<Effect>, host: Option<&str>, text: &str) {
    out.push(Effect::Note {
        host: host.map(str::to_string),
        text: text.to_string(),
    });
}
