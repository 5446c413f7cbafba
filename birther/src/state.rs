//! A node's provisioning state: Dominator's MachineBirthing states (`unknown`, `birth`,
//! `healthy`, `rebirth`, `clean`) plus `error`, as a plain value with pure transitions.
//!
//! [`Provisioning::apply`] takes an event and the time and returns the next record, what the
//! node's boot script must serve from then on ([`Serve`]), and a one-line summary for the
//! timeline. A request that makes no sense in the current state is an error and changes
//! nothing; a report repeated (an agent that retries a post whose answer it lost) changes
//! nothing and is no error. [`Provisioning::expire`] turns a run that stopped reporting into
//! an error; its clock starts at the run's first report from the ramdisk
//! ([`Provisioning::started_ms`]), so a machine that is still powered off never times out.
//! The record is stored as JSON; its field names are part of the store's format.

use paddock_image::image::{BadImageName, check_name};
use serde::{Deserialize, Serialize};

/// One step of a run in the ramdisk, in the order a run takes them. Birth skips
/// `object_cache`; a re-image that keeps the root skips `partition` for the root; clean only
/// has `wipe`. `sync` is the dominator's word (subd synced), never the ramdisk's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    ChooseDisk,
    Partition,
    Filesystems,
    ObjectCache,
    StartSubd,
    Register,
    Sync,
    BootLoader,
    Identity,
    HandOver,
    Wipe,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::ChooseDisk => "choose_disk",
            Step::Partition => "partition",
            Step::Filesystems => "filesystems",
            Step::ObjectCache => "object_cache",
            Step::StartSubd => "start_subd",
            Step::Register => "register",
            Step::Sync => "sync",
            Step::BootLoader => "boot_loader",
            Step::Identity => "identity",
            Step::HandOver => "hand_over",
            Step::Wipe => "wipe",
        }
    }
}

/// What a run in the ramdisk is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Birth,
    Rebirth,
    Clean,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Birth => "birth",
            Operation::Rebirth => "rebirth",
            Operation::Clean => "clean",
        }
    }

    /// The steps of this operation, in order.
    pub fn steps(self) -> &'static [Step] {
        use Step::*;
        match self {
            Operation::Birth => &[
                ChooseDisk,
                Partition,
                Filesystems,
                StartSubd,
                Register,
                Sync,
                BootLoader,
                Identity,
                HandOver,
            ],
            Operation::Rebirth => &[
                ChooseDisk,
                Partition,
                Filesystems,
                ObjectCache,
                StartSubd,
                Register,
                Sync,
                BootLoader,
                Identity,
                HandOver,
            ],
            Operation::Clean => &[Wipe],
        }
    }
}

/// A birth or rebirth under way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The image being installed (the MDB's RequiredImage).
    pub image: String,
    /// Rebirth: the image the node ran before (for the timeline; the disk may hold its bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_image: Option<String>,
    /// The last step the ramdisk reported done in this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<Step>,
    /// The dominator reported the node's subd synced to `image` in this run.
    #[serde(default)]
    pub synced: bool,
}

impl Run {
    fn new(image: String, previous_image: Option<String>) -> Run {
        Run {
            image,
            previous_image,
            last_step: None,
            synced: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// No image installed by Paddock (new, or cleaned): the node waits in the inspection
    /// ramdisk.
    Unknown,
    /// A first install: the ramdisk lays the disk out, starts subd, the dominator pushes.
    Birth(Run),
    /// Installed and handed over: the node boots its disk; the dominator keeps it on `image`.
    Healthy { image: String },
    /// A re-install reusing the bytes on the disk (fs2objectcache).
    Rebirth(Run),
    /// The disk is being wiped; ends in `unknown`.
    Clean {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_step: Option<Step>,
    },
    /// A run failed at `step`; the node waits in the inspection ramdisk for the operator.
    Error {
        operation: Operation,
        step: Step,
        message: String,
        /// The image the failed run installed (`None` for clean).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image: Option<String>,
    },
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Birth(_) => "birth",
            State::Healthy { .. } => "healthy",
            State::Rebirth(_) => "rebirth",
            State::Clean { .. } => "clean",
            State::Error { .. } => "error",
        }
    }

    /// The image installed or being installed.
    pub fn image(&self) -> Option<&str> {
        match self {
            State::Birth(r) | State::Rebirth(r) => Some(&r.image),
            State::Healthy { image } => Some(image),
            State::Error { image, .. } => image.as_deref(),
            State::Unknown | State::Clean { .. } => None,
        }
    }
}

/// What the node's boot script serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "serve", rename_all = "snake_case")]
pub enum Serve {
    /// The plain inspection ramdisk (it never writes to a disk): where an idle or failed
    /// node waits, asking `/next` what to do.
    InspectionRamdisk,
    BirthRamdisk {
        image: String,
    },
    RebirthRamdisk {
        image: String,
    },
    CleanRamdisk,
    /// Boot the installed system.
    LocalDisk,
}

impl Serve {
    /// The ramdisk's mode for its kernel command line (`paddock.mode=`); `None`: no ramdisk
    /// mode (local disk) or the plain inspection ramdisk.
    pub fn ramdisk_mode(&self) -> Option<&'static str> {
        match self {
            Serve::BirthRamdisk { .. } => Some("birth"),
            Serve::RebirthRamdisk { .. } => Some("rebirth"),
            Serve::CleanRamdisk => Some("clean"),
            Serve::InspectionRamdisk | Serve::LocalDisk => None,
        }
    }
}

/// What happened to a node: an operator's request, or a report from its ramdisk or from the
/// dominator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Install `image` on a node that has none (`paddock node provision`).
    ProvisionRequested { image: String },
    /// Re-install a provisioned node: `image`, or (`None`) the one it has.
    ReimageRequested {
        #[serde(default)]
        image: Option<String>,
    },
    /// Wipe the disk and return the node to `unknown`.
    CleanRequested,
    /// The ramdisk finished `step` of its run.
    StepDone { step: Step },
    /// `step` failed (reported by the ramdisk, or by the appliance for `sync`: image missing,
    /// fetch failed).
    StepFailed { step: Step, message: String },
    /// The dominator found the node's subd synced to `image`.
    SubdSynced { image: String },
    /// The clean run finished wiping.
    CleanDone,
    /// The ramdisk asked what to do and was answered this run's mode (`provision/next`): the
    /// machine is up, and the run's clock starts ([`Provisioning::started_ms`]).
    RunStarted,
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::ProvisionRequested { .. } => "provision requested",
            Event::ReimageRequested { .. } => "reimage requested",
            Event::CleanRequested => "clean requested",
            Event::StepDone { .. } => "step done",
            Event::StepFailed { .. } => "step failed",
            Event::SubdSynced { .. } => "subd synced",
            Event::CleanDone => "clean done",
            Event::RunStarted => "run started",
        }
    }
}

/// Why an event cannot apply. Nothing changes; every message says what to do instead.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error(transparent)]
    BadImage(#[from] BadImageName),
    #[error("the node is already provisioned with {image}: use reimage to install another image")]
    AlreadyProvisioned { image: String },
    #[error("the node has no image installed: use provision")]
    NotProvisioned,
    #[error(
        "the node is in {state}{}: wait for it to end, or clean the node to stop it",
        image.as_deref().map(|i| format!(" (image {i})")).unwrap_or_default()
    )]
    Busy {
        state: &'static str,
        image: Option<String>,
    },
    #[error("the node has no image to keep: name the image to install")]
    NoImageToKeep,
    #[error(
        "{event} does not apply to a node in {state}: a report from a run that is over (ignored)"
    )]
    NotRunning {
        state: &'static str,
        event: &'static str,
    },
    #[error("subd reports image {reported}, but the node is being installed with {expected}")]
    WrongImage { reported: String, expected: String },
    #[error("step {step} is not a step of {operation}")]
    WrongStep {
        step: &'static str,
        operation: &'static str,
    },
    #[error(
        "step {step} comes after the image is synced, and the dominator has not reported it synced"
    )]
    NotSynced { step: &'static str },
}

/// How long a run that has started ([`Provisioning::started_ms`]) may go without a report
/// before it is an error at the step it was due to finish next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// Every step but `sync` (birth, rebirth and clean alike).
    pub step_ms: u64,
    /// `sync`: from `register` until the dominator finds subd synced (the whole image may
    /// cross the network).
    pub sync_ms: u64,
}

/// A node's provisioning record, as stored (JSON, under the node).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provisioning {
    #[serde(flatten)]
    pub state: State,
    /// When the node entered this state (Unix ms).
    pub since_ms: u64,
    /// When the record last changed (Unix ms): the state, or a run's progress.
    pub updated_ms: u64,
    /// When the ramdisk first reported on the run under way (Unix ms): `provision/next`
    /// answered it the run's mode ([`Event::RunStarted`]), or its first step. The run's
    /// timeouts count from here on, never from the request. `None`: no run, or its machine
    /// has not booted the ramdisk yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
}

/// The result of an event: the record to store, what to boot, and whether anything changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub record: Provisioning,
    pub serve: Serve,
    /// `false`: a repeated report or request; nothing to write.
    pub changed: bool,
    /// For the node's timeline: `birth → healthy: step hand_over done (image a)`.
    pub summary: String,
}

/// A failure message from the network, bounded for the store.
fn clip_message(message: &str) -> String {
    const MAX: usize = 2000;
    let m = message.trim();
    if m.is_empty() {
        return "(no message)".into();
    }
    let mut out: String = m.chars().take(MAX).collect();
    if out.len() < m.len() {
        out.push('…');
    }
    out
}

impl Provisioning {
    pub fn new(now_ms: u64) -> Provisioning {
        Provisioning {
            state: State::Unknown,
            since_ms: now_ms,
            updated_ms: now_ms,
            started_ms: None,
        }
    }

    /// What the boot script serves in this state.
    pub fn serve(&self) -> Serve {
        match &self.state {
            State::Unknown | State::Error { .. } => Serve::InspectionRamdisk,
            State::Birth(r) => Serve::BirthRamdisk {
                image: r.image.clone(),
            },
            State::Rebirth(r) => Serve::RebirthRamdisk {
                image: r.image.clone(),
            },
            State::Clean { .. } => Serve::CleanRamdisk,
            State::Healthy { .. } => Serve::LocalDisk,
        }
    }

    fn unchanged(&self, why: &str) -> Transition {
        Transition {
            record: self.clone(),
            serve: self.serve(),
            changed: false,
            summary: format!("{}: {why} again; nothing changes", self.state.name()),
        }
    }

    fn to(&self, state: State, now_ms: u64, why: String) -> Transition {
        let same_kind = std::mem::discriminant(&state) == std::mem::discriminant(&self.state);
        let record = Provisioning {
            since_ms: if same_kind { self.since_ms } else { now_ms },
            updated_ms: now_ms,
            // A new state is a new run (or none): its clock has not started.
            started_ms: if same_kind { self.started_ms } else { None },
            state,
        };
        let summary = format!("{} → {}: {why}", self.state.name(), record.state.name());
        Transition {
            serve: record.serve(),
            record,
            changed: true,
            summary,
        }
    }

    /// Applies `event` at `now_ms`.
    pub fn apply(&self, event: &Event, now_ms: u64) -> Result<Transition, TransitionError> {
        use State as S;
        let not_running = || TransitionError::NotRunning {
            state: self.state.name(),
            event: event.name(),
        };
        let busy = || TransitionError::Busy {
            state: self.state.name(),
            image: self.state.image().map(String::from),
        };
        match (&self.state, event) {
            // Operator requests.
            (S::Unknown | S::Error { .. }, Event::ProvisionRequested { image }) => {
                check_name(image)?;
                let why = format!("provisioning requested (image {image})");
                Ok(self.to(S::Birth(Run::new(image.clone(), None)), now_ms, why))
            }
            (S::Birth(r), Event::ProvisionRequested { image }) if *image == r.image => {
                Ok(self.unchanged("provisioning requested"))
            }
            (S::Healthy { image }, Event::ProvisionRequested { .. }) => {
                Err(TransitionError::AlreadyProvisioned {
                    image: image.clone(),
                })
            }
            (S::Unknown, Event::ReimageRequested { .. }) => Err(TransitionError::NotProvisioned),
            (
                S::Healthy { image: old }
                | S::Error {
                    image: Some(old), ..
                },
                Event::ReimageRequested { image },
            ) => {
                let image = image.clone().unwrap_or_else(|| old.clone());
                check_name(&image)?;
                let why = format!("re-image requested (image {image}, was {old})");
                Ok(self.to(S::Rebirth(Run::new(image, Some(old.clone()))), now_ms, why))
            }
            (S::Error { image: None, .. }, Event::ReimageRequested { image }) => {
                let image = image.clone().ok_or(TransitionError::NoImageToKeep)?;
                check_name(&image)?;
                let why = format!("re-image requested (image {image})");
                Ok(self.to(S::Rebirth(Run::new(image, None)), now_ms, why))
            }
            (S::Rebirth(r), Event::ReimageRequested { image })
                if image.as_ref().is_none_or(|i| *i == r.image) =>
            {
                Ok(self.unchanged("re-image requested"))
            }
            (
                S::Birth(_) | S::Rebirth(_) | S::Clean { .. },
                Event::ProvisionRequested { .. } | Event::ReimageRequested { .. },
            ) => Err(busy()),
            (S::Clean { .. }, Event::CleanRequested) => Ok(self.unchanged("clean requested")),
            (_, Event::CleanRequested) => Ok(self.to(
                S::Clean { last_step: None },
                now_ms,
                "clean requested".into(),
            )),

            // The ramdisk is up and knows its mode: the run's clock starts.
            (S::Birth(_) | S::Rebirth(_) | S::Clean { .. }, Event::RunStarted) => {
                if self.started_ms.is_some() {
                    return Ok(self.unchanged("the ramdisk started the run"));
                }
                let why = match self.state.image() {
                    Some(image) => format!("the ramdisk started the run (image {image})"),
                    None => "the ramdisk started the run".into(),
                };
                Ok(started(self.to(self.state.clone(), now_ms, why), now_ms))
            }

            // Reports from a birth or rebirth.
            (S::Birth(r) | S::Rebirth(r), Event::StepDone { step }) => {
                Ok(started(self.step_done(r, *step, now_ms)?, now_ms))
            }
            (S::Birth(r) | S::Rebirth(r), Event::SubdSynced { image }) => {
                if *image != r.image {
                    return Err(TransitionError::WrongImage {
                        reported: image.clone(),
                        expected: r.image.clone(),
                    });
                }
                if r.synced {
                    return Ok(self.unchanged("subd synced"));
                }
                let run = Run {
                    synced: true,
                    ..r.clone()
                };
                let why = format!("subd synced to {image}");
                Ok(self.to(self.with_run(run), now_ms, why))
            }
            (S::Birth(r) | S::Rebirth(r), Event::StepFailed { step, message }) => {
                let operation = self.operation().unwrap_or(Operation::Birth);
                let message = clip_message(message);
                let why = format!("step {} failed: {message}", step.as_str());
                Ok(self.to(
                    S::Error {
                        operation,
                        step: *step,
                        message,
                        image: Some(r.image.clone()),
                    },
                    now_ms,
                    why,
                ))
            }

            // Reports from a clean.
            (S::Clean { last_step }, Event::StepDone { step }) => {
                if *step != Step::Wipe {
                    return Err(TransitionError::WrongStep {
                        step: step.as_str(),
                        operation: "clean",
                    });
                }
                if *last_step == Some(Step::Wipe) {
                    return Ok(self.unchanged("step wipe done"));
                }
                let t = self.to(
                    S::Clean {
                        last_step: Some(Step::Wipe),
                    },
                    now_ms,
                    "step wipe done".into(),
                );
                Ok(started(t, now_ms))
            }
            (S::Clean { .. }, Event::StepFailed { step, message }) => {
                let message = clip_message(message);
                let why = format!("step {} failed: {message}", step.as_str());
                Ok(self.to(
                    S::Error {
                        operation: Operation::Clean,
                        step: *step,
                        message,
                        image: None,
                    },
                    now_ms,
                    why,
                ))
            }
            (S::Clean { .. }, Event::CleanDone) => {
                Ok(self.to(S::Unknown, now_ms, "clean done".into()))
            }

            // Repeats of the report that ended a run.
            (S::Unknown, Event::CleanDone) => Ok(self.unchanged("clean done")),
            (
                S::Healthy { .. },
                Event::StepDone {
                    step: Step::HandOver,
                },
            ) => Ok(self.unchanged("step hand_over done")),
            (
                S::Error { step, message, .. },
                Event::StepFailed {
                    step: s,
                    message: m,
                },
            ) if step == s && *message == clip_message(m) => {
                Ok(self.unchanged("the same failure reported"))
            }

            // The dominator keeps a healthy node on its image, also a new one set in the MDB.
            (S::Healthy { image }, Event::SubdSynced { image: synced }) => {
                if image == synced {
                    Ok(self.unchanged("subd synced"))
                } else {
                    let why = format!("subd synced to {synced} (was {image})");
                    Ok(self.to(
                        S::Healthy {
                            image: synced.clone(),
                        },
                        now_ms,
                        why,
                    ))
                }
            }

            // Reports that belong to no run.
            (S::Unknown | S::Healthy { .. } | S::Error { .. }, Event::RunStarted)
            | (
                S::Unknown | S::Healthy { .. } | S::Error { .. } | S::Clean { .. },
                Event::StepDone { .. } | Event::StepFailed { .. } | Event::SubdSynced { .. },
            )
            | (
                S::Birth(_) | S::Rebirth(_) | S::Healthy { .. } | S::Error { .. },
                Event::CleanDone,
            ) => Err(not_running()),
        }
    }

    fn operation(&self) -> Option<Operation> {
        match self.state {
            State::Birth(_) => Some(Operation::Birth),
            State::Rebirth(_) => Some(Operation::Rebirth),
            State::Clean { .. } => Some(Operation::Clean),
            _ => None,
        }
    }

    /// The same kind of run (birth or rebirth) with `run`.
    fn with_run(&self, run: Run) -> State {
        match self.state {
            State::Rebirth(_) => State::Rebirth(run),
            _ => State::Birth(run),
        }
    }

    fn step_done(&self, r: &Run, step: Step, now_ms: u64) -> Result<Transition, TransitionError> {
        let operation = self.operation().unwrap_or(Operation::Birth);
        if step == Step::Sync || !operation.steps().contains(&step) {
            return Err(TransitionError::WrongStep {
                step: step.as_str(),
                operation: operation.as_str(),
            });
        }
        if r.last_step == Some(step) {
            return Ok(self.unchanged(&format!("step {} done", step.as_str())));
        }
        if step > Step::Sync && !r.synced {
            return Err(TransitionError::NotSynced {
                step: step.as_str(),
            });
        }
        let why = format!("step {} done (image {})", step.as_str(), r.image);
        if step == Step::HandOver {
            return Ok(self.to(
                State::Healthy {
                    image: r.image.clone(),
                },
                now_ms,
                why,
            ));
        }
        // A step before the last one and before the sync: the ramdisk started its run again
        // (a reboot or a power cut), so the install it reports on is a new one, not yet
        // synced. (A step after the sync reported again is a retry of that step.)
        let restarted = r.last_step.is_some_and(|last| step < last) && step < Step::Sync;
        let run = Run {
            last_step: Some(step),
            synced: r.synced && !restarted,
            ..r.clone()
        };
        let why = if restarted {
            format!("{why}; the run started again")
        } else {
            why
        };
        Ok(self.to(self.with_run(run), now_ms, why))
    }

    /// A run (birth, rebirth, clean) that has started ([`Provisioning::started_ms`], or a step
    /// reported) and has had no report for longer than its timeout becomes an error at the
    /// step it was due to finish next: [`Timeouts::sync_ms`] while it waits for the
    /// dominator's `sync`, [`Timeouts::step_ms`] for any other step. A run whose machine has
    /// not booted the ramdisk yet never expires. `None`: nothing to do.
    pub fn expire(&self, now_ms: u64, limits: &Timeouts) -> Option<Transition> {
        let (operation, last, image) = match &self.state {
            State::Birth(r) | State::Rebirth(r) => (
                self.operation()?,
                if r.synced {
                    r.last_step.max(Some(Step::Sync))
                } else {
                    r.last_step
                },
                Some(r.image.clone()),
            ),
            State::Clean { last_step } => (Operation::Clean, *last_step, None),
            _ => return None,
        };
        // A step reported counts as a start (a record written before `started_ms` existed).
        if self.started_ms.is_none() && last.is_none() {
            return None;
        }
        let steps = operation.steps();
        let step = steps
            .iter()
            .copied()
            .find(|s| last.is_none_or(|l| *s > l))
            .unwrap_or(steps[steps.len() - 1]);
        let limit = if step == Step::Sync {
            limits.sync_ms
        } else {
            limits.step_ms
        };
        let since = self.updated_ms.max(self.started_ms.unwrap_or(0));
        let quiet = now_ms.saturating_sub(since);
        if quiet <= limit {
            return None;
        }
        let message = format!(
            "no report for {} s (timeout {} s){}",
            quiet / 1000,
            limit / 1000,
            last.map(|l| format!("; last step done: {}", l.as_str()))
                .unwrap_or_default()
        );
        let why = format!("step {} timed out: {message}", step.as_str());
        Some(self.to(
            State::Error {
                operation,
                step,
                message,
                image,
            },
            now_ms,
            why,
        ))
    }
}

/// `t` with its run's clock started at `now_ms` if it had not (a report from the ramdisk).
fn started(mut t: Transition, now_ms: u64) -> Transition {
    let running = matches!(
        t.record.state,
        State::Birth(_) | State::Rebirth(_) | State::Clean { .. }
    );
    if t.changed && running && t.record.started_ms.is_none() {
        t.record.started_ms = Some(now_ms);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: u64 = 1_000;
    const NOW: u64 = 5_000;

    fn birth(image: &str, last_step: Option<Step>, synced: bool) -> State {
        State::Birth(Run {
            image: image.into(),
            previous_image: None,
            last_step,
            synced,
        })
    }

    fn rebirth(
        image: &str,
        previous: Option<&str>,
        last_step: Option<Step>,
        synced: bool,
    ) -> State {
        State::Rebirth(Run {
            image: image.into(),
            previous_image: previous.map(String::from),
            last_step,
            synced,
        })
    }

    fn healthy(image: &str) -> State {
        State::Healthy {
            image: image.into(),
        }
    }

    fn clean(last_step: Option<Step>) -> State {
        State::Clean { last_step }
    }

    fn error(operation: Operation, step: Step, message: &str, image: Option<&str>) -> State {
        State::Error {
            operation,
            step,
            message: message.into(),
            image: image.map(String::from),
        }
    }

    fn provision(image: &str) -> Event {
        Event::ProvisionRequested {
            image: image.into(),
        }
    }

    fn reimage(image: Option<&str>) -> Event {
        Event::ReimageRequested {
            image: image.map(String::from),
        }
    }

    fn done(step: Step) -> Event {
        Event::StepDone { step }
    }

    fn failed(step: Step, message: &str) -> Event {
        Event::StepFailed {
            step,
            message: message.into(),
        }
    }

    fn synced(image: &str) -> Event {
        Event::SubdSynced {
            image: image.into(),
        }
    }

    enum Want {
        /// The new state (changed).
        To(State),
        /// A repeat: nothing changes.
        Same,
        /// An error starting with this text.
        Err(&'static str),
    }
    use Want::*;

    /// Every transition: state × event → the new state, a repeat, or an error that changes
    /// nothing.
    #[test]
    fn transition_table() {
        use Operation as O;
        use Step::*;
        let a = Some("debian/a");
        let rows: Vec<(&str, State, Event, Want)> = vec![
            // The ramdisk starts a run (only the clock changes; see the test below).
            (
                "run started, birth",
                birth("debian/a", None, false),
                Event::RunStarted,
                To(birth("debian/a", None, false)),
            ),
            (
                "run started, rebirth",
                rebirth("debian/b", a, None, false),
                Event::RunStarted,
                To(rebirth("debian/b", a, None, false)),
            ),
            (
                "run started, clean",
                clean(None),
                Event::RunStarted,
                To(clean(None)),
            ),
            (
                "run started, healthy",
                healthy("debian/a"),
                Event::RunStarted,
                Err("run started does not apply to a node in healthy"),
            ),
            // unknown
            (
                "provision",
                State::Unknown,
                provision("debian/a"),
                To(birth("debian/a", None, false)),
            ),
            (
                "provision, bad name",
                State::Unknown,
                provision("../x"),
                Err("bad image name \"../x\""),
            ),
            (
                "reimage, nothing installed",
                State::Unknown,
                reimage(None),
                Err("the node has no image installed: use provision"),
            ),
            (
                "reimage to b, nothing installed",
                State::Unknown,
                reimage(Some("b")),
                Err("the node has no image installed"),
            ),
            (
                "clean",
                State::Unknown,
                Event::CleanRequested,
                To(clean(None)),
            ),
            (
                "stale step",
                State::Unknown,
                done(ChooseDisk),
                Err("step done does not apply to a node in unknown"),
            ),
            (
                "stale failure",
                State::Unknown,
                failed(Partition, "x"),
                Err("step failed does not apply to a node in unknown"),
            ),
            (
                "stale sync",
                State::Unknown,
                synced("debian/a"),
                Err("subd synced does not apply to a node in unknown"),
            ),
            ("clean done again", State::Unknown, Event::CleanDone, Same),
            // birth
            (
                "provision again",
                birth("debian/a", None, false),
                provision("debian/a"),
                Same,
            ),
            (
                "provision other",
                birth("debian/a", None, false),
                provision("b"),
                Err(
                    "the node is in birth (image debian/a): wait for it to end, or clean the node to stop it",
                ),
            ),
            (
                "reimage in birth",
                birth("debian/a", None, false),
                reimage(None),
                Err("the node is in birth (image debian/a)"),
            ),
            (
                "abort by clean",
                birth("debian/a", Some(Register), true),
                Event::CleanRequested,
                To(clean(None)),
            ),
            (
                "first step",
                birth("debian/a", None, false),
                done(ChooseDisk),
                To(birth("debian/a", Some(ChooseDisk), false)),
            ),
            (
                "skipping is fine",
                birth("debian/a", Some(ChooseDisk), false),
                done(StartSubd),
                To(birth("debian/a", Some(StartSubd), false)),
            ),
            (
                "object cache is rebirth's",
                birth("debian/a", None, false),
                done(ObjectCache),
                Err("step object_cache is not a step of birth"),
            ),
            (
                "sync is the dominator's",
                birth("debian/a", None, false),
                done(Sync),
                Err("step sync is not a step of birth"),
            ),
            (
                "wipe is clean's",
                birth("debian/a", None, false),
                done(Wipe),
                Err("step wipe is not a step of birth"),
            ),
            (
                "boot loader before sync",
                birth("debian/a", Some(Register), false),
                done(BootLoader),
                Err("step boot_loader comes after the image is synced"),
            ),
            (
                "hand-over before sync",
                birth("debian/a", Some(Register), false),
                done(HandOver),
                Err("step hand_over comes after"),
            ),
            (
                "synced",
                birth("debian/a", Some(Register), false),
                synced("debian/a"),
                To(birth("debian/a", Some(Register), true)),
            ),
            (
                "synced again",
                birth("debian/a", Some(Register), true),
                synced("debian/a"),
                Same,
            ),
            (
                "synced to another image",
                birth("debian/a", Some(Register), false),
                synced("b"),
                Err("subd reports image b, but the node is being installed with debian/a"),
            ),
            (
                "step again",
                birth("debian/a", Some(Register), false),
                done(Register),
                Same,
            ),
            (
                "restart",
                birth("debian/a", Some(Register), false),
                done(ChooseDisk),
                To(birth("debian/a", Some(ChooseDisk), false)),
            ),
            (
                "restart forgets the sync",
                birth("debian/a", Some(Register), true),
                done(StartSubd),
                To(birth("debian/a", Some(StartSubd), false)),
            ),
            (
                "after sync",
                birth("debian/a", Some(Register), true),
                done(BootLoader),
                To(birth("debian/a", Some(BootLoader), true)),
            ),
            (
                "retry after sync keeps it",
                birth("debian/a", Some(Identity), true),
                done(BootLoader),
                To(birth("debian/a", Some(BootLoader), true)),
            ),
            (
                "hand-over",
                birth("debian/a", Some(Identity), true),
                done(HandOver),
                To(healthy("debian/a")),
            ),
            (
                "failure",
                birth("debian/a", Some(ChooseDisk), false),
                failed(Partition, " sfdisk: /dev/vda: no such device \n"),
                To(error(
                    O::Birth,
                    Partition,
                    "sfdisk: /dev/vda: no such device",
                    a,
                )),
            ),
            (
                "failure without a message",
                birth("debian/a", None, false),
                failed(ChooseDisk, "  "),
                To(error(O::Birth, ChooseDisk, "(no message)", a)),
            ),
            (
                "image missing (the appliance)",
                birth("debian/a", Some(Register), false),
                failed(Sync, "image debian/a is missing"),
                To(error(O::Birth, Sync, "image debian/a is missing", a)),
            ),
            (
                "clean done in birth",
                birth("debian/a", None, false),
                Event::CleanDone,
                Err("clean done does not apply to a node in birth"),
            ),
            // rebirth
            (
                "object cache",
                rebirth("b", a, Some(Filesystems), false),
                done(ObjectCache),
                To(rebirth("b", a, Some(ObjectCache), false)),
            ),
            (
                "reimage again",
                rebirth("b", a, None, false),
                reimage(None),
                Same,
            ),
            (
                "reimage again, named",
                rebirth("b", a, None, false),
                reimage(Some("b")),
                Same,
            ),
            (
                "reimage other",
                rebirth("b", a, None, false),
                reimage(Some("c")),
                Err("the node is in rebirth (image b)"),
            ),
            (
                "provision in rebirth",
                rebirth("b", a, None, false),
                provision("b"),
                Err("the node is in rebirth (image b)"),
            ),
            (
                "rebirth synced",
                rebirth("b", a, Some(Register), false),
                synced("b"),
                To(rebirth("b", a, Some(Register), true)),
            ),
            (
                "rebirth synced to the old image",
                rebirth("b", a, Some(Register), false),
                synced("debian/a"),
                Err("subd reports image debian/a, but the node is being installed with b"),
            ),
            (
                "wipe in rebirth",
                rebirth("b", a, None, false),
                done(Wipe),
                Err("step wipe is not a step of rebirth"),
            ),
            (
                "fs2objectcache fails",
                rebirth("b", a, Some(Filesystems), false),
                failed(ObjectCache, "read error"),
                To(error(O::Rebirth, ObjectCache, "read error", Some("b"))),
            ),
            (
                "rebirth hand-over",
                rebirth("b", a, Some(Identity), true),
                done(HandOver),
                To(healthy("b")),
            ),
            (
                "rebirth clean",
                rebirth("b", a, None, false),
                Event::CleanRequested,
                To(clean(None)),
            ),
            (
                "clean done in rebirth",
                rebirth("b", a, None, false),
                Event::CleanDone,
                Err("clean done does not apply to a node in rebirth"),
            ),
            // healthy
            (
                "provision a healthy node",
                healthy("debian/a"),
                provision("b"),
                Err("the node is already provisioned with debian/a: use reimage"),
            ),
            (
                "reimage, keep",
                healthy("debian/a"),
                reimage(None),
                To(rebirth("debian/a", a, None, false)),
            ),
            (
                "reimage to b",
                healthy("debian/a"),
                reimage(Some("b")),
                To(rebirth("b", a, None, false)),
            ),
            (
                "reimage, bad name",
                healthy("debian/a"),
                reimage(Some("")),
                Err("bad image name \"\""),
            ),
            (
                "clean healthy",
                healthy("debian/a"),
                Event::CleanRequested,
                To(clean(None)),
            ),
            ("hand-over again", healthy("debian/a"), done(HandOver), Same),
            (
                "stale step in healthy",
                healthy("debian/a"),
                done(Partition),
                Err("step done does not apply to a node in healthy"),
            ),
            (
                "stale failure in healthy",
                healthy("debian/a"),
                failed(Partition, "x"),
                Err("step failed does not apply to a node in healthy"),
            ),
            (
                "still synced",
                healthy("debian/a"),
                synced("debian/a"),
                Same,
            ),
            (
                "the dominator moved it",
                healthy("debian/a"),
                synced("b"),
                To(healthy("b")),
            ),
            (
                "clean done in healthy",
                healthy("debian/a"),
                Event::CleanDone,
                Err("clean done does not apply"),
            ),
            // clean
            (
                "provision in clean",
                clean(None),
                provision("b"),
                Err("the node is in clean: wait for it to end"),
            ),
            (
                "reimage in clean",
                clean(None),
                reimage(Some("b")),
                Err("the node is in clean"),
            ),
            ("clean again", clean(None), Event::CleanRequested, Same),
            ("wiped", clean(None), done(Wipe), To(clean(Some(Wipe)))),
            ("wiped again", clean(Some(Wipe)), done(Wipe), Same),
            (
                "birth step in clean",
                clean(None),
                done(Partition),
                Err("step partition is not a step of clean"),
            ),
            (
                "wipe fails",
                clean(None),
                failed(Wipe, "blkdiscard: Operation not supported"),
                To(error(
                    O::Clean,
                    Wipe,
                    "blkdiscard: Operation not supported",
                    None,
                )),
            ),
            (
                "sync in clean",
                clean(None),
                synced("b"),
                Err("subd synced does not apply to a node in clean"),
            ),
            (
                "clean done",
                clean(Some(Wipe)),
                Event::CleanDone,
                To(State::Unknown),
            ),
            // error
            (
                "provision after an error",
                error(O::Birth, Partition, "x", a),
                provision("b"),
                To(birth("b", None, false)),
            ),
            (
                "reimage after an error, keep",
                error(O::Birth, Partition, "x", a),
                reimage(None),
                To(rebirth("debian/a", a, None, false)),
            ),
            (
                "reimage after an error, to b",
                error(O::Birth, Partition, "x", a),
                reimage(Some("b")),
                To(rebirth("b", a, None, false)),
            ),
            (
                "clean after an error",
                error(O::Birth, Partition, "x", a),
                Event::CleanRequested,
                To(clean(None)),
            ),
            (
                "failure reported again",
                error(O::Birth, Partition, "x", a),
                failed(Partition, "x "),
                Same,
            ),
            (
                "another failure",
                error(O::Birth, Partition, "x", a),
                failed(Partition, "y"),
                Err("step failed does not apply to a node in error"),
            ),
            (
                "step in error",
                error(O::Birth, Partition, "x", a),
                done(Filesystems),
                Err("step done does not apply to a node in error"),
            ),
            (
                "sync in error",
                error(O::Birth, Sync, "x", a),
                synced("debian/a"),
                Err("subd synced does not apply to a node in error"),
            ),
            (
                "clean done in error",
                error(O::Clean, Wipe, "x", None),
                Event::CleanDone,
                Err("clean done does not apply to a node in error"),
            ),
            (
                "reimage, keep, after a failed clean",
                error(O::Clean, Wipe, "x", None),
                reimage(None),
                Err("the node has no image to keep: name the image to install"),
            ),
            (
                "reimage after a failed clean",
                error(O::Clean, Wipe, "x", None),
                reimage(Some("b")),
                To(rebirth("b", None, None, false)),
            ),
            (
                "provision after a failed clean",
                error(O::Clean, Wipe, "x", None),
                provision("b"),
                To(birth("b", None, false)),
            ),
        ];
        for (what, state, event, want) in rows {
            let before = Provisioning {
                state: state.clone(),
                since_ms: T0,
                updated_ms: T0 + 1,
                started_ms: None,
            };
            let got = before.apply(&event, NOW);
            match (got, want) {
                (Ok(t), To(after)) => {
                    assert!(t.changed, "{what}");
                    assert_eq!(t.record.state, after, "{what}");
                    assert_eq!(t.record.updated_ms, NOW, "{what}");
                    let same_kind =
                        std::mem::discriminant(&state) == std::mem::discriminant(&after);
                    let since = if same_kind { T0 } else { NOW };
                    assert_eq!(t.record.since_ms, since, "{what}: since_ms");
                    assert_eq!(t.serve, t.record.serve(), "{what}");
                    assert!(
                        t.summary
                            .starts_with(&format!("{} → {}: ", state.name(), after.name())),
                        "{what}: {}",
                        t.summary
                    );
                }
                (Ok(t), Same) => {
                    assert!(!t.changed, "{what}");
                    assert_eq!(t.record, before, "{what}: a repeat changes nothing");
                    assert!(
                        t.summary.ends_with(" again; nothing changes"),
                        "{}",
                        t.summary
                    );
                    assert_eq!(t.serve, before.serve());
                }
                (Result::Err(e), Err(start)) => {
                    let e = e.to_string();
                    assert!(e.starts_with(start), "{what}: {e}");
                }
                (got, Want::To(s)) => panic!("{what}: got {got:?}, want {s:?}"),
                (got, Same) => panic!("{what}: got {got:?}, want a repeat"),
                (got, Err(e)) => panic!("{what}: got {got:?}, want error {e:?}"),
            }
        }
    }

    #[test]
    fn what_the_boot_script_serves() {
        let rows = [
            (State::Unknown, Serve::InspectionRamdisk, None),
            (
                birth("a", None, false),
                Serve::BirthRamdisk { image: "a".into() },
                Some("birth"),
            ),
            (
                rebirth("b", Some("a"), None, false),
                Serve::RebirthRamdisk { image: "b".into() },
                Some("rebirth"),
            ),
            (clean(None), Serve::CleanRamdisk, Some("clean")),
            (healthy("a"), Serve::LocalDisk, None),
            (
                error(Operation::Rebirth, Step::ObjectCache, "x", Some("b")),
                Serve::InspectionRamdisk,
                None,
            ),
        ];
        for (state, serve, mode) in rows {
            let p = Provisioning {
                state,
                since_ms: 0,
                updated_ms: 0,
                started_ms: None,
            };
            assert_eq!(p.serve(), serve, "{:?}", p.state);
            assert_eq!(serve.ramdisk_mode(), mode);
        }
    }

    /// A whole fresh install and a re-image, event by event, with the boot script after each.
    #[test]
    fn a_life() {
        use Step::*;
        let mut p = Provisioning::new(0);
        let events = [
            (provision("debian/a"), "birth_ramdisk"),
            (done(ChooseDisk), "birth_ramdisk"),
            (done(Partition), "birth_ramdisk"),
            (done(Filesystems), "birth_ramdisk"),
            (done(StartSubd), "birth_ramdisk"),
            (done(Register), "birth_ramdisk"),
            (synced("debian/a"), "birth_ramdisk"),
            (done(BootLoader), "birth_ramdisk"),
            (done(Identity), "birth_ramdisk"),
            (done(HandOver), "local_disk"),
            (reimage(Some("debian/b")), "rebirth_ramdisk"),
            (done(ChooseDisk), "rebirth_ramdisk"),
            (done(ObjectCache), "rebirth_ramdisk"),
            (done(StartSubd), "rebirth_ramdisk"),
            (done(Register), "rebirth_ramdisk"),
            (synced("debian/b"), "rebirth_ramdisk"),
            (done(BootLoader), "rebirth_ramdisk"),
            (done(HandOver), "local_disk"),
            (Event::CleanRequested, "clean_ramdisk"),
            (done(Wipe), "clean_ramdisk"),
            (Event::CleanDone, "inspection_ramdisk"),
        ];
        for (i, (event, serve)) in events.into_iter().enumerate() {
            let t = p.apply(&event, 10 * (i as u64 + 1)).unwrap();
            assert!(t.changed, "{event:?}");
            assert_eq!(serde_json::to_value(&t.serve).unwrap()["serve"], serve);
            p = t.record;
        }
        assert_eq!(p.state, State::Unknown);
    }

    /// The record as stored: flat JSON with the state's name in `state`.
    #[test]
    fn stored_json() {
        let p = Provisioning {
            state: rebirth("debian/b", Some("debian/a"), Some(Step::ObjectCache), false),
            since_ms: 1,
            updated_ms: 2,
            started_ms: None,
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            json!({"state": "rebirth", "image": "debian/b", "previous_image": "debian/a",
                   "last_step": "object_cache", "synced": false, "since_ms": 1, "updated_ms": 2})
        );
        let all = [
            State::Unknown,
            birth("a", None, false),
            birth("a", Some(Step::BootLoader), true),
            healthy("a"),
            rebirth("b", None, None, false),
            clean(None),
            clean(Some(Step::Wipe)),
            error(Operation::Clean, Step::Wipe, "x", None),
            error(Operation::Birth, Step::Sync, "fetch failed", Some("a")),
        ];
        for state in all {
            let p = Provisioning {
                state,
                since_ms: u64::MAX,
                updated_ms: 0,
                started_ms: None,
            };
            let text = serde_json::to_string(&p).unwrap();
            assert_eq!(
                serde_json::from_str::<Provisioning>(&text).unwrap(),
                p,
                "{text}"
            );
        }
        assert_eq!(
            serde_json::to_value(error(Operation::Birth, Step::Partition, "m", Some("a"))).unwrap(),
            json!({"state": "error", "operation": "birth", "step": "partition", "message": "m", "image": "a"})
        );
        let unknown: Provisioning =
            serde_json::from_str(r#"{"state": "unknown", "since_ms": 3, "updated_ms": 4}"#)
                .unwrap();
        assert_eq!(unknown.state, State::Unknown);
        for bad in [
            r#"{"state": "reborn", "since_ms": 3, "updated_ms": 4}"#,
            r#"{"state": "birth", "since_ms": 3, "updated_ms": 4}"#,
            r#"{"since_ms": 3, "updated_ms": 4}"#,
        ] {
            assert!(serde_json::from_str::<Provisioning>(bad).is_err(), "{bad}");
        }
        // Events as the API and the agent post them.
        let events = [
            (
                r#"{"event": "provision_requested", "image": "a"}"#,
                provision("a"),
            ),
            (r#"{"event": "reimage_requested"}"#, reimage(None)),
            (
                r#"{"event": "reimage_requested", "image": "b"}"#,
                reimage(Some("b")),
            ),
            (r#"{"event": "clean_requested"}"#, Event::CleanRequested),
            (
                r#"{"event": "step_done", "step": "hand_over"}"#,
                done(Step::HandOver),
            ),
            (
                r#"{"event": "step_failed", "step": "wipe", "message": "m"}"#,
                failed(Step::Wipe, "m"),
            ),
            (r#"{"event": "subd_synced", "image": "a"}"#, synced("a")),
            (r#"{"event": "clean_done"}"#, Event::CleanDone),
        ];
        for (text, event) in events {
            assert_eq!(
                serde_json::from_str::<Event>(text).unwrap(),
                event,
                "{text}"
            );
        }
        for step in Operation::Rebirth.steps().iter().chain([&Step::Wipe]) {
            assert_eq!(serde_json::to_value(step).unwrap(), step.as_str());
        }
    }

    #[test]
    fn long_failure_messages_are_bounded() {
        let p = Provisioning {
            state: birth("a", None, false),
            since_ms: 0,
            updated_ms: 0,
            started_ms: None,
        };
        let t = p
            .apply(&failed(Step::Partition, &"é".repeat(10_000)), 1)
            .unwrap();
        let State::Error { message, .. } = &t.record.state else {
            panic!()
        };
        assert_eq!(message.chars().count(), 2001);
        assert!(message.ends_with('…'));
        // Reported again, the same failure is recognised as a repeat.
        let again = t
            .record
            .apply(&failed(Step::Partition, &"é".repeat(10_000)), 2)
            .unwrap();
        assert!(!again.changed);
    }

    /// A run that stops reporting: the state, whether its ramdisk has reported (started),
    /// the time since its last report → the step it fails at, or nothing. `sync` has its own
    /// timeout; a run whose machine never booted the ramdisk never times out.
    #[test]
    fn expiry_table() {
        use Step::*;
        let limits = Timeouts {
            step_ms: 60_000,
            sync_ms: 300_000,
        };
        type Row = (State, bool, u64, Option<(Operation, Step, &'static str)>);
        let rows: Vec<Row> = vec![
            // Requested, the machine still powered off (or never booted): however long.
            (birth("a", None, false), false, u64::MAX, None),
            (rebirth("b", Some("a"), None, false), false, u64::MAX, None),
            (clean(None), false, u64::MAX, None),
            // Started: the first step is due within the step timeout.
            (birth("a", None, false), true, 60_000, None),
            (
                birth("a", None, false),
                true,
                90_000,
                Some((
                    Operation::Birth,
                    ChooseDisk,
                    "no report for 90 s (timeout 60 s)",
                )),
            ),
            (birth("a", Some(Partition), false), true, 60_000, None),
            (
                birth("a", Some(Partition), false),
                true,
                60_001,
                Some((
                    Operation::Birth,
                    Filesystems,
                    "no report for 60 s (timeout 60 s); last step done: partition",
                )),
            ),
            // A step reported starts the clock even without started_ms (older records).
            (
                birth("a", Some(Partition), false),
                false,
                60_001,
                Some((Operation::Birth, Filesystems, "last step done: partition")),
            ),
            // Registered, waiting for the dominator's sync: the sync timeout.
            (birth("a", Some(Register), false), true, 60_001, None),
            (birth("a", Some(Register), false), true, 300_000, None),
            (
                birth("a", Some(Register), false),
                true,
                300_001,
                Some((
                    Operation::Birth,
                    Sync,
                    "no report for 300 s (timeout 300 s); last step done: register",
                )),
            ),
            (
                rebirth("b", Some("a"), Some(Register), false),
                true,
                300_001,
                Some((Operation::Rebirth, Sync, "last step done: register")),
            ),
            // Synced: the steps after it have the step timeout again.
            (
                birth("a", Some(Register), true),
                true,
                60_001,
                Some((Operation::Birth, BootLoader, "last step done: sync")),
            ),
            (
                birth("a", Some(Identity), true),
                true,
                60_001,
                Some((Operation::Birth, HandOver, "last step done: identity")),
            ),
            (
                rebirth("b", None, Some(Filesystems), false),
                true,
                60_001,
                Some((Operation::Rebirth, ObjectCache, "")),
            ),
            (clean(None), true, 60_000, None),
            (
                clean(None),
                true,
                60_001,
                Some((Operation::Clean, Wipe, "no report for 60 s (timeout 60 s)")),
            ),
            (
                clean(Some(Wipe)),
                false,
                60_001,
                Some((Operation::Clean, Wipe, "last step done: wipe")),
            ),
            // No run: nothing to expire.
            (healthy("a"), true, u64::MAX, None),
            (State::Unknown, true, u64::MAX, None),
            (
                error(Operation::Birth, Sync, "x", Some("a")),
                true,
                u64::MAX,
                None,
            ),
        ];
        for (state, started, quiet, want) in rows {
            let p = Provisioning {
                state: state.clone(),
                since_ms: 0,
                updated_ms: 1_000,
                started_ms: started.then_some(500),
            };
            let got = p.expire(1_000u64.saturating_add(quiet), &limits);
            let what = format!("{state:?} started={started} quiet={quiet}");
            match (got, want) {
                (None, None) => {}
                (Some(t), Some((operation, step, text))) => {
                    let State::Error {
                        operation: o,
                        step: s,
                        message,
                        image,
                    } = &t.record.state
                    else {
                        panic!("{what}: {:?}", t.record.state)
                    };
                    assert_eq!((*o, *s), (operation, step), "{what}");
                    assert!(message.contains(text), "{what}: {message}");
                    assert_eq!(image.as_deref(), state.image());
                    assert_eq!(t.serve, Serve::InspectionRamdisk);
                    assert_eq!(t.record.started_ms, None, "{what}: the run is over");
                    assert!(
                        t.summary.starts_with(&format!(
                            "{} → error: step {} timed out: ",
                            state.name(),
                            step.as_str()
                        )),
                        "{what}: {}",
                        t.summary
                    );
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
        // A clock that went back is no timeout.
        let p = Provisioning {
            state: birth("a", None, false),
            since_ms: 0,
            updated_ms: 1_000_000,
            started_ms: Some(1_000_000),
        };
        assert_eq!(p.expire(0, &limits), None);
        // The clock counts from the start when it is the latest thing that happened.
        let p = Provisioning {
            state: birth("a", None, false),
            since_ms: 0,
            updated_ms: 0,
            started_ms: Some(100_000),
        };
        assert_eq!(p.expire(160_000, &limits), None);
        assert!(p.expire(160_001, &limits).is_some());
    }

    /// The run's clock: set by the first report from the ramdisk (`provision/next`
    /// answering its mode, or a step), kept while the run goes on, gone with the run.
    #[test]
    fn the_clock_starts_at_the_first_report() {
        use Step::*;
        let limits = Timeouts {
            step_ms: 1_000,
            sync_ms: 5_000,
        };
        let requested = Provisioning::new(0)
            .apply(&provision("a"), 10)
            .unwrap()
            .record;
        assert_eq!(requested.started_ms, None);
        // Powered off for a day: still waiting, no error.
        assert_eq!(requested.expire(86_400_000, &limits), None);
        // The machine boots the ramdisk a day later and asks what to do.
        let t = requested.apply(&Event::RunStarted, 86_400_000).unwrap();
        assert!(t.changed);
        assert_eq!(t.record.started_ms, Some(86_400_000));
        assert_eq!(t.record.state, requested.state, "only the clock changes");
        assert_eq!(t.record.since_ms, 10);
        assert_eq!(
            t.summary,
            "birth → birth: the ramdisk started the run (image a)"
        );
        let up = t.record;
        // Asked again (the agent retried): nothing changes, the clock keeps its start.
        let again = up.apply(&Event::RunStarted, 86_400_500).unwrap();
        assert!(!again.changed);
        assert_eq!(up.expire(86_401_000, &limits), None);
        assert!(up.expire(86_401_001, &limits).is_some());
        // Steps keep the start and move the last report.
        let step = up.apply(&done(ChooseDisk), 86_400_900).unwrap().record;
        assert_eq!(step.started_ms, Some(86_400_000));
        assert_eq!(step.expire(86_401_500, &limits), None);
        // A first step without a `next` (an agent that skipped it) starts the clock too.
        let direct = requested.apply(&done(ChooseDisk), 20).unwrap().record;
        assert_eq!(direct.started_ms, Some(20));
        let wipe = Provisioning::new(0)
            .apply(&Event::CleanRequested, 1)
            .unwrap()
            .record
            .apply(&done(Wipe), 7)
            .unwrap()
            .record;
        assert_eq!(wipe.started_ms, Some(7));
        // The run ends (healthy, error, unknown) or another begins (clean): no clock.
        let failed_run = step.apply(&failed(Partition, "x"), 86_401_000).unwrap();
        assert_eq!(failed_run.record.started_ms, None);
        let cleaned = step.apply(&Event::CleanRequested, 86_401_000).unwrap();
        assert_eq!(cleaned.record.started_ms, None);
        assert_eq!(cleaned.record.expire(u64::MAX, &limits), None);
        assert_eq!(
            wipe.apply(&Event::CleanDone, 9).unwrap().record.started_ms,
            None
        );
        // Only a run can start.
        for idle in [
            State::Unknown,
            healthy("a"),
            error(Operation::Birth, Partition, "x", Some("a")),
        ] {
            let p = Provisioning {
                state: idle.clone(),
                since_ms: 0,
                updated_ms: 0,
                started_ms: None,
            };
            let e = p.apply(&Event::RunStarted, 1).unwrap_err().to_string();
            assert!(
                e.starts_with("run started does not apply to a node in "),
                "{idle:?}: {e}"
            );
        }
        // Stored only while set.
        let v = serde_json::to_value(&up).unwrap();
        assert_eq!(v["started_ms"], 86_400_000);
        assert!(
            serde_json::to_value(&requested)
                .unwrap()
                .get("started_ms")
                .is_none()
        );
        assert_eq!(serde_json::from_value::<Provisioning>(v).unwrap(), up);
        assert_eq!(
            serde_json::from_str::<Event>(r#"{"event": "run_started"}"#).unwrap(),
            Event::RunStarted
        );
    }
}
