//! The several-host harness: three appliance hosts, each in its own namespace with its own
//! etcd member (one three-member cluster), joined by veth pairs to the provisioning bridge
//! of a fabric namespace where the VMs' taps are. Host `i` is `198.18.0.1{i+1}`.
//!
//! Hosts can be killed (`SIGKILL`), restarted, and cut off (their veth taken down, so
//! neither VMs nor the other etcd members reach them). A [`Sampler`] reads every host's
//! `pass` chain every 100 ms and remembers the most hosts it ever saw holding a pass rule.
//!
//! TLS throughout: etcd serves clients and peers over TLS and requires client certificates
//! (its own CA, made here with `paddock_security::ca` in `<dir>/etcd-pki`: one certificate per
//! member for its client and peer ports, one client certificate per appliance host and one
//! for the harness's `etcdctl`); every appliance host runs `paddock certs init` before its
//! first start (host 1 creates the appliance's CA in etcd, the others join it) and serves
//! HTTPS on `:8443`; the harness calls them with host 1's admin certificate ([`HaLab::admin`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::{
    Artifacts, Creds, Vm, VmSpec, bridge_namespace, curl_as, keep_or_remove, reap,
    remove_namespace, sh, sh_ok, start_vm, unique_tag,
};

/// The fabric namespace's own address on the bridge, for clients that are not VMs.
pub const CLIENT_IP: &str = "198.18.0.2";

pub struct Host {
    pub name: String,
    pub ns: String,
    pub ip: String,
    pub dir: PathBuf,
    appliance: Option<Child>,
    etcd: Option<Child>,
    starts: u32,
    /// The last octets of this host's DHCP pool (default: its own 30 addresses).
    pub pool: Option<(usize, usize)>,
}

impl Host {
    /// The API's base URL (HTTPS).
    pub fn url(&self) -> String {
        format!("https://{}:8443", self.ip)
    }

    /// The boot path's base URL (plain HTTP: boot scripts, assets, the CA).
    pub fn boot_url(&self) -> String {
        format!("http://{}:8080", self.ip)
    }

    /// Where `paddock certs init` put this host's certificates (and an admin certificate).
    pub fn certs(&self) -> PathBuf {
        self.dir.join("data").join("certs")
    }

    /// The configuration file [`HaLab::start_appliance`] writes.
    pub fn config(&self) -> PathBuf {
        self.dir.join("paddock.toml")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("paddock.{}.log", self.starts)))
            .unwrap_or_default()
    }
}

pub struct HaLab {
    pub net: String,
    pub tag: String,
    pub dir: PathBuf,
    pub hosts: Vec<Host>,
    pub vms: Vec<Vm>,
    artifacts: Artifacts,
    keep: bool,
    /// More configuration for every host (TOML sections, e.g. `[dominator]`).
    pub extra_config: String,
}

fn ip_of(i: usize) -> String {
    format!("198.18.0.{}", 11 + i)
}

/// etcd's own CA and certificates, in `dir`: `ca.pem`; `h<i>.pem`/`.key` for member `i` (its
/// client and peer ports, and as a client of the others: SANs its address and 127.0.0.1);
/// `paddock-h<i>` for appliance host `i`'s etcd client; `etcdctl` for the harness.
fn etcd_pki(dir: &std::path::Path, hosts: usize) -> anyhow::Result<()> {
    use paddock_security::ca;
    std::fs::create_dir_all(dir)?;
    let now = time::OffsetDateTime::now_utc();
    let authority = ca::new_ca("paddock-lab-etcd", now, 30)?;
    std::fs::write(dir.join("ca.pem"), &authority.cert_pem)?;
    let mut names: Vec<(String, Vec<String>)> = (0..hosts)
        .map(|i| {
            (
                format!("h{}", i + 1),
                vec![ip_of(i), "127.0.0.1".to_string()],
            )
        })
        .collect();
    names.extend((0..hosts).map(|i| (format!("paddock-h{}", i + 1), Vec::new())));
    names.push(("etcdctl".to_string(), Vec::new()));
    for (name, sans) in names {
        let issued = ca::issue(
            &authority,
            &ca::Request {
                name: name.clone(),
                methods: Vec::new(),
                groups: Vec::new(),
                sans,
                days: 30,
            },
            now,
        )?;
        std::fs::write(dir.join(format!("{name}.pem")), &issued.cert_pem)?;
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&key, &issued.key_pem)?;
        // The appliance refuses a private key that others may read.
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    }
    Ok(())
}

/// A host holds the pass rule when its `leader` set has a live element (several hosts) or
/// its pass chain has the static accept rule (one host). `None`: no table, or the namespace
/// cannot be read.
pub fn has_pass(ns: &str) -> Option<bool> {
    let out = Command::new("ip")
        .args([
            "netns", "exec", ns, "nft", "-j", "list", "table", "inet", "paddock",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let items = v["nftables"].as_array()?;
    Some(items.iter().any(|i| {
        (i["set"]["name"] == "leader" && i["set"]["elem"].as_array().is_some_and(|e| !e.is_empty()))
            || (i["rule"]["chain"] == "pass"
                && i["rule"]["expr"] == serde_json::json!([{"accept": null}]))
    }))
}

impl HaLab {
    /// Namespaces, bridge, veths and the etcd cluster; appliances are started with
    /// [`HaLab::start_appliance`].
    pub fn start(name: &str, artifacts: &Artifacts, hosts: usize) -> anyhow::Result<HaLab> {
        let tag = unique_tag("pdkh");
        let net = format!("{tag}-{name}");
        let dir = std::env::temp_dir().join(format!("paddock-ha-{net}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        bridge_namespace(&net, CLIENT_IP)?;
        let mut lab = HaLab {
            net,
            tag: tag.clone(),
            dir,
            hosts: Vec::new(),
            vms: Vec::new(),
            artifacts: artifacts.clone(),
            keep: false,
            extra_config: String::new(),
        };
        for i in 0..hosts {
            let ns = format!("{tag}-h{}", i + 1);
            let ip = ip_of(i);
            let hdir = lab.dir.join(format!("h{}", i + 1));
            std::fs::create_dir_all(&hdir)?;
            sh_ok(&format!(
                "ip netns add {ns} && ip -n {ns} link set lo up && \
                 ip -n {net} link add {tag}v{i} type veth peer name eth0 netns {ns} && \
                 ip -n {net} link set {tag}v{i} master br0 up && \
                 ip -n {ns} addr add {ip}/24 dev eth0 && ip -n {ns} link set eth0 up",
                net = lab.net
            ))?;
            lab.hosts.push(Host {
                name: format!("h{}", i + 1),
                ns,
                ip,
                dir: hdir,
                appliance: None,
                etcd: None,
                starts: 0,
                pool: None,
            });
        }
        etcd_pki(&lab.etcd_pki(), hosts)?;
        for i in 0..hosts {
            lab.start_etcd(i)?;
        }
        // Every member healthy and a write committed before any appliance starts.
        let endpoints: Vec<String> = lab
            .hosts
            .iter()
            .map(|h| format!("https://{}:2379", h.ip))
            .collect();
        let pki = lab.etcd_pki();
        let etcdctl = format!(
            "env ETCDCTL_API=3 etcdctl --endpoints {} --cacert {} --cert {} --key {}",
            endpoints.join(","),
            pki.join("ca.pem").display(),
            pki.join("etcdctl.pem").display(),
            pki.join("etcdctl.key").display()
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = sh(&format!(
                "ip netns exec {ns} {etcdctl} endpoint health && \
                 ip netns exec {ns} {etcdctl} put lab/ready 1",
                ns = lab.hosts[0].ns,
            ))?
            .status
            .success();
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!("the etcd cluster did not become healthy");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(lab)
    }

    /// etcd's CA and certificates (see [`etcd_pki`]).
    pub fn etcd_pki(&self) -> PathBuf {
        self.dir.join("etcd-pki")
    }

    /// The harness's credentials for every host's API: host 1's admin certificate (every
    /// host shares the CA).
    pub fn admin(&self) -> Creds {
        Creds::cert_in(&self.hosts[0].certs(), "admin")
    }

    fn cluster_spec(&self) -> String {
        (0..self.hosts.len())
            .map(|i| format!("h{}=https://{}:2380", i + 1, ip_of(i)))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn start_etcd(&mut self, i: usize) -> anyhow::Result<()> {
        let cluster = self.cluster_spec();
        let pki = self.etcd_pki();
        let h = &mut self.hosts[i];
        let (ca, cert, key) = (
            pki.join("ca.pem"),
            pki.join(format!("{}.pem", h.name)),
            pki.join(format!("{}.key", h.name)),
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(h.dir.join("etcd.log"))?;
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &h.ns,
                "etcd",
                "--name",
                &h.name,
                "--data-dir",
            ])
            .arg(h.dir.join("etcd"))
            // Clients and peers over TLS, each side with a certificate from etcd's CA.
            .arg("--cert-file")
            .arg(&cert)
            .arg("--key-file")
            .arg(&key)
            .arg("--trusted-ca-file")
            .arg(&ca)
            .arg("--client-cert-auth")
            .arg("--peer-cert-file")
            .arg(&cert)
            .arg("--peer-key-file")
            .arg(&key)
            .arg("--peer-trusted-ca-file")
            .arg(&ca)
            .arg("--peer-client-cert-auth")
            .args([
                "--listen-client-urls",
                &format!("https://{}:2379", h.ip),
                "--advertise-client-urls",
                &format!("https://{}:2379", h.ip),
                "--listen-peer-urls",
                &format!("https://{}:2380", h.ip),
                "--initial-advertise-peer-urls",
                &format!("https://{}:2380", h.ip),
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &self.tag,
                "--log-level",
                "warn",
                // A member coming back from a partition must not force an election.
                "--pre-vote=true",
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting etcd (apt-get install etcd-server)")?;
        h.etcd = Some(child);
        Ok(())
    }

    /// Writes host `i`'s configuration and starts `paddock serve` there (again, after a
    /// kill); returns when its API answers. Before its first start the host runs `paddock
    /// certs init` (the first host to do so creates the CA in etcd, the others join it).
    pub fn start_appliance(&mut self, i: usize) -> anyhow::Result<()> {
        let endpoints: Vec<String> = std::iter::once(i)
            .chain((0..self.hosts.len()).filter(|j| *j != i))
            .map(|j| format!("\"https://{}:2379\"", ip_of(j)))
            .collect();
        let pki = self.etcd_pki();
        let peers: Vec<String> = (0..self.hosts.len())
            .map(|j| format!("\"http://{}:8080\"", ip_of(j)))
            .collect();
        let a = &self.artifacts;
        let h = &mut self.hosts[i];
        let (lo, hi) = h.pool.unwrap_or((100 + 30 * i, 129 + 30 * i));
        let extra = format!(
            r#"[firewall]
enabled = true
interface = "eth0"
reconcile_secs = 2
[cluster]
store = "etcd"
etcd_endpoints = [{endpoints}]
etcd_ca_file = "{pki}/ca.pem"
etcd_cert_file = "{pki}/paddock-{name}.pem"
etcd_key_file = "{pki}/paddock-{name}.key"
host = "{name}"
lease_ttl_secs = 3
peers = [{peers}]
"#,
            pki = pki.display(),
            name = h.name,
            endpoints = endpoints.join(", "),
            peers = peers.join(", "),
        ) + &self.extra_config;
        let config = crate::appliance_config(
            &h.dir.join("data"),
            a,
            &crate::ApplianceSite {
                ip: &h.ip,
                iface: "eth0",
                pool: (lo, hi),
                cmdline: "console=ttyS0",
            },
            &extra,
        );
        let path = h.config();
        std::fs::write(&path, config)?;
        if !h.certs().join("host.pem").exists() {
            let out = crate::certs(&h.ns, &a.paddock, &path, "init")?;
            std::fs::write(h.dir.join("certs-init.log"), out)?;
        }
        h.starts += 1;
        let log = std::fs::File::create(h.dir.join(format!("paddock.{}.log", h.starts)))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &h.ns])
            .arg(&a.paddock)
            .env_remove("PADDOCK_INSECURE")
            .args(["serve", "--config"])
            .arg(&path)
            .env("PADDOCK_LOG", "info,paddock=debug")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting paddock")?;
        h.appliance = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.api(i, "GET", "/healthz", None).map(|(s, _)| s).ok() != Some(200) {
            if let Some(c) = self.hosts[i].appliance.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.hosts[i].appliance = None;
                bail!(
                    "paddock on {} exited with {status}:\n{}",
                    self.hosts[i].name,
                    self.hosts[i].log()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "paddock on {} did not start:\n{}",
                    self.hosts[i].name,
                    self.hosts[i].log()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// SIGKILL: the appliance gets no chance to remove its pass rule or resign.
    pub fn kill_appliance(&mut self, i: usize) {
        if let Some(mut c) = self.hosts[i].appliance.take() {
            reap(&mut c);
        }
    }

    /// The appliance's process id on host `i` (to kill it from another thread).
    pub fn appliance_pid(&self, i: usize) -> Option<u32> {
        self.hosts[i].appliance.as_ref().map(|c| c.id())
    }

    /// SIGTERM and wait (graceful: the host closes its filter and resigns).
    pub fn stop_appliance(&mut self, i: usize) {
        if let Some(mut c) = self.hosts[i].appliance.take() {
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

    /// Cuts host `i` off the provisioning network (and so from the other etcd members), or
    /// reconnects it.
    pub fn partition(&self, i: usize, cut: bool) -> anyhow::Result<()> {
        sh_ok(&format!(
            "ip -n {} link set {}v{i} {}",
            self.net,
            self.tag,
            if cut { "down" } else { "up" }
        ))?;
        Ok(())
    }

    /// Which hosts hold a pass rule now.
    pub fn pass_rules(&self) -> Vec<bool> {
        self.hosts
            .iter()
            .map(|h| has_pass(&h.ns).unwrap_or(false))
            .collect()
    }

    /// The one host holding the pass rule; waits up to `timeout` for exactly one.
    pub fn wait_leader(&self, timeout: Duration, not: Option<usize>) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.pass_rules();
            let holders: Vec<usize> = (0..p.len()).filter(|i| p[*i]).collect();
            if holders.len() == 1 && Some(holders[0]) != not {
                return Ok(holders[0]);
            }
            if Instant::now() > deadline {
                bail!("no single leader within {timeout:?}: pass rules {p:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Calls host `i`'s API from inside its namespace (HTTPS, as [`HaLab::admin`]):
    /// (status, body).
    pub fn api(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        let h = &self.hosts[i];
        curl_as(
            &h.ns,
            &self.admin(),
            method,
            &format!("{}{path}", h.url()),
            body,
            5,
        )
    }

    /// The API of the first host that answers (any host serves the whole API).
    pub fn api_json_any(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<Value> {
        let mut last = String::new();
        for i in 0..self.hosts.len() {
            if self.hosts[i].appliance.is_none() {
                continue;
            }
            match self.api(i, method, path, body) {
                Ok((s, text)) if (200..300).contains(&s) => {
                    return Ok(serde_json::from_str(&text)?);
                }
                Ok((s, text)) => last = format!("{s} {text}"),
                Err(e) => last = e.to_string(),
            }
        }
        bail!("{method} {path}: no host answered: {last}")
    }

    /// An HTTP request from the fabric (a client on the provisioning network, like a
    /// ramdisk agent) with `creds`: (status, body); status 0 when the host could not be
    /// reached.
    pub fn client(
        &self,
        creds: &Creds,
        url: &str,
        method: &str,
        body: Option<&str>,
    ) -> (u16, String) {
        curl_as(&self.net, creds, method, url, body, 5).unwrap_or((0, String::new()))
    }

    /// Powers a VM on, on the provisioning bridge.
    pub fn boot(&mut self, spec: VmSpec) -> anyhow::Result<usize> {
        let idx = self.vms.len();
        let site = crate::VmSite {
            ns: &self.net,
            tag: &self.tag,
            dir: &self.dir,
            artifacts: &self.artifacts,
        };
        let vm = start_vm(&site, idx, spec, 0)?;
        self.vms.push(vm);
        Ok(idx)
    }

    /// Starts sampling every host's pass chain every 100 ms.
    pub fn sampler(&self) -> Sampler {
        let namespaces: Vec<String> = self.hosts.iter().map(|h| h.ns.clone()).collect();
        let (stop, max, samples, doubles) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let s = (stop.clone(), max.clone(), samples.clone(), doubles.clone());
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                let tick = Instant::now();
                let holders: Vec<usize> = namespaces
                    .iter()
                    .enumerate()
                    .filter(|(_, ns)| has_pass(ns) == Some(true))
                    .map(|(i, _)| i)
                    .collect();
                max.fetch_max(holders.len(), Ordering::SeqCst);
                samples.fetch_add(1, Ordering::SeqCst);
                if holders.len() > 1 {
                    doubles
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((start.elapsed(), holders));
                }
                std::thread::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed()));
            }
        });
        Sampler {
            stop: s.0,
            max: s.1,
            samples: s.2,
            doubles: s.3,
            thread: Some(t),
        }
    }

    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Every host's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for h in &self.hosts {
            let log = h.log();
            let tail = &log[log.len().saturating_sub(4000)..];
            s.push_str(&format!("--- {} ({}) ---\n{}\n", h.name, h.ip, tail));
        }
        s
    }
}

impl Drop for HaLab {
    fn drop(&mut self) {
        for vm in &mut self.vms {
            reap(&mut vm.child);
        }
        for h in &mut self.hosts {
            for mut c in [h.appliance.take(), h.etcd.take()].into_iter().flatten() {
                reap(&mut c);
            }
            remove_namespace(&h.ns);
        }
        remove_namespace(&self.net);
        keep_or_remove("HA lab", &self.dir, self.keep);
    }
}

/// When (since the sampler started) two or more hosts held a pass rule, and which.
pub type Doubles = Vec<(Duration, Vec<usize>)>;

/// Reads every host's pass chain every 100 ms until dropped or stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    samples: Arc<AtomicUsize>,
    doubles: Arc<Mutex<Doubles>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Stops and returns (samples taken, most hosts ever holding a pass rule at once,
    /// the moments two or more did).
    pub fn finish(mut self) -> (usize, usize, Doubles) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let doubles = self
            .doubles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (
            self.samples.load(Ordering::SeqCst),
            self.max.load(Ordering::SeqCst),
            doubles,
        )
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
