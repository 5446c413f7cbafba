//! `paddock spec check|plan|apply|show|rounds` and `paddock census [hold]`: the role
//! engine's command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use paddock_roles::{Spec, minimums};

use crate::roles::plan_text;

use crate::census::{CensusView, LeaseRef, Register, Registered};
use crate::cli::{CallError, Client};
use crate::roles::{Applied, PlanPreview, Round, SpecBody, StoredSpec};

#[derive(Subcommand)]
pub enum SpecCmd {
    /// Validate spec files here (no appliance needed): every problem with file, line, field.
    Check { files: Vec<PathBuf> },
    /// The actions the leader would run for the live census, without running them: for
    /// FILE, or the applied spec.
    Plan { file: Option<PathBuf> },
    /// Validate FILE and make it the appliance's spec (a bad spec changes nothing).
    Apply { file: PathBuf },
    /// The applied spec.
    Show,
    /// What HOST's computed files would hold now; with PATH, that file and the data it is
    /// made from (nothing is stored or sent to the machine).
    Render {
        host: String,
        path: Option<String>,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Plan a kept round again from its record (census, scaled roles' history, time),
    /// with its own spec or FILE: the same spec always gives the same plan.
    Replay {
        /// The round's time (`paddock spec rounds` shows it).
        at_ms: i64,
        #[arg(long)]
        spec: Option<PathBuf>,
    },
    /// The last rounds: census, plan and what each action did.
    Rounds {
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print the rounds as JSON (for replay: each has the spec and the census).
        #[arg(long)]
        json: bool,
        /// Show each shadow spec's plan where it differs from the live one.
        #[arg(long)]
        shadow: bool,
    },
    /// Shadow specs: planned every round beside the live spec, against the same census and
    /// metrics, and never acted on.
    Shadow {
        #[command(subcommand)]
        cmd: ShadowCmd,
    },
}

#[derive(Subcommand)]
pub enum ShadowCmd {
    /// Validate FILE and plan it every round as the shadow NAME.
    Apply { name: String, file: PathBuf },
    /// Stop planning the shadow NAME.
    Remove { name: String },
    /// Every shadow spec.
    List,
}

pub fn shadow(api: &Client, cmd: ShadowCmd) -> anyhow::Result<()> {
    match cmd {
        ShadowCmd::Apply { name, file } => {
            let (file, text) = read_spec(&file)?;
            if let Err(e) = Spec::parse(&file, &text) {
                bail!("{e}\nnothing applied");
            }
            let a: Applied = api.post(
                &format!("/api/v1/spec/shadow/{name}"),
                &SpecBody {
                    file: Some(file),
                    text: Some(text),
                    ..SpecBody::default()
                },
            )?;
            println!("shadow {name} is {}: roles {}", a.file, a.roles.join(", "));
        }
        ShadowCmd::Remove { name } => {
            let _: serde_json::Value = api
                .call("DELETE", format!("/api/v1/spec/shadow/{name}"))
                .send()?;
            println!("shadow {name} removed");
        }
        ShadowCmd::List => {
            let all: std::collections::BTreeMap<String, StoredSpec> =
                api.get("/api/v1/spec/shadow")?;
            if all.is_empty() {
                println!("no shadow specs");
            }
            for (name, s) in all {
                println!(
                    "{name}: {} (applied {} ms since the epoch)",
                    s.file, s.applied_ms
                );
            }
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum CensusCmd {
    /// Register a role instance (or, with only --host, a host) under a store lease and keep
    /// it alive until SIGTERM or SIGINT; then revoke it.
    Hold {
        /// The appliance's URL (hooks get it as PADDOCK_URL).
        #[arg(long, env = "PADDOCK_URL")]
        url: Option<String>,
        #[arg(long)]
        role: Option<String>,
        #[arg(long)]
        instance: Option<String>,
        #[arg(long)]
        host: Option<String>,
        /// The instance's own word on its health: `up`, or anything else to leave its
        /// service's DNS records (its own name stays).
        #[arg(long)]
        status: Option<String>,
        /// A number of the instance's load, `NAME=VALUE` (repeatable); a role's `scale`
        /// follows one of them.
        #[arg(long = "metric", value_parser = parse_metric)]
        metrics: Vec<(String, f64)>,
        /// Read the metrics (`NAME=VALUE` lines) from FILE again every keep-alive and
        /// report them when they change.
        #[arg(long)]
        metrics_file: Option<PathBuf>,
        #[arg(long, default_value_t = crate::census::DEFAULT_TTL_SECS)]
        ttl: u64,
    },
}

/// A metric that is not `NAME=VALUE` with a finite number.
#[derive(Debug, thiserror::Error)]
pub enum MetricError {
    #[error("{0:?}: write NAME=VALUE")]
    NoValue(String),
    #[error("{0:?}: {1:?} is not a number")]
    NotANumber(String, String),
    #[error("{0:?}: not a finite number")]
    NotFinite(String),
}

/// `NAME=VALUE`, a finite number.
pub fn parse_metric(s: &str) -> Result<(String, f64), MetricError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| MetricError::NoValue(s.to_string()))?;
    let v: f64 = v
        .trim()
        .parse()
        .map_err(|_| MetricError::NotANumber(s.to_string(), v.to_string()))?;
    if !v.is_finite() {
        return Err(MetricError::NotFinite(s.to_string()));
    }
    Ok((k.trim().to_string(), v))
}

/// The metrics in `text`: `NAME=VALUE` lines (blank lines and `#` comments skipped).
pub fn parse_metrics(text: &str) -> Result<std::collections::BTreeMap<String, f64>, MetricError> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(parse_metric)
        .collect()
}

fn read_spec(path: &Path) -> anyhow::Result<(String, String)> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.len() > u64::try_from(paddock_roles::spec::MAX_SPEC_BYTES)? {
        bail!(
            "{}: {} bytes; a spec is at most {} bytes",
            path.display(),
            meta.len(),
            paddock_roles::spec::MAX_SPEC_BYTES
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    Ok((path.display().to_string(), text))
}

pub fn spec_check(files: &[PathBuf]) -> anyhow::Result<()> {
    if files.is_empty() {
        bail!("name at least one spec file");
    }
    let mut bad = 0;
    for f in files {
        let (file, text) = read_spec(f)?;
        let spec = match Spec::parse(&file, &text) {
            Ok(spec) => spec,
            Err(e) => {
                bad += 1;
                eprintln!("{e}");
                continue;
            }
        };
        // The templates it names too, as `spec apply` would send them.
        let templates = match read_templates(f, &spec) {
            Ok(t) => t,
            Err(e) => {
                bad += 1;
                eprintln!("{file}: {e:#}");
                continue;
            }
        };
        let mins = minimums(&spec)?;
        let list: Vec<String> = mins.iter().map(|(r, m)| format!("{r} ≥ {m}")).collect();
        println!(
            "{file}: ok, {} roles ({}), {} template(s)",
            spec.roles.len(),
            list.join(", "),
            templates.len()
        );
    }
    if bad > 0 {
        bail!("{bad} spec file(s) with problems");
    }
    Ok(())
}

/// A spec file as a request's body (none: the applied spec).
fn body_of(file: Option<&Path>) -> anyhow::Result<SpecBody> {
    Ok(match file {
        Some(f) => {
            let (file, text) = read_spec(f)?;
            SpecBody {
                file: Some(file),
                text: Some(text),
                ..SpecBody::default()
            }
        }
        None => SpecBody::default(),
    })
}

pub fn spec_plan(api: &Client, file: Option<&Path>) -> anyhow::Result<()> {
    let body = body_of(file)?;
    let p: PlanPreview = api.post("/api/v1/spec/plan", &body)?;
    println!(
        "spec {}: {} hosts, {} instances in the census",
        p.spec_file,
        p.census.hosts.len(),
        p.census.instances.len()
    );
    print!("{}", plan_text(&p.plan, &p.commands));
    Ok(())
}

/// The templates `spec` names, read from the `templates` directory beside its file; each
/// compiled here first, so an error names the operator's file.
fn read_templates(
    spec_path: &Path,
    spec: &Spec,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let dir = spec_path
        .parent()
        .unwrap_or(Path::new("."))
        .join("templates");
    let mut out = std::collections::BTreeMap::new();
    for name in spec.templates() {
        let p = dir.join(&name);
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("template {name}: {}", p.display()))?;
        out.insert(name, text);
    }
    crate::roles::spec_templates(spec, &out).map_err(|e| anyhow::anyhow!("{e}"))
}

pub fn spec_apply(api: &Client, path: &Path) -> anyhow::Result<()> {
    let (file, text) = read_spec(path)?;
    // Checked here first, so the errors name the operator's file even offline.
    let spec = match Spec::parse(&file, &text) {
        Ok(s) => s,
        Err(e) => bail!("{e}\nnothing applied"),
    };
    let templates =
        read_templates(path, &spec).map_err(|e| anyhow::anyhow!("{e:#}; nothing applied"))?;
    let a: Applied = api.post(
        "/api/v1/spec",
        &SpecBody {
            file: Some(file),
            text: Some(text),
            templates,
        },
    )?;
    println!("applied {}: roles {}", a.file, a.roles.join(", "));
    Ok(())
}

pub fn spec_render(api: &Client, host: &str, path: Option<&str>, json: bool) -> anyhow::Result<()> {
    let mut call = api.call("GET", "/api/v1/spec/render").query("host", host);
    if let Some(p) = path {
        call = call.query("path", p);
    }
    let files: Vec<crate::computed::Rendered> = call.send()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&files)?);
        return Ok(());
    }
    if files.is_empty() {
        println!("{host} has no computed files");
    }
    let mut failed = 0;
    for f in &files {
        let role = f
            .role
            .as_deref()
            .map(|r| format!(", role {r}"))
            .unwrap_or_default();
        println!(
            "# {} ({}{role}; mode {:04o}, owner {}:{})",
            f.path, f.source, f.mode, f.uid, f.gid
        );
        match (&f.content, &f.error) {
            (Some(c), _) => {
                print!("{c}");
                if !c.ends_with('\n') && !c.is_empty() {
                    println!();
                }
            }
            (None, e) => {
                failed += 1;
                println!("cannot be made: {}", e.as_deref().unwrap_or("?"));
            }
        }
        if path.is_some() {
            println!("# made from:\n{}", serde_json::to_string_pretty(&f.data)?);
        }
    }
    if failed > 0 {
        bail!("{failed} file(s) cannot be made: the machine is held until they can");
    }
    Ok(())
}

pub fn spec_replay(api: &Client, at_ms: i64, spec: Option<&Path>) -> anyhow::Result<()> {
    let body = body_of(spec)?;
    let r: crate::roles::Replayed = api.post(&format!("/api/v1/spec/replay/{at_ms}"), &body)?;
    println!("round {at_ms} planned again with {}:", r.spec_file);
    for (role, d) in &r.scale {
        println!("  {role}: {} ({})", d.desired, d.reason);
    }
    print!("{}", plan_text(&r.plan, &vec![None; r.plan.actions.len()]));
    if r.same {
        println!("the same plan as the round's");
    } else {
        println!("not the round's plan, which was:");
        print!(
            "{}",
            plan_text(&r.recorded, &vec![None; r.recorded.actions.len()])
        );
    }
    Ok(())
}

pub fn spec_show(api: &Client) -> anyhow::Result<()> {
    let s: StoredSpec = api.get("/api/v1/spec")?;
    println!("# {} (applied {} ms since the epoch)", s.file, s.applied_ms);
    print!("{}", s.text);
    Ok(())
}

pub fn spec_rounds(api: &Client, limit: usize, json: bool, shadow: bool) -> anyhow::Result<()> {
    let rounds: Vec<Round> = api.get(&format!("/api/v1/spec/rounds?limit={limit}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rounds)?);
        return Ok(());
    }
    for r in &rounds {
        println!(
            "round at {} ms: {} hosts, {} instances, {} actions",
            r.at_ms,
            r.census.hosts.len(),
            r.census.instances.len(),
            r.plan.actions.len()
        );
        for (role, d) in &r.scale {
            println!("  scale {role}: {} ({})", d.desired, d.reason);
        }
        let commands: Vec<_> = r.results.iter().map(|x| x.argv.clone()).collect();
        print!("{}", plan_text(&r.plan, &commands));
        if shadow {
            for (name, s) in &r.shadows {
                let diff = crate::roles::shadow_differences(&r.plan, &s.plan);
                if diff.is_empty() {
                    println!("  shadow {name} ({}): the same counts", s.file);
                    continue;
                }
                println!("  shadow {name} ({}), where it differs:", s.file);
                for (role, live, theirs) in diff {
                    let n = |x: Option<u64>| x.map_or("-".to_string(), |v| v.to_string());
                    println!("    {role}: live {} / shadow {}", n(live), n(theirs));
                }
                for (role, d) in &s.scale {
                    println!("    scale {role}: {} ({})", d.desired, d.reason);
                }
            }
        }
        for x in &r.results {
            println!("  {}", crate::roles::describe(x));
        }
    }
    Ok(())
}

pub fn census_list(api: &Client) -> anyhow::Result<()> {
    let v: CensusView = api.get("/api/v1/census")?;
    println!("{} hosts alive", v.hosts.len());
    for h in &v.hosts {
        println!("  {}", h.host);
    }
    println!("{} instances", v.instances.len());
    println!("  {:<20} {:<24} host", "role", "instance");
    for i in &v.instances {
        println!(
            "  {:<20} {:<24} {}",
            i.role,
            i.instance,
            i.host.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

/// `paddock census hold`: register, keep alive every TTL/3 (registering again if the lease
/// was lost; reporting `metrics_file`'s metrics when they change), revoke at SIGTERM/SIGINT.
pub fn census_hold(
    api: &Client,
    mut r: Register,
    metrics_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    let read = |f: &Path| -> anyhow::Result<std::collections::BTreeMap<String, f64>> {
        let text = std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?;
        parse_metrics(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))
    };
    if let Some(f) = &metrics_file {
        r.metrics.extend(read(f)?);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let api = api.clone();
        let register = {
            let (api, r) = (api.clone(), r.clone());
            move || {
                let (api, r) = (api.clone(), r.clone());
                async move {
                    tokio::task::spawn_blocking(move || {
                        api.post::<Registered>("/api/v1/census/register", &r)
                    })
                    .await?
                    .map_err(anyhow::Error::from)
                }
            }
        };
        let mut held = register().await?;
        let mut reported = r.metrics.clone();
        eprintln!(
            "registered {} (lease {:x}, ttl {} s)",
            held.key, held.lease, held.ttl_secs
        );
        let period = Duration::from_secs(held.ttl_secs).div_f64(3.0);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
            let (a, lease) = (api.clone(), LeaseRef { lease: held.lease });
            let kept = tokio::task::spawn_blocking(move || {
                a.post::<LeaseRef>("/api/v1/census/keepalive", &lease)
            })
            .await?;
            match kept {
                Ok(_) => {}
                Err(e) if e.status() == Some(404) => match register().await {
                    Ok(h) => held = h,
                    Err(e) => eprintln!("registering again: {e}"),
                },
                Err(e @ CallError::Unreachable { .. }) | Err(e) => eprintln!("keep-alive: {e}"),
            }
            let Some(f) = &metrics_file else { continue };
            let now = match read(f) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("metrics: {e:#}");
                    continue;
                }
            };
            if now != reported {
                let report = crate::census::StatusReport {
                    lease: held.lease,
                    status: r.status.clone(),
                    metrics: Some(now.clone()),
                };
                let a = api.clone();
                let sent = tokio::task::spawn_blocking(move || {
                    a.post::<serde_json::Value>("/api/v1/census/status", &report)
                })
                .await?;
                match sent {
                    Ok(_) => reported = now,
                    Err(e) => eprintln!("reporting metrics: {e}"),
                }
            }
        }
        let (a, lease) = (api.clone(), LeaseRef { lease: held.lease });
        let _ = tokio::task::spawn_blocking(move || {
            a.post::<LeaseRef>("/api/v1/census/revoke", &lease)
        })
        .await;
        eprintln!("revoked {}", held.key);
        Ok(())
    })
}
