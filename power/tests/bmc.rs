//! Both drivers against the real emulators: `scripts/bmc-harness.sh` starts, in a network
//! namespace it creates and removes, libvirtd with one TCG domain on a bridge, sushy-tools'
//! Redfish emulator (HTTP and HTTPS) and virtualbmc in front of it. The drivers run on a
//! thread that has entered that namespace; what they did is checked on the domain itself
//! (`virsh domstate`, `virsh dumpxml`) through the harness. Needs root and
//! `scripts/install-deps.sh`; the first run builds the emulators' venv (pip, cached in
//! /var/cache/paddock/bmc-venv). One test, one domain: at most one TCG VM runs at a time.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use paddock_power::{
    Credentials, ErrorKind, Ipmi, IpmiBmc, PowerDriver, PowerState, Redfish, RedfishBmc,
    RetryPolicy, Throttle, TlsVerify, wait_for_state,
};

/// How long a power action may take to show, and how often to look.
const SETTLE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);

/// An address on the harness's bridge that nothing answers.
const NOBODY: &str = "198.19.60.200";

struct Harness {
    ns: String,
    scratch: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    info: HashMap<String, String>,
}

impl Harness {
    fn start() -> Harness {
        let ns = format!("pbmc-{}", std::process::id());
        let scratch = std::env::temp_dir().join(format!("paddock-bmc-{}", std::process::id()));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/bmc-harness.sh");
        let started = Instant::now();
        let mut child = Command::new("bash")
            .args([script, "run", &ns])
            .arg(&scratch)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run scripts/bmc-harness.sh");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let Some(rest) = line.trim().strip_prefix("ready ") else {
            let status = child.wait().unwrap();
            let _ = std::fs::remove_dir_all(&scratch);
            panic!(
                "scripts/bmc-harness.sh did not start ({status}; its errors are above); it said {:?}",
                line.trim()
            );
        };
        let info = rest
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        eprintln!(
            "bmc harness ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Harness {
            ns,
            scratch,
            child,
            stdin,
            stdout,
            info,
        }
    }

    fn get(&self, key: &str) -> &str {
        self.info
            .get(key)
            .unwrap_or_else(|| panic!("the harness did not say {key}"))
    }

    /// `virsh ARGS` run by the harness inside its namespaces: exit status and output.
    fn virsh(&mut self, args: &str) -> (i32, String) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "virsh {args}").unwrap();
        stdin.flush().unwrap();
        let mut out = String::new();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "harness ended"
            );
            if let Some(rc) = line.trim_end().strip_prefix("end ") {
                return (rc.parse().unwrap(), out);
            }
            out.push_str(line.strip_prefix("| ").unwrap_or(&line));
        }
    }

    fn domstate(&mut self) -> String {
        let dom = self.get("domain").to_string();
        let (rc, out) = self.virsh(&format!("domstate {dom}"));
        assert_eq!(rc, 0, "virsh domstate: {out}");
        out.trim().to_string()
    }

    /// The device the domain boots from first: the first `<os><boot dev=…>` (how virtualbmc
    /// sets it), else the device holding `<boot order='1'/>` (how sushy-tools does),
    /// `network` for an interface, `hd` for a disk.
    fn first_boot_device(&mut self) -> String {
        let dom = self.get("domain").to_string();
        let (rc, xml) = self.virsh(&format!("dumpxml --inactive {dom}"));
        assert_eq!(rc, 0, "virsh dumpxml: {xml}");
        if let Some(at) = xml.find("<boot dev='") {
            let rest = &xml[at + "<boot dev='".len()..];
            return rest.split('\'').next().unwrap().to_string();
        }
        let at = xml
            .find("<boot order='1'/>")
            .unwrap_or_else(|| panic!("no boot device: {xml}"));
        let before = &xml[..at];
        match (before.rfind("<interface "), before.rfind("<disk ")) {
            (Some(i), d) if d.is_none_or(|d| i > d) => "network".into(),
            (_, Some(_)) => "hd".into(),
            _ => panic!("boot order on an unknown device: {xml}"),
        }
    }

    /// Puts the domain's definition back as the harness made it (boot from disk).
    fn reset_definition(&mut self) {
        let xml = self.scratch.join("vm/domain.xml");
        let (rc, out) = self.virsh(&format!("define {}", xml.display()));
        assert_eq!(rc, 0, "virsh define: {out}");
        assert_eq!(self.first_boot_device(), "hd");
    }

    fn credentials(&self) -> Credentials {
        Credentials::new(self.get("user"), self.get("password"))
    }

    fn redfish(&self, scheme: &str, port: &str, tls: TlsVerify) -> RedfishBmc {
        RedfishBmc {
            address: format!("{scheme}://{}:{}", self.get("ip"), self.get(port)),
            system: None,
            credentials: self.credentials(),
            tls,
        }
    }

    fn ipmi(&self) -> IpmiBmc {
        let port = self.get("ipmi").parse().unwrap();
        IpmiBmc::new(self.get("ip"), port, self.credentials())
    }

    /// Runs `f` on a thread inside the harness's network namespace.
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.ns);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).expect("the harness's namespace");
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                f()
            })
            .join()
            .expect("thread in the namespace")
        })
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Closing its stdin makes the harness stop everything and remove the namespace.
        drop(self.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Power off → PXE once → on → reboot → off through `d`, checked on the domain.
fn drive(h: &mut Harness, name: &str, d: &dyn PowerDriver) {
    let t = Instant::now();
    assert_eq!(
        h.inside(|| d.status()).unwrap(),
        PowerState::Off,
        "{name}: starts off"
    );
    assert_eq!(h.domstate(), "shut off");
    h.inside(|| d.boot_pxe_once()).unwrap();
    assert_eq!(
        h.first_boot_device(),
        "network",
        "{name}: the PXE override reached the domain"
    );
    h.inside(|| d.power_on()).unwrap();
    h.inside(|| wait_for_state(d, PowerState::On, SETTLE, POLL))
        .unwrap();
    assert_eq!(h.domstate(), "running", "{name}: power on");
    h.inside(|| d.power_on()).unwrap(); // already on: nothing to do
    h.inside(|| d.reboot()).unwrap();
    assert_eq!(h.domstate(), "running", "{name}: a reset keeps it running");
    h.inside(|| d.power_off()).unwrap();
    h.inside(|| wait_for_state(d, PowerState::Off, SETTLE, POLL))
        .unwrap();
    assert_eq!(h.domstate(), "shut off", "{name}: power off");
    h.inside(|| d.power_off()).unwrap(); // already off
    eprintln!(
        "{name}: status, PXE once, on, reboot, off in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        attempts: 2,
        first_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(100),
    }
}

#[test]
fn redfish_and_ipmi_drive_the_emulators_and_fail_clearly() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the BMC harness needs root (network namespaces, libvirtd)"
    );
    let total = Instant::now();
    let mut h = Harness::start();

    // Redfish over plain HTTP.
    let bmc = h.redfish("http", "http", TlsVerify::Verify);
    let d = Redfish::connect(&bmc, RetryPolicy::default()).unwrap();
    drive(&mut h, "redfish", &d);
    h.reset_definition();

    // IPMI.
    let d = Ipmi::new(h.ipmi(), RetryPolicy::default()).unwrap();
    drive(&mut h, "ipmi", &d);

    // Redfish over HTTPS: a self-signed certificate verifies against its CA, fails
    // verification against the public roots, and is accepted with verification off.
    let ca = PathBuf::from(h.get("ca"));
    let https = |tls| Redfish::connect(&h.redfish("https", "https", tls), quick()).unwrap();
    let (with_ca, public, insecure) = (
        https(TlsVerify::CaFile(ca)),
        https(TlsVerify::Verify),
        https(TlsVerify::Insecure),
    );
    assert_eq!(h.inside(|| with_ca.status()).unwrap(), PowerState::Off);
    assert_eq!(h.inside(|| insecure.status()).unwrap(), PowerState::Off);
    let e = h.inside(|| public.status()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Tls, "{e}");
    assert!(e.message.contains("give the BMC's CA certificate"), "{e}");

    // A wrong password: a clear credentials error from each protocol.
    let mut bmc = h.redfish("http", "http", TlsVerify::Verify);
    bmc.credentials = Credentials::new(h.get("user"), "not-the-password");
    let d = Redfish::connect(&bmc, quick()).unwrap();
    let e = h.inside(|| d.status()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    assert!(e.message.contains("HTTP 401"), "{e}");
    let mut bmc = h.ipmi();
    bmc.credentials = Credentials::new(h.get("user"), "not-the-password");
    let d = Ipmi::new(bmc, quick()).unwrap();
    let e = h.inside(|| d.status()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    assert!(e.message.contains("RAKP 2 HMAC is invalid"), "{e}");

    // An unreachable BMC: a clear error from each protocol, after a bounded time.
    let mut bmc = h.redfish("http", "http", TlsVerify::Verify);
    bmc.address = format!("http://{NOBODY}:8000");
    let d = Redfish::connect(&bmc, quick()).unwrap();
    let t = Instant::now();
    let e = h.inside(|| d.status()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(e.message.contains("after 2 tries"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let mut bmc = h.ipmi();
    bmc.host = NOBODY.into();
    (bmc.timeout_secs, bmc.retries) = (1, 1);
    let d = Ipmi::new(bmc, quick()).unwrap();
    let t = Instant::now();
    let e = h.inside(|| d.status()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    eprintln!(
        "unreachable IPMI BMC reported in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    assert_eq!(h.domstate(), "shut off");

    throttle_spaces_power_ons_as_the_bmc_log_shows(&h);

    let ns = h.ns.clone();
    drop(h);
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(&ns),
        "the harness removed its namespace"
    );
    eprintln!("whole BMC test in {:.1} s", total.elapsed().as_secs_f64());
}

/// The power-on throttle without the appliance: 10 machines (sushy-tools' fake driver)
/// asked to start at once with a limit of 2 per 10 s; the emulator's own log shows when each
/// Reset arrived.
fn throttle_spaces_power_ons_as_the_bmc_log_shows(h: &Harness) {
    let count: usize = h.get("fakes").parse().unwrap();
    let fake_uuid = |i: usize| format!("0f000000-0000-4000-8000-{i:012}");
    let drivers: Vec<Redfish> = (0..count)
        .map(|i| {
            let mut bmc = h.redfish("http", "fake", TlsVerify::Verify);
            bmc.system = Some(fake_uuid(i));
            Redfish::connect(&bmc, RetryPolicy::default()).unwrap()
        })
        .collect();
    let mut throttle = Throttle::new(2, Duration::from_secs(10)).unwrap();
    for i in 0..count {
        assert!(throttle.request(i));
    }
    let epoch = Instant::now();
    let clock = || u64::try_from(epoch.elapsed().as_millis()).unwrap();
    let started =
        h.inside(|| throttle.run_blocking(clock, std::thread::sleep, |&i| drivers[i].power_on()));
    let ours: Vec<u64> = started.iter().map(|s| s.at_ms / 1000).collect();
    for s in &started {
        assert_eq!(s.result, Ok(()), "power-on of fake-{}", s.node);
    }
    assert_eq!(
        ours,
        [0, 0, 10, 10, 20, 20, 30, 30, 40, 40],
        "admitted at (s)"
    );

    // The BMC's side: werkzeug's access log, `… [24/Nov/2026 04:20:01] "POST …Reset …" 204`
    // (the POST in colour escapes).
    let log = std::fs::read_to_string(h.get("fakelog")).unwrap();
    let mut at: Vec<(u32, String)> = log
        .lines()
        .filter(|l| {
            l.contains("POST /redfish")
                && l.contains("/Actions/ComputerSystem.Reset")
                && l.contains("\" 204")
        })
        .map(|l| {
            let stamp = l
                .split('[')
                .nth(1)
                .and_then(|r| r.split(']').next())
                .unwrap();
            let hms: Vec<u32> = stamp
                .rsplit(' ')
                .next()
                .unwrap()
                .split(':')
                .map(|n| n.parse().unwrap())
                .collect();
            let system = l
                .split("/Systems/")
                .nth(1)
                .unwrap()
                .split('/')
                .next()
                .unwrap();
            (hms[0] * 3600 + hms[1] * 60 + hms[2], system.to_string())
        })
        .collect();
    at.sort();
    assert_eq!(
        at.len(),
        count,
        "one Reset per machine in the BMC's log:\n{log}"
    );
    let first = at[0].0;
    let relative: Vec<u32> = at.iter().map(|(t, _)| t - first).collect();
    eprintln!(
        "throttle 2 per 10 s, 10 machines: the BMC log's Reset times (s from the first): {relative:?}"
    );
    for i in 0..count - 2 {
        // Whole seconds: a 10 s spacing can read as 9 or 10.
        assert!(
            relative[i + 2] - relative[i] >= 9,
            "3 power-ons within 10 s: {relative:?}"
        );
    }
    assert!((39..=45).contains(&relative[count - 1]), "{relative:?}");
}
