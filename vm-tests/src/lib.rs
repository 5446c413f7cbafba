//! The QEMU PXE harness.
//!
//! A [`Lab`] is a network namespace with a bridge (`198.18.0.1/24`), the real `paddock serve`
//! bound to it, and QEMU VMs (`-accel tcg`) whose NICs are taps on that bridge. VMs boot real
//! firmware: SeaBIOS with QEMU's iPXE option ROM, or OVMF (UEFI PXE → `snponly.efi` over our
//! TFTP → iPXE). Everything lives inside the namespace and is removed on drop.
//!
//! TLS is on, as an operator runs it: before `paddock serve` the lab runs `paddock certs
//! init` (the CA in the store, the host's certificate and an admin certificate in
//! `<data>/certs`), and every call the harness makes to the API, the console, `/rpc` and a
//! subd goes over HTTPS with that admin certificate ([`Creds`]). Only the boot path (DHCP,
//! TFTP, the boot scripts and assets on `http://…:8080`) is plain, as firmware needs.
//! [`Lab::start_insecure`] is the explicit opt-out.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

pub const SERVER_IP: &str = "198.18.0.1";
/// The boot path on plain HTTP: boot scripts, `/boot/assets`, `/boot/ca.pem`, `/healthz`.
pub const BOOT_URL: &str = "http://198.18.0.1:8080";
/// The API, console, `/v1` and `/rpc` (HTTPS; [`BOOT_URL`] when the lab runs insecure).
pub const API_URL: &str = "https://198.18.0.1:8443";
/// The appliance's address on an IPv6-only lab's provisioning network (2001:2::/48 is
/// IPv6's benchmarking range, as 198.18.0.0/15 is IPv4's).
pub const SERVER_IP6: &str = "2001:2::1";

pub mod bmc;
pub mod ha;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// What a lab needs from the build: the appliance binary and the discovery ramdisk.
#[derive(Clone, Debug)]
pub struct Artifacts {
    pub paddock: PathBuf,
    /// Holds `vmlinuz` and `initrd.img`.
    pub ramdisk_dir: PathBuf,
    /// Holds `undionly.kpxe`, `snponly.efi`, `ipxe.efi` (Debian's `ipxe`).
    pub ipxe_dir: PathBuf,
    pub ovmf_code: PathBuf,
    pub ovmf_vars: PathBuf,
    /// OVMF built for Secure Boot, and a variable store with Microsoft's keys enrolled.
    pub ovmf_secure_code: PathBuf,
    pub ovmf_secure_vars: PathBuf,
    /// UEFI for arm64 (Debian's `qemu-efi-aarch64`).
    pub aavmf_code: PathBuf,
    pub aavmf_vars: PathBuf,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

impl Artifacts {
    /// From `PADDOCK_BIN` (default `target/debug/paddock`) and `PADDOCK_RAMDISK_DIR` (default
    /// `target/ramdisk`), which `scripts/build-ramdisk.sh` fills.
    pub fn from_env() -> anyhow::Result<Self> {
        let root = workspace_root();
        let pick = |var: &str, default: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join(default))
        };
        let a = Artifacts {
            paddock: pick("PADDOCK_BIN", "target/debug/paddock"),
            ramdisk_dir: pick("PADDOCK_RAMDISK_DIR", "target/ramdisk"),
            ipxe_dir: PathBuf::from("/usr/lib/ipxe"),
            ovmf_code: PathBuf::from("/usr/share/OVMF/OVMF_CODE_4M.fd"),
            ovmf_vars: PathBuf::from("/usr/share/OVMF/OVMF_VARS_4M.fd"),
            ovmf_secure_code: PathBuf::from("/usr/share/OVMF/OVMF_CODE_4M.ms.fd"),
            ovmf_secure_vars: PathBuf::from("/usr/share/OVMF/OVMF_VARS_4M.ms.fd"),
            aavmf_code: PathBuf::from("/usr/share/AAVMF/AAVMF_CODE.fd"),
            aavmf_vars: PathBuf::from("/usr/share/AAVMF/AAVMF_VARS.fd"),
        };
        for (what, p) in [
            (
                "the paddock binary (cargo build -p paddock, or set PADDOCK_BIN)",
                a.paddock.clone(),
            ),
            (
                "the discovery kernel (run scripts/build-ramdisk.sh)",
                a.ramdisk_dir.join("vmlinuz"),
            ),
            (
                "the discovery initrd (run scripts/build-ramdisk.sh)",
                a.ramdisk_dir.join("initrd.img"),
            ),
            (
                "iPXE's undionly.kpxe (apt-get install ipxe)",
                a.ipxe_dir.join("undionly.kpxe"),
            ),
            ("OVMF (apt-get install ovmf)", a.ovmf_code.clone()),
        ] {
            if !p.exists() {
                bail!("{} is missing: {what}", p.display());
            }
        }
        Ok(a)
    }
}

/// The last `n` bytes of `s` (at a character boundary), for failure messages.
pub fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

pub use paddock_wire::unix_ms;

/// What subd fetched during a provisioning run, from the ramdisk's console line `subd
/// fetched N objects, B bytes, in S s` (`subd fetched nothing`: 0); the last run's.
pub fn subd_fetched_bytes(console: &str) -> Option<u64> {
    let at = console.rfind("subd fetched ")?;
    let rest = &console[at..];
    if rest.starts_with("subd fetched nothing") {
        return Some(0);
    }
    let (_, after) = rest.split_once(" objects, ")?;
    after.split_once(" bytes")?.0.trim().parse().ok()
}

/// Polls `probe` every 2 s until it gives a value; after `timeout` panics with `what` and
/// `context()` (the console's or the appliance's tail).
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    wait_every(what, timeout, Duration::from_secs(2), probe, context)
}

/// [`wait_for`], polling every `every` (for what is timed, or cheap to ask).
pub fn wait_every<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}\n{}",
            context()
        );
        std::thread::sleep(every);
    }
}

/// The node of a `GET /api/v1/nodes` answer that owns `mac`.
pub fn node_with_mac<'a>(nodes: &'a Value, mac: &str) -> Option<&'a Value> {
    nodes.as_array().into_iter().flatten().find(|n| {
        n["macs"]
            .as_array()
            .is_some_and(|m| m.iter().any(|x| x == mac))
    })
}

/// Runs `cmd` with `sh -c` (test-made strings only), capturing its output.
pub fn sh(cmd: &str) -> anyhow::Result<Output> {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .with_context(|| format!("running {cmd}"))
}

/// [`sh`], failing with the output when `cmd` fails; its stdout.
pub fn sh_ok(cmd: &str) -> anyhow::Result<String> {
    let out = sh(cmd)?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Who a client is to the appliance (or to a subd): the CA it checks the server against,
/// and a client certificate or a bearer token. [`Creds::none`]: plain HTTP, anonymous.
#[derive(Clone, Debug, Default)]
pub struct Creds {
    /// The CA (PEM) the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key (PEM).
    pub cert: Option<(PathBuf, PathBuf)>,
    /// An operator or agent token, sent as `Authorization: Bearer`.
    pub token: Option<String>,
}

impl Creds {
    /// Nothing: plain HTTP, or HTTPS without a client identity.
    pub fn none() -> Self {
        Creds::default()
    }

    /// `<dir>/ca.pem` and the certificate `<dir>/<name>.pem` with its key `<dir>/<name>.key`
    /// (what `paddock certs init` and `paddock certs issue NAME --out DIR` write).
    pub fn cert_in(dir: &Path, name: &str) -> Self {
        Creds {
            ca: Some(dir.join("ca.pem")),
            cert: Some((
                dir.join(format!("{name}.pem")),
                dir.join(format!("{name}.key")),
            )),
            token: None,
        }
    }

    /// The same identity, verifying servers with `ca` instead (subs: `subd-ca.pem`).
    pub fn with_ca(&self, ca: PathBuf) -> Self {
        Creds {
            ca: Some(ca),
            ..self.clone()
        }
    }

    /// The CA of `dir` and a bearer token.
    pub fn token_in(dir: &Path, token: &str) -> Self {
        Creds {
            ca: Some(dir.join("ca.pem")),
            cert: None,
            token: Some(token.to_string()),
        }
    }

    /// curl's options for these credentials.
    pub fn curl_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(ca) = &self.ca {
            a.extend(["--cacert".to_string(), ca.display().to_string()]);
        }
        if let Some((cert, key)) = &self.cert {
            a.extend([
                "--cert".to_string(),
                cert.display().to_string(),
                "--key".to_string(),
                key.display().to_string(),
            ]);
        }
        if let Some(t) = &self.token {
            a.extend(["-H".to_string(), format!("Authorization: Bearer {t}")]);
        }
        a
    }

    /// The CLI's environment for these credentials and `api` (`VAR=value` words for `env`;
    /// test-made paths without spaces).
    pub fn cli_env(&self, api: &str) -> String {
        let mut e = format!("PADDOCK_API={api}");
        if let Some(ca) = &self.ca {
            e.push_str(&format!(" PADDOCK_CA={}", ca.display()));
        }
        if let Some((cert, key)) = &self.cert {
            e.push_str(&format!(
                " PADDOCK_CERT={} PADDOCK_KEY={}",
                cert.display(),
                key.display()
            ));
        }
        if let Some(t) = &self.token {
            e.push_str(&format!(" PADDOCK_TOKEN={t}"));
        }
        e
    }
}

/// An HTTP request with curl from inside namespace `ns`, anonymous: (status, body); status 0
/// when nothing answered within `timeout_secs`.
pub fn curl_in(
    ns: &str,
    method: &str,
    url: &str,
    body: Option<&str>,
    timeout_secs: u32,
) -> anyhow::Result<(u16, String)> {
    curl_as(ns, &Creds::none(), method, url, body, timeout_secs)
}

/// [`curl_in`] with `creds` (HTTPS with a client certificate or token).
pub fn curl_as(
    ns: &str,
    creds: &Creds,
    method: &str,
    url: &str,
    body: Option<&str>,
    timeout_secs: u32,
) -> anyhow::Result<(u16, String)> {
    let timeout = timeout_secs.to_string();
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        ns,
        "curl",
        "-s",
        "-m",
        &timeout,
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ]);
    cmd.args(creds.curl_args());
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    cmd.arg(url);
    let out = cmd.output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    Ok((code.trim().parse().unwrap_or(0), body.to_string()))
}

/// Runs `paddock certs --config CONFIG ARGS` in namespace `ns` (the store the configuration
/// names; etcd is reached from there); its standard output.
pub fn certs(ns: &str, paddock: &Path, config: &Path, args: &str) -> anyhow::Result<String> {
    sh_ok(&format!(
        "ip netns exec {ns} env -u PADDOCK_INSECURE {} certs --config {} {args}",
        paddock.display(),
        config.display()
    ))
}

/// A fresh namespace `ns` holding a bridge `br0` that has address `ip`/24 (a stale one of
/// the same name is removed first).
pub fn bridge_namespace(ns: &str, ip: &str) -> anyhow::Result<()> {
    let _ = sh(&format!("ip netns del {ns} 2>/dev/null"));
    sh_ok(&format!(
        "ip netns add {ns} && ip -n {ns} link set lo up && ip -n {ns} link add br0 type bridge && \
         ip -n {ns} addr add {ip}/24 dev br0 && ip -n {ns} link set br0 up"
    ))?;
    Ok(())
}

/// Adds [`SERVER_IP6`]/64 to `br0` of `ns` (no duplicate address detection: nothing else
/// is on the bridge yet) and floods multicast (no querier runs, and DHCPv6 is multicast).
fn bridge_ipv6(ns: &str) -> anyhow::Result<()> {
    sh_ok(&format!(
        "ip -n {ns} link set br0 type bridge mcast_snooping 0 && \
         ip -n {ns} -6 addr add {SERVER_IP6}/64 dev br0 nodad"
    ))?;
    Ok(())
}

/// A tag unique to this process and call: `<prefix><pid>x<n>`, both numbers in base 36 so
/// that the tap names built from it (`<tag>t<round>n<nic>`) stay within Linux's 15 bytes
/// however many labs one test process starts.
pub fn unique_tag(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        base36(u64::from(std::process::id() % 100_000)),
        base36(u64::from(COUNTER.fetch_add(1, Ordering::SeqCst)))
    )
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[usize::try_from(n % 36).unwrap_or(0)]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest tag (a five-digit pid, the hundredth lab) leaves a tap name of at most
    /// 15 bytes.
    #[test]
    fn tap_names_fit_linux() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        let tag = format!("pdkv{}x{}", base36(99_999), base36(100));
        assert!(format!("{tag}t9n9").len() <= 15, "{tag}");
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS with QEMU's iPXE option ROM.
    Bios,
    /// OVMF: UEFI PXE, then `snponly.efi` over TFTP.
    Uefi,
    /// OVMF with Microsoft's keys enrolled and Secure Boot enforced (q35 with SMM, as the
    /// secure variable store needs): it runs only signed binaries.
    UefiSecureBoot,
    /// OVMF with PXE off (its `IPv4PXESupport`/`IPv6PXESupport` knobs): UEFI HTTP boot
    /// alone, as a machine whose firmware is set to boot over HTTP.
    UefiHttp,
    /// An arm64 machine (QEMU's `virt`, emulated by TCG) with UEFI (AAVMF): UEFI PXE as
    /// client architecture 11.
    Arm64Uefi,
    /// OVMF with IPv4 PXE off (`IPv4PXESupport`): UEFI PXE over IPv6 alone, as a machine on
    /// an IPv6-only network (it would otherwise wait out DHCPv4 first).
    UefiIpv6,
}

#[derive(Clone, Debug)]
pub struct VmSpec {
    pub name: String,
    pub firmware: Firmware,
    pub cpus: u32,
    pub memory_mb: u64,
    pub disks_mb: Vec<u64>,
    pub macs: Vec<String>,
    /// Boot this kernel directly instead of from the network (`bench/provision.sh`'s
    /// baseline boots the ramdisk with its own command line this way).
    pub direct: Option<DirectBoot>,
}

/// A kernel QEMU loads itself (`-kernel`, `-initrd`, `-append`).
#[derive(Clone, Debug)]
pub struct DirectBoot {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub append: String,
}

impl VmSpec {
    /// The machine `bench/provision.sh` and the provisioning scenarios install: 2 vCPUs
    /// (the scenarios, two VMs at once, take one), 1 GiB, one blank 4 GiB disk.
    pub fn provisioning(name: &str, mac: &str, firmware: Firmware) -> Self {
        VmSpec {
            name: name.into(),
            firmware,
            cpus: 2,
            memory_mb: 1024,
            disks_mb: vec![4096],
            macs: vec![mac.into()],
            direct: None,
        }
    }

    pub fn bios(name: &str, mac: &str) -> Self {
        VmSpec {
            name: name.into(),
            firmware: Firmware::Bios,
            cpus: 1,
            memory_mb: 512,
            disks_mb: vec![1024],
            macs: vec![mac.into()],
            direct: None,
        }
    }
}

pub struct Vm {
    pub spec: VmSpec,
    pub console: PathBuf,
    pub powered_on: Instant,
    /// Unix milliseconds at power-on, to compare with timeline entries.
    pub powered_on_ms: i64,
    /// How many times this VM was powered on again after its first start.
    pub round: u32,
    idx: usize,
    child: Child,
}

impl Vm {
    /// The VM has exited (powered itself off).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
    /// Pulls the plug.
    pub fn power_off(&mut self) {
        reap(&mut self.child);
    }

    pub fn console_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }
}

/// Where VMs run: a namespace with a bridge `br0`, the prefix of their tap names, the
/// directory of their disks and consoles, the firmware and ramdisk.
#[derive(Clone, Copy)]
pub struct VmSite<'a> {
    pub ns: &'a str,
    pub tag: &'a str,
    pub dir: &'a Path,
    pub artifacts: &'a Artifacts,
}

/// Powers a VM on. Round 0 creates its disks (and UEFI variables); a later round is the
/// same machine powered on again (the harness's VMs run with `-no-reboot`, so QEMU exits
/// where the machine reboots): its disks, variables and MACs, on new taps, with the disks
/// after the network in the boot order (OVMF keeps only the boot options QEMU names, and
/// iPXE hands a provisioned machine back to the firmware to boot its disk). Each NIC gets
/// a tap on `br0` of the site's namespace.
pub fn start_vm(site: &VmSite, idx: usize, spec: VmSpec, round: u32) -> anyhow::Result<Vm> {
    let VmSite {
        ns,
        tag,
        dir,
        artifacts,
    } = *site;
    let vmdir = dir.join(&spec.name);
    std::fs::create_dir_all(&vmdir)?;
    let (console, qemu_log) = if round == 0 {
        ("console.log".to_string(), "qemu.log".to_string())
    } else {
        (format!("console-{round}.log"), format!("qemu-{round}.log"))
    };
    let mut args: Vec<String> = vec![
        "-accel".into(),
        "tcg".into(),
        "-m".into(),
        spec.memory_mb.to_string(),
        "-smp".into(),
        spec.cpus.to_string(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", vmdir.join(&console).display()),
    ];
    // QEMU's default model with RDRAND, as every server CPU has: without it the guest's
    // random pool takes seconds to fill after boot, and the first to ask for randomness (a
    // TLS handshake, mkfs's UUIDs) waits for it, at a point that differs from run to run.
    // `PADDOCK_LAB_CPU` picks another model.
    // An arm64 machine: QEMU's `max` model has the RNDR instruction, RDRAND's counterpart;
    // pointer authentication with QEMU's own algorithm rather than QARMA emulates faster.
    let arm64 = spec.firmware == Firmware::Arm64Uefi;
    let cpu = if arm64 {
        "max,pauth-impdef=on".to_string()
    } else {
        std::env::var("PADDOCK_LAB_CPU").unwrap_or_else(|_| "qemu64,+rdrand".into())
    };
    args.extend(["-cpu".into(), cpu]);
    if arm64 {
        args.extend(["-machine".into(), "virt".into()]);
    }
    if let Some(d) = &spec.direct {
        args.extend([
            "-kernel".into(),
            d.kernel.display().to_string(),
            "-initrd".into(),
            d.initrd.display().to_string(),
            "-append".into(),
            d.append.clone(),
        ]);
    }
    for (i, mac) in spec.macs.iter().enumerate() {
        let tap = if round == 0 {
            format!("{tag}t{idx}n{i}")
        } else {
            format!("{tag}{i}{idx}r{round}")
        };
        if tap.len() > 15 {
            bail!("tap name {tap} is longer than Linux allows (15)");
        }
        sh_ok(&format!(
            "ip -n {ns} tuntap add dev {tap} mode tap && ip -n {ns} link set {tap} master br0 && ip -n {ns} link set {tap} up"
        ))?;
        args.push("-netdev".into());
        args.push(format!("tap,id=n{i},ifname={tap},script=no,downscript=no"));
        args.push("-device".into());
        let boot = if i == 0 { ",bootindex=1" } else { "" };
        // Under Secure Boot, OVMF's own (signed) virtio-net driver: QEMU's iPXE option ROM
        // is not signed. For HTTP boot too: the ROM's iPXE would boot the machine itself.
        // On arm64 the firmware's own driver (the ROM is x86 code).
        let rom = if matches!(
            spec.firmware,
            Firmware::UefiSecureBoot | Firmware::UefiHttp | Firmware::Arm64Uefi
        ) {
            ",romfile="
        } else {
            ""
        };
        args.push(format!("virtio-net-pci,netdev=n{i},mac={mac}{boot}{rom}"));
    }
    for (i, mb) in spec.disks_mb.iter().enumerate() {
        let img = vmdir.join(format!("disk{i}.img"));
        let boot = if round == 0 {
            std::fs::File::create(&img)?.set_len(mb * 1024 * 1024)?;
            String::new()
        } else {
            format!(",bootindex={}", i + 2)
        };
        args.push("-drive".into());
        args.push(format!("file={},if=none,id=d{i},format=raw", img.display()));
        args.push("-device".into());
        args.push(format!(
            "virtio-blk-pci,drive=d{i},serial={}-disk{i}{boot}",
            spec.name
        ));
    }
    if spec.firmware != Firmware::Bios {
        let (code, vars_from) = if spec.firmware == Firmware::UefiSecureBoot {
            args.extend([
                "-machine".into(),
                "q35,smm=on".into(),
                "-global".into(),
                "driver=cfi.pflash01,property=secure,value=on".into(),
            ]);
            (&artifacts.ovmf_secure_code, &artifacts.ovmf_secure_vars)
        } else if arm64 {
            (&artifacts.aavmf_code, &artifacts.aavmf_vars)
        } else if spec.firmware == Firmware::UefiIpv6 {
            args.push("-fw_cfg".into());
            args.push("name=opt/org.tianocore/IPv4PXESupport,string=n".into());
            (&artifacts.ovmf_code, &artifacts.ovmf_vars)
        } else if spec.firmware == Firmware::UefiHttp {
            for knob in ["IPv4PXESupport", "IPv6PXESupport"] {
                args.push("-fw_cfg".into());
                args.push(format!("name=opt/org.tianocore/{knob},string=n"));
            }
            (&artifacts.ovmf_code, &artifacts.ovmf_vars)
        } else {
            (&artifacts.ovmf_code, &artifacts.ovmf_vars)
        };
        let vars = vmdir.join("OVMF_VARS.fd");
        if round == 0 {
            std::fs::copy(vars_from, &vars)?;
        }
        args.push("-drive".into());
        args.push(format!(
            "if=pflash,format=raw,unit=0,readonly=on,file={}",
            code.display()
        ));
        args.push("-drive".into());
        args.push(format!(
            "if=pflash,format=raw,unit=1,file={}",
            vars.display()
        ));
    }
    let log = std::fs::File::create(vmdir.join(qemu_log))?;
    let (qemu, package) = if arm64 {
        ("qemu-system-aarch64", "qemu-system-arm qemu-efi-aarch64")
    } else {
        ("qemu-system-x86_64", "qemu-system-x86 ipxe-qemu")
    };
    let child = Command::new("ip")
        .args(["netns", "exec", ns, qemu])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {qemu} (apt-get install {package})"))?;
    Ok(Vm {
        console: vmdir.join(console),
        powered_on: Instant::now(),
        powered_on_ms: unix_ms(),
        round,
        idx,
        spec,
        child,
    })
}

/// Where one appliance host sits on the lab network.
pub struct ApplianceSite<'a> {
    pub ip: &'a str,
    pub iface: &'a str,
    /// Last octets of its DHCP pool in 198.18.0.0/24.
    pub pool: (usize, usize),
    /// The discovery ramdisk's extra kernel command line.
    pub cmdline: &'a str,
}

/// The configuration every lab appliance gets (DHCP, TFTP, HTTP boot of the discovery
/// ramdisk from its own address), with `extra` TOML appended.
pub fn appliance_config(data: &Path, a: &Artifacts, site: &ApplianceSite, extra: &str) -> String {
    let (ip, lo, hi) = (site.ip, site.pool.0, site.pool.1);
    format!(
        r#"data_dir = "{data}"
[http]
listen = "{ip}:8080"
assets_dir = "{assets}"
[dhcp]
interfaces = ["{iface}"]
[[dhcp.subnets]]
network = "198.18.0.0/24"
pools = ["198.18.0.{lo}-198.18.0.{hi}"]
routers = ["{ip}"]
lease_time = 600
[tftp]
listen = ["{ip}:69"]
root = "{ipxe}"
[boot.discovery]
kernel = "http://{ip}:8080/boot/assets/vmlinuz"
initrd = "http://{ip}:8080/boot/assets/initrd.img"
cmdline = "{cmdline}"
{extra}"#,
        data = data.display(),
        assets = a.ramdisk_dir.display(),
        ipxe = a.ipxe_dir.display(),
        iface = site.iface,
        cmdline = site.cmdline,
    )
}

/// [`appliance_config`] for an IPv6-only provisioning network: no DHCPv4, DHCPv6 with
/// router advertisements, and every URL a machine sees on [`SERVER_IP6`]. The appliance
/// listens on both families (`[::]`), so the harness still calls its API at [`API_URL`].
pub fn appliance_config6(data: &Path, a: &Artifacts, cmdline: &str, extra: &str) -> String {
    let ip = SERVER_IP6;
    format!(
        r#"data_dir = "{data}"
[http]
listen = "[::]:8080"
public_url = "http://[{ip}]:8080"
assets_dir = "{assets}"
[security]
listen = "[::]:8443"
public_url = "https://[{ip}]:8443"
[dhcp]
enabled = false
[dhcp6]
enabled = true
interfaces = ["br0"]
public_url = "http://[{ip}]:8080"
[[dhcp6.subnets]]
network = "2001:2::/64"
pools = ["2001:2::100-2001:2::1ff"]
[tftp]
listen = ["[::]:69"]
root = "{ipxe}"
[boot.discovery]
kernel = "http://[{ip}]:8080/boot/assets/vmlinuz"
initrd = "http://[{ip}]:8080/boot/assets/initrd.img"
cmdline = "{cmdline}"
{extra}"#,
        data = data.display(),
        assets = a.ramdisk_dir.display(),
        ipxe = a.ipxe_dir.display(),
    )
}

/// How a lab's provisioning network is addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabNet {
    /// 198.18.0.0/24 with DHCPv4.
    Ipv4,
    /// 2001:2::/64 with DHCPv6 alone: the machines get no IPv4 at all.
    Ipv6Only,
}

/// A namespace with a bridge, the appliance, and VMs.
pub struct Lab {
    pub ns: String,
    pub dir: PathBuf,
    pub tag: String,
    pub vms: Vec<Vm>,
    /// The appliance's configuration file.
    pub config: PathBuf,
    /// Where `paddock certs init` put the CA, the host's and the admin certificate (`None`:
    /// the lab runs insecure).
    pub certs: Option<PathBuf>,
    /// What the harness calls the API with: the admin certificate (nothing when insecure).
    pub creds: Creds,
    /// An operator token `lab` with the admin role, for the console's sign-in page
    /// (`/ui/login`). Minted before `serve` starts: `paddock certs token` writes the store,
    /// and a running single-host appliance owns its SQLite store alone.
    pub token: Option<String>,
    appliance: Option<Child>,
    artifacts: Artifacts,
    keep: bool,
}

impl Lab {
    /// Starts a lab with TLS on; `extra` is appended to the appliance's configuration.
    pub fn start(name: &str, artifacts: &Artifacts, extra: &str) -> anyhow::Result<Lab> {
        Self::start_with(name, artifacts, "console=ttyS0", extra)
    }

    /// Starts a lab (TLS on) whose discovery ramdisk gets `cmdline`.
    pub fn start_with(
        name: &str,
        artifacts: &Artifacts,
        cmdline: &str,
        extra: &str,
    ) -> anyhow::Result<Lab> {
        Self::launch(
            name,
            artifacts,
            cmdline,
            extra,
            (true, LabNet::Ipv4),
            &|_| Ok(()),
        )
    }

    /// Starts a lab (TLS on) after running `prepare` between `paddock certs init` and
    /// `serve` (a running appliance owns its store alone: certificates are issued before).
    pub fn start_prepared(
        name: &str,
        artifacts: &Artifacts,
        extra: &str,
        prepare: &dyn Fn(&Lab) -> anyhow::Result<()>,
    ) -> anyhow::Result<Lab> {
        Self::launch(
            name,
            artifacts,
            "console=ttyS0",
            extra,
            (true, LabNet::Ipv4),
            prepare,
        )
    }

    /// For [`Lab::start_prepared`]: the appliance's TFTP server off (UEFI HTTP boot needs
    /// none).
    pub fn tftp_off(lab: &Lab) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(&lab.config)?;
        std::fs::write(
            &lab.config,
            text.replace("[tftp]\n", "[tftp]\nenabled = false\n"),
        )?;
        Ok(())
    }

    /// Starts a lab in insecure mode (`[security] insecure = true`: plain HTTP, every call
    /// open): the explicit opt-out, for a scenario about insecure mode itself. No scenario
    /// needs it today.
    pub fn start_insecure(name: &str, artifacts: &Artifacts, extra: &str) -> anyhow::Result<Lab> {
        Self::launch(
            name,
            artifacts,
            "console=ttyS0",
            extra,
            (false, LabNet::Ipv4),
            &|_| Ok(()),
        )
    }

    /// Starts a lab (TLS on) whose machines are on an IPv6-only network
    /// ([`appliance_config6`]).
    pub fn start_ipv6_only(name: &str, artifacts: &Artifacts, extra: &str) -> anyhow::Result<Lab> {
        Self::launch(
            name,
            artifacts,
            "console=ttyS0",
            extra,
            (true, LabNet::Ipv6Only),
            &|_| Ok(()),
        )
    }

    fn launch(
        name: &str,
        artifacts: &Artifacts,
        cmdline: &str,
        extra: &str,
        (tls, net): (bool, LabNet),
        prepare: &dyn Fn(&Lab) -> anyhow::Result<()>,
    ) -> anyhow::Result<Lab> {
        let tag = unique_tag("pdkv");
        let ns = format!("{tag}-{name}");
        let dir = std::env::temp_dir().join(format!("paddock-lab-{ns}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        bridge_namespace(&ns, SERVER_IP)?;
        if net == LabNet::Ipv6Only {
            bridge_ipv6(&ns)?;
        }
        let data = dir.join("data");
        let certs_dir = tls.then(|| data.join("certs"));
        let mut lab = Lab {
            ns,
            config: dir.join("paddock.toml"),
            dir,
            tag,
            vms: Vec::new(),
            creds: certs_dir
                .as_deref()
                .map_or_else(Creds::none, |c| Creds::cert_in(c, "admin")),
            certs: certs_dir,
            token: None,
            appliance: None,
            artifacts: artifacts.clone(),
            // For looking into a run afterwards (a bench's phases, a test's logs).
            keep: std::env::var_os("PADDOCK_KEEP_LAB").is_some(),
        };
        let extra = if tls {
            extra.to_string()
        } else {
            format!("{extra}\n[security]\ninsecure = true\n")
        };
        let config = match net {
            LabNet::Ipv4 => appliance_config(
                &data,
                artifacts,
                &ApplianceSite {
                    ip: SERVER_IP,
                    iface: "br0",
                    pool: (100, 250),
                    cmdline,
                },
                &extra,
            ),
            LabNet::Ipv6Only => appliance_config6(&data, artifacts, cmdline, &extra),
        };
        std::fs::write(&lab.config, config)?;
        if tls {
            // The harness calls the API at the bridge's IPv4 address whatever the machines
            // use: on an IPv6-only lab the certificate names it too.
            let init = match net {
                LabNet::Ipv4 => "init".to_string(),
                LabNet::Ipv6Only => format!("init --san {SERVER_IP}"),
            };
            let out = certs(&lab.ns, &artifacts.paddock, &lab.config, &init)?;
            std::fs::write(lab.dir.join("certs-init.log"), out)?;
            let token = certs(
                &lab.ns,
                &artifacts.paddock,
                &lab.config,
                "token lab --role admin",
            )?;
            lab.token = Some(token.trim().to_string());
        }
        prepare(&lab)?;
        let log = std::fs::File::create(lab.dir.join("paddock.log"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &lab.ns])
            .arg(&artifacts.paddock)
            .env_remove("PADDOCK_INSECURE")
            .args(["serve", "--config"])
            .arg(&lab.config)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting paddock")?;
        lab.appliance = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while lab.api("GET", "/healthz", None).map(|(s, _)| s).ok() != Some(200) {
            if let Some(c) = lab.appliance.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!("paddock exited with {status}:\n{}", lab.appliance_log());
            }
            if Instant::now() > deadline {
                bail!("paddock did not start:\n{}", lab.appliance_log());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(lab)
    }

    /// Keep the lab directory after drop (for inspection).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    pub fn appliance_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("paddock.log")).unwrap_or_default()
    }

    /// The API's base URL: [`API_URL`], or [`BOOT_URL`] when the lab runs insecure.
    pub fn api_url(&self) -> &'static str {
        if self.certs.is_some() {
            API_URL
        } else {
            BOOT_URL
        }
    }

    /// Issues a certificate `name` with `args` (`--role …`, `--san …`) into
    /// `<lab>/issued`; its credentials (with the lab's CA). Insecure: [`Creds::none`].
    /// (`paddock certs issue` only reads the store, so it may run beside `serve`.)
    pub fn issue(&self, name: &str, args: &str) -> anyhow::Result<Creds> {
        let Some(certs_dir) = &self.certs else {
            return Ok(Creds::none());
        };
        let out = self.dir.join("issued");
        certs(
            &self.ns,
            &self.artifacts.paddock,
            &self.config,
            &format!("issue {name} {args} --out {}", out.display()),
        )?;
        std::fs::copy(certs_dir.join("ca.pem"), out.join("ca.pem"))?;
        Ok(Creds::cert_in(&out, name))
    }

    /// Calls the appliance's API from inside the namespace (HTTPS with the admin
    /// certificate): (status, body).
    pub fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        self.api_as(&self.creds, method, path, body)
    }

    /// [`Lab::api`] as someone else (`Creds::none()`: anonymous).
    pub fn api_as(
        &self,
        creds: &Creds,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        curl_as(
            &self.ns,
            creds,
            method,
            &format!("{}{path}", self.api_url()),
            body,
            10,
        )
    }

    pub fn api_json(&self, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<Value> {
        let (status, text) = self.api(method, path, body)?;
        if !(200..300).contains(&status) {
            bail!("{method} {path}: {status} {text}");
        }
        Ok(serde_json::from_str(&text)?)
    }

    /// Creates disks and a tap per NIC, and powers the VM on.
    pub fn boot(&mut self, spec: VmSpec) -> anyhow::Result<usize> {
        let idx = self.vms.len();
        let vm = start_vm(&self.site(), idx, spec, 0)?;
        self.vms.push(vm);
        Ok(idx)
    }

    fn site(&self) -> VmSite<'_> {
        VmSite {
            ns: &self.ns,
            tag: &self.tag,
            dir: &self.dir,
            artifacts: &self.artifacts,
        }
    }

    /// Adds an inspection rule that gives every machine inspected from now on `image`:
    /// provisioned in the boot that inspects it.
    pub fn set_image_rule(&self, image: &str) -> anyhow::Result<()> {
        let rule = serde_json::json!({
            "description": format!("install {image} on every new machine"),
            "conditions": [],
            "actions": [{"action": "set-image", "image": image}],
        });
        self.api_json("POST", "/v1/rules", Some(&rule.to_string()))
            .map(drop)
    }

    /// Powers VM `vm` on again (after it rebooted, powered off, or is pulled now): the same
    /// machine, see [`start_vm`]. Its console is a new file, `console-<round>.log`.
    pub fn power_on_again(&mut self, vm: usize) -> anyhow::Result<()> {
        let old = &mut self.vms[vm];
        old.power_off();
        let (spec, idx, round) = (old.spec.clone(), old.idx, old.round + 1);
        let again = start_vm(&self.site(), idx, spec, round)?;
        self.vms[vm] = again;
        Ok(())
    }

    /// `paddock ARGS` (the CLI) against this lab's appliance, from inside its namespace; its
    /// standard output. `args` are test-made words.
    pub fn cli(&self, args: &str) -> anyhow::Result<String> {
        sh_ok(&format!(
            "ip netns exec {} env {} {} {args}",
            self.ns,
            self.creds.cli_env(self.api_url()),
            self.artifacts.paddock.display()
        ))
    }

    /// Adds the image `name` from the tarball `tar` with the filter file `filter`.
    pub fn add_image(&self, name: &str, tar: &Path, filter: &Path) -> anyhow::Result<()> {
        self.cli(&format!(
            "image add {name} {} --filter {}",
            tar.display(),
            filter.display()
        ))
        .map(drop)
    }

    /// The bytes of image `name`, from the image server's list.
    pub fn image_bytes(&self, name: &str) -> anyhow::Result<u64> {
        let list = self.api_json("GET", "/rpc/ImageServer.ListImages", None)?;
        list["images"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["name"] == name)
            .and_then(|i| i["bytes"].as_u64())
            .with_context(|| format!("image {name} is not in {list}"))
    }

    /// The node that owns `mac`, if any.
    pub fn node_by_mac(&self, mac: &str) -> anyhow::Result<Option<Value>> {
        let nodes = self.api_json("GET", "/api/v1/nodes", None)?;
        Ok(node_with_mac(&nodes, mac).cloned())
    }

    /// Waits until the node owning the VM's first MAC reaches `finished` or `error`; returns
    /// the node (with its timeline) and the time since power-on.
    pub fn wait_enrolled(
        &mut self,
        vm: usize,
        timeout: Duration,
    ) -> anyhow::Result<(Value, Duration)> {
        let mac = self.vms[vm].spec.macs[0].clone();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(n) = self.node_by_mac(&mac)?
                && matches!(
                    n["introspection"]["state"].as_str(),
                    Some("finished" | "error")
                )
            {
                let full = self.api_json(
                    "GET",
                    &format!("/api/v1/nodes/{}", n["uuid"].as_str().unwrap_or("")),
                    None,
                )?;
                // Power-on to the moment the inventory was processed, from the timeline.
                let done_ms = full["timeline"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|e| {
                        matches!(
                            e["kind"].as_str(),
                            Some("introspection-finished" | "introspection-failed")
                        )
                    })
                    .filter_map(|e| e["at_ms"].as_i64())
                    .max()
                    .unwrap_or_else(unix_ms);
                let took =
                    Duration::from_millis((done_ms - self.vms[vm].powered_on_ms).max(0) as u64);
                return Ok((full, took));
            }
            if Instant::now() > deadline {
                let mut msg = format!(
                    "VM {} did not enrol within {timeout:?}\n--- console (tail) ---\n",
                    self.vms[vm].spec.name
                );
                let _ = writeln!(
                    msg,
                    "{}\n--- paddock log (tail) ---",
                    tail(&self.vms[vm].console_text(), 3000)
                );
                msg.push_str(tail(&self.appliance_log(), 3000));
                self.keep();
                bail!(msg);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Waits until the node's timeline has an entry of `kind`; returns the node then.
    pub fn wait_for_event(
        &self,
        vm: usize,
        uuid: &str,
        kind: &str,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.api_json("GET", &format!("/api/v1/nodes/{uuid}"), None)?;
            if n["timeline"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["kind"] == kind)
            {
                return Ok(n);
            }
            if Instant::now() > deadline {
                bail!(
                    "no {kind} on the timeline within {timeout:?}:\n{}",
                    tail(&self.vms[vm].console_text(), 3000)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until the VM has powered itself off.
    pub fn wait_powered_off(&mut self, vm: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.vms[vm].exited() {
            if Instant::now() > deadline {
                bail!(
                    "VM {} did not power off:\n{}",
                    self.vms[vm].spec.name,
                    tail(&self.vms[vm].console_text(), 3000)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(())
    }

    /// The processed introspection data of a node.
    pub fn data(&self, uuid: &str) -> anyhow::Result<Value> {
        self.api_json("GET", &format!("/v1/introspection/{uuid}/data"), None)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for vm in &mut self.vms {
            reap(&mut vm.child);
        }
        if let Some(mut a) = self.appliance.take() {
            reap(&mut a);
        }
        remove_namespace(&self.ns);
        keep_or_remove("lab", &self.dir, self.keep);
    }
}

/// Kills `child` and waits for it (what a lab's drop does with each process it started).
pub fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills whatever still runs in namespace `ns`, then deletes it.
pub fn remove_namespace(ns: &str) {
    let _ = sh(&format!(
        "ip netns pids {ns} | xargs -r kill -9 2>/dev/null"
    ));
    let _ = sh(&format!("ip netns del {ns}"));
}

/// A lab's files: kept (and said where) when asked to or when the test failed, else removed.
pub fn keep_or_remove(what: &str, dir: &Path, keep: bool) {
    if keep || std::thread::panicking() {
        eprintln!("{what} files kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}
