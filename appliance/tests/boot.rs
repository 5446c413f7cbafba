//! TFTP and HTTP boot with real clients (atftp, tftp-hpa, curl) against `paddock serve`.

mod support;

use support::*;

fn tftp_config(
    link: &Link,
    scratch: &Scratch,
    root: &std::path::Path,
    assets: &std::path::Path,
    max_transfers: usize,
) -> String {
    base_config(
        link,
        scratch,
        &format!(
            r#"[tftp]
listen = ["{SERVER_IP}:69"]
root = "{root}"
max_transfers = {max_transfers}
[boot.discovery]
kernel = "{PUBLIC_URL}/boot/assets/vmlinuz"
initrd = "{PUBLIC_URL}/boot/assets/initrd.img"
cmdline = "console=ttyS0"
"#,
            root = root.display()
        ),
    )
    .replace(
        "[http]\n",
        &format!("[http]\nassets_dir = \"{}\"\n", assets.display()),
    )
}

struct Setup {
    link: Link,
    scratch: Scratch,
    _app: Appliance,
}

fn setup() -> Setup {
    setup_with(8)
}

fn setup_with(max_transfers: usize) -> Setup {
    setup_config(max_transfers, "")
}

/// [`setup_with`], `extra` appended to the configuration.
fn setup_config(max_transfers: usize, extra: &str) -> Setup {
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let root = scratch.path("tftp");
    let assets = scratch.path("assets");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&assets).unwrap();
    // Files of awkward sizes: a multiple of the block size, one byte over, and a big one.
    sh_ok(&format!(
        "head -c 1048576 /dev/urandom > {r}/exact.bin && head -c 1048577 /dev/urandom > {r}/sub/over.bin && head -c 9000000 /dev/urandom > {r}/big.bin && echo secret > {s}/secret && ln -s {s}/secret {r}/leak && ln -s big.bin {r}/alias.bin && head -c 300000 /dev/urandom > {a}/vmlinuz",
        r = root.display(),
        s = scratch.0.display(),
        a = assets.display()
    ));
    link.give_client_static_address();
    let app = Appliance::start(
        &link.server,
        &scratch,
        &format!(
            "{}{extra}",
            tftp_config(&link, &scratch, &root, &assets, max_transfers)
        ),
    );
    Setup {
        link,
        scratch,
        _app: app,
    }
}

#[test]
fn atftp_and_tftp_hpa_download_exact_bytes() {
    require(&["atftp", "tftp", "curl", "ip"]);
    let s = setup();
    let root = s.scratch.path("tftp");
    let out = s.scratch.path("out.bin");
    let cases: &[(&str, &str)] = &[
        ("exact.bin", ""),
        ("sub/over.bin", ""),
        ("big.bin", ""),
        ("big.bin", "--option 'blksize 1468'"),
        (
            "big.bin",
            "--option 'blksize 1468' --option 'windowsize 16'",
        ),
        (
            "sub/over.bin",
            "--option 'blksize 8192' --option 'windowsize 4' --option 'tsize 0'",
        ),
        ("alias.bin", "--option 'blksize 1468'"),
    ];
    for (file, opts) in cases {
        let _ = std::fs::remove_file(&out);
        s.link.client.sh_ok(&format!(
            "atftp {opts} -g -r {file} -l {} {SERVER_IP}",
            out.display()
        ));
        let want = std::fs::canonicalize(root.join(file)).unwrap();
        sh_ok(&format!("cmp {} {}", want.display(), out.display()));
    }
    for file in ["exact.bin", "sub/over.bin", "big.bin"] {
        let _ = std::fs::remove_file(&out);
        s.link.client.sh_ok(&format!(
            "tftp -m binary {SERVER_IP} -c get {file} {}",
            out.display()
        ));
        sh_ok(&format!(
            "cmp {} {}",
            root.join(file).display(),
            out.display()
        ));
    }
    // Generated content served from memory: iPXE's autoexec.ipxe chains to the script.
    let _ = std::fs::remove_file(&out);
    s.link.client.sh_ok(&format!(
        "atftp -g -r autoexec.ipxe -l {} {SERVER_IP}",
        out.display()
    ));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("chain http://198.18.0.1:8080/boot/${net0/mac}.ipxe"),
        "{text}"
    );
}

/// A rack powering on at once: 1,000 real atftp processes fetch the boot loader together
/// (blksize 1468, as PXE ROMs ask), and every copy arrives byte for byte.
#[test]
fn a_thousand_concurrent_atftp_clients_all_get_exact_bytes() {
    require(&["atftp", "cmp", "ip"]);
    let s = setup_with(2048);
    let root = s.scratch.path("tftp");
    std::fs::copy("/usr/lib/ipxe/undionly.kpxe", root.join("undionly.kpxe")).unwrap();
    let out = s.scratch.path("storm");
    std::fs::create_dir_all(&out).unwrap();
    let clients = 1000;
    let started = std::time::Instant::now();
    let failed = s.link.client.sh_ok(&format!(
        "cd {out} && for i in $(seq {clients}); do \
           (atftp --option 'blksize 1468' -g -r undionly.kpxe -l $i.bin {SERVER_IP} >$i.log 2>&1 \
            || echo $i) & \
         done; wait",
        out = out.display()
    ));
    let secs = started.elapsed().as_secs_f64();
    assert!(
        failed.trim().is_empty(),
        "atftp failed for clients: {failed}"
    );
    let want = std::fs::read(root.join("undionly.kpxe")).unwrap();
    let mut exact = 0;
    for i in 1..=clients {
        let got = std::fs::read(out.join(format!("{i}.bin"))).unwrap_or_default();
        assert!(
            got == want,
            "client {i}: {} bytes, not the file's {}",
            got.len(),
            want.len()
        );
        exact += 1;
    }
    println!("tftp storm: {exact} of {clients} atftp clients got exact bytes in {secs:.2} s");
}

/// The signed chain with a real TFTP client (atftp), as shim and GRUB ask for it: shim and
/// GRUB from the packages, GRUB's first configuration, the machine's own (made when asked,
/// from its state, on the timeline) and the kernel from the assets directory.
#[test]
fn secure_boot_machines_get_the_signed_chain_and_their_own_grub_config() {
    require(&["atftp", "cmp", "curl", "ip"]);
    let shim = "/usr/lib/shim/shimx64.efi.signed";
    let grub = "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed";
    let s = setup_config(8, "[boot.secure_boot]\nenabled = true\n");
    let c = &s.link.client;
    let out = s.scratch.path("got");
    let get = |name: &str| {
        let _ = std::fs::remove_file(&out);
        c.sh_ok(&format!(
            "atftp -g -r '{name}' -l {} {SERVER_IP}",
            out.display()
        ));
        std::fs::read(&out).unwrap()
    };
    assert_eq!(get("shimx64.efi"), std::fs::read(shim).unwrap());
    assert_eq!(get("grubx64.efi"), std::fs::read(grub).unwrap());
    let chain = String::from_utf8(get("/grub/grub.cfg")).unwrap();
    assert!(
        chain.contains("configfile /grub/paddock/${grub_cpu}/${net_default_mac}.cfg"),
        "{chain}"
    );
    let mac = "52:54:00:12:34:57";
    let own = String::from_utf8(get(&format!("/grub/paddock/x86_64/{mac}.cfg"))).unwrap();
    assert!(
        own.contains("is unknown: booting the discovery ramdisk"),
        "{own}"
    );
    assert!(
        own.contains("linux '/vmlinuz' 'BOOTIF=01-52-54-00-12-34-57' "),
        "{own}"
    );
    assert!(own.contains("initrd '/initrd.img'"), "{own}");
    assert_eq!(
        get("/vmlinuz"),
        std::fs::read(s.scratch.path("assets/vmlinuz")).unwrap()
    );
    // Known and idle: GRUB hands the machine back to its firmware.
    let created: serde_json::Value = serde_json::from_str(&c.sh_ok(&format!(
        "curl -sf -X POST -H 'content-type: application/json' -d '{{\"macs\":[\"{mac}\"]}}' {PUBLIC_URL}/api/v1/nodes"
    )))
    .unwrap();
    let own = String::from_utf8(get(&format!("grub/paddock/x86_64/{mac}.cfg"))).unwrap();
    assert!(
        own.contains("--set=root; then\n  chainloader /EFI/BOOT/BOOTX64.EFI\n"),
        "{own}"
    );
    let node = c.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/api/v1/nodes/{}",
        created["uuid"].as_str().unwrap()
    ));
    assert!(
        node.contains(&format!("GRUB configuration served for {mac}: local disk")),
        "{node}"
    );
    // A name that is no MAC is no configuration, nor is a CPU this appliance boots none of
    // (arm64 is off).
    for name in [
        "grub/paddock/x86_64/nobody.cfg".to_string(),
        format!("grub/paddock/arm64/{mac}.cfg"),
    ] {
        let r = c.sh(&format!(
            "atftp -g -r {name} -l {} {SERVER_IP}",
            out.display()
        ));
        assert!(!r.status.success(), "{name}");
    }
}

#[test]
fn traversal_is_refused_with_a_tftp_error() {
    require(&["atftp", "tftp", "curl", "ip"]);
    let s = setup();
    let out = s.scratch.path("out.bin");
    for (name, reason) in [
        ("../secret", "'..' is not allowed"),
        ("sub/../../secret", "'..' is not allowed"),
        // A leading `/` names the root (as GRUB asks): nothing there.
        ("/etc/passwd", "File not found"),
        ("..\\\\secret", "backslashes are not allowed"),
        ("leak", "leads out of the TFTP root"),
        ("missing.bin", "File not found"),
    ] {
        let r = s.link.client.sh(&format!(
            "tftp -m binary {SERVER_IP} -c get '{name}' {}",
            out.display()
        ));
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(
            said.contains(reason),
            "{name}: expected {reason:?}, got {said:?}"
        );
        let got = std::fs::read(&out).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&got).contains("secret"),
            "{name} leaked the file"
        );
    }
    // Writes are refused.
    let w = s
        .link
        .client
        .sh(&format!("atftp -p -l /etc/hostname -r up.txt {SERVER_IP}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&w.stdout),
        String::from_utf8_lossy(&w.stderr)
    );
    assert!(said.contains("read-only"), "{said}");
    assert!(!s.scratch.path("tftp/up.txt").exists());
}

#[test]
fn http_boot_scripts_follow_node_state_and_assets_support_range() {
    require(&["curl", "ip"]);
    let s = setup();
    let c = &s.link.client;
    let mac = "52:54:00:12:34:56";
    let unknown = c.sh_ok(&format!("curl -sf {PUBLIC_URL}/boot/{mac}.ipxe"));
    assert!(unknown.starts_with("#!ipxe\n"), "{unknown}");
    assert!(
        unknown.contains(&format!(
            "kernel {PUBLIC_URL}/boot/assets/vmlinuz initrd=initrd BOOTIF=01-52-54-00-12-34-56"
        )),
        "{unknown}"
    );
    assert!(unknown.contains("console=ttyS0"));
    // Enrol it (no introspection): it now boots from its disk.
    let created = c.sh_ok(&format!(
        "curl -sf -X POST -H 'content-type: application/json' -d '{{\"macs\":[\"{mac}\"],\"name\":\"rack1-u7\"}}' {PUBLIC_URL}/api/v1/nodes"
    ));
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let uuid = created["uuid"].as_str().unwrap().to_string();
    let idle = c.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/boot/{}.ipxe",
        mac.to_uppercase()
    ));
    assert!(
        idle.contains("sanboot --no-describe --drive 0x80"),
        "{idle}"
    );
    // Start an introspection: the ramdisk again.
    let code = c.sh_ok(&format!(
        "curl -s -o /dev/null -w '%{{http_code}}' -X POST {PUBLIC_URL}/v1/introspection/rack1-u7"
    ));
    assert_eq!(code, "202");
    let inspecting = c.sh_ok(&format!("curl -sf {PUBLIC_URL}/boot/{mac}.ipxe"));
    assert!(
        inspecting.contains("booting the discovery ramdisk"),
        "{inspecting}"
    );
    // The timeline shows the scripts served; the same script fetched again at once (in a
    // loop, by anyone) adds no row.
    for _ in 0..3 {
        c.sh_ok(&format!(
            "curl -sf -o /dev/null {PUBLIC_URL}/boot/{mac}.ipxe"
        ));
    }
    let shown = c.sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/nodes/{uuid}"));
    assert!(
        shown.contains("boot-script") && shown.contains("introspection-started"),
        "{shown}"
    );
    let node: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let ramdisk_rows = node["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["kind"] == "boot-script"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("discovery ramdisk"))
        })
        .count();
    assert_eq!(ramdisk_rows, 1, "{shown}");
    // The same MAC cannot be enrolled twice.
    let dup = c.sh_ok(&format!(
        "curl -s -o /dev/null -w '%{{http_code}}' -X POST -H 'content-type: application/json' -d '{{\"macs\":[\"{mac}\"]}}' {PUBLIC_URL}/api/v1/nodes"
    ));
    assert_eq!(dup, "409");
    // Bad input: a clear 4xx with the error body shape.
    let bad = c.sh_ok(&format!(
        "curl -s -w ' %{{http_code}}' {PUBLIC_URL}/boot/not-a-mac.ipxe"
    ));
    assert!(
        bad.ends_with(" 400") && bad.contains("\"error\":{\"message\""),
        "{bad}"
    );
    let bad = c.sh_ok(&format!("curl -s -w ' %{{http_code}}' -X POST -H 'content-type: application/json' -d '{{\"macs\":7}}' {PUBLIC_URL}/api/v1/nodes"));
    assert!(bad.ends_with(" 400"), "{bad}");
    // Assets with Range.
    let part = s.scratch.path("part");
    let code = c.sh_ok(&format!(
        "curl -s -r 1000-1999 -o {} -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/vmlinuz",
        part.display()
    ));
    assert_eq!(code, "206");
    let whole = std::fs::read(s.scratch.path("assets/vmlinuz")).unwrap();
    assert_eq!(std::fs::read(&part).unwrap(), whole[1000..2000]);
    let code = c.sh_ok(&format!(
        "curl -s -r -100 -o {} -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/vmlinuz",
        part.display()
    ));
    assert_eq!(code, "206");
    assert_eq!(std::fs::read(&part).unwrap(), whole[whole.len() - 100..]);
    let code = c.sh_ok(&format!(
        "curl -s -r 300000- -o /dev/null -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/vmlinuz"
    ));
    assert_eq!(code, "416", "a range past the end");
    let code = c.sh_ok(&format!(
        "curl -s -o {} -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/vmlinuz",
        part.display()
    ));
    assert_eq!(
        (code.as_str(), std::fs::read(&part).unwrap() == whole),
        ("200", true)
    );
    let head = c.sh_ok(&format!("curl -s -I {PUBLIC_URL}/boot/assets/vmlinuz"));
    assert!(head.contains("content-length: 300000"), "{head}");
    std::os::unix::fs::symlink(s.scratch.path("secret"), s.scratch.path("assets/leak")).unwrap();
    let code = c.sh_ok(&format!(
        "curl -s -o /dev/null -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/leak"
    ));
    assert_eq!(code, "404", "a symlink leading out of the assets directory");
    let code = c.sh_ok(&format!(
        "curl -s --path-as-is -o /dev/null -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/../paddock.toml"
    ));
    assert_ne!(code, "200");
    let code = c.sh_ok(&format!(
        "curl -s -o /dev/null -w '%{{http_code}}' {PUBLIC_URL}/boot/assets/nope"
    ));
    assert_eq!(code, "404");
}
