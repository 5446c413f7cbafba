//! One sub's state machine (Dominator's `dom/herd/sub.go`), pure: the shell feeds it an
//! [`Event`] with the time and what the MDB and the operator want ([`Desired`]), and it
//! answers with the [`Action`] to take. At most one action is outstanding per sub; until its
//! result arrives, ticks answer [`Action::Wait`].
//!
//! The cycle: poll (with the generation of the tree last seen, so the tree travels only when
//! it changed) → plan against the required image → fetch what the sub lacks → wait for a
//! scan newer than the fetch → update → wait for a scan newer than the update → poll and
//! plan again, which proves the sub equals its image (an empty plan: synced). A synced sub
//! is polled every `poll_interval_ms`; a change of its tree or of its required image starts
//! the cycle again. An update that runs a high-impact or reboot trigger first asks whether
//! the machine may be disrupted now (when the herd has a check): a denial holds the sub,
//! which asks again after `disruption_retry_ms` without planning again while its tree stays
//! the same. Failures back off per sub, doubling from `backoff_min_ms` to
//! `backoff_max_ms` with jitter (so that subs a network outage failed together do not come
//! back together); other subs are not slowed. An unreachable sub is polled again after a
//! quarter of the time it has been unreachable (within the same bounds): a machine that
//! rebooted, for an update or into its installed system, is polled within a quarter more
//! of its downtime once its subd is back, not after a doubled delay as long as the outage.

use std::fmt;
use std::time::Duration;

use paddock_clock::Backoff;
use serde::{Deserialize, Serialize};

/// What the MDB and the operator want of this sub now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// The MDB's RequiredImage; none: the sub is left alone.
    pub required_image: Option<String>,
    /// The MDB's PlannedImage: its objects are fetched ahead once the sub is synced.
    pub planned_image: Option<String>,
    /// The MDB's DisableUpdates, or this sub paused by an operator (the reason).
    pub updates_disabled: Option<String>,
    /// The MDB tag `DisableSafetyCheck`.
    pub disable_safety_check: bool,
    /// The whole dominator is paused (the reason).
    pub paused: Option<String>,
    /// The MDB tag `ForceDisruptiveUpdate`: a disruptive update is not asked about.
    pub force_disruption: bool,
    /// Its computed files, laid over the required image (none: the image alone).
    pub computed: Option<std::sync::Arc<crate::overlay::Overlay>>,
}

/// The timing every sub follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Between polls of a sub with nothing to do.
    pub poll_interval_ms: u64,
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
    /// Updates in a row that leave the sub still different from its image before the sub
    /// is put in error (something on the machine undoes them).
    pub max_update_attempts: u32,
    /// A disruption check is configured: an update with a high-impact or reboot trigger
    /// asks it first.
    pub check_disruption: bool,
    /// After a denial, the wait before asking again.
    pub disruption_retry_ms: u64,
}

impl Policy {
    /// A sub's backoff; a fresh one per sub, each drawing its own jitter.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.backoff_min_ms),
            Duration::from_millis(self.backoff_max_ms),
        )
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            poll_interval_ms: 1_000,
            backoff_min_ms: 1_000,
            backoff_max_ms: 300_000,
            max_update_attempts: 3,
            check_disruption: false,
            disruption_retry_ms: 60_000,
        }
    }
}

/// What a poll answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollAnswer {
    /// 0 before the sub's first scan.
    pub generation: u64,
    /// Complete scans since the sub started.
    pub scan_count: u64,
    /// A fetch, update or cleanup is running on the sub (someone else's, or an earlier one).
    pub busy: bool,
    /// The sub's newest scan predates its last update: its tree is not the one that update
    /// left (a plan from it would redo the update with objects it consumed).
    pub stale: bool,
}

/// What the shell learnt planning the sub against its image (`paddock_image::plan`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanSummary {
    pub image: String,
    /// The sub already equals the image.
    pub empty: bool,
    /// The image has no filter (extra files are kept; no safety check).
    pub sparse: bool,
    pub image_inodes: u64,
    pub sub_inodes: u64,
    /// Paths the update would delete.
    pub deletions: u64,
    /// Objects the sub must fetch, and their bytes each rounded up to 4 KiB
    /// ([`fetch_need`]).
    pub objects_to_fetch: u64,
    pub fetch_bytes: u64,
    /// Free bytes of the sub's file system, when it said.
    pub free_bytes: Option<u64>,
    /// Objects in the sub's cache that neither its required nor its planned image needs.
    pub unused_cache_objects: u64,
    /// Objects of the planned image the sub does not hold yet.
    pub planned_objects_to_fetch: u64,
    /// The planned image `planned_objects_to_fetch` (and the preload list) was computed
    /// for: another planned image needs another plan.
    pub planned_image: Option<String>,
    /// The update runs a high-impact or reboot trigger.
    pub disruptive: bool,
}

/// What the disruption check answered for one sub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// The update may go on (what the check said, if anything).
    Permitted(String),
    /// Not now (why).
    Denied(String),
}

/// The bytes `sizes` take on the sub's file system: each rounded up to 4 KiB.
pub fn fetch_need(sizes: impl IntoIterator<Item = u64>) -> u64 {
    sizes
        .into_iter()
        .map(|s| s.div_ceil(4096).saturating_mul(4096))
        .fold(0u64, u64::saturating_add)
}

/// Dominator's safety rule: an image with fewer than half the sub's inodes, or an update
/// deleting more than half of them, is held until an operator clears it. The reason, if so.
pub fn unsafe_reason(p: &PlanSummary) -> Option<String> {
    if p.sub_inodes == 0 {
        return None;
    }
    if p.image_inodes.saturating_mul(2) < p.sub_inodes {
        return Some(format!(
            "image {} has {} inodes, fewer than half of the sub's {}",
            p.image, p.image_inodes, p.sub_inodes
        ));
    }
    if p.deletions.saturating_mul(2) > p.sub_inodes {
        return Some(format!(
            "the update to {} would delete {} of the sub's {} inodes, more than half",
            p.image, p.deletions, p.sub_inodes
        ));
    }
    None
}

/// What happened to the sub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Time passed (and, maybe, the MDB or the operator changed [`Desired`]).
    Tick,
    Polled(PollAnswer),
    PollFailed(String),
    /// The required image is not on the image server.
    ImageMissing(String),
    Planned(PlanSummary),
    PlanFailed(String),
    /// A fetch or an update the sub queued was given its slot and started.
    Started,
    /// A queued fetch or update still waits, now for this (an update slot, the share of
    /// high-impact updates).
    StillQueued(String),
    Fetched,
    FetchFailed(String),
    Updated,
    UpdateFailed(String),
    CleanedUp,
    CleanupFailed(String),
    /// An operator cleared the safety hold (`paddock sub clear-safety`).
    ClearSafety,
    /// The disruption check answered.
    Disruption(Disruption),
    /// Its computed files cannot be laid over its image (a path the image filters, a
    /// directory in the way): held like a file that could not be made.
    ComputedMissing(String),
}

/// What the shell does next for this sub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the given time (or until the outstanding action's result arrives).
    Wait,
    /// `Subd.Poll` with this generation (0: the tree is wanted whatever its generation);
    /// after a fetch or an update, the answer waits for a scan numbered above
    /// `wait_for_scan_after`.
    Poll {
        have_generation: u64,
        wait_for_scan_after: Option<u64>,
    },
    /// Plan the sub's tree against this image.
    Plan { image: String },
    /// Have the sub fetch the objects it lacks for this image (`preload`: the planned
    /// image, ahead of any update).
    Fetch { image: String, preload: bool },
    /// `Subd.Update` with the plan for this image.
    Update { image: String },
    /// `Subd.Cleanup`: remove the cache objects neither image needs.
    Cleanup,
    /// Ask the disruption check whether the update to this image may disrupt the machine.
    AskDisruption { image: String },
}

/// Where the sub stands, with the reason an operator needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SubState {
    /// Not polled yet, or no scan on the sub yet.
    Polling,
    Unreachable {
        error: String,
    },
    Computing,
    /// A fetch or an update is ready and waits for its turn (`step`: `fetch` or `update`;
    /// `waiting_for`: an update slot, or the share of high-impact updates). Only subs
    /// that hold a slot show fetching or updating.
    Queued {
        step: String,
        objects: u64,
        bytes: u64,
        waiting_for: String,
    },
    Fetching {
        objects: u64,
        bytes: u64,
    },
    /// A fetch or an update finished; the next plan needs a scan that saw it.
    WaitingForScan {
        after_scan: u64,
    },
    Updating,
    /// The update runs a high-impact or reboot trigger: the disruption check is asked.
    AskingDisruption,
    /// The disruption check said not now; it is asked again later.
    DisruptionDenied {
        reason: String,
    },
    Synced {
        image: String,
    },
    UnsafeUpdate {
        reason: String,
    },
    NotEnoughSpace {
        need: u64,
        free: u64,
    },
    UpdatesDisabled {
        reason: String,
    },
    ImageMissing {
        image: String,
    },
    /// A computed file could not be made: nothing of the update runs until it can.
    MissingComputedFile {
        reason: String,
    },
    /// The MDB names no required image for it.
    NoImage,
    Error {
        message: String,
    },
}

impl SubState {
    /// The state's name, as metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            SubState::Polling => "polling",
            SubState::Unreachable { .. } => "unreachable",
            SubState::Computing => "computing",
            SubState::Queued { .. } => "queued",
            SubState::Fetching { .. } => "fetching",
            SubState::WaitingForScan { .. } => "waiting_for_scan",
            SubState::Updating => "updating",
            SubState::AskingDisruption => "asking_disruption",
            SubState::DisruptionDenied { .. } => "disruption_denied",
            SubState::Synced { .. } => "synced",
            SubState::UnsafeUpdate { .. } => "unsafe_update",
            SubState::NotEnoughSpace { .. } => "not_enough_space",
            SubState::UpdatesDisabled { .. } => "updates_disabled",
            SubState::ImageMissing { .. } => "image_missing",
            SubState::MissingComputedFile { .. } => "missing_computed_file",
            SubState::NoImage => "no_image",
            SubState::Error { .. } => "error",
        }
    }
}

impl fmt::Display for SubState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubState::Polling => write!(f, "polling"),
            SubState::Unreachable { error } => write!(f, "unreachable: {error}"),
            SubState::Computing => write!(f, "computing the update"),
            SubState::Queued {
                step,
                objects,
                bytes,
                waiting_for,
            } => {
                if step == "fetch" {
                    write!(
                        f,
                        "queued to fetch {objects} objects ({bytes} bytes), waiting for {waiting_for}"
                    )
                } else {
                    write!(f, "queued to {step}, waiting for {waiting_for}")
                }
            }
            SubState::Fetching { objects, bytes } => {
                write!(f, "fetching {objects} objects ({bytes} bytes)")
            }
            SubState::WaitingForScan { after_scan } => {
                write!(f, "waiting for a scan after scan {after_scan}")
            }
            SubState::Updating => write!(f, "updating"),
            SubState::AskingDisruption => {
                write!(f, "asking whether the update may disrupt the machine")
            }
            SubState::DisruptionDenied { reason } => write!(f, "disruption denied: {reason}"),
            SubState::Synced { image } => write!(f, "synced to {image}"),
            SubState::UnsafeUpdate { reason } => {
                write!(f, "unsafe update held until cleared: {reason}")
            }
            SubState::NotEnoughSpace { need, free } => write!(
                f,
                "not enough free space: the update needs {need} bytes, the sub has {free}"
            ),
            SubState::UpdatesDisabled { reason } => write!(f, "updates disabled: {reason}"),
            SubState::ImageMissing { image } => {
                write!(f, "image {image} is not on the image server")
            }
            SubState::MissingComputedFile { reason } => {
                write!(f, "missing computed file: {reason}")
            }
            SubState::NoImage => write!(f, "no required image in the MDB"),
            SubState::Error { message } => write!(f, "error: {message}"),
        }
    }
}

/// The outstanding action, so that its result is read in context.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pending {
    Poll,
    Plan,
    Fetch { preload: Option<String> },
    Update,
    Cleanup,
    Disruption { image: String },
}

/// One sub. Small and of fixed size: the sub's tree is the shell's, held only while a plan
/// needs it.
#[derive(Clone, Debug)]
pub struct Sub {
    state: SubState,
    pending: Option<Pending>,
    /// The generation of the tree last planned (0: none).
    generation: u64,
    scan_count: u64,
    /// The image the sub was last proved equal to, at `generation`.
    synced_image: Option<String>,
    next_at_ms: u64,
    failures: u32,
    /// When polls began to fail (cleared by an answer).
    unreachable_since_ms: Option<u64>,
    /// The delays after failures; reset by a sync. Handed in by the shell ([`Policy::backoff`])
    /// so that the state machine itself never reads a clock or a random source.
    backoff: Backoff,
    update_attempts: u32,
    safety_cleared: bool,
    /// The planned image whose objects were fetched ahead.
    preloaded: Option<String>,
    /// The planned image the last plan computed the preload for.
    planned_for: Option<String>,
    /// Cleanup done since the last sync.
    cleaned: bool,
    /// What is wanted changed (or an operator cleared a hold) since the last plan: a held
    /// sub is planned again even if its tree did not change.
    replan: bool,
    /// The first error of the last update (a file's check that failed, a path that could
    /// not be made), for the error state when updates in a row do not take.
    last_update_error: Option<String>,
    /// Since when the sub's answers come before its first scan (a subd that has just
    /// started); cleared by an answer after one.
    unscanned_since_ms: Option<u64>,
}

/// How long a sub that has not scanned yet is polled every quarter second: a subd that has
/// just started on a new root (a birth's) scans it in moments, and its dominator should
/// not wait a whole poll interval to plan; one whose first scan takes longer (a full root
/// after a reboot) is polled at the usual pace after this.
const FIRST_SCAN_QUICK_MS: u64 = 2_000;

impl Sub {
    pub fn new(backoff: Backoff) -> Self {
        Sub {
            state: SubState::Polling,
            pending: None,
            generation: 0,
            scan_count: 0,
            synced_image: None,
            next_at_ms: 0,
            failures: 0,
            unreachable_since_ms: None,
            backoff,
            update_attempts: 0,
            safety_cleared: false,
            preloaded: None,
            planned_for: None,
            cleaned: false,
            replan: false,
            last_update_error: None,
            unscanned_since_ms: None,
        }
    }

    pub fn state(&self) -> &SubState {
        &self.state
    }

    /// When the sub next wants a tick (the shell may tick earlier; it costs nothing).
    pub fn next_at_ms(&self) -> u64 {
        self.next_at_ms
    }

    /// An action is outstanding.
    pub fn busy(&self) -> bool {
        self.pending.is_some()
    }

    /// Consecutive failures.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// What the last update's report said went wrong, if anything (told before its
    /// [`Event::Updated`]).
    pub fn note_update_error(&mut self, error: Option<String>) {
        self.last_update_error = error;
    }

    /// The MDB or an operator changed what is wanted: act at the next tick, not after the
    /// poll interval.
    pub fn desired_changed(&mut self, now_ms: u64) {
        self.next_at_ms = self.next_at_ms.min(now_ms);
        self.replan = true;
    }

    /// Held by a pause, the safety rule or a missing computed file, with nothing new to
    /// decide: its tree need not travel again until it changes or what is wanted does.
    fn held(&self) -> bool {
        !self.replan
            && matches!(
                self.state,
                SubState::UpdatesDisabled { .. }
                    | SubState::UnsafeUpdate { .. }
                    | SubState::MissingComputedFile { .. }
            )
    }

    /// Denied a disruption, with nothing new to decide: the same plan is asked about
    /// again, so its tree need not travel.
    fn denied(&self) -> bool {
        !self.replan && matches!(self.state, SubState::DisruptionDenied { .. })
    }

    /// A failure: counted, and the sub waits `delay` before it tries again.
    fn fail_for(&mut self, state: SubState, delay: Duration, now_ms: u64) -> Action {
        self.failures = self.failures.saturating_add(1);
        self.state = state;
        let delay = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.next_at_ms = now_ms.saturating_add(delay);
        Action::Wait
    }

    /// A failed step: the doubling backoff.
    fn fail(&mut self, state: SubState, now_ms: u64) -> Action {
        let delay = self.backoff.next_delay();
        self.fail_for(state, delay, now_ms)
    }

    /// A failed poll: the next after a quarter of the outage so far.
    fn unreachable(&mut self, error: String, now_ms: u64) -> Action {
        // Whatever answers next has started again: its first scan is timed from then.
        self.unscanned_since_ms = None;
        let since = *self.unreachable_since_ms.get_or_insert(now_ms);
        let delay = self
            .backoff
            .after_outage(Duration::from_millis(now_ms.saturating_sub(since)));
        self.fail_for(SubState::Unreachable { error }, delay, now_ms)
    }

    fn wait(&mut self, now_ms: u64, p: &Policy) -> Action {
        self.next_at_ms = now_ms.saturating_add(p.poll_interval_ms);
        Action::Wait
    }

    /// After a fetch or an update: poll at once, and go on only from a scan made after it.
    fn wait_for_scan(&mut self, now_ms: u64) -> Action {
        self.state = SubState::WaitingForScan {
            after_scan: self.scan_count,
        };
        self.next_at_ms = now_ms;
        Action::Wait
    }

    fn start(&mut self, pending: Pending, action: Action) -> Action {
        self.pending = Some(pending);
        action
    }

    /// Feeds one event; answers what to do next.
    pub fn handle(&mut self, event: Event, want: &Desired, now_ms: u64, p: &Policy) -> Action {
        match event {
            Event::Tick => self.tick(want, now_ms, p),
            Event::Polled(a) => {
                self.pending = None;
                self.unreachable_since_ms = None;
                self.polled(a, want, now_ms, p)
            }
            Event::PollFailed(error) => {
                self.pending = None;
                self.unreachable(error, now_ms)
            }
            Event::ImageMissing(image) => {
                self.pending = None;
                self.fail(SubState::ImageMissing { image }, now_ms)
            }
            Event::ComputedMissing(reason) => {
                self.pending = None;
                let generation = self.generation;
                self.computed_missing(reason, generation, now_ms, p)
            }
            Event::Planned(plan) => {
                self.pending = None;
                self.planned(plan, want, now_ms, p)
            }
            Event::PlanFailed(message)
            | Event::FetchFailed(message)
            | Event::UpdateFailed(message)
            | Event::CleanupFailed(message) => {
                self.pending = None;
                self.fail(SubState::Error { message }, now_ms)
            }
            Event::Started => {
                if let SubState::Queued {
                    step,
                    objects,
                    bytes,
                    ..
                } = &self.state
                {
                    self.state = if step == "fetch" {
                        SubState::Fetching {
                            objects: *objects,
                            bytes: *bytes,
                        }
                    } else {
                        SubState::Updating
                    };
                }
                Action::Wait
            }
            Event::StillQueued(reason) => {
                if let SubState::Queued { waiting_for, .. } = &mut self.state {
                    *waiting_for = reason;
                }
                Action::Wait
            }
            Event::Fetched => match self.pending.take() {
                Some(Pending::Fetch {
                    preload: Some(image),
                }) => {
                    self.preloaded = Some(image);
                    self.wait(now_ms, p)
                }
                _ => self.wait_for_scan(now_ms),
            },
            Event::Updated => {
                self.pending = None;
                self.wait_for_scan(now_ms)
            }
            Event::CleanedUp => {
                self.pending = None;
                self.cleaned = true;
                self.wait(now_ms, p)
            }
            Event::Disruption(answer) => {
                let Some(Pending::Disruption { image }) = self.pending.take() else {
                    return Action::Wait;
                };
                match answer {
                    Disruption::Permitted(_) => self.queue_update(image, now_ms, p),
                    Disruption::Denied(reason) => {
                        // A hold, not a failure: the sub is fine and asks again later.
                        self.state = SubState::DisruptionDenied { reason };
                        self.next_at_ms = now_ms.saturating_add(p.disruption_retry_ms);
                        Action::Wait
                    }
                }
            }
            Event::ClearSafety => {
                self.safety_cleared = true;
                self.replan = true;
                if matches!(self.state, SubState::UnsafeUpdate { .. }) {
                    self.next_at_ms = now_ms;
                }
                Action::Wait
            }
        }
    }

    fn tick(&mut self, want: &Desired, now_ms: u64, p: &Policy) -> Action {
        if self.pending.is_some() || now_ms < self.next_at_ms {
            return Action::Wait;
        }
        if want.required_image.is_none() {
            // Nothing to keep it on: not even polled (a machine enrolled but not yet
            // given an image, whose subd may not run).
            self.state = SubState::NoImage;
            self.synced_image = None;
            return self.wait(now_ms, p);
        }
        if matches!(
            self.state,
            SubState::Unreachable { .. } | SubState::Error { .. }
        ) {
            self.state = SubState::Polling;
        }
        // The tree is wanted whatever its generation when it will be planned against an
        // image it was not last planned against (the shell keeps no tree of a synced sub).
        let synced = !self.replan
            && self.synced_image.is_some()
            && self.synced_image == want.required_image
            && self.planned_for == want.planned_image
            && matches!(self.state, SubState::Synced { .. });
        let have_generation = if synced || self.held() || self.denied() {
            self.generation
        } else {
            0
        };
        let wait_for_scan_after = match self.state {
            SubState::WaitingForScan { after_scan } => Some(after_scan),
            _ => None,
        };
        self.start(
            Pending::Poll,
            Action::Poll {
                have_generation,
                wait_for_scan_after,
            },
        )
    }

    fn polled(&mut self, a: PollAnswer, want: &Desired, now_ms: u64, p: &Policy) -> Action {
        if matches!(self.state, SubState::Unreachable { .. }) {
            self.state = SubState::Polling;
        }
        if a.busy {
            // Someone's fetch or update is running.
            self.scan_count = a.scan_count;
            return self.wait(now_ms, p);
        }
        if a.generation == 0 {
            // Not scanned yet: see FIRST_SCAN_QUICK_MS.
            self.scan_count = a.scan_count;
            let since = *self.unscanned_since_ms.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) < FIRST_SCAN_QUICK_MS {
                self.next_at_ms = now_ms.saturating_add(p.poll_interval_ms.min(250));
                return Action::Wait;
            }
            return self.wait(now_ms, p);
        }
        self.unscanned_since_ms = None;
        // No plan from a tree older than our own fetch or update, nor from one older than
        // the sub's last update (whoever made it, and whether or not its answer arrived).
        let waiting = matches!(
            self.state,
            SubState::WaitingForScan { after_scan } if a.scan_count <= after_scan
        );
        if waiting || a.stale {
            self.scan_count = a.scan_count;
            self.next_at_ms = now_ms.saturating_add(p.poll_interval_ms.min(250));
            return Action::Wait;
        }
        self.scan_count = a.scan_count;
        let Some(image) = want.required_image.clone() else {
            self.state = SubState::NoImage;
            self.synced_image = None;
            return self.wait(now_ms, p);
        };
        if a.generation == self.generation && self.held() {
            return self.wait(now_ms, p);
        }
        if a.generation == self.generation && self.denied() {
            return self.start(
                Pending::Disruption {
                    image: image.clone(),
                },
                Action::AskDisruption { image },
            );
        }
        if let Some(reason) = want.computed.as_ref().and_then(|c| c.missing.clone()) {
            return self.computed_missing(reason, a.generation, now_ms, p);
        }
        // A new planned image needs a new plan too: the preload list is the plan's, and
        // new computed files need one (`replan`).
        let unchanged = !self.replan
            && a.generation == self.generation
            && self.synced_image.as_deref() == Some(image.as_str())
            && self.planned_for == want.planned_image
            && matches!(self.state, SubState::Synced { .. });
        if unchanged {
            if let Some(planned) = &want.planned_image
                && planned != &image
                && self.preloaded.as_ref() != Some(planned)
                && want.paused.is_none()
            {
                let planned = planned.clone();
                return self.start(
                    Pending::Fetch {
                        preload: Some(planned.clone()),
                    },
                    Action::Fetch {
                        image: planned,
                        preload: true,
                    },
                );
            }
            return self.wait(now_ms, p);
        }
        self.generation = a.generation;
        self.replan = false;
        self.state = SubState::Computing;
        self.start(Pending::Plan, Action::Plan { image })
    }

    /// Held until the file can be made: what is wanted changes when it can.
    fn computed_missing(
        &mut self,
        reason: String,
        generation: u64,
        now_ms: u64,
        p: &Policy,
    ) -> Action {
        self.generation = generation;
        self.replan = false;
        self.synced_image = None;
        self.state = SubState::MissingComputedFile { reason };
        self.wait(now_ms, p)
    }

    fn planned(&mut self, plan: PlanSummary, want: &Desired, now_ms: u64, p: &Policy) -> Action {
        self.planned_for = plan.planned_image.clone();
        if plan.empty {
            if self.synced_image.as_ref() != Some(&plan.image) {
                self.cleaned = false;
            }
            self.synced_image = Some(plan.image.clone());
            self.state = SubState::Synced { image: plan.image };
            self.failures = 0;
            self.backoff.reset();
            self.update_attempts = 0;
            self.last_update_error = None;
            self.safety_cleared = false;
            if plan.unused_cache_objects > 0 && !self.cleaned && want.paused.is_none() {
                return self.start(Pending::Cleanup, Action::Cleanup);
            }
            return self.wait(now_ms, p);
        }
        self.synced_image = None;
        if let Some(reason) = &want.paused {
            self.state = SubState::UpdatesDisabled {
                reason: format!("the dominator is paused: {reason}"),
            };
            return self.wait(now_ms, p);
        }
        if let Some(reason) = &want.updates_disabled {
            self.state = SubState::UpdatesDisabled {
                reason: reason.clone(),
            };
            return self.wait(now_ms, p);
        }
        if !plan.sparse
            && !want.disable_safety_check
            && !self.safety_cleared
            && let Some(reason) = unsafe_reason(&plan)
        {
            self.state = SubState::UnsafeUpdate { reason };
            return self.wait(now_ms, p);
        }
        if plan.objects_to_fetch > 0 {
            if let Some(free) = plan.free_bytes
                && plan.fetch_bytes > free
            {
                self.state = SubState::NotEnoughSpace {
                    need: plan.fetch_bytes,
                    free,
                };
                return self.wait(now_ms, p);
            }
            self.state = SubState::Queued {
                step: "fetch".into(),
                objects: plan.objects_to_fetch,
                bytes: plan.fetch_bytes,
                waiting_for: "an update slot".into(),
            };
            return self.start(
                Pending::Fetch { preload: None },
                Action::Fetch {
                    image: plan.image,
                    preload: false,
                },
            );
        }
        if plan.disruptive && p.check_disruption && !want.force_disruption {
            // Asked after the fetch, right before the update: the objects are in place
            // whatever the answer, and the machine is disrupted only when permitted.
            self.state = SubState::AskingDisruption;
            let image = plan.image;
            return self.start(
                Pending::Disruption {
                    image: image.clone(),
                },
                Action::AskDisruption { image },
            );
        }
        self.queue_update(plan.image, now_ms, p)
    }

    /// Queues the update, unless updates in a row failed to make the sub its image.
    fn queue_update(&mut self, image: String, now_ms: u64, p: &Policy) -> Action {
        self.update_attempts = self.update_attempts.saturating_add(1);
        if self.update_attempts > p.max_update_attempts {
            self.update_attempts = 0;
            let last = self.last_update_error.take();
            return self.fail(
                SubState::Error {
                    message: match last {
                        Some(e) => format!(
                            "the sub still differs from {image} after {} updates; the last \
                             said: {e}",
                            p.max_update_attempts
                        ),
                        None => format!(
                            "the sub still differs from {image} after {} updates",
                            p.max_update_attempts
                        ),
                    },
                },
                now_ms,
            );
        }
        self.state = SubState::Queued {
            step: "update".into(),
            objects: 0,
            bytes: 0,
            waiting_for: "an update slot".into(),
        };
        self.start(Pending::Update, Action::Update { image })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy {
        poll_interval_ms: 1_000,
        backoff_min_ms: 1_000,
        backoff_max_ms: 8_000,
        max_update_attempts: 2,
        check_disruption: false,
        disruption_retry_ms: 60_000,
    };

    /// With a disruption check, asked again 5 s after a denial.
    const CHECKED: Policy = Policy {
        check_disruption: true,
        disruption_retry_ms: 5_000,
        ..P
    };

    fn want(image: &str) -> Desired {
        Desired {
            required_image: Some(image.to_string()),
            ..Desired::default()
        }
    }

    fn answer(generation: u64, scan_count: u64) -> Event {
        Event::Polled(PollAnswer {
            generation,
            scan_count,
            busy: false,
            stale: false,
        })
    }

    fn plan(image: &str) -> PlanSummary {
        PlanSummary {
            image: image.to_string(),
            image_inodes: 100,
            sub_inodes: 100,
            ..PlanSummary::default()
        }
    }

    fn synced(image: &str) -> PlanSummary {
        PlanSummary {
            empty: true,
            ..plan(image)
        }
    }

    fn update_of(image: &str, deletions: u64, objects: u64, bytes: u64) -> PlanSummary {
        PlanSummary {
            deletions,
            objects_to_fetch: objects,
            fetch_bytes: bytes,
            free_bytes: Some(1 << 30),
            ..plan(image)
        }
    }

    /// A new sub ticked at 0, then answered at `at` with generation `generation` (scan
    /// `scan`): next, its tree is planned.
    fn answered(want: &Desired, generation: u64, scan: u64, at: u64) -> Sub {
        let mut s = Sub::new(P.backoff());
        s.handle(Event::Tick, want, 0, &P);
        s.handle(answer(generation, scan), want, at, &P);
        s
    }

    /// Runs `steps` (event, time, expected action, expected state name) from a new sub.
    fn run(sub: &mut Sub, want: &Desired, steps: &[(Event, u64, Action, &str)]) {
        for (i, (event, now, action, state)) in steps.iter().enumerate() {
            let got = sub.handle(event.clone(), want, *now, &P);
            assert_eq!(&got, action, "step {i}: {event:?} at {now}");
            assert_eq!(
                sub.state().name(),
                *state,
                "step {i}: {event:?} → {}",
                sub.state()
            );
        }
    }

    fn poll(g: u64) -> Action {
        Action::Poll {
            have_generation: g,
            wait_for_scan_after: None,
        }
    }

    /// A poll whose answer waits for a scan numbered above `after`.
    fn poll_after(g: u64, after: u64) -> Action {
        Action::Poll {
            have_generation: g,
            wait_for_scan_after: Some(after),
        }
    }

    fn plan_a(image: &str) -> Action {
        Action::Plan {
            image: image.to_string(),
        }
    }

    #[test]
    fn a_drifted_sub_is_fetched_updated_and_proved_synced() {
        let w = want("minbase2");
        let mut s = Sub::new(P.backoff());
        run(
            &mut s,
            &w,
            &[
                (Event::Tick, 0, poll(0), "polling"),
                (Event::Tick, 10, Action::Wait, "polling"), // one action at a time
                (answer(7, 3), 20, plan_a("minbase2"), "computing"),
                (
                    Event::Planned(update_of("minbase2", 4, 12, 90_000)),
                    30,
                    Action::Fetch {
                        image: "minbase2".into(),
                        preload: false,
                    },
                    // Ready, but only a sub holding an update slot shows fetching.
                    "queued",
                ),
                (Event::StillQueued("x".into()), 32, Action::Wait, "queued"),
                (Event::Tick, 35, Action::Wait, "queued"),
                (Event::Started, 36, Action::Wait, "fetching"),
                (Event::Fetched, 40, Action::Wait, "waiting_for_scan"),
                // The poll's answer waits on the sub for a scan after the fetch.
                (Event::Tick, 40, poll_after(0, 3), "waiting_for_scan"),
                // None came within the sub's wait (or an older sub did not wait): ask again
                // soon.
                (answer(8, 3), 50, Action::Wait, "waiting_for_scan"),
                (Event::Tick, 300, poll_after(0, 3), "waiting_for_scan"),
                (answer(8, 4), 310, plan_a("minbase2"), "computing"),
                (
                    Event::Planned(update_of("minbase2", 4, 0, 0)),
                    320,
                    Action::Update {
                        image: "minbase2".into(),
                    },
                    "queued",
                ),
                (Event::Started, 330, Action::Wait, "updating"),
                (Event::Updated, 400, Action::Wait, "waiting_for_scan"),
                (Event::Tick, 400, poll_after(0, 4), "waiting_for_scan"),
                (answer(9, 5), 410, plan_a("minbase2"), "computing"),
                (
                    Event::Planned(synced("minbase2")),
                    420,
                    Action::Wait,
                    "synced",
                ),
                // Synced: short polls with the generation, every interval.
                (Event::Tick, 1_000, Action::Wait, "synced"),
                (Event::Tick, 1_420, poll(9), "synced"),
                (answer(9, 6), 1_430, Action::Wait, "synced"),
                // A file changed by hand: a new generation → plan again.
                (Event::Tick, 2_430, poll(9), "synced"),
                (answer(10, 7), 2_440, plan_a("minbase2"), "computing"),
            ],
        );
    }

    #[test]
    fn a_new_required_image_is_picked_up_at_once_and_the_tree_is_asked_for() {
        let mut s = Sub::new(P.backoff());
        let a = want("minbase");
        run(
            &mut s,
            &a,
            &[
                (Event::Tick, 0, poll(0), "polling"),
                (answer(5, 1), 1, plan_a("minbase"), "computing"),
                (Event::Planned(synced("minbase")), 2, Action::Wait, "synced"),
            ],
        );
        let b = want("minbase2");
        s.desired_changed(500);
        run(
            &mut s,
            &b,
            &[
                (Event::Tick, 500, poll(0), "synced"),
                (answer(5, 2), 510, plan_a("minbase2"), "computing"),
            ],
        );
    }

    #[test]
    fn safety_holds_big_deletions_and_small_images_until_cleared() {
        // More than half deleted.
        let w = want("tiny");
        let mut s = answered(&w, 1, 1, 1);
        let a = s.handle(Event::Planned(update_of("tiny", 51, 0, 0)), &w, 2, &P);
        assert_eq!(a, Action::Wait);
        assert!(
            matches!(s.state(), SubState::UnsafeUpdate { reason } if reason.contains("delete 51 of the sub's 100")),
            "{}",
            s.state()
        );
        // Exactly half is allowed.
        assert_eq!(unsafe_reason(&update_of("x", 50, 0, 0)), None);
        // An image with fewer than half the sub's inodes.
        let small = PlanSummary {
            image_inodes: 49,
            ..plan("tiny")
        };
        assert!(unsafe_reason(&small).unwrap().contains("fewer than half"));
        // Polls go on; cleared, the next plan goes through.
        assert_eq!(s.handle(Event::ClearSafety, &w, 3, &P), Action::Wait);
        assert_eq!(s.next_at_ms(), 3);
        assert_eq!(s.handle(Event::Tick, &w, 3, &P), poll(0));
        assert_eq!(s.handle(answer(1, 2), &w, 4, &P), plan_a("tiny"));
        assert_eq!(
            s.handle(Event::Planned(update_of("tiny", 51, 0, 0)), &w, 5, &P),
            Action::Update {
                image: "tiny".into()
            }
        );
        // Sparse images and the DisableSafetyCheck tag skip the check.
        for (sparse, tag) in [(true, false), (false, true)] {
            let w = Desired {
                disable_safety_check: tag,
                ..want("tiny")
            };
            let mut s = answered(&w, 1, 1, 1);
            let p = PlanSummary {
                sparse,
                ..update_of("tiny", 90, 0, 0)
            };
            assert_eq!(
                s.handle(Event::Planned(p), &w, 2, &P),
                Action::Update {
                    image: "tiny".into()
                }
            );
        }
    }

    #[test]
    fn a_held_sub_is_not_replanned_until_its_tree_or_what_is_wanted_changes() {
        let paused = Desired {
            paused: Some("freeze".into()),
            ..want("m")
        };
        let mut s = answered(&paused, 4, 1, 0);
        s.handle(Event::Planned(update_of("m", 1, 0, 0)), &paused, 0, &P);
        assert_eq!(s.state().name(), "updates_disabled");
        // Polled with its generation; unchanged, it stays held without a plan.
        assert_eq!(s.handle(Event::Tick, &paused, 1_000, &P), poll(4));
        assert_eq!(s.handle(answer(4, 2), &paused, 1_000, &P), Action::Wait);
        assert_eq!(s.state().name(), "updates_disabled");
        // Its tree changed: planned again.
        s.handle(Event::Tick, &paused, 2_000, &P);
        assert_eq!(s.handle(answer(5, 3), &paused, 2_000, &P), plan_a("m"));
        s.handle(Event::Planned(update_of("m", 1, 0, 0)), &paused, 2_000, &P);
        // Resumed: the tree is asked for and planned at once.
        let resumed = want("m");
        s.desired_changed(2_500);
        assert_eq!(s.handle(Event::Tick, &resumed, 2_500, &P), poll(0));
        assert_eq!(s.handle(answer(5, 4), &resumed, 2_500, &P), plan_a("m"));
        assert_eq!(
            s.handle(Event::Planned(update_of("m", 1, 0, 0)), &resumed, 2_500, &P),
            Action::Update { image: "m".into() }
        );
    }

    #[test]
    fn a_missing_computed_file_holds_the_sub_until_it_can_be_made_and_new_files_replan() {
        let file = |content: &[u8]| crate::overlay::ComputedFile {
            object: paddock_image::ObjectId::of(content),
            size: 3,
            mode: 0o644,
            uid: 0,
            gid: 0,
            check: None,
        };
        let with = |missing: Option<&str>, content: &[u8]| Desired {
            computed: Some(std::sync::Arc::new(crate::overlay::Overlay {
                files: [("/etc/hostname".to_string(), file(content))].into(),
                missing: missing.map(str::to_string),
            })),
            ..want("m")
        };
        let held = with(Some("app.conf.j2:3: undefined variable vars.port"), b"a\n");
        let mut s = answered(&held, 4, 1, 0);
        assert_eq!(s.state().name(), "missing_computed_file");
        assert_eq!(
            s.state().to_string(),
            "missing computed file: app.conf.j2:3: undefined variable vars.port"
        );
        // Unchanged, it stays held and its tree does not travel again.
        assert_eq!(s.handle(Event::Tick, &held, 60_000, &P), poll(4));
        assert_eq!(s.handle(answer(4, 2), &held, 60_000, &P), Action::Wait);
        // The file can be made: planned at once, updated, synced.
        let ok = with(None, b"a\n");
        s.desired_changed(61_000);
        assert_eq!(s.handle(Event::Tick, &ok, 61_000, &P), poll(0));
        assert_eq!(s.handle(answer(4, 3), &ok, 61_000, &P), plan_a("m"));
        s.handle(Event::Planned(synced("m")), &ok, 61_000, &P);
        assert_eq!(s.state().name(), "synced");
        // New content for a file, same image: the synced sub's tree is planned again.
        let changed = with(None, b"b\n");
        s.desired_changed(62_000);
        assert_eq!(s.handle(Event::Tick, &changed, 62_000, &P), poll(0));
        assert_eq!(s.handle(answer(4, 4), &changed, 62_000, &P), plan_a("m"));
        // Files that cannot be laid over the image (found while planning) hold it too.
        let why = "/var/log/x is filtered by image m's filter line \"/var/log/.*\"";
        s.handle(Event::ComputedMissing(why.into()), &changed, 62_100, &P);
        assert_eq!(s.state().name(), "missing_computed_file");
        assert_eq!(s.handle(Event::Tick, &changed, 123_000, &P), poll(4));
    }

    fn disruptive(image: &str) -> PlanSummary {
        PlanSummary {
            disruptive: true,
            ..update_of(image, 1, 0, 0)
        }
    }

    fn ask(image: &str) -> Action {
        Action::AskDisruption {
            image: image.to_string(),
        }
    }

    #[test]
    fn a_disruptive_update_waits_while_denied_and_goes_on_once_permitted() {
        let w = want("m2");
        let (c, u) = (&CHECKED, Action::Update { image: "m2".into() });
        let mut s = Sub::new(P.backoff());
        s.handle(Event::Tick, &w, 0, c);
        s.handle(answer(7, 1), &w, 0, c);
        // Asked before the update, after any fetch.
        assert_eq!(
            s.handle(Event::Planned(disruptive("m2")), &w, 10, c),
            ask("m2")
        );
        assert_eq!(s.state().name(), "asking_disruption");
        assert_eq!(
            s.handle(Event::Tick, &w, 20, c),
            Action::Wait,
            "one at a time"
        );
        let no = Event::Disruption(Disruption::Denied("maintenance window closed".into()));
        assert_eq!(s.handle(no.clone(), &w, 100, c), Action::Wait);
        assert_eq!(
            s.state(),
            &SubState::DisruptionDenied {
                reason: "maintenance window closed".into()
            }
        );
        assert_eq!(s.failures(), 0, "a denial is a hold, not a failure");
        // Asked again only after the retry wait; the unchanged tree is not sent nor planned.
        assert_eq!(s.handle(Event::Tick, &w, 5_099, c), Action::Wait);
        assert_eq!(s.handle(Event::Tick, &w, 5_100, c), poll(7));
        assert_eq!(s.handle(answer(7, 2), &w, 5_100, c), ask("m2"));
        assert_eq!(
            s.state().name(),
            "disruption_denied",
            "no new state per retry"
        );
        assert_eq!(s.handle(no, &w, 5_200, c), Action::Wait);
        assert_eq!(s.handle(Event::Tick, &w, 10_200, c), poll(7));
        assert_eq!(s.handle(answer(7, 3), &w, 10_200, c), ask("m2"));
        let yes = Event::Disruption(Disruption::Permitted(String::new()));
        assert_eq!(s.handle(yes, &w, 10_300, c), u);
        assert_eq!(s.state().name(), "queued");
        assert_eq!(s.handle(Event::Started, &w, 10_300, c), Action::Wait);
        assert_eq!(s.state().name(), "updating");
        assert_eq!(s.handle(Event::Updated, &w, 10_400, c), Action::Wait);
        assert_eq!(s.state().name(), "waiting_for_scan");
    }

    #[test]
    fn only_a_disruptive_update_under_a_check_asks_and_the_mdb_can_force_it() {
        let u = Action::Update { image: "m2".into() };
        let forced = Desired {
            force_disruption: true,
            ..want("m2")
        };
        for (policy, w, plan, asks) in [
            (&CHECKED, want("m2"), update_of("m2", 1, 0, 0), false),
            (&P, want("m2"), disruptive("m2"), false),
            (&CHECKED, forced, disruptive("m2"), false),
            (&CHECKED, want("m2"), disruptive("m2"), true),
        ] {
            let mut s = answered(&w, 1, 1, 1);
            let want_action = if asks { ask("m2") } else { u.clone() };
            assert_eq!(
                s.handle(Event::Planned(plan.clone()), &w, 2, policy),
                want_action,
                "{plan:?} check {}",
                policy.check_disruption
            );
        }
    }

    #[test]
    fn a_denied_sub_plans_again_when_its_tree_or_its_image_changes() {
        let w = want("m2");
        let c = &CHECKED;
        let mut s = answered(&w, 1, 1, 1);
        s.handle(Event::Planned(disruptive("m2")), &w, 2, c);
        let no = Event::Disruption(Disruption::Denied("no".into()));
        s.handle(no.clone(), &w, 3, c);
        // The tree changed meanwhile: planned again (the plan may no longer disrupt).
        assert_eq!(s.handle(Event::Tick, &w, 5_003, c), poll(1));
        assert_eq!(s.handle(answer(2, 2), &w, 5_003, c), plan_a("m2"));
        assert_eq!(
            s.handle(Event::Planned(update_of("m2", 1, 0, 0)), &w, 5_004, c),
            Action::Update { image: "m2".into() }
        );
        // Denied, then the MDB names another image: planned at once against it.
        let mut s = answered(&w, 1, 1, 1);
        s.handle(Event::Planned(disruptive("m2")), &w, 2, c);
        s.handle(no, &w, 3, c);
        let w3 = want("m3");
        s.desired_changed(4);
        assert_eq!(s.handle(Event::Tick, &w3, 4, c), poll(0));
        assert_eq!(s.handle(answer(1, 2), &w3, 4, c), plan_a("m3"));
        // Denials in a row do not count as updates that did not stick.
        let mut s = answered(&w, 1, 1, 1);
        for i in 0..5u64 {
            let t = i * 10_000;
            if i > 0 {
                s.handle(Event::Tick, &w, t, c);
                assert_eq!(s.handle(answer(1, 1 + i), &w, t, c), ask("m2"), "retry {i}");
            } else {
                assert_eq!(
                    s.handle(Event::Planned(disruptive("m2")), &w, t, c),
                    ask("m2")
                );
            }
            s.handle(
                Event::Disruption(Disruption::Denied("no".into())),
                &w,
                t + 1,
                c,
            );
        }
        assert_eq!(s.state().name(), "disruption_denied");
    }

    #[test]
    fn objects_that_do_not_fit_are_not_fetched() {
        let w = want("big");
        let mut s = answered(&w, 1, 1, 1);
        let p = PlanSummary {
            free_bytes: Some(8_191),
            ..update_of("big", 0, 2, 8_192)
        };
        assert_eq!(s.handle(Event::Planned(p), &w, 2, &P), Action::Wait);
        assert_eq!(
            s.state(),
            &SubState::NotEnoughSpace {
                need: 8_192,
                free: 8_191
            }
        );
        assert_eq!(s.next_at_ms(), 1_002);
        // Rounded to 4 KiB each: 1 byte and 4,097 bytes take 12 KiB.
        assert_eq!(fetch_need([1, 4_097, 0]), 12_288);
    }

    #[test]
    fn failures_back_off_per_sub_and_a_sync_resets_them() {
        let w = want("minbase");
        let mut s = Sub::new(P.backoff());
        let mut now = 0;
        s.handle(Event::Tick, &w, now, &P);
        assert_eq!(s.handle(answer(3, 1), &w, now, &P), plan_a("minbase"));
        for step in [1_000, 2_000, 4_000, 8_000, 8_000] {
            assert_eq!(
                s.handle(Event::FetchFailed("no route".into()), &w, now, &P),
                Action::Wait
            );
            assert_eq!(s.state().name(), "error");
            // Doubling up to the cap, each delay jittered within [step/2, step].
            let delay = s.next_at_ms() - now;
            assert!(
                (step / 2..=step).contains(&delay),
                "{delay} ms outside [{}, {step}]",
                step / 2
            );
            assert_eq!(s.handle(Event::Tick, &w, now + delay - 1, &P), Action::Wait);
            now += delay;
            assert_eq!(s.handle(Event::Tick, &w, now, &P), poll(0));
            assert_eq!(s.handle(answer(3, 1), &w, now, &P), plan_a("minbase"));
        }
        assert_eq!(s.failures(), 5);
        s.handle(Event::Planned(synced("minbase")), &w, now, &P);
        assert_eq!(s.failures(), 0);
        assert_eq!(s.state().to_string(), "synced to minbase");
    }

    /// A synced machine reboots: its polls fail for the 50 s it is down, each retry after a
    /// quarter of the downtime so far (at least 1 s, at most the 8 s cap here), so its
    /// subd is polled at most a quarter of the outage after it is back.
    #[test]
    fn an_unreachable_sub_is_polled_again_after_a_quarter_of_its_downtime() {
        let w = want("minbase");
        let policy = Policy {
            backoff_max_ms: 300_000,
            ..P
        };
        let mut s = Sub::new(policy.backoff());
        s.handle(Event::Tick, &w, 0, &policy);
        s.handle(answer(3, 1), &w, 0, &policy);
        s.handle(Event::Planned(synced("minbase")), &w, 0, &policy);
        let down_at = 1_000;
        let back_at = 51_000;
        let mut now = down_at;
        let mut tries = 0;
        while now < back_at {
            let action = s.handle(Event::Tick, &w, now, &policy);
            assert!(
                matches!(action, Action::Poll { .. }),
                "at {now}: {action:?}"
            );
            s.handle(
                Event::PollFailed("connection refused".into()),
                &w,
                now,
                &policy,
            );
            assert_eq!(s.state().name(), "unreachable");
            let step = ((now - down_at) / 4).clamp(1_000, 300_000);
            let delay = s.next_at_ms() - now;
            assert!(
                (step / 2..=step).contains(&delay),
                "down {} ms: {delay} ms outside [{}, {step}]",
                now - down_at,
                step / 2
            );
            now += delay;
            tries += 1;
        }
        assert!(
            now - back_at <= (now - down_at) / 4,
            "polled {} ms after it came back",
            now - back_at
        );
        assert!((10..=40).contains(&tries), "{tries} tries in 50 s");
        assert_eq!(s.handle(Event::Tick, &w, now, &policy), poll(0));
        s.handle(answer(3, 2), &w, now, &policy);
        assert_eq!(s.state().name(), "computing");
        // A later outage is measured from its own start.
        s.handle(Event::Planned(synced("minbase")), &w, now, &policy);
        let later = now + 600_000;
        s.handle(Event::Tick, &w, later, &policy);
        s.handle(Event::PollFailed("timed out".into()), &w, later, &policy);
        assert!(s.next_at_ms() - later <= 1_000);
    }

    #[test]
    fn pause_disable_and_missing_images_hold_updates_but_polls_go_on() {
        let cases = [
            (
                Desired {
                    paused: Some("change freeze".into()),
                    ..want("m")
                },
                "updates disabled: the dominator is paused: change freeze",
            ),
            (
                Desired {
                    updates_disabled: Some("DisableUpdates in the MDB".into()),
                    ..want("m")
                },
                "updates disabled: DisableUpdates in the MDB",
            ),
        ];
        for (w, text) in cases {
            let mut s = answered(&w, 1, 1, 0);
            assert_eq!(
                s.handle(Event::Planned(update_of("m", 1, 1, 1)), &w, 0, &P),
                Action::Wait
            );
            assert_eq!(s.state().to_string(), text);
            // Polls go on, with the generation planned (the tree travels only if it changed).
            assert_eq!(s.handle(Event::Tick, &w, 1_000, &P), poll(1));
        }
        let w = want("gone");
        let mut s = answered(&w, 1, 1, 0);
        s.handle(Event::ImageMissing("gone".into()), &w, 0, &P);
        assert_eq!(
            s.state().to_string(),
            "image gone is not on the image server"
        );
        let mut s = Sub::new(P.backoff());
        let none = Desired::default();
        assert_eq!(
            s.handle(Event::Tick, &none, 0, &P),
            Action::Wait,
            "not polled"
        );
        assert_eq!(s.state(), &SubState::NoImage);
        assert_eq!(s.next_at_ms(), 1_000);
        // Given an image, it is polled at once.
        s.desired_changed(10);
        assert_eq!(s.handle(Event::Tick, &want("m"), 10, &P), poll(0));
    }

    #[test]
    fn a_tree_older_than_the_last_update_is_not_planned_from() {
        // The update call failed (its answer lost), but the sub applied it: the next poll
        // answers with the tree of a scan made before it.
        let w = want("m");
        let mut s = answered(&w, 3, 5, 0);
        let sent = s.handle(Event::Planned(plan("m")), &w, 0, &P);
        assert!(matches!(sent, Action::Update { .. }), "{sent:?}");
        s.handle(Event::UpdateFailed("connection reset".into()), &w, 10, &P);
        s.handle(Event::Tick, &w, 10_000, &P);
        let stale = Event::Polled(PollAnswer {
            generation: 4,
            scan_count: 6,
            busy: false,
            stale: true,
        });
        assert_eq!(s.handle(stale, &w, 10_000, &P), Action::Wait);
        s.handle(Event::Tick, &w, 10_250, &P);
        assert_eq!(
            s.handle(answer(5, 7), &w, 10_250, &P),
            Action::Plan { image: "m".into() },
            "a scan after the update"
        );
    }

    #[test]
    fn a_busy_or_unscanned_sub_is_left_alone() {
        let w = want("m");
        let mut s = Sub::new(P.backoff());
        s.handle(Event::Tick, &w, 0, &P);
        let busy = Event::Polled(PollAnswer {
            generation: 4,
            scan_count: 2,
            busy: true,
            stale: false,
        });
        assert_eq!(s.handle(busy, &w, 0, &P), Action::Wait);
        // Busy: polled again a poll interval later, as usual.
        assert_eq!(s.handle(Event::Tick, &w, 999, &P), Action::Wait);
        assert_eq!(s.handle(Event::Tick, &w, 1_000, &P), poll(0));
        // Not scanned yet: polled every quarter second for two seconds (a subd just
        // started on a new root scans it in moments), then at the usual pace.
        let mut now = 1_000;
        assert_eq!(s.handle(answer(0, 0), &w, now, &P), Action::Wait);
        assert_eq!(s.state().name(), "polling");
        while now < 1_000 + FIRST_SCAN_QUICK_MS {
            assert_eq!(s.handle(Event::Tick, &w, now + 249, &P), Action::Wait);
            now += 250;
            assert_eq!(s.handle(Event::Tick, &w, now, &P), poll(0), "at {now} ms");
            s.handle(answer(0, 0), &w, now, &P);
        }
        assert_eq!(s.handle(Event::Tick, &w, now + 999, &P), Action::Wait);
        assert_eq!(s.handle(Event::Tick, &w, now + 1_000, &P), poll(0));
        // Its first scan: planned at once.
        assert_eq!(s.handle(answer(3, 1), &w, now + 1_000, &P), plan_a("m"));
    }

    #[test]
    fn updates_that_do_not_stick_end_in_error() {
        let w = want("m");
        let mut s = Sub::new(P.backoff());
        let mut scan = 1;
        for _ in 0..P.max_update_attempts {
            s.handle(Event::Tick, &w, 0, &P);
            s.handle(answer(scan, scan), &w, 0, &P);
            assert_eq!(
                s.handle(Event::Planned(update_of("m", 1, 0, 0)), &w, 0, &P),
                Action::Update { image: "m".into() }
            );
            s.handle(Event::Updated, &w, 0, &P);
            scan += 1;
        }
        s.handle(Event::Tick, &w, 0, &P);
        s.handle(answer(scan, scan), &w, 0, &P);
        assert_eq!(
            s.handle(Event::Planned(update_of("m", 1, 0, 0)), &w, 0, &P),
            Action::Wait
        );
        assert_eq!(
            s.state().to_string(),
            "error: the sub still differs from m after 2 updates"
        );
    }

    #[test]
    fn a_synced_sub_preloads_its_planned_image_once_and_cleans_up_once() {
        let w = Desired {
            planned_image: Some("next".into()),
            ..want("m")
        };
        let mut s = answered(&w, 1, 1, 0);
        let done = PlanSummary {
            unused_cache_objects: 3,
            planned_image: Some("next".into()),
            ..synced("m")
        };
        assert_eq!(s.handle(Event::Planned(done), &w, 0, &P), Action::Cleanup);
        assert_eq!(s.handle(Event::CleanedUp, &w, 0, &P), Action::Wait);
        s.handle(Event::Tick, &w, 1_000, &P);
        assert_eq!(
            s.handle(answer(1, 2), &w, 1_000, &P),
            Action::Fetch {
                image: "next".into(),
                preload: true
            }
        );
        assert_eq!(s.handle(Event::Fetched, &w, 1_100, &P), Action::Wait);
        assert_eq!(s.state().name(), "synced");
        s.handle(Event::Tick, &w, 2_100, &P);
        assert_eq!(s.handle(answer(1, 3), &w, 2_100, &P), Action::Wait);
    }

    #[test]
    fn a_queued_sub_says_what_it_waits_for_and_keeps_its_fetch() {
        let w = want("minbase2");
        let mut s = answered(&w, 7, 3, 10);
        s.handle(
            Event::Planned(update_of("minbase2", 1, 12, 90_000)),
            &w,
            20,
            &P,
        );
        assert_eq!(
            s.state().to_string(),
            "queued to fetch 12 objects (90000 bytes), waiting for an update slot"
        );
        s.handle(
            Event::StillQueued("the high-impact share (1 of 1 running)".into()),
            &w,
            30,
            &P,
        );
        assert_eq!(
            serde_json::to_value(s.state()).unwrap(),
            serde_json::json!({"state": "queued", "step": "fetch", "objects": 12,
                "bytes": 90_000, "waiting_for": "the high-impact share (1 of 1 running)"})
        );
        assert!(s.busy(), "a queued sub's action is outstanding");
        s.handle(Event::Started, &w, 40, &P);
        assert_eq!(
            s.state(),
            &SubState::Fetching {
                objects: 12,
                bytes: 90_000
            }
        );
        // Started or StillQueued outside the queue change nothing.
        s.handle(Event::StillQueued("y".into()), &w, 41, &P);
        s.handle(Event::Started, &w, 42, &P);
        assert_eq!(s.state().name(), "fetching");
        s.handle(Event::Fetched, &w, 50, &P);
        s.handle(Event::Tick, &w, 50, &P);
        s.handle(answer(8, 4), &w, 60, &P);
        s.handle(Event::Planned(update_of("minbase2", 1, 0, 0)), &w, 70, &P);
        assert_eq!(
            s.state().to_string(),
            "queued to update, waiting for an update slot"
        );
        s.handle(Event::Started, &w, 80, &P);
        assert_eq!(s.state(), &SubState::Updating);
    }

    #[test]
    fn a_new_planned_image_is_planned_again_before_its_preload() {
        let mut w = want("minbase2");
        w.planned_image = Some("minbase3".into());
        let with_planned = |image: &str, planned: &str| PlanSummary {
            planned_image: Some(planned.to_string()),
            planned_objects_to_fetch: 5,
            ..synced(image)
        };
        // Polled at `t` (the sub `state` then): the tree (scan `scan`) is planned with
        // `planned` as the planned image, and the next poll brings the preload of `planned`.
        let plan_and_preload = |t: u64, state: &'static str, scan: u64, planned: &str| {
            vec![
                (Event::Tick, t, poll(0), state),
                (answer(7, scan), t + 10, plan_a("minbase2"), "computing"),
                (
                    Event::Planned(with_planned("minbase2", planned)),
                    t + 20,
                    Action::Wait,
                    "synced",
                ),
                (Event::Tick, t + 1_020, poll(7), "synced"),
                (
                    answer(7, scan + 1),
                    t + 1_030,
                    Action::Fetch {
                        image: planned.into(),
                        preload: true,
                    },
                    "synced",
                ),
                (Event::Fetched, t + 1_040, Action::Wait, "synced"),
            ]
        };
        let mut s = Sub::new(P.backoff());
        run(&mut s, &w, &plan_and_preload(0, "polling", 3, "minbase3"));
        // The MDB's PlannedImage changes: the preload list of the last plan is for
        // minbase3, so the tree is asked for and planned again before any preload.
        w.planned_image = Some("minbase4".into());
        s.desired_changed(1_100);
        let mut steps = plan_and_preload(1_100, "synced", 5, "minbase4");
        // Preloaded and planned for: short polls only.
        steps.extend([
            (Event::Tick, 3_140, poll(7), "synced"),
            (answer(7, 7), 3_150, Action::Wait, "synced"),
        ]);
        run(&mut s, &w, &steps);
    }

    #[test]
    fn the_state_serialises_with_its_reason() {
        let s = SubState::NotEnoughSpace { need: 2, free: 1 };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"state": "not_enough_space", "need": 2, "free": 1})
        );
        assert_eq!(serde_json::from_value::<SubState>(v).unwrap(), s);
    }
}
