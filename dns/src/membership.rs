//! Who of a service's registered instances stands in its DNS records.
//!
//! An instance reports its own status; anything but up takes it out of its service's
//! records. Self-reports are damped, so that a bug or an overload that makes many instances
//! report down at once cannot empty a service in one stroke:
//! - at most `max(⌊n/3⌋, 1)` self-removals per service within any window (60 s by
//!   default), where `n` is the number of the service's registered instances;
//! - the self-removal of the last member in service takes effect only after a longer delay
//!   (600 s by default);
//! - hard removals (the registration is gone: the instance was stopped, its lease expired,
//!   its host went away) take effect at once and are not counted;
//! - an instance that reports up again is back in service at once.
//!
//! Pending self-removals are applied oldest report first (then by instance name); the
//! answer of [`Membership::observe`] says when the next one may become due, so that the
//! shell can wake then without polling.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use paddock_clock::UnixMs;

/// What an instance says of itself. An instance that says nothing is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Up,
    Down,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The window within which at most ⌊n/3⌋ (at least 1) self-removals take effect.
    pub window: Duration,
    /// How long the last member in service stays after it reported down.
    pub last_member_delay: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            window: Duration::from_secs(60),
            last_member_delay: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    in_service: bool,
    /// When it reported down while in service (a removal pending).
    down_since: Option<UnixMs>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Service {
    members: BTreeMap<String, State>,
    /// When the self-removals still inside the window took effect.
    removals: VecDeque<UnixMs>,
}

/// One service's state that another host needs to go on from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    /// Its instances in service, each with when it reported down (a removal pending).
    pub in_service: BTreeMap<String, Option<UnixMs>>,
    /// When the self-removals still inside the window took effect, oldest first.
    pub removals: Vec<UnixMs>,
}

/// The services' members and the removals they are owed. Keys are role names, then
/// instance names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    services: BTreeMap<String, Service>,
}

impl Membership {
    /// Takes the current registrations (`(role, instance, report)`, each instance once)
    /// at `now_ms`: instances no longer registered leave at once, new ones enter as they
    /// report, and self-removals are applied as far as the policy allows. Answers when the
    /// next pending self-removal may take effect, if any is pending.
    pub fn observe<'a>(
        &mut self,
        now: UnixMs,
        registrations: impl IntoIterator<Item = (&'a str, &'a str, Report)>,
        p: &Policy,
    ) -> Option<UnixMs> {
        let mut seen: BTreeMap<&str, BTreeMap<&str, Report>> = BTreeMap::new();
        for (role, instance, report) in registrations {
            seen.entry(role).or_default().insert(instance, report);
        }
        self.services
            .retain(|role, _| seen.contains_key(role.as_str()));
        for (role, reports) in seen {
            let service = self.services.entry(role.to_string()).or_default();
            service
                .members
                .retain(|instance, _| reports.contains_key(instance.as_str()));
            for (instance, report) in reports {
                let state = service
                    .members
                    .entry(instance.to_string())
                    .or_insert(State {
                        // A new instance enters as it reports: not in service if down,
                        // which is no removal (it never stood in the records).
                        in_service: report == Report::Up,
                        down_since: None,
                    });
                match report {
                    Report::Up => {
                        state.in_service = true;
                        state.down_since = None;
                    }
                    Report::Down if state.in_service => {
                        state.down_since.get_or_insert(now);
                    }
                    Report::Down => {}
                }
            }
        }
        self.services
            .values_mut()
            .filter_map(|s| s.settle(now, p))
            .min()
    }

    /// Each service's state, as another host can take it over ([`Membership::resume`]).
    pub fn carried(&self) -> BTreeMap<String, Carried> {
        self.services
            .iter()
            .map(|(role, s)| {
                let carried = Carried {
                    in_service: s
                        .members
                        .iter()
                        .filter(|(_, m)| m.in_service)
                        .map(|(i, m)| (i.clone(), m.down_since))
                        .collect(),
                    removals: s.removals.iter().copied().collect(),
                };
                (role.clone(), carried)
            })
            .collect()
    }

    /// A membership that goes on from another host's (one taking over the lead): its
    /// members in service stay in, their pending removals and the window's removals
    /// still count. Instances it did not have in service enter as they report.
    pub fn resume(carried: BTreeMap<String, Carried>) -> Membership {
        let services = carried
            .into_iter()
            .map(|(role, c)| {
                let members = c
                    .in_service
                    .into_iter()
                    .map(|(i, down_since)| {
                        let state = State {
                            in_service: true,
                            down_since,
                        };
                        (i, state)
                    })
                    .collect();
                let service = Service {
                    members,
                    removals: c.removals.into(),
                };
                (role, service)
            })
            .collect();
        Membership { services }
    }

    /// Whether the instance stands in its service's records.
    pub fn in_service(&self, role: &str, instance: &str) -> bool {
        self.services
            .get(role)
            .and_then(|s| s.members.get(instance))
            .is_some_and(|m| m.in_service)
    }

    /// The instances of a role, each with whether it is in service.
    pub fn members(&self, role: &str) -> impl Iterator<Item = (&str, bool)> {
        self.services
            .get(role)
            .into_iter()
            .flat_map(|s| s.members.iter().map(|(i, m)| (i.as_str(), m.in_service)))
    }
}

impl Service {
    /// Applies the pending self-removals now allowed; when the next may become due.
    fn settle(&mut self, now: UnixMs, p: &Policy) -> Option<UnixMs> {
        while self
            .removals
            .front()
            .is_some_and(|t| now.since(*t) >= p.window)
        {
            self.removals.pop_front();
        }
        let allowed = (self.members.len() / 3).max(1);
        let mut pending: Vec<(UnixMs, String)> = self
            .members
            .iter()
            .filter(|(_, m)| m.in_service)
            .filter_map(|(i, m)| m.down_since.map(|t| (t, i.clone())))
            .collect();
        pending.sort();
        for (since, instance) in pending {
            let in_service = self.members.values().filter(|m| m.in_service).count();
            if self.removals.len() >= allowed {
                let oldest = self.removals.front().copied().unwrap_or(now);
                return Some(oldest.after(p.window));
            }
            let last_due = since.after(p.last_member_delay);
            if in_service == 1 && now < last_due {
                return Some(last_due);
            }
            if let Some(m) = self.members.get_mut(&instance) {
                m.in_service = false;
                m.down_since = None;
            }
            self.removals.push_back(now);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000;

    fn at(ms: i64) -> UnixMs {
        UnixMs(ms)
    }

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("db{i}")).collect()
    }

    /// Observes the role `db` with the instances of `names`, those in `down` reporting down.
    fn observe(m: &mut Membership, now: i64, names: &[String], down: &[&str]) -> Option<UnixMs> {
        let regs: Vec<(&str, &str, Report)> = names
            .iter()
            .map(|n| {
                let r = if down.contains(&n.as_str()) {
                    Report::Down
                } else {
                    Report::Up
                };
                ("db", n.as_str(), r)
            })
            .collect();
        m.observe(at(now), regs, &Policy::default())
    }

    /// `n` instances of `db`, all observed up at time 0.
    fn started(n: usize) -> (Vec<String>, Membership) {
        let all = names(n);
        let mut m = Membership::default();
        assert_eq!(observe(&mut m, 0, &all, &[]), None);
        (all, m)
    }

    fn in_service(m: &Membership) -> usize {
        m.members("db").filter(|(_, up)| *up).count()
    }

    #[test]
    fn five_of_nine_going_down_leave_three_at_once_and_two_a_window_later() {
        let (all, mut m) = started(9);
        assert_eq!(in_service(&m), 9);
        let down = ["db1", "db2", "db3", "db4", "db5"];
        assert_eq!(observe(&mut m, 10 * S, &all, &down), Some(at(70 * S)));
        assert_eq!(in_service(&m), 6);
        // The oldest reports first, then by name.
        assert!(!m.in_service("db", "db1") && !m.in_service("db", "db3"));
        assert!(m.in_service("db", "db4") && m.in_service("db", "db5"));
        // Nothing more within the window, however often it is asked.
        assert_eq!(observe(&mut m, 69 * S, &all, &down), Some(at(70 * S)));
        assert_eq!(in_service(&m), 6);
        assert_eq!(observe(&mut m, 70 * S, &all, &down), None);
        assert_eq!(in_service(&m), 4);
        assert!(!m.in_service("db", "db5"));
    }

    #[test]
    fn the_last_member_leaves_only_after_the_long_delay() {
        let (all, mut m) = started(2);
        assert_eq!(observe(&mut m, 0, &all, &["db1"]), None);
        assert_eq!(in_service(&m), 1);
        // The last member reports down at 100 s: it stays until 700 s.
        assert_eq!(
            observe(&mut m, 100 * S, &all, &["db1", "db2"]),
            Some(at(700 * S))
        );
        assert_eq!(
            observe(&mut m, 699 * S, &all, &["db1", "db2"]),
            Some(at(700 * S))
        );
        assert!(m.in_service("db", "db2"));
        assert_eq!(observe(&mut m, 700 * S, &all, &["db1", "db2"]), None);
        assert_eq!(in_service(&m), 0);
        // Up again: back at once.
        observe(&mut m, 701 * S, &all, &["db1"]);
        assert!(m.in_service("db", "db2"));
    }

    #[test]
    fn a_lone_member_counts_as_the_last_and_one_removal_is_always_allowed() {
        let (one, mut m) = started(1);
        assert_eq!(observe(&mut m, 5 * S, &one, &["db1"]), Some(at(605 * S)));
        assert!(m.in_service("db", "db1"));
        // Two members: ⌊2/3⌋ = 0, yet one self-removal per window is allowed.
        let (two, mut m) = started(2);
        observe(&mut m, 0, &two, &["db2"]);
        assert!(!m.in_service("db", "db2"));
    }

    #[test]
    fn a_host_taking_over_goes_on_from_where_the_last_leader_was() {
        let (all, mut m) = started(9);
        let down = ["db1", "db2", "db3", "db4"];
        observe(&mut m, 10 * S, &all, &down);
        assert_eq!(in_service(&m), 6);
        // Taken as new members, all four would be out at once: no damping.
        let mut fresh = Membership::default();
        observe(&mut fresh, 20 * S, &all, &down);
        assert_eq!(in_service(&fresh), 5);
        // Resumed, db4's removal is still pending behind the window's three.
        let mut next = Membership::resume(m.carried());
        assert_eq!(next.carried(), m.carried());
        assert_eq!(observe(&mut next, 20 * S, &all, &down), Some(at(70 * S)));
        assert_eq!(in_service(&next), 6);
        assert_eq!(observe(&mut next, 70 * S, &all, &down), None);
        assert!(!next.in_service("db", "db4"));
    }

    #[test]
    fn hard_removals_take_effect_at_once_and_are_not_counted() {
        let (all, mut m) = started(9);
        observe(&mut m, S, &all, &["db1", "db2", "db3"]);
        assert_eq!(in_service(&m), 6);
        // Five registrations vanish (stopped, lease expired): gone at once, within the
        // window that the three self-removals used up.
        let left: Vec<String> = all[..4].to_vec();
        assert_eq!(observe(&mut m, 2 * S, &left, &["db1", "db2", "db3"]), None);
        assert_eq!(in_service(&m), 1);
        assert!(m.in_service("db", "db4"));
        assert!(!m.in_service("db", "db9"));
        // Every registration gone: the service is gone too.
        observe(&mut m, 3 * S, &[], &[]);
        assert_eq!(m.members("db").count(), 0);
    }

    #[test]
    fn a_new_instance_enters_as_it_reports_and_up_cancels_a_pending_removal() {
        let mut all = names(3);
        let mut m = Membership::default();
        observe(&mut m, 0, &all, &[]);
        all.push("db4".into());
        observe(&mut m, S, &all, &["db4"]);
        assert!(!m.in_service("db", "db4"));
        assert_eq!(in_service(&m), 3);
        // db4 was never in, so its down took no removal: db1 may still leave.
        observe(&mut m, 2 * S, &all, &["db1", "db2", "db4"]);
        assert!(!m.in_service("db", "db1"));
        assert!(
            m.in_service("db", "db2"),
            "one removal per window for 4 members"
        );
        observe(&mut m, 3 * S, &all, &["db1", "db4"]);
        assert!(m.in_service("db", "db2"));
        // Its pending removal was cancelled: it does not leave when the window opens.
        observe(&mut m, 70 * S, &all, &["db1", "db4"]);
        assert!(m.in_service("db", "db2"));
        assert_eq!(in_service(&m), 2);
    }

    #[test]
    fn services_are_damped_apart() {
        let mut m = Membership::default();
        let regs = |down: bool| {
            let r = if down { Report::Down } else { Report::Up };
            vec![
                ("a", "a1", r),
                ("a", "a2", Report::Up),
                ("b", "b1", r),
                ("b", "b2", Report::Up),
            ]
        };
        m.observe(at(0), regs(false), &Policy::default());
        m.observe(at(S), regs(true), &Policy::default());
        assert!(!m.in_service("a", "a1"));
        assert!(!m.in_service("b", "b1"));
    }
}
