//! What the dashboard's charts over time draw from: a sample of the appliance every minute
//! (machines per provisioning state, the subs' compliance, the power-on queue), the last
//! day's kept in memory. A host that starts again starts a new history: the charts are a
//! view for the operator, and the store stays the record. Pure ring; the sampler is the
//! console's task.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// A day of minutes.
pub const KEPT: usize = 24 * 60;

/// The appliance at one minute.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: i64,
    /// Machines per provisioning state.
    pub states: BTreeMap<&'static str, u64>,
    pub synced: u64,
    pub subs: u64,
    pub power_queue: u64,
}

#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// Adds a sample, dropping the oldest beyond [`KEPT`].
    pub fn record(&self, sample: Sample) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() == KEPT {
            s.pop_front();
        }
        s.push_back(sample);
    }

    /// The samples taken at or after `since_ms`, oldest first, thinned to at most `points`
    /// (every k-th, keeping the newest).
    pub fn since(&self, since_ms: i64, points: usize) -> Vec<Sample> {
        let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let recent: Vec<&Sample> = s.iter().filter(|x| x.at_ms >= since_ms).collect();
        let step = recent.len().div_ceil(points.max(1)).max(1);
        let skip = (recent.len() + step - 1) % step;
        recent
            .into_iter()
            .skip(skip)
            .step_by(step)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_kept_and_thinned_to_the_points_asked_keeping_the_newest() {
        let h = History::default();
        for i in 0..(KEPT as i64 + 10) {
            h.record(Sample {
                at_ms: i * 60_000,
                subs: u64::try_from(i).unwrap(),
                ..Sample::default()
            });
        }
        let all = h.since(0, usize::MAX);
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0].subs, 10);
        let hour = h.since((KEPT as i64 + 10 - 60) * 60_000, 12);
        assert_eq!(hour.len(), 12);
        assert_eq!(hour.last().unwrap().subs, KEPT as u64 + 9);
        assert_eq!(hour[0].subs, KEPT as u64 + 9 - 55);
    }
}
