//! The packet loop both DHCP shells share: replies that need no durable change leave at once;
//! lease changes gather into a batch written as ONE store transaction while packets keep
//! being handled; when it commits, its replies are sent and the next batch (everything that
//! arrived meanwhile) is written. A reply therefore always follows the fsync of its lease, and
//! the number of fsyncs adapts to the load. Packets are read and replies sent in batches
//! (`recvmmsg`, `sendmmsg`): under a boot storm a system call per packet was a large part of
//! the loop's time. The counters and errors of both shells live here too.

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use paddock_store::{Op, Store, StoreError, Txn};
use serde::de::DeserializeOwned;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Packets read, or replies sent, by one system call at most.
const BATCH: usize = 64;
/// The largest packet read; a longer one is dropped as malformed (cut short, it could still
/// decode, with options missing).
const MAX_PACKET: usize = 4096;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    pub received: AtomicU64,
    pub malformed: AtomicU64,
    pub ignored: AtomicU64,
    pub offers: AtomicU64,
    pub acks: AtomicU64,
    pub naks: AtomicU64,
    pub persist_errors: AtomicU64,
    /// Requests dropped because their client was over its budget (`per_client_burst`,
    /// `per_client_per_sec`). Not counted in `ignored`.
    pub limited_client: AtomicU64,
    /// Requests dropped because they would have taken a new address beyond
    /// `new_leases_per_window`. Not counted in `ignored`.
    pub limited_new_leases: AtomicU64,
    /// Relayed requests from a source not among the configured relays. Not counted in
    /// `ignored`.
    pub relay_refused: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("cannot open a DHCP socket on {interface} port {port}: {source}")]
    Bind {
        interface: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("DHCP socket on {interface}: {source}")]
    Io {
        interface: String,
        source: std::io::Error,
    },
    #[error("lease record {key} is unreadable: {source}")]
    BadLease {
        key: String,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An encoded reply and where it goes.
pub(crate) type Reply = (Vec<u8>, SocketAddr);

/// Lease writes waiting for the next transaction, and the replies that follow them.
#[derive(Default)]
pub(crate) struct Batch {
    pub ops: Vec<Op>,
    pub replies: Vec<Reply>,
}

/// One socket's protocol: what a packet does, and where its leases are stored.
pub(crate) trait Handler: Send + Sync {
    /// Handles one received packet: a reply that can go at once into `now`; lease changes,
    /// with the replies that must wait for them, into `next`. Must not block.
    fn packet(&self, data: &[u8], peer: SocketAddr, now: &mut Vec<Reply>, next: &mut Batch);
    fn store(&self) -> Arc<dyn Store>;
    fn stats(&self) -> &Stats;
    /// A batch of `leases` was not stored: its replies are withheld.
    fn not_stored(&self, leases: usize, error: &StoreError) {
        self.stats()
            .persist_errors
            .fetch_add(leases as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(leases, %error, "dhcp: leases not stored, their replies withheld");
    }
}

/// Every lease stored under `prefix`. One unreadable record stops the start: a lease
/// forgotten would be handed out again while its holder still uses it.
pub(crate) async fn stored_leases<L: DeserializeOwned>(
    store: &dyn Store,
    prefix: &str,
) -> Result<Vec<L>, ShellError> {
    store
        .range(prefix)
        .await?
        .into_iter()
        .map(|kv| {
            serde_json::from_slice(&kv.value).map_err(|source| ShellError::BadLease {
                key: kv.key,
                source,
            })
        })
        .collect()
}

/// A server's UDP socket on `interface` (SO_BINDTODEVICE), bound to `addr`, non-blocking:
/// `family` sets what one family needs before the bind (broadcast, v6-only), `joined` what
/// it needs after (a multicast group).
pub(crate) fn server_socket(
    interface: &str,
    addr: SocketAddr,
    family: impl FnOnce(&Socket) -> std::io::Result<()>,
    joined: impl FnOnce(&Socket) -> std::io::Result<()>,
) -> Result<UdpSocket, ShellError> {
    let err = |source| ShellError::Bind {
        interface: interface.to_string(),
        port: addr.port(),
        source,
    };
    let s =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    family(&s).map_err(err)?;
    s.set_reuse_address(true).map_err(err)?;
    s.bind_device(Some(interface.as_bytes())).map_err(err)?;
    // Bigger buffers ride out bursts (a rack powering on at once).
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&addr.into()).map_err(err)?;
    joined(&s).map_err(err)?;
    s.set_nonblocking(true).map_err(err)?;
    UdpSocket::from_std(s.into()).map_err(err)
}

/// Serves every socket with its handler, and calls `tick` every 10 s (offers and
/// advertisements whose hold ran out are forgotten there); ends with the first socket that
/// fails.
pub(crate) async fn run<H: Handler + 'static>(
    links: Vec<(H, UdpSocket, String)>,
    tick: impl Fn() + Send + 'static,
) -> Result<(), ShellError> {
    let mut tasks = tokio::task::JoinSet::new();
    for (handler, socket, interface) in links {
        tasks.spawn(async move { serve(&handler, &socket, &interface).await });
    }
    tasks.spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            every.tick().await;
            tick();
        }
    });
    while let Some(res) = tasks.join_next().await {
        if let Ok(Err(e)) = res {
            return Err(e);
        }
    }
    Ok(())
}

type CommitFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<paddock_store::TxnResponse, StoreError>> + Send>>;

/// Serves `socket` until it fails.
pub(crate) async fn serve<H: Handler>(
    h: &H,
    socket: &UdpSocket,
    interface: &str,
) -> Result<(), ShellError> {
    let io_error = |source| ShellError::Io {
        interface: interface.to_string(),
        source,
    };
    let mut rx = Received::new();
    let mut now = Vec::with_capacity(BATCH);
    let mut next = Batch::default();
    let mut writing: Option<(CommitFuture, Vec<Reply>, usize)> = None;
    loop {
        tokio::select! {
            ready = socket.readable() => {
                ready.map_err(io_error)?;
                match socket.try_io(Interest::READABLE, || rx.read(socket.as_raw_fd())) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_error(e)),
                }
                for (data, peer) in rx.packets() {
                    h.packet(data, peer, &mut now, &mut next);
                }
                send_all(socket, &now).await;
                now.clear();
                // Nothing above spends the task's cooperative budget (a `recv_from` spent a
                // unit a packet): spend it here, so that a queue that never empties under a
                // storm still lets the worker run other tasks, the store's commit among them.
                for _ in 0..rx.got.len() {
                    tokio::task::consume_budget().await;
                }
            }
            res = async { writing.as_mut().expect("guarded").0.as_mut().await }, if writing.is_some() => {
                let (_, replies, leases) = writing.take().expect("guarded");
                match res {
                    Ok(_) => send_all(socket, &replies).await,
                    Err(e) => h.not_stored(leases, &e),
                }
            }
        }
        if writing.is_none() && !next.ops.is_empty() {
            let Batch { ops, replies } = std::mem::take(&mut next);
            let leases = ops.len();
            let txn = Txn {
                success: ops,
                ..Txn::default()
            };
            let store = h.store();
            writing = Some((
                Box::pin(async move { store.txn(txn).await }),
                replies,
                leases,
            ));
        }
    }
}

/// The buffers one `recvmmsg` fills, and what it read into them. (nix's message headers
/// hold raw pointers, so they are made for each call rather than kept across an await.)
struct Received {
    bufs: Vec<u8>,
    /// Each packet's length and sender, in the order of `bufs`' slots.
    got: Vec<(usize, Option<SocketAddr>)>,
}

impl Received {
    fn new() -> Self {
        Received {
            bufs: vec![0; BATCH * MAX_PACKET],
            got: Vec::with_capacity(BATCH),
        }
    }

    /// Reads what is queued on `fd`, up to [`BATCH`] packets, without waiting.
    fn read(&mut self, fd: RawFd) -> std::io::Result<()> {
        self.got.clear();
        let mut slots: Vec<[IoSliceMut<'_>; 1]> = self
            .bufs
            .chunks_mut(MAX_PACKET)
            .map(|b| [IoSliceMut::new(b)])
            .collect();
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
        let read = recvmmsg(
            fd,
            &mut headers,
            slots.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )?;
        self.got.extend(read.map(|m| {
            // A packet cut short is passed on empty: it fails to decode and counts as such.
            let n = if m.flags.contains(MsgFlags::MSG_TRUNC) {
                0
            } else {
                m.bytes
            };
            (n, m.address.as_ref().and_then(socket_addr))
        }));
        Ok(())
    }

    /// The packets of the last read, each with its sender.
    fn packets(&self) -> impl Iterator<Item = (&[u8], SocketAddr)> {
        self.bufs
            .chunks(MAX_PACKET)
            .zip(&self.got)
            .filter_map(|(buf, (n, peer))| Some((&buf[..(*n).min(MAX_PACKET)], (*peer)?)))
    }
}

/// A sender's address as the standard library has it (its scope, for a link-local one).
fn socket_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    a.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into()))
}

/// Sends every reply, [`BATCH`] to a system call, waiting while the socket's buffer is full.
/// A reply the kernel refuses (no route to its address) is logged and skipped.
async fn send_all(socket: &UdpSocket, replies: &[Reply]) {
    let mut rest = replies;
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(BATCH)];
        match socket.try_io(Interest::WRITABLE, || send_batch(socket.as_raw_fd(), batch)) {
            Ok(sent) => rest = &rest[sent.clamp(1, batch.len())..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Err(e) = socket.writable().await {
                    tracing::debug!(error = %e, replies = rest.len(), "dhcp: replies not sent");
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!(to = %rest[0].1, error = %e, "dhcp: send failed");
                rest = &rest[1..];
            }
        }
    }
}

/// One `sendmmsg` of `batch`: how many of its replies left.
fn send_batch(fd: RawFd, batch: &[Reply]) -> std::io::Result<usize> {
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(batch.len(), None);
    let slices: Vec<[IoSlice<'_>; 1]> = batch.iter().map(|(b, _)| [IoSlice::new(b)]).collect();
    let to: Vec<Option<SockaddrStorage>> = batch.iter().map(|(_, a)| Some((*a).into())).collect();
    Ok(sendmmsg(fd, &mut headers, slices.iter(), to, [], MsgFlags::empty())?.count())
}
