//! Mutual TLS for the bench, as an installation runs it: a CA made here, a certificate per
//! simulated sub with its loopback address as an IP SAN (the dominator verifies a sub under
//! its address), and the dominator's own certificate granting `Subd.*`.
//!
//! `certs DIR` writes the CA and the dominator's certificate; the simulator reads the CA and
//! issues its subs' certificates at start; the herd reads the CA and its certificate.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use paddock_security::{ca, tls};
use time::OffsetDateTime;
use tokio::net::TcpListener;

use crate::{BenchError, CONNECTIONS, Local, Res, sub_ip};

const CA_PEM: &str = "ca.pem";
const CA_KEY: &str = "ca.key";
const DOMINATOR_PEM: &str = "dominator.pem";
const DOMINATOR_KEY: &str = "dominator.key";

fn read(dir: &Path, name: &str) -> Res<String> {
    let path = dir.join(name);
    std::fs::read_to_string(&path).map_err(|source| BenchError::File { path, source })
}

fn write(dir: &Path, name: &str, text: &str) -> Res<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|source| BenchError::File { path, source })
}

/// `certs DIR`: a new CA and the dominator's certificate (`Subd.*`), as PEM files in DIR.
pub fn certs(dir: &Path) -> Res<()> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::File {
        path: dir.to_path_buf(),
        source,
    })?;
    let now = OffsetDateTime::now_utc();
    let authority = ca::new_ca("paddock-bench-ca", now, 2)?;
    let dominator = ca::issue(
        &authority,
        &ca::Request {
            name: "dominator".into(),
            methods: vec!["Subd.*".into()],
            days: 2,
            ..ca::Request::default()
        },
        now,
    )?;
    write(dir, CA_PEM, &authority.cert_pem)?;
    write(dir, CA_KEY, &authority.key_pem)?;
    write(dir, DOMINATOR_PEM, &dominator.cert_pem)?;
    write(dir, DOMINATOR_KEY, &dominator.key_pem)
}

/// The herd's client configuration: DIR's CA, the dominator's certificate.
pub fn client(dir: &Path) -> Res<Arc<rustls::ClientConfig>> {
    let (cert, key) = (read(dir, DOMINATOR_PEM)?, read(dir, DOMINATOR_KEY)?);
    Ok(tls::client_config(
        &read(dir, CA_PEM)?,
        Some((&cert, &key)),
    )?)
}

/// A server configuration per sub (sub `i` at [`sub_ip`]`(i)`), each with a certificate of
/// its own from DIR's CA, client certificates required (as subd).
pub fn servers(dir: &Path, subs: usize) -> Res<Vec<Arc<rustls::ServerConfig>>> {
    let authority = ca::Ca {
        cert_pem: read(dir, CA_PEM)?,
        key_pem: read(dir, CA_KEY)?,
    };
    let now = OffsetDateTime::now_utc();
    (0..subs)
        .map(|i| {
            let issued = ca::issue(
                &authority,
                &ca::Request {
                    name: format!("sub{i:07}"),
                    methods: vec!["ObjectServer.GetObjects".into()],
                    sans: vec![sub_ip(i).to_string()],
                    days: 2,
                    ..ca::Request::default()
                },
                now,
            )?;
            let material = tls::Material {
                ca_pem: authority.cert_pem.clone(),
                cert_pem: issued.cert_pem,
                key_pem: issued.key_pem,
            };
            Ok(tls::server_config(&material, tls::ClientAuth::Required)?)
        })
        .collect()
}

/// Serves `app` on `listener` as subd's listener does ([`tls::serve_connection`], with the
/// default limits: the header and idle timeouts): over TLS with the sub's own configuration
/// on a sub's address, in plain HTTP elsewhere (the driver's control calls on 127.0.0.1).
/// Each connection counts in [`CONNECTIONS`] (over TLS: a handshake each).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    configs: Arc<Vec<Arc<rustls::ServerConfig>>>,
    sub_index: fn(SocketAddr) -> Option<usize>,
) -> Res<()> {
    loop {
        let (tcp, addr) = listener.accept().await?;
        let accepted = tokio::time::Instant::now();
        let Ok(local) = tcp.local_addr() else {
            continue;
        };
        CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        let _ = tcp.set_nodelay(true);
        let app = app.clone().layer(Extension(ConnectInfo(Local(local))));
        let config = sub_index(local).and_then(|i| configs.get(i).cloned());
        let peer = tls::Peer {
            addr,
            tls: config.is_some(),
            identity: None,
            certificate_error: None,
        };
        let limits = tls::Limits::default();
        tokio::spawn(async move {
            match config {
                Some(config) => {
                    let Ok(stream) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await
                    else {
                        return;
                    };
                    tls::serve_connection(stream, peer, app, limits, accepted).await;
                }
                None => tls::serve_connection(tcp, peer, app, limits, accepted).await,
            }
        });
    }
}
