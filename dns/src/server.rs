//! The thin async shell: UDP and TCP sockets on each listen address, every question answered
//! by [`wire::respond`] from the newest zones the watch holds.
//!
//! TCP connections are bounded in number and in idle time, so that idle or slow askers
//! cannot hold the server; at cancellation the listeners stop and each connection ends after
//! the answer it is writing.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::wire::{self, Reply, TransferAcl, Transport};
use crate::zone::Zones;

/// How the server treats its askers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub transfer_acl: TransferAcl,
    /// TCP connections open at once; more wait in the kernel's backlog.
    pub max_tcp: usize,
    /// How long a TCP connection may wait for its next question.
    pub tcp_idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            transfer_acl: TransferAcl::default(),
            max_tcp: 128,
            tcp_idle: Duration::from_secs(10),
        }
    }
}

/// The bound sockets: binding first lets `paddock serve` fail at start on a taken port.
pub struct Server {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
}

impl Server {
    pub async fn bind(addrs: &[SocketAddr]) -> io::Result<Server> {
        let mut server = Server {
            udp: Vec::new(),
            tcp: Vec::new(),
        };
        for a in addrs {
            let udp = UdpSocket::bind(a).await.map_err(|e| at(e, "UDP", *a))?;
            // The TCP port is the UDP one (which may have been 0: any free port).
            let port = udp.local_addr()?.port();
            let tcp_at = SocketAddr::new(a.ip(), port);
            let tcp = TcpListener::bind(tcp_at)
                .await
                .map_err(|e| at(e, "TCP", tcp_at))?;
            server.udp.push(udp);
            server.tcp.push(tcp);
        }
        Ok(server)
    }

    /// Where it listens (UDP and TCP share each address).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.udp
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }

    /// Answers until `cancel`, from whatever `zones` holds at each question.
    pub async fn run(
        self,
        zones: watch::Receiver<Arc<Zones>>,
        limits: Limits,
        cancel: CancellationToken,
    ) -> io::Result<()> {
        let limits = Arc::new(limits);
        let mut tasks = JoinSet::new();
        for socket in self.udp {
            let socket = Arc::new(socket);
            // Two answering loops per socket: one waits in recv while the other answers.
            for _ in 0..2 {
                tasks.spawn(udp_loop(
                    socket.clone(),
                    zones.clone(),
                    limits.clone(),
                    cancel.clone(),
                ));
            }
        }
        let slots = Arc::new(Semaphore::new(limits.max_tcp));
        for listener in self.tcp {
            tasks.spawn(tcp_loop(
                listener,
                zones.clone(),
                limits.clone(),
                slots.clone(),
                cancel.clone(),
            ));
        }
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(io::Error::other(e)),
            }
        }
        Ok(())
    }
}

fn at(e: io::Error, what: &str, a: SocketAddr) -> io::Error {
    io::Error::new(e.kind(), format!("dns: binding {what} {a}: {e}"))
}

async fn udp_loop(
    socket: Arc<UdpSocket>,
    zones: watch::Receiver<Arc<Zones>>,
    limits: Arc<Limits>,
    cancel: CancellationToken,
) -> io::Result<()> {
    let mut buf = vec![0u8; 4_096];
    loop {
        let (n, from) = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok(got) => got,
                // An ICMP error from an earlier send surfaces here on Linux: not ours to end.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e),
            },
            () = cancel.cancelled() => return Ok(()),
        };
        let current = zones.borrow().clone();
        let reply = wire::respond(
            &current,
            &limits.transfer_acl,
            &buf[..n],
            Transport::Udp,
            from.ip(),
        );
        if let Reply::One(bytes) = reply
            && let Err(e) = socket.send_to(&bytes, from).await
        {
            tracing::debug!(%from, error = %e, "dns: an answer was not sent");
        }
    }
}

async fn tcp_loop(
    listener: TcpListener,
    zones: watch::Receiver<Arc<Zones>>,
    limits: Arc<Limits>,
    slots: Arc<Semaphore>,
    cancel: CancellationToken,
) -> io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.map_err(io::Error::other)?,
            () = cancel.cancelled() => break,
        };
        let (stream, from) = tokio::select! {
            r = listener.accept() => match r {
                Ok(got) => got,
                Err(e) => {
                    tracing::warn!(error = %e, "dns: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = cancel.cancelled() => break,
        };
        let (zones, limits, cancel) = (zones.clone(), limits.clone(), cancel.clone());
        connections.spawn(async move {
            if let Err(e) = connection(stream, from.ip(), zones, &limits, cancel).await {
                tracing::debug!(%from, error = %e, "dns: TCP connection ended");
            }
            drop(slot);
        });
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One TCP connection: length-prefixed questions, each answered in order, until the asker
/// closes, idles past the limit, or the server stops.
async fn connection(
    mut stream: TcpStream,
    source: IpAddr,
    zones: watch::Receiver<Arc<Zones>>,
    limits: &Limits,
    cancel: CancellationToken,
) -> io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let len = tokio::select! {
            r = tokio::time::timeout(limits.tcp_idle, stream.read_u16()) => match r {
                Ok(Ok(len)) => len,
                Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(()),
            },
            () = cancel.cancelled() => return Ok(()),
        };
        buf.resize(usize::from(len), 0);
        tokio::time::timeout(limits.tcp_idle, stream.read_exact(&mut buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "a question sent too slowly"))??;
        let current = zones.borrow().clone();
        let messages =
            match wire::respond(&current, &limits.transfer_acl, &buf, Transport::Tcp, source) {
                Reply::Drop => return Ok(()),
                Reply::One(m) => vec![m],
                Reply::Transfer(ms) => ms,
            };
        for m in messages {
            let len = u16::try_from(m.len()).map_err(io::Error::other)?;
            let mut framed = Vec::with_capacity(m.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&m);
            stream.write_all(&framed).await?;
        }
    }
}
