//! `bench/roles.sh`'s measurement: `plan` for `spec/appliance.toml` over HOSTS hosts (10 of
//! them appliance hosts with the `CUSTOM_PADDOCK_HOST` trait, the rest x86-64 machines),
//! from an empty census (every instance to start: the largest plan) and from the census
//! that plan leads to (the steady state the leader re-plans every round).
//! Prints `roles hosts=<n> plan_ms=<t>` (the median of RUNS plans from empty) and `#` detail
//! lines on stderr.

use std::time::Instant;

use paddock_roles::{Census, Host, Spec, applied, plan};

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
}
