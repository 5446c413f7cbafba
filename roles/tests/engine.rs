//! The engine's table tests over BlacKnight's simulation spec (`spec/blacknight-sim.toml`)
//! and the diamond DAG of the reference (A(min 4)→B:1, A→C:1, B→C:1, C→D:1).

use paddock_roles::{
    Census, Host, Instance, Kind, Outcome, Plan, Spec, Why, applied, minimums, plan,
};

const SIM: &str = include_str!("../../spec/blacknight-sim.toml");
const APPLIANCE: &str = include_str!("../../spec/appliance.toml");

const DIAMOND: &str = r#"
[roles.a]
min = 4
start = { hook = "d/start.sh", args = ["i"] }
stop = { hook = "d/stop.sh", args = ["i"] }
depends = { b = 1, c = 1 }
[roles.b]
start = { hook = "d/start.sh", args = ["i"] }
stop = { hook = "d/stop.sh", args = ["i"] }
depends = { c = 1 }
[roles.c]
start = { hook = "d/start.sh", args = ["i"] }
stop = { hook = "d/stop.sh", args = ["i"] }
depends = { d = 1 }
[roles.d]
start = { hook = "d/start.sh", args = ["h"] }
stop = { hook = "d/stop.sh", args = ["h"] }
"#;

fn sim() -> Spec {
    Spec::parse("spec/blacknight-sim.toml", SIM).unwrap()
}

fn diamond() -> Spec {
    Spec::parse("diamond.toml", DIAMOND).unwrap()
}

fn hosts(n: usize) -> Vec<Host> {
    (1..=n)
        .map(|i| Host {
            name: format!("h{i:02}"),
            ..Host::default()
        })
        .collect()
}

fn census(n_hosts: usize, instances: &[(&str, &str, Option<&str>)]) -> Census {
    Census {
        hosts: hosts(n_hosts),
        instances: instances
            .iter()
            .map(|(role, id, host)| Instance {
                role: role.to_string(),
                id: id.to_string(),
                host: host.map(str::to_string),
            })
            .collect(),
        ..Census::default()
    }
}

/// The sim running: `ncs` node controllers on h01…, `apps` apps, one db, one hadoop.
fn sim_running(n_hosts: usize, ncs: usize, apps: usize) -> Census {
    let mut c = census(
        n_hosts,
        &[("db", "db-1", None), ("hadoop", "hadoop-1", None)],
    );
    for i in 1..=ncs {
        c.instances.push(Instance {
            role: "node_controller".into(),
            id: format!("node_controller-{i}"),
            host: Some(format!("h{i:02}")),
        });
    }
    for i in 1..=apps {
        c.instances.push(Instance {
            role: "app".into(),
            id: format!("app-{i}"),
            host: None,
        });
    }
    c
}

/// An action as one line: `start node_controller-1 on h01 (minimum)`.
fn lines(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .map(|a| {
            let kind = match a.kind {
                Kind::Start => "start",
                Kind::Stop => "stop",
            };
            let why = match a.why {
                Why::Minimum => "minimum",
                Why::Repurposed => "repurposed",
                Why::Growth => "growth",
                Why::AboveMax => "above max",
                Why::Orphaned => "orphaned",
                Why::Rollout => "rollout",
                Why::Load => "load",
            };
            match &a.host {
                Some(h) => format!("{kind} {} on {h} ({why})", a.instance),
                None => format!("{kind} {} ({why})", a.instance),
            }
        })
        .collect()
}

/// Plans, checks that carrying the plan out gives an empty plan with the same outcome, and
/// returns the plan.
fn plan_settles(spec: &Spec, census: &Census) -> Plan {
    let first = plan(spec, census);
    assert_eq!(
        plan(spec, census),
        first,
        "the same census gives the same plan"
    );
    let after = applied(census, &first);
    let second = plan(spec, &after);
    assert!(
        second.actions.is_empty(),
        "an applied plan must give an empty plan; got {:?}",
        lines(&second)
    );
    assert_eq!(second.outcome, first.outcome);
    first
}

fn target(p: &Plan, role: &str) -> u64 {
    p.roles[role].target
}

#[test]
fn minimums_are_inferred_in_topological_order() {
    let m = minimums(&sim()).unwrap();
    let got: Vec<(&str, u64)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        got,
        vec![
            ("app", 3),
            ("db", 1),
            ("hadoop", 1),
            // max(declared 1, ceil(3/2 + 1/2 + 1/2)): capacity shared, summed exactly.
            ("node_controller", 3),
            ("secondary_head", 0),
        ]
    );
    // BlacKnight's per-path DFS over-counts the diamond (D = 12); the diff needs 8.
    let m = minimums(&diamond()).unwrap();
    let got: Vec<(&str, u64)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(got, vec![("a", 4), ("b", 4), ("c", 8), ("d", 8)]);
}

#[test]
fn the_appliance_example_is_valid() {
    let spec = Spec::parse("spec/appliance.toml", APPLIANCE).unwrap();
    let m = minimums(&spec).unwrap();
    assert_eq!(m["worker"], 10);
    assert_eq!(m["monitor"], 1);
    assert_eq!(m["boot"], 1);
    assert_eq!(m["etcd"], 3);
}

/// BlacKnight's `__main__`: the sim spec on three idle hosts.
#[test]
fn from_nothing_on_three_hosts_restores_minimum_then_grows() {
    let p = plan_settles(&sim(), &census(3, &[]));
    assert_eq!(
        lines(&p),
        vec![
            "start node_controller-1 on h01 (minimum)",
            "start node_controller-2 on h02 (minimum)",
            "start node_controller-3 on h03 (minimum)",
            "start hadoop-1 (minimum)",
            "start db-1 (minimum)",
            "start app-1 (minimum)",
            "start app-2 (minimum)",
            "start app-3 (minimum)",
            // 3 node controllers serve ceil(4/2 + 1/2 + 1/2) = 3: a fourth app fits, a
            // fifth would need a fourth host; secondary_head would need one too.
            "start app-4 (growth)",
        ]
    );
    assert_eq!(p.outcome, Outcome::Viable);
}

#[test]
fn below_minimum_fail_stops_with_the_reason_and_no_actions() {
    // Two hosts cannot hold the 3 node controllers the minimum needs.
    let p = plan(&sim(), &census(2, &[]));
    assert!(p.actions.is_empty(), "{:?}", lines(&p));
    assert_eq!(
        p.outcome,
        Outcome::FailStop(
            "minimum viable cannot be reached: node_controller needs 1 more host(s): no idle host it may run on and no surplus host of another role to re-purpose".into()
        )
    );
    // Hosts lost under a running appliance: the same, and nothing already running is
    // stopped either.
    let running = sim_running(2, 2, 4);
    let p = plan(&sim(), &running);
    assert!(p.actions.is_empty(), "{:?}", lines(&p));
    assert!(matches!(p.outcome, Outcome::FailStop(_)));
}

#[test]
fn a_surplus_leaf_host_is_repurposed_to_restore_minimum() {
    // h03 runs secondary_head (min 0): surplus. A node controller died (its host is gone
    // from the census with it), so node_controller is one short.
    let mut c = sim_running(3, 2, 3);
    c.instances.push(Instance {
        role: "secondary_head".into(),
        id: "secondary_head-1".into(),
        host: Some("h03".into()),
    });
    let p = plan_settles(&sim(), &c);
    assert_eq!(
        lines(&p),
        vec![
            "stop secondary_head-1 on h03 (repurposed)",
            "start node_controller-3 on h03 (repurposed)",
            "start app-4 (growth)",
        ]
    );
    // Growth never re-purposes: with the minimum met, secondary_head stays where it is.
    let p = plan_settles(&sim(), &applied(&c, &p));
    assert!(p.actions.is_empty());
}

#[test]
fn growth_steps_are_all_or_nothing_across_the_chain() {
    // From nothing: 8 hosts for the minimum (d = 8). One more A needs B+1, C+2, D+2: two
    // hosts. With one spare host nothing grows (no D started alone).
    let p = plan_settles(&diamond(), &census(9, &[]));
    assert_eq!(target(&p, "a"), 4);
    assert_eq!(target(&p, "d"), 8);
    assert_eq!(p.actions.len(), 4 + 4 + 8 + 8);
    assert!(!p.actions.iter().any(|a| a.why == Why::Growth));
    assert_eq!(p.outcome, Outcome::Viable);
    // With two spare hosts A grows by one, and its chain with it.
    let p = plan_settles(&diamond(), &census(10, &[]));
    let growth: Vec<String> = lines(&p)
        .into_iter()
        .filter(|l| l.ends_with("(growth)"))
        .collect();
    assert_eq!(
        growth,
        vec![
            "start d-9 on h09 (growth)",
            "start d-10 on h10 (growth)",
            "start c-9 (growth)",
            "start c-10 (growth)",
            "start b-5 (growth)",
            "start a-5 (growth)",
        ]
    );
}

#[test]
fn dependees_start_before_dependers_and_dependers_stop_first() {
    let p = plan(&diamond(), &census(8, &[]));
    let first = |role: &str| p.actions.iter().position(|a| a.role == role).unwrap();
    assert!(first("d") < first("c") && first("c") < first("b") && first("b") < first("a"));

    // Lower a's max under a running diamond with surplus: a stops first, then what its
    // dependees no longer need is left running (no scale-down below what is used).
    let spec = Spec::parse(
        "diamond.toml",
        &DIAMOND.replace("[roles.a]\nmin = 4", "[roles.a]\nmin = 4\nmax = 4"),
    )
    .unwrap();
    let grown = applied(&census(10, &[]), &plan(&diamond(), &census(10, &[])));
    let p = plan_settles(&spec, &grown);
    assert_eq!(lines(&p), vec!["stop a-5 (above max)"]);
}

#[test]
fn surplus_above_max_is_stopped() {
    // Two secondary heads (an operator started one by hand); max is 1.
    let mut c = applied(&census(5, &[]), &plan(&sim(), &census(5, &[])));
    c.instances.push(Instance {
        role: "secondary_head".into(),
        id: "secondary_head-9".into(),
        host: Some("h05".into()),
    });
    let p = plan_settles(&sim(), &c);
    assert_eq!(lines(&p), vec!["stop secondary_head-9 on h05 (above max)"]);
}

#[test]
fn dependers_orphaned_by_lost_hosts_are_stopped() {
    // 4 node controllers serve 6 apps (ceil(6/2 + 1/2 + 1/2) = 4). h04 dies with its node
    // controller and there is no host to replace it: 3 serve 4 apps, so two apps go.
    let full = sim_running(4, 4, 6);
    assert!(plan(&sim(), &full).actions.is_empty());
    let mut lost = full.clone();
    lost.hosts.retain(|h| h.name != "h04");
    lost.instances.retain(|i| i.host.as_deref() != Some("h04"));
    let p = plan_settles(&sim(), &lost);
    assert_eq!(
        lines(&p),
        vec!["stop app-6 (orphaned)", "stop app-5 (orphaned)"]
    );
    assert_eq!(p.outcome, Outcome::Viable);
}

/// A role that runs on a host, with hooks taking `-h <host>`, and `extra` fields.
fn host_role(name: &str, extra: &str) -> String {
    format!(
        "[roles.{name}]\n{extra}\nstart = {{ hook = \"s.sh\", args = [\"h\"] }}\nstop = {{ hook = \"t.sh\", args = [\"h\"] }}\n"
    )
}

#[test]
fn higher_priority_roots_grow_first() {
    let text = [
        host_role("low", "priority = 1"),
        host_role("high", "priority = 9\nmax = 2"),
        host_role("also_low", "priority = 1"),
    ]
    .concat();
    let spec = Spec::parse("p.toml", &text).unwrap();
    let p = plan_settles(&spec, &census(5, &[]));
    assert_eq!(
        lines(&p),
        vec![
            // Starts are listed by role (dependees first, then by name); the hosts show the
            // order they were taken in: high first, then the two low roots in turn.
            "start low-1 on h04 (growth)",
            "start high-1 on h01 (growth)",
            "start high-2 on h02 (growth)",
            "start also_low-1 on h03 (growth)",
            "start also_low-2 on h05 (growth)",
        ]
    );
    // Equal priorities take turns.
    assert_eq!(p.roles["low"].target, 1);
    assert_eq!(p.roles["also_low"].target, 2);
}

#[test]
fn hosts_are_chosen_by_selector_and_quarantined_hosts_are_left() {
    let text = host_role("gpu", "min = 1\nhosts = { traits = [\"CUSTOM_GPU\"] }");
    let spec = Spec::parse("g.toml", &text).unwrap();
    let mut c = census(3, &[]);
    c.hosts[2].traits.insert("CUSTOM_GPU".into());
    c.hosts[1].traits.insert("CUSTOM_GPU".into());
    let p = plan_settles(&spec, &c);
    assert_eq!(
        lines(&p),
        vec![
            "start gpu-1 on h02 (minimum)",
            "start gpu-2 on h03 (growth)"
        ]
    );
    c.quarantined.insert("h02".into());
    let p = plan_settles(&spec, &c);
    assert_eq!(lines(&p), vec!["start gpu-1 on h03 (minimum)"]);
    c.quarantined.insert("h03".into());
    let p = plan(&spec, &c);
    assert!(matches!(p.outcome, Outcome::FailStop(_)));
}

#[test]
fn the_plan_does_not_depend_on_the_census_order() {
    let c = census(
        6,
        &[
            ("node_controller", "node_controller-1", Some("h01")),
            ("app", "app-2", None),
            ("unknown", "u-1", Some("h06")),
            ("app", "app-1", None),
        ],
    );
    let mut shuffled = c.clone();
    shuffled.instances.reverse();
    shuffled.hosts.reverse();
    let p = plan_settles(&sim(), &c);
    assert_eq!(plan(&sim(), &shuffled), p);
    // The unknown role's host is not taken; its instance is left alone and noted.
    assert!(!p.actions.iter().any(|a| a.host.as_deref() == Some("h06")));
    assert_eq!(
        p.notes,
        vec!["instance u-1 of role unknown (not in the spec) left alone"]
    );
}

#[test]
fn hook_command_lines_follow_blacknights_convention() {
    let text = r#"
[args]
p = "head-1"
zone = "z1"
[roles.leaf]
start = { hook = "x/start.sh", args = ["h", "p", "zone", "host", "i"] }
stop = { hook = "x/stop.sh", args = ["instance", "h"] }
[roles.top]
start = { hook = "x/top.sh", args = ["i"] }
stop = { hook = "x/top-stop.sh", args = ["i", "p"] }
depends = { leaf = 1 }
[roles.img]
image = "minbase"
"#;
    let spec = Spec::parse("h.toml", text).unwrap();
    let p = plan(&spec, &census(3, &[]));
    let cmd = |role: &str| {
        let a = p.actions.iter().find(|a| a.role == role).unwrap();
        a.command(&spec).unwrap()
    };
    assert_eq!(
        cmd("leaf").unwrap(),
        vec![
            "x/start.sh",
            "-h",
            "h02",
            "-p",
            "head-1",
            "--zone",
            "z1",
            "--host",
            "h02",
            "-i",
            "leaf-1"
        ]
    );
    assert_eq!(cmd("top").unwrap(), vec!["x/top.sh", "-i", "top-1"]);
    // An image role has no hook: its start sets the host's required image.
    assert_eq!(cmd("img"), None);
    let img = p.actions.iter().find(|a| a.role == "img").unwrap();
    assert_eq!(img.image.as_deref(), Some("minbase"));
    // Stops name the victim.
    let c = census(
        1,
        &[
            ("leaf", "leaf-7", Some("h01")),
            ("top", "top-3", None),
            ("top", "top-4", None),
        ],
    );
    let spec = Spec::parse(
        "h.toml",
        &text.replace("[roles.top]", "[roles.top]\nmax = 1"),
    )
    .unwrap();
    let p = plan(&spec, &c);
    assert_eq!(lines(&p), vec!["stop top-4 (above max)"]);
    assert_eq!(
        p.actions[0].command(&spec).unwrap().unwrap(),
        vec!["x/top-stop.sh", "-i", "top-4", "-p", "head-1"]
    );
    let stop_leaf = paddock_roles::Action {
        kind: Kind::Stop,
        role: "leaf".into(),
        instance: "leaf-7".into(),
        host: Some("h01".into()),
        image: None,
        why: Why::AboveMax,
    };
    assert_eq!(
        stop_leaf.command(&spec).unwrap().unwrap(),
        vec!["x/stop.sh", "--instance", "leaf-7", "-h", "h01"]
    );
    let no_host = paddock_roles::Action {
        host: None,
        ..stop_leaf
    };
    assert_eq!(
        no_host.command(&spec),
        Err(paddock_roles::CommandError::NoHost {
            instance: "leaf-7".into(),
            role: "leaf".into(),
            flag: "-h".into(),
        })
    );
    assert_eq!(
        no_host.command(&spec).unwrap_err().to_string(),
        "leaf-7 of leaf has no host for -h"
    );
}

#[test]
fn kill_a_hosts_instances_then_the_plan_restores_them() {
    // The integration scenario, in the pure engine: 5 hosts, steady state; h02's instance
    // dies (its lease expired) while the host stays enrolled.
    let steady = applied(&census(5, &[]), &plan(&sim(), &census(5, &[])));
    assert!(plan(&sim(), &steady).actions.is_empty());
    let mut killed = steady.clone();
    killed
        .instances
        .retain(|i| i.host.as_deref() != Some("h02"));
    let p = plan_settles(&sim(), &killed);
    // The dead instance's id is free again (its registration is gone).
    assert_eq!(lines(&p), vec!["start node_controller-2 on h02 (minimum)"]);
    // A host added: growth.
    let mut more = steady.clone();
    more.hosts.extend(hosts(7).into_iter().skip(5));
    let p = plan_settles(&sim(), &more);
    assert!(
        p.actions.iter().all(|a| a.why == Why::Growth),
        "{:?}",
        lines(&p)
    );
    assert!(target(&p, "app") > target(&plan(&sim(), &steady), "app"));
}

#[test]
fn the_plan_round_trips_through_json() {
    let p = plan(&sim(), &census(3, &[]));
    let text = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Plan>(&text).unwrap(), p);
    let p = plan(&sim(), &census(1, &[]));
    let text = serde_json::to_string(&p.outcome).unwrap();
    assert!(
        text.starts_with(r#"{"state":"fail_stop","reason":"minimum viable"#),
        "{text}"
    );
}

/// The fuzz target's property over mutations of the example specs (each line dropped, and
/// each digit replaced by 0, 1, 2, 7 and 9): any text gives errors naming a line of the
/// file, or a spec whose plan is deterministic and settles once applied — from nothing, and
/// after any one host of a settled census is lost.
#[test]
fn mutated_specs_give_errors_or_plans_that_settle() {
    let mut texts = Vec::new();
    for base in [SIM, APPLIANCE, DIAMOND] {
        let lines: Vec<&str> = base.lines().collect();
        for i in 0..lines.len() {
            let mut l = lines.clone();
            l.remove(i);
            texts.push(l.join("\n"));
        }
        for (i, c) in base.char_indices().filter(|(_, c)| c.is_ascii_digit()) {
            for d in ['0', '1', '2', '7', '9'] {
                if d != c {
                    let mut t = base.to_string();
                    t.replace_range(i..i + 1, &d.to_string());
                    texts.push(t);
                }
            }
        }
    }
    let (mut ok, mut bad) = (0, 0);
    for text in &texts {
        match Spec::parse("m.toml", text) {
            Err(e) => {
                bad += 1;
                assert!(!e.0.is_empty());
                for p in &e.0 {
                    assert!(p.line >= 1 && p.line <= text.lines().count() + 1, "{p}");
                }
            }
            Ok(spec) => {
                ok += 1;
                for n in [0, 3, 6, 12] {
                    plan_settles(&spec, &census(n, &[]));
                }
                // Every host of a settled census lost in turn (its instances with it).
                let full = applied(&census(12, &[]), &plan(&spec, &census(12, &[])));
                for i in 1..=12 {
                    let name = format!("h{i:02}");
                    let mut c = full.clone();
                    c.hosts.retain(|h| h.name != name);
                    c.instances
                        .retain(|x| x.host.as_deref() != Some(name.as_str()));
                    plan_settles(&spec, &c);
                }
            }
        }
    }
    assert!(ok > 50 && bad > 10, "{ok} valid, {bad} refused");
}
