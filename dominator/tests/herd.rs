//! The herd over a simulated fleet: convergence within the update limit, drift restored,
//! pause, the safety hold and unreachable subs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use paddock_dominator::sim::{SimFleet, file};
use paddock_dominator::{Census, Desired, Herd, Limits, Policy, SubSpec};
use paddock_image::{FileSystem, Filter, Image, Triggers};
use tokio::sync::watch;

fn tree(prefix: &str, n: usize) -> FileSystem {
    let mut fs = FileSystem::with_root(0o755, 0, 0);
    for i in 0..n {
        fs.insert(&format!("/f{i}"), file(&format!("{prefix}{}", i % 7)))
            .unwrap();
    }
    fs
}

fn image(name: &str, fs: FileSystem) -> Image {
    Image::new(name, fs, Some(Filter::parse("").unwrap()))
}

/// A simulated fleet whose updates take `update_time`, holding `images` (handed back for the
/// test to use).
fn fleet_of<const N: usize>(
    update_time: Duration,
    images: [Image; N],
) -> (Arc<SimFleet>, [Image; N]) {
    let fleet = SimFleet::new(update_time);
    for i in &images {
        fleet.add_image(i.clone());
    }
    (fleet, images)
}

/// Makes the simulated sub at `address` refuse connections, or take them again.
fn set_unreachable(fleet: &SimFleet, address: &str, unreachable: bool) {
    fleet
        .subs
        .lock()
        .unwrap()
        .get_mut(address)
        .unwrap()
        .unreachable = unreachable;
}

fn spec(i: usize, image: &str, paused: Option<&str>) -> SubSpec {
    SubSpec {
        hostname: format!("sub{i}"),
        address: format!("198.18.7.{i}:6969"),
        desired: Desired {
            required_image: Some(image.into()),
            paused: paused.map(String::from),
            ..Desired::default()
        },
        safety_clearance: 0,
    }
}

fn specs(n: usize, image: &str, paused: Option<&str>) -> Vec<SubSpec> {
    (0..n).map(|i| spec(i, image, paused)).collect()
}

const POLICY: Policy = Policy {
    poll_interval_ms: 50,
    backoff_min_ms: 50,
    backoff_max_ms: 400,
    max_update_attempts: 3,
    check_disruption: false,
    disruption_retry_ms: 1_000,
};

struct Running {
    fleet: Arc<SimFleet>,
    changes: tokio::sync::mpsc::UnboundedReceiver<paddock_dominator::Change>,
    census: Census,
    specs: watch::Sender<Vec<SubSpec>>,
    _stop: watch::Sender<bool>,
}

fn start(fleet: Arc<SimFleet>, initial: Vec<SubSpec>, update_slots: usize) -> Running {
    start_with(
        fleet,
        initial,
        Limits {
            update_slots,
            image_server: "198.18.0.1:8080".into(),
            ..Limits::default()
        },
    )
}

fn start_with(fleet: Arc<SimFleet>, initial: Vec<SubSpec>, limits: Limits) -> Running {
    let herd = Herd::new(
        fleet.clone(),
        fleet.clone(),
        POLICY,
        limits,
        Census::default(),
    );
    let (tx, changes) = tokio::sync::mpsc::unbounded_channel();
    let herd = herd.with_changes(tx);
    let census = herd.census();
    let (specs, specs_rx) = watch::channel(initial);
    let (stop, stop_rx) = watch::channel(false);
    let epoch = Instant::now();
    tokio::spawn(herd.run(specs_rx, stop_rx, move || {
        u64::try_from(epoch.elapsed().as_millis()).unwrap()
    }));
    Running {
        fleet,
        changes,
        census,
        specs,
        _stop: stop,
    }
}

impl Running {
    fn states(&self) -> Vec<(String, String)> {
        self.census
            .read()
            .unwrap()
            .values()
            .map(|s| (s.hostname.clone(), s.summary.clone()))
            .collect()
    }

    async fn until(&self, what: &str, mut ok: impl FnMut(&Running) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok(self) {
            assert!(
                Instant::now() < deadline,
                "{what} did not happen: {:?}",
                self.states()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn all(&self, summary: &str) -> bool {
        let c = self.census.read().unwrap();
        !c.is_empty() && c.values().all(|s| s.summary == summary)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_subs_converge_within_the_update_limit_and_drift_is_restored() {
    let (fleet, [a, b]) = fleet_of(
        Duration::from_millis(30),
        [
            image("minbase", tree("a", 60)),
            image("minbase2", tree("b", 60)),
        ],
    );
    for i in 0..40 {
        fleet.add_sub(&format!("198.18.7.{i}:6969"), a.fs.clone());
    }
    let r = start(fleet.clone(), specs(40, "minbase", None), 3);
    r.until("all synced to minbase", |r| r.all("synced to minbase"))
        .await;
    assert_eq!(fleet.max_running.load(Ordering::SeqCst), 0, "nothing to do");

    // The MDB now requires minbase2: every sub fetches and updates, at most 3 at once.
    r.specs.send_replace(specs(40, "minbase2", None));
    r.until("all synced to minbase2", |r| r.all("synced to minbase2"))
        .await;
    let max = fleet.max_running.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&max),
        "at most 3 at once, and more than one: {max}"
    );
    for i in 0..40 {
        let s = fleet.sub(&format!("198.18.7.{i}:6969"));
        assert_eq!(*s.fs, b.fs, "sub{i}");
        assert_eq!(s.updates, 1, "sub{i}");
    }

    // Each sub says since when it is synced.
    let since = |r: &Running, host: &str| r.census.read().unwrap()[host].since_ms;
    let (since5, since6) = (since(&r, "sub5"), since(&r, "sub6"));

    // A file changed by hand on one sub is put back, and each step is told (for the
    // machine's timeline).
    let mut r = r;
    while r.changes.try_recv().is_ok() {}
    fleet.edit("198.18.7.5:6969", |fs| {
        fs.insert("/etc-by-hand", file("oops")).unwrap();
    });
    r.until("drift restored and proved", |r| {
        *r.fleet.sub("198.18.7.5:6969").fs == b.fs && r.all("synced to minbase2")
    })
    .await;
    assert_eq!(fleet.sub("198.18.7.5:6969").updates, 2);
    let mut told = Vec::new();
    let mut report = None;
    while let Ok(c) = r.changes.try_recv() {
        if c.hostname == "sub5" {
            told.push(c.state.name());
            if c.report.is_some() {
                report = c.report.map(|r| r.describe());
            }
        }
    }
    // The cycle's report goes with the change that ends it.
    let report = report.expect("a report with the synced change");
    assert!(
        report.starts_with("updated to minbase2: plan: 0 objects to fetch")
            && report.contains("nothing fetched, change window 2 ms, no triggers"),
        "{report}"
    );
    assert_eq!(
        told,
        [
            "computing",
            "queued",
            "updating",
            "waiting_for_scan",
            "computing",
            "synced"
        ]
    );
    // A synced fleet is short-polled: trees travel only when something changed.
    let trees = fleet.trees_sent.load(Ordering::SeqCst);
    let polls = fleet.polls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(fleet.polls.load(Ordering::SeqCst) > polls + 40);
    assert_eq!(fleet.trees_sent.load(Ordering::SeqCst), trees);
    // The restored sub is synced anew; the others' polls since left their time alone.
    assert!(since(&r, "sub5") > since5, "{since5}");
    assert_eq!(since(&r, "sub6"), since6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subs_health_check_after_its_update_reaches_the_census() {
    let (fleet, [a, _]) = fleet_of(
        Duration::from_millis(1),
        [image("a", tree("a", 10)), image("b", tree("b", 10))],
    );
    for i in 0..3 {
        fleet.add_sub(&format!("198.18.7.{i}:6969"), a.fs.clone());
    }
    if let Some(s) = fleet.subs.lock().unwrap().get_mut("198.18.7.2:6969") {
        s.health_fails = true;
    }
    let r = start(fleet.clone(), specs(3, "a", None), 3);
    r.until("all synced to a", |r| r.all("synced to a")).await;
    // No update yet: no health check to tell.
    assert!(
        r.census
            .read()
            .unwrap()
            .values()
            .all(|s| s.health.is_none())
    );
    r.specs.send_replace(specs(3, "b", None));
    let health = |r: &Running, host: &str| r.census.read().unwrap()[host].health.clone();
    r.until("every sub's check on b", |r| {
        r.all("synced to b")
            && (0..3).all(|i| health(r, &format!("sub{i}")).is_some_and(|h| h.image == "b"))
    })
    .await;
    assert!(health(&r, "sub0").is_some_and(|h| h.passed));
    assert!(
        health(&r, "sub2").is_some_and(|h| !h.passed),
        "sub2's check fails"
    );
    // The status as the API serves it carries it.
    let json = serde_json::to_value(&r.census.read().unwrap()["sub2"]).unwrap();
    assert_eq!(json["health"]["passed"], false, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_dominator_changes_nothing_until_resumed() {
    let (fleet, [a]) = fleet_of(Duration::from_millis(1), [image("a", tree("a", 20))]);
    for i in 0..3 {
        fleet.add_sub(&format!("198.18.7.{i}:6969"), a.fs.clone());
    }
    let r = start(fleet.clone(), specs(3, "a", Some("change freeze")), 2);
    r.until("synced", |r| r.all("synced to a")).await;
    fleet.edit("198.18.7.1:6969", |fs| {
        fs.insert("/by-hand", file("x")).unwrap();
    });
    r.until("held", |r| {
        r.states()
            .iter()
            .any(|(_, s)| s == "updates disabled: the dominator is paused: change freeze")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fleet.sub("198.18.7.1:6969").updates, 0);
    r.specs.send_replace(specs(3, "a", None));
    r.until("resumed and restored", |r| {
        *r.fleet.sub("198.18.7.1:6969").fs == a.fs
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_image_is_held_and_an_unreachable_sub_backs_off_then_converges() {
    let (fleet, [big, tiny]) = fleet_of(
        Duration::from_millis(1),
        [image("big", tree("b", 40)), image("tiny", tree("t", 3))],
    );
    fleet.add_sub("198.18.7.0:6969", big.fs.clone());
    fleet.add_sub("198.18.7.1:6969", tree("z", 5));
    set_unreachable(&fleet, "198.18.7.1:6969", true);
    let both = vec![spec(0, "tiny", None), spec(1, "big", None)];
    let r = start(fleet.clone(), both, 2);
    r.until("held and unreachable", |r| {
        let s = r.states();
        s.len() == 2
            && s[0]
                .1
                .starts_with("unsafe update held until cleared: image tiny has 4 inodes")
            && s[1]
                .1
                .starts_with("unreachable: 198.18.7.1:6969: connection refused")
    })
    .await;
    assert_eq!(fleet.sub("198.18.7.0:6969").updates, 0);
    // Cleared by an operator: the update goes through.
    let mut cleared = vec![spec(0, "tiny", None), spec(1, "big", None)];
    cleared[0].safety_clearance = 1;
    r.specs.send_replace(cleared);
    r.until("cleared and synced", |r| {
        r.states().first().is_some_and(|s| s.1 == "synced to tiny")
    })
    .await;
    assert_eq!(*fleet.sub("198.18.7.0:6969").fs, tiny.fs);
    let failures = r.census.read().unwrap()["sub1"].failures;
    assert!(failures >= 1);
    // Retried meanwhile (polling, refused again), it is still unreachable since the first
    // refusal.
    let unreachable_since = r.census.read().unwrap()["sub1"].since_ms;
    r.until("retried again", |r| {
        r.census.read().unwrap()["sub1"].failures > failures
    })
    .await;
    let s = r.census.read().unwrap()["sub1"].clone();
    assert!(s.summary.starts_with("unreachable"), "{}", s.summary);
    assert_eq!(s.since_ms, unreachable_since);
    set_unreachable(&fleet, "198.18.7.1:6969", false);
    r.until("reachable again and synced", |r| {
        r.states().get(1).is_some_and(|s| s.1 == "synced to big")
    })
    .await;
    assert_eq!(*fleet.sub("198.18.7.1:6969").fs, big.fs);
    assert_eq!(r.census.read().unwrap()["sub1"].failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_impact_updates_are_held_to_their_share_and_ordinary_ones_are_not() {
    // 20 subs, 4 update slots, share 0.1: at most 2 updates with a reboot trigger at once.
    let mut b = image("kernel2", tree("b", 30));
    b.triggers = Triggers::new(vec![paddock_image::Trigger {
        match_lines: vec!["/f.*".into()],
        service: "reboot".into(),
        do_reboot: true,
        ..paddock_image::Trigger::default()
    }])
    .unwrap();
    // A rebooting update lasts 440 ms against an ordinary one's 40 (the machine
    // restarting): the second rebooting update is admitted while the first still runs,
    // whatever order the queue happens to take, so the share is reached; and were it not
    // kept, a third would be too.
    let fleet = SimFleet::rebooting(Duration::from_millis(40), Duration::from_millis(400));
    let (a, c, d) = (
        image("minbase", tree("a", 30)),
        image("tools2", tree("c", 30)),
        image("tools3", tree("d", 30)),
    );
    for i in [&a, &b, &c, &d] {
        fleet.add_image(i.clone());
    }
    for i in 0..20 {
        fleet.add_sub(&format!("198.18.7.{i}:6969"), a.fs.clone());
    }
    let limits = Limits {
        update_slots: 4,
        image_server: "198.18.0.1:8080".into(),
        high_impact_share: 0.1,
        ..Limits::default()
    };
    let r = start_with(fleet.clone(), specs(20, "minbase", None), limits);
    r.until("all synced to minbase", |r| r.all("synced to minbase"))
        .await;
    // Sample the census meanwhile: only subs holding a slot show fetching or updating.
    let census = r.census.clone();
    let (max_active, max_queued) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (ma, mq) = (max_active.clone(), max_queued.clone());
    let sampler = tokio::spawn(async move {
        loop {
            {
                let c = census.read().unwrap();
                let n = |s: &[&str]| c.values().filter(|x| s.contains(&x.state.name())).count();
                ma.fetch_max(n(&["fetching", "updating"]), Ordering::SeqCst);
                mq.fetch_max(n(&["queued"]), Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let synced = |r: &Running, names: &[&str]| {
        r.census
            .read()
            .unwrap()
            .values()
            .all(|s| names.iter().any(|n| s.summary == format!("synced to {n}")))
    };
    // First an ordinary image for all: the share holds none of them back, so they take more
    // than its two slots at once.
    r.specs.send_replace(specs(20, "tools2", None));
    r.until("all synced to tools2", |r| synced(r, &["tools2"]))
        .await;
    let ordinary = fleet.max_ordinary_updates_running.load(Ordering::SeqCst);
    // Then a quarter of the fleet gets the rebooting image and the rest another ordinary one:
    // the rebooting updates never run more than two at once, beside the ordinary ones.
    let want: Vec<SubSpec> = (0..20)
        .map(|i| spec(i, if i % 4 == 0 { "kernel2" } else { "tools3" }, None))
        .collect();
    r.specs.send_replace(want);
    r.until("all synced to kernel2 or tools3", |r| {
        synced(r, &["kernel2", "tools3"])
    })
    .await;
    sampler.abort();
    let high = fleet.max_high_impact_running.load(Ordering::SeqCst);
    let all = fleet.max_running.load(Ordering::SeqCst);
    let (active, queued) = (
        max_active.load(Ordering::SeqCst),
        max_queued.load(Ordering::SeqCst),
    );
    eprintln!(
        "high-impact at once {high}, ordinary updates at once {ordinary}, all {all}, \
         census: fetching/updating at most {active}, queued at most {queued}"
    );
    assert_eq!(high, 2, "max(1, floor(0.1 × 20)) rebooting updates at once");
    assert!(
        ordinary >= 3,
        "ordinary updates are not held by the share: {ordinary}"
    );
    assert!(all <= 4, "the update slots: {all}");
    assert!(
        active <= 4,
        "only subs holding a slot show fetching/updating: {active}"
    );
    assert!(queued > 4, "the rest show queued: {queued}");
    for i in 0..20 {
        let s = fleet.sub(&format!("198.18.7.{i}:6969"));
        let want = if i % 4 == 0 { &b.fs } else { &d.fs };
        assert_eq!(*s.fs, *want, "sub{i}");
    }
}
