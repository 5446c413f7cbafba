//! `bench/fleet.sh`'s driver: a rack refresh on one machine. `--subs N` real `paddock-subd`
//! processes, each on its own empty root under `/dev/shm` and its own address on the loopback
//! of the lab's namespace (`198.18.8.<n>`), are told at once to run the same new image, and
//! the appliance's image server delivers it to all of them; then the same bytes go to as many
//! clients the plainest way there is.
//!
//! * **paddock**: the appliance as operators run it (TLS, every subd with its own certificate
//!   from the appliance's CA), its dominator allowed to update the whole fleet at once
//!   (`max_updates` = N) with no fetch pacing. The clock starts when a new MDB file that gives
//!   every machine the image replaces the empty one (write, then rename: what an operator's
//!   tooling does) and stops when the dominator marked the last sub `synced to` it (the
//!   census's `since_ms`, the same machine's clock): fetched over HTTPS, verified, applied
//!   and proved by a scan.
//! * **nginx**: nginx serves the image's tarball over plain HTTP to N `curl | tar -x` clients
//!   started at once, each into an empty root on the same file system.
//!
//! The image is minbase's `/etc`, `/usr/bin` and `/usr/sbin` (about 30 MB; 200 copies fit in
//! memory twice over). Prints `fleet subs=N tls=on paddock_s=… nginx_s=… ratio=…`, the
//! aggregate rates, and `fleet subs=N refetched=0` when no sub fetched an object twice (each
//! sub's fetched objects, from its log, add up to the image's objects exactly).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use paddock_vm_tests::{Artifacts, Lab, SERVER_IP, certs, sh_ok};

const IMAGE: &str = "fleet/a";
/// The image's paths, from minbase.
const IMAGE_PATHS: &str = "etc usr/bin usr/sbin";
/// The images' filter and subd's exclusions (in place of its defaults), so both skip the same.
const FILTER: [&str; 3] = ["/tmp/.*", "/var/log/.*", "/var/tmp/.*"];
const PEER_PORT: u16 = 8081;

struct Sub {
    name: String,
    ip: String,
    root: PathBuf,
    log: PathBuf,
    child: Option<Stopped>,
}

/// The subds and the roots; dropping it stops them and removes the roots.
struct Fleet {
    subs: Vec<Sub>,
    roots: PathBuf,
}

impl Sub {
    fn stop(&mut self) {
        self.child = None;
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.subs.iter_mut().for_each(Sub::stop);
        let _ = std::fs::remove_dir_all(&self.roots);
    }
}

fn main() -> anyhow::Result<()> {
    let mut subs = 50usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--subs" => {
                subs = args
                    .next()
                    .context("--subs needs a number")?
                    .parse()
                    .context("--subs")?;
                if !(1..=250).contains(&subs) {
                    bail!("--subs: 1 to 250 (one /24 of loopback addresses)");
                }
            }
            "-h" | "--help" => {
                println!("paddock-fleet-bench [--subs N]   (run by bench/fleet.sh)");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; see --help"),
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let minbase = root.join("target/images/minbase");
    if !minbase.join("etc").is_dir() {
        bail!(
            "{} is missing: run scripts/test-images.sh",
            minbase.display()
        );
    }
    let paddock = std::env::var_os("PADDOCK_BIN")
        .map(PathBuf::from)
        .context("PADDOCK_BIN: the paddock binary")?;
    let subd = paddock.with_file_name("paddock-subd");
    let work = root.join("target/bench-fleet");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;

    // The image, its filter, and what it holds.
    let tar = work.join("fleet.tar");
    sh_ok(&format!(
        "tar -C {} -cf {} {IMAGE_PATHS}",
        minbase.display(),
        tar.display()
    ))?;
    let filter = work.join("filter");
    std::fs::write(&filter, FILTER.join("\n") + "\n")?;
    let objects = image_objects(&minbase)?;
    let tar_bytes = std::fs::metadata(&tar)?.len();
    println!(
        "fleet image: {objects} objects, tarball {:.1} MiB",
        tar_bytes as f64 / 1048576.0
    );

    // This bench boots no machine: the appliance serves an empty ramdisk directory.
    let ramdisk = work.join("ramdisk");
    std::fs::create_dir_all(&ramdisk)?;
    for f in ["vmlinuz", "initrd.img"] {
        std::fs::write(ramdisk.join(f), b"")?;
    }
    let artifacts = Artifacts {
        paddock: paddock.clone(),
        ramdisk_dir: ramdisk,
        ipxe_dir: PathBuf::from("/usr/lib/ipxe"),
        ovmf_code: PathBuf::new(),
        ovmf_vars: PathBuf::new(),
        ovmf_secure_code: PathBuf::new(),
        ovmf_secure_vars: PathBuf::new(),
        aavmf_code: PathBuf::new(),
        aavmf_vars: PathBuf::new(),
    };
    let mdb = work.join("mdb.json");
    std::fs::write(&mdb, "[]\n")?;
    let subs_dir = work.join("subs");
    std::fs::create_dir_all(&subs_dir)?;
    let names: Vec<(String, String)> = (0..subs)
        .map(|i| (format!("sub{i:03}"), format!("198.18.8.{}", i + 1)))
        .collect();
    let extra = format!(
        "[dominator]\nmax_updates = {subs}\nfetch_speed_percent = 100\n\
         [images]\nmdb_file = \"{}\"\nmdb_poll_secs = 1\n",
        mdb.display()
    );
    let started = Instant::now();
    let lab = Lab::start_prepared("fleet", &artifacts, &extra, &|lab| {
        // Every subd's own certificate, as a birth gives it one (issued before `serve`).
        for (name, ip) in &names {
            certs(
                &lab.ns,
                &paddock,
                &lab.config,
                &format!(
                    "issue {name} --role subd --san {ip} --out {}",
                    subs_dir.display()
                ),
            )?;
        }
        Ok(())
    })?;
    let certs_dir = lab.certs.clone().context("the lab runs TLS")?;
    let client_ca = subs_dir.join("clients.pem");
    std::fs::write(
        &client_ca,
        std::fs::read_to_string(certs_dir.join("ca.pem"))?
            + &std::fs::read_to_string(certs_dir.join("subd-ca.pem"))?,
    )?;
    lab.add_image(IMAGE, &tar, &filter)?;
    println!(
        "fleet: appliance, {subs} certificates and the image in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The subds, on empty roots.
    let mut batch = String::new();
    for (_, ip) in &names {
        writeln!(batch, "addr add {ip}/32 dev lo")?;
    }
    let batch_file = work.join("addresses");
    std::fs::write(&batch_file, batch)?;
    sh_ok(&format!("ip -n {} -batch {}", lab.ns, batch_file.display()))?;
    let roots = Path::new("/dev/shm").join(format!("paddock-fleet-{}", lab.tag));
    let mut fleet = Fleet {
        subs: Vec::new(),
        roots: roots.clone(),
    };
    for (name, ip) in &names {
        let root = roots.join(name);
        std::fs::create_dir_all(&root)?;
        let log = subs_dir.join(format!("{name}.log"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &lab.ns])
            .arg(&subd)
            .env("PADDOCK_LOG", "info")
            .arg("--root")
            .arg(&root)
            .args(["--listen", &format!("{ip}:6969")])
            .arg("--ca")
            .arg(certs_dir.join("ca.pem"))
            .arg("--client-ca")
            .arg(&client_ca)
            .arg("--cert")
            .arg(subs_dir.join(format!("{name}.pem")))
            .arg("--key")
            .arg(subs_dir.join(format!("{name}.key")))
            .args([
                "--trigger-command",
                "/bin/true",
                "--reboot-command",
                "/bin/true",
            ])
            // Scans as subd runs them by default (a cycle of at least 1 s, paced); the
            // speeds are given rather than measured by each of N subds at start.
            .args(["--device-speed", "1073741824", "--link-speed", "1073741824"]);
        for f in FILTER {
            cmd.args(["--exclude", f]);
        }
        let out = std::fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting paddock-subd")?;
        fleet.subs.push(Sub {
            name: name.clone(),
            ip: ip.clone(),
            root,
            log,
            child: Some(Stopped(child)),
        });
    }
    wait_until("every subd listening", Duration::from_secs(60), || {
        Ok(fleet.subs.iter().all(|s| {
            std::fs::read_to_string(&s.log)
                .unwrap_or_default()
                .contains("paddock-subd: listening on")
        }))
    })?;

    // Paddock: every machine gets the image at once.
    let machines: Vec<serde_json::Value> = fleet
        .subs
        .iter()
        .map(|s| serde_json::json!({"Hostname": s.name, "IpAddress": s.ip, "RequiredImage": IMAGE}))
        .collect();
    let next = work.join("mdb.json.new");
    std::fs::write(&next, serde_json::to_vec_pretty(&machines)?)?;
    let t0 = Instant::now();
    let t0_ms = paddock_wire::unix_ms();
    std::fs::rename(&next, &mdb)?;
    let want = format!("synced to {IMAGE}");
    let mut last_report = Instant::now();
    let mut synced_at_ms = 0i64;
    wait_until("every sub synced", Duration::from_secs(1800), || {
        // A busy appliance may answer late: an error is reported, and the wait goes on.
        let list = match lab.api_json("GET", "/rpc/Dominator.ListSubs", None) {
            Ok(v) => v,
            Err(e) => {
                println!(
                    "fleet: ListSubs after {:.0} s: {e:#}",
                    t0.elapsed().as_secs_f64()
                );
                return Ok(false);
            }
        };
        let subs_now = list.as_array().cloned().unwrap_or_default();
        let synced = subs_now
            .iter()
            .filter(|s| s["summary"] == want.as_str())
            .count();
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            println!(
                "fleet: {synced} of {subs} synced after {:.0} s",
                t0.elapsed().as_secs_f64()
            );
        }
        if synced == subs {
            synced_at_ms = subs_now
                .iter()
                .filter_map(|s| s["since_ms"].as_i64())
                .max()
                .unwrap_or(0);
        }
        Ok(synced == subs)
    })?;
    // The clock stops when the dominator marked the last sub synced (its census says
    // when), not when this loop, asking every quarter second, next looked.
    let seen_s = t0.elapsed().as_secs_f64();
    let paddock_s = if synced_at_ms > t0_ms {
        (synced_at_ms - t0_ms) as f64 / 1000.0
    } else {
        seen_s
    };
    println!("fleet subs={subs} paddock_seen_s={seen_s:.2} (when this loop saw it)");

    // What each sub fetched, from its own log.
    let mut fetched_bytes = 0u64;
    let mut refetched = Vec::new();
    for s in &fleet.subs {
        let (n, bytes) = fetched(&std::fs::read_to_string(&s.log)?);
        fetched_bytes += bytes;
        if n != objects {
            refetched.push(format!("{} fetched {n} objects of {objects}", s.name));
        }
    }
    fleet.subs.iter_mut().for_each(Sub::stop);
    for s in &fleet.subs {
        let _ = std::fs::remove_dir_all(&s.root);
    }

    // nginx: the tarball to as many `curl | tar -x` clients at once.
    let peer_roots: Vec<PathBuf> = (0..subs)
        .map(|i| roots.join(format!("peer{i:03}")))
        .collect();
    let nginx_s = nginx_peer(&lab.ns, &work, &tar, &peer_roots)?;
    let peer_bytes = tar_bytes * subs as u64;
    drop(fleet);

    println!(
        "fleet subs={subs} paddock_MiB_per_s={:.0} nginx_MiB_per_s={:.0} (image bytes fetched \
         by the subs, tarball bytes served by nginx)",
        fetched_bytes as f64 / 1048576.0 / paddock_s,
        peer_bytes as f64 / 1048576.0 / nginx_s
    );
    println!(
        "fleet subs={subs} tls=on paddock_s={paddock_s:.1} nginx_s={nginx_s:.1} ratio={:.2}",
        paddock_s / nginx_s
    );
    if refetched.is_empty() {
        println!(
            "fleet subs={subs} refetched=0 (every sub fetched each of the {objects} objects once)"
        );
        Ok(())
    } else {
        println!("fleet subs={subs} refetched={}", refetched.len());
        bail!("objects fetched more than once:\n{}", refetched.join("\n"))
    }
}

/// The peer: nginx serving `tar` in namespace `ns` to a `curl | tar -x` client per root, all
/// started at once; the seconds until the last is done. nginx is stopped on every path.
fn nginx_peer(ns: &str, work: &Path, tar: &Path, roots: &[PathBuf]) -> anyhow::Result<f64> {
    let www = work.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::hard_link(tar, www.join("fleet.tar"))
        .or_else(|_| std::fs::copy(tar, www.join("fleet.tar")).map(|_| ()))?;
    let conf = work.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes auto;\npid {w}/nginx.pid;\nerror_log {w}/nginx-error.log;\n\
             daemon off;\nevents {{ worker_connections 8192; }}\nhttp {{\n  access_log off;\n  \
             sendfile on;\n  tcp_nopush on;\n  server {{ listen {SERVER_IP}:{PEER_PORT}; root {www}; }}\n}}\n",
            w = work.display(),
            www = www.display()
        ),
    )?;
    let nginx = Command::new("ip")
        .args(["netns", "exec", ns, "nginx", "-c"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.join("nginx.log"))?)
        .spawn()
        .context("starting nginx")?;
    let _nginx = Stopped(nginx);
    let url = format!("http://{SERVER_IP}:{PEER_PORT}/fleet.tar");
    wait_until("nginx serving", Duration::from_secs(20), || {
        Ok(Command::new("ip")
            .args(["netns", "exec", ns, "curl", "-sfo", "/dev/null", &url])
            .status()?
            .success())
    })?;
    for r in roots {
        std::fs::create_dir_all(r)?;
    }
    let t = Instant::now();
    let clients: Vec<Child> = roots
        .iter()
        .map(|r| {
            Command::new("ip")
                .args(["netns", "exec", ns, "sh", "-c"])
                .arg(format!("curl -sf {url} | tar -x -C {}", r.display()))
                .stdin(Stdio::null())
                .spawn()
                .context("starting a curl client")
        })
        .collect::<anyhow::Result<_>>()?;
    let mut failed = 0;
    for mut c in clients {
        if !c.wait()?.success() {
            failed += 1;
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    if failed > 0 {
        bail!("{failed} of {} curl | tar clients failed", roots.len());
    }
    Ok(seconds)
}

/// A child process killed and reaped when dropped.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The distinct objects of the image: the SHA-512s of its non-empty regular files.
fn image_objects(minbase: &Path) -> anyhow::Result<u64> {
    let out = sh_ok(&format!(
        "cd {} && find {IMAGE_PATHS} -type f -size +0 -print0 | xargs -0 sha512sum | cut -d' ' -f1 | sort -u | wc -l",
        minbase.display()
    ))?;
    out.trim().parse().context("counting the image's objects")
}

/// The objects and bytes a subd's log says it fetched, over all its fetches.
fn fetched(log: &str) -> (u64, u64) {
    let field = |line: &str, key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    log.lines()
        .filter(|l| l.contains(" fetched ") || l.contains(" fetch failed"))
        .map(strip_ansi)
        .filter(|l| l.contains("objects="))
        .fold((0, 0), |(n, b), l| {
            (n + field(&l, "objects="), b + field(&l, "bytes="))
        })
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
