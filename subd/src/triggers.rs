//! Which services an update stops, starts, reloads or reboots for (Dominator's
//! `sub/rpcd/update.go:runTriggers`), and the shell that runs the commands.
//!
//! [`trigger_actions`] is pure. The stop phase matches the changed paths against the old
//! image's triggers merged with the new one's (so a daemon the new image removes is stopped
//! and, lacking a new trigger, never started again); the start phase against the new image's
//! only. Triggers run in `SortName` order (version sort). A service with a matched trigger
//! that is not a reload is stopped and started, and its reload triggers are skipped; a
//! service matched by reload triggers only is not stopped and is reloaded at start. If any
//! matched trigger reboots, nothing is stopped and only the rebooting triggers are started,
//! then the machine reboots unless one of them failed (a failure of a trigger named
//! `reboot` is ignored). The service `subd` is never stopped: `subd restart` comes last.
//! HighImpact is reported when any trigger of either phase that matched has it.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use paddock_image::{Trigger, Triggers};

pub use paddock_subd_proto::{Action, CommandOutcome, TriggerActions, Verb};

/// The service that is never stopped, only restarted last.
pub const SUBD_SERVICE: &str = "subd";

/// The actions for an update whose changed paths ([`paddock_image::UpdateRequest::changed_paths`])
/// are `changed`, from the triggers of the previous update (`old`) and of this one (`new`).
pub fn trigger_actions(old: &Triggers, new: &Triggers, changed: &[&str]) -> TriggerActions {
    let merged = old.merge(new);
    let stop_matched = merged.matching(changed.iter().copied());
    let start_matched = new.matching(changed.iter().copied());
    let high_impact = stop_matched
        .iter()
        .chain(start_matched.iter())
        .any(|t| t.high_impact);
    let reboot = start_matched.iter().any(|t| t.do_reboot);
    let any_reboot = reboot || stop_matched.iter().any(|t| t.do_reboot);

    let mut out = TriggerActions {
        high_impact,
        reboot,
        ..TriggerActions::default()
    };
    if !any_reboot {
        for (service, reload_only) in services(&stop_matched) {
            if !reload_only && service != SUBD_SERVICE {
                out.stop.push(Action::new(service, Verb::Stop));
            }
        }
    }
    if reboot {
        let rebooting: Vec<&Trigger> = start_matched
            .iter()
            .copied()
            .filter(|t| t.do_reboot)
            .collect();
        for (service, _) in services(&rebooting) {
            let mut a = Action::new(service, Verb::Start);
            a.ignore_failure = service == "reboot";
            out.start.push(a);
        }
        return out;
    }
    let mut restart_subd = false;
    for (service, reload_only) in services(&start_matched) {
        if service == SUBD_SERVICE {
            restart_subd = true;
            continue;
        }
        let verb = if reload_only {
            Verb::Reload
        } else {
            Verb::Start
        };
        out.start.push(Action::new(service, verb));
    }
    if restart_subd {
        out.start.push(Action::new(SUBD_SERVICE, Verb::Restart));
    }
    out
}

/// The services of matched triggers in run order (first appearance), each with whether only
/// reload triggers matched it.
fn services<'a>(matched: &[&'a Trigger]) -> Vec<(&'a str, bool)> {
    let mut out: Vec<(&'a str, bool)> = Vec::new();
    for t in matched {
        match out.iter_mut().find(|(s, _)| *s == t.service) {
            Some((_, reload_only)) => *reload_only &= t.do_reload,
            None => out.push((t.service.as_str(), t.do_reload)),
        }
    }
    out
}

/// Output kept per command.
pub const OUTPUT_BYTES: usize = 4096;

/// Runs `argv ++ args` with standard input from /dev/null and its output into a scratch
/// file in `scratch_dir` (not a pipe: a daemon the command starts keeps its descriptors, and
/// a pipe would never end). Killed after `timeout`.
pub fn run_command(
    argv: &[String],
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
    scratch_dir: &Path,
) -> CommandOutcome {
    let started = Instant::now();
    let command = argv
        .iter()
        .map(String::as_str)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = CommandOutcome {
        command,
        ..CommandOutcome::default()
    };
    let Some((prog, rest)) = argv.split_first() else {
        out.output = "no command configured".into();
        return out;
    };
    let scratch = scratch_dir.join(format!(
        "command-output.{}.{}",
        std::process::id(),
        unique()
    ));
    let file = match std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&scratch)
    {
        Ok(f) => f,
        Err(e) => {
            out.output = format!("cannot create {}: {e}", scratch.display());
            return out;
        }
    };
    let _ = std::fs::remove_file(&scratch);
    let (Ok(f1), Ok(f2)) = (file.try_clone(), file.try_clone()) else {
        out.output = "cannot duplicate the output file".into();
        return out;
    };
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .args(args)
        .stdin(Stdio::null())
        .stdout(f1)
        .stderr(f2);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            out.output = format!("cannot run {prog}: {e}");
            out.elapsed_ms = started.elapsed().as_millis() as u64;
            return out;
        }
    };
    let deadline = started + timeout;
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => {
                out.output = format!("waiting for {prog}: {e}");
                break None;
            }
        }
    };
    let mut buf = Vec::new();
    let mut f = file;
    use std::io::Seek;
    if f.seek(std::io::SeekFrom::Start(0)).is_ok() {
        let _ = (&mut f).take(OUTPUT_BYTES as u64).read_to_end(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    out.elapsed_ms = started.elapsed().as_millis() as u64;
    match status {
        Some(s) => {
            out.ok = s.success();
            out.exit_code = s.code();
            out.output = text;
        }
        None if out.output.is_empty() => {
            out.output = format!("timed out after {} s; killed. {text}", timeout.as_secs());
        }
        None => {}
    }
    out
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Splits a configured command (`service`, `/usr/local/bin/svc --quiet`) on whitespace.
pub fn split_command(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(json: &str) -> Triggers {
        Triggers::parse(json).unwrap()
    }

    fn names(a: &[Action]) -> Vec<String> {
        a.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn trigger_table() {
        let ssh = r#"{"MatchLines": ["/usr/sbin/sshd"], "Service": "ssh"}"#;
        let ssh_reload = r#"{"MatchLines": ["/etc/ssh/.*"], "Service": "ssh", "DoReload": true}"#;
        let nginx_reload =
            r#"{"MatchLines": ["/etc/nginx/.*"], "Service": "nginx", "DoReload": true}"#;
        let cron = r#"{"MatchLines": ["/usr/sbin/cron"], "Service": "cron"}"#;
        let kernel = r#"{"MatchLines": ["/boot/.*"], "Service": "kernel", "DoReboot": true, "HighImpact": true}"#;
        let reboot = r#"{"MatchLines": ["/boot/.*"], "Service": "reboot", "DoReboot": true}"#;
        let subd = r#"{"MatchLines": ["/usr/sbin/paddock-subd"], "Service": "subd"}"#;
        let db = r#"{"MatchLines": ["/usr/sbin/db"], "Service": "db", "HighImpact": true}"#;
        let sorted_b = r#"{"MatchLines": ["/x"], "Service": "b", "SortName": "svc10"}"#;
        let sorted_a = r#"{"MatchLines": ["/x"], "Service": "a", "SortName": "svc9"}"#;
        struct Case {
            name: &'static str,
            old: String,
            new: String,
            changed: &'static [&'static str],
            stop: &'static [&'static str],
            start: &'static [&'static str],
            reboot: bool,
            high_impact: bool,
        }
        let l = |v: &[&str]| format!("[{}]", v.join(","));
        let cases = [
            Case {
                name: "nothing matched",
                old: l(&[]),
                new: l(&[ssh]),
                changed: &["/etc/motd"],
                stop: &[],
                start: &[],
                reboot: false,
                high_impact: false,
            },
            Case {
                name: "a binary: stop and start",
                old: l(&[]),
                new: l(&[ssh, ssh_reload]),
                changed: &["/usr/sbin/sshd", "/etc/ssh/sshd_config"],
                stop: &["ssh stop"],
                start: &["ssh start"],
                reboot: false,
                high_impact: false,
            },
            Case {
                name: "config only: reload, not stopped",
                old: l(&[]),
                new: l(&[ssh, ssh_reload]),
                changed: &["/etc/ssh/sshd_config"],
                stop: &[],
                start: &["ssh reload"],
                reboot: false,
                high_impact: false,
            },
            Case {
                name: "removed by the new image: old trigger stops it, nothing starts it",
                old: l(&[cron]),
                new: l(&[ssh]),
                changed: &["/usr/sbin/cron"],
                stop: &["cron stop"],
                start: &[],
                reboot: false,
                high_impact: false,
            },
            Case {
                name: "version order of SortName",
                old: l(&[]),
                new: l(&[sorted_b, sorted_a]),
                changed: &["/x"],
                stop: &["a stop", "b stop"],
                start: &["a start", "b start"],
                reboot: false,
                high_impact: false,
            },
            Case {
                name: "subd is never stopped, restarted last",
                old: l(&[]),
                new: l(&[subd, cron, nginx_reload]),
                changed: &["/usr/sbin/paddock-subd", "/usr/sbin/cron", "/etc/nginx/x"],
                stop: &["cron stop"],
                start: &["cron start", "nginx reload", "subd restart"],
                reboot: false,
                high_impact: false,
            },
            Case {
                name: "reboot: no stops, only rebooting starts",
                old: l(&[]),
                new: l(&[kernel, reboot, cron]),
                changed: &["/boot/vmlinuz", "/usr/sbin/cron"],
                stop: &[],
                start: &["kernel start", "reboot start"],
                reboot: true,
                high_impact: true,
            },
            Case {
                name: "high impact from the old image's triggers",
                old: l(&[db]),
                new: l(&[]),
                changed: &["/usr/sbin/db"],
                stop: &["db stop"],
                start: &[],
                reboot: false,
                high_impact: true,
            },
        ];
        for c in cases {
            let a = trigger_actions(&t(&c.old), &t(&c.new), c.changed);
            assert_eq!(names(&a.stop), c.stop, "{}: stop", c.name);
            assert_eq!(names(&a.start), c.start, "{}: start", c.name);
            assert_eq!(a.reboot, c.reboot, "{}: reboot", c.name);
            assert_eq!(a.high_impact, c.high_impact, "{}: high impact", c.name);
        }
        let a = trigger_actions(&t("[]"), &t(&l(&[reboot])), &["/boot/x"]);
        assert!(a.start[0].ignore_failure);
    }

    #[test]
    fn commands_run_with_output_and_a_timeout() {
        let d = tempfile::tempdir().unwrap();
        let sh = |s: &str| vec!["sh".to_string(), "-c".to_string(), s.to_string()];
        let o = run_command(
            &sh("echo out; echo err >&2; echo \"$0 $1 $V\"; exit 3"),
            &["a1", "a2"],
            &[("V", "v")],
            Duration::from_secs(10),
            d.path(),
        );
        assert!(!o.ok);
        assert_eq!(o.exit_code, Some(3));
        assert_eq!(o.output, "out\nerr\na1 a2 v\n");
        let o = run_command(&sh("true"), &[], &[], Duration::from_secs(10), d.path());
        assert!(o.ok && o.output.is_empty());
        // A daemon that keeps the output open does not hold the command up.
        let t0 = Instant::now();
        let o = run_command(
            &sh("sleep 5 & echo started"),
            &[],
            &[],
            Duration::from_secs(10),
            d.path(),
        );
        assert!(o.ok && o.output == "started\n", "{o:?}");
        assert!(t0.elapsed() < Duration::from_secs(4));
        let o = run_command(
            &sh("sleep 5"),
            &[],
            &[],
            Duration::from_millis(200),
            d.path(),
        );
        assert!(!o.ok && o.output.contains("timed out"), "{o:?}");
        let o = run_command(
            &["/nonexistent/x".into()],
            &[],
            &[],
            Duration::from_secs(1),
            d.path(),
        );
        assert!(!o.ok && o.output.contains("cannot run"), "{o:?}");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
