//! VM scenarios of provisioning, one per firmware kind, each a machine's life: a
//! blank VM PXE-boots, is inspected and, through an inspection rule's `set-image`, installed
//! in the same boot by the ramdisk's birth mode; it reboots into the installed Debian, whose
//! own subd answers and is synced to A; it is re-imaged to B keeping its root as an object
//! cache (the bytes fetched are printed as a share of B's bytes), boots B and is synced to
//! it; under BIOS it then becomes the one host of an image role on B, and a spec naming A
//! rolls it (the dominator updates the running system, a trigger reboots it, it boots A);
//! `clean` then leaves a disk with no partition table.
//!
//! Each prints its timings. They need what the other VM scenarios need (root, QEMU, iPXE,
//! OVMF, `scripts/build-ramdisk.sh`) and the bootable test images (`scripts/test-images.sh`:
//! `target/images/bootable.tar`, `bootable2.tar`, `bootable.filter`). TCG is slow: a run takes
//! many minutes.
//!
//! The harness's VMs run with `-no-reboot`, so QEMU exits where the machine reboots; the
//! scenario then powers the same VM (its disk, its UEFI variables, its MAC) on again.
//!
//! Two failures seen on the way, and their fixes: the installed system never synced because
//! subd's scan skips mount points (`/proc`, `/run` … looked missing; subd now works through a
//! private bind mount of `/`, `subd/src/bind_root.rs`); under UEFI, OVMF had no disk option
//! after iPXE's `exit`, and GRUB chained by iPXE from the ESP could not name its root
//! (`(,gpt3)`), so the local boot chains `file://PADDOCK-ESP/EFI/BOOT/BOOTX64.EFI` and that
//! image finds the root by its label (`birther/src/layout.rs`, `efi_early_config`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use paddock_vm_tests::{
    Artifacts, Creds, Firmware, Lab, VmSpec, curl_as, sh, subd_fetched_bytes, tail, wait_for,
};
use serde_json::{Value, json};

const IMAGE_A: &str = "paddock/bootable";
const IMAGE_B: &str = "paddock/bootable2";

fn artifacts() -> Artifacts {
    Artifacts::from_env().unwrap_or_else(|e| panic!("VM scenarios cannot run: {e:#}"))
}

fn images() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images");
    for f in ["bootable.tar", "bootable2.tar", "bootable.filter"] {
        assert!(
            dir.join(f).exists(),
            "{} is missing: run scripts/test-images.sh",
            dir.join(f).display()
        );
    }
    dir
}

fn add_image(lab: &Lab, name: &str, tar: &str) {
    let dir = images();
    let started = Instant::now();
    lab.add_image(name, &dir.join(tar), &dir.join("bootable.filter"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!(
        "image {name} added in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

struct Installed {
    lab: Lab,
    vm: usize,
    uuid: String,
    hostname: String,
    /// The machine has computed files: its `/etc/hostname` (`<name>-lab1`) and, while it
    /// runs the role `app`, `/etc/app/role.conf`.
    computed: bool,
    /// The role loop's hooks directory, removed after the lab (declared after it, so dropped
    /// after the appliance that uses it has stopped).
    _hooks: tempfile::TempDir,
}

/// Every machine's `/etc/hostname` is computed (its name and the site), and the role `app`
/// (when `app_image` is given: an image role on it) gives its machines `/etc/app/role.conf`.
fn computed_spec(app_image: Option<&str>) -> Value {
    let mut text = "[vars]\nsite = \"lab1\"\n\n[[files]]\npath = \"/etc/hostname\"\n\
                    template = \"hostname.j2\"\n"
        .to_string();
    if let Some(image) = app_image {
        // Deadlines for TCG: the batch includes a reboot.
        text.push_str(&format!(
            "\n[roles.app]\nmin = 0\nmax = 1\nimage = \"{image}\"\n\
             update = {{ min_healthy_secs = 5, healthy_deadline_secs = 1500, \
             progress_deadline_secs = 1800 }}\n\
             files = [{{ path = \"/etc/app/role.conf\", template = \"app.j2\", mode = \"0640\" }}]\n"
        ));
    }
    json!({
        "file": "spec/lab.toml",
        "text": text,
        "templates": {
            "hostname.j2": "{{ machine.name }}-{{ vars.site }}\n",
            "app.j2": "role={{ role }} host={{ machine.name }} members={{ peers.app | length }}\n",
        },
    })
}

impl Installed {
    fn record(&self) -> Value {
        self.lab
            .api_json(
                "GET",
                &format!("/api/v1/nodes/{}/provisioning", self.uuid),
                None,
            )
            .unwrap_or(Value::Null)
    }

    /// The dominator's view of the installed system (`Dominator.GetSub`).
    fn sub(&self) -> anyhow::Result<Value> {
        self.lab.api_json(
            "GET",
            &format!("/rpc/Dominator.GetSub?hostname={}", self.hostname),
            None,
        )
    }

    fn name(&self) -> String {
        self.lab.vms[self.vm].spec.name.clone()
    }

    fn console(&self) -> String {
        self.lab.vms[self.vm].console_text()
    }

    /// Waits for the provisioning state `state` (or fails at `error`) while the console
    /// shows the machine's progress.
    fn wait_state(&self, state: &str, timeout: Duration) {
        wait_for(
            &format!("node {} to reach {state}", self.uuid),
            timeout,
            || {
                let r = self.record();
                assert_ne!(r["state"], "error", "{r}\n{}", tail(&self.console(), 4000));
                (r["state"] == state).then_some(())
            },
            || {
                format!(
                    "record {}\n--- console ---\n{}\n--- paddock ---\n{}",
                    self.record(),
                    tail(&self.console(), 4000),
                    tail(&self.lab.appliance_log(), 3000)
                )
            },
        );
    }

    /// Waits for the install to reach `healthy` while reading the machine's console page
    /// every second: each change of its progress bar (percent, step, the sync's fetch line).
    fn wait_installed_watching_the_page(
        &self,
        timeout: Duration,
    ) -> Vec<(u32, String, Option<String>)> {
        let mut seen: Vec<(u32, String, Option<String>)> = Vec::new();
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.record();
            assert_ne!(r["state"], "error", "{r}\n{}", tail(&self.console(), 4000));
            if r["state"] == "healthy" {
                return seen;
            }
            if let Ok((200, html)) = self
                .lab
                .api("GET", &format!("/ui/nodes/{}", self.uuid), None)
                && let Some(p) = progress_on_page(&html)
                && seen.last() != Some(&p)
            {
                seen.push(p);
            }
            assert!(
                Instant::now() < deadline,
                "node {} not healthy within {timeout:?}: {r}\n{}",
                self.uuid,
                tail(&self.console(), 4000)
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Waits until the VM has rebooted (QEMU exits there: `-no-reboot`) or powered off.
    fn wait_exited(&mut self, what: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.lab.vms[self.vm].exited() {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}\n{}",
                tail(&self.console(), 4000)
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn power_on(&mut self) {
        self.lab
            .power_on_again(self.vm)
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Boots the installed system: it reaches a login prompt, its own subd answers Poll on
    /// the registered address, and the dominator finds it synced to `image`; then it is
    /// powered off.
    fn boots_installed(&mut self, image: &str) {
        self.boots(image);
        // The installed system keeps running until pulled: this VM has no BMC for the
        // appliance to power it off with, so the harness resets the machine for what comes
        // next.
        self.lab.vms[self.vm].power_off();
    }

    /// [`Installed::boots_installed`], left running.
    fn boots(&mut self, image: &str) {
        let mut started = Instant::now();
        self.power_on();
        // Under TCG a guest kernel now and then spins in a boot-time self-test
        // (`watchdog: BUG: soft lockup … [cryptomgr_test]`, seen once in a full run) and never
        // reaches a prompt: the emulated machine hung, not the install. Such a boot is
        // power-cycled once, and said; a second hang fails as any other.
        let hung = wait_for(
            "the installed system's login prompt",
            Duration::from_secs(1200),
            || {
                let out = self.console();
                if out.contains("login:") {
                    Some(false)
                } else {
                    out.contains("BUG: soft lockup").then_some(true)
                }
            },
            || tail(&self.console(), 4000).to_string(),
        );
        if hung {
            println!(
                "{}: the guest kernel hung at boot (soft lockup), power-cycled once:\n{}",
                self.name(),
                tail(&self.console(), 1500)
            );
            self.lab.vms[self.vm].power_off();
            started = Instant::now();
            self.power_on();
            wait_for(
                "the installed system's login prompt, after a power cycle",
                Duration::from_secs(1200),
                || self.console().contains("login:").then_some(()),
                || tail(&self.console(), 4000).to_string(),
            );
        }
        println!(
            "{}: power-on → installed system's login prompt {:.1} s",
            self.name(),
            started.elapsed().as_secs_f64()
        );
        let sub = self.sub().unwrap_or_else(|e| panic!("{e:#}"));
        let address = sub["address"].as_str().unwrap_or("").to_string();
        let host = address.split(':').next().unwrap_or("").to_string();
        // subd speaks mutual TLS with the certificate the birther installed (from the subd
        // CA, which the appliance's clients do not trust): the harness calls it with the
        // lab's admin certificate (`*.*`), verifying it as the dominator does.
        let scheme = if self.lab.certs.is_some() {
            "https"
        } else {
            "http"
        };
        let as_sub = |c: &Creds| match &self.lab.certs {
            Some(dir) => c.with_ca(dir.join("subd-ca.pem")),
            None => c.clone(),
        };
        let subd = format!("{scheme}://{host}:6969");
        wait_for(
            "the installed subd to answer Poll",
            Duration::from_secs(300),
            || {
                let (status, body) = curl_as(
                    &self.lab.ns,
                    &as_sub(&self.lab.creds),
                    "POST",
                    &format!("{subd}/rpc/Subd.Poll"),
                    Some(r#"{"short_poll_only": true}"#),
                    10,
                )
                .ok()?;
                (status == 200).then_some(body)
            },
            || tail(&self.console(), 3000).to_string(),
        );
        if self.lab.certs.is_some() {
            // A certificate from the same CA that may only poll: subd answers its Poll and
            // refuses its Update, naming the method.
            let poller = as_sub(
                &self
                    .lab
                    .issue("poller", "--methods Subd.Poll")
                    .unwrap_or_else(|e| panic!("{e:#}")),
            );
            let call = |method: &str, body: &str| {
                curl_as(
                    &self.lab.ns,
                    &poller,
                    "POST",
                    &format!("{subd}/rpc/Subd.{method}"),
                    Some(body),
                    10,
                )
                .unwrap_or_else(|e| panic!("{e:#}"))
            };
            let (status, body) = call("Poll", r#"{"short_poll_only": true}"#);
            assert_eq!(status, 200, "Poll with Subd.Poll: {body}");
            let (status, body) = call("Update", "{}");
            assert_eq!(status, 403, "Update without Subd.Update: {body}");
            assert!(body.contains("Subd.Update"), "{body}");
            println!(
                "{}: subd refused an Update from a certificate without Subd.Update: {}",
                self.name(),
                body.trim()
            );
        }
        let synced = wait_for(
            "the dominator to find the installed system synced",
            Duration::from_secs(600),
            || {
                let s = self.sub().ok()?;
                (s["state"] == "synced" && s["image"] == image).then_some(s)
            },
            || tail(&self.lab.appliance_log(), 3000).to_string(),
        );
        println!(
            "{}: installed system synced to {image} ({:.1} s after power-on): {}",
            self.name(),
            started.elapsed().as_secs_f64(),
            synced["summary"]
        );
    }

    fn apply_role(&self, image: &str) {
        let body = if self.computed {
            computed_spec(Some(image))
        } else {
            // Deadlines for TCG: the batch includes a reboot.
            let text = format!(
                "[roles.app]\nmin = 0\nmax = 1\nimage = \"{image}\"\n\
                 update = {{ min_healthy_secs = 5, healthy_deadline_secs = 1500, \
                 progress_deadline_secs = 1800 }}\n"
            );
            json!({"file": "spec/app.toml", "text": text})
        };
        self.lab
            .api_json("POST", "/api/v1/spec", Some(&body.to_string()))
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// With computed files: the running system's login prompt names it by its computed
    /// `/etc/hostname` (so it booted with it), and `paths` hold what the spec made of them,
    /// read from the machine by its own subd (`Subd.GetFiles`).
    fn has_computed_files(&self, paths: &[(&str, String)]) {
        if !self.computed {
            return;
        }
        let prompt = format!("{}-lab1 login:", self.hostname);
        assert!(
            self.console().contains(&prompt),
            "no {prompt:?}: {}",
            tail(&self.console(), 3000)
        );
        let names: Vec<&str> = paths.iter().map(|(p, _)| *p).collect();
        let body = json!({ "paths": names }).to_string();
        let (status, got) = self
            .subd_call("GetFiles", &body)
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(status, 200, "GetFiles: {got}");
        for (path, want) in paths {
            assert!(
                got.contains(want.as_str()),
                "{path}: {want:?} not in {got:?}"
            );
        }
        println!(
            "{}: booted as {prompt:?}; its computed files hold {:?}",
            self.name(),
            paths.iter().map(|(_, w)| w.trim()).collect::<Vec<_>>()
        );
    }

    /// A call to the machine's own subd (over mutual TLS with the lab's admin certificate,
    /// verified against the subd CA, as the dominator calls it).
    fn subd_call(&self, method: &str, body: &str) -> anyhow::Result<(u16, String)> {
        let sub = self.sub()?;
        let address = sub["address"].as_str().unwrap_or("").to_string();
        let host = address.split(':').next().unwrap_or("").to_string();
        let (scheme, creds) = match &self.lab.certs {
            Some(dir) => ("https", self.lab.creds.with_ca(dir.join("subd-ca.pem"))),
            None => ("http", self.lab.creds.clone()),
        };
        curl_as(
            &self.lab.ns,
            &creds,
            "POST",
            &format!("{scheme}://{host}:6969/rpc/Subd.{method}"),
            Some(body),
            10,
        )
    }

    /// The machine (on B, powered off) is the one host of an image role on B; a spec that
    /// names A rolls it: the leader's rollout sets its RequiredImage, the dominator updates
    /// the running system, whose trigger reboots it, and it boots A and is synced to it.
    fn rolled_by_a_spec_change(&mut self) {
        // B and A again under a role's names (words); A with a trigger that reboots the
        // machine when its package set changes. (Not on any change: each boot of these
        // images drifts a few paths, which the dominator puts back; a reboot for each would
        // never end.)
        let triggers = self.lab.dir.join("reboot-triggers.json");
        std::fs::write(
            &triggers,
            r#"[{"MatchLines": ["/var/lib/dpkg/status$"], "Service": "reboot", "DoReboot": true}]"#,
        )
        .unwrap();
        let dir = images();
        for (name, tar, more) in [
            ("rolled-b", "bootable2.tar", String::new()),
            (
                "rolled-a",
                "bootable.tar",
                format!("--triggers {}", triggers.display()),
            ),
        ] {
            self.lab
                .cli(&format!(
                    "image add {name} {} --filter {} {more}",
                    dir.join(tar).display(),
                    dir.join("bootable.filter").display(),
                ))
                .unwrap_or_else(|e| panic!("{e:#}"));
        }
        self.boots(IMAGE_B);
        self.apply_role("rolled-b");
        wait_for(
            "the role's instance on the machine",
            Duration::from_secs(300),
            || {
                let s = self.sub().ok()?;
                (s["state"] == "synced" && s["image"] == "rolled-b").then_some(())
            },
            || tail(&self.lab.appliance_log(), 3000).to_string(),
        );
        let role_file = format!("role=app host={} members=1\n", self.hostname);
        let hostname = format!("{}-lab1\n", self.hostname);
        if self.computed {
            // The role's file arrives once the machine's instance counts.
            wait_for(
                "the role's file on the machine",
                Duration::from_secs(300),
                || {
                    let (status, got) = self
                        .subd_call("GetFiles", r#"{"paths": ["/etc/app/role.conf"]}"#)
                        .ok()?;
                    (status == 200 && got.contains(&role_file)).then_some(())
                },
                || tail(&self.lab.appliance_log(), 3000).to_string(),
            );
        }
        self.has_computed_files(&[
            ("/etc/hostname", hostname.clone()),
            ("/etc/app/role.conf", role_file.clone()),
        ]);
        let started = Instant::now();
        self.apply_role("rolled-a");
        self.wait_exited(
            "the reboot the update's trigger asked for",
            Duration::from_secs(900),
        );
        println!(
            "{}: spec apply → the machine rebooted by its update {:.1} s",
            self.name(),
            started.elapsed().as_secs_f64()
        );
        self.boots("rolled-a");
        self.has_computed_files(&[
            ("/etc/hostname", hostname),
            ("/etc/app/role.conf", role_file),
        ]);
        let done = wait_for(
            "the rollout done",
            Duration::from_secs(600),
            || {
                let r = self
                    .lab
                    .api_json("GET", "/api/v1/rollouts/app", None)
                    .ok()?;
                (r["phase"]["phase"] == "done").then_some(r)
            },
            || tail(&self.lab.appliance_log(), 3000).to_string(),
        );
        assert_eq!(done["from"], "rolled-b", "{done}");
        assert_eq!(done["to"], "rolled-a", "{done}");
        let timeline = self
            .lab
            .api_json("GET", &format!("/api/v1/nodes/{}", self.uuid), None)
            .unwrap_or_else(|e| panic!("{e:#}"));
        // The reboot may cut subd's answer to the update short: the timeline is sure to
        // hold the sync that proved the machine on A, and the rollout's own entries.
        let entries: Vec<&str> = timeline["timeline"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str())
            .filter(|m| m.contains("rolled-a"))
            .collect();
        assert!(
            entries
                .iter()
                .any(|m| m.starts_with("dominator: synced to rolled-a")),
            "{entries:#?}"
        );
        println!(
            "{}: rolled from B to A by a spec change, booted A, rollout done {:.1} s after the apply; timeline:\n  {}",
            self.name(),
            started.elapsed().as_secs_f64(),
            entries.join("\n  ")
        );
        self.lab.vms[self.vm].power_off();
    }

    /// Re-images to `image` (the root is kept and becomes the object cache), prints the
    /// bytes fetched as a share of the image's bytes, then boots it.
    fn reimage(&mut self, image: &str) {
        self.lab
            .cli(&format!("node reimage {} --image {image}", self.uuid))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let started = Instant::now();
        self.power_on();
        self.wait_state("healthy", Duration::from_secs(3600));
        self.wait_exited("the rebirth's reboot", Duration::from_secs(300));
        let out = self.console();
        assert!(
            out.contains("re-image keeps the root"),
            "{}",
            tail(&out, 4000)
        );
        assert!(
            out.contains("step object_cache: done"),
            "{}",
            tail(&out, 4000)
        );
        let fetched = subd_fetched_bytes(&out)
            .unwrap_or_else(|| panic!("no `subd fetched` line:\n{}", tail(&out, 4000)));
        let total = self
            .lab
            .image_bytes(image)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let share = fetched as f64 / total as f64;
        println!(
            "{}: re-image to {image}: power-on → hand-over {:.1} s; fetched {fetched} of {total} bytes, fetched_share={share:.3}",
            self.name(),
            started.elapsed().as_secs_f64()
        );
        // B shares ~90 % of its files with A (scripts/test-images.sh): most of it must come
        // from the kept root. The issue's goal is 0.12; a share near 1 means the cache was lost.
        assert!(
            share < 0.5,
            "the re-image fetched {share:.3} of {image}'s bytes: the kept root served little"
        );
        self.boots_installed(image);
    }

    /// Cleans: the ramdisk wipes the disk and powers off; no partition table is left.
    fn clean(&mut self) {
        self.lab
            .cli(&format!("node clean {}", self.uuid))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let started = Instant::now();
        self.power_on();
        self.wait_exited(
            "the clean run to power the VM off",
            Duration::from_secs(900),
        );
        assert_eq!(self.record()["state"], "unknown", "{}", self.record());
        let disk = self.lab.dir.join(self.name()).join("disk0.img");
        let out = sh(&format!("sfdisk --json {}", disk.display())).unwrap();
        assert!(
            !out.status.success(),
            "a partition table is left: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let sigs = sh(&format!("wipefs --no-act {}", disk.display())).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&sigs.stdout).trim(),
            "",
            "signatures are left"
        );
        println!(
            "{}: clean: power-on → powered off {:.1} s, no partition table",
            self.name(),
            started.elapsed().as_secs_f64()
        );
    }
}

/// The progress bar of a machine's console page, from its HTML: the percentage, the step
/// and the sync's fetch line (when a fetch runs).
fn progress_on_page(html: &str) -> Option<(u32, String, Option<String>)> {
    fn after<'a>(from: &'a str, marker: &str) -> Option<&'a str> {
        from.find(marker).map(|i| &from[i + marker.len()..])
    }
    let bar = after(html, "id=\"run-bar\"")?;
    let value = after(bar, "value=\"")?;
    let percent = value[..value.find('"')?].parse().ok()?;
    let step = after(html, "id=\"run-step\">")?;
    let step = step[..step.find('<')?].to_string();
    let fetch = after(html, "id=\"run-fetch\">").and_then(|f| {
        let text = &f[..f.find("</p>")?];
        Some(text.replace("&nbsp;", " "))
    });
    Some((percent, step, fetch))
}

/// A blank VM is inspected and installed in the same boot (a `set-image` rule), and hands
/// over: the ramdisk reboots it.
fn install_in_one_boot(firmware: Firmware, name: &str, mac: &str, computed: bool) -> Installed {
    let a = artifacts();
    // The role loop on (image roles need no hooks; the directory is the lab's own).
    let hooks = tempfile::Builder::new()
        .prefix(&format!("paddock-hooks-{name}-"))
        .tempdir()
        .unwrap();
    let mut roles = format!(
        "[roles]\nhooks_dir = \"{}\"\nround_secs = 5\n",
        hooks.path().display()
    );
    if firmware == Firmware::UefiSecureBoot {
        roles.push_str("[boot.secure_boot]\nenabled = true\n");
    }
    let mut lab = Lab::start(name, &a, &roles).expect("lab");
    if computed {
        lab.api_json(
            "POST",
            "/api/v1/spec",
            Some(&computed_spec(None).to_string()),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
    add_image(&lab, IMAGE_A, "bootable.tar");
    lab.set_image_rule(IMAGE_A).expect("the set-image rule");
    // One vCPU: the scenarios run two VMs at once on a two-core machine, and four TCG vCPU
    // threads on two cores spent the difference waiting on each other (an install handed
    // over in 137 s with two vCPUs, in 93 s with one; the file's run 683 s → 570 s).
    // `bench/provision.sh` runs one VM at a time and keeps two.
    let spec = VmSpec {
        cpus: 1,
        ..VmSpec::provisioning(name, mac, firmware)
    };
    let vm = lab.boot(spec).expect("boot");
    let (node, enrolled) = lab
        .wait_enrolled(vm, Duration::from_secs(1200))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    println!(
        "{name}: power-on → inspected {:.1} s",
        enrolled.as_secs_f64()
    );
    let uuid = node["uuid"].as_str().unwrap().to_string();
    let next = lab
        .api_json(
            "POST",
            "/api/v1/provision/next",
            Some(&json!({"macs": [mac]}).to_string()),
        )
        .expect("provision/next");
    let hostname = next["hostname"].as_str().unwrap_or("").to_string();
    let mut installed = Installed {
        lab,
        vm,
        uuid,
        hostname,
        computed,
        _hooks: hooks,
    };
    let seen = installed.wait_installed_watching_the_page(Duration::from_secs(3600));
    let took = installed.lab.vms[vm].powered_on.elapsed();
    // The console's bar moved with the install: several values, never back.
    let percents: Vec<u32> = seen.iter().map(|p| p.0).collect();
    assert!(
        percents.windows(2).all(|w| w[0] <= w[1]) && seen.len() >= 3,
        "the machine page's progress bar did not move forward through the install: {seen:?}"
    );
    // The sync's fetch (about 500 MB, ten seconds and more) is shown as it goes: bytes of the
    // total, the rate and the time left.
    let fetching: Vec<&String> = seen.iter().filter_map(|p| p.2.as_ref()).collect();
    assert!(
        fetching
            .iter()
            .any(|f| f.contains(" of ") && f.contains("/s")),
        "the page never showed the sync's fetch with its rate: {seen:?}"
    );
    println!(
        "{name}: the machine page's progress bar read {:?}; during the sync {} fetch readings, \
         the last with a rate {:?}, then {:?}",
        seen.iter()
            .map(|p| format!("{}% {}", p.0, p.1))
            .collect::<Vec<_>>(),
        fetching.len(),
        fetching.iter().rev().find(|f| f.contains("/s")),
        fetching.last()
    );
    installed.wait_exited("the hand-over's reboot", Duration::from_secs(300));
    let out = installed.console();
    for line in ["step partition: done", "step identity: done", "hand_over"] {
        assert!(out.contains(line), "{line}: {}", tail(&out, 4000));
    }
    assert!(
        !out.contains("paddock.mode="),
        "one boot: the inspection ramdisk went on (no second boot)"
    );
    println!(
        "{name}: power-on → installed and handed over {:.1} s (one boot)",
        took.as_secs_f64()
    );
    installed
}

/// A machine's life under one firmware kind: installed with A in one boot, synced; re-imaged
/// to B keeping its root, synced; (`rolled`) with computed files from the first boot on (its
/// `/etc/hostname`, then its role's file), given an image role and rolled back to A by a
/// spec change; cleaned.
fn life(firmware: Firmware, name: &str, mac: &str, rolled: bool) {
    let mut vm = install_in_one_boot(firmware, name, mac, rolled);
    vm.boots(IMAGE_A);
    // Its computed /etc/hostname was placed in the install's sync: the first boot has it.
    let hostname = format!("{}-lab1\n", vm.hostname);
    vm.has_computed_files(&[("/etc/hostname", hostname)]);
    vm.lab.vms[vm.vm].power_off();
    add_image(&vm.lab, IMAGE_B, "bootable2.tar");
    vm.reimage(IMAGE_B);
    if rolled {
        vm.rolled_by_a_spec_change();
    }
    vm.clean();
}

#[test]
fn bios_vm_is_installed_reimaged_and_cleaned() {
    life(Firmware::Bios, "provb", "52:54:00:16:b1:01", true);
}

#[test]
fn uefi_vm_is_installed_reimaged_and_cleaned() {
    life(Firmware::Uefi, "provu", "52:54:00:16:e1:01", false);
}

/// Secure Boot, from power-on to the installed system: inspected and installed in one boot
/// through shim → GRUB; the birther installs the image's signed shim and GRUB (the firmware
/// would refuse the image it makes otherwise); the next boot's GRUB chains the disk's shim,
/// and the installed kernel runs under Secure Boot.
#[test]
fn secure_boot_vm_is_installed_and_boots_signed() {
    let mut vm = install_in_one_boot(
        Firmware::UefiSecureBoot,
        "provs",
        "52:54:00:16:5b:01",
        false,
    );
    let install = vm.console();
    assert!(
        install.contains("uefi firmware enforcing Secure Boot"),
        "{}",
        tail(&install, 4000)
    );
    vm.boots(IMAGE_A);
    let booted = vm.console();
    for said in [
        "booting from the local disk",
        "secureboot: Secure boot enabled",
        "Kernel is locked down from EFI Secure Boot",
    ] {
        assert!(booted.contains(said), "{said:?}: {}", tail(&booted, 6000));
    }
    vm.lab.vms[vm.vm].power_off();
}

#[test]
fn subd_fetch_lines_are_read() {
    assert_eq!(
        subd_fetched_bytes("x\nsubd fetched 12 objects, 3456 bytes, in 1.2 s\n"),
        Some(3456)
    );
    assert_eq!(
        subd_fetched_bytes(
            "subd fetched 1 objects, 9 bytes\nsubd fetched nothing: every object was already on the disk"
        ),
        Some(0)
    );
    assert_eq!(
        subd_fetched_bytes("subd's fetch statistics could not be read"),
        None
    );
}
