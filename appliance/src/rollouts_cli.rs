//! `paddock rollout status|promote|pause|resume|revert|history`: image roles' rolling
//! updates, read and steered through the API.

use clap::Subcommand;
use paddock_rollout::Rollout;

use crate::cli::{Client, printable};

#[derive(Subcommand)]
pub enum RolloutCmd {
    /// Every role's rollout, or one role's in full.
    Status { role: Option<String> },
    /// Promote the role's healthy canaries: the rest follow, batch by batch.
    Promote { role: String },
    /// Hold the next batch (the one in flight lands).
    Pause { role: String },
    /// Go on where it paused (a failed batch is tried again).
    Resume { role: String },
    /// Back to the last stable image, in batches, without canaries.
    Revert { role: String },
    /// The role's ended rollouts.
    History { role: String },
}

pub fn rollout(api: &Client, cmd: RolloutCmd) -> anyhow::Result<()> {
    let path = |role: &str, rest: &str| format!("/api/v1/rollouts/{role}{rest}");
    let one = |role: &str, command: &str| -> anyhow::Result<()> {
        // Only a role's name goes into the path.
        paddock_roles::check_name(role)?;
        let r: Rollout = api.post(&path(role, &format!("/{command}")), &serde_json::json!({}))?;
        print!("{}", describe(&r));
        Ok(())
    };
    match cmd {
        RolloutCmd::Status { role: None } => {
            let all: Vec<Rollout> = api.get("/api/v1/rollouts")?;
            if all.is_empty() {
                println!("no rollouts (a changed image of an image role starts one)");
            }
            for r in &all {
                println!("{}", line(r));
            }
        }
        RolloutCmd::Status { role: Some(role) } => {
            paddock_roles::check_name(&role)?;
            let r: Rollout = api.get(&path(&role, ""))?;
            print!("{}", describe(&r));
        }
        RolloutCmd::Promote { role } => one(&role, "promote")?,
        RolloutCmd::Pause { role } => one(&role, "pause")?,
        RolloutCmd::Resume { role } => one(&role, "resume")?,
        RolloutCmd::Revert { role } => one(&role, "revert")?,
        RolloutCmd::History { role } => {
            paddock_roles::check_name(&role)?;
            let all: Vec<Rollout> = api.get(&path(&role, "/history"))?;
            for r in &all {
                println!("{}", line(r));
            }
        }
    }
    Ok(())
}

/// One line: role, from → to, phase, batches, why.
pub fn line(r: &Rollout) -> String {
    format!(
        "{:<20} {} -> {}  {}  {} batches{}",
        printable(&r.role),
        printable(&r.from),
        printable(&r.to),
        r.phase.name(),
        r.batches,
        r.why
            .as_deref()
            .map(|w| format!("  ({})", printable(w)))
            .unwrap_or_default()
    )
}

/// A rollout in full, as `paddock rollout status ROLE` prints it.
pub fn describe(r: &Rollout) -> String {
    use std::fmt::Write;
    let mut out = format!("{}\n", line(r));
    let p = &r.policy;
    let _ = writeln!(
        out,
        "policy: max_parallel {}, canary {}, min_healthy {} s, healthy_deadline {} s, \
         progress_deadline {} s, auto_revert {}, auto_promote {}, max_paused {} s",
        p.max_parallel,
        p.canary,
        p.min_healthy_secs,
        p.healthy_deadline_secs,
        p.progress_deadline_secs,
        p.auto_revert,
        p.auto_promote,
        p.max_paused_secs
    );
    for (host, since) in &r.batch {
        let state = match since {
            Some(t) => format!("healthy since {}", paddock_inspector::node::iso(t.secs())),
            None => "not healthy yet".to_string(),
        };
        let _ = writeln!(out, "  in flight: {} ({state})", printable(host));
    }
    if !r.log.is_empty() {
        let _ = writeln!(out, "log:");
    }
    for e in &r.log {
        let host = e
            .host
            .as_deref()
            .map(|h| format!("{}: ", printable(h)))
            .unwrap_or_default();
        let at = paddock_inspector::node::iso(e.at.secs());
        let _ = writeln!(out, "  {at}  {host}{}", printable(&e.text));
    }
    out
}
