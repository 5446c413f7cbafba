//! `bench/provision.sh`'s driver: installing an image with Paddock against the plainest way
//! to put a tarball on a disk, on the same VM and the same ramdisk, in one run.
//!
//! * **baseline**: the VM (TCG, 2 vCPUs, 1 GiB, one 4 GiB disk) boots the discovery ramdisk
//!   directly with `paddock.bench_tar=URL`: it lays the disk out and formats it exactly as a
//!   birth does (`paddock_birther::layout`), then streams image A's tarball from the
//!   appliance's HTTP server onto the new root with busybox `wget -O- URL | tar -x`.
//!   `baseline_s` runs from the console's `baseline: begins` to `baseline: streamed`.
//! * **paddock**: the same VM spec, blank, PXE-boots through Paddock, is inspected, and a
//!   `set-image` rule installs A in the same boot: the birther lays the disk out, subd starts
//!   on the new root and the dominator pushes A. `install_s` runs from the console's `birth of
//!   node … begins` to `subd synced to …` (the image's files are on the root; the boot
//!   loader and identity come after and are not counted, as the baseline installs neither).
//! * **re-image**: the installed VM is re-imaged to B (≈10 % of its files changed): the
//!   root is kept as an object cache and `fetched_share` is what subd fetched over B's bytes.
//! * **tls=off**: the install again by an appliance in insecure mode (plain HTTP), in a lab
//!   of its own, for what TLS costs.
//!
//! Both clocks are the host's, reading the same serial console file every 100 ms.
//!
//! Prints `provision install tls=on install_s=<s> baseline_s=<s> ratio=<r>`,
//! `provision reimage fetched_share=<f>` and `provision install tls=off …`. `--uefi` runs
//! all under OVMF.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use paddock_vm_tests::{Artifacts, DirectBoot, Firmware, Lab, VmSpec, subd_fetched_bytes, tail};

const IMAGE_A: &str = "bench/a";
const IMAGE_B: &str = "bench/b";

/// Waits until the console of VM `vm` holds `marker`; the moment it was first seen. A line
/// holding `failure` (when given) or the VM exiting first is an error.
fn seen(
    lab: &mut Lab,
    vm: usize,
    marker: &str,
    failure: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = lab.vms[vm].console_text();
        if text.contains(marker) {
            return Ok(Instant::now());
        }
        if let Some(f) = failure
            && text.contains(f)
        {
            bail!("{f}:\n{}", tail(&text, 3000));
        }
        if lab.vms[vm].exited() {
            bail!(
                "the VM stopped before `{marker}`:\n{}",
                tail(&lab.vms[vm].console_text(), 3000)
            );
        }
        if Instant::now() > deadline {
            bail!("no `{marker}` within {timeout:?}:\n{}", tail(&text, 3000));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spec(name: &str, mac: &str, firmware: Firmware, direct: Option<DirectBoot>) -> VmSpec {
    VmSpec {
        direct,
        ..VmSpec::provisioning(name, mac, firmware)
    }
}

/// A file of `from` in `dir` under `name`: a hard link where the file system allows, a copy
/// where not (the appliance serves only files beneath its assets directory).
fn place(from: &Path, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let to = dir.join(name);
    let _ = std::fs::remove_file(&to);
    if std::fs::hard_link(from, &to).is_err() {
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(to)
}

/// A provisioning run's clock: from the console's `begins` line (`birth of node …`,
/// `rebirth of node …`) to `subd synced to …`, in seconds; then waits for the machine's
/// reboot into the installed system.
fn run_window(lab: &mut Lab, vm: usize, begins: &str) -> anyhow::Result<f64> {
    let t0 = seen(lab, vm, begins, None, Duration::from_secs(1200))?;
    let t1 = seen(
        lab,
        vm,
        "subd synced to",
        Some("stopped: step"),
        Duration::from_secs(3600),
    )?;
    wait_exit(lab, vm, "the hand-over's reboot", Duration::from_secs(900))?;
    Ok((t1 - t0).as_secs_f64())
}

fn wait_exit(lab: &mut Lab, vm: usize, what: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !lab.vms[vm].exited() {
        if Instant::now() > deadline {
            bail!(
                "{what}: not within {timeout:?}\n{}",
                tail(&lab.vms[vm].console_text(), 3000)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut firmware = Firmware::Bios;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--uefi" => firmware = Firmware::Uefi,
            "-h" | "--help" => {
                println!("paddock-provision-bench [--uefi]   (run by bench/provision.sh)");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; see --help"),
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let images = root.join("target/images");
    let (tar_a, tar_b, filter) = (
        images.join("bootable.tar"),
        images.join("bootable2.tar"),
        images.join("bootable.filter"),
    );
    for f in [&tar_a, &tar_b, &filter] {
        if !f.exists() {
            bail!("{} is missing: run scripts/test-images.sh", f.display());
        }
    }
    // The appliance serves the ramdisk and, for the baseline, A's tarball from one
    // directory.
    let mut artifacts = Artifacts::from_env()?;
    let assets = root.join("target/bench-provision");
    std::fs::create_dir_all(&assets)?;
    let kernel = place(&artifacts.ramdisk_dir.join("vmlinuz"), &assets, "vmlinuz")?;
    let initrd = place(
        &artifacts.ramdisk_dir.join("initrd.img"),
        &assets,
        "initrd.img",
    )?;
    place(&tar_a, &assets, "a.tar")?;
    artifacts.ramdisk_dir = assets.clone();
    let mut lab = Lab::start("pbench", &artifacts, "")?;
    println!(
        "provision bench: {firmware:?}, lab files in {}",
        lab.dir.display()
    );

    // Baseline.
    let url = paddock_vm_tests::BOOT_URL;
    let vm = lab.boot(spec(
        "baseline",
        "52:54:00:16:ba:01",
        firmware,
        Some(DirectBoot {
            kernel,
            initrd,
            append: format!(
                "console=ttyS0 paddock.url={url} paddock.bench_tar={url}/boot/assets/a.tar"
            ),
        }),
    ))?;
    let t0 = seen(
        &mut lab,
        vm,
        "baseline: begins",
        None,
        Duration::from_secs(600),
    )?;
    let t1 = seen(
        &mut lab,
        vm,
        "baseline: streamed",
        Some("baseline: failed"),
        Duration::from_secs(3600),
    )?;
    let t2 = seen(
        &mut lab,
        vm,
        "baseline: synced",
        Some("baseline: failed"),
        Duration::from_secs(600),
    )?;
    let baseline_s = (t1 - t0).as_secs_f64();
    println!(
        "provision baseline streamed_s={baseline_s:.1} then_synced_s={:.1}",
        (t2 - t1).as_secs_f64()
    );
    wait_exit(
        &mut lab,
        vm,
        "the baseline's power-off",
        Duration::from_secs(300),
    )?;

    // Paddock, as operators run it (TLS): inspected and installed with A in one boot.
    let (vm, install_s) = install(&mut lab, &tar_a, &filter, firmware, "52:54:00:16:ba:02")?;
    println!(
        "provision install tls=on install_s={install_s:.1} baseline_s={baseline_s:.1} ratio={:.2}",
        install_s / baseline_s
    );

    // Re-image to B: the root holding A becomes the object cache.
    let node = lab
        .node_by_mac("52:54:00:16:ba:02")?
        .context("the installed VM has no node")?;
    let uuid = node["uuid"].as_str().unwrap_or_default().to_string();
    lab.add_image(IMAGE_B, &tar_b, &filter)?;
    lab.cli(&format!("node reimage {uuid} --image {IMAGE_B}"))?;
    lab.power_on_again(vm)?;
    let reimage_s = run_window(&mut lab, vm, "rebirth of node")?;
    let text = lab.vms[vm].console_text();
    let fetched = subd_fetched_bytes(&text)
        .with_context(|| format!("no `subd fetched` line:\n{}", tail(&text, 3000)))?;
    let b_bytes = lab.image_bytes(IMAGE_B)?;
    println!(
        "provision reimage fetched_share={:.3} fetched_bytes={fetched} image_bytes={b_bytes} reimage_s={reimage_s:.1}",
        fetched as f64 / b_bytes as f64,
    );
    drop(lab);

    // The same install by an insecure appliance (plain HTTP, no client certificates), for
    // what TLS costs.
    let mut lab = Lab::start_insecure("pbplain", &artifacts, "")?;
    let (_, plain_s) = install(&mut lab, &tar_a, &filter, firmware, "52:54:00:16:ba:03")?;
    println!(
        "provision install tls=off install_s={plain_s:.1} baseline_s={baseline_s:.1} ratio={:.2}",
        plain_s / baseline_s
    );
    Ok(())
}

/// A blank VM PXE-boots through `lab`, is inspected, and a `set-image` rule installs A in the
/// same boot; the VM's index in the lab and the install's seconds ([`run_window`]).
fn install(
    lab: &mut Lab,
    tar: &Path,
    filter: &Path,
    firmware: Firmware,
    mac: &str,
) -> anyhow::Result<(usize, f64)> {
    let started = Instant::now();
    lab.add_image(IMAGE_A, tar, filter)?;
    println!(
        "provision image A added in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    lab.set_image_rule(IMAGE_A)?;
    let vm = lab.boot(spec("paddock", mac, firmware, None))?;
    let install_s = run_window(lab, vm, "birth of node")?;
    // Where the time went, as the ramdisk saw it.
    let text = lab.vms[vm].console_text();
    if let Some(line) = text.lines().rfind(|l| l.contains("subd synced to")) {
        println!("provision {}", line.trim());
    }
    Ok((vm, install_s))
}
