//! The packet loop both DHCP shells share: replies that need no durable change leave at once;
//! lease changes gather into a batch written as ONE store transaction while packets keep
//! being handled; when it commits, its replies are sent and the next batch (everything that
//! arrived meanwhile) is written. A reply therefore always follows the fsync of its lease, and
//! the number of fsyncs adapts to the load. The counters and errors of both shells live here
//! too.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use paddock_store::{Op, Store, StoreError, Txn};
use serde::de::DeserializeOwned;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

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
    /// Handles one received packet: sends what can go now, queues lease changes (with the
    /// replies that must wait for them) in `next`.
    fn packet(
        &self,
        socket: &UdpSocket,
        data: &[u8],
        peer: SocketAddr,
        next: &mut Batch,
    ) -> impl Future<Output = ()> + Send;
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
    let mut buf = vec![0u8; 4096];
    let mut next = Batch::default();
    let mut writing: Option<(CommitFuture, Vec<Reply>, usize)> = None;
    loop {
        tokio::select! {
            res = socket.recv_from(&mut buf) => {
                let (n, peer) = res.map_err(|source| ShellError::Io {
                    interface: interface.to_string(),
                    source,
                })?;
                h.packet(socket, &buf[..n], peer, &mut next).await;
            }
            res = async { writing.as_mut().expect("guarded").0.as_mut().await }, if writing.is_some() => {
                let (_, replies, leases) = writing.take().expect("guarded");
                match res {
                    Ok(_) => {
                        for (bytes, to) in &replies {
                            send(socket, bytes, *to).await;
                        }
                    }
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

pub(crate) async fn send(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    // Straight to the socket when it has room (nearly always); through the reactor otherwise.
    let res = match socket.try_send_to(bytes, to) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => socket.send_to(bytes, to).await,
        other => other,
    };
    if let Err(e) = res {
        tracing::debug!(%to, error = %e, "dhcp: send failed");
    }
}
