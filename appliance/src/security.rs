//! The appliance's security shell: the CA and agent key in the store, this
//! host's certificate on disk, operator tokens, the middleware that applies
//! [`crate::access`] to every request, agent tokens on the boot path, and the audit log.
//!
//! Store keys: `security/ca` (the CA's certificate and key, shared by every host),
//! `security/agent-key` (the agent tokens' HMAC key), `security/tokens/<sha256>` (operator
//! tokens, by digest), `audit/<ms>-<random>` (one entry per mutating call).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use paddock_inspector::api::Speaker;
use paddock_inventory::MacAddr;
use paddock_security::token;
use paddock_security::{Identity, Permissions, Proof, ca, tls};
use paddock_store::Store;
use serde::{Deserialize, Serialize};

use crate::access::{self, Access, Caller, Decision};
use crate::agent_tokens::ensure_agent_key;
use crate::audit::{Audit, AuditEntry, Kind};

/// TLS, or the explicit insecure mode.
#[derive(Clone, Debug)]
pub enum SecurityConfig {
    Insecure,
    Tls(TlsConfig),
}

/// The HTTPS listener and what it enforces.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    /// `https://…` as machines reach this host.
    pub public_url: String,
    /// The agent's URLs: this host's, then its peers' (their HTTP URLs with this scheme
    /// and port).
    pub agent_urls: Vec<String>,
    pub inspector_noauth: bool,
    pub agent_token_ttl: Duration,
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// What this domain reads beyond its own section: where this host is reached.
#[derive(Clone, Debug)]
pub struct Reach {
    pub security: SecurityConfig,
    pub http_listen: SocketAddr,
    /// The plain-HTTP URL machines use.
    pub public_url: String,
    /// The discovery agent's URLs (this host's, then its peers').
    pub agent_urls: Vec<String>,
    /// This host's name in a cluster.
    pub host: Option<String>,
}

pub const CA_KEY: &str = "security/ca";
/// The CA that signs provisioned machines' subd certificates, and nothing else.
pub const SUBD_CA_KEY: &str = "security/subd-ca";
pub const TOKENS: &str = "security/tokens/";

/// The files `paddock certs init` writes into `[security] dir`.
pub const CA_FILE: &str = "ca.pem";
/// The subd CA's certificate: what a client of subs (the dominator, an operator calling a
/// sub directly) verifies them with.
pub const SUBD_CA_FILE: &str = "subd-ca.pem";
pub const HOST_CERT: &str = "host.pem";
pub const HOST_KEY: &str = "host.key";

/// The CA as the store keeps it.
#[derive(Serialize, Deserialize)]
struct StoredCa {
    cert_pem: String,
    key_pem: String,
}

/// An operator token as the store keeps it (never the token itself).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRecord {
    pub name: String,
    pub methods: Vec<String>,
    pub created_ms: i64,
    pub expires_ms: i64,
}

/// Whether `name` may be a certificate's CN.
pub fn valid_cert_name(name: &str) -> bool {
    ca::check_name(name).is_ok()
}

/// Whether `s` may be a certificate's subject alternative name.
pub fn valid_san(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
        || (!s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-')))
}

/// What the middleware and the boot path need.
pub struct Security {
    store: Arc<dyn Store>,
    /// Who changed what, and who was refused.
    pub audit: Arc<Audit>,
    /// This host's DHCP server, when it runs one: agent tokens are bound to its leases.
    dhcp: std::sync::OnceLock<Arc<paddock_dhcp::shell::DhcpService>>,
    pub tls: Option<TlsState>,
}

/// TLS is on: this host's material and the shared secrets.
pub struct TlsState {
    pub config: TlsConfig,
    pub material: tls::Material,
    pub ca: ca::Ca,
    /// Signs subd certificates; trusted for clients and for subs, never for appliances.
    pub subd_ca: ca::Ca,
    /// The names and addresses this appliance answers for (its certificate's, its peers'):
    /// never put in a subd certificate.
    pub appliance_names: Vec<String>,
    pub ca_fingerprint: String,
    /// Minting and checking agent tokens.
    pub agent_tokens: crate::agent_tokens::AgentTokens,
}

impl TlsState {
    /// Whom clients may be: holders of certificates from the CA or the subd CA.
    pub fn client_roots(&self) -> String {
        pem_bundle(&self.material.ca_pem, &self.subd_ca.cert_pem)
    }
}

/// Two PEM texts as one, on lines of their own (a `ca.pem` edited without its last newline
/// would otherwise run into the next certificate's header).
fn pem_bundle(a: &str, b: &str) -> String {
    format!("{}\n{}", a.trim_end(), b)
}

/// A subd certificate's name and SANs, by the rules in [`Security::subd_trust`]: the first
/// of `names` that is a certificate name, does not read as an address and is not the
/// appliance's; the SANs less the appliance's names and addresses, and less any name that
/// reads as an address.
pub fn subd_names(
    names: &[&str],
    sans: &[String],
    appliance: &[String],
) -> anyhow::Result<(String, Vec<String>)> {
    let ours = |s: &str| {
        appliance.iter().any(|a| a.eq_ignore_ascii_case(s))
            || s.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
            || s.eq_ignore_ascii_case("localhost")
    };
    let name = names
        .iter()
        .find(|n| valid_cert_name(n) && !ca::looks_like_address(n) && !ours(n))
        .with_context(|| {
            format!(
                "none of {names:?} may name a subd certificate (an address, or this appliance's)"
            )
        })?;
    let sans = sans
        .iter()
        .filter(|s| !ours(s))
        // An address goes in as an address; a name that only reads as one, not at all.
        .filter(|s| s.parse::<std::net::IpAddr>().is_ok() || !ca::looks_like_address(s))
        .cloned()
        .collect();
    Ok((name.to_string(), sans))
}

async fn read_ca(store: &dyn Store) -> anyhow::Result<Option<ca::Ca>> {
    read_ca_at(store, CA_KEY).await
}

async fn read_ca_at(store: &dyn Store, key: &str) -> anyhow::Result<Option<ca::Ca>> {
    Ok(match store.get(key).await? {
        Some(kv) => {
            let s: StoredCa =
                serde_json::from_slice(&kv.value).context("the stored CA does not parse")?;
            Some(ca::Ca {
                cert_pem: s.cert_pem,
                key_pem: s.key_pem,
            })
        }
        None => None,
    })
}

/// The shared CA: the store's, or a new one if there is none yet (created with a compare
/// on absence, so two hosts initialising at once share the winner's).
pub async fn ensure_ca(store: &dyn Store) -> anyhow::Result<(ca::Ca, bool)> {
    ensure_ca_at(store, CA_KEY, || {
        ca::new_ca("paddock-ca", time::OffsetDateTime::now_utc(), 3650)
    })
    .await
}

/// The shared subd CA, the same way; a new one's name constraints exclude
/// `appliance_names`.
pub async fn ensure_subd_ca(
    store: &dyn Store,
    appliance_names: &[String],
) -> anyhow::Result<ca::Ca> {
    let (c, _) = ensure_ca_at(store, SUBD_CA_KEY, || {
        ca::new_subd_ca(
            "paddock-subd-ca",
            time::OffsetDateTime::now_utc(),
            3650,
            appliance_names,
        )
    })
    .await?;
    Ok(c)
}

/// The CA stored at `key`, or the one `make` makes, stored with a compare on absence (a
/// host that loses the race takes the winner's); whether this call created it.
async fn ensure_ca_at(
    store: &dyn Store,
    key: &str,
    make: impl FnOnce() -> Result<ca::Ca, ca::CaError>,
) -> anyhow::Result<(ca::Ca, bool)> {
    if let Some(c) = read_ca_at(store, key).await? {
        return Ok((c, false));
    }
    let new = make()?;
    let body = serde_json::to_vec(&StoredCa {
        cert_pem: new.cert_pem.clone(),
        key_pem: new.key_pem.clone(),
    })?;
    if store.create(key, body).await? {
        Ok((new, true))
    } else {
        let c = read_ca_at(store, key)
            .await?
            .with_context(|| format!("{key} vanished"))?;
        Ok((c, false))
    }
}

/// Writes a file with `mode`, whole or not at all (temporary file, then rename).
pub fn write_file(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// What `paddock certs init` did.
pub struct InitReport {
    pub dir: PathBuf,
    pub created_ca: bool,
    pub ca_fingerprint: String,
    pub sans: Vec<String>,
    pub admin: Option<(PathBuf, PathBuf)>,
}

/// `paddock certs init`: the shared CA and agent key (created if this is the first host),
/// and this host's key and certificate (the key is made here and never leaves), plus an
/// admin operator certificate when asked.
pub async fn init(
    store: &dyn Store,
    cfg: &Reach,
    extra_sans: &[String],
    admin: Option<&str>,
) -> anyhow::Result<InitReport> {
    let SecurityConfig::Tls(t) = &cfg.security else {
        bail!("[security] insecure = true: there is nothing to initialise");
    };
    let (authority, created_ca) = ensure_ca(store).await?;
    ensure_agent_key(store).await?;
    let mut sans = vec![
        t.listen.ip().to_string(),
        cfg.http_listen.ip().to_string(),
        "127.0.0.1".into(),
        "::1".into(),
        "localhost".into(),
    ];
    if let Some(h) = &cfg.host {
        sans.push(h.clone());
    }
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        sans.push(h.trim().to_string());
    }
    for host in [&t.public_url, &cfg.public_url] {
        if let Some(h) = url_host(host) {
            sans.push(h);
        }
    }
    sans.extend(extra_sans.iter().cloned());
    sans.retain(|s| s != "0.0.0.0" && s != "::");
    let mut seen = std::collections::BTreeSet::new();
    sans.retain(|s| seen.insert(s.clone()));
    let now = time::OffsetDateTime::now_utc();
    let host_name = cfg.host.clone().unwrap_or_else(|| "paddock".to_string());
    let host = ca::issue(
        &authority,
        &ca::Request {
            name: host_name,
            methods: vec!["*.*".into()],
            groups: vec![],
            sans: sans.clone(),
            days: 825,
        },
        now,
    )?;
    let subd_ca = ensure_subd_ca(store, &appliance_names(sans.clone(), cfg, t)).await?;
    crate::at_rest::private_dir(&t.dir)?;
    write_file(&t.dir.join(CA_FILE), &authority.cert_pem, 0o644)?;
    write_file(&t.dir.join(SUBD_CA_FILE), &subd_ca.cert_pem, 0o644)?;
    write_file(&t.dir.join(HOST_KEY), &host.key_pem, 0o600)?;
    write_file(
        &t.dir.join(HOST_CERT),
        &format!("{}{}", host.cert_pem, authority.cert_pem),
        0o644,
    )?;
    let admin = match admin {
        Some(name) => {
            let issued = ca::issue(
                &authority,
                &ca::Request {
                    name: name.to_string(),
                    methods: vec![access::ADMIN.into()],
                    groups: vec![],
                    sans: vec![],
                    days: 825,
                },
                now,
            )?;
            let (c, k) = (
                t.dir.join(format!("{name}.pem")),
                t.dir.join(format!("{name}.key")),
            );
            write_file(&k, &issued.key_pem, 0o600)?;
            write_file(&c, &issued.cert_pem, 0o644)?;
            Some((c, k))
        }
        None => None,
    };
    let fp = tls::Material {
        ca_pem: authority.cert_pem.clone(),
        cert_pem: String::new(),
        key_pem: String::new(),
    }
    .ca_fingerprint()
    .map_err(anyhow::Error::msg)?;
    Ok(InitReport {
        dir: t.dir.clone(),
        created_ca,
        ca_fingerprint: fp,
        sans,
        admin,
    })
}

/// The names and addresses this appliance answers for: its certificate's SANs, and the
/// hosts of its and its peers' URLs (sorted, once each).
fn appliance_names(host_sans: Vec<String>, cfg: &Reach, t: &TlsConfig) -> Vec<String> {
    let mut names = host_sans;
    for u in std::iter::once(&t.public_url)
        .chain(&t.agent_urls)
        .chain(std::iter::once(&cfg.public_url))
        .chain(&cfg.agent_urls)
    {
        names.extend(url_host(u));
    }
    names.sort();
    names.dedup();
    names
}

fn url_host(u: &str) -> Option<String> {
    let rest = u.split_once("://")?.1;
    let hostport = rest.split('/').next()?;
    let host = if let Some(h) = hostport.strip_prefix('[') {
        h.split(']').next()?
    } else {
        hostport.rsplit_once(':').map_or(hostport, |(h, _)| h)
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// `paddock certs issue`: a certificate from the shared CA, with a new key, or for a
/// request (the key stays with whoever made it).
pub async fn issue(
    store: &dyn Store,
    req: &ca::Request,
    csr_pem: Option<&str>,
) -> anyhow::Result<ca::Issued> {
    let authority = read_ca(store)
        .await?
        .context("no CA in the store: run `paddock certs init` first")?;
    let now = time::OffsetDateTime::now_utc();
    Ok(match csr_pem {
        Some(csr) => ca::Issued {
            cert_pem: ca::sign_request(&authority, csr, req, now)?,
            key_pem: String::new(),
        },
        None => ca::issue(&authority, req, now)?,
    })
}

/// `paddock certs token`: a new operator token; only its digest is stored.
pub async fn create_token(
    store: &dyn Store,
    name: &str,
    methods: &Permissions,
    days: i64,
) -> anyhow::Result<String> {
    ca::check_name(name)?;
    if !(1..=3650).contains(&days) {
        bail!("--days: 1 to 3650");
    }
    let t = token::operator_token(token::random::<32>());
    let digest = token::operator_digest(&t).context("a token we made does not parse")?;
    let now = paddock_wire::unix_ms();
    let rec = TokenRecord {
        name: name.to_string(),
        methods: methods.patterns().to_vec(),
        created_ms: now,
        expires_ms: now + days * 86_400_000,
    };
    store
        .put(&format!("{TOKENS}{digest}"), serde_json::to_vec(&rec)?)
        .await?;
    Ok(t)
}

/// Every operator token's record (never the token: only its digest is stored).
pub async fn list_tokens(store: &dyn Store) -> anyhow::Result<Vec<TokenRecord>> {
    Ok(store
        .range(TOKENS)
        .await?
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect())
}

/// Deletes every operator token named `name`; how many there were.
pub async fn revoke_tokens(store: &dyn Store, name: &str) -> anyhow::Result<usize> {
    let mut n = 0;
    for kv in store.range(TOKENS).await? {
        if serde_json::from_slice::<TokenRecord>(&kv.value).is_ok_and(|t| t.name == name) {
            store.delete(&kv.key).await?;
            n += 1;
        }
    }
    Ok(n)
}

/// The CA's fingerprint and this host's certificate, for `paddock certs show`.
pub fn host_material(dir: &Path) -> anyhow::Result<tls::Material> {
    tls::Material::read(
        &dir.join(CA_FILE),
        &dir.join(HOST_CERT),
        &dir.join(HOST_KEY),
    )
    .map_err(|e| anyhow::anyhow!("{e}\n{}", material_advice(&e)))
}

/// What to do about host material that does not load, by its cause: no certificates yet,
/// files the appliance's user may not read (`certs init` run as root after the first start),
/// or files that do not parse.
fn material_advice(e: &tls::MaterialError) -> &'static str {
    match e {
        tls::MaterialError::Read { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            "TLS is on ([security] insecure is not set) and this host has no certificates: \
             run `paddock certs init` (or set [security] insecure = true for a lab on an \
             isolated network)"
        }
        tls::MaterialError::Read { source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            "the certificates must belong to the user the appliance runs as: `chown -R \
             paddock: <data_dir>`, and run later `paddock certs` commands as that user \
             (`runuser -u paddock -- paddock certs …`)"
        }
        tls::MaterialError::Read { .. } => "this host's certificates could not be read",
        tls::MaterialError::Check { .. } => {
            "this host's certificates do not parse or do not belong together: `paddock certs \
             init` writes a new key and certificate for this host"
        }
    }
}

impl Security {
    /// At start: insecure (said loudly), or this host's material, checked against the CA
    /// in the store (a host with another CA's certificates refuses to start).
    pub async fn load(store: Arc<dyn Store>, cfg: &Reach) -> anyhow::Result<Arc<Self>> {
        let t = match &cfg.security {
            SecurityConfig::Insecure => {
                tracing::warn!(
                    "INSECURE MODE ([security] insecure = true): plain HTTP, no certificates, \
                     every method open to anyone who reaches {}; use only on an isolated lab network",
                    cfg.http_listen
                );
                return Ok(Arc::new(Security {
                    audit: Arc::new(Audit::new(store.clone())),
                    dhcp: std::sync::OnceLock::new(),
                    store,
                    tls: None,
                }));
            }
            SecurityConfig::Tls(t) => t.clone(),
        };
        let material = host_material(&t.dir)?;
        crate::at_rest::check_key(&t.dir.join(HOST_KEY))?;
        let ca = read_ca(store.as_ref()).await?.with_context(|| {
            format!(
                "no CA in the store, though {} holds certificates: run `paddock certs init` \
                 against this store",
                t.dir.display()
            )
        })?;
        if ca.cert_pem.trim() != material.ca_pem.trim() {
            bail!(
                "{} is not the CA in the store: this host's certificates were made for \
                 another appliance; run `paddock certs init` again",
                t.dir.join(CA_FILE).display()
            );
        }
        let agent_key = ensure_agent_key(store.as_ref()).await?;
        let ca_fingerprint = material.ca_fingerprint().map_err(anyhow::Error::msg)?;
        let host_sans = match paddock_security::identity::pem_certificates(&material.cert_pem)
            .map_err(anyhow::Error::msg)?
            .first()
        {
            Some(der) => paddock_security::identity::subject_alt_names(der)?,
            None => Vec::new(),
        };
        let appliance_names = appliance_names(host_sans, cfg, &t);
        let subd_ca = ensure_subd_ca(store.as_ref(), &appliance_names).await?;
        let agent_tokens =
            crate::agent_tokens::AgentTokens::new(store.clone(), agent_key, t.agent_token_ttl);
        // Written by `certs init`; a host initialised before there was a subd CA gets it now.
        let subd_ca_file = t.dir.join(SUBD_CA_FILE);
        if !subd_ca_file.exists() {
            write_file(&subd_ca_file, &subd_ca.cert_pem, 0o644)?;
        }
        Ok(Arc::new(Security {
            audit: Arc::new(Audit::new(store.clone())),
            dhcp: std::sync::OnceLock::new(),
            store,
            tls: Some(TlsState {
                config: t,
                material,
                ca,
                subd_ca,
                appliance_names,
                ca_fingerprint,
                agent_tokens,
            }),
        }))
    }

    /// Binds agent tokens to this host's DHCP leases (once, when DHCP starts).
    pub fn bind_leases(&self, dhcp: Arc<paddock_dhcp::shell::DhcpService>) {
        let _ = self.dhcp.set(dhcp);
    }

    /// The address `mac` holds a lease on here, if this host serves DHCP and knows one.
    pub fn lease_of(&self, mac: MacAddr) -> Option<std::net::IpAddr> {
        let dhcp = self.dhcp.get()?;
        dhcp.bound_address(mac).map(std::net::IpAddr::V4)
    }

    /// This host as a client of its subs (TLS on): subs' certificates come from the subd CA
    /// (or, for machines provisioned before there was one, the CA); ours, the host's.
    pub fn sub_client_config(&self) -> anyhow::Result<Option<Arc<rustls::ClientConfig>>> {
        let Some(t) = &self.tls else { return Ok(None) };
        tls::client_config(
            &t.client_roots(),
            Some((&t.material.cert_pem, &t.material.key_pem)),
        )
        .map(Some)
        .map_err(anyhow::Error::msg)
    }

    /// The same for ureq clients (image replication).
    pub fn host_ureq_tls(&self) -> anyhow::Result<Option<ureq::tls::TlsConfig>> {
        self.as_host(tls::ureq_tls)
    }

    fn as_host<T>(
        &self,
        make: impl Fn(&str, Option<(&str, &str)>) -> Result<T, tls::TlsError>,
    ) -> anyhow::Result<Option<T>> {
        self.tls
            .as_ref()
            .map(|t| {
                make(
                    &t.material.ca_pem,
                    Some((&t.material.cert_pem, &t.material.key_pem)),
                )
            })
            .transpose()
            .map_err(anyhow::Error::msg)
    }

    /// The rustls server configuration (TLS on).
    pub fn server_config(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        self.tls
            .as_ref()
            .map(|t| {
                tls::server_config_for_clients(
                    &t.material,
                    tls::ClientAuth::Optional,
                    &t.client_roots(),
                )
            })
            .transpose()
            .map_err(anyhow::Error::msg)
    }

    /// The kernel command line the ramdisk gets for `mac` with TLS on (`None` with TLS off,
    /// or when no token could be minted): the CA's URLs (on
    /// each of `http_urls`, the plain-HTTP base URLs of this host first and then its peers',
    /// so that the agent still finds the CA when the host that served the script is gone),
    /// its fingerprint and a fresh agent token.
    pub async fn agent_cmdline(&self, mac: &str, http_urls: &[&str]) -> Option<String> {
        let t = self.tls.as_ref()?;
        let tok = match t.agent_tokens.mint(mac).await {
            Ok(tok) => tok?,
            Err(e) => {
                tracing::error!(error = %e, "agent token: not minted");
                return None;
            }
        };
        let mut ca_urls: Vec<String> = Vec::new();
        for u in http_urls.iter().filter(|u| u.starts_with("http://")) {
            let u = format!("{}/boot/ca.pem", u.trim_end_matches('/'));
            if !ca_urls.contains(&u) {
                ca_urls.push(u);
            }
        }
        Some(format!(
            "paddock.ca_url={} paddock.ca_fingerprint={} paddock.token={tok}",
            ca_urls.join(","),
            t.ca_fingerprint
        ))
    }

    /// A certificate for a provisioned machine's subd, from the subd CA: it may fetch
    /// objects and poll itself; it is named by the first usable of `names` and answers for
    /// `sans` (its host name and address). Nothing that reads as an address goes in as a
    /// name, and no name or address of this appliance goes in at all.
    pub fn subd_trust(
        &self,
        names: &[&str],
        sans: &[String],
    ) -> anyhow::Result<Option<paddock_birther::protocol::SubdTrust>> {
        let Some(t) = &self.tls else { return Ok(None) };
        let (name, sans) = subd_names(names, sans, &t.appliance_names)?;
        let issued = ca::issue(
            &t.subd_ca,
            &ca::Request {
                name,
                methods: access::SUBD.split(',').map(str::to_string).collect(),
                groups: vec![],
                sans,
                days: 825,
            },
            time::OffsetDateTime::now_utc(),
        )?;
        Ok(Some(paddock_birther::protocol::SubdTrust {
            ca_pem: t.material.ca_pem.clone(),
            client_ca_pem: t.client_roots(),
            cert_pem: issued.cert_pem,
            key_pem: issued.key_pem,
        }))
    }

    pub(crate) async fn operator_token(&self, tok: &str) -> Result<Identity, TokenRefused> {
        let digest = token::operator_digest(tok).ok_or(TokenRefused::Malformed)?;
        let kv = self
            .store
            .get(&format!("{TOKENS}{digest}"))
            .await
            .map_err(|e| {
                tracing::debug!(error = %e, "security: the token store did not answer");
                TokenRefused::StoreUnavailable
            })?
            .ok_or(TokenRefused::Unknown)?;
        let rec: TokenRecord =
            serde_json::from_slice(&kv.value).map_err(|_| TokenRefused::Unknown)?;
        if paddock_wire::unix_ms() >= rec.expires_ms {
            return Err(TokenRefused::Expired);
        }
        Ok(Identity {
            user: rec.name,
            methods: Permissions::new(&rec.methods).map_err(|_| TokenRefused::Unknown)?,
            groups: vec![],
            proof: Proof::Token,
        })
    }
}

/// Why an operator's token is not taken (the text goes back to the caller, so it names
/// nothing of the store's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenRefused {
    #[error("malformed token")]
    Malformed,
    #[error("unknown token")]
    Unknown,
    #[error("token expired")]
    Expired,
    #[error("the token store is unavailable")]
    StoreUnavailable,
}

/// Where a token came from: the `Authorization` header (sent on purpose by a client), or
/// the console's cookie (attached by the browser to any request, whoever started it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bearer {
    Header(String),
    Cookie(String),
}

impl Bearer {
    fn token(&self) -> &str {
        match self {
            Bearer::Header(t) | Bearer::Cookie(t) => t,
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<Bearer> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        && let Some(t) = v.strip_prefix("Bearer ")
    {
        return Some(Bearer::Header(t.trim().to_string()));
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix("paddock_token="))
        .map(|t| Bearer::Cookie(t.to_string()))
        .next()
}

fn refuse(status: StatusCode, message: String, path: &str) -> Response {
    // A person at the console without credentials is sent to the login page.
    if status == StatusCode::UNAUTHORIZED && path.starts_with("/ui") {
        return (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, "/ui/login")],
            message,
        )
            .into_response();
    }
    // The body of a refused call is never read: close, so a kept-alive client does not send
    // its next call on a connection hyper is about to drop.
    let mut resp = paddock_wire::ApiError::new(status.as_u16(), message).into_response();
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    resp
}

/// Applies [`access::decide`] to every request, then audits mutating calls; every answer
/// carries [`crate::browser::HARDENING`].
pub async fn authorize(State(sec): State<Arc<Security>>, req: Request, next: Next) -> Response {
    let mut resp = decide_and_run(&sec, req, next).await;
    for (k, v) in crate::browser::HARDENING {
        resp.headers_mut()
            .insert(k, header::HeaderValue::from_static(v));
    }
    resp
}

/// Only these are served on plain HTTP when TLS is on: what a PXE client fetches before it
/// has the CA, and a health probe. A sign-in or an API call there would travel in clear.
fn plain_http_serves(http: &str, path: &str) -> bool {
    matches!(http, "GET" | "HEAD") && (path.starts_with("/boot/") || path == "/healthz")
}

async fn decide_and_run(sec: &Arc<Security>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let http = req.method().as_str().to_string();
    let acc = access::access(&http, &path);
    let peer = req.extensions().get::<tls::Peer>().cloned();
    let addr = peer
        .as_ref()
        .map(|p| p.addr)
        .or_else(|| {
            req.extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0)
        })
        .map_or_else(|| "-".into(), |a| a.to_string());
    let entry = |who: &str, proof: &str, method: &str, status: StatusCode| {
        AuditEntry::now(who, proof, method, &http, &path, status.as_u16(), &addr)
    };
    let Some(t) = &sec.tls else {
        // Insecure: everything allowed; mutating calls still audited, as `-`.
        let resp = next.run(req).await;
        if acc.mutates() {
            let e = entry("-", "insecure", acc.method(), resp.status());
            sec.audit.record(Kind::Operator, e).await;
        }
        return resp;
    };
    let over_tls = peer.as_ref().is_some_and(|p| p.tls);
    if acc == Access::Public && (over_tls || plain_http_serves(&http, &path)) {
        // The sign-in form is a browser's post: only from our own pages.
        if path == "/ui/login" && http == "POST" && !crate::browser::same_origin(req.headers()) {
            let status = StatusCode::FORBIDDEN;
            let e = entry("(anonymous)", "none", "Console.Login", status);
            sec.audit.record(Kind::Refused, e).await;
            return refuse(
                status,
                "POST /ui/login: a sign-in from another site is refused".into(),
                "",
            );
        }
        return next.run(req).await;
    }
    if !over_tls {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "{http} {path}: only boot files are served on plain HTTP; use {}",
                t.config.public_url
            ),
            "",
        );
    }
    let peer = peer.expect("checked above");
    // Who: a certificate, else a bearer token or the console's cookie.
    let mut identity: Option<Identity> = peer.identity.as_deref().cloned();
    let mut refused: Option<String> = peer.certificate_error.clone();
    let mut agent_mac: Option<MacAddr> = None;
    let bearer = bearer(req.headers());
    // A credential the browser attaches by itself: the cookie, or a client certificate
    // when no Authorization header says the client meant to call.
    let ambient = match &bearer {
        Some(Bearer::Cookie(_)) => true,
        Some(Bearer::Header(_)) => false,
        None => identity.is_some(),
    };
    if identity.is_none()
        && refused.is_none()
        && let Some(tok) = bearer.as_ref().map(Bearer::token)
    {
        if tok.starts_with("pa1.") {
            let lease = |mac| sec.lease_of(mac);
            match t.agent_tokens.check(tok, peer.addr.ip(), lease).await {
                Ok(mac) => agent_mac = Some(mac),
                Err(why) => refused = Some(why.to_string()),
            }
        } else {
            match sec.operator_token(tok).await {
                Ok(id) => identity = Some(id),
                Err(e) => refused = Some(format!("token: {e}")),
            }
        }
    }
    let (who, proof) = match (&identity, &agent_mac) {
        (Some(id), _) => (
            id.user.clone(),
            match id.proof {
                Proof::Certificate => "certificate",
                Proof::Token => "token",
                Proof::Agent => "agent",
            },
        ),
        (None, Some(mac)) => (format!("agent:{mac}"), "agent"),
        (None, None) => ("(anonymous)".to_string(), "none"),
    };
    let method = acc.method();
    if ambient && let Err(why) = crate::browser::check_ambient(req.method(), &path, req.headers()) {
        tracing::info!(peer = %addr, %why, "cross-site request refused");
        let status = StatusCode::FORBIDDEN;
        sec.audit
            .record(Kind::Refused, entry(&who, proof, method, status))
            .await;
        return refuse(status, why.to_string(), "");
    }
    let caller = match (&identity, &agent_mac, &refused) {
        (_, _, Some(why)) => Caller::Refused(why),
        (Some(id), _, _) => Caller::Granted(&id.methods),
        (None, Some(_), _) => Caller::AgentToken,
        (None, None, None) => Caller::Anonymous,
    };
    let status = match access::decide(acc, caller, &path, t.config.inspector_noauth) {
        Decision::Allow => None,
        Decision::Unauthenticated(m) => Some((StatusCode::UNAUTHORIZED, m)),
        Decision::Denied(m) => Some((StatusCode::FORBIDDEN, format!("{m} to {who:?}"))),
    };
    if let Some((status, message)) = status {
        tracing::info!(%who, %method, %path, peer = %addr, %message, "access denied");
        sec.audit
            .record(Kind::Refused, entry(&who, proof, method, status))
            .await;
        return refuse(status, message, &path);
    }
    let mut req = req;
    // Every agent route acts for this MAC alone (the handlers check the node a path names
    // after decoding it, and look nodes up by this MAC rather than by what a body lists).
    let kind = match agent_mac {
        Some(mac) if identity.is_none() => {
            req.extensions_mut().insert(Speaker(mac));
            Kind::Agent
        }
        _ => Kind::Operator,
    };
    // What the caller holds, for handlers that hand out credentials.
    if let Some(id) = &identity {
        req.extensions_mut().insert(Issuer(id.methods.clone()));
    }
    let resp = next.run(req).await;
    if acc.mutates() {
        // A refusal by the handler (an agent speaking for another node) counts as one.
        let kind = if matches!(resp.status().as_u16(), 401 | 403) {
            Kind::Refused
        } else {
            kind
        };
        sec.audit
            .record(kind, entry(&who, proof, method, resp.status()))
            .await;
    }
    resp
}

async fn audit_list(
    State(sec): State<Arc<Security>>,
    Query(q): Query<paddock_wire::Limit>,
) -> Result<axum::Json<Vec<AuditEntry>>, paddock_wire::ApiError> {
    let limit = q.or(100, crate::audit::KEEP);
    sec.audit
        .log(limit)
        .await
        .map(axum::Json)
        .map_err(|e| paddock_wire::ApiError::internal(e.to_string()))
}

/// The CA's certificate (public: the agent fetches it over plain HTTP and checks it
/// against the fingerprint on its command line).
pub fn ca_pem(sec: &Security) -> Option<String> {
    sec.tls.as_ref().map(|t| t.material.ca_pem.clone())
}

/// The methods of the operator behind a request (TLS on): a token or certificate it
/// issues may carry no more.
#[derive(Debug, Clone)]
pub struct Issuer(pub Permissions);

/// `POST /api/v1/tokens`: what a new operator token is for.
#[derive(Debug, Serialize, Deserialize)]
pub struct NewToken {
    pub name: String,
    /// Comma-separated `Service.Method` patterns.
    pub methods: String,
    pub days: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CreatedToken {
    pub token: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RevokeTokens {
    pub name: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Revoked {
    pub revoked: usize,
}

async fn tokens_create(
    State(sec): State<Arc<Security>>,
    issuer: Option<axum::Extension<Issuer>>,
    axum::Json(req): axum::Json<NewToken>,
) -> Result<(StatusCode, axum::Json<CreatedToken>), paddock_wire::ApiError> {
    let perms = Permissions::parse_list(&req.methods)
        .map_err(|e| paddock_wire::ApiError::bad_request(format!("methods: {e}")))?;
    if let Some(axum::Extension(Issuer(own))) = issuer
        && let Some(more) = perms.patterns().iter().find(|p| !own.covers(p))
    {
        return Err(paddock_wire::ApiError::new(
            403,
            format!("a token cannot carry more than its issuer: {more} is not among your methods"),
        ));
    }
    let token = create_token(sec.store.as_ref(), &req.name, &perms, req.days)
        .await
        .map_err(|e| paddock_wire::ApiError::bad_request(e.to_string()))?;
    Ok((StatusCode::CREATED, axum::Json(CreatedToken { token })))
}

async fn tokens_list(
    State(sec): State<Arc<Security>>,
) -> Result<axum::Json<Vec<TokenRecord>>, paddock_wire::ApiError> {
    list_tokens(sec.store.as_ref())
        .await
        .map(axum::Json)
        .map_err(|e| paddock_wire::ApiError::internal(e.to_string()))
}

async fn tokens_revoke(
    State(sec): State<Arc<Security>>,
    axum::Json(req): axum::Json<RevokeTokens>,
) -> Result<axum::Json<Revoked>, paddock_wire::ApiError> {
    match revoke_tokens(sec.store.as_ref(), &req.name).await {
        Ok(0) => Err(paddock_wire::ApiError::not_found(format!(
            "no token named {:?}",
            req.name
        ))),
        Ok(revoked) => Ok(axum::Json(Revoked { revoked })),
        Err(e) => Err(paddock_wire::ApiError::internal(e.to_string())),
    }
}

/// `POST /api/v1/agent-tokens/rotate`: `{"rotate": true}`, so that no stray post rotates.
#[derive(Debug, Serialize, Deserialize)]
pub struct RotateAgentKey {
    pub rotate: bool,
}

/// `POST /api/v1/agent-tokens/revoke`: the node whose machine's tokens are void.
#[derive(Debug, Serialize, Deserialize)]
pub struct RevokeAgent {
    pub node: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RevokedAgent {
    /// The MACs whose tokens were voided.
    pub macs: Vec<String>,
}

#[derive(Clone)]
struct AgentTokenApi {
    sec: Arc<Security>,
    inspector: Arc<paddock_inspector::service::Inspector>,
}

fn tls_only(sec: &Security) -> Result<&TlsState, paddock_wire::ApiError> {
    sec.tls
        .as_ref()
        .ok_or_else(|| paddock_wire::ApiError::bad_request("TLS is off: there are no agent tokens"))
}

async fn agent_key_rotate(
    State(api): State<AgentTokenApi>,
    axum::Json(req): axum::Json<RotateAgentKey>,
) -> Result<axum::Json<RotateAgentKey>, paddock_wire::ApiError> {
    if !req.rotate {
        return Err(paddock_wire::ApiError::bad_request(
            "send {\"rotate\": true} to void every agent token",
        ));
    }
    tls_only(&api.sec)?
        .agent_tokens
        .rotate()
        .await
        .map_err(|e| paddock_wire::ApiError::internal(e.to_string()))?;
    tracing::warn!("agent tokens: the signing key was rotated; every outstanding token is void");
    Ok(axum::Json(req))
}

async fn agent_tokens_revoke(
    State(api): State<AgentTokenApi>,
    axum::Json(req): axum::Json<RevokeAgent>,
) -> Result<axum::Json<RevokedAgent>, paddock_wire::ApiError> {
    let t = tls_only(&api.sec)?;
    let node = api
        .inspector
        .find(&req.node)
        .await?
        .ok_or_else(|| paddock_wire::ApiError::not_found(format!("no node {:?}", req.node)))?
        .node;
    let mut macs: Vec<String> = node.macs.iter().map(ToString::to_string).collect();
    macs.extend(node.pxe_mac.map(|m| m.to_string()));
    macs.sort();
    macs.dedup();
    t.agent_tokens
        .revoke(&macs)
        .await
        .map_err(|e| paddock_wire::ApiError::internal(e.to_string()))?;
    Ok(axum::Json(RevokedAgent { macs }))
}

/// `/api/v1/audit`, `/api/v1/tokens`, `/api/v1/agent-tokens`, `/ui/audit`, `/ui/login`.
pub fn router(
    sec: Arc<Security>,
    inspector: Arc<paddock_inspector::service::Inspector>,
) -> axum::Router {
    let agent_tokens = axum::Router::new()
        .route(
            "/api/v1/agent-tokens/rotate",
            axum::routing::post(agent_key_rotate),
        )
        .route(
            "/api/v1/agent-tokens/revoke",
            axum::routing::post(agent_tokens_revoke),
        )
        .with_state(AgentTokenApi {
            sec: sec.clone(),
            inspector,
        });
    axum::Router::new()
        .route("/api/v1/audit", axum::routing::get(audit_list))
        .route(
            "/api/v1/tokens",
            axum::routing::get(tokens_list).post(tokens_create),
        )
        .route("/api/v1/tokens/revoke", axum::routing::post(tokens_revoke))
        .with_state(sec)
        .merge(agent_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only missing certificates are answered with `certs init` and the insecure switch;
    /// unreadable ones with their ownership, bad ones with a new host certificate.
    #[test]
    fn material_errors_get_the_advice_of_their_cause() {
        let read = |kind| tls::MaterialError::Read {
            path: "/var/lib/paddock/certs/host.key".into(),
            source: std::io::Error::from(kind),
        };
        let missing = material_advice(&read(std::io::ErrorKind::NotFound));
        assert!(missing.contains("has no certificates") && missing.contains("insecure"));
        let denied = material_advice(&read(std::io::ErrorKind::PermissionDenied));
        assert!(denied.contains("chown -R paddock:"), "{denied}");
        assert!(!denied.contains("has no certificates"), "{denied}");
        let bad = tls::MaterialError::Check {
            ca: "ca.pem".into(),
            cert: "host.pem".into(),
            key: "host.key".into(),
            source: Box::new(tls::TlsError::Pem(
                paddock_security::identity::PemError::Empty,
            )),
        };
        assert!(material_advice(&bad).contains("do not parse"));
    }

    #[test]
    fn hosts_of_urls() {
        assert_eq!(
            url_host("https://198.18.0.1:8443").as_deref(),
            Some("198.18.0.1")
        );
        assert_eq!(
            url_host("http://paddock.lab/").as_deref(),
            Some("paddock.lab")
        );
        assert_eq!(url_host("http://[::1]:80").as_deref(), Some("::1"));
        assert_eq!(url_host("nope"), None);
    }

    #[test]
    fn a_pem_bundle_keeps_both_certificates() {
        let now = time::OffsetDateTime::now_utc();
        let a = ca::new_ca("a", now, 1).unwrap().cert_pem;
        let b = ca::new_ca("b", now, 1).unwrap().cert_pem;
        let both = pem_bundle(a.trim_end(), &b);
        assert_eq!(
            paddock_security::identity::pem_certificates(&both)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn subd_certificates_never_name_the_appliance() {
        let appliance = vec!["198.18.0.1".to_string(), "paddock.lab".to_string()];
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (name, sans) = subd_names(
            &["web-1", "uuid"],
            &s(&[
                "web-1",
                "198.18.0.66",
                "198.18.0.1",
                "127.0.0.1",
                "PADDOCK.lab",
            ]),
            &appliance,
        )
        .unwrap();
        assert_eq!(
            (name.as_str(), sans),
            ("web-1", s(&["web-1", "198.18.0.66"]))
        );
        // A host name that reads as an address is neither the name nor a SAN.
        let (name, sans) = subd_names(
            &["127.0.0.1", "5f0c-node"],
            &s(&["127.0.0.1", "10.1", "198.18.0.66"]),
            &appliance,
        )
        .unwrap();
        assert_eq!((name.as_str(), sans), ("5f0c-node", s(&["198.18.0.66"])));
        assert!(subd_names(&["paddock.lab", "1.2.3.4"], &[], &appliance).is_err());
    }

    #[test]
    fn bearer_from_header_or_cookie() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=b; paddock_token=po1.x".parse().unwrap());
        assert_eq!(bearer(&h), Some(Bearer::Cookie("po1.x".into())));
        h.insert(header::AUTHORIZATION, "Bearer pa1.y".parse().unwrap());
        assert_eq!(bearer(&h), Some(Bearer::Header("pa1.y".into())));
    }
}
