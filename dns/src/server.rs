//! The thin shell: UDP and TCP sockets on each listen address, every question answered by
//! [`wire::respond`] (through the [`AnswerCache`] over UDP) from the newest zones the watch
//! holds.
//!
//! UDP is answered by one blocking thread per core, all reading the same socket, each
//! reading and writing up to [`BATCH`] datagrams per system call. Measured on 2 cores
//! (bench/dns.sh): two tokio tasks sharing one socket answered 96k questions/s; the threads
//! 151k; batched, more (bench/RESULTS.md). A socket per thread (`SO_REUSEPORT`) spreads
//! askers by their address and port, so a few busy askers can load one thread while the
//! other idles: a median of 171k against one shared socket's 183k, with 20 askers.
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

use crate::cache::AnswerCache;
use crate::notify::{Notifier, PeerZone};
use crate::rrl::{Limiter, RateLimit, Verdict};
use crate::stats::{Stats, Tally, question_type};
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
    /// Per listen address, one socket per answering thread.
    udp: Vec<Vec<std::net::UdpSocket>>,
    tcp: Vec<TcpListener>,
    peers: PeerBoard,
    stats: Arc<Stats>,
}

/// How long an answering thread waits in `recv` before it looks at the cancellation.
const UDP_POLL: Duration = Duration::from_millis(200);

/// The UDP socket the answering threads share.
fn udp_socket(a: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(a), Type::DGRAM, Some(Protocol::UDP))?;
    // Room for a burst while the threads are busy (the kernel caps it at rmem_max).
    let _ = s.set_recv_buffer_size(4 << 20);
    s.bind(&a.into())?;
    s.set_read_timeout(Some(UDP_POLL))?;
    Ok(s.into())
}

impl Server {
    pub async fn bind(addrs: &[SocketAddr]) -> io::Result<Server> {
        let mut server = Server {
            udp: Vec::new(),
            tcp: Vec::new(),
            peers: PeerBoard::default(),
            stats: Arc::default(),
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for a in addrs {
            let first = udp_socket(*a).map_err(|e| at(e, "UDP", *a))?;
            // The others, and TCP, on the first's port (which may have been 0: any free one).
            let port = first.local_addr()?.port();
            let at_port = SocketAddr::new(a.ip(), port);
            let mut sockets = vec![first];
            for _ in 1..threads {
                let again = sockets[0].try_clone()?;
                sockets.push(again);
            }
            let tcp = TcpListener::bind(at_port)
                .await
                .map_err(|e| at(e, "TCP", at_port))?;
            server.udp.push(sockets);
            server.tcp.push(tcp);
        }
        Ok(server)
    }

    /// The server's counters, for `/metrics`.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The secondaries' standing, kept current while the server runs.
    pub fn peers(&self) -> PeerBoard {
        self.peers.clone()
    }

    /// Where it listens (UDP and TCP share each address).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.udp
            .iter()
            .filter_map(|s| s.first()?.local_addr().ok())
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
        let from = self.local_addrs().first().copied();
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
        for socket in self.udp.into_iter().flatten() {
            let (zones, limits, limiter, cancel) = (
                zones.clone(),
                limits.clone(),
                limiter.clone(),
                cancel.clone(),
            );
            let stats = self.stats.clone();
            tasks.spawn_blocking(move || {
                let shared = Shared {
                    limits: &limits,
                    limiter: &limiter,
                    stats: &stats,
                };
                udp_loop(&socket, zones, &shared, &cancel)
            });
        }
        let slots = Arc::new(Semaphore::new(limits.max_tcp));
        for listener in self.tcp {
            tasks.spawn(tcp_loop(
                listener,
                zones.clone(),
                (limits.clone(), self.stats.clone()),
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

/// Datagrams taken from the socket, and answers given to it, per system call.
const BATCH: usize = 32;

/// What the answering threads share.
struct Shared<'a> {
    limits: &'a Limits,
    limiter: &'a std::sync::Mutex<Limiter>,
    stats: &'a Stats,
}

/// One answering thread: questions from its socket until `cancel`, read and answered in
/// batches (`recvmmsg`: the first waits, the rest are what is queued already; `sendmmsg`).
fn udp_loop(
    socket: &std::net::UdpSocket,
    mut zones: watch::Receiver<Arc<Zones>>,
    shared: &Shared<'_>,
    cancel: &CancellationToken,
) -> io::Result<()> {
    let (limits, limiter) = (shared.limits, shared.limiter);
    let mut tally = Tally::default();
    use nix::errno::Errno;
    use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
    use std::io::{IoSlice, IoSliceMut};
    use std::os::fd::AsRawFd;

    let fd = socket.as_raw_fd();
    let mut bufs = vec![[0u8; 4_096]; BATCH];
    let mut rx = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut tx = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut cache = AnswerCache::default();
    let mut current = zones.borrow_and_update().clone();
    let limited = limits.rate.per_second > 0;
    let mut received: Vec<(usize, SockaddrStorage)> = Vec::with_capacity(BATCH);
    // The batch's answers, one after another in `out`, each with its asker.
    let mut out: Vec<u8> = Vec::with_capacity(BATCH * 512);
    let mut replies: Vec<(std::ops::Range<usize>, SockaddrStorage)> = Vec::with_capacity(BATCH);
    while !cancel.is_cancelled() {
        received.clear();
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs
                .iter_mut()
                .map(|b| [IoSliceMut::new(&mut b[..])])
                .collect();
            match recvmmsg(fd, &mut rx, iovs.iter_mut(), MsgFlags::MSG_WAITFORONE, None) {
                Ok(got) => received.extend(got.filter_map(|m| Some((m.bytes, m.address?)))),
                // The read timeout (a look at the cancellation), a signal, or an ICMP error
                // from an earlier answer surfacing here.
                Err(Errno::EAGAIN | Errno::EINTR | Errno::ECONNREFUSED) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        if zones.has_changed().unwrap_or(false) {
            current = zones.borrow_and_update().clone();
        }
        replies.clear();
        out.clear();
        for (i, (n, address)) in received.iter().enumerate() {
            let Some(from) = socket_addr(address) else {
                continue;
            };
            let query = &bufs[i][..*n];
            let verdict = if limited {
                let now = paddock_clock::now();
                match limiter.lock() {
                    Ok(mut l) => l.check(from.ip(), now),
                    Err(poisoned) => poisoned.into_inner().check(from.ip(), now),
                }
            } else {
                Verdict::Answer
            };
            let at = out.len();
            let reply = match verdict {
                Verdict::Answer => {
                    cache.answer_into(&current, &limits.transfer_acl, query, from.ip(), &mut out)
                }
                Verdict::Slip => {
                    tally.slipped();
                    Some(wire::slipped(query).map_or(Reply::Drop, Reply::One))
                }
                Verdict::Drop => {
                    tally.limited();
                    Some(Reply::Drop)
                }
            };
            if let Some(Reply::One(bytes)) = reply {
                out.extend_from_slice(&bytes);
            }
            let sent = (out.len() > at).then(|| &out[at..]);
            tally.count(question_type(query), sent);
            if sent.is_some() {
                replies.push((at..out.len(), *address));
            }
        }
        tally.flush(shared.stats);
        if replies.is_empty() {
            continue;
        }
        let slices: Vec<[IoSlice<'_>; 1]> = replies
            .iter()
            .map(|(r, _)| [IoSlice::new(&out[r.clone()])])
            .collect();
        let addrs: Vec<Option<SockaddrStorage>> = replies.iter().map(|(_, a)| Some(*a)).collect();
        if let Err(e) = sendmmsg(fd, &mut tx, slices.iter(), addrs, [], MsgFlags::empty()) {
            tracing::debug!(error = %e, answers = replies.len(), "dns: answers were not sent");
        }
    }
    Ok(())
}

/// The asker's address as the standard library has it.
fn socket_addr(a: &nix::sys::socket::SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4(std::net::SocketAddrV4::from(*v4)));
    }
    a.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(std::net::SocketAddrV6::from(*v6)))
}

async fn tcp_loop(
    listener: TcpListener,
    zones: watch::Receiver<Arc<Zones>>,
    (limits, stats): (Arc<Limits>, Arc<Stats>),
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
        let (transfers, stats) = (transfers.clone(), stats.clone());
        connections.spawn(async move {
            let asker = Asker {
                source: from.ip(),
                limits: &limits,
                transfers,
                stats: &stats,
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
    stats: &'a Stats,
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
        let reply = wire::respond(&current, &limits.transfer_acl, &buf, Transport::Tcp, source);
        let mut tally = Tally::default();
        let first = match &reply {
            Reply::Drop => None,
            Reply::One(m) => Some(m.as_slice()),
            Reply::Transfer { messages, .. } => messages.first().map(Vec::as_slice),
        };
        tally.count(question_type(&buf), first);
        tally.flush(asker.stats);
        let messages = match reply {
            Reply::Drop => return Ok(()),
            Reply::One(m) => vec![m],
            Reply::Transfer {
                apex,
                serial,
                incremental,
                messages,
            } => {
                tracing::info!(%source, zone = %apex, serial, incremental, "dns: zone transferred");
                let counter = if incremental {
                    &asker.stats.transfers_incremental
                } else {
                    &asker.stats.transfers_full
                };
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// The serial `peer` serves for `apex`, asked now over UDP; `None` without an answer
/// within `wait`.
pub async fn ask_serial(peer: SocketAddr, apex: &str, wait: Duration) -> Option<u32> {
    let local: SocketAddr = match peer {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await.ok()?;
    socket.connect(peer).await.ok()?;
    let id = rand_id();
    let question = wire::soa_query(apex, id)?;
    let ask = async {
        socket.send(&question).await.ok()?;
        let mut buf = vec![0u8; 4_096];
        loop {
            let n = socket.recv(&mut buf).await.ok()?;
            if let Some(serial) = wire::soa_serial(&buf[..n], id) {
                return Some(serial);
            }
        }
    };
    tokio::time::timeout(wait, ask).await.ok().flatten()
}

/// A query ID nobody off the path can guess (an answer must echo it).
fn rand_id() -> u16 {
    use ring::rand::SecureRandom;
    let mut id = [0u8; 2];
    let _ = ring::rand::SystemRandom::new().fill(&mut id);
    u16::from_be_bytes(id)
}

/// Tells the secondaries of each new serial until cancelled (see [`Notifier`]).
async fn notify_loop(
    socket: UdpSocket,
    (secondaries, board): (Vec<SocketAddr>, PeerBoard),
    mut zones: watch::Receiver<Arc<Zones>>,
    mut transfers: mpsc::Receiver<Transferred>,
    cancel: CancellationToken,
) -> io::Result<()> {
    // The zones are taken up as they appear (none before the first build).
    let mut notifier = Notifier::new(&secondaries, &[]);
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
