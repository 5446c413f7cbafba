//! The lab: one command that starts the appliance in a namespace, PXE-boots VMs through it,
//! forwards the console to 127.0.0.1, prints each node's state as it changes, and cleans
//! everything up on Ctrl-C.
//!
//! `paddock-lab [--vms N] [--uefi] [--port 8080]`, after `scripts/build-ramdisk.sh` (the
//! README's lab command, `./scripts/lab.sh`, does all of it).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{SigSet, Signal};
use paddock_vm_tests::{Artifacts, Firmware, Lab, VmSpec};

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
    let mut port = 8080u16;
    let mut once = false;
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
            "--port" => {
                port = it
                    .next()
                    .context("--port needs a number")?
                    .parse()
                    .context("--port")?
            }
            "--once" => once = true,
            "-h" | "--help" => {
                println!("paddock-lab [--vms N] [--uefi] [--port 8080] [--once]");
                println!(
                    "  --once: exit when every VM has enrolled (finished or error), printing the times"
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
    let mut lab = Lab::start("lab", &artifacts, "")?;
    let _forward = Forwarder(
        Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr"))
            .arg(format!(
                "EXEC:ip netns exec {} socat STDIO TCP\\:198.18.0.1\\:8080",
                lab.ns
            ))
            .stdin(Stdio::null())
            .spawn()
            .context("starting socat (apt-get install socat)")?,
    );
    println!(
        "Paddock lab: namespace {}, appliance at http://198.18.0.1:8080 inside it",
        lab.ns
    );
    println!("Console:     http://127.0.0.1:{port}/ui   (API: http://127.0.0.1:{port}/v1)");
    println!("Logs:        {}", lab.dir.display());
    for i in 0..vms {
        let mac = format!("52:54:00:1a:b0:{:02x}", i + 1);
        let mut spec = VmSpec::bios(&format!("vm{i}"), &mac);
        spec.firmware = firmware;
        spec.cpus = 2;
        lab.boot(spec)?;
        println!("[{:>6.1}s] vm{i} ({mac}, {firmware:?}) powered on", 0.0);
    }
    let started = Instant::now();
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
                if last.get(&name) != Some(&state) {
                    println!(
                        "[{:>6.1}s] node {name} {}: {state}   http://127.0.0.1:{port}/ui/nodes/{}",
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
        for (i, vm) in lab.vms.iter_mut().enumerate() {
            if !off[i] && vm.exited() {
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
