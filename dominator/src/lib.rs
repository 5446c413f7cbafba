//! The dominator (Dominator's `dom/herd`): keeps every sub — a machine running
//! `paddock-subd` — on the image the MDB requires of it.
//!
//! [`sub`] is the pure core: one sub's state machine, fed what happened (a poll answered, a
//! plan computed, a fetch or an update done or failed) and the time, and answering with the
//! next thing to do. It holds no I/O and no clock; the shell that polls subs over their RPC,
//! computes plans with `paddock_image::plan` and bounds how many run at once drives it.

pub mod client;
pub mod compute;
pub mod herd;
pub mod overlay;
pub mod sim;
pub mod sub;

pub use client::HttpSubRpc;
pub use compute::{Computed, PreparedImage, compute, provably_unchanged};
pub use herd::{
    Admission, Census, Change, ChangeReport, DisruptionCheck, DisruptionQuery, FetchProgress, Herd,
    ImageSource, Limits, Polled, RpcError, SubHealth, SubRpc, SubSpec, SubStatus, admit,
    high_impact_limit,
};
pub use overlay::{ComputedFile, Overlay, OverlayError, lay, without_lines_naming};
pub use sub::{Action, Desired, Disruption, Event, PlanSummary, Policy, PollAnswer, Sub, SubState};
