//! Test hosts for integration tests: network namespaces joined by veth pairs, the real
//! `paddock` binary running inside one of them, and real clients in the others.
//!
//! Everything uses 198.18.0.0/15 addresses inside namespaces the test creates; `Drop`
//! removes them. Tests need root and the client tools that `.ci/run` installs; a missing
//! prerequisite fails the test with a message saying what to install.

#![allow(dead_code)]

pub mod kill;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub const SERVER_IP: &str = "198.18.0.1";
pub const PUBLIC_URL: &str = "http://198.18.0.1:8080";

/// Fails the test unless we are root and every tool is installed.
pub fn require(tools: &[&str]) {
    assert!(
        nix_is_root(),
        "integration tests create network namespaces and must run as root"
    );
    for t in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            found,
            "{t} is not installed; run .ci/run or see README (test prerequisites)"
        );
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

pub fn sh(cmd: &str) -> Output {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("spawn sh")
}

#[track_caller]
pub fn sh_ok(cmd: &str) -> String {
    let out = sh(cmd);
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace; deleted (with its interfaces) on drop.
pub struct Ns {
    pub name: String,
}

impl Ns {
    pub fn new(name: String) -> Self {
        let _ = sh(&format!("ip netns del {name} 2>/dev/null"));
        sh_ok(&format!(
            "ip netns add {name} && ip -n {name} link set lo up"
        ));
        Ns { name }
    }

    /// Runs a shell command inside the namespace.
    pub fn sh(&self, cmd: &str) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, "sh", "-c", cmd])
            .output()
            .expect("spawn ip netns exec")
    }

    #[track_caller]
    pub fn sh_ok(&self, cmd: &str) -> String {
        let out = self.sh(cmd);
        assert!(
            out.status.success(),
            "in {}: `{cmd}` failed: {}\n{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn spawn(&self, cmd: &str, log: &Path) -> Child {
        let log = std::fs::File::create(log).expect("log file");
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "sh",
                "-c",
                &format!("exec {cmd}"),
            ])
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("spawn")
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = sh(&format!(
            "ip netns pids {} | xargs -r kill -9 2>/dev/null",
            self.name
        ));
        let _ = sh(&format!("ip netns del {}", self.name));
    }
}

/// Two hosts on one link: `server` (198.18.0.1/24 on `server_if`) and `client` (`client_if`,
/// no address).
pub struct Link {
    pub client: Ns,
    pub server: Ns,
    pub server_if: String,
    pub client_if: String,
    pub tag: String,
}

impl Link {
    /// Gives the client end the static address 198.18.0.50/24 (for clients that do not use
    /// DHCP).
    pub fn give_client_static_address(&self) {
        self.client.sh_ok(&format!(
            "ip addr add 198.18.0.50/24 dev {}",
            self.client_if
        ));
    }

    pub fn new() -> Self {
        let tag = format!(
            "pdk{}x{}",
            std::process::id() % 100_000,
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let server = Ns::new(format!("{tag}-srv"));
        let client = Ns::new(format!("{tag}-cli"));
        let (server_if, client_if) = (format!("{tag}s"), format!("{tag}c"));
        connect(&server, &server_if, &client, &client_if);
        server.sh_ok(&format!("ip addr add {SERVER_IP}/24 dev {server_if}"));
        Link {
            client,
            server,
            server_if,
            client_if,
            tag,
        }
    }
}

/// A veth pair between two namespaces, both ends up.
pub fn connect(a: &Ns, a_if: &str, b: &Ns, b_if: &str) {
    sh_ok(&format!(
        "ip link add {a_if} netns {} type veth peer name {b_if} netns {}",
        a.name, b.name
    ));
    a.sh_ok(&format!("ip link set {a_if} up"));
    b.sh_ok(&format!("ip link set {b_if} up"));
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("paddock-test-{tag}"));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The real `paddock serve` running in a namespace.
pub struct Appliance {
    pub child: Option<Child>,
    pub config: PathBuf,
    pub log: PathBuf,
    ns_name: String,
    starts: u32,
    /// Run with `PADDOCK_INSECURE=true` (every test but the security ones).
    insecure: bool,
}

impl Appliance {
    /// Writes `config` to the scratch directory and starts the appliance in `ns`; returns
    /// when `/healthz` answers.
    /// The appliance in its explicit insecure mode (plain HTTP, every method open): the
    /// tests of everything but security itself.
    pub fn start(ns: &Ns, scratch: &Scratch, config: &str) -> Self {
        Self::start_mode(ns, scratch, config, true)
    }

    /// The appliance with TLS on (its configuration must say where the certificates are,
    /// and `paddock certs init` must have run).
    pub fn start_secure(ns: &Ns, scratch: &Scratch, config: &str) -> Self {
        Self::start_mode(ns, scratch, config, false)
    }

    fn start_mode(ns: &Ns, scratch: &Scratch, config: &str, insecure: bool) -> Self {
        let path = scratch.path("paddock.toml");
        std::fs::write(&path, config).expect("write config");
        let mut a = Appliance {
            child: None,
            config: path,
            log: scratch.path("paddock.log"),
            ns_name: ns.name.clone(),
            starts: 0,
            insecure,
        };
        a.restart(ns);
        a
    }

    pub fn restart(&mut self, ns: &Ns) {
        self.starts += 1;
        let log = self.log.with_extension(format!("{}.log", self.starts));
        self.log = log.clone();
        let child = ns.spawn(
            &format!(
                "env PADDOCK_LOG=debug PADDOCK_INSECURE={} {} serve --config {}",
                self.insecure,
                env!("CARGO_BIN_EXE_paddock"),
                self.config.display()
            ),
            &log,
        );
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ns
                .sh(&format!("curl -sf -m 1 {PUBLIC_URL}/healthz"))
                .status
                .success()
            {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("paddock exited with {status}:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "paddock did not become healthy:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = sh(&format!("kill -TERM {}", c.id()));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- paddock log ({}) ---\n{}",
                self.ns_name,
                self.log_text()
            );
        }
    }
}

/// The usual single-subnet configuration, with extra TOML appended.
pub fn base_config(link: &Link, scratch: &Scratch, extra: &str) -> String {
    let subnet = format!(
        r#"[[dhcp.subnets]]
network = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.199"]
routers = ["{SERVER_IP}"]
lease_time = 3600
"#
    );
    subnets_config(&link.server_if, scratch, &subnet, extra)
}

/// A configuration serving DHCP on `iface` for `subnets` (`[[dhcp.subnets]]` tables), with
/// extra TOML appended.
pub fn subnets_config(iface: &str, scratch: &Scratch, subnets: &str, extra: &str) -> String {
    format!(
        r#"data_dir = "{data}"
[http]
listen = "{SERVER_IP}:8080"
[dhcp]
interfaces = ["{iface}"]
{subnets}{extra}"#,
        data = scratch.path("data").display(),
    )
}

/// `paddock_{family}_packets_total{outcome}` (`family`: `dhcp` or `dhcp6`) from the
/// appliance's `/metrics`, as served in `ns`.
pub fn dhcp_packets(ns: &Ns, family: &str, outcome: &str) -> u64 {
    let metrics = ns.sh_ok(&format!("curl -sf {PUBLIC_URL}/metrics"));
    let series = format!("paddock_{family}_packets_total{{outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {outcome} packet counter in:\n{metrics}"))
}

/// Parses `KEY=VALUE` lines.
pub fn env_map(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A busybox udhcpc script that records what the server said, one file per event.
pub fn udhcpc_script(scratch: &Scratch) -> PathBuf {
    let p = scratch.path("udhcpc.sh");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\n[ \"$1\" = bound ] || [ \"$1\" = renew ] || exit 0\nenv > {}/udhcpc.$1.env\n",
            scratch.0.display()
        ),
    )
    .expect("write script");
    sh_ok(&format!("chmod +x {}", p.display()));
    p
}

/// Runs udhcpc once with `args`; returns the environment the server's answer produced.
pub fn udhcpc(
    link: &Link,
    scratch: &Scratch,
    args: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    let script = udhcpc_script(scratch);
    let bound = scratch.path("udhcpc.bound.env");
    let _ = std::fs::remove_file(&bound);
    let out = link.client.sh(&format!(
        "busybox udhcpc -i {} -n -q -f -t 3 -T 1 -A 1 -s {} {args}",
        link.client_if,
        script.display()
    ));
    if !out.status.success() {
        return None;
    }
    let text = std::fs::read_to_string(&bound).ok()?;
    Some(env_map(&text))
}

/// An HTTP answer as curl saw it.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    /// The Inspector error message, asserting the `{"error": {"message": …}}` shape.
    #[track_caller]
    pub fn error(&self) -> String {
        let v = self.json();
        v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.message in {v}"))
            .to_string()
    }
}

/// Calls the appliance's HTTP API with curl from inside `ns`.
pub fn http(
    ns: &Ns,
    scratch: &Scratch,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Resp {
    let mut cmd = format!("curl -s -i -X {method} '{PUBLIC_URL}{path}'");
    for (k, v) in headers {
        cmd.push_str(&format!(" -H '{k}: {v}'"));
    }
    if let Some(b) = body {
        let f = scratch.path(&format!(
            "body-{}.json",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&f, b).expect("write body");
        cmd.push_str(&format!(
            " -H 'Content-Type: application/json' --data-binary @{}",
            f.display()
        ));
    }
    curl(ns, &cmd)
}

/// Runs a `curl -s -i …` command inside `ns` and reads its answer.
pub fn curl(ns: &Ns, cmd: &str) -> Resp {
    let out = ns.sh(cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no HTTP status from `{cmd}`: {text:?} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Resp {
        status,
        headers,
        body: body.to_string(),
    }
}

/// An IPA-shaped inventory for a machine with these MACs (the first is the PXE NIC).
pub fn inventory(macs: &[&str], cpus: u32, memory_mb: u64, disks_gib: &[u64]) -> serde_json::Value {
    serde_json::json!({
        "inventory": {
            "interfaces": macs.iter().enumerate().map(|(i, m)| serde_json::json!({
                "name": format!("eth{i}"), "mac_address": m,
                "ipv4_address": if i == 0 { serde_json::json!("198.18.0.150") } else { serde_json::Value::Null },
                "has_carrier": true, "speed_mbps": 1000, "driver": "virtio_net"
            })).collect::<Vec<_>>(),
            "cpu": {"model_name": "QEMU Virtual CPU", "count": cpus, "architecture": "x86_64", "flags": ["fpu", "aes"], "socket_count": 1},
            "memory": {"total": memory_mb * 1024 * 1024 - 50_000_000, "physical_mb": memory_mb},
            "disks": disks_gib.iter().enumerate().map(|(i, g)| serde_json::json!({
                "name": format!("/dev/vd{}", (b'a' + i as u8) as char), "size": g << 30, "rotational": true,
                "serial": format!("disk{i}"), "by_path": format!("/dev/disk/by-path/pci-0000:00:0{}.0", 4 + i)
            })).collect::<Vec<_>>(),
            "system_vendor": {"product_name": "Standard PC (i440FX + PIIX, 1996)", "serial_number": "", "manufacturer": "QEMU",
                              "firmware": {"vendor": "SeaBIOS", "version": "1.16.2", "build_date": "04/01/2014"}},
            "boot": {"current_boot_mode": "bios", "pxe_interface": macs[0]},
            "hostname": "localhost"
        },
        "boot_interface": format!("01-{}", macs[0].replace(':', "-")),
        "error": null
    })
}

/// Polls `f` every 200 ms until it holds; fails after 15 s naming what was awaited.
#[track_caller]
/// A log's text without its terminal colour codes (`ESC [ … m`), so that `key=value` reads
/// as written.
pub fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// An appliance (no TFTP) that watches the MDB file `mdb`, polling it every second.
pub fn start_with_mdb_file(link: &Link, scratch: &Scratch, mdb: &Path) -> Appliance {
    let config = base_config(
        link,
        scratch,
        &format!(
            "[tftp]\nenabled = false\n[images]\nmdb_file = \"{}\"\nmdb_poll_secs = 1\n",
            mdb.display()
        ),
    );
    Appliance::start(&link.server, scratch, &config)
}

/// An appliance (TFTP off) that also reads the MDB from a file the test writes.
pub struct MdbLab {
    // Dropped first: the appliance goes before its namespace and scratch directory.
    _app: Appliance,
    pub mdb: PathBuf,
    pub scratch: Scratch,
    pub link: Link,
}

impl MdbLab {
    pub fn start() -> MdbLab {
        require(&["curl", "ip"]);
        let link = Link::new();
        let scratch = Scratch::new(&link.tag);
        let mdb = scratch.path("mdb.json");
        let app = start_with_mdb_file(&link, &scratch, &mdb);
        MdbLab {
            _app: app,
            mdb,
            scratch,
            link,
        }
    }

    /// One call from the server's namespace (curl).
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Resp {
        http(&self.link.server, &self.scratch, method, path, body, &[])
    }

    /// `Mdb.ListMachines`: the MDB's machines and the file's state.
    pub fn machines(&self) -> serde_json::Value {
        self.call("GET", "/rpc/Mdb.ListMachines", None).json()
    }

    /// The MDB's hostnames, sorted.
    pub fn hostnames(&self) -> Vec<String> {
        self.machines()["machines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["machine"]["Hostname"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Replaces a file as an operator's tool should: written beside it, then renamed over it.
pub fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A process killed and reaped when the test ends.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the built `paddock-subd` (`cargo build -p paddock-subd` first) in `ns` on `root`,
/// listening on 127.0.0.2:6969, fast and with no-op triggers; `extra`: more arguments.
/// Returns once it listens.
pub fn start_subd(ns: &Ns, scratch: &Scratch, root: &Path, extra: &str) -> Reap {
    let subd = Path::new(env!("CARGO_BIN_EXE_paddock")).with_file_name("paddock-subd");
    assert!(
        subd.exists(),
        "{} is missing: run `cargo build -p paddock-subd` first",
        subd.display()
    );
    std::fs::create_dir_all(root).expect("the subd root");
    let log = scratch.path("subd.log");
    let child = Reap(ns.spawn(
        &format!(
            "env PADDOCK_LOG=info {} --insecure --root {} --listen 127.0.0.2:6969 \
             --trigger-command /bin/true --reboot-command /bin/true \
             --device-speed 1073741824 --link-speed 1073741824 --min-cycle-ms 100 {extra}",
            subd.display(),
            root.display()
        ),
        &log,
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("paddock-subd: listening on")
    {
        assert!(
            Instant::now() < deadline,
            "subd did not listen: see {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    child
}

/// The real `paddock` CLI run inside `ns` against the appliance at [`PUBLIC_URL`].
pub fn cli(ns: &Ns, args: &str) -> Output {
    ns.sh(&cli_command(args))
}

/// As [`cli`], which must succeed: its standard output.
#[track_caller]
pub fn cli_ok(ns: &Ns, args: &str) -> String {
    ns.sh_ok(&cli_command(args))
}

fn cli_command(args: &str) -> String {
    format!(
        "PADDOCK_API={PUBLIC_URL} {} {args}",
        env!("CARGO_BIN_EXE_paddock")
    )
}

/// The MAC of `iface` in `ns`.
pub fn mac_of(ns: &Ns, iface: &str) -> String {
    ns.sh_ok(&format!("cat /sys/class/net/{iface}/address"))
        .trim()
        .to_string()
}

/// The MAC of the link's client end.
pub fn client_mac(link: &Link) -> String {
    mac_of(&link.client, &link.client_if)
}

/// Creates a node for `mac` through the API (from the server's namespace); returns its UUID.
pub fn create_node(link: &Link, mac: &str) -> String {
    let created = link.server.sh_ok(&format!(
        "curl -sf -X POST -H 'content-type: application/json' -d '{{\"macs\":[\"{mac}\"]}}' {PUBLIC_URL}/api/v1/nodes"
    ));
    serde_json::from_str::<serde_json::Value>(&created).unwrap()["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}
