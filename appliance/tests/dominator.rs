//! The dominator in a running appliance against real `paddock-subd` processes: every sub
//! is a copy of the Debian minbase tree (`target/images`, from `scripts/test-images.sh`)
//! served by its own subd on a loopback address of the appliance's namespace
//! (`127.0.0.<n>:6969`). The fleet converges to a new image with at most `max_updates`
//! fetching or updating at once, drift is undone, an unsafe image is held until cleared,
//! a pause holds every update, and a `kill -9` of the appliance mid-update, or of a subd
//! mid-fetch, still ends converged.
//!
//! Sub roots live under `/dev/shm` (tmpfs): twenty copies of minbase take about 9 s there
//! and 30 s on the disk. The tests run one at a time (each starts its own fleet).

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// One fleet at a time: twenty subds hashing on two cores is all the machine has.
static SERIAL: Mutex<()> = Mutex::new(());

const POLL_MS: u64 = 200;
const MAX_UPDATES: usize = 3;

/// The images' filter, and subd's exclusions (`--exclude`, in place of its defaults), so both
/// ignore the same paths.
const FILTER: [&str; 3] = ["/tmp/.*", "/var/log/.*", "/var/tmp/.*"];

fn images_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/images")
}

/// `paddock-subd` beside the `paddock` binary cargo built for this test.
fn subd_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_paddock")).with_file_name("paddock-subd");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p paddock-subd` first",
        bin.display()
    );
    bin
}

/// Runs `f` on a thread that has entered the namespace `ns`.
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns file");
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("thread in the namespace")
    })
}

fn agent() -> ureq::Agent {
    paddock_client::Builder::new()
        .timeout(Duration::from_secs(30))
        .agent()
}

/// A call from inside `ns`: the status and the JSON answer (`null` if none).
fn call(ns: &str, method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    in_ns(ns, || {
        let a = agent();
        let resp = match body {
            Some(b) => a.post(url).send_json(&b),
            None if method == "POST" => a.post(url).send_empty(),
            None => a.get(url).call(),
        }
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.into_body().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    })
}

/// One real subd.
struct Subd {
    host: String,
    ip: String,
    root: PathBuf,
    child: Option<Child>,
}

/// The appliance, its namespace and the subds in it.
struct Fleet {
    subs: Vec<Subd>,
    app: Appliance,
    roots: PathBuf,
    scratch: Scratch,
    link: Link,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.subs {
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.app.kill9();
        if std::thread::panicking() {
            for s in &self.subs {
                let log = self.scratch.path(&format!("{}.log", s.host));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                eprintln!("--- {} (last lines, newest first) ---", s.host);
                for l in tail {
                    eprintln!("{l}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.roots);
    }
}

impl Fleet {
    /// An appliance with minbase (and `more` images) added, and `n` subds on copies of
    /// minbase, none in the MDB yet.
    fn start(n: usize, more: &[(&str, &Path)], subd_args: &str) -> Fleet {
        Fleet::start_with(n, more, subd_args, "")
    }

    /// [`Fleet::start`] with `extra` added to the appliance's configuration (a section
    /// after `[dominator]`).
    fn start_with(n: usize, more: &[(&str, &Path)], subd_args: &str, extra: &str) -> Fleet {
        require(&["curl", "ip", "cp", "tar"]);
        let dir = images_dir();
        assert!(
            dir.join("minbase2.tar").exists() && dir.join("minbase2/etc").is_dir(),
            "{} is missing: run scripts/test-images.sh (scripts/test.sh does)",
            dir.display()
        );
        let bin = subd_bin();
        let link = Link::new();
        let scratch = Scratch::new(&link.tag);
        let shm = Path::new("/dev/shm");
        let roots = if shm.is_dir() {
            shm.join(format!("paddock-dominator-{}", link.tag))
        } else {
            scratch.path("roots")
        };
        let _ = std::fs::remove_dir_all(&roots);
        std::fs::create_dir_all(&roots).unwrap();
        // 100 % means unlimited; a test that slows the subds' link (`--link-speed`) wants
        // its fetches paced to it.
        let fetch_percent = if subd_args.contains("--link-speed") {
            99
        } else {
            100
        };
        let config = base_config(
            &link,
            &scratch,
            &format!(
                "[tftp]\nenabled = false\n[dominator]\nsubd_port = 6969\nmax_updates = \
                 {MAX_UPDATES}\npoll_interval_ms = {POLL_MS}\nfetch_speed_percent = \
                 {fetch_percent}\n{extra}"
            ),
        );
        let app = Appliance::start(&link.server, &scratch, &config);
        let mut fleet = Fleet {
            subs: Vec::new(),
            app,
            roots,
            scratch,
            link,
        };
        let t = Instant::now();
        fleet.add_image("minbase", &dir.join("minbase.tar"));
        for (name, tar) in more {
            fleet.add_image(name, tar);
        }
        println!("images added in {:.1} s", t.elapsed().as_secs_f64());

        let t = Instant::now();
        for i in 0..n {
            let root = fleet.roots.join(format!("sub{i:02}"));
            sh_ok(&format!(
                "cp -a {} {}",
                dir.join("minbase").display(),
                root.display()
            ));
            fleet.subs.push(Subd {
                host: format!("sub{i:02}"),
                ip: format!("127.0.0.{}", i + 2),
                root,
                child: None,
            });
        }
        println!(
            "{n} copies of minbase in {} in {:.1} s",
            fleet.roots.display(),
            t.elapsed().as_secs_f64()
        );
        for i in 0..n {
            fleet.start_subd(i, &bin, subd_args);
        }
        for i in 0..n {
            let log = fleet.scratch.path(&format!("{}.log", fleet.subs[i].host));
            wait_long(&format!("{} to listen", fleet.subs[i].host), 30, || {
                std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("paddock-subd: listening on")
            });
        }
        fleet
    }

    /// [`Fleet::start`] with minbase2 added and `n` subs synced to minbase.
    fn on_minbase(n: usize, subd_args: &str) -> Fleet {
        let m2 = images_dir().join("minbase2.tar");
        let fleet = Fleet::start(n, &[("minbase2", &m2)], subd_args);
        fleet.require_image("minbase");
        fleet.wait_all("synced to minbase", 120);
        fleet
    }

    fn start_subd(&mut self, i: usize, bin: &Path, extra: &str) {
        let s = &self.subs[i];
        // A test may slow the link (`--link-speed` in `extra`) to catch a fetch running.
        let link = if extra.contains("--link-speed") {
            ""
        } else {
            "--link-speed 1073741824"
        };
        // `{host}` in `extra` is the sub's name (a trigger command that logs per sub).
        let cmd = format!(
            "env PADDOCK_LOG=info {} --insecure --root {} --listen {}:6969 \
             --trigger-command /bin/true --reboot-command /bin/true \
             --device-speed 1073741824 {link} --min-cycle-ms 100 {}",
            bin.display(),
            s.root.display(),
            s.ip,
            extra.replace("{host}", &s.host)
        );
        let cmd = FILTER
            .iter()
            .fold(cmd, |c, f| format!("{c} --exclude '{f}'"));
        let log = self.scratch.path(&format!("{}.log", s.host));
        let child = self.link.server.spawn(&cmd, &log);
        self.subs[i].child = Some(child);
    }

    fn ns(&self) -> &str {
        &self.link.server.name
    }

    fn add_image(&self, name: &str, tar: &Path) {
        self.add_image_with(name, tar, "");
    }

    /// [`Fleet::add_image`] with more arguments to `paddock image add` (`--triggers F`).
    fn add_image_with(&self, name: &str, tar: &Path, args: &str) {
        let filter = self.scratch.path("filter");
        std::fs::write(&filter, FILTER.join("\n") + "\n").unwrap();
        self.link.server.sh_ok(&format!(
            "PADDOCK_API={PUBLIC_URL} {} image add {name} {} --filter {} {args}",
            env!("CARGO_BIN_EXE_paddock"),
            tar.display(),
            filter.display()
        ));
    }

    fn api(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = call(self.ns(), method, &format!("{PUBLIC_URL}{path}"), body);
        assert_eq!(status, 200, "{method} {path}: {v}");
        v
    }

    /// Sets every sub's machine in the MDB with this required image.
    fn require_image(&self, image: &str) {
        for s in &self.subs {
            self.require_image_of(s, image);
        }
    }

    fn require_image_of(&self, s: &Subd, image: &str) {
        self.api(
            "POST",
            "/rpc/Mdb.SetMachine",
            Some(json!({"Hostname": s.host, "IpAddress": s.ip, "RequiredImage": image})),
        );
    }

    /// hostname → (state, summary).
    fn census(&self) -> BTreeMap<String, (String, String)> {
        let v = self.api("GET", "/rpc/Dominator.ListSubs", None);
        v.as_array()
            .unwrap_or_else(|| panic!("ListSubs: {v}"))
            .iter()
            .map(|s| {
                let get = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                (get("hostname"), (get("state"), get("summary")))
            })
            .collect()
    }

    /// Waits until every sub's summary is `summary`; the time it took.
    fn wait_all(&self, summary: &str, secs: u64) -> Duration {
        let t = Instant::now();
        let mut last = BTreeMap::new();
        while t.elapsed() < Duration::from_secs(secs) {
            last = self.census();
            if last.len() == self.subs.len() && last.values().all(|(_, s)| s == summary) {
                return t.elapsed();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("not every sub is {summary:?} after {secs} s: {last:#?}");
    }

    /// Whether each subd says a fetch or an update is running (short polls, no tree), all
    /// asked at once so the answers are one instant's.
    fn busy_on_subs(&self) -> Vec<bool> {
        let ns = self.ns();
        std::thread::scope(|scope| {
            let asks: Vec<_> = self
                .subs
                .iter()
                .map(|s| {
                    let url = format!("http://{}:6969/rpc/Subd.Poll", s.ip);
                    scope.spawn(move || {
                        let body = json!({"have_generation": 0, "short_poll_only": true});
                        let (_, v) = call(ns, "POST", &url, Some(body));
                        v["fetch_in_progress"] == true || v["update_in_progress"] == true
                    })
                })
                .collect();
            asks.into_iter()
                .map(|a| a.join().unwrap_or(false))
                .collect()
        })
    }

    /// The most fetches that ran at once, from the subds' logs (each `fetched` line has
    /// its end time and its length).
    fn max_concurrent_fetches(&self) -> (usize, usize) {
        let mut edges = Vec::new();
        for s in &self.subs {
            let log = std::fs::read_to_string(self.scratch.path(&format!("{}.log", s.host)))
                .unwrap_or_default();
            for line in log.lines().map(without_colours) {
                if !line.contains(" fetched ") {
                    continue;
                }
                let Some(end) = line.split_whitespace().next().and_then(unix_secs) else {
                    continue;
                };
                let secs: f64 = line
                    .split("seconds=")
                    .nth(1)
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
                edges.push((end - secs, 1i32));
                edges.push((end, -1));
            }
        }
        edges.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let (mut now, mut max) = (0i32, 0i32);
        for (_, d) in &edges {
            now += d;
            max = max.max(now);
        }
        (edges.len() / 2, max as usize)
    }
}

/// `2026-11-23T23:45:03.855274Z` → seconds since the epoch.
fn unix_secs(ts: &str) -> Option<f64> {
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let t: Vec<f64> = time
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let (y, m, day) = (d[0] - i64::from(d[1] <= 2), d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days as f64 * 86_400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2])
}

#[track_caller]
fn wait_long(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

/// What a tree holds, path by path, outside the filter and `/.subd`: kind, mode, owner,
/// and the bytes of a file or the target of a symlink.
fn tree(root: &Path) -> BTreeMap<String, (u32, u32, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
            if rel == "/.subd" || filtered(&rel) {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let data = if m.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if m.file_type().is_file() {
                std::fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push(p);
            }
            out.insert(rel, (m.mode(), m.uid(), m.gid(), data));
        }
    }
    out
}

/// The filter's lines are all `<dir>/.*`.
fn filtered(rel: &str) -> bool {
    FILTER
        .iter()
        .any(|f| rel.starts_with(f.trim_end_matches(".*")))
}

#[track_caller]
fn assert_same_tree(root: &Path, want: &BTreeMap<String, (u32, u32, u32, Vec<u8>)>, name: &str) {
    let got = tree(root);
    let differ: Vec<&String> = want
        .keys()
        .chain(got.keys())
        .filter(|k| want.get(*k) != got.get(*k))
        .take(10)
        .collect();
    assert!(
        differ.is_empty(),
        "{} differs from {name} ({} paths vs {}), first: {differ:?}",
        root.display(),
        got.len(),
        want.len()
    );
}

#[test]
fn twenty_subs_converge_to_minbase2_with_at_most_n_updating() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let m2 = images_dir().join("minbase2.tar");
    let fleet = Fleet::start(20, &[("minbase2", &m2)], "");
    // sub00 is also a node (of the same name), so the dominator files its changes on
    // that node's timeline.
    let (status, node) = call(
        fleet.ns(),
        "POST",
        &format!("{PUBLIC_URL}/api/v1/nodes"),
        Some(json!({"macs": ["52:54:00:d0:00:00"], "name": "sub00"})),
    );
    assert!((200..300).contains(&status), "{status} {node}");
    let t = Instant::now();
    fleet.require_image("minbase");
    let d = fleet.wait_all("synced to minbase", 360);
    println!("20 subs synced to minbase in {:.1} s", d.as_secs_f64());

    fleet.require_image("minbase2");
    let t2 = Instant::now();
    let (mut max_census, mut max_subd, mut samples) = (0usize, 0usize, 0u32);
    loop {
        let census = fleet.census();
        let active = census
            .values()
            .filter(|(state, _)| state == "fetching" || state == "updating")
            .count();
        // The subds are asked every fourth sample (200 ms): twenty polls at once cost.
        let on_subs = if samples % 4 == 0 {
            fleet.busy_on_subs().into_iter().filter(|b| *b).count()
        } else {
            0
        };
        max_census = max_census.max(active);
        max_subd = max_subd.max(on_subs);
        samples += 1;
        if census.len() == 20 && census.values().all(|(_, s)| s == "synced to minbase2") {
            break;
        }
        assert!(
            t2.elapsed() < Duration::from_secs(600),
            "not converged to minbase2 after 600 s: {census:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "20 subs converged to minbase2 in {:.1} s ({samples} samples); at once at most: \
         {max_census} fetching or updating in ListSubs, {max_subd} fetching or updating on \
         the subds (max_updates = {MAX_UPDATES}); {:.1} s in all",
        t2.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    let (fetches, max_fetches) = fleet.max_concurrent_fetches();
    println!("from the subds' logs: {fetches} fetches, at most {max_fetches} at once");
    assert_eq!(fetches, 20, "one fetch per sub");
    assert!(max_fetches <= MAX_UPDATES, "{max_fetches} fetches at once");
    assert!(max_subd >= 1, "no fetch or update was ever seen running");
    assert!(
        max_subd <= MAX_UPDATES,
        "{max_subd} subds fetched or updated at once"
    );
    // Subs waiting for an update slot show `queued`: only those holding one show
    // fetching or updating.
    assert!(
        (1..=MAX_UPDATES).contains(&max_census),
        "ListSubs showed {max_census} subs fetching or updating at once"
    );

    // The change that proved sub00 synced to minbase2 is on its node's timeline with what
    // the update did: the plan, the bytes fetched, the change window, the triggers.
    // The timeline is written after the census shows the change (a task of its own): it
    // is waited for, not read once.
    let mut entries = Vec::new();
    let mut done = String::new();
    let found = (0..100).any(|_| {
        entries = dominator_timeline(&fleet, "sub00");
        match entries.iter().find(|m| m.contains("updated to minbase2")) {
            Some(m) => {
                done = m.clone();
                true
            }
            None => {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        }
    });
    assert!(found, "no update on sub00's timeline: {entries:#?}");
    println!("sub00's timeline: {done}");
    assert!(
        done.starts_with("dominator: synced to minbase2; updated to minbase2: plan: "),
        "{done}"
    );
    assert!(
        done.contains(" MB) fetched in ")
            && !done.contains(" 0 objects (0.0 MB) fetched")
            && done.contains("change window ")
            && done.contains("triggers"),
        "{done}"
    );

    let want = tree(&images_dir().join("minbase2"));
    assert!(want.len() > 3000, "{}", want.len());
    let t = Instant::now();
    for s in &fleet.subs {
        assert_same_tree(&s.root, &want, "minbase2");
    }
    println!(
        "every root equals minbase2 ({} paths each, compared byte for byte in {:.1} s)",
        want.len(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn a_file_changed_by_hand_is_restored_within_a_poll_cycle() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fleet = Fleet::start(2, &[], "--scan-percent 100 --cpu-percent 100");
    fleet.require_image("minbase");
    fleet.wait_all("synced to minbase", 120);
    let (root, other) = (&fleet.subs[0].root, &fleet.subs[1].root);
    let path = root.join("etc/debian_version");
    let want = std::fs::read(&path).unwrap();
    let before_other = tree(other);

    let t = Instant::now();
    std::fs::write(&path, b"changed by hand\n").unwrap();
    let took = wait_long("/etc/debian_version to be restored", 30, || {
        std::fs::read(&path).unwrap_or_default() == want
    });
    println!(
        "a changed /etc/debian_version was restored in {:.2} s (poll interval {POLL_MS} ms)",
        took.as_secs_f64()
    );
    // A removed file comes back too.
    let gone = root.join("usr/bin/ls");
    let ls = std::fs::read(&gone).unwrap();
    std::fs::remove_file(&gone).unwrap();
    let took2 = wait_long("/usr/bin/ls to come back", 30, || {
        std::fs::read(&gone).unwrap_or_default() == ls
    });
    println!(
        "a removed /usr/bin/ls came back in {:.2} s",
        took2.as_secs_f64()
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(
        std::fs::metadata(&gone).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    fleet.wait_all("synced to minbase", 30);
    // The other sub was left alone.
    assert_same_tree(other, &before_other, "its own earlier self");
}

#[test]
fn an_unsafe_image_is_held_until_cleared() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // A tiny full image: /etc/passwd, /usr/bin and little else.
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("tree");
    for d in ["etc", "usr/bin"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    std::fs::write(t.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(t.join("etc/hostname"), "tiny\n").unwrap();
    let tar = tmp.path().join("tiny.tar");
    sh_ok(&format!(
        "tar -C {} --owner=0 --group=0 -cf {} .",
        t.display(),
        tar.display()
    ));
    let fleet = Fleet::start(1, &[("tiny", &tar)], "--scan-percent 100 --cpu-percent 100");
    let s = &fleet.subs[0];
    fleet.require_image("minbase");
    fleet.wait_all("synced to minbase", 120);
    let before = tree(&s.root).len();

    fleet.require_image("tiny");
    let mut summary = String::new();
    wait_long("the unsafe hold", 30, || {
        let c = fleet.census();
        let (state, sum) = c[&s.host].clone();
        summary = sum;
        state == "unsafe_update"
    });
    println!("held: {summary}");
    assert!(
        summary.contains("fewer than half") || summary.contains("more than half"),
        "{summary}"
    );
    let sub = fleet.api(
        "GET",
        &format!("/rpc/Dominator.GetSub?hostname={}", s.host),
        None,
    );
    assert_eq!(sub["state"], "unsafe_update", "{sub}");
    assert!(
        sub["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{sub}"
    );
    // Held for several cycles: nothing on disk changes.
    std::thread::sleep(Duration::from_millis(POLL_MS * 10));
    assert_eq!(fleet.census()[&s.host].0, "unsafe_update");
    assert_eq!(tree(&s.root).len(), before, "the root changed while held");
    assert!(s.root.join("etc/debian_version").exists());

    let r = fleet.api(
        "POST",
        "/rpc/Dominator.ClearSafety",
        Some(json!({"hostname": s.host})),
    );
    assert_eq!(r["safety_clearance"], 1, "{r}");
    let took = fleet.wait_all("synced to tiny", 60);
    println!("cleared: synced to tiny in {:.1} s", took.as_secs_f64());
    // The directories the filter says may hold filtered paths stay, whatever the image has
    // (their filtered contents are the machine's); the rest is the image.
    let mut got = tree(&s.root);
    for kept in ["/tmp", "/var", "/var/log", "/var/tmp"] {
        let dir = got.remove(kept).map(|(mode, ..)| mode & 0o170000);
        assert_eq!(dir, Some(0o040000), "{kept} is not kept as a directory");
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        tree(&t).keys().collect::<Vec<_>>()
    );
    assert_eq!(got, tree(&t), "the root is not tiny");
}

#[test]
fn pause_stops_all_updates_within_one_cycle() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fleet = Fleet::on_minbase(3, "--scan-percent 100 --cpu-percent 100");

    let p = fleet.api(
        "POST",
        "/rpc/Dominator.Pause",
        Some(json!({"reason": "change freeze"})),
    );
    assert_eq!(p["reason"], "change freeze", "{p}");
    let status = fleet.api("GET", "/rpc/Dominator.Status", None);
    assert_eq!(status["paused"]["reason"], "change freeze", "{status}");
    // Drift on one sub, a new image for the other two.
    let drift = fleet.subs[0].root.join("etc/debian_version");
    std::fs::write(&drift, b"drifted\n").unwrap();
    for s in &fleet.subs[1..] {
        fleet.require_image_of(s, "minbase2");
    }
    // Every sub reaches `updates_disabled`; none fetches or updates. A held sub is planned
    // again every poll interval (its full tree each time), so it shows `computing` now
    // and then: counted, not refused.
    let t = Instant::now();
    let held = "updates disabled: the dominator is paused: change freeze";
    let mut seen: BTreeMap<String, Duration> = BTreeMap::new();
    let (mut samples, mut computing) = (0u32, 0u32);
    let watch = |seen: &mut BTreeMap<String, Duration>, samples: &mut u32, computing: &mut u32| {
        for (host, (state, summary)) in fleet.census() {
            assert!(
                !["fetching", "updating", "waiting_for_scan"].contains(&state.as_str()),
                "{host} is {summary} while paused"
            );
            if summary == held {
                seen.entry(host).or_insert(t.elapsed());
            }
            *computing += u32::from(state == "computing");
        }
        *samples += 1;
    };
    while seen.len() < fleet.subs.len() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "not every sub showed {held:?} in 30 s: {seen:?}"
        );
        watch(&mut seen, &mut samples, &mut computing);
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("after the pause, each sub first showed updates_disabled at: {seen:?}");
    let trees: Vec<_> = fleet.subs.iter().map(|s| tree(&s.root)).collect();
    let hold = Instant::now();
    while hold.elapsed() < Duration::from_millis(POLL_MS * 15) {
        watch(&mut seen, &mut samples, &mut computing);
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "paused {:.1} s: {samples} census samples, {computing} sub-samples `computing` \
         (held subs are re-planned every cycle)",
        t.elapsed().as_secs_f64()
    );
    for (s, before) in fleet.subs.iter().zip(&trees) {
        assert_same_tree(&s.root, before, "itself before the pause");
    }
    assert_eq!(std::fs::read(&drift).unwrap(), b"drifted\n");

    fleet.api("POST", "/rpc/Dominator.Resume", None);
    let t = Instant::now();
    wait_long("convergence after resume", 120, || {
        let c = fleet.census();
        c[&fleet.subs[0].host].1 == "synced to minbase"
            && fleet.subs[1..]
                .iter()
                .all(|s| c[&s.host].1 == "synced to minbase2")
    });
    println!("resumed: converged in {:.1} s", t.elapsed().as_secs_f64());
    assert_ne!(std::fs::read(&drift).unwrap(), b"drifted\n");
    let want = tree(&images_dir().join("minbase2"));
    for s in &fleet.subs[1..] {
        assert_same_tree(&s.root, &want, "minbase2");
    }
}

#[test]
fn kill9_of_the_appliance_during_an_update_ends_converged() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut fleet = Fleet::on_minbase(4, "--scan-percent 100 --cpu-percent 100");
    fleet.require_image("minbase2");
    wait_long("a fetch or an update on a subd", 60, || {
        fleet.busy_on_subs().into_iter().any(|b| b)
    });
    let before = fleet.census();
    fleet.app.kill9();
    println!("killed the appliance with {before:?}");
    let Fleet { app, link, .. } = &mut fleet;
    app.restart(&link.server);
    let took = fleet.wait_all("synced to minbase2", 480);
    println!(
        "after the restart every sub converged in {:.1} s",
        took.as_secs_f64()
    );
    let want = tree(&images_dir().join("minbase2"));
    for s in &fleet.subs {
        assert_same_tree(&s.root, &want, "minbase2");
    }
}

#[test]
fn kill9_of_a_subd_during_a_fetch_ends_converged() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let m2 = images_dir().join("minbase2.tar");
    // 500 kB/s, fetched at 99 % of it: minbase2's 15 MB of new objects take about 30 s.
    let args = "--scan-percent 100 --cpu-percent 100 --link-speed 500000";
    let mut fleet = Fleet::start(2, &[("minbase2", &m2)], args);
    fleet.require_image("minbase");
    fleet.wait_all("synced to minbase", 120);
    fleet.require_image("minbase2");
    let victim = fleet.subs[0].ip.clone();
    let ns = fleet.ns().to_string();
    wait_long("a fetch running on sub00", 120, || {
        let body = json!({"have_generation": 0, "short_poll_only": true});
        let url = format!("http://{victim}:6969/rpc/Subd.Poll");
        let (_, v) = call(&ns, "POST", &url, Some(body));
        v["fetch_in_progress"] == true
    });
    let mut child = fleet.subs[0].child.take().expect("sub00 runs");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    println!(
        "killed sub00's subd mid-fetch; census: {:?}",
        fleet.census().get("sub00")
    );
    // The dead sub shows as unreachable; the other goes on.
    wait_long("sub00 unreachable in ListSubs", 60, || {
        fleet.census()["sub00"].0 == "unreachable"
    });
    let bin = subd_bin();
    fleet.start_subd(0, &bin, args);
    let took = fleet.wait_all("synced to minbase2", 480);
    println!(
        "after subd's restart both subs converged in {:.1} s",
        took.as_secs_f64()
    );
    // The half-fetched object was never renamed into the cache, and the restart removed it.
    let objects = fleet.subs[0].root.join(".subd/objects");
    let leftovers: Vec<String> = walk(&objects)
        .into_iter()
        .filter(|p| p.ends_with('~'))
        .collect();
    assert!(leftovers.is_empty(), "partial objects left: {leftovers:?}");
    let want = tree(&images_dir().join("minbase2"));
    for s in &fleet.subs {
        assert_same_tree(&s.root, &want, "minbase2");
    }
}

/// Every path under `dir`, recursively (empty when it does not exist).
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p.display().to_string());
        }
    }
    out
}

/// A form post to the console from inside `ns` (ureq follows no redirect here): the status.
fn post_form(ns: &str, url: &str, origin: &str, form: &str) -> u16 {
    in_ns(ns, || {
        let a = agent();
        a.post(url)
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .send(form)
            .unwrap_or_else(|e| panic!("POST {url}: {e}"))
            .status()
            .as_u16()
    })
}

#[test]
fn the_required_image_changes_from_the_cli_and_the_console() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fleet = Fleet::on_minbase(1, "--scan-percent 100 --cpu-percent 100");
    let cli = |args: &str| {
        let out = fleet.link.server.sh(&format!(
            "PADDOCK_API={PUBLIC_URL} {} sub {args} 2>&1",
            env!("CARGO_BIN_EXE_paddock")
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let required = || {
        let v = fleet.api("GET", "/rpc/Mdb.ListMachines", None);
        let text = v.to_string();
        assert!(text.contains("sub00"), "{text}");
        v["machines"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| &e["machine"])
            .find(|m| m["Hostname"] == "sub00")
            .map(|m| m["RequiredImage"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };

    // An image that does not exist is refused and changes nothing.
    let out = cli("update sub00 --image nosuch");
    assert!(out.contains("no image \"nosuch\""), "{out}");
    assert_eq!(required(), "minbase");

    // The console: a form from another site is refused; from the console itself it is taken.
    let url = format!("{PUBLIC_URL}/ui/subs/sub00/image");
    let status = post_form(
        fleet.ns(),
        &url,
        "http://198.18.0.99:8080",
        "image=minbase2",
    );
    assert_eq!(status, 403, "a cross-site form");
    assert_eq!(required(), "minbase");
    let status = post_form(fleet.ns(), &url, PUBLIC_URL, "image=minbase2");
    assert_eq!(
        status, 303,
        "the console's own form redirects to the sub's page"
    );
    assert_eq!(required(), "minbase2");
    let took = fleet.wait_all("synced to minbase2", 240);
    println!(
        "console: synced to minbase2 {:.1} s after the form",
        took.as_secs_f64()
    );

    // The CLI, back to minbase.
    let out = cli("update sub00 --image minbase");
    assert!(out.contains("must now run minbase"), "{out}");
    let took = fleet.wait_all("synced to minbase", 240);
    println!(
        "cli: synced to minbase {:.1} s after `paddock sub update`",
        took.as_secs_f64()
    );
    assert_same_tree(
        &fleet.subs[0].root,
        &tree(&images_dir().join("minbase")),
        "minbase",
    );
}

/// Six subds, each an enrolled node of its name (what makes a reachable sub a host for
/// roles), synced to minbase, with the role loop on (hooks in `hooks`).
fn role_fleet(subd_args: &str, hooks: &Path) -> Fleet {
    let m2 = images_dir().join("minbase2.tar");
    std::fs::create_dir_all(hooks).unwrap();
    let roles = format!(
        "[roles]\nhooks_dir = \"{}\"\nround_secs = 2\ndebounce_ms = 100\n",
        hooks.display()
    );
    let fleet = Fleet::start_with(6, &[("minbase2", &m2)], subd_args, &roles);
    for i in 0..6 {
        let body =
            json!({"macs": [format!("52:54:00:d1:00:{i:02x}")], "name": format!("sub{i:02}")});
        let (status, node) = call(
            fleet.ns(),
            "POST",
            &format!("{PUBLIC_URL}/api/v1/nodes"),
            Some(body),
        );
        assert!((200..300).contains(&status), "{status} {node}");
    }
    fleet.require_image("minbase");
    fleet.wait_all("synced to minbase", 120);
    fleet
}

impl Fleet {
    /// Applies a spec of one image role `app` (min 4, max 6) on `image`, rolled by `update`.
    fn apply_app(&self, image: &str, update: &str) {
        let text = format!(
            "[roles.app]\nmin = 4\nmax = 6\nimage = \"{image}\"\nupdate = {{ {update} }}\n"
        );
        self.api(
            "POST",
            "/api/v1/spec",
            Some(json!({"file": "spec/app.toml", "text": text})),
        );
    }

    /// Waits until the role loop counts six instances of `app`.
    fn wait_six_instances(&self) {
        let t = Instant::now();
        loop {
            let p = self.api("POST", "/api/v1/spec/plan", Some(json!({})));
            let n = p["census"]["instances"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|i| i["role"] == "app").count());
            if n == 6 {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "not six instances of app: {p}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The console's roles page.
    fn roles_page(&self) -> Resp {
        http(
            &self.link.server,
            &self.scratch,
            "GET",
            "/ui/roles",
            None,
            &[],
        )
    }

    /// `app`'s rollout (null before it has one).
    fn rollout(&self) -> Value {
        let url = format!("{PUBLIC_URL}/api/v1/rollouts/app");
        match call(self.ns(), "GET", &url, None) {
            (200, v) => v,
            _ => Value::Null,
        }
    }

    /// Waits until `app`'s rollout is in `phase`.
    fn wait_rollout(&self, phase: &str, secs: u64) -> Value {
        let t = Instant::now();
        loop {
            let r = self.rollout();
            if r["phase"]["phase"] == phase {
                return r;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "no {phase} rollout after {secs} s: {r}\n{:?}",
                self.census()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// How many machines are synced to exactly `image`.
    fn synced_to(&self, image: &str) -> usize {
        let want = format!("synced to {image}");
        self.census().values().filter(|(_, s)| *s == want).count()
    }
}

/// An image role on six machines (minimum four) is rolled from minbase to minbase2 by a
/// spec change, two at a time: at no moment are fewer than four machines synced (sampled
/// every 100 ms from the dominator's census), and the rollout ends done, three batches.
#[test]
fn an_image_role_rolls_two_at_a_time_and_never_below_its_minimum() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let hooks = std::env::temp_dir().join(format!("paddock-rollout-{}-a", std::process::id()));
    let fleet = role_fleet("", &hooks);
    let update = "max_parallel = 3, min_healthy_secs = 2";
    fleet.apply_app("minbase", update);
    fleet.wait_six_instances();

    fleet.apply_app("minbase2", update);
    let t = Instant::now();
    let (mut fewest, mut most_away, mut samples) = (6usize, 0usize, 0u32);
    loop {
        let census = fleet.census();
        let synced = census
            .values()
            .filter(|(_, summary)| summary.starts_with("synced to minbase"))
            .count();
        fewest = fewest.min(synced);
        most_away = most_away.max(6 - synced);
        samples += 1;
        assert!(
            synced >= 4,
            "{synced} synced after {:.1} s: {census:#?}",
            t.elapsed().as_secs_f64()
        );
        let done = census.values().all(|(_, s)| s == "synced to minbase2")
            && fleet.rollout()["phase"]["phase"] == "done";
        if done {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "not rolled: {census:?}\n{}",
            fleet.rollout()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "rolled 6 machines to minbase2 in {:.1} s, {samples} samples: never fewer than \
         {fewest} synced, at most {most_away} away at once",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        most_away, 2,
        "two at a time (max_parallel 3, but the minimum is 4)"
    );
    let r = fleet.rollout();
    let got = (r["from"].as_str(), r["to"].as_str(), r["batches"].as_u64());
    assert_eq!(got, (Some("minbase"), Some("minbase2"), Some(3)), "{r}");
    let history = fleet.api("GET", "/api/v1/rollouts/app/history", None);
    assert_eq!(history.as_array().map(Vec::len), Some(1), "{history}");
    let status = fleet.link.server.sh_ok(&format!(
        "PADDOCK_API={PUBLIC_URL} {} rollout status app",
        env!("CARGO_BIN_EXE_paddock")
    ));
    assert!(
        status.starts_with("app") && status.contains("minbase -> minbase2  done  3 batches"),
        "{status}"
    );
    // Its log: every step, each machine it moved, in order.
    let log: Vec<&str> = status
        .lines()
        .skip_while(|l| *l != "log:")
        .skip(1)
        .collect();
    assert!(
        log[0].ends_with("started: from minbase to minbase2"),
        "{status}"
    );
    assert_eq!(
        log.iter()
            .filter(|l| l.ends_with(": forward: to minbase2"))
            .count(),
        6,
        "{status}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("batch 3 healthy on minbase2: ")),
        "{status}"
    );
    // The console's roles page shows it.
    let page = fleet.roles_page();
    let rollouts = page
        .body
        .split("<h2>Rollouts</h2>")
        .nth(1)
        .unwrap_or_default();
    assert!(
        rollouts.contains(
            "<td><code>minbase</code></td><td><code>minbase2</code></td><td>done</td><td>3</td>"
        ),
        "{}",
        page.body
    );
    assert!(
        rollouts.contains("The rollout of app: its log (newest first)")
            && rollouts.contains("started: from minbase to minbase2"),
        "{}",
        page.body
    );
    let _ = std::fs::remove_dir_all(&hooks);
}

/// minbase2 whose health check fails pauses the rollout on its first batch, four machines
/// still on minbase; `paddock rollout revert` brings the two back. Applied again with the
/// check passing, the rollout survives a kill -9 of the appliance mid-way and ends done.
#[test]
fn a_failing_image_pauses_a_revert_brings_it_back_and_a_restart_goes_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let hooks = std::env::temp_dir().join(format!("paddock-rollout-{}-b", std::process::id()));
    std::fs::create_dir_all(&hooks).unwrap();
    // subd runs the check with the image it applied in PADDOCK_SUBD_IMAGE.
    let ok = hooks.join("minbase2-ok");
    let check = hooks.join("health.sh");
    std::fs::write(
        &check,
        format!(
            "#!/bin/sh\ntest \"$PADDOCK_SUBD_IMAGE\" != minbase2 || test -e {}\n",
            ok.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&check, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut fleet = role_fleet(&format!("--health-command {}", check.display()), &hooks);
    let update =
        "max_parallel = 2, auto_revert = false, min_healthy_secs = 2, healthy_deadline_secs = 20";
    fleet.apply_app("minbase", update);
    fleet.wait_six_instances();

    fleet.apply_app("minbase2", update);
    let paused = fleet.wait_rollout("paused", 180);
    assert_eq!(paused["phase"]["failed"], true, "{paused}");
    let why = paused["why"].as_str().unwrap_or_default();
    assert!(why.contains("healthy_deadline_secs"), "{why}");
    assert_eq!(fleet.synced_to("minbase"), 4, "{:?}", fleet.census());
    // Promote is refused (nothing to promote); revert, from the console's button, asks to
    // confirm first.
    let refused = fleet.link.server.sh(&format!(
        "PADDOCK_API={PUBLIC_URL} {} rollout promote app 2>&1",
        env!("CARGO_BIN_EXE_paddock")
    ));
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(
        !refused.status.success() && text.contains("cannot promote a rollout that is paused"),
        "{text}"
    );
    let page = fleet.roles_page();
    assert!(
        page.body.contains(r#"action="/ui/rollouts/app/revert""#)
            && page.body.contains(r#"action="/ui/rollouts/app/resume""#)
            && !page.body.contains(r#"action="/ui/rollouts/app/promote""#),
        "a paused rollout's buttons: {}",
        page.body
    );
    let url = format!("{PUBLIC_URL}/ui/rollouts/app/revert");
    assert_eq!(
        post_form(fleet.ns(), &url, PUBLIC_URL, ""),
        200,
        "the confirmation page"
    );
    assert_eq!(
        fleet.rollout()["phase"]["phase"],
        "paused",
        "nothing before confirming"
    );
    assert_eq!(post_form(fleet.ns(), &url, PUBLIC_URL, "confirm=yes"), 303);
    fleet.wait_rollout("reverted", 180);
    fleet.wait_all("synced to minbase", 120);

    // The check passes now; the spec applied again tries minbase2 again. This part is about
    // the restart, not the deadline: each batch is given room for its post-update scans,
    // which a loaded machine runs slowly at their nice value (a batch was seen to take 19 s).
    std::fs::write(&ok, "").unwrap();
    let again = "max_parallel = 2, auto_revert = false, min_healthy_secs = 2, \
                 healthy_deadline_secs = 120";
    fleet.apply_app("minbase2", again);
    let t = Instant::now();
    loop {
        let r = fleet.rollout();
        if r["to"] == "minbase2" && r["phase"]["phase"] == "forward" && r["batches"] == 1 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "no first batch: {r}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fleet.app.kill9();
    let Fleet { app, link, .. } = &mut fleet;
    app.restart(&link.server);
    fleet.wait_rollout("done", 300);
    fleet.wait_all("synced to minbase2", 60);
    let history = fleet.api("GET", "/api/v1/rollouts/app/history", None);
    let phases: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["phase"]["phase"].as_str())
        .collect();
    assert_eq!(phases, ["reverted", "done"], "{history}");
    let _ = std::fs::remove_dir_all(&hooks);
}

/// A machine's dominator entries on its node's timeline.
fn dominator_timeline(fleet: &Fleet, node: &str) -> Vec<String> {
    let v = fleet.api("GET", &format!("/api/v1/nodes/{node}"), None);
    v["timeline"]
        .as_array()
        .unwrap_or_else(|| panic!("no timeline: {v}"))
        .iter()
        .filter(|e| e["kind"] == "dominator")
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect()
}

/// The disruption check with real subds: an update whose trigger reboots the machine waits
/// in `disruption denied` while the configured program denies (asked again every second,
/// the machine untouched), and goes on once it permits; an ordinary update on another
/// machine is never asked about. Each ask is on stdin as the machine's JSON.
#[test]
fn a_reboot_update_waits_while_the_check_denies_and_an_ordinary_one_never_asks() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("paddock-disrupt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (asked, open) = (dir.join("asked"), dir.join("window-open"));
    let check = dir.join("maintenance-window");
    std::fs::write(
        &check,
        format!(
            "#!/bin/sh\n{{ echo \"$1 $PADDOCK_HOST\"; cat; echo; }} >> {asked}\n\
             if [ -e {open} ]; then echo 'window open'; exit 0; fi\n\
             echo 'outside the maintenance window'; exit 2\n",
            asked = asked.display(),
            open = open.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&check, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hooks = dir.join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let extra = format!(
        "disruption_check = \"{}\"\ndisruption_retry_secs = 1\n[roles]\nhooks_dir = \"{}\"\n\
         round_secs = 2\ndebounce_ms = 100\n",
        check.display(),
        hooks.display()
    );
    let fleet = Fleet::start_with(2, &[], "", &extra);
    let m2 = images_dir().join("minbase2.tar");
    let triggers = dir.join("triggers.json");
    std::fs::write(
        &triggers,
        r#"[{"MatchLines": ["/etc/.*", "/usr/.*"], "Service": "kernel", "DoReboot": true, "HighImpact": true}]"#,
    )
    .unwrap();
    fleet.add_image_with(
        "reboot2",
        &m2,
        &format!("--triggers {}", triggers.display()),
    );
    fleet.add_image("plain2", &m2);
    let m1 = images_dir().join("minbase.tar");
    fleet.add_image_with(
        "reboot1",
        &m1,
        &format!("--triggers {}", triggers.display()),
    );
    // sub00 is a node, so its changes are on a timeline.
    let (status, node) = call(
        fleet.ns(),
        "POST",
        &format!("{PUBLIC_URL}/api/v1/nodes"),
        Some(json!({"macs": ["52:54:00:d2:00:00"], "name": "sub00"})),
    );
    assert!((200..300).contains(&status), "{status} {node}");
    fleet.require_image("minbase");
    fleet.wait_all("synced to minbase", 120);

    fleet.require_image_of(&fleet.subs[0], "reboot2");
    fleet.require_image_of(&fleet.subs[1], "plain2");
    let denied = "disruption denied: maintenance-window: outside the maintenance window";
    wait_long("sub00 denied and sub01 on plain2", 120, || {
        let c = fleet.census();
        let is = |h: &str, want: &str| c.get(h).is_some_and(|(_, s)| s == want);
        is("sub00", denied) && is("sub01", "synced to plain2")
    });
    // Held: asked again every second, the machine still on minbase.
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(fleet.census()["sub00"].1, denied);
    let log = std::fs::read_to_string(&asked).unwrap();
    let asks = log.lines().filter(|l| *l == "request sub00").count();
    println!(
        "asked {asks} times in {:.1} s of denial",
        t.elapsed().as_secs_f64()
    );
    assert!(asks >= 3, "asked only {asks} times:\n{log}");
    assert!(
        !log.contains("sub01"),
        "an ordinary update was asked about:\n{log}"
    );
    let subject: Value = log
        .lines()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap_or_else(|| panic!("no JSON on stdin:\n{log}"));
    assert_eq!(subject["hostname"], "sub00", "{subject}");
    assert_eq!(subject["image"], "reboot2", "{subject}");
    assert_eq!(subject["reboot"], true, "{subject}");
    assert_eq!(subject["services"], json!(["kernel"]), "{subject}");
    assert_eq!(subject["machine"]["RequiredImage"], "reboot2", "{subject}");
    let want_minbase = tree(&images_dir().join("minbase"));
    assert_same_tree(&fleet.subs[0].root, &want_minbase, "minbase");

    // The window opens: the next ask permits and the update runs.
    std::fs::write(&open, "").unwrap();
    let d = wait_long("sub00 synced to reboot2", 60, || {
        fleet
            .census()
            .get("sub00")
            .is_some_and(|(_, s)| s == "synced to reboot2")
    });
    println!(
        "sub00 updated {:.1} s after the window opened",
        d.as_secs_f64()
    );
    assert_same_tree(
        &fleet.subs[0].root,
        &tree(&images_dir().join("minbase2")),
        "minbase2",
    );
    let entries = dominator_timeline(&fleet, "sub00");
    assert!(
        entries.iter().any(|m| m == &format!("dominator: {denied}")),
        "{entries:#?}"
    );
    let done = entries
        .iter()
        .find(|m| m.contains("updated to reboot2"))
        .unwrap_or_else(|| panic!("no update on sub00's timeline: {entries:#?}"));
    println!("sub00's timeline: {done}");
    assert!(
        done.contains("disruption permitted after ")
            && done.contains(" s denied: by maintenance-window: window open")
            && done.contains("rebooting"),
        "{done}"
    );

    // A role's `disrupt` hook is asked too, after the program, and a rollout's disruptive
    // update waits for it the same way: `app` (one instance, on sub00, the only node) rolls
    // from reboot2 to reboot1 (minbase's tree under the rebooting trigger).
    let (hook_log, quorum) = (dir.join("hook-asked"), dir.join("quorum"));
    std::fs::write(
        hooks.join("may-disrupt.sh"),
        format!(
            "#!/bin/sh\n{{ echo \"$PADDOCK_ACTION $PADDOCK_ROLE $*\"; cat; echo; }} >> {log}\n\
             if [ -e {quorum} ]; then exit 0; fi\necho 'the quorum would be lost'; exit 1\n",
            log = hook_log.display(),
            quorum = quorum.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        hooks.join("may-disrupt.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let app = |image: &str| {
        let text = format!(
            "[roles.app]\nmin = 0\nmax = 1\nimage = \"{image}\"\n\
             disrupt = {{ hook = \"may-disrupt.sh\", args = [\"h\"] }}\n\
             update = {{ min_healthy_secs = 1 }}\n"
        );
        fleet.api(
            "POST",
            "/api/v1/spec",
            Some(json!({"file": "spec/app.toml", "text": text})),
        );
    };
    app("reboot2");
    wait_long("app's instance on sub00", 60, || {
        let p = fleet.api("POST", "/api/v1/spec/plan", Some(json!({})));
        p["census"]["instances"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i["role"] == "app" && i["host"] == "sub00"))
    });
    app("reboot1");
    let held = "disruption denied: role app's disrupt hook: the quorum would be lost";
    wait_long("the rollout's update held by app's hook", 90, || {
        fleet.census().get("sub00").is_some_and(|(_, s)| s == held)
    });
    let r = fleet.api("GET", "/api/v1/rollouts/app", None);
    assert!(
        !["done", "failed"].contains(&r["phase"]["phase"].as_str().unwrap_or("")),
        "{r}"
    );
    let log = std::fs::read_to_string(&hook_log).unwrap();
    assert!(log.starts_with("disrupt app -h sub00\n{"), "{log}");
    std::fs::write(&quorum, "").unwrap();
    let d = wait_long("sub00 synced to reboot1", 60, || {
        fleet
            .census()
            .get("sub00")
            .is_some_and(|(_, s)| s == "synced to reboot1")
    });
    println!(
        "the rollout's update went on {:.1} s after the hook permitted",
        d.as_secs_f64()
    );
    wait_long("app's rollout done", 60, || {
        fleet.api("GET", "/api/v1/rollouts/app", None)["phase"]["phase"] == "done"
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The spec of the computed-files test: every machine's `/etc/paddock-name`, and the peers
/// of role `app` on the machines that run it, checked before it replaces the old.
fn computed_spec(marker: &str, peers_line: &str) -> String {
    format!(
        "[vars]\ncluster = \"fleet\"\nmarker = \"{marker}\"\n\n\
         [[files]]\npath = \"/etc/paddock-name\"\ntemplate = \"name.j2\"\n\n\
         [roles.app]\nmin = 1\nstart = {{ hook = \"start\" }}\nstop = {{ hook = \"stop\" }}\n\
         files = [{{ path = \"/etc/app/peers\", template = \"peers.j2\", mode = \"0640\", \
         check = [\"/bin/sh\", \"-c\", \"if grep -q BAD \\\"$0\\\"; then echo refused BAD; exit 1; fi\"] }}]\n\
         # {peers_line}\n"
    )
}

const PEERS_J2: &str = "# {{ machine.name }} in {{ vars.cluster }} ({{ vars.marker }})\n\
{% for p in peers.app %}{{ p.instance }} {{ p.host }} {{ p.addresses[0] }}\n{% endfor %}";

/// Computed files with real subds: twenty machines each get their own
/// `/etc/paddock-name`; the two running `app` get its peers. A third peer registering
/// changes the file on the three members and no other machine, firing the reload trigger
/// once on each; a content the file's check refuses keeps the old file and says why on the
/// sub and its timeline; a template with an undefined variable holds the members with
/// "missing computed file"; a hand edit is put back as drift.
#[test]
fn computed_files_follow_the_peers_are_checked_and_kept_in_place() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("paddock-computed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("spec/templates")).unwrap();
    let trig = dir.join("trigger");
    std::fs::write(
        &trig,
        format!(
            "#!/bin/sh\necho \"$2 $3\" >> {}/triggers-$1\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&trig, std::fs::Permissions::from_mode(0o755)).unwrap();
    let triggers_of = |host: &str| -> Vec<String> {
        std::fs::read_to_string(dir.join(format!("triggers-{host}")))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let fleet = Fleet::start_with(
        20,
        &[],
        &format!("--trigger-command '{} {{host}}'", trig.display()),
        "",
    );
    let triggers = dir.join("triggers.json");
    std::fs::write(
        &triggers,
        r#"[{"MatchLines": ["/etc/app/peers"], "Service": "app", "DoReload": true},
            {"MatchLines": ["/etc/paddock-name"], "Service": "name", "DoReload": true}]"#,
    )
    .unwrap();
    fleet.add_image_with(
        "appbase",
        &images_dir().join("minbase.tar"),
        &format!("--triggers {}", triggers.display()),
    );
    let (status, node) = call(
        fleet.ns(),
        "POST",
        &format!("{PUBLIC_URL}/api/v1/nodes"),
        Some(json!({"macs": ["52:54:00:d3:00:00"], "name": "sub00"})),
    );
    assert!((200..300).contains(&status), "{status} {node}");

    // The spec and its templates, applied from files as an operator does.
    let spec = dir.join("spec/fleet.toml");
    std::fs::write(&spec, computed_spec("ok", "")).unwrap();
    std::fs::write(
        dir.join("spec/templates/name.j2"),
        "{{ machine.name }}.{{ vars.cluster }}\n",
    )
    .unwrap();
    std::fs::write(dir.join("spec/templates/peers.j2"), PEERS_J2).unwrap();
    let paddock = env!("CARGO_BIN_EXE_paddock");
    let cli = |args: &str| -> String {
        fleet
            .link
            .server
            .sh_ok(&format!("PADDOCK_API={PUBLIC_URL} {paddock} {args}"))
    };
    cli(&format!("spec apply {}", spec.display()));
    let mut holds = Vec::new();
    let mut hold = |instance: &str, host: &str| {
        let log = fleet.scratch.path(&format!("hold-{instance}.log"));
        holds.push(fleet.link.server.spawn(
            &format!(
                "{paddock} census hold --url {PUBLIC_URL} --role app --instance {instance} \
                 --host {host} --ttl 30"
            ),
            &log,
        ));
    };
    hold("app-1", "sub00");
    hold("app-2", "sub01");
    wait_long("two app instances registered", 30, || {
        let v = fleet.api("GET", "/api/v1/census", None);
        v["instances"].as_array().is_some_and(|a| a.len() == 2)
    });
    fleet.require_image("appbase");
    fleet.wait_all("synced to appbase", 180);

    let read = |i: usize, rel: &str| std::fs::read_to_string(fleet.subs[i].root.join(rel)).ok();
    let peers = |hosts: &[(&str, &str)]| {
        let mut s = String::new();
        for (i, h) in hosts {
            let n: usize = h[3..].parse().unwrap();
            s.push_str(&format!("{i} {h} 127.0.0.{}\n", n + 2));
        }
        s
    };
    let two = [("app-1", "sub00"), ("app-2", "sub01")];
    for i in 0..20 {
        let host = &fleet.subs[i].host;
        assert_eq!(
            read(i, "etc/paddock-name").as_deref(),
            Some(format!("{host}.fleet\n").as_str())
        );
        let want = (i < 2).then(|| format!("# {host} in fleet (ok)\n{}", peers(&two)));
        assert_eq!(read(i, "etc/app/peers"), want, "{host}");
    }
    let mode = std::fs::metadata(fleet.subs[0].root.join("etc/app/peers"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o7777, 0o640);
    let files = cli("sub files sub00");
    println!("{files}");
    assert!(
        files.contains("/etc/app/peers") && files.contains("template peers.j2 (role app)"),
        "{files}"
    );
    let rendered = cli("spec render sub01 /etc/app/peers");
    assert!(
        rendered.contains("app-2 sub01 127.0.0.3") && rendered.contains("# made from:"),
        "{rendered}"
    );

    // A third peer: the three members' files change, no other machine's.
    let before: Vec<Vec<String>> = (0..20).map(|i| triggers_of(&fleet.subs[i].host)).collect();
    hold("app-3", "sub02");
    let three = [("app-1", "sub00"), ("app-2", "sub01"), ("app-3", "sub02")];
    let d = wait_long("three members with three peers", 60, || {
        (0..3).all(|i| {
            read(i, "etc/app/peers")
                == Some(format!(
                    "# {} in fleet (ok)\n{}",
                    fleet.subs[i].host,
                    peers(&three)
                ))
        })
    });
    println!(
        "a peer added: every member's file changed {:.2} s after it registered (poll cycle {POLL_MS} ms)",
        d.as_secs_f64()
    );
    fleet.wait_all("synced to appbase", 60);
    std::thread::sleep(Duration::from_secs(2));
    for (i, seen) in before.iter().enumerate() {
        let host = &fleet.subs[i].host;
        let new: Vec<String> = triggers_of(host)[seen.len()..].to_vec();
        if i < 3 {
            assert_eq!(new, ["app reload"], "{host}: one reload for one change");
        } else {
            assert!(new.is_empty(), "{host} was not concerned: {new:?}");
            assert!(read(i, "etc/app/peers").is_none());
        }
    }

    // A content the check refuses: the old file stays, and the sub and its timeline say why.
    std::fs::write(&spec, computed_spec("BAD", "")).unwrap();
    cli(&format!("spec apply {}", spec.display()));
    wait_long("sub00 in error for its refused file", 90, || {
        fleet.census()["sub00"].1.contains("refused BAD")
    });
    let state = fleet.census()["sub00"].1.clone();
    println!("sub00: {state}");
    assert!(
        state.contains("its check /bin/sh exited 1: refused BAD; the old file is kept"),
        "{state}"
    );
    assert_eq!(
        read(0, "etc/app/peers"),
        Some(format!("# sub00 in fleet (ok)\n{}", peers(&three)))
    );
    let timeline = dominator_timeline(&fleet, "sub00");
    assert!(
        timeline
            .iter()
            .any(|m| m.contains("refused BAD; the old file is kept")),
        "{timeline:#?}"
    );
    // Machines without the file are not concerned.
    assert_eq!(fleet.census()["sub07"].1, "synced to appbase");

    // A template with an undefined variable: the members are held, the others are not.
    std::fs::write(
        dir.join("spec/templates/peers.j2"),
        format!("{PEERS_J2}{{{{ vars.nope }}}}\n"),
    )
    .unwrap();
    std::fs::write(&spec, computed_spec("ok", "")).unwrap();
    cli(&format!("spec apply {}", spec.display()));
    wait_long("the members held for a missing computed file", 60, || {
        let c = fleet.census();
        (0..3).all(|i| {
            c[&fleet.subs[i].host]
                .1
                .starts_with("missing computed file: /etc/app/peers: peers.j2:")
        })
    });
    let c = fleet.census();
    println!("sub01: {}", c["sub01"].1);
    assert!(
        c["sub01"].1.ends_with("undefined variable vars.nope"),
        "{}",
        c["sub01"].1
    );
    assert_eq!(c["sub09"].1, "synced to appbase");
    let out = fleet.link.server.sh(&format!(
        "PADDOCK_API={PUBLIC_URL} {paddock} spec render sub01 2>&1"
    ));
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(out.contains("cannot be made: peers.j2:"), "{out}");

    // Fixed; then a hand edit is drift, put back.
    std::fs::write(dir.join("spec/templates/peers.j2"), PEERS_J2).unwrap();
    cli(&format!("spec apply {}", spec.display()));
    fleet.wait_all("synced to appbase", 120);
    std::fs::write(fleet.subs[5].root.join("etc/paddock-name"), "hacked\n").unwrap();
    wait_long("sub05's name put back", 60, || {
        read(5, "etc/paddock-name").as_deref() == Some("sub05.fleet\n")
    });
    for mut h in holds {
        let _ = h.kill();
        let _ = h.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
