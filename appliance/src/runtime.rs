//! The service runtime: every subsystem of `paddock serve` runs here, in one shape.
//!
//! A service is a named future built from the shared [`Context`] (store, leadership watch,
//! cancellation) and run until its token is cancelled. Its [`Policy`] says what its end
//! means: a `Fatal` service (a listener, the election) stops the appliance when it ends or
//! fails; a `Restart` service (a watch, a sync loop) is logged and started again after a
//! backoff with jitter. Leader-only work runs through [`Runtime::while_leading`] and
//! [`Runtime::every_while_leading`]: started when this host's tenure begins, cancelled when
//! it ends.
//!
//! Shutdown drains: [`Runtime::drain`] cancels every service's token, so listeners stop
//! accepting and finish the requests in flight, and waits up to the grace period before it
//! aborts what is left.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use paddock_clock::Backoff;
use paddock_store::{Compare, Store};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::leader::LeaderRx;

/// What a service's end means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The appliance cannot serve without it: its end (error, return or panic) stops the
    /// appliance.
    Fatal,
    /// Started again after a backoff (1 s doubling to 60 s, with jitter) when it fails or
    /// returns before shutdown.
    Restart,
}

/// What every service is built from.
#[derive(Clone)]
pub struct Context {
    pub store: Arc<dyn Store>,
    pub leader: LeaderRx,
    /// Cancelled when the appliance shuts down: stop accepting, finish, return.
    pub cancel: CancellationToken,
}

/// Why [`Runtime::wait`] returned.
#[derive(Debug)]
pub enum Stop {
    /// A signal (SIGTERM, SIGINT) asked for a shutdown.
    Asked(&'static str),
    /// A fatal service ended.
    Failed(anyhow::Error),
}

type Outcome = (&'static str, Policy, anyhow::Result<()>);

pub struct Runtime {
    ctx: Context,
    tasks: JoinSet<Outcome>,
}

impl Runtime {
    pub fn new(store: Arc<dyn Store>, leader: LeaderRx) -> Self {
        Runtime {
            ctx: Context {
                store,
                leader,
                cancel: CancellationToken::new(),
            },
            tasks: JoinSet::new(),
        }
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Runs a service: `make` builds one run of it from a fresh context. The run watches the
    /// context's token itself and returns once it is cancelled and its work in flight is
    /// done (a listener finishes its requests); [`Runtime::drain`] aborts it after the grace
    /// period otherwise.
    pub fn spawn<M, F>(&mut self, name: &'static str, policy: Policy, mut make: M)
    where
        M: FnMut(Context) -> F + Send + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let ctx = self.ctx.clone();
        self.tasks.spawn(async move {
            let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
            loop {
                let result = make(ctx.clone()).await;
                if ctx.cancel.is_cancelled() || policy == Policy::Fatal {
                    return (name, policy, result);
                }
                let delay = backoff.next_delay();
                match result {
                    Ok(()) => tracing::warn!(service = name, ?delay, "service returned; restarting"),
                    Err(e) => {
                        tracing::error!(service = name, error = %format!("{e:#}"), ?delay, "service failed; restarting")
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = ctx.cancel.cancelled() => return (name, policy, Ok(())),
                }
            }
        });
    }

    /// A service built once (it owns what cannot be built again, a bound listener): it
    /// cannot be restarted, so it is always `Fatal`. Like [`Runtime::spawn`]'s, its run
    /// watches the context's token.
    pub fn spawn_once<M, F>(&mut self, name: &'static str, make: M)
    where
        M: FnOnce(Context) -> F + Send + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let mut once = Some(make);
        self.spawn(name, Policy::Fatal, move |ctx| {
            let run = once.take().map(|make| make(ctx));
            async move {
                match run {
                    Some(run) => run.await,
                    None => anyhow::bail!("{name} cannot be started again"),
                }
            }
        });
    }

    /// A service with nothing to finish: run once, dropped at shutdown (a loop that never
    /// returns by itself).
    pub fn spawn_future<F>(&mut self, name: &'static str, future: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.spawn_once(name, move |ctx| async move {
            until_cancelled(ctx.cancel, future).await.unwrap_or(Ok(()))
        });
    }

    /// Runs `make` while this host leads: started when a tenure begins, its token cancelled
    /// when the tenure ends (it must then return; it is started again on the next tenure).
    /// `make` gets the tenure's fence.
    pub fn while_leading<M, F>(&mut self, name: &'static str, make: M)
    where
        M: Fn(Context, Option<Compare>) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let make = Arc::new(make);
        self.spawn(name, Policy::Restart, move |ctx| {
            let make = make.clone();
            let cancel = ctx.cancel.clone();
            async move {
                until_cancelled(cancel, tenures(name, ctx, make)).await;
                Ok(())
            }
        });
    }

    /// Runs `work` every `period` while this host leads, with the leader's fence (none for a
    /// host alone) to carry on each of its writes.
    pub fn every_while_leading<W, F>(&mut self, name: &'static str, period: Duration, work: W)
    where
        W: Fn(Option<Compare>) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        self.every_or_woken_while_leading(name, period, None, work);
    }

    /// [`Runtime::every_while_leading`], and also at once each time `wake` is notified (the
    /// period then starts again): for work an event makes urgent and a missed event must not
    /// stall.
    pub fn every_or_woken_while_leading<W, F>(
        &mut self,
        name: &'static str,
        period: Duration,
        wake: Option<Arc<Notify>>,
        work: W,
    ) where
        W: Fn(Option<Compare>) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let work = Arc::new(work);
        self.spawn(name, Policy::Restart, move |ctx| {
            let work = work.clone();
            let leader = ctx.leader.clone();
            let each = move || {
                let fence = leader.borrow().as_ref().map(|l| l.fence());
                let work = work.clone();
                async move {
                    if let Some(fence) = fence {
                        work(fence).await;
                    }
                }
            };
            let wake = wake.clone();
            async move {
                until_cancelled(ctx.cancel, ticks_or_woken(period, wake.as_deref(), each)).await;
                Ok(())
            }
        });
    }

    /// Runs `work` every `period` on every host.
    pub fn every<W, F>(&mut self, name: &'static str, period: Duration, work: W)
    where
        W: Fn() -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let work = Arc::new(work);
        self.spawn(name, Policy::Restart, move |ctx| {
            let work = work.clone();
            async move {
                until_cancelled(ctx.cancel, ticks(period, move || work())).await;
                Ok(())
            }
        });
    }

    /// Waits for `asked` (a signal) or for a fatal service to end, whichever comes first.
    pub async fn wait<A>(&mut self, asked: A) -> Stop
    where
        A: Future<Output = &'static str>,
    {
        tokio::pin!(asked);
        loop {
            tokio::select! {
                why = &mut asked => return Stop::Asked(why),
                joined = self.tasks.join_next() => match joined {
                    None => return Stop::Failed(anyhow::anyhow!("no service is running")),
                    Some(Ok((name, _, Ok(())))) => {
                        return Stop::Failed(anyhow::anyhow!("{name} stopped unexpectedly"));
                    }
                    Some(Ok((name, _, Err(e)))) => return Stop::Failed(e.context(name)),
                    Some(Err(e)) if e.is_panic() => {
                        return Stop::Failed(anyhow::anyhow!("a service panicked: {e}"));
                    }
                    Some(Err(_)) => continue,
                },
            }
        }
    }

    /// Cancels every service and waits up to `grace` for them to finish (listeners finish
    /// the requests in flight); what is left then is aborted. Returns how many were.
    pub async fn drain(mut self, grace: Duration) -> usize {
        self.ctx.cancel.cancel();
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(None) => return 0,
                Ok(Some(Ok((name, _, Err(e))))) => {
                    tracing::warn!(service = name, error = %format!("{e:#}"), "service ended with an error while draining");
                }
                Ok(Some(_)) => {}
                Err(_) => {
                    let left = self.tasks.len();
                    tracing::warn!(
                        services = left,
                        ?grace,
                        "grace period over: aborting what is left"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    return left;
                }
            }
        }
    }
}

/// Runs `work` until it ends or the context is cancelled (then it is dropped: for work with
/// nothing in flight worth finishing).
/// `None` when it was cancelled.
pub async fn until_cancelled<F: Future>(cancel: CancellationToken, work: F) -> Option<F::Output> {
    tokio::select! {
        r = work => Some(r),
        () = cancel.cancelled() => None,
    }
}

/// `work` every `period`; a late tick waits a whole period rather than bunching up.
async fn ticks<W, F>(period: Duration, work: W)
where
    W: Fn() -> F,
    F: Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        work().await;
    }
}

/// [`ticks`], and a run at once whenever `wake` is notified (a notification that comes while
/// `work` runs is kept for the next turn), but never sooner than a fifth of `period` after the
/// last run began: a burst of wakes (a fleet turning synced) costs five runs a period at most.
async fn ticks_or_woken<W, F>(period: Duration, wake: Option<&Notify>, work: W)
where
    W: Fn() -> F,
    F: Future<Output = ()>,
{
    let Some(wake) = wake else {
        return ticks(period, work).await;
    };
    let gap = period / 5;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = wake.notified() => tick.reset(),
        }
        let began = tokio::time::Instant::now();
        work().await;
        tokio::time::sleep_until(began + gap).await;
    }
}

/// One run of `make` per tenure of this host, cancelled when the tenure ends.
async fn tenures<M, F>(name: &'static str, ctx: Context, make: Arc<M>)
where
    M: Fn(Context, Option<Compare>) -> F,
    F: Future<Output = ()>,
{
    let mut leader = ctx.leader.clone();
    loop {
        let fence = loop {
            if let Some(l) = leader.borrow_and_update().clone() {
                break l.fence();
            }
            if leader.changed().await.is_err() {
                // The sender is gone and this host does not lead: it never will.
                std::future::pending::<()>().await;
            }
        };
        let tenure = ctx.cancel.child_token();
        let run = make(
            Context {
                cancel: tenure.clone(),
                ..ctx.clone()
            },
            fence,
        );
        tokio::pin!(run);
        tokio::select! {
            () = &mut run => {}
            () = tenure_ends(&mut leader) => {
                tracing::info!(service = name, "tenure ended: stopping");
                tenure.cancel();
                run.await;
            }
        }
    }
}

/// Resolves when this host no longer leads.
async fn tenure_ends(leader: &mut LeaderRx) {
    loop {
        if leader.borrow_and_update().is_none() {
            return;
        }
        if leader.changed().await.is_err() {
            // One host: leadership never changes.
            std::future::pending::<()>().await;
        }
    }
}

/// SIGTERM or SIGINT, whichever comes first.
pub async fn signalled() -> anyhow::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runtime() -> (Runtime, crate::leader::LeaderTx) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let (tx, rx) = tokio::sync::watch::channel(None);
        (Runtime::new(store, rx), tx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_restart_service_is_started_again_after_a_backoff() {
        let (mut rt, _tx) = runtime();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        rt.spawn("flaky", Policy::Restart, move |_| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                anyhow::bail!("broken")
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // The first delay is between 0.5 and 1 s; the second between 1 and 2 s.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(rt.drain(Duration::from_secs(1)).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fatal_service_stops_the_appliance() {
        let (mut rt, _tx) = runtime();
        rt.spawn_future("listener", async { anyhow::bail!("port taken") });
        rt.spawn_future("idle", std::future::pending());
        match rt.wait(std::future::pending()).await {
            Stop::Failed(e) => assert!(format!("{e:#}").contains("listener: port taken"), "{e:#}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_stops_and_draining_waits_for_services_to_finish() {
        let (mut rt, _tx) = runtime();
        let finished = Arc::new(AtomicUsize::new(0));
        let f = finished.clone();
        rt.spawn("drains", Policy::Fatal, move |ctx| {
            let f = f.clone();
            async move {
                ctx.cancel.cancelled().await;
                // In-flight work finishing after the cancel.
                tokio::time::sleep(Duration::from_secs(2)).await;
                f.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        let stop = rt.wait(async { "SIGTERM" }).await;
        assert!(matches!(stop, Stop::Asked("SIGTERM")));
        assert_eq!(rt.drain(Duration::from_secs(5)).await, 0);
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "the work in flight finished"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_outlives_the_grace_period_is_aborted() {
        let (mut rt, _tx) = runtime();
        rt.spawn("stuck", Policy::Fatal, |_ctx| async {
            std::future::pending::<()>().await;
            Ok(())
        });
        rt.spawn_future("loop", std::future::pending());
        let started = tokio::time::Instant::now();
        assert_eq!(
            rt.drain(Duration::from_secs(3)).await,
            1,
            "the stuck one is aborted"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn leader_only_work_runs_during_a_tenure_only() {
        let (mut rt, tx) = runtime();
        let ticks = Arc::new(AtomicUsize::new(0));
        let t = ticks.clone();
        rt.every_while_leading("tick", Duration::from_secs(1), move |_fence| {
            let t = t.clone();
            async move {
                t.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), 0, "no tenure, no work");
        tx.send_replace(Some(crate::leader::Leadership::Sole));
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        let during = ticks.load(Ordering::SeqCst);
        assert!((2..=4).contains(&during), "{during}");
        tx.send_replace(None);
        tokio::time::sleep(Duration::from_millis(5_000)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), during, "the tenure ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenure_service_is_cancelled_when_the_tenure_ends() {
        let (mut rt, tx) = runtime();
        let (started, stopped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s, e) = (started.clone(), stopped.clone());
        rt.while_leading("herd", move |ctx, _fence| {
            let (s, e) = (s.clone(), e.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                let _guard = OnDrop(e);
                ctx.cancel.cancelled().await;
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(started.load(Ordering::SeqCst), 0);
        tx.send_replace(Some(crate::leader::Leadership::Sole));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        tx.send_replace(None);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
        tx.send_replace(Some(crate::leader::Leadership::Sole));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "the next tenure starts it again"
        );
    }

    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A woken run comes at once, not at the next period; without a wake the period holds.
    #[tokio::test(start_paused = true)]
    async fn woken_work_runs_at_once_and_the_period_still_holds() {
        let (mut rt, tx) = runtime();
        tx.send_replace(Some(crate::leader::Leadership::Sole));
        let runs = Arc::new(AtomicUsize::new(0));
        let wake = Arc::new(Notify::new());
        let r = runs.clone();
        let period = Duration::from_secs(10);
        rt.every_or_woken_while_leading("census", period, Some(wake.clone()), move |_| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the first run is at once");
        // A wake within a fifth of the period of the last run waits for that fifth.
        wake.notify_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "not sooner than the gap");
        tokio::time::sleep(period / 5).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "woken: once the gap is over"
        );
        // A later wake comes at once.
        tokio::time::sleep(period / 2).await;
        wake.notify_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "woken: at once");
        // The wake started the period again: nothing until a whole period after it.
        tokio::time::sleep(period - Duration::from_millis(2)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            4,
            "the period holds without a wake"
        );
        assert_eq!(rt.drain(Duration::from_secs(1)).await, 0);
    }
}
