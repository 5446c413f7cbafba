//! Load-driven capacity (verwalter's scheduler, with the semantics of Kubernetes'
//! HorizontalPodAutoscaler): how many instances a role with `scale` wants, from the metric
//! its live instances report. Pure: the metrics, the time and what was decided before are
//! passed in, and what to remember is handed back ([`ScaleState`]).
//!
//! * **Raw**: `clamp(⌈Σ metric / target_per_instance⌉, min, max)`, over the live instances
//!   that report the metric (a dead instance's lease is gone, and its metric with it).
//! * **Tolerance**: while `Σ / (desired × target)` is within `tolerance` of 1, nothing
//!   changes (no flapping around the target).
//! * **Up** at once, at most `up_per_min` instances per `rate_secs` (60 s by default).
//! * **Down** only as far as every recommendation of the last `down_stabilise_secs` allows
//!   (the highest of them, HPA's rule), once that much history exists, and at most
//!   `down_per_min` instances per `rate_secs`.
//! * No instance reports the metric: the desired count stays where it was.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A role's `scale` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// The metric its instances register (`paddock census hold --metric rps=120`).
    pub metric: String,
    /// The load one instance is meant to carry.
    pub target_per_instance: f64,
    /// How far from the target the load per instance may be before the count changes.
    #[serde(default = "tolerance")]
    pub tolerance: f64,
    /// Instances added at most per `rate_secs`.
    #[serde(default = "up_per_min")]
    pub up_per_min: u32,
    /// Instances removed at most per `rate_secs`.
    #[serde(default = "down_per_min")]
    pub down_per_min: u32,
    /// A decrease waits until every recommendation this long called for it.
    #[serde(default = "down_stabilise_secs")]
    pub down_stabilise_secs: u64,
    /// The period the rates count in (a minute; shorter in tests).
    #[serde(default = "rate_secs")]
    pub rate_secs: u64,
}

/// Its numbers are checked finite ([`Scale::problem`]), so equality is an equivalence.
impl Eq for Scale {}

fn tolerance() -> f64 {
    0.1
}
fn up_per_min() -> u32 {
    5
}
fn down_per_min() -> u32 {
    1
}
fn down_stabilise_secs() -> u64 {
    300
}
fn rate_secs() -> u64 {
    60
}

impl Scale {
    /// Why the table cannot be used, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if !(self.target_per_instance.is_finite() && self.target_per_instance > 0.0) {
            return Some(format!(
                "target_per_instance {} must be a number above 0",
                self.target_per_instance
            ));
        }
        if !(0.0..1.0).contains(&self.tolerance) {
            return Some(format!(
                "tolerance {} must be at least 0 and below 1",
                self.tolerance
            ));
        }
        if self.up_per_min == 0 || self.down_per_min == 0 {
            return Some("up_per_min and down_per_min must be at least 1".into());
        }
        if self.rate_secs == 0 {
            return Some("rate_secs must be at least 1".into());
        }
        None
    }
}

/// What is remembered of a scaled role between rounds (kept with each round, so a new
/// leader goes on from the last one's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleState {
    /// The count last decided.
    pub desired: Option<u64>,
    /// Since when recommendations have been kept without a gap (ms).
    pub since_ms: Option<i64>,
    /// Recommendations within the stabilisation window: (ms, count).
    pub recommendations: VecDeque<(i64, u64)>,
    /// Changes of the desired count within the rate period: (ms, signed change).
    pub changes: VecDeque<(i64, i64)>,
}

/// One decision: the count, and why, for the round's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub desired: u64,
    /// The metric's sum over the live instances that report it (none: none does).
    pub load: Option<f64>,
    pub reason: String,
}

/// The load is a sum of finite metrics, so equality is an equivalence.
impl Eq for Decision {}

/// The count `scale` wants for a role whose live instances number `current` and report
/// `metrics`, bounded by `min` and `max` (`u64::MAX`: none), at `now_ms`; `state` is what
/// the last decision left, and is updated.
pub fn desired(
    scale: &Scale,
    min: u64,
    max: u64,
    current: u64,
    metrics: &[f64],
    state: &mut ScaleState,
    now_ms: i64,
) -> Decision {
    let max = max.max(min);
    let base = state.desired.unwrap_or(current).clamp(min, max);
    let per = i64::try_from(scale.rate_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let window = i64::try_from(scale.down_stabilise_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    state.changes.retain(|(at, _)| now_ms - at < per);
    let decide = |state: &mut ScaleState, desired: u64, load, reason: String| {
        if desired != base {
            let delta = i64::try_from(desired).unwrap_or(i64::MAX)
                - i64::try_from(base).unwrap_or(i64::MAX);
            state.changes.push_back((now_ms, delta));
        }
        state.desired = Some(desired);
        Decision {
            desired,
            load,
            reason,
        }
    };
    let usable: Vec<f64> = metrics
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect();
    if usable.is_empty() {
        return decide(
            state,
            base,
            None,
            format!("no live instance reports {}: kept at {base}", scale.metric),
        );
    }
    let load: f64 = usable.iter().sum();
    let per_instance = scale.target_per_instance;
    let want = (load / per_instance).ceil();
    let raw = if want >= u64::MAX as f64 {
        max
    } else {
        (want as u64).clamp(min, max)
    };
    let ratio = if base == 0 {
        f64::INFINITY
    } else {
        load / (base as f64 * per_instance)
    };
    let recommendation = if (ratio - 1.0).abs() <= scale.tolerance {
        base
    } else {
        raw
    };
    state.since_ms.get_or_insert(now_ms);
    state.recommendations.push_back((now_ms, recommendation));
    state
        .recommendations
        .retain(|(at, _)| now_ms - at <= window);
    let what = format!(
        "{} = {load} over {} instance(s)",
        scale.metric,
        usable.len()
    );
    if recommendation > base {
        let added: i64 = state.changes.iter().map(|(_, d)| (*d).max(0)).sum();
        let room = u64::try_from(i64::from(scale.up_per_min) - added).unwrap_or(0);
        let to = recommendation.min(base.saturating_add(room));
        let reason = if to < recommendation {
            format!(
                "{what} wants {recommendation}: up to {to} (at most {} per {} s)",
                scale.up_per_min, scale.rate_secs
            )
        } else {
            format!("{what} wants {recommendation}: up")
        };
        return decide(state, to, Some(load), reason);
    }
    if recommendation < base {
        let settled = state.since_ms.is_some_and(|since| now_ms - since >= window);
        if !settled {
            return decide(
                state,
                base,
                Some(load),
                format!(
                    "{what} wants {recommendation}: kept at {base} until {} s of history say so",
                    scale.down_stabilise_secs
                ),
            );
        }
        let highest = state
            .recommendations
            .iter()
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(recommendation);
        if highest >= base {
            return decide(
                state,
                base,
                Some(load),
                format!(
                    "{what} wants {recommendation}: kept at {base} (the last {} s wanted up to {highest})",
                    scale.down_stabilise_secs
                ),
            );
        }
        let removed: i64 = state.changes.iter().map(|(_, d)| (-*d).max(0)).sum();
        let room = u64::try_from(i64::from(scale.down_per_min) - removed).unwrap_or(0);
        let to = highest.max(base.saturating_sub(room));
        return decide(
            state,
            to,
            Some(load),
            format!("{what} wants {recommendation}: down to {to}"),
        );
    }
    decide(state, base, Some(load), format!("{what}: {base} holds it"))
}
