//! The role loop end to end: the real appliance leads alone, with BlacKnight's
//! simulation spec; every host is a network namespace whose agent (`paddock census hold
//! --host`) keeps the host's registration alive; the example hooks (`hooks/lib/sim.sh`)
//! start each instance as a `paddock census hold` process — inside the host's namespace for
//! the roles that run on a host — which registers the instance under a store lease.
//!
//! Kill one host's instances → minimum viable is back within one lease TTL plus one round;
//! add a host → capacity grows; kill hosts below the minimum → fail-stop, nothing started.

mod support;

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// The instances' lease TTL (the spec passes it to the hooks as `--ttl`).
const TTL_SECS: u64 = 4;
/// A round at least this often, and 200 ms after a census change.
const ROUND_SECS: u64 = 2;

struct Lab {
    link: Link,
    scratch: Scratch,
    appliance: Appliance,
    hosts: Vec<(Ns, Option<Child>)>,
}

impl Lab {
    /// The appliance with the role loop on (hooks in `hooks`, their state in the scratch
    /// directory's `hook-state`) and `hosts` live hosts.
    fn start(link: Link, scratch: Scratch, hooks: &std::path::Path, hosts: usize) -> Lab {
        let config = base_config(
            &link,
            &scratch,
            &format!(
                "[tftp]\nenabled = false\n[roles]\nhooks_dir = \"{}\"\nstate_dir = \"{}\"\n\
                 round_secs = {ROUND_SECS}\ndebounce_ms = 200\nregister_grace_secs = 5\n\
                 quarantine_secs = 5\n",
                hooks.display(),
                scratch.path("hook-state").display()
            ),
        );
        let appliance = Appliance::start(&link.server, &scratch, &config);
        let mut lab = Lab {
            link,
            scratch,
            appliance,
            hosts: Vec::new(),
        };
        for i in 1..=hosts {
            lab.add_host(i);
        }
        within(
            &format!("{hosts} live hosts"),
            Duration::from_secs(15),
            || lab.live_hosts() == hosts,
        );
        lab
    }

    /// Host `i` (1-based): a namespace on its own link to the appliance's, 198.18.<10+i>.2,
    /// with its agent registering the host.
    fn add_host(&mut self, i: usize) {
        let tag = self.link.tag.clone();
        let ns = Ns::new(format!("{tag}-h{i}"));
        let (a, b) = (format!("{tag}a{i}"), format!("{tag}b{i}"));
        connect(&self.link.server, &a, &ns, &b);
        let net = 10 + i;
        self.link
            .server
            .sh_ok(&format!("ip addr add 198.18.{net}.1/24 dev {a}"));
        ns.sh_ok(&format!(
            "ip addr add 198.18.{net}.2/24 dev {b} && ip route add default via 198.18.{net}.1"
        ));
        let agent = ns.spawn(
            &format!(
                "{} census hold --url {PUBLIC_URL} --host {} --ttl 2",
                env!("CARGO_BIN_EXE_paddock"),
                ns.name
            ),
            &self.scratch.path(&format!("agent-{i}.log")),
        );
        self.hosts.push((ns, Some(agent)));
    }

    /// SIGKILL of every process in host `i`'s namespace but its agent (the host stays).
    fn kill_instances(&self, i: usize) {
        let (ns, agent) = &self.hosts[i - 1];
        let keep = agent.as_ref().map(|c| c.id()).unwrap_or(0);
        sh_ok(&format!(
            "for p in $(ip netns pids {}); do [ \"$p\" = {keep} ] || kill -9 \"$p\"; done",
            ns.name
        ));
    }

    /// SIGKILL of everything in host `i`'s namespace: the host is dead.
    fn kill_host(&mut self, i: usize) {
        let (ns, agent) = &mut self.hosts[i - 1];
        sh_ok(&format!("ip netns pids {} | xargs -r kill -9", ns.name));
        if let Some(mut c) = agent.take() {
            let _ = c.wait();
        }
    }

    fn post(&self, path: &str, body: &Value) -> Resp {
        let body = body.to_string();
        http(
            &self.link.server,
            &self.scratch,
            "POST",
            path,
            Some(&body),
            &[],
        )
    }

    fn get(&self, path: &str) -> Value {
        let r = http(&self.link.server, &self.scratch, "GET", path, None, &[]);
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        r.json()
    }

    /// role → hosts (`-` for none) of the live instances.
    fn census(&self) -> Vec<(String, String)> {
        let v = self.get("/api/v1/census");
        let mut out: Vec<(String, String)> = v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["role"].as_str().unwrap().to_string(),
                    i["host"].as_str().unwrap_or("-").to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn live_hosts(&self) -> usize {
        self.get("/api/v1/census")["hosts"]
            .as_array()
            .unwrap()
            .len()
    }
}

/// Polls `f` every 200 ms until it holds or `limit` passes; the time it took.
#[track_caller]
fn within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

fn sim_spec() -> String {
    let text = include_str!("../../spec/blacknight-sim.toml");
    // The roles that run on a host get a short lease, so a dead instance leaves quickly.
    let text = text.replace(
        "start = { hook = \"blacknight/start_nc.sh\", args = [\"h\"] }",
        "start = { hook = \"blacknight/start_nc.sh\", args = [\"h\", \"ttl\"] }",
    );
    format!("[args]\nttl = \"{TTL_SECS}\"\n\n{text}")
}

#[test]
fn the_leader_keeps_the_sim_at_minimum_viable_and_grows_it() {
    require(&["ip", "curl", "setsid"]);
    let link = Link::new();
    let scratch = Scratch::new(&format!("{}-roles", link.tag));
    let hooks = scratch.path("hooks");
    sh_ok(&format!(
        "cp -r {}/../hooks {}",
        env!("CARGO_MANIFEST_DIR"),
        hooks.display()
    ));
    let mut lab = Lab::start(link, scratch, &hooks, 4);

    // A bad spec is refused with its line and field, and changes nothing.
    let bad = serde_json::json!({"file": "bad.toml", "text": "[roles.a]\nmin = 2\nmax = 1\nstart = { hook = \"x\" }\nstop = { hook = \"y\" }\n"});
    let r = lab.post("/api/v1/spec", &bad);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "bad.toml:3: roles.a.max: impossible bounds: min 2 is above max 1"
    );
    let r = http(
        &lab.link.server,
        &lab.scratch,
        "GET",
        "/api/v1/spec",
        None,
        &[],
    );
    assert_eq!(r.status, 404, "no spec was applied: {}", r.body);

    // The spec: 3 node controllers (the minimum), db, hadoop, 4 apps (what 3 node
    // controllers serve), and the secondary head on the fourth host.
    let spec = serde_json::json!({"file": "spec/blacknight-sim.toml", "text": sim_spec()});
    let r = lab.post("/api/v1/spec", &spec);
    assert_eq!(r.status, 200, "{}", r.body);
    let tag = lab.link.tag.clone();
    let h = |i: usize| format!("{tag}-h{i}");
    let steady = vec![
        ("app".to_string(), "-".to_string()),
        ("app".into(), "-".into()),
        ("app".into(), "-".into()),
        ("app".into(), "-".into()),
        ("db".into(), "-".into()),
        ("hadoop".into(), "-".into()),
        ("node_controller".into(), h(1)),
        ("node_controller".into(), h(2)),
        ("node_controller".into(), h(3)),
        ("secondary_head".into(), h(4)),
    ];
    within(
        "the sim at its steady state",
        Duration::from_secs(30),
        || lab.census() == steady,
    );
    // The live plan is empty now (and previewing runs nothing).
    let r = lab.post("/api/v1/spec/plan", &serde_json::json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["plan"]["actions"], serde_json::json!([]));
    assert_eq!(r.json()["plan"]["outcome"]["state"], "viable");
    // The console's page shows the same: the census, the preview, the rounds.
    let page = http(
        &lab.link.server,
        &lab.scratch,
        "GET",
        "/ui/roles",
        None,
        &[],
    );
    assert_eq!(page.status, 200);
    for want in [
        "spec/blacknight-sim.toml",
        "Census: 4 hosts alive, 10 instances",
        "Plan preview (nothing is run)",
        "outcome: viable",
        "start node_controller node_controller-1 on",
    ] {
        assert!(page.body.contains(want), "{want:?} not in\n{}", page.body);
    }

    // Kill h2's node controller (h2 itself lives on): its lease expires, the next round
    // starts a node controller again on the idle host.
    let last_round = lab.get("/api/v1/spec/rounds?limit=1")[0]["at_ms"]
        .as_i64()
        .unwrap();
    lab.kill_instances(2);
    let killed = Instant::now();
    let restarted_on_h2 = |lab: &Lab| {
        let rounds = lab.get("/api/v1/spec/rounds?limit=50");
        rounds.as_array().unwrap().iter().any(|r| {
            r["at_ms"].as_i64().unwrap() > last_round
                && r["results"].as_array().unwrap().iter().any(|x| {
                    x["ok"] == true
                        && x["action"]["kind"] == "start"
                        && x["action"]["role"] == "node_controller"
                        && x["action"]["why"] == "minimum"
                        && x["action"]["host"] == h(2).as_str()
                })
        })
    };
    assert!(!restarted_on_h2(&lab));
    within(
        "minimum viable restored on h2",
        Duration::from_secs(TTL_SECS + ROUND_SECS + 3),
        || restarted_on_h2(&lab) && lab.census() == steady,
    );
    eprintln!(
        "restored {:.1} s after the kill (TTL {TTL_SECS} s, round {ROUND_SECS} s)",
        killed.elapsed().as_secs_f64()
    );

    // A fifth host: a fourth node controller, and the apps it serves (ceil(6/2 + 1/2 + 1/2)
    // = 4).
    lab.add_host(5);
    within("growth onto h5", Duration::from_secs(20), || {
        let c = lab.census();
        c.contains(&("node_controller".into(), h(5)))
            && c.iter().filter(|(r, _)| r == "app").count() == 6
    });

    // Hosts die until too few remain for the minimum: fail-stop, nothing started.
    for i in 1..=4 {
        lab.kill_host(i);
    }
    within("only h5 alive", Duration::from_secs(15), || {
        lab.live_hosts() == 1
    });
    // The dead hosts' instances leave as their leases expire (the secondary head's is the
    // hooks' default 10 s).
    within(
        "no instance on a dead host",
        Duration::from_secs(15),
        || {
            lab.census()
                .iter()
                .all(|(_, host)| host == "-" || *host == h(5))
        },
    );
    within("the fail-stop round", Duration::from_secs(20), || {
        let rounds = lab.get("/api/v1/spec/rounds?limit=5");
        rounds.as_array().unwrap().iter().any(|r| {
            r["plan"]["outcome"]["state"] == "fail_stop"
                && r["plan"]["actions"] == serde_json::json!([])
                && r["results"] == serde_json::json!([])
        })
    });
    // The leader runs exactly a round's actions, and while the census stays as it is every
    // later plan is this one (the engine is a function of spec and census): the plan is
    // fail-stop with no actions, so nothing starts or stops, without waiting rounds out.
    let plan = lab.post("/api/v1/spec/plan", &serde_json::json!({})).json();
    assert_eq!(plan["plan"]["outcome"]["state"], "fail_stop");
    assert_eq!(plan["plan"]["actions"], serde_json::json!([]), "{plan}");
    let reason = plan["plan"]["outcome"]["reason"].as_str().unwrap();
    assert!(
        reason
            .starts_with("minimum viable cannot be reached: node_controller needs 2 more host(s)"),
        "{reason}"
    );
    let log = lab.appliance.log_text();
    assert!(log.contains("fail-stop"), "the log says so:\n{log}");
}

/// A hook role's `version` rolls one instance at a time: each instance's stop hook gets the
/// version it ran, its start hook the new one, and it counts healthy once registered `up`
/// again; never fewer than the minimum are up (sampled every 100 ms from the census). A
/// version whose instances never say `up` fails at the healthy deadline and goes back by
/// itself (auto_revert) to the last good version, restarting the instance it moved.
#[test]
fn a_hook_role_rolls_its_version_one_instance_at_a_time_and_a_bad_one_goes_back() {
    require(&["ip", "curl", "setsid"]);
    let link = Link::new();
    let scratch = Scratch::new(&format!("{}-rollv", link.tag));
    let hooks = scratch.path("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    // start.sh -h HOST -v VERSION --ttl T: registers the instance, `starting` (not up) on
    // the version "bad"; stop.sh -h HOST -v VERSION: ends it. Both log what they did.
    let start = r#"#!/bin/sh
set -eu
host=$2; version=$4; ttl=$6
echo "start $PADDOCK_INSTANCE $version" >> "$PADDOCK_HOOK_STATE/cache.log"
status=up
if [ "$version" = bad ]; then status=starting; fi
setsid "$PADDOCK_BIN" census hold --url "$PADDOCK_URL" --role cache --instance "$PADDOCK_INSTANCE" --host "$host" --status "$status" --ttl "$ttl" </dev/null >/dev/null 2>&1 &
echo $! > "$PADDOCK_HOOK_STATE/cache.$PADDOCK_INSTANCE.pid"
"#;
    let stop = r#"#!/bin/sh
set -eu
echo "stop $PADDOCK_INSTANCE $4" >> "$PADDOCK_HOOK_STATE/cache.log"
pid="$PADDOCK_HOOK_STATE/cache.$PADDOCK_INSTANCE.pid"
if [ -f "$pid" ]; then kill -TERM "$(cat "$pid")" 2>/dev/null || true; rm -f "$pid"; fi
"#;
    for (name, body) in [("start.sh", start), ("stop.sh", stop)] {
        std::fs::write(hooks.join(name), body).unwrap();
        sh_ok(&format!("chmod 755 {}", hooks.join(name).display()));
    }
    let state = scratch.path("hook-state");
    let lab = Lab::start(link, scratch, &hooks, 3);
    let apply = |lab: &Lab, version: &str| {
        let text = format!(
            "[args]\nttl = \"{TTL_SECS}\"\n[roles.cache]\nmin = 2\nmax = 3\nversion = \"{version}\"\n\
             start = {{ hook = \"start.sh\", args = [\"h\", \"v\", \"ttl\"] }}\n\
             stop = {{ hook = \"stop.sh\", args = [\"h\", \"v\"] }}\n\
             update = {{ min_healthy_secs = 1, healthy_deadline_secs = 6 }}\n"
        );
        let r = lab.post(
            "/api/v1/spec",
            &serde_json::json!({"file": "spec/cache.toml", "text": text}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    };
    // Instances of cache registered up.
    let up = |lab: &Lab| -> usize {
        lab.get("/api/v1/census")["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["role"] == "cache" && i["status"].as_str().is_none_or(|s| s == "up"))
            .count()
    };
    let phase = |lab: &Lab| -> String {
        let r = http(
            &lab.link.server,
            &lab.scratch,
            "GET",
            "/api/v1/rollouts/cache",
            None,
            &[],
        );
        if r.status == 200 {
            r.json()["phase"]["phase"]
                .as_str()
                .unwrap_or("")
                .to_string()
        } else {
            String::new()
        }
    };
    let log = || std::fs::read_to_string(state.join("cache.log")).unwrap_or_default();
    apply(&lab, "7.1");
    within("three caches up", Duration::from_secs(30), || up(&lab) == 3);
    assert_eq!(log().matches(" 7.1\n").count(), 3, "{}", log());

    // To 7.2, one at a time, never fewer than 2 up.
    apply(&lab, "7.2");
    let t = Instant::now();
    let mut fewest = usize::MAX;
    within("the rollout to 7.2 done", Duration::from_secs(90), || {
        fewest = fewest.min(up(&lab));
        std::thread::sleep(Duration::from_millis(100));
        phase(&lab) == "done"
    });
    println!(
        "7.1 → 7.2 in {:.1} s, at least {fewest} of 3 up throughout",
        t.elapsed().as_secs_f64()
    );
    assert!(fewest >= 2, "{fewest} caches up at one point");
    within("three caches up on 7.2", Duration::from_secs(20), || {
        up(&lab) == 3
    });
    let text = log();
    for id in ["cache-1", "cache-2", "cache-3"] {
        let stop = format!("stop {id} 7.1\nstart {id} 7.2\n");
        assert!(text.contains(&stop), "{id} not restarted on 7.2:\n{text}");
    }

    // A version whose instance never says up: the batch fails at the healthy deadline and
    // the rollout goes back to 7.2 by itself, restarting the one instance it moved.
    let before = log().len();
    apply(&lab, "bad");
    let mut fewest = usize::MAX;
    within("the bad rollout reverted", Duration::from_secs(90), || {
        fewest = fewest.min(up(&lab));
        std::thread::sleep(Duration::from_millis(100));
        phase(&lab) == "reverted"
    });
    within(
        "three caches up on 7.2 again",
        Duration::from_secs(20),
        || up(&lab) == 3,
    );
    let after = log()[before..].to_string();
    println!("the bad rollout's hooks:\n{after}");
    assert!(fewest >= 2, "{fewest} caches up at one point");
    assert_eq!(after.matches("start ").count(), 2, "{after}");
    let moved = after
        .lines()
        .find_map(|l| l.strip_suffix(" bad")?.strip_prefix("start "))
        .unwrap_or_else(|| panic!("no instance started on bad:\n{after}"));
    assert!(
        after.contains(&format!("stop {moved} bad\nstart {moved} 7.2\n")),
        "{after}"
    );
    let r = lab.get("/api/v1/rollouts/cache/history");
    let phases: Vec<&str> = r
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["phase"]["phase"].as_str())
        .collect();
    // Oldest first.
    assert_eq!(phases, ["done", "reverted"], "{r}");
}

/// `paddock spec check` reads files only: it works with no appliance to reach and no
/// credentials (here: an HTTPS API whose CA file does not exist).
#[test]
fn spec_check_needs_no_appliance() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/appliance.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["spec", "check"])
        .arg(&spec)
        .env("PADDOCK_API", "https://198.18.0.254:1")
        .env("PADDOCK_CA", "/nonexistent/ca.pem")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The templates the spec names are checked too, as `spec apply` would send them: missing,
    // then broken.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("appliance.toml");
    std::fs::copy(&spec, &copy).unwrap();
    let check = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paddock"))
            .args(["spec", "check"])
            .arg(&copy)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = check();
    assert!(missing.contains("template etcd/etcd.env.j2"), "{missing}");
    std::fs::create_dir_all(dir.path().join("templates/etcd")).unwrap();
    std::fs::write(
        dir.path().join("templates/etcd/etcd.env.j2"),
        "ETCD_NAME={{ host.name",
    )
    .unwrap();
    let broken = check();
    assert!(broken.contains("etcd/etcd.env.j2"), "{broken}");
}

/// Load-driven capacity end to end: `web` (hostless: it depends on `lb`) follows the `rps`
/// its instances report through `paddock census hold --metrics-file` (the test, as the
/// balancer, writes each instance's share of the load). The load goes from 100 to 1,000:
/// web grows to 10, at most 5 per rate period (4 s here); it falls back to 1 once the load
/// drops and the stabilisation window (6 s) has passed. A shadow spec with half the target
/// plans 20 in its rounds and starts nothing. A kept round replays to the same plan.
#[test]
fn a_scaled_role_follows_its_load_within_its_rates_and_a_shadow_only_plans() {
    require(&["ip", "curl", "setsid"]);
    let link = Link::new();
    let scratch = Scratch::new(&format!("{}-scale", link.tag));
    let hooks = scratch.path("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let rps = scratch.path("rps");
    std::fs::create_dir_all(&rps).unwrap();
    // lb runs on a host (as in the other tests); each web instance reports the share of the
    // load the test (the balancer) writes in its file, none until the balancer gives it one.
    let start = format!(
        r#"#!/bin/sh
set -eu
host=${{2:-}}
if [ "$PADDOCK_ROLE" = web ]; then
  f={rps}/$PADDOCK_INSTANCE
  [ -f "$f" ] || echo rps=0 > "$f"
  setsid "$PADDOCK_BIN" census hold --url "$PADDOCK_URL" --role web --instance "$PADDOCK_INSTANCE" --metrics-file "$f" --ttl 3 </dev/null >/dev/null 2>&1 &
else
  setsid "$PADDOCK_BIN" census hold --url "$PADDOCK_URL" --role "$PADDOCK_ROLE" --instance "$PADDOCK_INSTANCE" --host "$host" --ttl 3 </dev/null >/dev/null 2>&1 &
fi
echo $! > "$PADDOCK_HOOK_STATE/$PADDOCK_INSTANCE.pid"
"#,
        rps = rps.display()
    );
    let stop = r#"#!/bin/sh
pid="$PADDOCK_HOOK_STATE/$PADDOCK_INSTANCE.pid"
if [ -f "$pid" ]; then kill -TERM "$(cat "$pid")" 2>/dev/null || true; rm -f "$pid"; fi
"#;
    for (name, body) in [("start.sh", start.as_str()), ("stop.sh", stop)] {
        std::fs::write(hooks.join(name), body).unwrap();
        sh_ok(&format!("chmod 755 {}", hooks.join(name).display()));
    }
    let lab = Lab::start(link, scratch, &hooks, 1);
    // A tolerance of 5 %, not the default 10 %: an eleventh web that starts while the
    // balancer is still moving the shares (see "ten webs steady" below) carries 1,000 rps at
    // 91 % of the target, which 10 % would keep for good; at 5 % the stabilisation window
    // takes it back.
    let spec = |target: u32| {
        format!(
            "[roles.lb]\nmin = 1\nmax = 1\nstart = {{ hook = \"start.sh\", args = [\"h\"] }}\n\
             stop = {{ hook = \"stop.sh\" }}\n\n\
             [roles.web]\nmin = 1\nmax = 20\ndepends = {{ lb = 100 }}\n\
             start = {{ hook = \"start.sh\" }}\nstop = {{ hook = \"stop.sh\" }}\n\
             scale = {{ metric = \"rps\", target_per_instance = {target}, up_per_min = 5, \
             down_per_min = 5, rate_secs = 4, down_stabilise_secs = 6, tolerance = 0.05 }}\n"
        )
    };
    let r = lab.post(
        "/api/v1/spec",
        &serde_json::json!({"file": "spec/web.toml", "text": spec(100)}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = lab.post(
        "/api/v1/spec/shadow/half",
        &serde_json::json!({"file": "spec/web-half.toml", "text": spec(50)}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let webs = |lab: &Lab| lab.census().iter().filter(|(r, _)| r == "web").count();
    // The balancer: each live web instance gets its share of `total`.
    let balance = |lab: &Lab, total: f64| {
        let v = lab.get("/api/v1/census");
        let ids: Vec<String> = v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["role"] == "web")
            .filter_map(|i| i["instance"].as_str().map(str::to_string))
            .collect();
        for id in &ids {
            let share = total / ids.len() as f64;
            std::fs::write(rps.join(id), format!("rps={share}\n")).unwrap();
        }
    };
    within("one web at 100 rps", Duration::from_secs(30), || {
        balance(&lab, 100.0);
        webs(&lab) == 1
    });

    // 1,000 rps: up to 10, at most 5 in any 4 s.
    let t = Instant::now();
    let mut seen: Vec<(Instant, usize)> = Vec::new();
    within("ten webs at 1,000 rps", Duration::from_secs(60), || {
        balance(&lab, 1000.0);
        let n = webs(&lab);
        seen.push((Instant::now(), n));
        std::thread::sleep(Duration::from_millis(100));
        n >= 10
    });
    // Settled: ten, three seconds running (an instance that started before the balancer
    // moved its share reports the old share a moment, and may add one, which the
    // stabilisation window then takes back).
    let mut stable_since = Instant::now();
    within("ten webs steady", Duration::from_secs(60), || {
        balance(&lab, 1000.0);
        let n = webs(&lab);
        seen.push((Instant::now(), n));
        if n != 10 {
            stable_since = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
        stable_since.elapsed() >= Duration::from_secs(3)
    });
    println!(
        "100 → 1,000 rps: 1 → 10 webs in {:.1} s; counts seen {:?}",
        t.elapsed().as_secs_f64(),
        {
            let mut c: Vec<usize> = seen.iter().map(|(_, n)| *n).collect();
            c.dedup();
            c
        }
    );
    for (i, (at, n)) in seen.iter().enumerate() {
        for (later, m) in &seen[i..] {
            if later.duration_since(*at) < Duration::from_millis(3500) {
                assert!(m.saturating_sub(*n) <= 5, "{n} → {m} within 4 s: {seen:?}");
            }
        }
    }
    // The round that saw the whole 1,000 rps: the tenth web's first report can reach the
    // census after the count settled (a busy machine delays it), and rounds are kept only
    // when something changed, so this waits for it rather than taking the last one kept.
    let waited = Instant::now();
    let scaled = loop {
        balance(&lab, 1000.0);
        let rounds = lab.get("/api/v1/spec/rounds?limit=200");
        let rounds = rounds.as_array().unwrap();
        let found = rounds
            .iter()
            .rev()
            .find(|r| r["scale"]["web"]["desired"] == 10 && r["scale"]["web"]["load"] == 1000.0);
        if let Some(r) = found {
            break r.clone();
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "no round saw 1,000 rps with 10 webs; the last kept: {}",
            rounds.last().cloned().unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("the round: {}", scaled["scale"]["web"]["reason"]);
    // The shadow (target 50) wants 20 (within its own rates), or already holds 20 when the
    // live count took a detour (an eleventh web taken back) and its own rates had the time;
    // its plan is beside the live one.
    let shadow = &scaled["shadows"]["half"];
    let reason = shadow["scale"]["web"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("wants 20") || shadow["scale"]["web"]["desired"] == 20,
        "{shadow}"
    );
    assert!(
        shadow["plan"]["roles"]["web"]["target"].as_u64() > Some(10),
        "{shadow}"
    );
    assert_eq!(webs(&lab), 10, "the shadow started nothing");
    let m = http(&lab.link.server, &lab.scratch, "GET", "/metrics", None, &[]);
    for line in [
        "paddock_role_desired{role=\"web\"} 10",
        "paddock_role_instances{role=\"web\"} 10",
    ] {
        assert!(
            m.body.contains(line),
            "no {line:?} in /metrics:\n{}",
            m.body
        );
    }
    // The round replays to the same plan.
    let at = scaled["at_ms"].as_i64().unwrap();
    let replayed = lab.post(&format!("/api/v1/spec/replay/{at}"), &serde_json::json!({}));
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    assert_eq!(replayed.json()["same"], true, "{}", replayed.body);

    // The load drops: nothing for the 6 s window, then back to 1.
    let t = Instant::now();
    within("one web again at 100 rps", Duration::from_secs(60), || {
        balance(&lab, 100.0);
        std::thread::sleep(Duration::from_millis(200));
        webs(&lab) == 1
    });
    let back = t.elapsed();
    println!(
        "1,000 → 100 rps: 10 → 1 webs in {:.1} s",
        back.as_secs_f64()
    );
    assert!(
        back >= Duration::from_secs(6),
        "declined within the window: {back:?}"
    );
}
