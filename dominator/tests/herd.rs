//! The herd over a simulated fleet: convergence within the update limit, drift restored,
//! pause, the safety hold and unreachable subs.

use std::sync::Arc;
use std::sync::atomic::Ordering;
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
    Image {
        name: name.into(),
        fs,
        filter: Some(Filter::parse("").unwrap()),
        triggers: Triggers::default(),
        created_on_ms: 0,
        created_by: String::new(),
        expires_at_ms: None,
    }
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
};

struct Running {
    fleet: Arc<SimFleet>,
    changes: tokio::sync::mpsc::UnboundedReceiver<(String, paddock_dominator::SubState)>,
    census: Census,
    specs: watch::Sender<Vec<SubSpec>>,
    _stop: watch::Sender<bool>,
}

fn start(fleet: Arc<SimFleet>, initial: Vec<SubSpec>, update_slots: usize) -> Running {
    let herd = Herd::new(
        fleet.clone(),
        fleet.clone(),
        POLICY,
        Limits {
            update_slots,
            image_server: "198.18.0.1:8080".into(),
            ..Limits::default()
        },
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
    let fleet = SimFleet::new(Duration::from_millis(30));
    let a = image("minbase", tree("a", 60));
    let b = image("minbase2", tree("b", 60));
    fleet.add_image(a.clone());
    fleet.add_image(b.clone());
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
    while let Ok((host, state)) = r.changes.try_recv() {
        if host == "sub5" {
            told.push(state.name());
        }
    }
    assert_eq!(
        told,
        [
            "computing",
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_dominator_changes_nothing_until_resumed() {
    let fleet = SimFleet::new(Duration::from_millis(1));
    let a = image("a", tree("a", 20));
    fleet.add_image(a.clone());
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
    let fleet = SimFleet::new(Duration::from_millis(1));
    let big = image("big", tree("b", 40));
    let tiny = image("tiny", tree("t", 3));
    fleet.add_image(big.clone());
    fleet.add_image(tiny.clone());
    fleet.add_sub("198.18.7.0:6969", big.fs.clone());
    fleet.add_sub("198.18.7.1:6969", tree("z", 5));
    fleet
        .subs
        .lock()
        .unwrap()
        .get_mut("198.18.7.1:6969")
        .unwrap()
        .unreachable = true;
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
    fleet
        .subs
        .lock()
        .unwrap()
        .get_mut("198.18.7.1:6969")
        .unwrap()
        .unreachable = false;
    r.until("reachable again and synced", |r| {
        r.states().get(1).is_some_and(|s| s.1 == "synced to big")
    })
    .await;
    assert_eq!(*fleet.sub("198.18.7.1:6969").fs, big.fs);
    assert_eq!(r.census.read().unwrap()["sub1"].failures, 0);
}
