//! The rollout machine against a simulated role: each host takes `DELAY` to land a version
//! it is set to (down meanwhile), then runs it, healthy if the version is good. Time is
//! whole seconds from 0; the machine is stepped every second, as the shell's loop would.

use std::collections::{BTreeMap, BTreeSet};

use paddock_clock::UnixMs;
use paddock_rollout::{Command, Effect, Instance, Phase, Policy, Rollout};

const DELAY: i64 = 5;

fn t(secs: i64) -> UnixMs {
    UnixMs(secs * 1_000)
}

struct Host {
    version: String,
    healthy: bool,
    landing: Option<(String, i64)>,
}

struct World {
    hosts: BTreeMap<String, Host>,
    good: BTreeSet<String>,
    /// Each host's versions as set, in order.
    sets: Vec<(String, String)>,
}

impl World {
    /// `n` hosts `h1`… on `version`, healthy; `good` the versions that run healthy.
    fn new(n: usize, version: &str, good: &[&str]) -> World {
        let hosts = (1..=n)
            .map(|i| {
                let h = Host {
                    version: version.into(),
                    healthy: true,
                    landing: None,
                };
                (format!("h{i}"), h)
            })
            .collect();
        World {
            hosts,
            good: good.iter().map(|g| g.to_string()).collect(),
            sets: Vec::new(),
        }
    }

    fn apply(&mut self, effects: &[Effect], now: i64) {
        for e in effects {
            let Effect::Set { host, version } = e else {
                continue;
            };
            let Some(h) = self.hosts.get_mut(host) else {
                continue;
            };
            let already = h.landing.as_ref().map(|l| &l.0) == Some(version)
                || (h.landing.is_none() && &h.version == version);
            if already {
                continue;
            }
            h.healthy = false;
            h.landing = Some((version.clone(), now + DELAY));
            self.sets.push((host.clone(), version.clone()));
        }
    }

    fn tick(&mut self, now: i64) {
        for h in self.hosts.values_mut() {
            if let Some((v, at)) = h.landing.take_if(|(_, at)| now >= *at) {
                let _ = at;
                h.healthy = self.good.contains(&v);
                h.version = v;
            }
        }
    }

    fn instances(&self) -> Vec<Instance> {
        self.hosts
            .iter()
            .map(|(name, h)| Instance {
                host: name.clone(),
                version: Some(h.version.clone()),
                healthy: h.healthy,
            })
            .collect()
    }

    fn healthy(&self) -> usize {
        self.hosts.values().filter(|h| h.healthy).count()
    }

    fn on(&self, version: &str) -> usize {
        self.hosts.values().filter(|h| h.version == version).count()
    }
}

/// Steps `r` every second over `[from, to)` (stopping once it has ended), checking after
/// every step that the role keeps `min` healthy instances (where it had them). Answers the
/// second it stopped at.
fn run(r: &mut Rollout, w: &mut World, min: u32, from: i64, to: i64) -> i64 {
    for now in from..to {
        w.tick(now);
        let before = w.healthy();
        let effects = r.step(t(now), &w.instances(), min);
        w.apply(&effects, now);
        let floor = before.min(min as usize);
        assert!(
            w.healthy() >= floor,
            "at {now} s: {} healthy, below {floor} ({:?})",
            w.healthy(),
            r.phase
        );
        if r.phase.ended() || matches!(r.phase, Phase::Paused { .. } | Phase::Promoting) {
            return now;
        }
    }
    to
}

fn policy(max_parallel: u32) -> Policy {
    Policy {
        max_parallel,
        ..Policy::default()
    }
}

#[test]
fn batches_never_take_the_role_below_its_minimum() {
    // Six hosts, minimum four, three at a time asked for: two at a time is all it may do.
    let mut w = World::new(6, "A", &["A", "B"]);
    let mut r = Rollout::start("db", "A", "B", policy(3), t(0));
    let end = run(&mut r, &mut w, 4, 0, 1_000);
    assert_eq!(r.phase, Phase::Done, "{:?}", r.why);
    assert_eq!(w.on("B"), 6);
    assert_eq!(r.batches, 3);
    // Each batch: 5 s to land, 10 s healthy: three batches in about 45 s.
    assert!((44..=50).contains(&end), "{end}");
    let firsts: Vec<&str> = w.sets.iter().take(2).map(|(h, _)| h.as_str()).collect();
    assert_eq!(firsts, ["h1", "h2"]);
}

#[test]
fn with_no_room_above_the_minimum_it_waits_and_says_why() {
    let mut w = World::new(4, "A", &["A", "B"]);
    let mut r = Rollout::start("db", "A", "B", policy(2), t(0));
    let effects = r.step(t(0), &w.instances(), 4);
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Set { .. })),
        "{effects:?}"
    );
    let why = r.why.clone().unwrap_or_default();
    assert!(
        why.contains("4 healthy") && why.contains("minimum is 4"),
        "{why}"
    );
    // Said once, not on every step.
    let again = r.step(t(1), &w.instances(), 4);
    assert!(again.is_empty(), "{again:?}");
    // A fifth host joins: room for one.
    w.hosts.insert(
        "h5".into(),
        Host {
            version: "A".into(),
            healthy: true,
            landing: None,
        },
    );
    run(&mut r, &mut w, 4, 2, 1_000);
    assert_eq!(r.phase, Phase::Done);
    assert!(w.sets.len() == 5, "{:?}", w.sets);
}

#[test]
fn canaries_wait_for_promote_then_the_rest_follow() {
    let mut w = World::new(5, "A", &["A", "B"]);
    let p = Policy {
        canary: 1,
        max_parallel: 2,
        ..Policy::default()
    };
    let mut r = Rollout::start("web", "A", "B", p, t(0));
    assert_eq!(r.phase, Phase::Canary);
    assert_eq!(r.version_for_new(), "A");
    let at = run(&mut r, &mut w, 3, 0, 1_000);
    assert_eq!(r.phase, Phase::Promoting);
    assert_eq!(w.on("B"), 1, "one canary");
    // An hour later, still waiting: no deadline runs while an operator decides.
    assert_eq!(run(&mut r, &mut w, 3, at, at + 3_600), at);
    let mut r2 = r.clone();
    for now in at..at + 3_600 {
        assert!(r2.step(t(now), &w.instances(), 3).is_empty());
    }
    assert_eq!(r2.phase, Phase::Promoting);
    r.command(Command::Promote, t(at + 3_600)).unwrap();
    assert_eq!(r.version_for_new(), "B");
    run(&mut r, &mut w, 3, at + 3_600, at + 5_000);
    assert_eq!(r.phase, Phase::Done);
    assert_eq!(w.on("B"), 5);
    // With auto_promote, no wait.
    let mut w = World::new(5, "A", &["A", "B"]);
    let p = Policy {
        canary: 1,
        auto_promote: true,
        ..Policy::default()
    };
    let mut r = Rollout::start("web", "A", "B", p, t(0));
    run(&mut r, &mut w, 3, 0, 1_000);
    assert_eq!(r.phase, Phase::Done);
}

#[test]
fn health_counts_after_min_healthy_and_a_flap_starts_it_again() {
    let p = Policy {
        min_healthy_secs: 10,
        ..Policy::default()
    };
    let mut r = Rollout::start("db", "A", "B", p, t(0));
    let on = |v: &str, healthy: bool| {
        vec![Instance {
            host: "h1".into(),
            version: Some(v.into()),
            healthy,
        }]
    };
    let effects = r.step(t(0), &on("A", true), 0);
    assert!(effects.contains(&Effect::Set {
        host: "h1".into(),
        version: "B".into()
    }));
    // Still on A and down: asked again (the shell's set is idempotent).
    let again = r.step(t(1), &on("A", false), 0);
    assert!(again.iter().any(|e| matches!(e, Effect::Set { .. })));
    r.step(t(5), &on("B", true), 0);
    r.step(t(10), &on("B", false), 0);
    r.step(t(12), &on("B", true), 0);
    r.step(t(21), &on("B", true), 0);
    assert_eq!(
        r.phase,
        Phase::Forward,
        "healthy since 12 s: not yet at 21 s"
    );
    assert_eq!(r.next_wake(), Some(t(22)));
    r.step(t(22), &on("B", true), 0);
    assert_eq!(r.phase, Phase::Done);
}

#[test]
fn a_failed_batch_pauses_without_auto_revert_and_the_rest_stay() {
    let mut w = World::new(6, "A", &["A"]);
    let p = Policy {
        max_parallel: 2,
        auto_revert: false,
        healthy_deadline_secs: 60,
        ..Policy::default()
    };
    let mut r = Rollout::start("db", "A", "B", p, t(0));
    let at = run(&mut r, &mut w, 4, 0, 1_000);
    assert_eq!(at, 60, "the batch fails at its healthy deadline");
    let Phase::Paused { failed, .. } = r.phase else {
        panic!("{:?}", r.phase)
    };
    assert!(failed);
    let why = r.why.clone().unwrap_or_default();
    assert!(
        why.contains("h1, h2") && why.contains("healthy_deadline_secs"),
        "{why}"
    );
    assert_eq!(w.on("A"), 4, "four hosts still on A");
    // The operator reverts: the two go back, nothing else moves.
    r.command(Command::Revert, t(100)).unwrap();
    run(&mut r, &mut w, 4, 100, 1_000);
    assert_eq!(r.phase, Phase::Reverted);
    assert_eq!(w.on("A"), 6);
    assert_eq!(w.sets.len(), 4, "{:?}", w.sets);
}

#[test]
fn a_canary_that_never_becomes_healthy_fails_at_the_progress_deadline() {
    // Nomad's stuck deployment: a canary that never gets healthy, with a long healthy
    // deadline, must still end, at the progress deadline, and go back.
    let mut w = World::new(4, "A", &["A"]);
    let p = Policy {
        canary: 1,
        healthy_deadline_secs: 7_200,
        progress_deadline_secs: 600,
        ..Policy::default()
    };
    let mut r = Rollout::start("db", "A", "B", p, t(0));
    for now in 0..600 {
        w.tick(now);
        let e = r.step(t(now), &w.instances(), 3);
        w.apply(&e, now);
    }
    assert_eq!(r.phase, Phase::Canary, "not a second before the deadline");
    w.tick(600);
    let e = r.step(t(600), &w.instances(), 3);
    w.apply(&e, 600);
    assert_eq!(r.phase, Phase::Reverting);
    assert!(
        r.why
            .clone()
            .unwrap_or_default()
            .contains("progress_deadline_secs")
    );
    run(&mut r, &mut w, 3, 601, 2_000);
    assert_eq!(r.phase, Phase::Reverted);
    assert_eq!(w.on("A"), 4);
}

#[test]
fn auto_revert_goes_straight_back_and_leaves_no_bad_instance() {
    // B is bad: the first batch fails, and the revert (no canary phase) takes both of its
    // hosts back at once, leaving none on B.
    let mut w = World::new(6, "A", &["A"]);
    let p = Policy {
        max_parallel: 2,
        canary: 0,
        healthy_deadline_secs: 30,
        ..Policy::default()
    };
    let mut r = Rollout::start("db", "A", "B", p, t(0));
    let mut phases = Vec::new();
    for now in 0..500 {
        w.tick(now);
        let e = r.step(t(now), &w.instances(), 4);
        w.apply(&e, now);
        if phases.last() != Some(&r.phase.name()) {
            phases.push(r.phase.name());
        }
        assert!(w.healthy() >= 4, "at {now}");
        if r.phase.ended() {
            break;
        }
    }
    assert_eq!(phases, ["forward", "reverting", "reverted"]);
    assert_eq!(w.on("A"), 6, "no instance left on B");
    // Every step is on the role's log, in order, with its time.
    let log: Vec<(i64, &str)> = r
        .log
        .iter()
        .map(|e| (e.at.0 / 1_000, e.text.as_str()))
        .collect();
    assert_eq!(log.first(), Some(&(0, "started: from A to B")));
    assert!(log.windows(2).all(|w| w[0].0 <= w[1].0), "{log:?}");
    assert!(
        log.iter()
            .any(|(_, t)| t.starts_with("reverting to A: ") && t.contains("healthy_deadline_secs")),
        "{log:?}"
    );
    assert_eq!(
        log.last().map(|e| e.1),
        Some("reverted: every instance healthy on A")
    );
    let moved: Vec<&str> = r.log.iter().filter_map(|e| e.host.as_deref()).collect();
    assert_eq!(moved.len(), 4, "two hosts there and back: {log:?}");
}

#[test]
fn the_log_keeps_the_newest_notes() {
    let mut r = Rollout::start("db", "A", "B", policy(1), t(0));
    for i in 0..300 {
        let (pause, resume) = (Command::Pause, Command::Resume);
        r.command(pause, t(2 * i)).unwrap();
        r.command(resume, t(2 * i + 1)).unwrap();
    }
    assert_eq!(r.log.len(), paddock_rollout::LOG_KEPT);
    assert_eq!(r.log.last().unwrap().text, "resumed");
    // 601 notes (the start, then one a second): the 200 from the 400th second on.
    assert_eq!(r.log.first().unwrap().at, t(400), "the oldest went first");
}

#[test]
fn a_revert_after_healthy_batches_takes_the_updated_back_in_batches() {
    let mut w = World::new(6, "A", &["A", "B"]);
    let mut r = Rollout::start("db", "A", "B", policy(2), t(0));
    // Two batches (four hosts) on B, then the operator reverts.
    let mut now = 0;
    while r.batches < 2 {
        w.tick(now);
        let e = r.step(t(now), &w.instances(), 4);
        w.apply(&e, now);
        now += 1;
    }
    assert!(w.on("B") >= 4);
    r.command(Command::Revert, t(now)).unwrap();
    assert_eq!(r.version_for_new(), "A");
    run(&mut r, &mut w, 4, now, now + 1_000);
    assert_eq!(r.phase, Phase::Reverted);
    assert_eq!(w.on("A"), 6);
}

#[test]
fn pause_holds_the_next_batch_and_resume_goes_on() {
    let mut w = World::new(4, "A", &["A", "B"]);
    let mut r = Rollout::start("db", "A", "B", policy(1), t(0));
    run(&mut r, &mut w, 2, 0, 3);
    r.command(Command::Pause, t(3)).unwrap();
    // The batch in flight lands; nothing new starts.
    for now in 3..200 {
        w.tick(now);
        let e = r.step(t(now), &w.instances(), 2);
        assert!(
            !e.iter().any(|e| matches!(e, Effect::Set { .. })),
            "at {now}: {e:?}"
        );
    }
    assert_eq!(w.on("B"), 1);
    assert!(r.command(Command::Promote, t(200)).is_err());
    r.command(Command::Resume, t(200)).unwrap();
    run(&mut r, &mut w, 2, 200, 1_000);
    assert_eq!(r.phase, Phase::Done);
    let err = r.command(Command::Pause, t(1_000)).unwrap_err();
    assert_eq!(err.to_string(), "cannot pause a rollout that is done");
}

#[test]
fn a_rollout_paused_for_max_paused_reverts_then_and_not_a_second_before() {
    // verwalter meant to do this and got the comparison backwards: both sides here.
    let p = Policy {
        max_paused_secs: 1_800,
        ..Policy::default()
    };
    for failed in [false, true] {
        let mut w = World::new(3, "A", if failed { &["A"] } else { &["A", "B"] });
        let mut r = Rollout::start(
            "db",
            "A",
            "B",
            Policy {
                auto_revert: false,
                ..p.clone()
            },
            t(0),
        );
        let paused_at = if failed {
            run(&mut r, &mut w, 1, 0, 10_000)
        } else {
            run(&mut r, &mut w, 1, 0, 2);
            r.command(Command::Pause, t(2)).unwrap();
            2
        };
        assert!(matches!(r.phase, Phase::Paused { .. }), "{:?}", r.phase);
        assert_eq!(r.next_wake(), Some(t(paused_at + 1_800)));
        let e = r.step(t(paused_at + 1_799), &w.instances(), 1);
        assert!(
            matches!(r.phase, Phase::Paused { .. }),
            "a second before: {e:?}"
        );
        r.step(t(paused_at + 1_800), &w.instances(), 1);
        assert_eq!(r.phase, Phase::Reverting, "failed: {failed}");
        assert!(
            r.why
                .clone()
                .unwrap_or_default()
                .contains("max_paused_secs")
        );
    }
}

#[test]
fn a_host_lost_mid_rollout_leaves_it_and_a_new_one_starts_on_the_reached_version() {
    let mut w = World::new(4, "A", &["A", "B"]);
    let mut r = Rollout::start("db", "A", "B", policy(2), t(0));
    run(&mut r, &mut w, 2, 0, 2);
    assert_eq!(r.batch.len(), 2);
    // h1, in the batch, is gone (its machine died); the role loop starts a replacement on
    // the version the rollout has reached.
    w.hosts.remove("h1");
    let e = r.step(t(2), &w.instances(), 2);
    assert!(e.contains(&Effect::Note {
        host: Some("h1".into()),
        text: "left the role during its update".into()
    }));
    assert_eq!(r.batch.len(), 1);
    let v = r.version_for_new().to_string();
    assert_eq!(v, "B");
    w.hosts.insert(
        "h9".into(),
        Host {
            version: v,
            healthy: true,
            landing: None,
        },
    );
    run(&mut r, &mut w, 2, 3, 1_000);
    assert_eq!(r.phase, Phase::Done);
    assert_eq!(w.on("B"), 4);
    assert!(
        !w.sets.iter().any(|(h, _)| h == "h9"),
        "the new host needed no update"
    );
}

#[test]
fn a_new_leader_goes_on_where_the_last_one_was() {
    let p = Policy {
        canary: 1,
        auto_promote: true,
        max_parallel: 2,
        ..Policy::default()
    };
    let script = |cut: Option<i64>| {
        let mut w = World::new(7, "A", &["A", "B"]);
        let mut r = Rollout::start("db", "A", "B", p.clone(), t(0));
        for now in 0..1_000 {
            if Some(now) == cut {
                // The leader dies; the next reads the state it kept.
                let kept = serde_json::to_string(&r).unwrap();
                r = serde_json::from_str(&kept).unwrap();
            }
            w.tick(now);
            let e = r.step(t(now), &w.instances(), 4);
            w.apply(&e, now);
            if r.phase.ended() {
                return (now, r, w.sets);
            }
        }
        panic!("no end");
    };
    let (end, whole, sets) = script(None);
    for cut in [3, 17, 30, end - 1] {
        let (end2, resumed, sets2) = script(Some(cut));
        assert_eq!(
            (end2, &resumed, &sets2),
            (end, &whole, &sets),
            "cut at {cut}"
        );
    }
}

#[test]
fn the_progress_deadline_restarts_on_every_healthy_batch_and_on_promotion() {
    // Each batch takes 15 s; six one at a time take 90 s, past a 40 s progress deadline
    // that each healthy batch starts again.
    let mut w = World::new(6, "A", &["A", "B"]);
    let p = Policy {
        progress_deadline_secs: 40,
        ..Policy::default()
    };
    let mut r = Rollout::start("db", "A", "B", p.clone(), t(0));
    let end = run(&mut r, &mut w, 5, 0, 1_000);
    assert_eq!(r.phase, Phase::Done, "{:?}", r.why);
    assert!(end > 80, "{end}");
    // A promotion after a long wait starts it again too.
    let mut w = World::new(3, "A", &["A", "B"]);
    let mut r = Rollout::start("db", "A", "B", Policy { canary: 1, ..p }, t(0));
    let at = run(&mut r, &mut w, 1, 0, 1_000);
    r.command(Command::Promote, t(at + 500)).unwrap();
    assert_eq!(r.progress_at, t(at + 500));
    run(&mut r, &mut w, 1, at + 500, at + 2_000);
    assert_eq!(r.phase, Phase::Done);
}

#[test]
fn policies_are_checked_and_commands_refused_out_of_turn() {
    assert!(Policy::default().problems().is_empty());
    let bad = Policy {
        max_parallel: 0,
        min_healthy_secs: 60,
        healthy_deadline_secs: 60,
        ..Policy::default()
    };
    let p = bad.problems().join("\n");
    assert!(
        p.contains("max_parallel") && p.contains("healthy_deadline_secs: 60"),
        "{p}"
    );
    let mut r = Rollout::start("db", "A", "B", Policy::default(), t(0));
    let e = r.command(Command::Promote, t(0)).unwrap_err();
    assert_eq!(e.to_string(), "cannot promote a rollout that is forward");
    assert!(r.command(Command::Resume, t(0)).is_err());
    r.command(Command::Revert, t(1)).unwrap();
    assert!(
        r.command(Command::Revert, t(2)).is_err(),
        "a revert runs to its end"
    );
}
