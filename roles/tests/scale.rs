//! Load-driven capacity, table by table, with the time passed in: growth within the rate,
//! no flapping inside the tolerance, decline only after the stabilisation window, the
//! bounds, a dependee growing with its scaled depender, and dead instances' metrics.

use std::collections::BTreeMap;

use paddock_roles::{
    Census, Instance, Kind, Metric, Scale, ScaleState, Spec, decide, desired, plan, plan_with,
};

fn scale() -> Scale {
    Scale {
        metric: "rps".into(),
        target_per_instance: 100.0,
        tolerance: 0.1,
        up_per_min: 5,
        down_per_min: 1,
        down_stabilise_secs: 300,
        rate_secs: 60,
    }
}

const S: i64 = 1000;

/// Feeds `(at seconds, load)` and returns the desired count after each.
fn run(min: u64, max: u64, start: u64, steps: &[(i64, f64)]) -> Vec<u64> {
    let sc = scale();
    let mut st = ScaleState {
        desired: Some(start),
        ..ScaleState::default()
    };
    steps
        .iter()
        .map(|&(at, load)| desired(&sc, min, max, start, &[load], &mut st, at * S).desired)
        .collect()
}

#[test]
fn growth_is_immediate_but_within_the_rate() {
    // 1,000 rps wants 10: 5 at once from 2 (7), nothing more within the minute, then 10.
    assert_eq!(
        run(
            1,
            20,
            2,
            &[
                (0, 1000.0),
                (30, 1000.0),
                (59, 1000.0),
                (60, 1000.0),
                (61, 1000.0)
            ]
        ),
        [7, 7, 7, 10, 10]
    );
}

#[test]
fn inside_the_tolerance_nothing_changes() {
    // 10 instances at 100 each: ±10 % is not a reason to move; 12 % is.
    assert_eq!(
        run(
            1,
            20,
            10,
            &[
                (0, 1050.0),
                (10, 950.0),
                (20, 1090.0),
                (30, 1000.0),
                (40, 1120.0)
            ]
        ),
        [10, 10, 10, 10, 12]
    );
}

#[test]
fn one_instance_too_many_is_kept_inside_the_tolerance_only() {
    // Eleven carrying what ten hold (91 % of the target): kept for good at 10 %, taken back
    // once the window has passed at 5 %.
    let eleven = |tolerance: f64| -> Vec<u64> {
        let sc = Scale {
            tolerance,
            ..scale()
        };
        let mut st = ScaleState {
            desired: Some(11),
            ..ScaleState::default()
        };
        [0, 200, 301, 400]
            .iter()
            .map(|&at| desired(&sc, 1, 20, 11, &[1000.0], &mut st, at * S).desired)
            .collect()
    };
    assert_eq!(eleven(0.1), [11, 11, 11, 11]);
    assert_eq!(eleven(0.05), [11, 11, 10, 10]);
}

#[test]
fn decline_waits_for_the_whole_window_and_then_goes_slowly() {
    // The load falls to 300 at 0 s: nothing until 300 s of history wanted less, then one
    // instance per minute.
    let steps: Vec<(i64, f64)> = (0..=8).map(|m| (m * 60, 300.0)).collect();
    assert_eq!(run(1, 20, 10, &steps), [10, 10, 10, 10, 10, 9, 8, 7, 6]);
    // A spike inside the window holds the count where the spike wanted it.
    let spiky = [
        (0, 300.0),
        (100, 1000.0),
        (300, 300.0),
        (350, 300.0),
        (401, 300.0),
        (461, 300.0),
    ];
    assert_eq!(run(1, 20, 10, &spiky), [10, 10, 10, 10, 9, 8]);
}

#[test]
fn the_bounds_hold_and_no_metric_keeps_the_count() {
    assert_eq!(run(2, 8, 6, &[(0, 1e9), (60, 1e9)]), [8, 8]);
    assert_eq!(
        run(
            2,
            8,
            6,
            &[(0, 0.0), (300, 0.0), (360, 0.0), (420, 0.0), (480, 0.0)]
        ),
        [6, 5, 4, 3, 2]
    );
    let sc = scale();
    let mut st = ScaleState::default();
    let d = desired(&sc, 1, 10, 4, &[], &mut st, 0);
    assert_eq!(d.desired, 4);
    assert_eq!(d.load, None);
    assert!(
        d.reason.contains("no live instance reports rps"),
        "{}",
        d.reason
    );
    // A count below the minimum starts at it.
    let mut st = ScaleState::default();
    assert_eq!(desired(&sc, 3, 10, 0, &[50.0], &mut st, 0).desired, 3);
}

fn spec() -> Spec {
    Spec::parse(
        "spec/web.toml",
        r#"
[roles.web]
min = 1
max = 20
start = { hook = "web.sh", args = ["i"] }
stop = { hook = "web-stop.sh", args = ["i"] }
depends = { cache = 4 }
scale = { metric = "rps", target_per_instance = 100 }

[roles.cache]
min = 1
start = { hook = "cache.sh", args = ["i"] }
stop = { hook = "cache-stop.sh", args = ["i"] }
"#,
    )
    .unwrap()
}

fn census(webs: usize, caches: usize, hosts: usize) -> Census {
    let mut c = Census::default();
    for i in 1..=hosts {
        c.hosts.push(paddock_roles::Host {
            name: format!("h{i:02}"),
            ..paddock_roles::Host::default()
        });
    }
    let mut n = 0;
    let mut add = |role: &str, count: usize, c: &mut Census| {
        for i in 1..=count {
            n += 1;
            c.instances.push(Instance {
                role: role.into(),
                id: format!("{role}-{i}"),
                host: Some(format!("h{n:02}")),
            });
        }
    };
    add("web", webs, &mut c);
    add("cache", caches, &mut c);
    c
}

fn report(c: &mut Census, role: &str, id: &str, rps: f64) {
    c.metrics
        .entry(role.into())
        .or_default()
        .entry(id.into())
        .or_default()
        .insert("rps".into(), Metric(rps));
}

#[test]
fn a_dependee_grows_with_its_scaled_depender_and_dead_instances_do_not_count() {
    let s = spec();
    let mut c = census(2, 1, 30);
    report(&mut c, "web", "web-1", 500.0);
    report(&mut c, "web", "web-2", 500.0);
    // web-9 is gone (not in the census): its report does not count.
    report(&mut c, "web", "web-9", 5000.0);
    assert_eq!(c.metric("web", "rps"), [500.0, 500.0]);
    let mut states = BTreeMap::new();
    let d = decide(&s, &c, &mut states, 0);
    assert_eq!(d["web"].desired, 7, "{:?}", d["web"]);
    assert_eq!(d["web"].load, Some(1000.0));
    let goals: BTreeMap<String, u64> = d.iter().map(|(r, x)| (r.clone(), x.desired)).collect();
    let p = plan_with(&s, &c, &goals);
    assert_eq!(p.roles["web"].target, 7);
    // One cache per four webs: 2 for 7.
    assert_eq!(p.roles["cache"].target, 2);
    let starts = |role: &str| {
        p.actions
            .iter()
            .filter(|a| a.kind == Kind::Start && a.role == role)
            .count()
    };
    assert_eq!((starts("web"), starts("cache")), (5, 1));
    // Without a goal the root grows to its max, as before.
    assert_eq!(plan(&s, &c).roles["web"].target, 20);
    // The load gone: after the window, down one at a time; the cache follows.
    let mut c = census(7, 2, 30);
    for i in 1..=7 {
        report(&mut c, "web", &format!("web-{i}"), 10.0);
    }
    let mut t = 0;
    let mut last = 0;
    while t <= 600 {
        last = decide(&s, &c, &mut states, t * 1000)["web"].desired;
        t += 60;
    }
    assert!(last < 7, "declined to {last}");
    let goals = BTreeMap::from([("web".to_string(), 4)]);
    let p = plan_with(&s, &c, &goals);
    assert_eq!((p.roles["web"].target, p.roles["cache"].target), (4, 2));
    let goals = BTreeMap::from([("web".to_string(), 1)]);
    let p = plan_with(&s, &c, &goals);
    assert_eq!(p.roles["web"].target, 1);
    assert!(
        p.actions.iter().all(|a| a.kind == Kind::Stop),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_bad_scale_table_is_refused_with_its_field() {
    for (table, want) in [
        (
            "{ metric = \"rps\", target_per_instance = 0 }",
            "target_per_instance 0",
        ),
        (
            "{ metric = \"rps\", target_per_instance = 10, tolerance = 1.5 }",
            "tolerance 1.5",
        ),
        (
            "{ metric = \"rps\", target_per_instance = 10, up_per_min = 0 }",
            "up_per_min",
        ),
        (
            "{ metric = \"-x\", target_per_instance = 10 }",
            "roles.web.scale.metric",
        ),
        (
            "{ metric = \"rps\", target = 10 }",
            "unknown field `target`",
        ),
    ] {
        let text = format!(
            "[roles.web]\nmin = 1\nstart = {{ hook = \"w\" }}\nstop = {{ hook = \"s\" }}\nscale = {table}\n"
        );
        let e = Spec::parse("spec/w.toml", &text).unwrap_err().to_string();
        assert!(e.contains(want), "{table}: {e}");
    }
}

/// A small deterministic generator (no dependency needed for a property test's inputs).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// A round replayed from its record plans what the round planned: for many random
/// censuses, loads and histories, the inputs as kept (JSON, as the store holds them) give
/// the same counts and the same plan, round after round.
#[test]
fn a_replay_of_a_kept_round_plans_the_same_always() {
    let s = spec();
    let mut rng = Lcg(7);
    for case in 0..200 {
        let mut c = census(
            1 + rng.next(12) as usize,
            rng.next(4) as usize,
            10 + rng.next(20) as usize,
        );
        let mut states = BTreeMap::new();
        for round in 0..5 {
            let ids: Vec<String> = c
                .instances
                .iter()
                .filter(|i| i.role == "web")
                .map(|i| i.id.clone())
                .collect();
            for id in ids {
                if rng.next(4) > 0 {
                    report(&mut c, "web", &id, rng.next(2000) as f64 + 0.5);
                }
            }
            let at = (round * 70 + case) as i64 * 1000;
            let kept_census: Census =
                serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            let kept_states: BTreeMap<String, ScaleState> =
                serde_json::from_str(&serde_json::to_string(&states).unwrap()).unwrap();
            let (live, decided) = paddock_roles::round_plan(&s, &c, &mut states, at);
            let mut replay_states = kept_states;
            let (again, redecided) =
                paddock_roles::round_plan(&s, &kept_census, &mut replay_states, at);
            assert_eq!(live, again, "case {case} round {round}");
            assert_eq!(decided, redecided, "case {case} round {round}");
            assert_eq!(states, replay_states, "case {case} round {round}");
            c = paddock_roles::applied(&c, &live);
        }
    }
}
