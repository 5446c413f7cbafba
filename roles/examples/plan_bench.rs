//! `bench/roles.sh`'s measurement: `plan` for `spec/appliance.toml` over HOSTS hosts (10 of
//! them appliance hosts with the `CUSTOM_PADDOCK_HOST` trait, the rest x86-64 machines),
//! from an empty census (every instance to start: the largest plan) and from the census
//! that plan leads to (the steady state the leader re-plans every round).
//! Prints `roles hosts=<n> plan_ms=<t>` (the median of RUNS plans from empty) and `#` detail
//! lines on stderr.
//!
//! Then load-driven capacity at scale: SCALED_ROLES (19) hostless roles, each with `scale`
//! on `rps` and served by `base` (on hosts), 10,000 instances among them each reporting
//! its `rps`, over the same hosts; a round (each role's count from the metrics, then the
//! plan) from the live census, with a load that grows every role by one instance and with
//! the load steady. Prints `roles scale hosts=<n> roles=<r> instances=<i> plan_ms=<t>`.

use std::time::Instant;

use std::collections::BTreeMap;

use paddock_roles::{Census, Host, Instance, Metric, ScaleState, Spec, applied, plan};

fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("HOSTS", 1000);
    let runs = env("RUNS", 21).max(1);
    let path = std::env::var("SPEC").unwrap_or_else(|_| "spec/appliance.toml".into());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let spec = Spec::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
    let hosts = (0..n)
        .map(|i| {
            let mut h = Host {
                name: format!("host-{i:05}"),
                ..Host::default()
            };
            if i < 10 {
                h.traits.insert("CUSTOM_PADDOCK_HOST".into());
            }
            h.properties.insert("cpu_arch".into(), "x86_64".into());
            h
        })
        .collect();
    let empty = Census {
        hosts,
        ..Census::default()
    };
    let first = plan(&spec, &empty);
    let steady = applied(&empty, &first);
    let again = plan(&spec, &steady);
    assert!(again.actions.is_empty(), "the applied plan must settle");
    let cold = median_ms(runs, || {
        std::hint::black_box(plan(&spec, &empty));
    });
    let warm = median_ms(runs, || {
        std::hint::black_box(plan(&spec, &steady));
    });
    eprintln!(
        "# {} actions from empty ({:?}); targets: {}",
        first.actions.len(),
        first.outcome,
        first
            .roles
            .iter()
            .map(|(r, c)| format!("{r}={}", c.target))
            .collect::<Vec<_>>()
            .join(" ")
    );
    eprintln!("# plan from empty {cold:.2} ms, steady state {warm:.2} ms (median of {runs})");
    println!("roles hosts={n} plan_ms={cold:.2}");
    scaled(
        &empty.hosts,
        runs,
        env("INSTANCES", 10_000),
        env("SCALED_ROLES", 19),
    );
}

/// The load-driven round at scale (see the module's note).
fn scaled(hosts: &[Host], runs: usize, instances: usize, roles: usize) {
    let per_role = instances / roles.max(1);
    let mut text = String::from(
        "[roles.base]\nmin = 10\nmax = 10\nstart = { hook = \"s\" }\nstop = { hook = \"t\" }\n",
    );
    for r in 0..roles {
        text.push_str(&format!(
            "\n[roles.web{r:02}]\nmin = 1\nmax = {}\ndepends = {{ base = 10000 }}\n\
             start = {{ hook = \"s\" }}\nstop = {{ hook = \"t\" }}\n\
             scale = {{ metric = \"rps\", target_per_instance = 100 }}\n",
            per_role * 2
        ));
    }
    let spec = Spec::parse("bench/scaled.toml", &text).unwrap_or_else(|e| panic!("{e}"));
    let mut census = Census {
        hosts: hosts.to_vec(),
        ..Census::default()
    };
    for (i, h) in hosts.iter().take(10).enumerate() {
        census.instances.push(Instance {
            role: "base".into(),
            id: format!("base-{}", i + 1),
            host: Some(h.name.clone()),
        });
    }
    for r in 0..roles {
        let role = format!("web{r:02}");
        let reports = census.metrics.entry(role.clone()).or_default();
        for i in 1..=per_role {
            let id = format!("{role}-{i}");
            reports.insert(
                id.clone(),
                BTreeMap::from([("rps".to_string(), Metric(100.0))]),
            );
            census.instances.push(Instance {
                role: role.clone(),
                id,
                host: None,
            });
        }
    }
    let live = census.instances.len();
    let round = |census: &Census| {
        let mut states: BTreeMap<String, ScaleState> = BTreeMap::new();
        paddock_roles::round_plan(&spec, census, &mut states, 0)
    };
    let (steady_plan, _) = round(&census);
    assert!(
        steady_plan.actions.is_empty(),
        "a steady load must plan nothing"
    );
    // Each role's load grows by a tenth and more (past the tolerance): 5 more each (the rate).
    let mut busier = census.clone();
    for reports in busier.metrics.values_mut() {
        if let Some(m) = reports.values_mut().next() {
            m.insert("rps".into(), Metric(5_500.0));
        }
    }
    let (grown, decisions) = round(&busier);
    let starts = grown.actions.len();
    let steady = median_ms(runs, || {
        std::hint::black_box(round(&census));
    });
    let growing = median_ms(runs, || {
        std::hint::black_box(round(&busier));
    });
    eprintln!(
        "# scale: {live} live instances in {} roles; steady load {steady:.2} ms (no action), \
         growing load {growing:.2} ms ({starts} starts; web00 {})",
        roles + 1,
        decisions
            .get("web00")
            .map_or(String::new(), |d| d.reason.clone())
    );
    println!(
        "roles scale hosts={} roles={} instances={live} plan_ms={:.2}",
        hosts.len(),
        roles + 1,
        steady.max(growing)
    );
}
