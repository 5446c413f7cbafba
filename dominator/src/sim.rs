//! A simulated fleet: subs that answer subd's RPC from memory, and the images they are
//! kept on. For the herd's tests and the fleet-scale bench; never used by `paddock serve`.
//!
//! A simulated sub scans between any two polls (its scan count moves on every poll), sends
//! its tree when the caller's generation differs, adds fetched objects to its cache, and
//! applies an update by taking the named image's tree (full images only) and runs its health
//! check (failing on a sub whose `health_fails` is set). It counts the fetches and updates
//! running at once, so tests can check the herd's limits.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use paddock_image::{FileSystem, Image, Inode, Mtime, ObjectId, UpdateRequest};
use paddock_subd_proto::{
    CommandOutcome, FetchReply, FetchRequest, FetchStats, HealthCheck, PollRequest, PollResponse,
    UpdateReport,
};

use crate::herd::{ImageSource, RpcError, SubRpc};

/// A regular file holding `content` (mode 0644, root's, mtime 1), for simulated trees.
pub fn file(content: &str) -> Inode {
    Inode::Regular {
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: Mtime { sec: 1, nsec: 0 },
        size: u64::try_from(content.len()).unwrap_or(u64::MAX),
        object: (!content.is_empty()).then(|| ObjectId::of(content.as_bytes())),
    }
}

#[derive(Clone, Debug)]
pub struct SimSub {
    pub fs: Arc<FileSystem>,
    pub cache: BTreeSet<ObjectId>,
    pub generation: u64,
    pub scan_count: u64,
    pub updates: u64,
    pub unreachable: bool,
    /// Its health check fails after an update.
    pub health_fails: bool,
    /// The health check after its last update.
    pub health: Option<HealthCheck>,
}

#[derive(Default)]
pub struct SimFleet {
    pub subs: Mutex<HashMap<String, SimSub>>,
    pub images: Mutex<HashMap<String, Arc<Image>>>,
    /// How long an update takes (to see concurrency).
    pub update_time: Duration,
    /// How much longer an update with a reboot or high-impact trigger takes (the machine
    /// restarting), so that such updates overlap the ordinary ones around them.
    pub reboot_time: Duration,
    running: AtomicUsize,
    /// The most fetches and updates seen running at once.
    pub max_running: AtomicUsize,
    high_impact_running: AtomicUsize,
    /// The most updates with a high-impact or reboot trigger seen running at once.
    pub max_high_impact_running: AtomicUsize,
    ordinary_updates_running: AtomicUsize,
    /// The most updates without such a trigger seen running at once.
    pub max_ordinary_updates_running: AtomicUsize,
    pub polls: AtomicUsize,
    pub trees_sent: AtomicUsize,
}

impl SimFleet {
    pub fn new(update_time: Duration) -> Arc<Self> {
        Arc::new(SimFleet {
            update_time,
            ..SimFleet::default()
        })
    }

    /// A fleet whose rebooting updates take `reboot_time` more than the others.
    pub fn rebooting(update_time: Duration, reboot_time: Duration) -> Arc<Self> {
        Arc::new(SimFleet {
            update_time,
            reboot_time,
            ..SimFleet::default()
        })
    }

    pub fn add_image(&self, image: Image) {
        self.images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(image.name.clone(), Arc::new(image));
    }

    /// A sub at `address` holding `fs`.
    pub fn add_sub(&self, address: &str, fs: FileSystem) {
        self.subs.lock().unwrap_or_else(|p| p.into_inner()).insert(
            address.to_string(),
            SimSub {
                fs: Arc::new(fs),
                cache: BTreeSet::new(),
                generation: 1,
                scan_count: 1,
                updates: 0,
                unreachable: false,
                health_fails: false,
                health: None,
            },
        );
    }

    /// Changes a sub's tree by hand (as an operator editing a file would).
    pub fn edit(&self, address: &str, f: impl FnOnce(&mut FileSystem)) {
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        let s = subs.get_mut(address).expect("no such sub");
        let mut fs = (*s.fs).clone();
        f(&mut fs);
        s.fs = Arc::new(fs);
        s.generation += 1;
    }

    pub fn sub(&self, address: &str) -> SimSub {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())[address].clone()
    }

    fn with<T>(
        &self,
        address: &str,
        f: impl FnOnce(&mut SimSub) -> Result<T, RpcError>,
    ) -> Result<T, RpcError> {
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        match subs.get_mut(address) {
            Some(s) if !s.unreachable => f(s),
            _ => Err(RpcError(format!("{address}: connection refused"))),
        }
    }

    async fn busy(&self) -> RunningGuard<'_> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.update_time).await;
        RunningGuard(&self.running)
    }
}

struct RunningGuard<'a>(&'a AtomicUsize);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl SubRpc for SimFleet {
    async fn poll(&self, address: &str, req: PollRequest) -> Result<PollResponse, RpcError> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        let r = self.with(address, |s| {
            s.scan_count += 1;
            let send = req.have_generation != s.generation && !req.short_poll_only;
            Ok(PollResponse {
                generation: s.generation,
                scan_count: s.scan_count,
                free_space: Some(1 << 40),
                file_system_follows: send,
                file_system: send.then(|| (*s.fs).clone()),
                object_cache: send.then(|| s.cache.clone()),
                last_health_check: s.health.clone(),
                ..PollResponse::default()
            })
        })?;
        if r.file_system.is_some() {
            self.trees_sent.fetch_add(1, Ordering::Relaxed);
        }
        Ok(r)
    }

    async fn fetch(&self, address: &str, req: FetchRequest) -> Result<FetchReply, RpcError> {
        let _running = self.busy().await;
        let objects = u64::try_from(req.objects.len()).unwrap_or(u64::MAX);
        self.with(address, |s| {
            s.cache.extend(req.objects);
            s.generation += 1;
            Ok(())
        })?;
        Ok(FetchReply {
            started: false,
            // 4 KiB an object, at the simulated pace.
            stats: Some(FetchStats {
                objects,
                bytes: objects * 4096,
                seconds: self.update_time.as_secs_f64(),
                rate_limit: None,
            }),
            new_generation: true,
        })
    }

    async fn update(&self, address: &str, req: UpdateRequest) -> Result<UpdateReport, RpcError> {
        let high = req
            .matched_triggers()
            .iter()
            .any(|t| t.high_impact || t.do_reboot);
        let (counter, max) = if high {
            (&self.high_impact_running, &self.max_high_impact_running)
        } else {
            (
                &self.ordinary_updates_running,
                &self.max_ordinary_updates_running,
            )
        };
        let now = counter.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(now, Ordering::SeqCst);
        let _kind = RunningGuard(counter);
        let _running = self.busy().await;
        if high {
            tokio::time::sleep(self.reboot_time).await;
        }
        let mut report = UpdateReport {
            image_name: req.image_name.clone(),
            ..UpdateReport::default()
        };
        report.apply.change_window_ms = 2.0;
        let image = self
            .images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&req.image_name)
            .cloned()
            .ok_or_else(|| RpcError(format!("no image {}", req.image_name)))?;
        self.with(address, |s| {
            s.fs = Arc::new(image.fs.clone());
            s.generation += 1;
            s.updates += 1;
            let health = HealthCheck {
                image_name: req.image_name.clone(),
                at_ms: i64::try_from(s.updates).unwrap_or(i64::MAX),
                outcome: CommandOutcome {
                    command: "health".into(),
                    ok: !s.health_fails,
                    exit_code: Some(i32::from(s.health_fails)),
                    ..CommandOutcome::default()
                },
            };
            report.health = Some(health.clone());
            s.health = Some(health);
            Ok(())
        })?;
        Ok(report)
    }

    async fn cleanup(&self, address: &str, objects: Vec<ObjectId>) -> Result<(), RpcError> {
        self.with(address, |s| {
            for o in &objects {
                s.cache.remove(o);
            }
            s.generation += 1;
            Ok(())
        })
    }
}

#[async_trait]
impl ImageSource for SimFleet {
    async fn image(&self, name: &str) -> Result<Option<Arc<Image>>, RpcError> {
        Ok(self
            .images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned())
    }
}
