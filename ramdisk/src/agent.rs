//! The agent's shell: everything that touches the machine (mounts, modules, links, DHCP,
//! sockets, reboot). The decisions live in the pure modules (`cmdline`, `collect`, `api`,
//! `lldp`); this file strings them together and never lets PID 1 exit.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::kmod::{ModuleInitFlags, finit_module};
use nix::mount::{MsFlags, mount};
use nix::sys::reboot::{RebootMode, reboot};
use nix::sys::socket::{
    AddressFamily, LinkAddr, SockFlag, SockProtocol, SockType, recvfrom, setsockopt, socket,
    sockopt,
};
use nix::sys::time::TimeVal;
use paddock_inventory::{IntrospectionData, MacAddr};
use serde_json::{Value, json};

use crate::api::{self, Action, Event};
use crate::busybox::busybox;
use crate::cmdline::{self, Cmdline, LogLevel};
use crate::collect::{self, Collected, Context};
use crate::console::Console;
use crate::http::{Client, Url, UrlError};
use crate::lldp;
use crate::provision::client as provision_api;
use crate::provision::shell::{self as provision_shell, Finish};
use crate::trust::{self, TrustError};
use paddock_birther::Operation;

pub const MODULE_LIST: &str = "/etc/paddock/modules";
pub const UDHCPC_SCRIPT: &str = "/etc/paddock/udhcpc.script";
pub use crate::provision::shell::BUSYBOX;
const NIC_WAIT: Duration = Duration::from_secs(20);
/// One DHCPv6 attempt on a NIC (about udhcpc's 10 tries of 2 s).
const DHCP6_WAIT: Duration = Duration::from_secs(20);
const WAIT_POLL: Duration = Duration::from_secs(10);

/// Why the agent stopped (the console and the `error` event say it).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot read /proc/cmdline: {0}")]
    Cmdline(#[source] std::io::Error),
    #[error("no paddock.url= on the kernel command line; the boot script must set it")]
    NoUrl,
    #[error("paddock.url: {0}")]
    Url(#[from] UrlError),
    #[error("paddock.url= is empty")]
    EmptyUrl,
    #[error(
        "no network interface with MAC {mac} (BOOTIF) appeared within {secs} s (seen: [{seen}]); is its driver in the ramdisk (paddock-ramdisk-build --modules)?"
    )]
    NoBootNic {
        mac: String,
        secs: u64,
        seen: String,
    },
    #[error("no network interface appeared within {secs} s and BOOTIF is not set")]
    NoNic { secs: u64 },
    #[error("no network")]
    NoNetwork,
    #[error(transparent)]
    Continue(#[from] api::ContinueError),
    #[error("reboot(2) for {step} failed: {errno}")]
    Reboot { step: &'static str, errno: Errno },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("{0}")]
    Provision(String),
    #[error(transparent)]
    Trust(#[from] TrustError),
}

#[derive(Debug, thiserror::Error)]
#[error("cannot mount {fstype} on {target}: {errno}")]
pub struct MountError {
    fstype: &'static str,
    target: &'static str,
    errno: Errno,
}

/// A kernel module that did not load.
#[derive(Debug, thiserror::Error)]
enum ModuleError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Load(Errno),
}

/// Why the LLDP collector heard nothing.
#[derive(Debug, thiserror::Error)]
pub enum LldpError {
    #[error("AF_PACKET socket: {0}")]
    Socket(Errno),
    #[error("SO_RCVTIMEO: {0}")]
    Timeout(Errno),
    #[error("recvfrom: {0}")]
    Recv(Errno),
}

/// Assembles the `/v1/continue` body (pure): the inventory, IPA's root disk guess, the boot
/// interface, the collectors asked for, and every problem in `error`.
pub fn introspection_data(
    cmd: &Cmdline,
    collected: Collected,
    boot_mac: Option<&str>,
    mut problems: Vec<String>,
    pci_devices: Option<Value>,
) -> IntrospectionData {
    let mut errors = cmd.errors.clone();
    errors.extend(collected.errors);
    errors.append(&mut problems);
    let mut extra = serde_json::Map::new();
    extra.insert(
        "configuration".into(),
        json!({ "collectors": cmd.collectors }),
    );
    if let Some(p) = pci_devices {
        extra.insert("pci_devices".into(), p);
    }
    IntrospectionData {
        root_disk: collect::root_disk(&collected.inventory.disks),
        inventory: Some(collected.inventory),
        boot_interface: cmd
            .bootif_raw
            .clone()
            .or_else(|| boot_mac.map(|m| format!("01-{}", m.replace(':', "-")))),
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        logs: None,
        extra,
    }
}

/// Runs the agent. Never returns: the machine is powered off or rebooted, or the agent waits
/// with its last message on the console.
pub fn run(console: &Console) -> ! {
    let mut a = Agent {
        console,
        cmd: cmdline::parse(""),
        client: None,
        mac: String::new(),
        pending: Vec::new(),
    };
    let reason = match a.steps() {
        Ok(never) => match never {},
        Err(reason) => reason.to_string(),
    };
    a.halt(&reason)
}

struct Agent<'a> {
    console: &'a Console,
    cmd: Cmdline,
    client: Option<Client>,
    /// The boot MAC, for events.
    mac: String,
    /// Events from before the network was up.
    pending: Vec<Event>,
}

enum Never {}

impl Agent<'_> {
    fn say(&self, msg: &str) {
        self.console.say(msg);
    }

    /// Console line plus a best-effort event (queued until the network is up).
    fn step(&mut self, step: &str, level: &str, message: &str) {
        self.say(&format!("{step}: {message}"));
        let ev = Event {
            mac: self.mac.clone(),
            step: step.into(),
            message: message.into(),
            level: level.into(),
        };
        match self.client.as_mut() {
            None => self.pending.push(ev),
            Some(c) => {
                if let Err(e) = api::report(c, &ev) {
                    self.console
                        .debug(&format!("(event {step} not reported: {e})"));
                }
            }
        }
    }

    fn flush_events(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for mut ev in pending {
            if ev.mac.is_empty() {
                ev.mac = self.mac.clone();
            }
            if let Some(c) = self.client.as_mut()
                && let Err(e) = api::report(c, &ev)
            {
                self.console
                    .debug(&format!("(event {} not reported: {e})", ev.step));
            }
        }
    }

    fn halt(&mut self, reason: &str) -> ! {
        self.step("error", "error", reason);
        self.say("stopped; this machine needs attention (the message above says why). Power-cycle it to retry.");
        let mut n = 0u64;
        loop {
            std::thread::sleep(Duration::from_secs(60));
            n += 1;
            if n.is_multiple_of(5) {
                self.say(&format!("still stopped: {reason}"));
            }
        }
    }

    fn steps(&mut self) -> Result<Never, AgentError> {
        self.say("starting");
        mount_all(self.console)?;
        let line = std::fs::read_to_string("/proc/cmdline").map_err(AgentError::Cmdline)?;
        self.cmd = cmdline::parse(&line);
        self.console.set_debug(self.cmd.log == LogLevel::Debug);
        self.console.debug(&format!(
            "kernel command line: {}",
            cmdline::redacted(line.trim())
        ));
        for w in self.cmd.warnings.clone() {
            self.say(&format!("warning: {w}"));
        }
        for e in self.cmd.errors.clone() {
            self.say(&format!("error (will be reported): {e}"));
        }
        if let Some(m) = &self.cmd.boot_mac {
            self.mac = m.clone();
        }
        let url_s = self.cmd.url.clone().ok_or(AgentError::NoUrl)?;
        // Several appliance hosts: `paddock.url=http://a:8080,http://b:8080`.
        let urls = url_s
            .split(',')
            .filter(|u| !u.trim().is_empty())
            .map(|u| Url::parse(u.trim().trim_end_matches('/')))
            .collect::<Result<Vec<_>, _>>()?;
        let url = urls.first().cloned().ok_or(AgentError::EmptyUrl)?;

        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let modules_msg = self.load_modules();
        let mut problems = Vec::new();
        self.step(
            "booted",
            "info",
            &format!(
                "paddock-agent {} on Linux {}; {modules_msg}",
                env!("CARGO_PKG_VERSION"),
                kernel.trim()
            ),
        );

        // An appliance URL with an IPv6 literal means an IPv6 provisioning network.
        let (ifname, ip) = self.network(url.host.parse::<std::net::Ipv6Addr>().is_ok())?;
        let tls = self.appliance_tls(&urls)?;
        let secured = tls.is_some();
        self.client = Client::with_tls(urls, Duration::from_secs(5), Duration::from_secs(30), tls)
            .map(|c| c.with_token(self.cmd.token.clone()));
        self.flush_events();
        self.step(
            "network-up",
            "info",
            &format!(
                "{ifname} has {ip} (boot MAC {}); appliance {url}{}{}",
                self.mac,
                if secured {
                    " (TLS, its CA checked against the pinned fingerprint)"
                } else {
                    ""
                },
                if self.cmd.token.is_some() {
                    ", with an agent token"
                } else {
                    ""
                }
            ),
        );

        let mut ctx = Context {
            boot_mac: Some(self.mac.clone()),
            ipv4: ipv4_addresses(),
            ipv6: ipv6_addresses_of(&ifname),
            lldp: BTreeMap::new(),
            architecture: std::env::consts::ARCH.to_string(),
        };
        if self.cmd.lldp {
            match self.listen_lldp() {
                Ok(l) => ctx.lldp = l,
                Err(e) => problems.push(format!("lldp collector: {e}")),
            }
        }
        let collected = collect::collect(Path::new("/"), &ctx);
        let pci = if self.cmd.wants("pci-devices") {
            match collect::pci::collect(Path::new("/")) {
                Ok(v) => Some(v),
                Err(e) => {
                    problems.push(format!("pci-devices collector: {e}"));
                    None
                }
            }
        } else {
            None
        };
        let inv = &collected.inventory;
        let summary = format!(
            "{} CPUs, {} MiB, {} disk(s) [{}], {} NIC(s) [{}], boot mode {}",
            inv.cpu.as_ref().and_then(|c| c.count).unwrap_or(0),
            inv.memory.as_ref().and_then(|m| m.physical_mb).unwrap_or(0),
            inv.disks.len(),
            inv.disks
                .iter()
                .map(|d| format!("{} {} B", d.name, d.size))
                .collect::<Vec<_>>()
                .join(", "),
            inv.interfaces.len(),
            inv.interfaces
                .iter()
                .map(|i| format!("{} {}", i.name, i.mac_address.as_deref().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", "),
            inv.boot
                .as_ref()
                .map(|b| b.current_boot_mode.as_str())
                .unwrap_or("?"),
        );
        let inventory = collected.inventory.clone();
        let mut macs: Vec<String> = inventory
            .interfaces
            .iter()
            .filter_map(|i| i.mac_address.clone())
            .collect();
        if !self.mac.is_empty() && !macs.contains(&self.mac) {
            macs.insert(0, self.mac.clone());
        }
        if let Some(url) = self.cmd.bench_tar.clone() {
            // bench/provision.sh's baseline: no inspection, no report; powers off either way.
            if let Err(e) = provision_shell::baseline(self.console, &inventory, &url) {
                self.say(&format!("baseline: failed: {e}"));
            }
            let errno = provision_shell::finish(Finish::PowerOff);
            return Err(AgentError::Reboot {
                step: "poweroff",
                errno,
            });
        }
        if let Some(mode) = self.cmd.mode {
            // The boot script of a node in birth, rebirth or clean: no inspection.
            self.step("inventory-collected", "info", &summary);
            return self.provision(Some(mode), None, inventory, &ip, &macs);
        }
        let data = introspection_data(&self.cmd, collected, Some(&self.mac), problems, pci);
        match &data.error {
            None => self.step("inventory-collected", "info", &summary),
            Some(e) => self.step(
                "inventory-collected",
                "error",
                &format!("{summary}; problems: {e}"),
            ),
        }
        if self.console.is_debug() {
            self.console
                .debug(&serde_json::to_string(&data).unwrap_or_default());
        }

        let uuid = self.post(&data)?;
        self.step("inventory-posted", "info", &format!("node {uuid}"));
        if let Some(e) = &data.error {
            self.say(&format!("the appliance was told about: {e}"));
        }
        // One boot: a node that has an image by the end of its inspection is installed now.
        self.provision(None, Some(&uuid), inventory, &ip, &macs)
    }

    /// With an `https://` appliance URL: fetches the CA from `paddock.ca_url` (plain HTTP,
    /// retried until it answers), checks it against `paddock.ca_fingerprint` and makes the TLS
    /// configuration that trusts only it. A missing pin or a CA that does not match stops the
    /// agent (never a fallback to an unverified connection). `None`: plain HTTP, as before.
    fn appliance_tls(&mut self, urls: &[Url]) -> Result<Option<ureq::tls::TlsConfig>, AgentError> {
        if !trust::needs_tls(urls) {
            return Ok(None);
        }
        // Every host's copy, tried in turn: the boot script's host may be gone (HA).
        let (ca_urls, want) = trust::pinned(&self.cmd)?;
        let shown = ca_urls
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        self.say(&format!(
            "fetching the appliance's CA from {shown} (pinned SHA-256 {want})"
        ));
        let console = self.console;
        let first = ca_urls.first().cloned().ok_or(AgentError::NoNetwork)?;
        let mut fetcher =
            Client::with_hosts(ca_urls, Duration::from_secs(5), Duration::from_secs(30))
                .ok_or(AgentError::NoNetwork)?;
        let tls = trust::fetch(&mut fetcher, &first, &want, 0, &mut |d, why| {
            console.say(&format!(
                "cannot fetch the appliance's CA ({why}); trying again in {} s",
                d.as_secs()
            ));
            std::thread::sleep(d);
        })?;
        self.say("the appliance's CA matches the pinned fingerprint");
        Ok(Some(tls))
    }

    /// Asks the appliance what to provision and runs it; with nothing to do, follows the
    /// inspection's next action. `wanted`: the mode the boot script gave (the appliance is
    /// then asked until it answers); `None`: the one-boot path after an inspection (one try:
    /// an appliance without provisioning goes on as before).
    fn provision(
        &mut self,
        wanted: Option<Operation>,
        uuid: Option<&str>,
        inventory: paddock_inventory::Inventory,
        ip: &str,
        macs: &[String],
    ) -> Result<Never, AgentError> {
        let console = self.console;
        let client = self.client.as_mut().ok_or(AgentError::NoNetwork)?;
        let tries = if wanted.is_some() { 0 } else { 1 };
        let answer = provision_api::next(client, macs, tries, &mut |d, why| {
            console.say(&format!(
                "cannot ask what to provision ({why}); asking again in {} s",
                d.as_secs()
            ));
            std::thread::sleep(d);
        });
        let assignment = match answer {
            Ok(a) => a,
            Err(e) if wanted.is_some() => return Err(AgentError::Provision(e.to_string())),
            Err(e) => {
                self.say(&format!("no provisioning ({e})"));
                let uuid = uuid.ok_or(AgentError::NoNetwork)?;
                return self.follow(uuid);
            }
        };
        let Some(mode) = assignment.mode else {
            if wanted.is_some() {
                self.say("booted to provision, but the appliance has nothing to do for this node");
            }
            return match uuid.map(str::to_string).or(assignment.node) {
                Some(node) => self.follow(&node),
                None => Err(AgentError::Provision(
                    "booted to provision, but the appliance knows no node with this machine's MACs"
                        .into(),
                )),
            };
        };
        if let Some(w) = wanted
            && w != mode
        {
            self.say(&format!(
                "booted for {}, but the appliance now says {}; doing that",
                w.as_str(),
                mode.as_str()
            ));
        }
        self.step(
            "provision",
            "info",
            &format!(
                "{} of node {} with image {}",
                mode.as_str(),
                assignment.node.as_deref().unwrap_or("?"),
                assignment.image.as_deref().unwrap_or("-")
            ),
        );
        let result = {
            let client = self.client.as_mut().ok_or(AgentError::NoNetwork)?;
            provision_shell::Run::new(console, client, assignment, inventory, ip.to_string())
                .execute()
        };
        match result {
            Ok(how) => {
                let step = match how {
                    Finish::Reboot => "reboot",
                    Finish::PowerOff => "poweroff",
                };
                self.step(step, "info", &format!("{} done; {step}", mode.as_str()));
                let errno = provision_shell::finish(how);
                Err(AgentError::Reboot { step, errno })
            }
            Err(e) => Err(AgentError::Provision(format!(
                "{} stopped: {e}",
                mode.as_str()
            ))),
        }
    }

    /// Loads the modules the builder listed, dependencies first. A module that does not load
    /// is not fatal (the machine may not have that hardware); the console and the `booted`
    /// event say so.
    fn load_modules(&mut self) -> String {
        let list = match std::fs::read_to_string(MODULE_LIST) {
            Ok(l) => l,
            Err(e) => return format!("no module list ({MODULE_LIST}: {e})"),
        };
        let (mut loaded, mut already, mut failed) = (0, 0, Vec::new());
        for path in list
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let name = path.rsplit('/').next().unwrap_or(path);
            let res = match File::open(path) {
                Err(source) => Err(ModuleError::Open {
                    path: path.to_string(),
                    source,
                }),
                Ok(f) => match finit_module(&f, c"", ModuleInitFlags::empty()) {
                    Ok(()) => Ok(true),
                    Err(Errno::EEXIST) => Ok(false),
                    Err(e) => Err(ModuleError::Load(e)),
                },
            };
            match res {
                Ok(true) => {
                    loaded += 1;
                    self.console.debug(&format!("loaded {name}"));
                }
                Ok(false) => already += 1,
                Err(e) => {
                    self.say(&format!("warning: module {name}: {e}"));
                    failed.push(format!("{name}: {e}"));
                }
            }
        }
        let mut msg = format!("{loaded} modules loaded, {already} already present");
        if !failed.is_empty() {
            msg.push_str(&format!(", failed: {}", failed.join(", ")));
        }
        msg
    }

    /// Finds the boot NIC, brings it up and runs DHCP on it until it has an address: DHCPv6
    /// when the appliance is reached at an IPv6 address (`ipv6`), else DHCPv4.
    fn network(&mut self, ipv6: bool) -> Result<(String, String), AgentError> {
        let _ = busybox(&["ip", "link", "set", "dev", "lo", "up"]);
        let root = Path::new("/");
        let deadline = Instant::now() + NIC_WAIT;
        let candidates: Vec<(String, String)> = loop {
            let found: Vec<(String, String)> = match &self.cmd.boot_mac {
                Some(mac) => collect::net::find_by_mac(root, mac)
                    .map(|n| vec![(n, mac.clone())])
                    .unwrap_or_default(),
                None => collect::net::physical(root),
            };
            if !found.is_empty() {
                break found;
            }
            if Instant::now() >= deadline {
                let seen = collect::net::physical(root)
                    .iter()
                    .map(|(n, m)| format!("{n}={m}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let secs = NIC_WAIT.as_secs();
                return Err(match &self.cmd.boot_mac {
                    Some(mac) => AgentError::NoBootNic {
                        mac: mac.clone(),
                        secs,
                        seen,
                    },
                    None => AgentError::NoNic { secs },
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        let mut backoff = api::ipa_backoff();
        let mut round = 0u32;
        loop {
            for (ifname, mac) in &candidates {
                self.say(&format!(
                    "{} on {ifname} ({mac})",
                    if ipv6 { "DHCPv6" } else { "DHCP" }
                ));
                if let Err(e) = busybox(&["ip", "link", "set", "dev", ifname, "up"]) {
                    self.say(&format!("warning: cannot bring {ifname} up: {e}"));
                }
                if ipv6 {
                    let Ok(hw) = mac.parse::<MacAddr>() else {
                        self.say(&format!("{ifname}: cannot read its MAC {mac:?}"));
                        continue;
                    };
                    let console = self.console;
                    let mut say = |m: &str| console.say(m);
                    match crate::dhcp6::lease(ifname, hw, DHCP6_WAIT, &mut say) {
                        Ok(b) => {
                            if self.mac.is_empty() {
                                self.mac = mac.to_ascii_lowercase();
                            }
                            return Ok((ifname.clone(), b.address.to_string()));
                        }
                        Err(e) => self.say(&format!("no DHCPv6 lease on {ifname}: {e}")),
                    }
                    continue;
                }
                match busybox(&[
                    "udhcpc",
                    "-i",
                    ifname,
                    "-n",
                    "-q",
                    "-t",
                    "10",
                    "-T",
                    "2",
                    "-s",
                    UDHCPC_SCRIPT,
                ]) {
                    Ok(()) => {
                        if let Some(ip) = ipv4_addresses().get(ifname.as_str()) {
                            if self.mac.is_empty() {
                                self.mac = mac.to_ascii_lowercase();
                            }
                            return Ok((ifname.clone(), ip.clone()));
                        }
                        self.say(&format!(
                            "udhcpc succeeded but {ifname} has no IPv4 address"
                        ));
                    }
                    Err(e) => self.say(&format!("no DHCP lease on {ifname}: {e}")),
                }
            }
            round += 1;
            self.wait_to_retry(
                &mut backoff,
                &format!("no address yet (round {round}); trying again"),
            );
        }
    }

    fn post(&mut self, data: &IntrospectionData) -> Result<String, AgentError> {
        let console = self.console;
        let mut round = 0u32;
        loop {
            let client = self.client.as_mut().ok_or(AgentError::NoNetwork)?;
            self.console.say(&format!(
                "posting the inventory to {}/v1/continue",
                client.url
            ));
            let res = api::post_continue(
                client,
                data,
                api::CONTINUE_TRIES,
                &mut api::ipa_backoff(),
                &mut |d, why| {
                    console.say(&format!(
                        "post failed ({why}); retrying in {} s",
                        d.as_secs()
                    ));
                },
            );
            match res {
                Ok(uuid) => return Ok(uuid),
                Err(e @ api::ContinueError::GaveUp { .. }) => {
                    round += 1;
                    // IPA stops here; an appliance that is restarting should not strand the
                    // machine, so start another round after a minute.
                    self.step(
                        "error",
                        "error",
                        &format!("{e}; next round in 60 s (round {round})"),
                    );
                    std::thread::sleep(Duration::from_secs(60));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Says what is retried and after how long (`… in N s`), then waits that long.
    fn wait_to_retry(&mut self, backoff: &mut paddock_clock::Backoff, what: &str) {
        let pause = backoff.next_delay();
        self.say(&format!("{what} in {} s", pause.as_secs()));
        std::thread::sleep(pause);
    }

    /// Asks what to do next until told to power off or reboot.
    fn follow(&mut self, uuid: &str) -> Result<Never, AgentError> {
        let mut backoff = api::ipa_backoff();
        let mut waits = 0u32;
        loop {
            let client = self.client.as_mut().ok_or(AgentError::NoNetwork)?;
            match api::next_action(client, uuid) {
                Ok(Action::Wait) => {
                    backoff.reset();
                    if waits.is_multiple_of(6) {
                        self.say(&format!(
                            "the appliance says wait; asking again every {} s",
                            WAIT_POLL.as_secs()
                        ));
                    }
                    waits += 1;
                    std::thread::sleep(WAIT_POLL);
                }
                Ok(action @ (Action::Poweroff | Action::Reboot)) => {
                    let (step, mode) = match action {
                        Action::Reboot => ("reboot", RebootMode::RB_AUTOBOOT),
                        _ => ("poweroff", RebootMode::RB_POWER_OFF),
                    };
                    self.step(step, "info", &format!("the appliance says {step}"));
                    nix::unistd::sync();
                    let Err(errno) = reboot(mode);
                    return Err(AgentError::Reboot { step, errno });
                }
                Err(e) => self.wait_to_retry(
                    &mut backoff,
                    &format!("cannot learn the next action ({e}); asking again"),
                ),
            }
        }
    }

    /// Listens on every NIC for one LLDP frame each, for at most `paddock.lldp_timeout`.
    fn listen_lldp(&mut self) -> Result<BTreeMap<String, Vec<(u8, String)>>, LldpError> {
        let nics = collect::net::physical(Path::new("/"));
        let mut by_index = BTreeMap::new();
        for (n, _) in &nics {
            if let Some(i) = collect::net::index_of(Path::new("/"), n) {
                by_index.insert(i, n.clone());
            }
            // LLDP goes to a link-local multicast address NICs filter out: listen promiscuously.
            let _ = busybox(&["ip", "link", "set", "dev", n, "up", "promisc", "on"]);
        }
        self.say(&format!(
            "listening for LLDP on {} NIC(s) for up to {} s",
            by_index.len(),
            self.cmd.lldp_timeout.as_secs()
        ));
        let result = (|| {
            let fd = socket(
                AddressFamily::Packet,
                SockType::Raw,
                SockFlag::empty(),
                SockProtocol::EthAll,
            )
            .map_err(LldpError::Socket)?;
            setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(1, 0))
                .map_err(LldpError::Timeout)?;
            let deadline = Instant::now() + self.cmd.lldp_timeout;
            let mut heard = BTreeMap::new();
            let mut buf = vec![0u8; 9216];
            while Instant::now() < deadline && heard.len() < by_index.len() {
                match recvfrom::<LinkAddr>(fd.as_raw_fd(), &mut buf) {
                    Ok((n, Some(addr))) => {
                        let index = u32::try_from(addr.ifindex()).ok();
                        let Some(name) = index.and_then(|i| by_index.get(&i)) else {
                            continue;
                        };
                        if heard.contains_key(name) {
                            continue;
                        }
                        if let Ok(tlvs) = lldp::parse_frame(&buf[..n]) {
                            self.console
                                .debug(&format!("LLDP on {name}: {} TLVs", tlvs.len()));
                            heard.insert(name.clone(), tlvs);
                        }
                    }
                    Ok((_, None)) => {}
                    Err(Errno::EAGAIN | Errno::EINTR) => {}
                    Err(e) => return Err(LldpError::Recv(e)),
                }
            }
            Ok(heard)
        })();
        for (n, _) in &nics {
            let _ = busybox(&["ip", "link", "set", "dev", n, "promisc", "off"]);
        }
        result
    }
}

/// Interface → first IPv4 address.
fn ipv4_addresses() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                out.entry(a.interface_name.clone())
                    .or_insert_with(|| sin.ip().to_string());
            }
        }
    }
    out
}

/// [`ipv6_addresses`], once the boot interface `ifname` has one: the kernel forms the
/// link-local address only when it has processed the carrier coming up, which it may do up
/// to a second after the link works for DHCP. Waits at most 3 s, and not at all where the
/// kernel has no IPv6.
fn ipv6_addresses_of(ifname: &str) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let found = ipv6_addresses();
        if found.contains_key(ifname)
            || !std::path::Path::new("/proc/sys/net/ipv6").exists()
            || Instant::now() >= deadline
        {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Interface name → its IPv6 address (see [`crate::collect::ipv6_by_interface`]).
fn ipv6_addresses() -> BTreeMap<String, String> {
    let addrs = nix::ifaddrs::getifaddrs()
        .into_iter()
        .flatten()
        .filter_map(|a| {
            let sin6 = a.address.as_ref()?.as_sockaddr_in6()?.ip();
            Some((a.interface_name, sin6))
        });
    crate::collect::ipv6_by_interface(addrs)
}

/// Mounts the API file systems. `/proc` and `/sys` are required; the others are best effort.
fn mount_all(console: &Console) -> Result<(), MountError> {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let table: [(&str, &str, MsFlags, Option<&str>, bool); 5] = [
        // devtmpfs first: /dev/urandom and /dev/console must exist before anything else.
        (
            "devtmpfs",
            "/dev",
            MsFlags::MS_NOSUID,
            Some("mode=0755"),
            false,
        ),
        ("proc", "/proc", nosuid, None, true),
        ("sysfs", "/sys", nosuid, None, true),
        (
            "tmpfs",
            "/run",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
            false,
        ),
        (
            "tmpfs",
            "/tmp",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
            false,
        ),
    ];
    for (fstype, target, flags, data, required) in table {
        let _ = std::fs::create_dir_all(target);
        console.say(&format!("mounting {target} ({fstype})"));
        match mount(Some(fstype), target, Some(fstype), flags, data) {
            Ok(()) | Err(Errno::EBUSY) => {}
            Err(errno) if required => {
                return Err(MountError {
                    fstype,
                    target,
                    errno,
                });
            }
            Err(e) => console.say(&format!("warning: cannot mount {fstype} on {target}: {e}")),
        }
    }
    let _ = std::fs::create_dir_all("/run/paddock");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_inventory::{Disk, Interface, Inventory};

    fn collected(errors: Vec<String>) -> Collected {
        Collected {
            inventory: Inventory {
                interfaces: vec![Interface {
                    name: "eth0".into(),
                    mac_address: Some("52:54:00:12:34:56".into()),
                    ..Default::default()
                }],
                disks: vec![
                    Disk {
                        name: "/dev/vda".into(),
                        size: 10 << 30,
                        ..Default::default()
                    },
                    Disk {
                        name: "/dev/vdb".into(),
                        size: 5 << 30,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            errors,
        }
    }

    #[test]
    fn the_posted_body_table() {
        struct Case {
            line: &'static str,
            collector_errors: Vec<String>,
            problems: Vec<String>,
            boot_interface: &'static str,
            error: Option<&'static str>,
        }
        let cases = [
            Case {
                line: "BOOTIF=01-52-54-00-12-34-56 paddock.url=http://p",
                collector_errors: vec![],
                problems: vec![],
                boot_interface: "01-52-54-00-12-34-56",
                error: None,
            },
            Case {
                line: "paddock.url=http://p paddock.collectors=default,bogus",
                collector_errors: vec!["disks collector: cannot read /sys/block".into()],
                problems: vec!["lldp collector: AF_PACKET socket: EPERM".into()],
                boot_interface: "01-52-54-00-12-34-56",
                error: Some(
                    "unknown collector 'bogus' in paddock.collectors (known: default, pci-devices, lldp); \
                     disks collector: cannot read /sys/block; lldp collector: AF_PACKET socket: EPERM",
                ),
            },
        ];
        for c in cases {
            let cmd = cmdline::parse(c.line);
            let d = introspection_data(
                &cmd,
                collected(c.collector_errors),
                Some("52:54:00:12:34:56"),
                c.problems,
                None,
            );
            assert_eq!(
                d.boot_interface.as_deref(),
                Some(c.boot_interface),
                "{}",
                c.line
            );
            assert_eq!(d.error.as_deref(), c.error, "{}", c.line);
            assert_eq!(
                d.root_disk.as_ref().map(|r| r.name.as_str()),
                Some("/dev/vdb")
            );
            let v = serde_json::to_value(&d).unwrap();
            assert_eq!(
                v["configuration"]["collectors"],
                json!(cmd.collectors),
                "{}",
                c.line
            );
            assert!(v.get("pci_devices").is_none());
            // What the inspector will parse.
            let back = IntrospectionData::parse(&serde_json::to_vec(&d).unwrap()).unwrap();
            assert_eq!(back.inventory_checked().unwrap().interfaces[0].name, "eth0");
        }
        let d = introspection_data(
            &cmdline::parse(""),
            collected(vec![]),
            None,
            vec![],
            Some(json!([{"vendor_id": "8086", "product_id": "1521"}])),
        );
        assert_eq!(
            serde_json::to_value(&d).unwrap()["pci_devices"][0]["vendor_id"],
            "8086"
        );
        assert_eq!(d.boot_interface, None);
    }
}
