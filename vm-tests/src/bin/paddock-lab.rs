//! The lab: one command that starts the appliance in a namespace, PXE-boots VMs through it,
//! forwards the console to 127.0.0.1, prints each node's state as it changes, and cleans
//! everything up on Ctrl-C.
//!
//! `paddock-lab [--vms N] [--uefi | --secure-boot | --http-boot | --ipv6-only | --arch aarch64]
//! [--port 8443]
//! [--provision IMAGE.tar [--filter F]]`, after
//! `scripts/build-ramdisk.sh` (the README's lab command, `./scripts/lab.sh`, does all of it).
//!
//! TLS is on: the forwarder passes `https://127.0.0.1:PORT` through to the appliance's HTTPS
//! listener (its certificate names 127.0.0.1 too). The lab prints the CA's file, an admin
//! login token for the console's sign-in page (`paddock certs token lab --role admin`) and
//! the CLI's environment (the admin certificate `paddock certs init` made).
//!
//! With `--provision`, the tarball becomes image `lab/<name>`, an inspection rule assigns it
//! to every new machine, and each VM is installed in the boot that inspects it; where the
//! ramdisk reboots the machine (QEMU exits: `-no-reboot`), the lab powers it on again, as
//! the machine's own firmware would, so it boots the installed system and its subd takes
//! over. The node's provisioning state and the dominator's view of its sub are printed as
//! they change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{SigSet, Signal};
use paddock_vm_tests::{API_URL, Artifacts, BOOT_URL, Firmware, Lab, SERVER_IP, VmSpec};

struct Forwarder(Child);

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut vms = 1;
    let mut firmware = Firmware::Bios;
    let mut port = 8443u16;
    let mut once = false;
    let mut provision: Option<PathBuf> = None;
    let mut filter: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--vms" => {
                vms = it
                    .next()
                    .context("--vms needs a number")?
                    .parse()
                    .context("--vms")?
            }
            "--uefi" => firmware = Firmware::Uefi,
            "--secure-boot" => firmware = Firmware::UefiSecureBoot,
            "--http-boot" => firmware = Firmware::UefiHttp,
            "--ipv6-only" => firmware = Firmware::UefiIpv6,
            "--arch" => match it.next().map(String::as_str) {
                Some("aarch64" | "arm64") => firmware = Firmware::Arm64Uefi,
                Some("x86_64") => {}
                other => anyhow::bail!("--arch is x86_64 or aarch64, not {other:?}"),
            },
            "--port" => {
                port = it
                    .next()
                    .context("--port needs a number")?
                    .parse()
                    .context("--port")?
            }
            "--once" => once = true,
            "--provision" => {
                provision = Some(
                    it.next()
                        .context("--provision needs an image tarball")?
                        .into(),
                )
            }
            "--filter" => filter = Some(it.next().context("--filter needs a file")?.into()),
            "-h" | "--help" => {
                println!(
                    "paddock-lab [--vms N] [--uefi | --secure-boot | --http-boot | --arch aarch64] [--port 8443] [--once] [--provision IMAGE.tar [--filter FILE]]"
                );
                println!(
                    "  --secure-boot: OVMF with Microsoft's keys, Secure Boot enforced; the appliance serves shim → GRUB"
                );
                println!(
                    "  --http-boot: OVMF booting over HTTP alone (PXE off), the appliance's TFTP off"
                );
                println!(
                    "  --arch aarch64: arm64 VMs (QEMU virt under TCG, AAVMF) boot GRUB → the arm64 ramdisk; inspection only"
                );
                println!(
                    "  --port: where https://127.0.0.1:PORT reaches the console and API (default 8443)"
                );
                println!(
                    "  --once: exit when every VM has enrolled (finished or error), printing the times;"
                );
                println!("          with --provision, when every VM's installed system is synced");
                println!(
                    "  --provision: install IMAGE.tar on every VM in the boot that inspects it"
                );
                println!(
                    "  --filter: the image's filter (default: bootable.filter beside the tarball)"
                );
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?}; see --help"),
        }
    }
    // Ctrl-C and SIGTERM end the lab cleanly: block them here (children inherit the mask and
    // are killed by the clean-up) and wait for them on a thread.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block()?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            if signals.wait().is_ok() {
                stop.store(true, Ordering::SeqCst);
            }
        });
    }

    let artifacts = Artifacts::from_env()?;
    let image = match &provision {
        Some(tar) => Some(image_name(tar)?),
        None => None,
    };
    let filter = match (&provision, filter) {
        (Some(_), Some(f)) => Some(f),
        (Some(tar), None) => {
            let beside = tar.with_file_name("bootable.filter");
            beside.exists().then_some(beside)
        }
        (None, _) => None,
    };
    if firmware == Firmware::Arm64Uefi && provision.is_some() {
        anyhow::bail!(
            "--arch aarch64 inspects; it does not install (the arm64 ramdisk carries no disk tools)"
        );
    }
    let extra = match firmware {
        Firmware::UefiSecureBoot => "[boot.secure_boot]\nenabled = true\n",
        Firmware::Arm64Uefi => "[boot.arm64]\nenabled = true\n",
        _ => "",
    };
    let prepare: &dyn Fn(&Lab) -> anyhow::Result<()> = if firmware == Firmware::UefiHttp {
        &Lab::tftp_off
    } else {
        &|_| Ok(())
    };
    let mut lab = if firmware == Firmware::UefiIpv6 {
        Lab::start_ipv6_only("lab", &artifacts, extra)?
    } else {
        Lab::start_prepared("lab", &artifacts, extra, prepare)?
    };
    let _forward = Forwarder(
        Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr"))
            .arg(format!(
                "EXEC:ip netns exec {} socat STDIO TCP\\:{SERVER_IP}\\:8443",
                lab.ns
            ))
            .stdin(Stdio::null())
            .spawn()
            .context("starting socat (apt-get install socat)")?,
    );
    let base = format!("https://127.0.0.1:{port}");
    println!(
        "Paddock lab: namespace {}, appliance at {API_URL} (boot files {BOOT_URL}) inside it",
        lab.ns
    );
    println!("Logs:        {}", lab.dir.display());
    if let Some(certs) = &lab.certs {
        let token = lab.token.clone().unwrap_or_default();
        let ca = certs.join("ca.pem");
        println!("Console:     {base}/ui  (sign in at {base}/ui/login with the token below)");
        println!("Token:       {token}");
        println!(
            "CA:          {}  (the console's certificate chains to it; trust it in the browser or accept the warning)",
            ca.display()
        );
        println!(
            "CLI:         export PADDOCK_API={base} PADDOCK_CA={} PADDOCK_CERT={} PADDOCK_KEY={}",
            ca.display(),
            certs.join("admin.pem").display(),
            certs.join("admin.key").display()
        );
        println!("             then e.g. `target/release/paddock node list`");
        println!(
            "curl:        curl --cacert {} --cert {} --key {} {base}/api/v1/nodes",
            ca.display(),
            certs.join("admin.pem").display(),
            certs.join("admin.key").display()
        );
    }
    if let (Some(tar), Some(name)) = (&provision, &image) {
        let started = Instant::now();
        match &filter {
            Some(f) => lab.add_image(name, tar, f)?,
            None => {
                println!("warning: no filter for {name}: subd will own the whole root");
                lab.cli(&format!("image add {name} {}", tar.display()))?;
            }
        }
        lab.set_image_rule(name)?;
        println!(
            "Image:       {name} from {} ({:.1} s), installed on every new machine by a set-image rule",
            tar.display(),
            started.elapsed().as_secs_f64()
        );
    }
    for i in 0..vms {
        let mac = format!("52:54:00:1a:b0:{:02x}", i + 1);
        // An installed image needs a disk of at least 4 GiB (the birther's smallest root
        // disk) and the memory the provisioning ramdisk works in.
        let mut spec = match provision {
            Some(_) => VmSpec::provisioning(&format!("vm{i}"), &mac, firmware),
            None => VmSpec::bios(&format!("vm{i}"), &mac),
        };
        spec.firmware = firmware;
        spec.cpus = 2;
        if firmware == Firmware::Arm64Uefi {
            // AAVMF and the arm64 kernel want more than a BIOS machine's 512 MiB.
            spec.memory_mb = 1024;
        }
        lab.boot(spec)?;
        println!("[{:>6.1}s] vm{i} ({mac}, {firmware:?}) powered on", 0.0);
    }
    let started = Instant::now();
    let first_power_on: Vec<Instant> = lab.vms.iter().map(|v| v.powered_on).collect();
    let mut enrolled = vec![false; vms];
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut off = vec![false; vms];
    while !stop.load(Ordering::SeqCst) {
        if let Ok(nodes) = lab.api_json("GET", "/api/v1/nodes", None) {
            for n in nodes.as_array().into_iter().flatten() {
                let name = n["name"]
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| n["macs"][0].as_str().unwrap_or("?").to_string());
                let state = format!(
                    "{}{}",
                    n["introspection"]["state"].as_str().unwrap_or("-"),
                    n["introspection"]["error"]
                        .as_str()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                );
                let uuid = n["uuid"].as_str().unwrap_or("");
                let state = match &image {
                    Some(_) => format!("{state}; {}", provisioning(&lab, uuid, &name_of(n))),
                    None => state,
                };
                if last.get(&name) != Some(&state) {
                    println!(
                        "[{:>6.1}s] node {name} {}: {state}   https://127.0.0.1:{port}/ui/nodes/{}",
                        started.elapsed().as_secs_f64(),
                        n["uuid"].as_str().unwrap_or(""),
                        n["uuid"].as_str().unwrap_or("")
                    );
                    last.insert(name, state);
                }
            }
        }
        if once {
            for (i, done) in enrolled.iter_mut().enumerate() {
                let mac = &lab.vms[i].spec.macs[0];
                if !*done
                    && let Some(image) = &image
                    && let Ok(Some(n)) = lab.node_by_mac(mac)
                {
                    let p = provisioning(&lab, n["uuid"].as_str().unwrap_or(""), &name_of(&n));
                    // Done once the installed system (booted again after the hand-over, at
                    // its login prompt) has its own subd synced, not the ramdisk's.
                    let installed = p.starts_with("healthy")
                        && lab.vms[i].round >= 1
                        && lab.vms[i].console_text().contains("login:")
                        && p.contains(&format!("sub synced to {image}"));
                    if p.starts_with("error") || installed {
                        *done = true;
                        println!(
                            "vm{i} provisioned: {p}; seconds={:.1}",
                            first_power_on[i].elapsed().as_secs_f64()
                        );
                    }
                } else if !*done
                    && image.is_none()
                    && let Ok(Some(n)) = lab.node_by_mac(mac)
                    && matches!(
                        n["introspection"]["state"].as_str(),
                        Some("finished" | "error")
                    )
                {
                    *done = true;
                    println!(
                        "vm{i} enrolled state={} seconds={:.1}",
                        n["introspection"]["state"].as_str().unwrap_or("?"),
                        lab.vms[i].powered_on.elapsed().as_secs_f64()
                    );
                }
            }
            if enrolled.iter().all(|d| *d) {
                break;
            }
        }
        let mut exited = Vec::new();
        for (i, vm) in lab.vms.iter_mut().enumerate() {
            if !off[i] && vm.exited() {
                exited.push(i);
            }
        }
        for i in exited {
            // A machine the ramdisk handed over rebooted: power it on again, as its firmware
            // would, and it boots the installed system.
            let healthy = image.is_some()
                && lab
                    .node_by_mac(&lab.vms[i].spec.macs[0])
                    .ok()
                    .flatten()
                    .and_then(|n| {
                        let uuid = n["uuid"].as_str()?.to_string();
                        lab.api_json("GET", &format!("/api/v1/nodes/{uuid}/provisioning"), None)
                            .ok()
                    })
                    .is_some_and(|r| r["state"] == "healthy");
            if healthy {
                println!(
                    "[{:>6.1}s] vm{i} rebooted: powering it on into the installed system",
                    started.elapsed().as_secs_f64()
                );
                lab.power_on_again(i)?;
            } else {
                off[i] = true;
                println!(
                    "[{:>6.1}s] vm{i} powered off",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    println!("stopping: removing the VMs, the appliance and the namespace");
    Ok(())
}

/// `lab/<file name without .tar>`: the image a tarball becomes.
fn image_name(tar: &Path) -> anyhow::Result<String> {
    if !tar.is_file() {
        anyhow::bail!("{} is not a file", tar.display());
    }
    let stem = tar
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.trim_end_matches(".tar"))
        .filter(|n| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
        .with_context(|| {
            format!(
                "{}: name the tarball with letters, digits, '-', '_' or '.'",
                tar.display()
            )
        })?;
    Ok(format!("lab/{stem}"))
}

/// The name a node's installed system and its sub go by: the node's name, else
/// `node-<first 8 hex digits of its UUID>` (the appliance's rule).
fn name_of(node: &serde_json::Value) -> String {
    match node["name"].as_str() {
        Some(n) => n.to_string(),
        None => format!(
            "node-{}",
            node["uuid"]
                .as_str()
                .unwrap_or("")
                .replace('-', "")
                .chars()
                .take(8)
                .collect::<String>()
        ),
    }
}

/// A node's provisioning state, and its sub's as the dominator sees it once registered.
fn provisioning(lab: &Lab, uuid: &str, hostname: &str) -> String {
    let record = lab
        .api_json("GET", &format!("/api/v1/nodes/{uuid}/provisioning"), None)
        .unwrap_or_default();
    let mut out = record["state"].as_str().unwrap_or("-").to_string();
    if let Some(step) = record["last_step"].as_str() {
        out.push_str(&format!(" (done: {step})"));
    }
    if let Some(step) = record["step"].as_str() {
        out.push_str(&format!(" at {step}"));
    }
    if let Some(e) = record["message"].as_str() {
        out.push_str(&format!(": {e}"));
    }
    if let Ok(sub) = lab.api_json(
        "GET",
        &format!("/rpc/Dominator.GetSub?hostname={hostname}"),
        None,
    ) && let Some(state) = sub["state"].as_str()
    {
        out.push_str(&format!(
            "; sub {state} to {}",
            sub["image"].as_str().unwrap_or("-")
        ));
    }
    out
}
