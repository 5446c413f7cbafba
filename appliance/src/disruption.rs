//! The disruption check (Dominator's disruption manager, asked here by the dominator
//! rather than by subd): before an update that reboots a machine or runs a high-impact
//! trigger, the herd asks whether this machine may be disrupted now.
//!
//! Asked in turn: the program `[dominator] disruption_check`, then the `disrupt` hook of
//! every role with an instance on the machine (once per instance). Each gets the machine's
//! data as JSON on stdin ([`Subject`]); exit 0 permits; any other exit, a timeout or a
//! program that cannot run denies, and the first line of its output (else of its errors)
//! says why. Every one must permit; the first denial is the answer. A denied sub waits in
//! `disruption denied` and is asked again after `disruption_retry_secs`; the answers and
//! the wait are on the machine's timeline. Rollouts of image roles move machines through
//! the dominator, so their disruptive updates are asked the same way.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use paddock_dominator::{Disruption, DisruptionCheck, DisruptionQuery};
use paddock_image::Machine;
use paddock_imageserver::mdb::MdbService;
use serde::Serialize;

use crate::roles::{ActionError, HookCall, HookRun, Program, Roles, run_hook, run_program};

/// What a check reads on stdin.
#[derive(Clone, Debug, Serialize)]
pub struct Subject {
    #[serde(flatten)]
    pub update: DisruptionQuery,
    /// The machine's MDB entry, when it has one.
    pub machine: Option<Machine>,
    /// The role instances on it.
    pub instances: Vec<InstanceRef>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct InstanceRef {
    pub role: String,
    pub instance: String,
}

/// The first line of `text` that says something, trimmed and at most 200 characters.
fn first_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(200).collect())
}

/// One check's run as an answer: exit 0 permits (saying what it printed); anything else
/// denies, saying why.
pub fn verdict(who: &str, run: Result<HookRun, ActionError>) -> Disruption {
    match run {
        Ok(r) if r.exit == Some(0) => Disruption::Permitted(match first_line(&r.stdout) {
            Some(line) => format!("{who}: {line}"),
            None => who.to_string(),
        }),
        Ok(r) => {
            let why = first_line(&r.stdout)
                .or_else(|| first_line(&r.stderr))
                .unwrap_or_else(|| match r.exit {
                    Some(code) => format!("exit {code}"),
                    None => "killed by a signal".into(),
                });
            Disruption::Denied(format!("{who}: {why}"))
        }
        Err(e) => Disruption::Denied(format!("{who}: {e}")),
    }
}

/// The answer when every check asked permitted, saying who (nothing asked: nothing said).
pub fn permitted_by(whys: &[String]) -> Disruption {
    if whys.is_empty() {
        Disruption::Permitted(String::new())
    } else {
        Disruption::Permitted(format!("by {}", whys.join("; ")))
    }
}

/// The appliance's disruption check.
pub struct Checker {
    program: Option<PathBuf>,
    timeout: Duration,
    mdb: Arc<MdbService>,
    /// Set once the roles are built (they are built after the dominator).
    roles: OnceLock<Arc<Roles>>,
}

impl Checker {
    pub fn new(program: Option<PathBuf>, timeout: Duration, mdb: Arc<MdbService>) -> Arc<Self> {
        Arc::new(Checker {
            program,
            timeout,
            mdb,
            roles: OnceLock::new(),
        })
    }

    /// The roles whose `disrupt` hooks are asked too.
    pub fn set_roles(&self, roles: Arc<Roles>) {
        let _ = self.roles.set(roles);
    }

    async fn subject(&self, query: DisruptionQuery) -> (Subject, Option<paddock_roles::Spec>) {
        let machine = match self.mdb.entries().await {
            Ok(mut all) => all.remove(&query.hostname).map(|e| e.machine),
            Err(e) => {
                tracing::warn!(error = %e, "disruption: the MDB cannot be read");
                None
            }
        };
        let (spec, instances) = match self.roles.get() {
            Some(roles) => match roles.on_host(&query.hostname).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(error = %e, "disruption: the role census cannot be read");
                    (None, Vec::new())
                }
            },
            None => (None, Vec::new()),
        };
        let instances = instances
            .into_iter()
            .map(|i| InstanceRef {
                role: i.role,
                instance: i.id,
            })
            .collect();
        let subject = Subject {
            update: query,
            machine,
            instances,
        };
        (subject, spec)
    }
}

#[async_trait]
impl DisruptionCheck for Checker {
    async fn ask(&self, query: DisruptionQuery) -> Disruption {
        let (subject, spec) = self.subject(query).await;
        let input = serde_json::to_vec(&subject).unwrap_or_default();
        let host = subject.update.hostname.as_str();
        // Asked in turn; the first denial is the answer, and nothing after it is asked.
        let mut permitted = Vec::new();
        if let Some(path) = &self.program {
            let who = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            let dir = path.parent().unwrap_or(std::path::Path::new("/"));
            let env = [("PADDOCK_HOST", host.to_string())];
            let run = run_program(&Program {
                path,
                args: &["request".to_string()],
                env: &env,
                dir,
                input: Some(&input),
                timeout: self.timeout,
                stdout_kept: crate::roles::OUTPUT_TAIL,
            })
            .await;
            match verdict(&who, run) {
                Disruption::Permitted(why) => permitted.push(why),
                denied => return denied,
            }
        }
        let hooks = self.roles.get().and_then(|r| Some((r, r.config.as_ref()?)));
        if let (Some(spec), Some((roles, cfg))) = (&spec, hooks) {
            for i in &subject.instances {
                let Some(role) = spec.roles.get(&i.role) else {
                    continue;
                };
                let Some(hook) = &role.disrupt else { continue };
                let who = format!("role {}'s disrupt hook", i.role);
                let run = match paddock_roles::hook_argv(hook, spec, role, &i.instance, Some(host))
                {
                    Ok(argv) => {
                        let call = HookCall {
                            role: &i.role,
                            instance: &i.instance,
                            action: "disrupt",
                            host: Some(host),
                            input: Some(&input),
                        };
                        run_hook(cfg, &roles.public_url, &call, &argv).await
                    }
                    Err(e) => Err(ActionError::Command(e)),
                };
                match verdict(&who, run) {
                    Disruption::Permitted(why) => permitted.push(why),
                    denied => return denied,
                }
            }
        }
        permitted_by(&permitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(exit: Option<i32>, stdout: &str, stderr: &str) -> Result<HookRun, ActionError> {
        Ok(HookRun {
            exit,
            stdout: stdout.into(),
            stderr: stderr.into(),
        })
    }

    #[test]
    fn exit_zero_permits_and_anything_else_denies_with_its_reason() {
        let p = |s: &str| Disruption::Permitted(s.into());
        let d = |s: &str| Disruption::Denied(s.into());
        let long = "x".repeat(300);
        let cases = [
            (run(Some(0), "", ""), p("check")),
            (
                run(Some(0), "\n  window open  \nmore\n", ""),
                p("check: window open"),
            ),
            (
                run(Some(2), "outside the window\n", "ignored"),
                d("check: outside the window"),
            ),
            (
                run(Some(1), "", "pending approval\n"),
                d("check: pending approval"),
            ),
            (run(Some(7), "", ""), d("check: exit 7")),
            (run(None, "", ""), d("check: killed by a signal")),
            (
                Err(ActionError::Timeout(Duration::from_secs(30))),
                d("check: the hook ran longer than 30 s and was killed"),
            ),
            (
                run(Some(3), &long, ""),
                d(&format!("check: {}", "x".repeat(200))),
            ),
        ];
        for (i, (r, want)) in cases.into_iter().enumerate() {
            assert_eq!(verdict("check", r), want, "case {i}");
        }
    }

    #[test]
    fn a_permission_says_who_gave_it() {
        let whys = [
            "check".to_string(),
            "role db's disrupt hook: ok".to_string(),
        ];
        assert_eq!(
            permitted_by(&whys),
            Disruption::Permitted("by check; role db's disrupt hook: ok".into())
        );
        assert_eq!(permitted_by(&[]), Disruption::Permitted(String::new()));
    }
}
