//! The listener's clocks between requests, over a real socket: a client that comes back
//! after longer than the header timeout finds its connection still open; one that stays away
//! longer than the idle timeout finds it closed; a request head that trickles in on a
//! kept-alive connection is cut at the header timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use paddock_security::limits::Limits;
use paddock_security::tls;

const HEADER: Duration = Duration::from_millis(300);
const IDLE: Duration = Duration::from_millis(1500);

/// A plain listener with short clocks whose one route answers the caller's port.
fn server() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app =
                Router::new().route(
                    "/",
                    get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                        peer.port().to_string()
                    }),
                );
            let limits = Limits {
                header_read_timeout: HEADER,
                idle_timeout: IDLE,
                ..Limits::default()
            };
            tls::serve(listener, None, app, limits).await
        })
    });
    rx.recv().unwrap()
}

/// One request on `s`; the body (the port the server saw).
fn call(s: &mut TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "closed mid-answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .expect("a content-length")
                .trim()
                .parse()
                .unwrap();
            if body.len() >= len {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                return body.to_string();
            }
        }
    }
}

/// Asserts that the server closes `s` (EOF) no sooner than `at_least` (less a little for
/// the timers) and within `limit`.
fn closed_after(s: &mut TcpStream, at_least: Duration, limit: Duration) {
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("unexpected bytes: {:?}", &buf[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("not closed within {limit:?}: {e}"),
    }
    let after = t0.elapsed();
    assert!(
        after >= at_least - Duration::from_millis(50),
        "closed after {after:?}, before {at_least:?}"
    );
}

#[test]
fn a_client_back_after_the_header_timeout_keeps_its_connection() {
    let addr = server();
    let mut s = TcpStream::connect(addr).unwrap();
    let port = s.local_addr().unwrap().port().to_string();
    assert_eq!(call(&mut s), port);
    for _ in 0..3 {
        std::thread::sleep(HEADER * 3);
        assert_eq!(call(&mut s), port, "the same connection answers");
    }
}

#[test]
fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let addr = server();
    let mut s = TcpStream::connect(addr).unwrap();
    call(&mut s);
    closed_after(&mut s, IDLE, IDLE * 4);
}

#[test]
fn a_trickled_head_on_a_kept_alive_connection_is_cut_at_the_header_timeout() {
    let addr = server();
    let mut s = TcpStream::connect(addr).unwrap();
    call(&mut s);
    std::thread::sleep(HEADER);
    s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    closed_after(&mut s, HEADER, IDLE);
}

#[test]
fn a_silent_connection_is_cut_at_the_header_timeout() {
    let addr = server();
    let mut s = TcpStream::connect(addr).unwrap();
    closed_after(&mut s, HEADER, IDLE);
}
