//! The HTTP face of the appliance: boot scripts and assets, the Inspector API, Paddock's
//! API, health and metrics.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_dhcp::shell::DhcpService;
use paddock_inspector::service::{Inspector, Subject};
use paddock_inventory::MacAddr;
use paddock_wire::ApiError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use serde::{Deserialize, Serialize};

use crate::boot;
use crate::config::{Config, SecurityConfig};
use crate::pxe_filter::FirewallAnswer;

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// The console dashboard's samples over time.
    pub console_history: Arc<crate::console_history::History>,
    pub inspector: Arc<Inspector>,
    pub dhcp: Option<Arc<DhcpService>>,
    /// `None` with `[dhcp6]` off.
    pub dhcp6: Option<Arc<paddock_dhcp::v6::shell::Dhcp6Service>>,
    pub filter: Option<Arc<crate::pxe_filter::PxeFilter>>,
    pub imageserver: paddock_imageserver::api::ImageServerState,
    pub leader: crate::leader::LeaderRx,
    pub store: std::sync::Arc<dyn paddock_store::Store>,
    /// Certificates, tokens, the access middleware and the audit log.
    pub security: Arc<crate::security::Security>,
    /// `http.assets_dir`, served at `/boot/assets/`.
    pub assets: Option<Arc<crate::assets::Assets>>,
    /// The dominator's census and controls (`/rpc/Dominator.*`).
    pub dominator: crate::dominator::Dominator,
    /// Provisioning records, requests and the agent's protocol.
    pub provisioning: Arc<crate::provisioning::Provisioner>,
    /// The role spec, its loop and the census (`/api/v1/spec`, `/api/v1/census`).
    pub roles: Arc<crate::roles::Roles>,
    /// BMCs: `/api/v1/nodes/{node}/power`, the throttle's queue.
    pub power: Arc<crate::power::Power>,
    /// The DNS server's zones and secondaries (`/api/v1/dns`); `None` with DNS off.
    pub dns: Option<crate::dns::DnsHandle>,
    /// The machines' computed files (`/api/v1/spec/render`, `/rpc/Dominator.GetSubFiles`).
    pub computed: Arc<crate::computed::Renderer>,
    /// Boot-script rows lately recorded, so that a script fetched in a loop adds one.
    pub boot_rows: Arc<boot::RecentRows>,
}

pub fn router(state: AppState) -> Router {
    let mut r = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/boot/{name}", get(boot_script))
        .route("/api/v1/leases", get(leases))
        .route("/api/v1/leases6", get(leases6))
        .route("/api/v1/firewall", get(firewall))
        .route("/api/v1/cluster", get(cluster));
    if let Some(assets) = &state.assets {
        let assets = assets.clone();
        r = r.route(
            "/boot/assets/{*name}",
            get(
                move |Path(name): Path<String>, req: axum::extract::Request| {
                    crate::assets::serve(assets.clone(), name, req)
                },
            ),
        );
    }
    let inspector = paddock_inspector::api::router(state.inspector.clone());
    let imageserver = paddock_imageserver::api::router(state.imageserver.clone());
    let dominator = crate::dominator::router(state.dominator.clone()).merge(
        crate::computed::router(crate::computed::ComputedRoutes {
            renderer: state.computed.clone(),
            mdb: state.dominator.mdb.clone(),
        }),
    );
    let provisioning = crate::provisioning::router(state.provisioning.clone());
    let power = crate::power::router(state.power.clone());
    let roles = crate::roles::router(state.roles.clone())
        .merge(crate::census::router(state.roles.census.clone()))
        .merge(crate::dns::router(state.dns.clone()))
        .merge(crate::rollouts::router(state.roles.store.clone()));
    let roles_page = axum::Router::new()
        .route("/ui/roles", get(crate::roles_page::page))
        .route(
            "/ui/rollouts/{role}/promote",
            post(crate::roles_page::promote),
        )
        .route("/ui/rollouts/{role}/pause", post(crate::roles_page::pause))
        .route(
            "/ui/rollouts/{role}/resume",
            post(crate::roles_page::resume),
        )
        .route(
            "/ui/rollouts/{role}/revert",
            post(crate::roles_page::revert),
        )
        .with_state((state.roles.clone(), state.dns.clone()));
    let console = crate::console::router(console(&state));
    let security = state.security.clone();
    let inspector_for_security = state.inspector.clone();
    r.with_state(state)
        .merge(crate::security::router(
            security.clone(),
            inspector_for_security,
        ))
        .merge(inspector)
        .merge(imageserver)
        .merge(dominator)
        .merge(provisioning)
        .merge(power)
        .merge(roles)
        .merge(console)
        .merge(roles_page)
        .merge(crate::console_access::router(security.clone()))
        .layer(axum::middleware::from_fn_with_state(
            security,
            crate::security::authorize,
        ))
}

async fn boot_script(
    State(s): State<AppState>,
    peer: Option<axum::Extension<paddock_security::tls::Peer>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let ipxe = |body: String| {
        ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
    };
    if name == "ca.pem" {
        return match crate::security::ca_pem(&s.security) {
            Some(pem) => {
                Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], pem).into_response())
            }
            None => Err(ApiError::not_found("TLS is off: there is no CA")),
        };
    }
    if name == "autoexec.ipxe" || name == "boot.ipxe" {
        return Ok(ipxe(boot::chain_script(&s.config.public_url)));
    }
    let Some(mac) = name.strip_suffix(".ipxe") else {
        return Err(ApiError::not_found(format!(
            "no boot file {name:?}; scripts are /boot/<mac>.ipxe"
        )));
    };
    let mac: MacAddr = mac
        .parse()
        .map_err(|e: paddock_inventory::MacParseError| ApiError::bad_request(e.to_string()))?;
    let from = peer.map(|axum::Extension(p)| p.addr.ip());
    let asked = Asked::of(&s, mac, from).await?;
    let script = boot::script(
        mac,
        asked.node.as_ref(),
        asked.serve.as_ref(),
        &asked.discovery,
        &s.config.public_url,
    );
    asked.record(&s, mac, "iPXE script").await;
    Ok(ipxe(script))
}

/// What a machine that asks for its boot configuration (an iPXE script, a GRUB
/// configuration) is decided from.
struct Asked {
    node: Option<paddock_inspector::node::Node>,
    serve: Option<paddock_birther::Serve>,
    /// The discovery settings, with the agent's token when it may have one.
    discovery: boot::Discovery,
    /// The MAC has a lease from this host.
    leased: bool,
}

impl Asked {
    /// `from`: the address the request came from.
    async fn of(
        s: &AppState,
        mac: MacAddr,
        from: Option<std::net::IpAddr>,
    ) -> Result<Self, ApiError> {
        let node = s.inspector.by_mac(mac).await?.map(|v| v.node);
        let serve = match &node {
            Some(n) => s.provisioning.serve(n.uuid).await?,
            None => None,
        };
        // With TLS the agent calls the HTTPS URLs, pins the CA (fetched from this host or,
        // when it is gone, a peer) and carries a fresh token.
        let http_urls: Vec<&str> = std::iter::once(s.config.public_url.as_str())
            .chain(s.config.discovery.agent_urls.iter().map(String::as_str))
            .collect();
        // A machine with a lease here gets its token only at the lease's address: a
        // configuration fetched by anyone else still boots, but speaks for no one.
        let lease = s.security.lease_of(mac);
        let cmdline = if crate::agent_tokens::may_mint(lease, from) {
            s.security.agent_cmdline(&mac.to_string(), &http_urls).await
        } else {
            tracing::warn!(%mac, ?from, "boot: configuration fetched from outside the MAC's lease: no agent token");
            None
        };
        let mut discovery = s.config.discovery.clone();
        if let (crate::config::SecurityConfig::Tls(t), Some(extra)) = (&s.config.security, cmdline)
        {
            discovery.agent_urls = t.agent_urls.clone();
            discovery.cmdline = if discovery.cmdline.is_empty() {
                extra
            } else {
                format!("{} {extra}", discovery.cmdline)
            };
        }
        Ok(Asked {
            node,
            serve,
            discovery,
            leased: lease.is_some(),
        })
    }

    /// The timeline row and the log line for a configuration served (`what`: which).
    async fn record(&self, s: &AppState, mac: MacAddr, what: &str) {
        let boots = boot::decide(self.node.as_ref(), self.serve.as_ref()).what();
        let subject = self
            .node
            .as_ref()
            .map_or(Subject::Mac(mac), |n| Subject::Node(n.uuid));
        // A timeline row for a known node, or a MAC this host gave a lease to: made-up MACs
        // (anyone may ask for any configuration) add nothing to the store, and the same row
        // again within a short window adds nothing either.
        let row = format!("{what} served for {mac}: {boots}");
        if (self.node.is_some() || self.leased)
            && s.boot_rows.fresh(mac, &row, std::time::Instant::now())
            && let Err(e) = s.inspector.event(subject, "boot-script", &row, false).await
        {
            tracing::warn!(%mac, error = %e, "boot: timeline entry not recorded");
        }
        tracing::info!(%mac, known = self.node.is_some(), what = %boots, loader = what, "boot: configuration served");
    }
}

/// Makes each machine's GRUB configuration when its GRUB asks over TFTP: the same decision,
/// token and timeline row as the iPXE script. TFTP runs on its own threads, so this waits
/// on the runtime for the store's answer.
pub struct GrubConfigs {
    pub state: AppState,
    pub runtime: tokio::runtime::Handle,
}

impl paddock_tftp::Maker for GrubConfigs {
    fn make(&self, client: std::net::SocketAddr, name: &str) -> Option<Vec<u8>> {
        let (cpu, mac) = boot::grub_config_name(name)?;
        let kernel = self.state.config.grub_boot.as_ref()?.kernel(cpu)?;
        let s = &self.state;
        let made = self.runtime.block_on(async {
            let asked = Asked::of(s, mac, Some(client.ip())).await?;
            asked.record(s, mac, "GRUB configuration").await;
            Ok::<_, ApiError>(boot::grub_config(
                mac,
                asked.node.as_ref(),
                asked.serve.as_ref(),
                &asked.discovery,
                &s.config.public_url,
                cpu,
                kernel,
            ))
        });
        match made {
            Ok(text) => Some(text.into_bytes()),
            Err(e) => {
                tracing::warn!(%mac, error = %e.message, "boot: no GRUB configuration");
                None
            }
        }
    }
}

async fn firewall(State(s): State<AppState>) -> Response {
    match &s.filter {
        Some(f) => Json(FirewallAnswer::On(Box::new(f.status()))).into_response(),
        None => Json(FirewallAnswer::Off { enabled: false }).into_response(),
    }
}

/// What `GET /api/v1/cluster` answers: this host's place in the appliance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "store", rename_all = "lowercase")]
pub enum ClusterStatus {
    /// One host on the embedded store: it always leads.
    Sqlite { hosts: u32, leading: bool },
    /// Several hosts sharing an etcd cluster.
    Etcd {
        etcd_endpoints: Vec<String>,
        host: String,
        leading: bool,
        /// The leader as the store shows it (none while an election runs).
        leader: Option<ClusterLeader>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterLeader {
    pub host: String,
    pub revision: paddock_store::Revision,
}

/// This host's place in the appliance: one host, or which host of several leads.
async fn cluster(State(s): State<AppState>) -> Json<ClusterStatus> {
    let leading = s.leader.borrow().is_some();
    Json(match &s.config.cluster {
        None => ClusterStatus::Sqlite {
            hosts: 1,
            leading: true,
        },
        Some(c) => ClusterStatus::Etcd {
            etcd_endpoints: c.etcd_endpoints.clone(),
            host: c.host.clone(),
            leading,
            leader: paddock_store::election::Election::new(s.store.clone(), "pxe")
                .leader()
                .await
                .ok()
                .flatten()
                .map(|(_, host, revision)| ClusterLeader {
                    host: String::from_utf8_lossy(&host).into_owned(),
                    revision,
                }),
        },
    })
}

async fn leases6(State(s): State<AppState>) -> Response {
    let leases = s.dhcp6.as_ref().map(|d| d.leases()).unwrap_or_default();
    Json(leases).into_response()
}

async fn leases(State(s): State<AppState>) -> Response {
    let leases = s.dhcp.as_ref().map(|d| d.leases()).unwrap_or_default();
    Json(leases).into_response()
}

/// The labels of `paddock_dhcp_packets_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The labels of `paddock_nodes` and `paddock_dominator_subs`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// What `/metrics` shows of the dominator: subs per state (`SubState::name()`) from the
/// census, and whether every update is paused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DominatorGauges {
    pub subs: std::collections::BTreeMap<&'static str, i64>,
    pub paused: bool,
}

impl DominatorGauges {
    /// Counts the census; `paused` when the `dominator/pause` key is set.
    pub fn read(census: &paddock_dominator::Census, paused: bool) -> Self {
        let mut subs = std::collections::BTreeMap::new();
        for s in census.read().unwrap_or_else(|p| p.into_inner()).values() {
            *subs.entry(s.state.name()).or_insert(0) += 1;
        }
        DominatorGauges { subs, paused }
    }
}

/// `/metrics`: the DHCPv4 and DHCPv6 servers' counters, the nodes by introspection state
/// and the dominator's subs by state, read at each scrape.
async fn metrics(State(s): State<AppState>) -> Response {
    let nodes = s.inspector.list().await.ok();
    let dominator = if s.dominator.enabled {
        match s.store.get(crate::dominator::PAUSE).await {
            Ok(pause) => Some(DominatorGauges::read(&s.dominator.census, pause.is_some())),
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read the dominator's pause");
                None
            }
        }
    } else {
        None
    };
    match render_metrics(
        s.dhcp.as_ref().map(|d| &d.stats),
        s.dhcp6.as_ref().map(|d| &d.stats),
        nodes.as_deref(),
        dominator.as_ref(),
    )
    .map(|text| crate::power::add_metrics(text, &s.power.throttle_view()))
    .map(|text| crate::dns::add_metrics(text, s.dns.as_ref()))
    .map(|text| crate::roles::add_metrics(text, s.roles.round_stats().as_ref()))
    {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A gauge per `state`, registered as `name`.
fn by_state(registry: &mut Registry, name: &str, help: &str) -> Family<StateLabels, Gauge> {
    let family = Family::<StateLabels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

/// The metrics in the OpenMetrics text format: `paddock_dhcp_packets_total{outcome}` and
/// `paddock_dhcp6_packets_total{outcome}` (with each DHCP server), `paddock_nodes{state}`
/// (when the nodes could be read), and `paddock_dominator_subs{state}` and
/// `paddock_dominator_paused` (0/1) with the dominator.
fn render_metrics(
    dhcp: Option<&paddock_dhcp::shell::Stats>,
    dhcp6: Option<&paddock_dhcp::shell::Stats>,
    nodes: Option<&[paddock_inspector::node::Node]>,
    dominator: Option<&DominatorGauges>,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    // DHCPv6 answers with an Advertise or a Reply (a refusal is a status inside a Reply):
    // its families name them so, and have no NAK.
    for (name, help, stats, answers) in [
        (
            "paddock_dhcp_packets",
            "DHCP packets by outcome",
            dhcp,
            ["offer", "ack", "nak"],
        ),
        (
            "paddock_dhcp6_packets",
            "DHCPv6 packets by outcome",
            dhcp6,
            ["advertise", "reply", ""],
        ),
    ] {
        let Some(st) = stats else { continue };
        let packets = Family::<OutcomeLabels, Counter>::default();
        registry.register(name, help, packets.clone());
        for (outcome, c) in [
            ("received", &st.received),
            ("malformed", &st.malformed),
            ("ignored", &st.ignored),
            ("limited_client", &st.limited_client),
            ("limited_new_lease", &st.limited_new_leases),
            ("relay_refused", &st.relay_refused),
            (answers[0], &st.offers),
            (answers[1], &st.acks),
            (answers[2], &st.naks),
            ("persist_error", &st.persist_errors),
        ]
        .into_iter()
        .filter(|(outcome, _)| !outcome.is_empty())
        {
            packets
                .get_or_create(&OutcomeLabels { outcome })
                .inc_by(c.load(Ordering::Relaxed));
        }
    }
    if let Some(nodes) = nodes {
        let by_state = by_state(
            &mut registry,
            "paddock_nodes",
            "Nodes by introspection state",
        );
        for n in nodes {
            let state = n.state().map_or("none", |s| s.as_str());
            by_state.get_or_create(&StateLabels { state }).inc();
        }
    }
    if let Some(d) = dominator {
        let subs = by_state(
            &mut registry,
            "paddock_dominator_subs",
            "Subs by dominator state (the leader's census)",
        );
        for (&state, &n) in &d.subs {
            subs.get_or_create(&StateLabels { state }).set(n);
        }
        let paused = Gauge::<i64>::default();
        paused.set(i64::from(d.paused));
        registry.register(
            "paddock_dominator_paused",
            "1 while every update is paused (dominator/pause)",
            paused,
        );
    }
    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(out)
}

/// What the console reads, from the appliance's state.
fn console(state: &AppState) -> crate::console::Console {
    crate::console::Console {
        inspector: state.inspector.clone(),
        dhcp: state.dhcp.clone(),
        filter: state.filter.clone(),
        imageserver: state.imageserver.clone(),
        leader: state.leader.clone(),
        cluster: state.config.cluster.clone(),
        dominator: state.dominator.clone(),
        provisioning: state.provisioning.clone(),
        power: state.power.clone(),
        dns: state.dns.clone(),
        computed: state.computed.clone(),
        roles: state.roles.clone(),
        history: state.console_history.clone(),
    }
}

/// Binds the plain listener and, with TLS, the HTTPS one, and serves the API on them. At
/// shutdown both stop accepting and give the requests in flight `[http]
/// shutdown_grace_secs` to finish.
pub async fn start(rt: &mut crate::runtime::Runtime, state: AppState) -> anyhow::Result<()> {
    let (cfg, security) = (state.config.clone(), state.security.clone());
    crate::console::sample_every_minute(console(&state));
    let app = router(state);
    let listener = bind(cfg.http_listen, "HTTP")?;
    tracing::info!(listen = %cfg.http_listen, public_url = %cfg.public_url, "http: listening");
    serve_on(rt, "http", listener, None, app.clone(), &cfg);
    if let (SecurityConfig::Tls(t), Some(server)) = (&cfg.security, security.server_config()?) {
        let listener = bind(t.listen, "HTTPS")?;
        let ca = security
            .tls
            .as_ref()
            .map_or("", |s| s.ca_fingerprint.as_str());
        tracing::info!(listen = %t.listen, public_url = %t.public_url, ca = %ca, "https: listening");
        serve_on(rt, "https", listener, Some(server), app, &cfg);
    }
    Ok(())
}

/// Connections the kernel holds for the listener before it accepts them (it caps this at
/// `net.core.somaxconn`, 4,096 by default). In a boot storm a thousand machines ask for
/// their script and assets within moments of each other: at the 1,024 that a plain bind
/// gives, about 240 of 1,000 SYNs were dropped, and each of those machines waited a 1 s
/// retransmit before it was served.
const LISTEN_BACKLOG: u32 = 4096;

fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context as _;
    let listen = || {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }?;
        // As a plain bind does: a restarted appliance binds while old connections linger.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().with_context(|| format!("binding {what} on {addr}"))
}

fn serve_on(
    rt: &mut crate::runtime::Runtime,
    name: &'static str,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    cfg: &Config,
) {
    let (limits, grace) = (cfg.listener_limits(), cfg.http_shutdown_grace);
    rt.spawn_once(name, move |ctx| async move {
        let stop = ctx.cancel.cancelled_owned();
        paddock_security::tls::serve_until(listener, tls, app, limits, stop, grace).await;
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listener's queue is what `ss` shows as a listening socket's Send-Q: the backlog
    /// asked for, as far as the kernel's cap allows (a plain bind gives 1,024).
    #[tokio::test]
    async fn the_listener_queues_a_storm_of_connections() {
        let l = bind("127.0.0.1:0".parse().unwrap(), "HTTP").unwrap();
        let port = l.local_addr().unwrap().port();
        let ss = std::process::Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
            .unwrap();
        let line = String::from_utf8(ss.stdout).unwrap();
        let queue: u32 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        let cap: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(queue, LISTEN_BACKLOG.min(cap), "ss: {line}");
        assert!(queue > 1024, "the kernel caps the queue at {cap}: {line}");
    }

    #[test]
    fn metrics_keep_their_names_and_labels() {
        let stats = paddock_dhcp::shell::Stats::default();
        stats.malformed.store(3, Ordering::Relaxed);
        let mut node = paddock_inspector::node::Node::new(uuid::Uuid::from_u128(1), 0);
        let bare = node.clone();
        node.introspection = Some(paddock_inspector::node::Introspection {
            state: paddock_inspector::state::State::Finished,
            started_at: None,
            finished_at: None,
            error: None,
            manage_boot: true,
            set_image: None,
        });
        let census = paddock_dominator::Census::default();
        for (host, state) in [
            (
                "a",
                paddock_dominator::SubState::Synced { image: "i".into() },
            ),
            (
                "b",
                paddock_dominator::SubState::Synced { image: "i".into() },
            ),
            (
                "c",
                paddock_dominator::SubState::Unreachable {
                    error: "refused".into(),
                },
            ),
        ] {
            census
                .write()
                .unwrap()
                .insert(host.into(), crate::dominator::test_sub(host, state));
        }
        let dominator = DominatorGauges::read(&census, true);
        let text = render_metrics(
            Some(&stats),
            Some(&stats),
            Some(&[node.clone(), node, bare]),
            Some(&dominator),
        )
        .unwrap();
        for line in [
            "# TYPE paddock_dhcp_packets counter",
            "paddock_dhcp_packets_total{outcome=\"malformed\"} 3",
            "paddock_dhcp_packets_total{outcome=\"ack\"} 0",
            "paddock_dhcp6_packets_total{outcome=\"malformed\"} 3",
            "paddock_dhcp6_packets_total{outcome=\"advertise\"} 0",
            "# TYPE paddock_nodes gauge",
            "paddock_nodes{state=\"finished\"} 2",
            "paddock_nodes{state=\"none\"} 1",
            "# TYPE paddock_dominator_subs gauge",
            "paddock_dominator_subs{state=\"synced\"} 2",
            "paddock_dominator_subs{state=\"unreachable\"} 1",
            "# TYPE paddock_dominator_paused gauge",
            "paddock_dominator_paused 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        assert!(!text.contains("paddock_dhcp6_packets_total{outcome=\"nak\"}"));
        assert_eq!(render_metrics(None, None, None, None).unwrap(), "# EOF\n");
        let idle = render_metrics(None, None, None, Some(&DominatorGauges::default())).unwrap();
        assert!(
            idle.lines().any(|l| l == "paddock_dominator_paused 0"),
            "{idle}"
        );
    }

    #[test]
    fn the_cluster_answer_keeps_its_json() {
        let one = ClusterStatus::Sqlite {
            hosts: 1,
            leading: true,
        };
        assert_eq!(
            serde_json::to_value(&one).unwrap(),
            serde_json::json!({"store": "sqlite", "hosts": 1, "leading": true})
        );
        let several = ClusterStatus::Etcd {
            etcd_endpoints: vec!["http://198.18.0.11:2379".into()],
            host: "a".into(),
            leading: false,
            leader: Some(ClusterLeader {
                host: "b".into(),
                revision: 9,
            }),
        };
        assert_eq!(
            serde_json::to_value(&several).unwrap(),
            serde_json::json!({"store": "etcd", "etcd_endpoints": ["http://198.18.0.11:2379"],
                "host": "a", "leading": false, "leader": {"host": "b", "revision": 9}})
        );
    }
}
