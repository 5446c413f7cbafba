//! `paddock serve`: the recipe. It opens the store, builds each subsystem from the
//! configuration and hands its services to the [`Runtime`], which runs them until SIGTERM
//! and then drains them.

use std::sync::Arc;

use paddock_imageserver::images::ImageServer;
use paddock_imageserver::mdb::MdbService;
use paddock_inspector::service::{Inspector, NodeObserver};
use paddock_store::Store;

use crate::config::{Config, DhcpConfig, LogFormat, SecurityConfig};
use crate::leader::{LeaderRx, LeaderTx, TenureClock};
use crate::pxe_filter::{Admit, PxeFilter};
use crate::runtime::{Runtime, Stop};
use crate::security::Security;

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

/// Brings the store to this release's schema, writing a backup of it first when it must be
/// migrated (into `<data_dir>/backups/`; the image objects are referenced, not copied, as no
/// migration touches them).
async fn up_to_date(cfg: &Config, store: &Arc<dyn Store>) -> anyhow::Result<()> {
    use crate::schema::Outcome;
    let outcome = crate::schema::bring_up_to_date(store.as_ref(), async || {
        let dir = cfg.data_dir.join("backups");
        crate::at_rest::private_dir(&dir)?;
        let stamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let file = dir.join(format!(
            "before-schema-{}-{stamp}.tar",
            crate::schema::CURRENT
        ));
        let src = cfg.backup_sources(crate::backup::StoreSource::Open(store.clone()), None, false);
        crate::backup::write(&file, src).await?;
        Ok(Some(file))
    })
    .await?;
    match outcome {
        Outcome::Migrated { from, to, backup } => tracing::info!(
            from,
            to,
            backup = ?backup,
            "store: migrated to this release's schema (the backup holds the store as it was)"
        ),
        Outcome::NewerCompatible(s) => tracing::warn!(
            found = s.version,
            known = crate::schema::CURRENT,
            "store: a newer release migrated the store compatibly; upgrade this host"
        ),
        Outcome::Stamped | Outcome::UpToDate | Outcome::MigratedElsewhere => {}
    }
    // Only now, with the backup on disk and the store at this schema, is the file closed to
    // releases from before store versions.
    store.seal_layout().await?;
    Ok(())
}

/// Tells the service manager, when one started us with `NOTIFY_SOCKET`; a failure to tell
/// it is logged, never fatal (without systemd there is nobody to tell).
fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!(error = %e, "could not notify the service manager");
    }
}

/// What most subsystems are built from.
struct Core {
    cfg: Arc<Config>,
    store: Arc<dyn Store>,
    leader: LeaderRx,
    inspector: Arc<Inspector>,
    security: Arc<Security>,
    images: Arc<ImageServer>,
    mdb: Arc<MdbService>,
}

/// What the HTTP API and the console serve, besides the [`Core`].
struct Served {
    power: Arc<crate::power::Power>,
    dominator: crate::dominator::Dominator,
    roles: Arc<crate::roles::Roles>,
    provisioner: Arc<crate::provisioning::Provisioner>,
    dhcp: Option<Arc<paddock_dhcp::shell::DhcpService>>,
    dhcp6: Option<Arc<paddock_dhcp::v6::shell::Dhcp6Service>>,
    dns: Option<crate::dns::DnsHandle>,
    computed: Arc<crate::computed::Renderer>,
    filter: Option<Arc<PxeFilter>>,
}

pub async fn run(cfg: Config) -> anyhow::Result<()> {
    // A connection of either listener (a rack's machines each hold one while they wait for
    // a lane), a TFTP transfer and a sub each take a descriptor.
    paddock_dominator::client::raise_open_file_limit();
    let _lock = crate::cluster::hold_store_lock(&cfg.data_dir, cfg.cluster.as_ref())?;
    let store = crate::cluster::open_store(&cfg.data_dir, cfg.cluster.as_ref()).await?;
    up_to_date(&cfg, &store).await?;
    let cfg = Arc::new(cfg);
    // Leadership: one host alone always leads; several elect one through the store.
    let (leader_tx, leader_rx) = match &cfg.cluster {
        None => crate::leader::always(),
        Some(_) => tokio::sync::watch::channel(None),
    };
    let mut rt = Runtime::new(store.clone(), leader_rx.clone());
    let tenure = elect(&mut rt, &cfg, leader_tx);
    let core = Core::open(&mut rt, cfg.clone(), store, leader_rx).await?;
    let filter = match &cfg.firewall {
        Some(fw) => Some(
            crate::pxe_filter::start_filter(&mut rt, fw, core.inspector.clone(), tenure).await?,
        ),
        None => None,
    };
    let power = core.start_power(&mut rt);
    let computed = core.computed();
    let provisioner = core.provisioner(&power, &computed);
    core.observe(&filter, &power, &provisioner);
    let dhcp = match &cfg.dhcp {
        Some(d) => Some(core.start_dhcp(&mut rt, d, &filter).await?),
        None => None,
    };
    let dns = crate::dns::start(&mut rt, cfg.dns.as_ref()).await?;
    let dhcp6 = match &cfg.dhcp6 {
        Some(d) => Some(core.start_dhcp6(&mut rt, d, &filter).await?),
        None => None,
    };
    crate::inspection::start(&mut rt, &core.inspector, cfg.clean_up_period, &cfg.timeline);
    crate::audit::start(&mut rt, core.security.audit.clone());
    if let Some(t) = &core.security.tls {
        crate::agent_tokens::start(&mut rt, t.agent_tokens.ttl);
    }
    let (dominator, disruption) = core.start_dominator(&mut rt, &provisioner, &computed)?;
    let roles = core.start_roles(&mut rt, &dominator, disruption.as_deref());
    let served = Served {
        power,
        dominator,
        roles,
        provisioner,
        dhcp,
        dhcp6,
        dns,
        computed,
        filter: filter.clone(),
    };
    core.start_http(&mut rt, served).await?;
    // Every socket is bound by now: tell systemd (Type=notify) that the appliance is ready.
    notify(&[sd_notify::NotifyState::Ready]);
    shut_down(rt, filter.as_deref(), &cfg).await
}

/// With several hosts, campaigns for leadership through the store (resigning at shutdown,
/// so another host takes over at once); returns the tenure clock the PXE filter follows.
fn elect(rt: &mut Runtime, cfg: &Config, leader_tx: LeaderTx) -> Option<Arc<TenureClock>> {
    let c = cfg.cluster.as_ref()?;
    let clock = TenureClock::new(c.lease_ttl, c.lease_ttl / 3);
    let elector = crate::leader::Elector {
        store: rt.context().store.clone(),
        host: c.host.clone(),
        clock: clock.clone(),
    };
    tracing::info!(host = %c.host, endpoints = ?c.etcd_endpoints, "cluster: campaigning for leadership");
    rt.spawn_once("election", move |ctx| async move {
        elector.run(leader_tx, ctx.cancel).await;
        Ok(())
    });
    Some(clock)
}

/// Waits for SIGTERM (or a fatal service's end), then stops in order: the PXE filter fails
/// closed first (no pass rule once this host stops serving), then every service is
/// cancelled at once — the election resigns, listeners stop accepting and finish the
/// requests in flight within the grace period.
async fn shut_down(
    mut rt: Runtime,
    filter: Option<&PxeFilter>,
    cfg: &Config,
) -> anyhow::Result<()> {
    let stop = rt.wait(crate::runtime::signalled().await?).await;
    match &stop {
        Stop::Asked(signal) => tracing::info!("{signal}: shutting down"),
        Stop::Failed(e) => tracing::error!(error = %format!("{e:#}"), "shutting down"),
    }
    notify(&[sd_notify::NotifyState::Stopping]);
    if let Some(f) = filter {
        f.close().await;
    }
    // The listeners' own grace, and a second for the rest to notice.
    let aborted = rt
        .drain(cfg.http_shutdown_grace + std::time::Duration::from_secs(1))
        .await;
    tracing::info!(aborted, "stopped");
    match stop {
        Stop::Asked(_) => Ok(()),
        Stop::Failed(e) => Err(e),
    }
}

impl Core {
    async fn open(
        rt: &mut Runtime,
        cfg: Arc<Config>,
        store: Arc<dyn Store>,
        leader: LeaderRx,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let inspector = Arc::new(Inspector::new(store.clone(), cfg.inspector.clone()));
        // Certificates and tokens first: with TLS on and no certificates, nothing starts.
        let security = Security::load(store.clone(), &cfg.reach()).await?;
        let objects = paddock_imageserver::objects::ObjectStore::open(&cfg.images.dir)
            .with_context(|| format!("opening the object store at {}", cfg.images.dir.display()))?;
        let images = ImageServer::new(store.clone(), Arc::new(objects));
        let mdb = MdbService::new(store.clone(), cfg.images.mdb_file.clone());
        let (peer_urls, own_url) = match &cfg.security {
            SecurityConfig::Tls(t) => (&t.agent_urls, &t.public_url),
            SecurityConfig::Insecure => (&cfg.discovery.agent_urls, &cfg.public_url),
        };
        let peers = crate::images::Replication {
            urls: peer_urls
                .iter()
                .filter(|u| *u != own_url)
                .cloned()
                .collect(),
            tls: security.host_ureq_tls()?,
        };
        crate::images::start(rt, &cfg.images, &images, &mdb, peers);
        Ok(Core {
            cfg,
            store,
            leader,
            inspector,
            security,
            images,
            mdb,
        })
    }

    /// Provisioning: a rule's set-image acts when the introspection finishes.
    fn provisioner(
        &self,
        power: &Arc<crate::power::Power>,
        computed: &Arc<crate::computed::Renderer>,
    ) -> Arc<crate::provisioning::Provisioner> {
        let cfg = &self.cfg;
        Arc::new(crate::provisioning::Provisioner {
            store: self.store.clone(),
            inspector: self.inspector.clone(),
            images: self.images.clone(),
            mdb: self.mdb.clone(),
            public_url: cfg.api_url().to_string(),
            subd_port: cfg
                .dominator
                .as_ref()
                .map_or(paddock_birther::protocol::SUBD_PORT, |d| d.subd_port),
            timeouts: cfg.provisioning.timeouts,
            security: Some(self.security.clone()),
            power: Some(power.clone()),
            clock: Arc::new(paddock_clock::SystemClock),
            computed: Some(computed.clone() as Arc<dyn crate::provisioning::ComputedPaths>),
        })
    }

    /// What hears of node changes: the PXE filter, power's manage_boot, provisioning's rule
    /// wishes and the MDB recorder.
    fn observe(
        &self,
        filter: &Option<Arc<PxeFilter>>,
        power: &Arc<crate::power::Power>,
        provisioner: &Arc<crate::provisioning::Provisioner>,
    ) {
        let mut observers: Vec<Arc<dyn NodeObserver>> = Vec::new();
        if let Some(f) = filter {
            observers.push(f.clone());
        }
        observers.push(Arc::new(crate::power::ManageBoot(power.clone())));
        observers.push(Arc::new(crate::provisioning::RuleWishes(
            provisioner.clone(),
        )));
        if self.cfg.images.record_enrolled {
            // With TLS, an agent's reported address is called only inside the subnets this
            // appliance gives leases on.
            let networks = match self.cfg.security {
                SecurityConfig::Tls(_) => Some(
                    self.cfg
                        .dhcp
                        .iter()
                        .flat_map(|d| d.subnets.iter().map(|s| s.network))
                        .collect(),
                ),
                SecurityConfig::Insecure => None,
            };
            observers.push(crate::images::MdbRecorder::within(
                self.inspector.clone(),
                self.mdb.clone(),
                networks,
            ));
        }
        self.inspector
            .observe(Arc::new(crate::images::Observers(observers)));
    }

    async fn start_dhcp(
        &self,
        rt: &mut Runtime,
        d: &DhcpConfig,
        filter: &Option<Arc<PxeFilter>>,
    ) -> anyhow::Result<Arc<paddock_dhcp::shell::DhcpService>> {
        let start = self.dhcp_start(&d.deny_macs, filter);
        let service = crate::dhcp::start(rt, d, start).await?;
        self.security.bind_leases(service.clone());
        Ok(service)
    }

    async fn start_dhcp6(
        &self,
        rt: &mut Runtime,
        d: &crate::dhcp6::Dhcp6Config,
        filter: &Option<Arc<PxeFilter>>,
    ) -> anyhow::Result<Arc<paddock_dhcp::v6::shell::Dhcp6Service>> {
        let start = self.dhcp_start(&d.deny_macs, filter);
        crate::dhcp6::start(rt, d, start).await
    }

    /// What both DHCP services start with: who is admitted (the section's deny list, the PXE
    /// filter, and with several hosts only while leading), the boot policy, this host.
    fn dhcp_start(
        &self,
        deny: &std::collections::BTreeSet<paddock_inventory::MacAddr>,
        filter: &Option<Arc<PxeFilter>>,
    ) -> crate::dhcp::Start<'_> {
        crate::dhcp::Start {
            boot: &self.cfg.boot,
            cluster_host: self.cfg.cluster.as_ref().map(|c| c.host.as_str()),
            policy: Arc::new(Admit {
                deny: deny.clone(),
                filter: filter.clone(),
                leader: self.cfg.cluster.as_ref().map(|_| self.leader.clone()),
            }),
            inspector: self.inspector.clone(),
        }
    }

    /// The dominator (when configured) and provisioning's leader work, which follows the
    /// dominator's census; with the disruption check the herd asks (when a program or the
    /// roles' hooks can answer), which learns the roles once they are built.
    fn start_dominator(
        &self,
        rt: &mut Runtime,
        provisioner: &Arc<crate::provisioning::Provisioner>,
        computed: &Arc<crate::computed::Renderer>,
    ) -> anyhow::Result<(
        crate::dominator::Dominator,
        Option<Arc<crate::disruption::Checker>>,
    )> {
        let mut checker = None;
        let synced = Arc::new(tokio::sync::Notify::new());
        let census = match &self.cfg.dominator {
            Some(d) => {
                if d.disruption_check.is_some() || self.cfg.roles.is_some() {
                    checker = Some(crate::disruption::Checker::new(
                        d.disruption_check.clone(),
                        d.disruption_timeout,
                        self.mdb.clone(),
                    ));
                }
                let disruption = checker
                    .clone()
                    .map(|c| c as Arc<dyn paddock_dominator::DisruptionCheck>);
                let wiring = crate::dominator::Wiring {
                    store: self.store.clone(),
                    mdb: self.mdb.clone(),
                    images: self.images.clone(),
                    image_server_url: self.cfg.api_url().to_string(),
                    host: self
                        .cfg
                        .cluster
                        .as_ref()
                        .map_or_else(|| "paddock".to_string(), |c| c.host.clone()),
                    inspector: self.inspector.clone(),
                    tls: self.security.sub_client_config()?,
                    disruption,
                    overlays: Some(computed.clone() as Arc<dyn crate::dominator::Overlays>),
                    synced: synced.clone(),
                };
                crate::dominator::start(rt, d, wiring)
            }
            None => paddock_dominator::Census::default(),
        };
        crate::provisioning::start(rt, provisioner.clone(), census.clone(), synced);
        let dominator = crate::dominator::Dominator {
            store: self.store.clone(),
            census,
            leader: self.leader.clone(),
            enabled: self.cfg.dominator.is_some(),
            mdb: self.mdb.clone(),
            images: self.images.clone(),
        };
        Ok((dominator, checker))
    }

    /// Power: the BMC drivers, their queue and the throttle, started on the runtime.
    fn start_power(&self, rt: &mut Runtime) -> Arc<crate::power::Power> {
        let power = crate::power::Power::new(
            self.store.clone(),
            self.inspector.clone(),
            self.cfg.power,
            paddock_power::RetryPolicy::default(),
        );
        crate::power::start(rt, power.clone());
        power
    }

    /// Computed files: the roles' hook programs, and the DNS origin their data names.
    fn computed(&self) -> Arc<crate::computed::Renderer> {
        let cfg = &self.cfg;
        crate::computed::Renderer::new(
            self.store.clone(),
            self.images.clone(),
            self.inspector.clone(),
            cfg.roles.as_ref().map(|r| crate::computed::Programs {
                dir: r.hooks_dir.clone(),
                timeout: r.hook_timeout,
            }),
            cfg.dns.as_ref().map(|d| d.zone.origin.clone()),
        )
    }

    /// The roles (from the census and the dominator), which the disruption check, when
    /// there is one, asks from now on.
    fn start_roles(
        &self,
        rt: &mut Runtime,
        dominator: &crate::dominator::Dominator,
        disruption: Option<&crate::disruption::Checker>,
    ) -> Arc<crate::roles::Roles> {
        let roles = crate::roles::Roles::new(
            self.store.clone(),
            crate::census::CensusService {
                store: self.store.clone(),
                inspector: self.inspector.clone(),
            },
            dominator.clone(),
            self.cfg.roles.clone(),
            self.cfg.api_url().to_string(),
            self.leader.clone(),
        );
        if let Some(check) = disruption {
            check.set_roles(roles.clone());
        }
        roles.start(rt);
        roles
    }

    /// TFTP (with GRUB's configurations made from the API's state) and the HTTP listeners.
    async fn start_http(self, rt: &mut Runtime, s: Served) -> anyhow::Result<()> {
        let cfg = self.cfg.clone();
        let state = crate::http::AppState {
            console_history: Arc::default(),
            boot_rows: Arc::default(),
            power: s.power,
            dominator: s.dominator,
            roles: s.roles,
            provisioning: s.provisioner,
            dhcp: s.dhcp,
            dhcp6: s.dhcp6,
            dns: s.dns,
            computed: s.computed,
            filter: s.filter,
            assets: cfg
                .assets_dir
                .as_deref()
                .map(|dir| crate::assets::Assets::open(dir, cfg.http_asset_lanes))
                .transpose()?,
            config: self.cfg,
            security: self.security,
            inspector: self.inspector,
            imageserver: paddock_imageserver::api::ImageServerState {
                images: self.images,
                mdb: self.mdb,
            },
            leader: self.leader,
            store: self.store,
        };
        let grub = cfg.grub_boot.as_ref().map(|g| {
            let maker: Arc<dyn paddock_tftp::Maker> = Arc::new(crate::http::GrubConfigs {
                state: state.clone(),
                runtime: tokio::runtime::Handle::current(),
            });
            (g, maker)
        });
        crate::boot::start_tftp(cfg.tftp.as_ref(), &cfg.public_url, grub)?;
        crate::http::start(rt, state).await
    }
}
