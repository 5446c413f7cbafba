//! TLS for every service (rustls with ring): the server's configuration (client certificates
//! verified against the CA), the accept loop that hands each request its verified [`Peer`]
//! (neither axum nor axum-server exposes the peer's certificate), and the clients'
//! configurations. The same loop serves plain connections, so both listeners share the
//! [`Limits`]: connections per listener and per source, a deadline from accept to the end of
//! the headers, an idle timeout between requests (the [`Keepalive`] clocks), and a minimum
//! body rate.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::identity::{self, Identity, PemError};
use crate::keepalive::{Expiry, Keepalive};

/// Why TLS material did not make a configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("CA certificate: {0}")]
    CaCertificate(rustls::Error),
    #[error("private key: {0}")]
    PrivateKey(rustls_pki_types::pem::Error),
    #[error("private key: {0}")]
    UreqPrivateKey(ureq::Error),
    #[error("client verifier: {0}")]
    ClientVerifier(rustls::server::VerifierBuilderError),
    #[error("protocol versions: {0}")]
    ProtocolVersions(rustls::Error),
    #[error("certificate and key: {0}")]
    CertificateAndKey(rustls::Error),
    #[error("client certificate and key: {0}")]
    ClientCertificateAndKey(rustls::Error),
}

/// Why [`Material::read`] failed; both name the files.
#[derive(Debug, thiserror::Error)]
pub enum MaterialError {
    #[error("{}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{} / {} / {}: {source}", ca.display(), cert.display(), key.display())]
    Check {
        ca: std::path::PathBuf,
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        source: Box<TlsError>,
    },
}

/// The CA, and this service's own certificate and key, PEM.
#[derive(Clone)]
pub struct Material {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material").finish_non_exhaustive()
    }
}

impl Material {
    /// Reads `ca.pem`-style files; errors name the file.
    pub fn read(
        ca: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self, MaterialError> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).map_err(|source| MaterialError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let m = Material {
            ca_pem: read(ca)?,
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        };
        m.check().map_err(|source| MaterialError::Check {
            ca: ca.to_path_buf(),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            source: Box::new(source),
        })?;
        Ok(m)
    }

    /// Parses everything once, so a bad file is reported at start, not at the first call.
    pub fn check(&self) -> Result<(), TlsError> {
        roots(&self.ca_pem)?;
        chain(&self.cert_pem)?;
        key(&self.key_pem)?;
        Ok(())
    }

    /// The CA's SHA-256 fingerprint (hex).
    pub fn ca_fingerprint(&self) -> Result<String, PemError> {
        Ok(identity::fingerprint(
            &identity::pem_certificates(&self.ca_pem)?[0],
        ))
    }
}

/// ring, with its cipher suites in the order this CPU runs fastest ([`fastest_first`]).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    fastest_first(&mut p.cipher_suites, cpu_has_aes());
    Arc::new(p)
}

/// Orders `suites` for a CPU with or without AES instructions. Without them (an old CPU, or
/// the default CPU model of a QEMU TCG guest) AES-GCM runs in software, several times slower
/// than ChaCha20-Poly1305, so ChaCha20 goes first, as Go's crypto/tls orders them; with them,
/// ring's own order (AES-GCM first) stays. A client's order is the one the server follows.
pub fn fastest_first(suites: &mut [rustls::SupportedCipherSuite], has_aes: bool) {
    if !has_aes {
        // A stable sort: the TLS 1.3 suites stay ahead of the TLS 1.2 ones within each kind.
        suites.sort_by_key(|s| {
            let chacha = matches!(
                s.suite(),
                rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
            );
            (s.version() != &rustls::version::TLS13, !chacha)
        });
    }
}

/// Whether this CPU has the instructions AES-GCM needs to run fast.
fn cpu_has_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

fn roots(ca_pem: &str) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for der in identity::pem_certificates(ca_pem)? {
        store
            .add(CertificateDer::from(der))
            .map_err(TlsError::CaCertificate)?;
    }
    Ok(store)
}

fn chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, PemError> {
    Ok(identity::pem_certificates(pem)?
        .into_iter()
        .map(CertificateDer::from)
        .collect())
}

fn key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(TlsError::PrivateKey)
}

/// Whether a client must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Verified if presented; a client without one is anonymous (tokens, public routes).
    Optional,
    /// Refused at the handshake without one (subd).
    Required,
}

/// The server side: our certificate; clients' certificates verified against the CA (a
/// certificate from another CA, or expired, fails the handshake).
pub fn server_config(
    m: &Material,
    auth: ClientAuth,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    server_config_for_clients(m, auth, &m.ca_pem)
}

/// The same, with clients' certificates verified against `client_roots_pem` (the CA, and
/// the CA that signs subd certificates: subs are clients too, never servers we trust).
pub fn server_config_for_clients(
    m: &Material,
    auth: ClientAuth,
    client_roots_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(client_roots_pem)?), provider());
    let verifier = match auth {
        ClientAuth::Optional => verifier.allow_unauthenticated(),
        ClientAuth::Required => verifier,
    }
    .build()
    .map_err(TlsError::ClientVerifier)?;
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::ProtocolVersions)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain(&m.cert_pem)?, key(&m.key_pem)?)
        .map_err(TlsError::CertificateAndKey)?;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// The client side: servers verified against `ca_pem`; our certificate if given.
pub fn client_config(
    ca_pem: &str,
    ours: Option<(&str, &str)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::ProtocolVersions)?
        .with_root_certificates(roots(ca_pem)?);
    let c = match ours {
        Some((cert, k)) => b
            .with_client_auth_cert(chain(cert)?, key(k)?)
            .map_err(TlsError::ClientCertificateAndKey)?,
        None => b.with_no_client_auth(),
    };
    Ok(Arc::new(c))
}

/// ureq's TLS settings for a client of ours: the CA as the only root, our certificate if
/// given.
pub fn ureq_tls(
    ca_pem: &str,
    ours: Option<(&str, &str)>,
) -> Result<ureq::tls::TlsConfig, TlsError> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let roots: Vec<Certificate<'static>> = identity::pem_certificates(ca_pem)?
        .into_iter()
        .map(|d| Certificate::from_der(&d).to_owned())
        .collect();
    let mut b = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(provider())
        .root_certs(RootCerts::Specific(Arc::new(roots)));
    if let Some((cert, k)) = ours {
        let certs: Vec<Certificate<'static>> = identity::pem_certificates(cert)?
            .into_iter()
            .map(|d| Certificate::from_der(&d).to_owned())
            .collect();
        let key = PrivateKey::from_pem(k.as_bytes())
            .map_err(TlsError::UreqPrivateKey)?
            .to_owned();
        b = b.client_cert(Some(ClientCert::new_with_certs(&certs, key)));
    }
    Ok(b.build())
}

/// The caller of one request, as the accept loop saw it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// Over TLS (else a plain connection).
    pub tls: bool,
    /// The verified client certificate's identity, if one was presented.
    pub identity: Option<Arc<Identity>>,
    /// A verified certificate whose extensions do not parse: it may call nothing.
    pub certificate_error: Option<String>,
}

pub use crate::limits::Limits;
use crate::limits::{MinRate, SourceSlots};

/// Serves `app` on `listener`: over TLS when `tls` is given, else plain. Runs until the
/// process ends.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: Limits,
) -> std::io::Result<()> {
    serve_until(
        listener,
        tls,
        app,
        limits,
        std::future::pending(),
        Duration::ZERO,
    )
    .await;
    Ok(())
}

/// [`serve`] until `stop` resolves, then drains: the listener closes (new connections are
/// refused), idle connections close, each request in flight gets its answer before its
/// connection closes, and this returns when every connection has closed or `grace` has
/// passed, whichever is first.
pub async fn serve_until(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: Limits,
    stop: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let sources = Arc::new(SourceSlots::default());
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            a = listener.accept() => a,
        };
        let (tcp, addr) = match accepted {
            Ok(c) => c,
            // Out of descriptors and the like: wait a little rather than spin.
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(source) = sources.take(addr.ip(), limits.max_per_source) else {
            tracing::debug!(%addr, "connection refused: this source holds its share");
            drop(tcp);
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%addr, "connection refused: at the connection limit");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let closing = closing.clone();
        tokio::spawn(async move {
            let _held = (permit, source);
            // The first request's head is due from accept, the handshake included.
            let accepted = Instant::now();
            match acceptor {
                Some(acceptor) => {
                    let tls =
                        match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%addr, error = %e, "TLS handshake refused");
                                return;
                            }
                            Err(_) => return,
                        };
                    let (identity, certificate_error) = match tls.get_ref().1.peer_certificates() {
                        Some([leaf, ..]) => match identity::from_certificate(leaf.as_ref()) {
                            Ok(id) => (Some(Arc::new(id)), None),
                            Err(e) => (None, Some(e.to_string())),
                        },
                        _ => (None, None),
                    };
                    let peer = Peer {
                        addr,
                        tls: true,
                        identity,
                        certificate_error,
                    };
                    connection(tls, peer, app, limits, accepted, closing).await;
                }
                None => {
                    let peer = Peer {
                        addr,
                        tls: false,
                        identity: None,
                        certificate_error: None,
                    };
                    connection(tcp, peer, app, limits, accepted, closing).await;
                }
            }
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    // Every connection holds a slot: all slots back means every connection has closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(?grace, "connections still open after the grace period");
    }
}

/// Resolves once the server drains (or is gone).
async fn closed(closing: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

/// A connection's [`Keepalive`], told by its stream, its requests and their answers, and
/// read by its watchdog.
struct Clocks {
    keepalive: Mutex<Keepalive>,
    /// A deadline moved (one permit is kept, so a move is never missed).
    moved: tokio::sync::Notify,
}

impl Clocks {
    fn with<T>(&self, f: impl FnOnce(&mut Keepalive) -> T) -> T {
        f(&mut self.keepalive.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn bytes_read(&self) {
        if self.with(|k| k.bytes_read(Instant::now())) {
            self.moved.notify_one();
        }
    }

    fn response_done(&self) {
        if self.with(|k| k.response_done(Instant::now())) {
            self.moved.notify_one();
        }
    }
}

/// The connection's stream, telling its clocks when the client sends.
struct Watched<T> {
    inner: T,
    clocks: Arc<Clocks>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clocks.bytes_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that tells the clocks when it is done with (sent, or dropped).
struct Answered {
    inner: axum::body::Body,
    clocks: Arc<Clocks>,
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.clocks.response_done();
    }
}

impl http_body::Body for Answered {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// One accepted connection (over TLS, its handshake done by the caller), served as
/// [`serve`] serves each: the [`Peer`] in every request, the [`Keepalive`] clocks from
/// `accepted`, the minimum body rate. For a server with an accept loop of its own (one that
/// picks its certificate by the address a connection came to); it knows no drain.
pub async fn serve_connection<I>(io: I, peer: Peer, app: Router, limits: Limits, accepted: Instant)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Held until the connection ends: a dropped sender would read as "draining".
    let (_never, closing) = tokio::sync::watch::channel(false);
    connection(io, peer, app, limits, accepted, closing).await;
}

async fn connection<I>(
    io: I,
    peer: Peer,
    app: Router,
    limits: Limits,
    accepted: Instant,
    mut closing: tokio::sync::watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let addr = peer.addr;
    let clocks = Arc::new(Clocks {
        keepalive: Mutex::new(Keepalive::new(
            accepted,
            limits.header_read_timeout,
            limits.idle_timeout,
        )),
        moved: tokio::sync::Notify::new(),
    });
    let on_request = clocks.clone();
    let on_answer = clocks.clone();
    let service = app
        .map_request(move |req: axum::extract::Request<hyper::body::Incoming>| {
            on_request.with(Keepalive::request);
            let mut req = req.map(|b| {
                axum::body::Body::new(MinRate::new(
                    b,
                    limits.min_body_rate,
                    limits.header_read_timeout,
                ))
            });
            req.extensions_mut().insert(ConnectInfo(addr));
            req.extensions_mut().insert(peer.clone());
            req
        })
        .map_response(move |res: axum::response::Response| {
            let clocks = on_answer.clone();
            res.map(|inner| axum::body::Body::new(Answered { inner, clocks }))
        });
    let service = hyper_util::service::TowerToHyperService::new(service);
    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // hyper's header timer also runs while a kept-alive connection waits for its next
    // request; the clocks keep the two apart.
    b.http1().timer(TokioTimer::new()).header_read_timeout(None);
    let b = b.http1_only();
    let io = TokioIo::new(Watched {
        inner: io,
        clocks: clocks.clone(),
    });
    let conn = b.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    // Closing (the server drains) or idle too long: the request in flight, if any, gets its
    // answer, then the connection closes; an idle one closes at once.
    let result = loop {
        let due = clocks.with(|k| k.deadline());
        let clock = async {
            match due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => break r,
            () = clocks.moved.notified() => {}
            () = clock => match clocks.with(|k| k.expired(Instant::now())) {
                Some(Expiry::Head) => {
                    tracing::debug!(%addr, "connection closed: no request headers in time");
                    return;
                }
                Some(Expiry::Idle) => {
                    conn.as_mut().graceful_shutdown();
                    break conn.as_mut().await;
                }
                None => {}
            },
            () = closed(&mut closing) => {
                conn.as_mut().graceful_shutdown();
                break conn.as_mut().await;
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%addr, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CipherSuite as C;

    fn order(has_aes: bool) -> Vec<C> {
        let mut suites = rustls::crypto::ring::default_provider().cipher_suites;
        fastest_first(&mut suites, has_aes);
        suites.iter().map(|s| s.suite()).collect()
    }

    #[test]
    fn without_aes_instructions_chacha20_goes_first() {
        let o = order(false);
        assert_eq!(o[0], C::TLS13_CHACHA20_POLY1305_SHA256, "{o:?}");
        // TLS 1.3 before TLS 1.2 still, and nothing lost.
        let first_tls12 = o
            .iter()
            .position(|s| !format!("{s:?}").starts_with("TLS13"))
            .unwrap();
        assert!(
            o[..first_tls12]
                .iter()
                .all(|s| format!("{s:?}").starts_with("TLS13"))
        );
        assert!(
            format!("{:?}", o[first_tls12]).contains("CHACHA20"),
            "{o:?}"
        );
        assert_eq!(o.len(), order(true).len());
    }

    #[test]
    fn with_aes_instructions_rings_order_stays() {
        let ring: Vec<C> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(order(true), ring);
        assert_ne!(ring[0], C::TLS13_CHACHA20_POLY1305_SHA256);
    }
}
