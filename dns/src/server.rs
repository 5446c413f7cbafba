//! The thin async shell: UDP and TCP sockets on each listen address, every question answered
//! by [`wire::respond`] from the newest zones the watch holds.
//!
//! TCP connections are bounded in number and in idle time, so that idle or slow askers
//! cannot hold the server; at cancellation the listeners stop and each connection ends after
//! the answer it is writing. With secondaries configured, a NOTIFY loop tells them of each
//! new serial from the first listen address (the address they know as their primary).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::notify::{Notifier, PeerZone};
use crate::rrl::{Limiter, RateLimit, Verdict};
use crate::wire::{self, Reply, TransferAcl, Transport};
use crate::zone::Zones;

/// A transfer sent: the asker's address, the zone, the serial it now has.
type Transferred = (IpAddr, String, u32);

/// How the server treats its askers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub transfer_acl: TransferAcl,
    /// TCP connections open at once; more wait in the kernel's backlog.
    pub max_tcp: usize,
    /// How long a TCP connection may wait for its next question.
    pub tcp_idle: Duration,
    /// Secondaries told of every new serial (NOTIFY).
    pub secondaries: Vec<SocketAddr>,
    /// Answers per source netblock over UDP.
    pub rate: RateLimit,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            transfer_acl: TransferAcl::default(),
            max_tcp: 128,
            tcp_idle: Duration::from_secs(10),
            secondaries: Vec::new(),
            rate: RateLimit::default(),
        }
    }
}

/// Where each secondary stands with each zone, as the NOTIFY loop last saw it.
pub type PeerBoard = Arc<std::sync::Mutex<Vec<PeerZone>>>;

/// The bound sockets: binding first lets `paddock serve` fail at start on a taken port.
pub struct Server {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
    peers: PeerBoard,
}

impl Server {
    pub async fn bind(addrs: &[SocketAddr]) -> io::Result<Server> {
        let mut server = Server {
            udp: Vec::new(),
            tcp: Vec::new(),
            peers: PeerBoard::default(),
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

    /// The secondaries' standing, kept current while the server runs.
    pub fn peers(&self) -> PeerBoard {
        self.peers.clone()
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
        let (transfers_tx, transfers) = mpsc::channel::<Transferred>(64);
        let from = self.udp.first().and_then(|s| s.local_addr().ok());
        if let (Some(from), false) = (from, limits.secondaries.is_empty()) {
            let socket = UdpSocket::bind(SocketAddr::new(from.ip(), 0)).await?;
            tasks.spawn(notify_loop(
                socket,
                (limits.secondaries.clone(), self.peers.clone()),
                zones.clone(),
                transfers,
                cancel.clone(),
            ));
        }
        let limiter = Arc::new(std::sync::Mutex::new(Limiter::new(limits.rate)));
        for socket in self.udp {
            let socket = Arc::new(socket);
            // Two answering loops per socket: one waits in recv while the other answers.
            for _ in 0..2 {
                tasks.spawn(udp_loop(
                    socket.clone(),
                    zones.clone(),
                    limits.clone(),
                    limiter.clone(),
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
                transfers_tx.clone(),
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
    limiter: Arc<std::sync::Mutex<Limiter>>,
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
        let verdict = match limiter.lock() {
            Ok(mut l) => l.check(from.ip(), paddock_clock::now()),
            Err(poisoned) => poisoned.into_inner().check(from.ip(), paddock_clock::now()),
        };
        let reply = match verdict {
            Verdict::Answer => {
                let current = zones.borrow().clone();
                wire::respond(
                    &current,
                    &limits.transfer_acl,
                    &buf[..n],
                    Transport::Udp,
                    from.ip(),
                )
            }
            Verdict::Slip => wire::slipped(&buf[..n]).map_or(Reply::Drop, Reply::One),
            Verdict::Drop => Reply::Drop,
        };
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
    transfers: mpsc::Sender<Transferred>,
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
        let transfers = transfers.clone();
        connections.spawn(async move {
            let asker = Asker {
                source: from.ip(),
                limits: &limits,
                transfers,
            };
            if let Err(e) = connection(stream, asker, zones, cancel).await {
                tracing::debug!(%from, error = %e, "dns: TCP connection ended");
            }
            drop(slot);
        });
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Who is at the other end of a TCP connection, and where its transfers are reported.
struct Asker<'a> {
    source: IpAddr,
    limits: &'a Limits,
    transfers: mpsc::Sender<Transferred>,
}

/// One TCP connection: length-prefixed questions, each answered in order, until the asker
/// closes, idles past the limit, or the server stops.
async fn connection(
    mut stream: TcpStream,
    asker: Asker<'_>,
    zones: watch::Receiver<Arc<Zones>>,
    cancel: CancellationToken,
) -> io::Result<()> {
    let (source, limits) = (asker.source, asker.limits);
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
        let messages = match wire::respond(
            &current,
            &limits.transfer_acl,
            &buf,
            Transport::Tcp,
            source,
        ) {
            Reply::Drop => return Ok(()),
            Reply::One(m) => vec![m],
            Reply::Transfer {
                apex,
                serial,
                incremental,
                messages,
            } => {
                tracing::info!(%source, zone = %apex, serial, incremental, "dns: zone transferred");
                // Best effort: a full channel only delays resuming a given-up peer.
                let _ = asker.transfers.try_send((source, apex, serial));
                messages
            }
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

/// Tells the secondaries of each new serial until cancelled (see [`Notifier`]).
async fn notify_loop(
    socket: UdpSocket,
    (secondaries, board): (Vec<SocketAddr>, PeerBoard),
    mut zones: watch::Receiver<Arc<Zones>>,
    mut transfers: mpsc::Receiver<Transferred>,
    cancel: CancellationToken,
) -> io::Result<()> {
    let apexes: Vec<String> = zones
        .borrow()
        .zones
        .iter()
        .map(|z| z.apex.clone())
        .collect();
    let mut notifier = Notifier::new(&secondaries, &apexes);
    let serials = |z: &Zones| -> Vec<(String, u32)> {
        z.zones.iter().map(|z| (z.apex.clone(), z.serial)).collect()
    };
    let mut current = zones.borrow().clone();
    let mut buf = vec![0u8; 4_096];
    loop {
        let now = paddock_clock::now();
        notifier.serials(now, serials(&current).iter().map(|(a, s)| (a.as_str(), *s)));
        for n in notifier.due(now) {
            let Some(zone) = current.zones.iter().find(|z| z.apex == n.apex) else {
                continue;
            };
            if let Some(bytes) = wire::notify(zone, n.serial, n.id) {
                tracing::debug!(peer = %n.peer, zone = %n.apex, serial = n.serial, "dns: NOTIFY");
                if let Err(e) = socket.send_to(&bytes, n.peer).await {
                    tracing::debug!(peer = %n.peer, error = %e, "dns: a NOTIFY was not sent");
                }
            }
        }
        if let Ok(mut b) = board.lock() {
            *b = notifier.peers().cloned().collect();
        }
        let wait = notifier
            .next_wake()
            .map_or(Duration::from_secs(3_600), |t| {
                t.since(paddock_clock::now())
            });
        tokio::select! {
            changed = zones.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                current = zones.borrow_and_update().clone();
            }
            Some((ip, apex, serial)) = transfers.recv() => {
                notifier.transferred(ip, &apex, serial, paddock_clock::now());
            }
            r = socket.recv_from(&mut buf) => {
                if let Ok((n, from)) = r
                    && let Some((apex, id)) = wire::notify_answer(&buf[..n])
                {
                    notifier.answered(from, &apex, id);
                }
            }
            () = tokio::time::sleep(wait) => {}
            () = cancel.cancelled() => return Ok(()),
        }
    }
}
