//! The dominator's subd client over mutual TLS, against a real subd serving
//! `paddock_subd::rpc` over TLS on a temporary root, with certificates from a CA made here:
//! a dominator certificate (`Subd.*`) polls and updates over one kept-alive connection; one
//! with only `Subd.Poll` has its Update refused with a 403 naming the method and the user,
//! and the tree stays as it was; a dominator that does not trust the sub's CA, or speaks
//! the other scheme, gets nothing.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paddock_dominator::HttpSubRpc;
use paddock_dominator::herd::SubRpc;
use paddock_image::{FileSystem, Filter, Image, Inode};
use paddock_security::ca::{self, Ca};
use paddock_security::tls;
use paddock_subd::service::{PollRequest, PollResponse};
use paddock_subd::{Subd, SubdConfig};
use time::OffsetDateTime;

fn leaf(authority: &Ca, name: &str, methods: &[&str]) -> (String, String) {
    let req = ca::Request {
        name: name.into(),
        methods: methods.iter().map(|m| m.to_string()).collect(),
        sans: vec!["127.0.0.1".into()],
        days: 2,
        ..Default::default()
    };
    let issued = ca::issue(authority, &req, OffsetDateTime::now_utc()).unwrap();
    (issued.cert_pem, issued.key_pem)
}

/// A dominator's client trusting `ca_pem` with `cert`.
fn rpc(ca_pem: &str, cert: &(String, String)) -> HttpSubRpc {
    let config = tls::client_config(ca_pem, Some((&cert.0, &cert.1))).unwrap();
    HttpSubRpc::with_tls("paddock-test", Duration::from_secs(5), config)
}

/// The client ports of the connections calls came over, in order.
type Connections = Arc<Mutex<Vec<u16>>>;

/// subd on `root` over TLS (subd's router and authorize layer, as `rpc::serve` has them),
/// noting each call's connection; its address.
async fn serve(root: &Path, authority: &Ca) -> (SocketAddr, Connections) {
    serve_with(root, authority, tls::Limits::default()).await
}

/// [`serve`] with `limits`.
async fn serve_with(root: &Path, authority: &Ca, limits: tls::Limits) -> (SocketAddr, Connections) {
    let subd = Subd::start(SubdConfig::for_tests(root)).unwrap();
    let (cert_pem, key_pem) = leaf(authority, "subd-m1", &["ObjectServer.GetObjects"]);
    let material = tls::Material {
        ca_pem: authority.cert_pem.clone(),
        cert_pem,
        key_pem,
    };
    let config = tls::server_config(&material, tls::ClientAuth::Required).unwrap();
    let connections = Connections::default();
    let noted = connections.clone();
    let app = paddock_subd::rpc::router(subd)
        .layer(axum::middleware::from_fn(paddock_subd::rpc::authorize))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let peer = req.extensions().get::<tls::Peer>().map(|p| p.addr.port());
                noted.lock().unwrap().extend(peer);
                next.run(req)
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tls::serve(listener, Some(config), app, limits));
    (addr, connections)
}

/// Polls until a complete scan is in; the full answer.
async fn scanned(rpc: &HttpSubRpc, addr: &str) -> PollResponse {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = rpc.poll(addr, PollRequest::default()).await.unwrap();
        if p.scan_count > 0 && p.file_system.is_some() {
            return p;
        }
        assert!(Instant::now() < deadline, "no scan");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sub's tree with a new directory `/made-by-update`.
fn image_with_new_dir(sub: &FileSystem) -> Image {
    let mut fs = sub.clone();
    let Some(Inode::Directory { uid, gid, .. }) = fs.get("/").cloned() else {
        panic!("no root directory");
    };
    fs.insert(
        "/made-by-update",
        Inode::Directory {
            mode: 0o750,
            uid,
            gid,
        },
    )
    .unwrap();
    Image::new("with-dir", fs, Some(Filter::empty()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_certificate_granting_subd_update_updates() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("motd"), b"hello\n").unwrap();
    let now = OffsetDateTime::now_utc();
    let authority = ca::new_ca("paddock-test-ca", now, 10).unwrap();
    let (addr, connections) = serve(d.path(), &authority).await;
    let addr = addr.to_string();

    let dominator = rpc(
        &authority.cert_pem,
        &leaf(&authority, "dominator", &["Subd.*"]),
    );
    let p = scanned(&dominator, &addr).await;
    let image = image_with_new_dir(p.file_system.as_ref().unwrap());
    let req = paddock_image::plan::plan(
        p.file_system.as_ref().unwrap(),
        p.object_cache.as_ref().unwrap(),
        &image,
    );

    // A certificate with Subd.Poll alone polls and cannot update.
    let watcher = rpc(
        &authority.cert_pem,
        &leaf(&authority, "alice", &["Subd.Poll"]),
    );
    watcher.poll(&addr, PollRequest::default()).await.unwrap();
    let e = watcher.update(&addr, req.clone()).await.unwrap_err();
    assert_eq!(
        e.0,
        r#"Subd.Update: 403: access to method Subd.Update denied to "alice""#
    );
    let e = watcher.cleanup(&addr, Vec::new()).await.unwrap_err();
    assert!(
        e.0.contains("access to method Subd.Cleanup denied"),
        "{}",
        e.0
    );
    assert!(!d.path().join("made-by-update").exists());

    // The dominator updates.
    let report = dominator.update(&addr, req).await.unwrap();
    assert_eq!(report.error, None);
    assert!(d.path().join("made-by-update").is_dir());

    // Its polls keep their connection (a TLS handshake per poll would cost more than the
    // poll): twenty in a row come over a few. Not one: the client hands a connection back to
    // its pool from the connection's own task, so on a loaded machine the next poll can find
    // none idle and open another (4 were seen while the suite built beside it); a handshake
    // per poll would be 20.
    let before = connections.lock().unwrap().len();
    for _ in 0..20 {
        dominator.poll(&addr, PollRequest::default()).await.unwrap();
    }
    let ports: std::collections::BTreeSet<u16> = connections.lock().unwrap()[before..]
        .iter()
        .copied()
        .collect();
    assert!(
        ports.len() <= 10,
        "20 polls over {} connections",
        ports.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_further_apart_than_the_header_timeout_keep_their_connection() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("motd"), b"hello\n").unwrap();
    let authority = ca::new_ca("paddock-test-ca", OffsetDateTime::now_utc(), 10).unwrap();
    // The header timeout stands for the 10 s default, the interval for a 30 s poll interval.
    let header = Duration::from_millis(200);
    let limits = tls::Limits {
        header_read_timeout: header,
        ..tls::Limits::default()
    };
    let (addr, connections) = serve_with(d.path(), &authority, limits).await;
    let addr = addr.to_string();
    let dominator = rpc(
        &authority.cert_pem,
        &leaf(&authority, "dominator", &["Subd.*"]),
    );
    for _ in 0..4 {
        dominator.poll(&addr, PollRequest::default()).await.unwrap();
        tokio::time::sleep(header * 3).await;
    }
    let ports: std::collections::BTreeSet<u16> =
        connections.lock().unwrap().iter().copied().collect();
    assert_eq!(
        ports.len(),
        1,
        "4 polls over {} connections (handshakes)",
        ports.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_from_another_ca_or_the_wrong_scheme_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let now = OffsetDateTime::now_utc();
    let authority = ca::new_ca("paddock-test-ca", now, 10).unwrap();
    let addr = serve(d.path(), &authority).await.0.to_string();
    let cert = leaf(&authority, "dominator", &["Subd.*"]);

    // The dominator trusts another CA: the sub's certificate is refused.
    let other = ca::new_ca("paddock-test-ca", now, 10).unwrap();
    let e = rpc(&other.cert_pem, &cert)
        .poll(&addr, PollRequest::default())
        .await
        .unwrap_err();
    assert!(e.0.contains("certificate"), "{}", e.0);

    // A TLS dominator never speaks plain HTTP, and a plain one cannot speak TLS.
    let tls_rpc = rpc(&authority.cert_pem, &cert);
    let e = tls_rpc
        .poll(&format!("http://{addr}"), PollRequest::default())
        .await
        .unwrap_err();
    assert!(e.0.contains("plain http:// refused"), "{}", e.0);
    let plain = HttpSubRpc::new("paddock-test", Duration::from_secs(5));
    let e = plain
        .poll(&format!("https://{addr}"), PollRequest::default())
        .await
        .unwrap_err();
    assert!(e.0.contains("https:// needs"), "{}", e.0);
    // Plain HTTP to the TLS port gets no answer.
    assert!(plain.poll(&addr, PollRequest::default()).await.is_err());

    // The right CA and certificate work.
    tls_rpc.poll(&addr, PollRequest::default()).await.unwrap();
}
