//! `paddock serve`: wires the store, DHCP, TFTP and HTTP together and runs until SIGTERM.

use std::net::Ipv4Addr;
use std::sync::Arc;

use anyhow::{Context, bail};
use dhcproto::v4::MessageType;
use paddock_dhcp::shell::{DhcpObserver, DhcpService, Listener};
use paddock_dhcp::{Leases, Server, ServerConfig};
use paddock_firewall::Nft;
use paddock_inspector::service::{DhcpAnswer, DhcpReply, Inspector, now_secs};
use paddock_inventory::MacAddr;
use paddock_store::{SqliteStore, Store};
use paddock_wire::unix_ms as now_ms;
use tokio::signal::unix::{SignalKind, signal};

use crate::boot;
use crate::config::{Config, DhcpConfig, LogFormat};
use crate::http::{AppState, router};
use crate::pxe_filter::{Admit, PxeFilter};

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PADDOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

/// Files "PXE client answered" entries in the machine's timeline, off the packet path: the
/// answers go, in order, to one task that files whatever has queued up in one write
/// (renewals counted, see `Inspector::dhcp_answered`).
struct TimelineObserver(tokio::sync::mpsc::Sender<DhcpAnswer>);

/// Answers waiting to be filed; past this (a store that stopped answering) they are dropped.
const TIMELINE_QUEUE: usize = 65_536;
/// Answers filed per write.
const TIMELINE_BATCH: usize = 256;

impl TimelineObserver {
    fn start(inspector: Arc<Inspector>) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel(TIMELINE_QUEUE);
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(TIMELINE_BATCH);
            while rx.recv_many(&mut batch, TIMELINE_BATCH).await > 0 {
                if let Err(e) = inspector.dhcp_answered(&batch).await {
                    tracing::warn!(answers = batch.len(), error = %e, "dhcp: timeline entries not recorded");
                }
                batch.clear();
            }
        });
        TimelineObserver(tx)
    }
}

impl DhcpObserver for TimelineObserver {
    fn pxe_answered(&self, mac: MacAddr, reply: MessageType, ip: Ipv4Addr, boot: &str) {
        let reply = match reply {
            MessageType::Offer => DhcpReply::Offer,
            MessageType::Ack => DhcpReply::Ack,
            MessageType::Nak => DhcpReply::Nak,
            other => {
                tracing::debug!(%mac, ?other, "dhcp: no timeline entry for this reply");
                return;
            }
        };
        let answer = DhcpAnswer {
            mac,
            reply,
            ip,
            boot: boot.to_string(),
            at_ms: now_ms(),
        };
        if let Err(e) = self.0.try_send(answer) {
            tracing::warn!(%mac, error = %e, "dhcp: timeline entry not recorded");
        }
    }
}

/// The IPv4 address that identifies this server on `interface`: the first one inside a
/// configured subnet, else the first one.
fn interface_address(interface: &str, cfg: &DhcpConfig) -> anyhow::Result<Ipv4Addr> {
    let addrs: Vec<Ipv4Addr> = nix::ifaddrs::getifaddrs()
        .context("listing interface addresses")?
        .filter(|a| a.interface_name == interface)
        .filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
        .collect();
    addrs
        .iter()
        .find(|ip| cfg.subnets.iter().any(|s| s.network.contains(*ip)))
        .or(addrs.first())
        .copied()
        .with_context(|| format!("interface {interface} has no IPv4 address; add one or remove it from dhcp.interfaces"))
}

/// The store the configuration names: SQLite under `data_dir`, or the etcd cluster.
/// The lock `paddock serve` holds on a single-host store for as long as it runs: the SQLite
/// store has one writer (its revisions are counted in that process), so other commands that
/// write (`paddock certs token` …) go through the running appliance's API instead.
pub fn store_lock(cfg: &Config) -> anyhow::Result<Option<std::fs::File>> {
    if cfg.cluster.is_some() {
        return Ok(None);
    }
    crate::at_rest::private_dir(&cfg.data_dir)?;
    let path = cfg.data_dir.join("store.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

pub async fn open_store(cfg: &Config) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match &cfg.cluster {
        None => {
            crate::at_rest::private_dir(&cfg.data_dir)?;
            Arc::new(SqliteStore::open(cfg.data_dir.join("store.db")).context("opening the store")?)
        }
        Some(c) => {
            let tls = match &c.etcd_tls {
                Some((ca, cert, key)) => {
                    crate::at_rest::check_key(key)?;
                    let read = |p: &std::path::PathBuf| {
                        std::fs::read_to_string(p)
                            .with_context(|| format!("reading {}", p.display()))
                    };
                    Some(paddock_store::EtcdTls {
                        ca_pem: read(ca)?,
                        cert_pem: read(cert)?,
                        key_pem: read(key)?,
                    })
                }
                None => None,
            };
            Arc::new(
                paddock_store::EtcdStore::connect_with(
                    &c.etcd_endpoints,
                    std::time::Duration::from_secs(5),
                    tls.as_ref(),
                )
                .await
                .context("connecting to the etcd cluster")?,
            )
        }
    })
}

pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let _store_lock = match (store_lock(&cfg)?, &cfg.cluster) {
        (Some(l), _) => Some(l),
        (None, None) => bail!(
            "another process holds {}: one paddock serve per data_dir",
            cfg.data_dir.join("store.lock").display()
        ),
        (None, Some(_)) => None,
    };
    crate::at_rest::private_dir(&cfg.data_dir)?;
    let store = open_store(&cfg).await?;
    let cfg = Arc::new(cfg);
    let mut tasks = tokio::task::JoinSet::new();
    // Leadership: one host alone always leads; several elect one through the store.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (leader_tx, leader_rx) = match &cfg.cluster {
        None => crate::leader::always(),
        Some(_) => tokio::sync::watch::channel(None),
    };
    let clock = cfg
        .cluster
        .as_ref()
        .map(|c| crate::leader::TenureClock::new(c.lease_ttl, c.lease_ttl / 3));
    let elector = cfg.cluster.as_ref().zip(clock.clone()).map(|(c, clock)| {
        let e = crate::leader::Elector {
            store: store.clone(),
            host: c.host.clone(),
            clock,
        };
        tracing::info!(host = %c.host, endpoints = ?c.etcd_endpoints, "cluster: campaigning for leadership");
        tokio::spawn(e.run(leader_tx, stop_rx))
    });
    let inspector = Arc::new(Inspector::new(store.clone(), cfg.inspector.clone()));
    // Certificates and tokens first: with TLS on and no certificates, nothing starts.
    let security = crate::security::Security::load(store.clone(), &cfg).await?;
    let objects = Arc::new(
        paddock_imageserver::objects::ObjectStore::open(&cfg.images.dir)
            .with_context(|| format!("opening the object store at {}", cfg.images.dir.display()))?,
    );
    let images = paddock_imageserver::images::ImageServer::new(store.clone(), objects);
    let mdb = paddock_imageserver::mdb::MdbService::new(store.clone(), cfg.images.mdb_file.clone());
    // Several hosts: each keeps every image's objects, fetched from the others, so any
    // leader's image server serves every image.
    let (peer_urls, own_url) = match &cfg.security {
        crate::config::SecurityConfig::Tls(t) => (&t.agent_urls, &t.public_url),
        crate::config::SecurityConfig::Insecure => (&cfg.discovery.agent_urls, &cfg.public_url),
    };
    let image_peers: Vec<String> = peer_urls
        .iter()
        .filter(|u| *u != own_url)
        .cloned()
        .collect();
    if !image_peers.is_empty() {
        let r = paddock_imageserver::replicate::Replicator::with_tls(
            images.clone(),
            image_peers,
            security.host_ureq_tls()?,
        );
        tokio::spawn(r.run(store.clone()));
    }
    let mut observers: Vec<Arc<dyn paddock_inspector::service::NodeObserver>> = Vec::new();
    let filter = match &cfg.firewall {
        Some(fw) => {
            let f = PxeFilter::start(
                Nft::local(),
                fw.interface.clone(),
                fw.discovery,
                inspector.clone(),
                leader_rx.borrow().is_some(),
                clock.clone(),
            )
            .await
            .context("starting the PXE filter (nftables)")?;
            if clock.is_some() {
                let kf = f.clone();
                tasks.spawn(async move {
                    kf.keep_leader_element().await;
                    Ok(())
                });
            }
            observers.push(f.clone());
            // The pass rule follows leadership.
            let (lf, mut lrx) = (f.clone(), leader_rx.clone());
            tasks.spawn(async move {
                while lrx.changed().await.is_ok() {
                    let leads = lrx.borrow_and_update().is_some();
                    lf.set_pass(leads).await;
                }
                // One host: leadership never changes (the sender is gone).
                std::future::pending::<()>().await;
                Ok(())
            });
            // Changes made through other hosts arrive through the store.
            if cfg.cluster.is_some() {
                let (wf, st) = (f.clone(), store.clone());
                tasks.spawn(async move {
                    follow_nodes(st, wf).await;
                    Ok(())
                });
            }
            let (r, period) = (f.clone(), fw.reconcile);
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    if let Err(e) = r.reconcile().await {
                        tracing::error!(error = %e, "pxe filter: reconcile failed");
                    }
                }
            });
            tracing::info!(interface = %fw.interface, discovery = fw.discovery, "pxe filter: on");
            Some(f)
        }
        None => None,
    };

    // Power (BMCs): manage_boot follows introspections; the leader's throttle and sync.
    let power = crate::power::Power::new(
        store.clone(),
        inspector.clone(),
        cfg.power,
        paddock_power::RetryPolicy::default(),
    );
    observers.push(Arc::new(crate::power::ManageBoot(power.clone())));
    crate::power::spawn(&mut tasks, power.clone(), leader_rx.clone());

    // Provisioning: a rule's set-image acts when the introspection finishes.
    let provisioner = Arc::new(crate::provisioning::Provisioner {
        store: store.clone(),
        inspector: inspector.clone(),
        images: images.clone(),
        mdb: mdb.clone(),
        public_url: cfg.api_url().to_string(),
        subd_port: cfg
            .dominator
            .as_ref()
            .map_or(paddock_birther::protocol::SUBD_PORT, |d| d.subd_port),
        timeouts: cfg.provisioning.timeouts,
        security: Some(security.clone()),
        power: Some(power.clone()),
    });
    observers.push(Arc::new(crate::provisioning::RuleWishes(
        provisioner.clone(),
    )));
    if cfg.images.record_enrolled {
        // With TLS, an agent's reported address is called only inside the subnets this
        // appliance gives leases on.
        let networks = match cfg.security {
            crate::config::SecurityConfig::Tls(_) => Some(
                cfg.dhcp
                    .iter()
                    .flat_map(|d| d.subnets.iter().map(|s| s.network))
                    .collect(),
            ),
            crate::config::SecurityConfig::Insecure => None,
        };
        observers.push(crate::images::MdbRecorder::within(
            inspector.clone(),
            mdb.clone(),
            networks,
        ));
    }
    inspector.observe(Arc::new(crate::images::Observers(observers)));
    if cfg.images.mdb_file.is_some() {
        let (m, period) = (mdb.clone(), cfg.images.mdb_poll);
        tasks.spawn(async move {
            m.watch(period, now_ms).await;
            Ok(())
        });
    }
    {
        let (im, period) = (images.clone(), cfg.images.expire_check);
        let lrx_images = leader_rx.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                if !leads(&lrx_images) {
                    continue;
                }
                if let Err(e) = im.expire(now_ms()).await {
                    tracing::error!(error = %e, "images: expiry check failed");
                }
            }
        });
    }

    if let (Some(c), Some(d)) = (&cfg.cluster, &cfg.dhcp) {
        claim_pools(&store, &c.host, d).await?;
    }
    let dhcp = match &cfg.dhcp {
        Some(d) => {
            let listeners = d
                .interfaces
                .iter()
                .map(|i| {
                    Ok(Listener {
                        interface: i.clone(),
                        address: interface_address(i, d)?,
                        port: d.port,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let leases = Leases::new(d.subnets.clone(), d.reservations.clone())?;
            let server = Server::new(
                leases,
                ServerConfig {
                    boot: cfg.boot.clone(),
                    client_port: d.client_port,
                    relay_port: d.relay_port,
                },
            )
            .with_limits(d.rate_limits);
            let policy = Arc::new(Admit {
                deny: d.deny_macs.clone(),
                filter: filter.clone(),
                leader: cfg.cluster.as_ref().map(|_| leader_rx.clone()),
            });
            let observer = Arc::new(TimelineObserver::start(inspector.clone()));
            let service = DhcpService::new(server, store.clone(), policy, Some(observer)).await?;
            let run = service.clone().run(listeners);
            tasks.spawn(async move { run.await.context("DHCP server") });
            security.bind_leases(service.clone());
            Some(service)
        }
        None => None,
    };

    if let Some(t) = &cfg.tftp {
        let mem = paddock_tftp::MemFiles::default();
        mem.insert(
            "autoexec.ipxe",
            boot::chain_script(&cfg.public_url).into_bytes(),
        );
        for addr in &t.listen {
            paddock_tftp::spawn(*addr, t.server.clone(), mem.clone())?;
            tracing::info!(%addr, "tftp: listening");
        }
    }

    {
        // Introspection timeouts (Inspector's periodic clean-up).
        let inspector = inspector.clone();
        every_while_leading(&mut tasks, cfg.clean_up_period, &leader_rx, move |fence| {
            let inspector = inspector.clone();
            async move {
                match inspector.expire_fenced(now_secs(), fence.as_ref()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(count = n, "inspector: introspections timed out"),
                    Err(e) => tracing::error!(error = %e, "inspector: timeout check failed"),
                }
            }
        });
    }
    {
        // Timeline pruning: the newest entries per node and MAC, and the last introspections.
        let (inspector, limits) = (inspector.clone(), cfg.timeline.limits);
        every_while_leading(
            &mut tasks,
            cfg.timeline.prune_every,
            &leader_rx,
            move |fence| {
                let inspector = inspector.clone();
                async move {
                    match inspector.prune_timeline(&limits, fence.as_ref()).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(deleted = n, "timeline: pruned"),
                        Err(e) => tracing::error!(error = %e, "timeline: pruning failed"),
                    }
                }
            },
        );
    }
    let census = match &cfg.dominator {
        Some(d) => crate::dominator::spawn(
            &mut tasks,
            d,
            crate::dominator::Wiring {
                store: store.clone(),
                mdb: mdb.clone(),
                images: images.clone(),
                leader: leader_rx.clone(),
                image_server_url: cfg.api_url().to_string(),
                host: cfg
                    .cluster
                    .as_ref()
                    .map_or_else(|| "paddock".to_string(), |c| c.host.clone()),
                inspector: inspector.clone(),
                tls: security.sub_client_config()?,
            },
        ),
        None => paddock_dominator::Census::default(),
    };
    crate::provisioning::watch_census(
        &mut tasks,
        provisioner.clone(),
        census.clone(),
        leader_rx.clone(),
    );
    crate::provisioning::expire_runs(&mut tasks, provisioner.clone(), leader_rx.clone());
    let dominator = crate::dominator::Dominator {
        store: store.clone(),
        census,
        leader: leader_rx.clone(),
        enabled: cfg.dominator.is_some(),
        mdb: mdb.clone(),
        images: images.clone(),
    };
    let roles = crate::roles::Roles::new(
        store.clone(),
        crate::census::CensusService {
            store: store.clone(),
            inspector: inspector.clone(),
        },
        dominator.clone(),
        cfg.roles.clone(),
        cfg.api_url().to_string(),
        leader_rx.clone(),
    );
    tokio::spawn(roles.clone().run());
    let state = AppState {
        security: security.clone(),
        power,
        dominator,
        roles,
        config: cfg.clone(),
        provisioning: provisioner,
        inspector,
        dhcp,
        filter: filter.clone(),
        imageserver: paddock_imageserver::api::ImageServerState { images, mdb },
        leader: leader_rx.clone(),
        store: store.clone(),
        assets: cfg
            .assets_dir
            .as_deref()
            .map(crate::assets::Assets::open)
            .transpose()?,
    };
    let listener = tokio::net::TcpListener::bind(cfg.http_listen)
        .await
        .with_context(|| format!("binding HTTP on {}", cfg.http_listen))?;
    tracing::info!(listen = %cfg.http_listen, public_url = %cfg.public_url, "http: listening");
    let app = router(state);
    let limits = cfg.listener_limits();
    {
        let app = app.clone();
        tasks.spawn(async move {
            paddock_security::tls::serve(listener, None, app, limits)
                .await
                .context("HTTP server")
        });
    }
    if let (crate::config::SecurityConfig::Tls(t), Some(server)) =
        (&cfg.security, security.server_config()?)
    {
        let listener = tokio::net::TcpListener::bind(t.listen)
            .await
            .with_context(|| format!("binding HTTPS on {}", t.listen))?;
        tracing::info!(listen = %t.listen, public_url = %t.public_url, ca = %security.tls.as_ref().map_or("", |s| s.ca_fingerprint.as_str()), "https: listening");
        tasks.spawn(async move {
            paddock_security::tls::serve(listener, Some(server), app, limits)
                .await
                .context("HTTPS server")
        });
    }
    {
        // The audit log keeps the newest entries.
        let security = security.clone();
        every_while_leading(
            &mut tasks,
            std::time::Duration::from_secs(60),
            &leader_rx,
            move |_fence| {
                let security = security.clone();
                async move {
                    match security.audit.prune().await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(deleted = n, "audit: pruned"),
                        Err(e) => tracing::error!(error = %e, "audit: pruning failed"),
                    }
                }
            },
        );
    }

    {
        // Refusals are counted in memory and written every few seconds, on every host.
        let audit = security.audit.clone();
        tasks.spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                every.tick().await;
                audit.flush(paddock_wire::unix_ms()).await;
            }
        });
    }

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        Some(res) = tasks.join_next() => {
            match res {
                Ok(Ok(())) => bail!("a service stopped unexpectedly"),
                Ok(Err(e)) => return Err(e),
                Err(e) => bail!("a service panicked: {e}"),
            }
        }
    }
    // Fail closed first: no pass rule once this host stops serving; then leave the
    // election so another host takes over at once; then stop everything else.
    if let Some(f) = &filter {
        f.close().await;
    }
    let _ = stop_tx.send(true);
    if let Some(e) = elector {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), e).await;
    }
    tasks.abort_all();
    Ok(())
}

/// Several hosts share the lease records, so their DHCP pools must not overlap: each host
/// records its pools under `cluster/pools/<host>` and refuses to start when another host's
/// pools overlap its own.
async fn claim_pools(
    store: &Arc<dyn Store>,
    host: &str,
    d: &crate::config::DhcpConfig,
) -> anyhow::Result<()> {
    let mine: Vec<(u32, u32)> = d
        .subnets
        .iter()
        .flat_map(|s| s.pools.iter())
        .map(|p| (u32::from(p.start), u32::from(p.end)))
        .collect();
    for kv in store.range("cluster/pools/").await? {
        let other = kv.key.trim_start_matches("cluster/pools/");
        if other == host {
            continue;
        }
        let theirs: Vec<(u32, u32)> = serde_json::from_slice(&kv.value).unwrap_or_default();
        for (a, b) in &mine {
            if let Some((c, e)) = theirs.iter().find(|(c, e)| a <= e && c <= b) {
                bail!(
                    "DHCP pool {}-{} overlaps host {other}'s pool {}-{}: hosts of one appliance need disjoint pools",
                    Ipv4Addr::from(*a),
                    Ipv4Addr::from(*b),
                    Ipv4Addr::from(*c),
                    Ipv4Addr::from(*e)
                );
            }
        }
    }
    store
        .put(&format!("cluster/pools/{host}"), serde_json::to_vec(&mine)?)
        .await?;
    Ok(())
}

/// Runs `work` every `period` while this host leads. Leader-only work: `work` gets the
/// leader's fence (none for a host alone) to carry on each of its writes.
fn every_while_leading<W, F>(
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
    period: std::time::Duration,
    leader: &crate::leader::LeaderRx,
    mut work: W,
) where
    W: FnMut(Option<paddock_store::Compare>) -> F + Send + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let lrx = leader.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let Some(leadership) = lrx.borrow().clone() else {
                continue;
            };
            work(leadership.fence()).await;
        }
    });
}

fn leads(rx: &crate::leader::LeaderRx) -> bool {
    rx.borrow().is_some()
}

/// Keeps this host's filter sets in step with node changes made through any host: every
/// change under `nodes/` triggers an update (bursts are folded into one).
async fn follow_nodes(store: Arc<dyn Store>, filter: Arc<PxeFilter>) {
    loop {
        let mut w = match store.watch("nodes/", 0).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "pxe filter: cannot watch nodes; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        // Changes that happened before the watch started are caught by this full update.
        if let Err(e) = filter.update(&[]).await {
            tracing::warn!(error = %e, "pxe filter: update failed");
        }
        loop {
            match w.next().await {
                Some(Ok(first)) => {
                    // Fold a burst: take whatever else is already queued; read only the
                    // nodes that changed.
                    let mut keys = vec![first.kv.key];
                    while let Ok(Some(Ok(ev))) =
                        tokio::time::timeout(std::time::Duration::from_millis(5), w.next()).await
                    {
                        keys.push(ev.kv.key);
                    }
                    let uuids: Vec<uuid::Uuid> = keys
                        .iter()
                        .filter_map(|k| k.strip_prefix("nodes/")?.parse().ok())
                        .collect();
                    if let Err(e) = filter.update(&uuids).await {
                        tracing::warn!(error = %e, "pxe filter: update failed");
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pxe filter: node watch ended; watching again");
                    break;
                }
                None => break,
            }
        }
    }
}
