//! The inspector's periodic work on the leader: introspections that timed out, and the
//! timeline kept to its limits.

use std::sync::Arc;
use std::time::Duration;

use paddock_inspector::service::{Inspector, TimelineLimits, now_secs};

use crate::runtime::Runtime;

/// What the timeline keeps, and how often the leader prunes it.
#[derive(Clone, Debug)]
pub struct TimelineConfig {
    pub limits: TimelineLimits,
    pub prune_every: Duration,
}

/// Starts the leader's clean-up: `clean_up_period` for timeouts (Inspector's periodic
/// clean-up), `timeline.prune_every` for the newest entries per node and MAC and the last
/// introspections.
pub fn start(
    rt: &mut Runtime,
    inspector: &Arc<Inspector>,
    clean_up_period: Duration,
    timeline: &TimelineConfig,
) {
    let i = inspector.clone();
    rt.every_while_leading("introspection timeouts", clean_up_period, move |fence| {
        let i = i.clone();
        async move {
            match i.expire_fenced(now_secs(), fence.as_ref()).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(count = n, "inspector: introspections timed out"),
                Err(e) => tracing::error!(error = %e, "inspector: timeout check failed"),
            }
        }
    });
    let (i, limits) = (inspector.clone(), timeline.limits);
    rt.every_while_leading("timeline pruning", timeline.prune_every, move |fence| {
        let i = i.clone();
        async move {
            match i.prune_timeline(&limits, fence.as_ref()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "timeline: pruned"),
                Err(e) => tracing::error!(error = %e, "timeline: pruning failed"),
            }
        }
    });
}
