//! The IPMI driver: `ipmitool -I lanplus`, as Ironic drives it. The core is pure: the argument
//! vector ([`argv`]), and the reading of `ipmitool`'s output ([`parse_status`], [`confirm`],
//! [`classify_failure`]). The password goes through the environment (`-E`, `IPMI_PASSWORD`),
//! never on the command line; no shell is involved, and the BMC's text is only quoted in
//! messages.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::text::quote;
use crate::{Credentials, ErrorKind, PowerDriver, PowerError, PowerState, RetryPolicy};

/// IPMI 2.0 limits (ipmitool refuses longer ones).
pub const MAX_USERNAME: usize = 16;
pub const MAX_PASSWORD: usize = 20;

/// A BMC spoken to over IPMI 2.0 (RMCP+, `lanplus`).
#[derive(Debug, Clone)]
pub struct IpmiBmc {
    /// Host name or IP address.
    pub host: String,
    /// UDP port (623 on real BMCs).
    pub port: u16,
    pub credentials: Credentials,
    /// `ipmitool`'s own timeout per try (`-N`, seconds) and retries (`-R`).
    pub timeout_secs: u8,
    pub retries: u8,
    /// The `ipmitool` to run (`ipmitool` from `PATH` by default).
    pub ipmitool: PathBuf,
}

impl IpmiBmc {
    pub fn new(host: impl Into<String>, port: u16, credentials: Credentials) -> IpmiBmc {
        IpmiBmc {
            host: host.into(),
            port,
            credentials,
            timeout_secs: 2,
            retries: 2,
            ipmitool: PathBuf::from("ipmitool"),
        }
    }

    /// The settings checked: a host `ipmitool` cannot mistake for an option, names within
    /// IPMI's limits.
    pub fn validate(&self) -> Result<(), PowerError> {
        let bad = |m: String| Err(PowerError::new(ErrorKind::Unsupported, m));
        let h = &self.host;
        if h.is_empty()
            || h.starts_with('-')
            || !h
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-:_".contains(c))
        {
            return bad(format!(
                "IPMI address {:?} is not a host name or IP address",
                quote(h)
            ));
        }
        let user = &self.credentials.username;
        if user.len() > MAX_USERNAME || user.chars().any(char::is_control) {
            return bad(format!(
                "IPMI user names are at most {MAX_USERNAME} bytes without control characters"
            ));
        }
        let pass = self.credentials.password.expose();
        if pass.len() > MAX_PASSWORD || pass.contains('\0') {
            return bad(format!(
                "IPMI 2.0 passwords are at most {MAX_PASSWORD} bytes"
            ));
        }
        Ok(())
    }
}

/// What one `ipmitool` run asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Status,
    On,
    Off,
    /// A hard reset (`power reset`). `power cycle` is not used: virtualbmc and some BMCs
    /// refuse it, and Ironic reboots with off/on or reset.
    Reset,
    BootPxe,
}

impl Op {
    fn words(self) -> &'static [&'static str] {
        match self {
            Op::Status => &["power", "status"],
            Op::On => &["power", "on"],
            Op::Off => &["power", "off"],
            Op::Reset => &["power", "reset"],
            Op::BootPxe => &["chassis", "bootdev", "pxe"],
        }
    }

    /// The command as the operator would type it after `ipmitool … `.
    pub fn command(self) -> String {
        self.words().join(" ")
    }
}

/// `ipmitool`'s arguments for `op` on `bmc` (the program name not included). `-E` makes it
/// read the password from `IPMI_PASSWORD`; `-v` makes it say why a session failed.
pub fn argv(bmc: &IpmiBmc, op: Op) -> Vec<String> {
    let mut v: Vec<String> = [
        "-I",
        "lanplus",
        "-H",
        &bmc.host,
        "-p",
        &bmc.port.to_string(),
        "-U",
        &bmc.credentials.username,
        "-E",
        "-N",
        &bmc.timeout_secs.max(1).to_string(),
        "-R",
        &bmc.retries.max(1).to_string(),
        "-v",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(op.words().iter().map(|w| w.to_string()));
    v
}

/// `power status` → the state (`Chassis Power is on|off`).
pub fn parse_status(stdout: &str) -> Result<PowerState, PowerError> {
    for line in stdout.lines() {
        match line.trim() {
            "Chassis Power is on" => return Ok(PowerState::On),
            "Chassis Power is off" => return Ok(PowerState::Off),
            _ => {}
        }
    }
    Err(PowerError::new(
        ErrorKind::BadAnswer,
        format!("ipmitool power status said {:?}", quote(stdout)),
    ))
}

/// A successful run of `op` says so on stdout; anything else is a bad answer.
pub fn confirm(op: Op, stdout: &str) -> Result<(), PowerError> {
    let expected = match op {
        Op::Status => return parse_status(stdout).map(|_| ()),
        Op::On => "Chassis Power Control: Up/On",
        Op::Off => "Chassis Power Control: Down/Off",
        Op::Reset => "Chassis Power Control: Reset",
        Op::BootPxe => "Set Boot Device to pxe",
    };
    if stdout.lines().any(|l| l.trim() == expected) {
        Ok(())
    } else {
        Err(PowerError::new(
            ErrorKind::BadAnswer,
            format!("ipmitool {} said {:?}", op.command(), quote(stdout)),
        ))
    }
}

/// Why a run that exited non-zero failed, from its stderr (with `-v`). Only the lines that
/// name a failure count: `-v` also prints harmless "Invalid command" completion codes of
/// its own probes on runs that succeed.
pub fn classify_failure(op: Op, bmc: &str, stderr: &str) -> PowerError {
    let has = |needle: &str| stderr.lines().any(|l| l.contains(needle));
    let what = format!("ipmitool {} on {bmc}", op.command());
    if has("RAKP 2 HMAC is invalid")
        || has("unauthorized name")
        || has("invalid authentication")
        || has("RAKP 2 message indicates an error")
        || has("no response from RAKP 1")
        || has("Authentication type NONE not supported")
    {
        return PowerError::new(
            ErrorKind::Credentials,
            format!(
                "{what}: the BMC refused the session ({}): check the node's BMC user name and password",
                quote(last_error_line(stderr, "RAKP"))
            ),
        );
    }
    if has("Get Auth Capabilities error")
        || has("Error issuing Get Channel Authentication Capabilities")
        || (has("Unable to establish") && !has("RAKP"))
    {
        return PowerError::new(
            ErrorKind::Unreachable,
            format!(
                "{what}: no answer to IPMI (RMCP+) from the BMC: check its address and port and that IPMI over LAN is on"
            ),
        );
    }
    let failed = stderr
        .lines()
        .rfind(|l| l.contains("failed") || l.starts_with("Error"))
        .or_else(|| stderr.lines().rfind(|l| !l.trim().is_empty()))
        .unwrap_or("");
    let kind = if [
        "Invalid data field",
        "Invalid command",
        "not supported",
        "Unknown command",
    ]
    .iter()
    .any(|n| failed.contains(n))
    {
        ErrorKind::Unsupported
    } else if ["Node busy", "Timeout", "Out of space"]
        .iter()
        .any(|n| failed.contains(n))
    {
        ErrorKind::Busy
    } else {
        ErrorKind::Refused
    };
    PowerError::new(kind, format!("{what}: {}", quote(failed)))
}

fn last_error_line<'a>(stderr: &'a str, needle: &str) -> &'a str {
    stderr
        .lines()
        .rfind(|l| l.contains(needle))
        .unwrap_or("")
        .trim_start_matches("> ")
}

/// What one run of `ipmitool` gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// The result of `op` from `ipmitool`'s output.
pub fn interpret(op: Op, bmc: &str, out: &Output) -> Result<Option<PowerState>, PowerError> {
    if !out.success {
        return Err(classify_failure(op, bmc, &out.stderr));
    }
    match op {
        Op::Status => parse_status(&out.stdout).map(Some),
        _ => confirm(op, &out.stdout).map(|_| None),
    }
}

/// Runs `ipmitool`; the shell of this driver.
pub trait Runner: Send + Sync {
    fn run(&self, bmc: &IpmiBmc, op: Op) -> Result<Output, PowerError>;
}

/// The real `ipmitool`, with the password in its environment and a hard time limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ipmitool;

impl Runner for Ipmitool {
    fn run(&self, bmc: &IpmiBmc, op: Op) -> Result<Output, PowerError> {
        let mut child = Command::new(&bmc.ipmitool)
            .args(argv(bmc, op))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LC_ALL", "C")
            .env("IPMI_PASSWORD", bmc.credentials.password.expose())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                PowerError::new(
                    ErrorKind::Unsupported,
                    format!(
                        "cannot run {}: {e} (install ipmitool: scripts/install-deps.sh)",
                        bmc.ipmitool.display()
                    ),
                )
            })?;
        // ipmitool bounds itself (-N × -R per step); this bounds it again, whatever it does.
        let limit = Duration::from_secs(
            10 + 4 * u64::from(bmc.timeout_secs.max(1)) * u64::from(bmc.retries.max(1) + 1),
        );
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(p) = pipe {
                    let _ = p.take(1 << 20).read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if started.elapsed() > limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(PowerError::new(
                        ErrorKind::Unreachable,
                        format!(
                            "ipmitool {} on {}: no result within {} s",
                            op.command(),
                            bmc.host,
                            limit.as_secs()
                        ),
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => {
                    return Err(PowerError::new(
                        ErrorKind::Unreachable,
                        format!("waiting for ipmitool: {e}"),
                    ));
                }
            }
        };
        let (out, err) = (
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        );
        Ok(Output {
            success: status.success(),
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
        })
    }
}

/// The IPMI driver over a runner.
pub struct Ipmi<R = Ipmitool> {
    bmc: IpmiBmc,
    runner: R,
    retry: RetryPolicy,
    sleep: fn(Duration),
}

impl Ipmi {
    pub fn new(bmc: IpmiBmc, retry: RetryPolicy) -> Result<Ipmi, PowerError> {
        Ipmi::with_runner(bmc, Ipmitool, retry)
    }
}

impl<R: Runner> Ipmi<R> {
    pub fn with_runner(bmc: IpmiBmc, runner: R, retry: RetryPolicy) -> Result<Ipmi<R>, PowerError> {
        bmc.validate()?;
        Ok(Ipmi {
            bmc,
            runner,
            retry,
            sleep: std::thread::sleep,
        })
    }

    /// Replaces the pause between retries (tests).
    pub fn with_sleep(mut self, sleep: fn(Duration)) -> Ipmi<R> {
        self.sleep = sleep;
        self
    }

    fn op(&self, op: Op) -> Result<Option<PowerState>, PowerError> {
        let name = format!("{}:{}", self.bmc.host, self.bmc.port);
        self.retry.run(self.sleep, || {
            let out = self.runner.run(&self.bmc, op)?;
            interpret(op, &name, &out)
        })
    }

    fn state(&self) -> Result<PowerState, PowerError> {
        self.op(Op::Status)?.ok_or_else(|| {
            PowerError::new(ErrorKind::BadAnswer, "ipmitool power status gave no state")
        })
    }
}

impl<R: Runner> PowerDriver for Ipmi<R> {
    fn status(&self) -> Result<PowerState, PowerError> {
        self.state()
    }

    fn power_on(&self) -> Result<(), PowerError> {
        if self.state()? == PowerState::On {
            return Ok(());
        }
        self.op(Op::On).map(|_| ())
    }

    fn power_off(&self) -> Result<(), PowerError> {
        if self.state()? == PowerState::Off {
            return Ok(());
        }
        self.op(Op::Off).map(|_| ())
    }

    fn reboot(&self) -> Result<(), PowerError> {
        match self.state()? {
            PowerState::Off => self.op(Op::On).map(|_| ()),
            _ => self.op(Op::Reset).map(|_| ()),
        }
    }

    fn boot_pxe_once(&self) -> Result<(), PowerError> {
        self.op(Op::BootPxe).map(|_| ())
    }
}
