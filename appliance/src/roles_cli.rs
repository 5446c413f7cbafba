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
    /// The last rounds: census, plan and what each action did.
    Rounds {
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print the rounds as JSON (for replay: each has the spec and the census).
        #[arg(long)]
        json: bool,
    },
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
        #[arg(long, default_value_t = crate::census::DEFAULT_TTL_SECS)]
        ttl: u64,
    },
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
        match Spec::parse(&file, &text) {
            Ok(spec) => {
                let mins = minimums(&spec)?;
                let list: Vec<String> = mins.iter().map(|(r, m)| format!("{r} ≥ {m}")).collect();
                println!(
                    "{file}: ok, {} roles ({})",
                    spec.roles.len(),
                    list.join(", ")
                );
            }
            Err(e) => {
                bad += 1;
                eprintln!("{e}");
            }
        }
    }
    if bad > 0 {
        bail!("{bad} spec file(s) with problems");
    }
    Ok(())
}

pub fn spec_plan(api: &Client, file: Option<&Path>) -> anyhow::Result<()> {
    let body = match file {
        Some(f) => {
            let (file, text) = read_spec(f)?;
            SpecBody {
                file: Some(file),
                text: Some(text),
                ..SpecBody::default()
            }
        }
        None => SpecBody::default(),
    };
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
            .with_context(|| format!("template {name}: {}; nothing applied", p.display()))?;
        out.insert(name, text);
    }
    crate::roles::spec_templates(spec, &out).map_err(|e| anyhow::anyhow!("{e}; nothing applied"))
}

pub fn spec_apply(api: &Client, path: &Path) -> anyhow::Result<()> {
    let (file, text) = read_spec(path)?;
    // Checked here first, so the errors name the operator's file even offline.
    let spec = match Spec::parse(&file, &text) {
        Ok(s) => s,
        Err(e) => bail!("{e}\nnothing applied"),
    };
    let templates = read_templates(path, &spec)?;
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

pub fn spec_show(api: &Client) -> anyhow::Result<()> {
    let s: StoredSpec = api.get("/api/v1/spec")?;
    println!("# {} (applied {} ms since the epoch)", s.file, s.applied_ms);
    print!("{}", s.text);
    Ok(())
}

pub fn spec_rounds(api: &Client, limit: usize, json: bool) -> anyhow::Result<()> {
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
        let commands: Vec<_> = r.results.iter().map(|x| x.argv.clone()).collect();
        print!("{}", plan_text(&r.plan, &commands));
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
/// was lost), revoke at SIGTERM/SIGINT.
pub fn census_hold(api: &Client, r: Register) -> anyhow::Result<()> {
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
