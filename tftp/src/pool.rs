//! The transfer loops: a few threads (one per core by default), each driving many transfers
//! with one epoll set (mio) and one ordered list of deadlines, instead of one thread per
//! transfer. Under a boot storm a loop wakes once for a batch of ACKs rather than once per
//! ACK per thread; with one or two transfers it polls for a short while before it sleeps,
//! which keeps a single stream's lock-step round trip as short as a spinning thread's.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::engine::{Step, Transfer, TransferError};

/// How long a loop with few transfers polls before it sleeps. A lock-step client answers
/// within tens of microseconds; waking a sleeping thread (and CPU) costs as much again.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(200);
/// Polling pays only while the loop has this many transfers or fewer: under a storm the
/// next ACK is always already there, and a spinning loop would steal the CPU from it.
const POLL_WHILE_AT_MOST: usize = 2;
const WAKER: Token = Token(usize::MAX);
/// Packets read from one transfer's socket before the loop turns to the others.
const READ_BUDGET: usize = 64;

/// Told how a transfer ended (logging, releasing the client's slot).
pub type Done = Box<dyn FnOnce(Result<u64, TransferError>) + Send>;

/// A transfer ready to run: its connected socket (its own transfer ID), the state machine,
/// and who to tell when it ends.
pub struct Job {
    pub sock: std::net::UdpSocket,
    pub transfer: Transfer,
    pub done: Done,
}

struct Loop {
    tx: mpsc::Sender<Job>,
    waker: Arc<Waker>,
}

/// The transfer loops of one TFTP server.
pub struct Pool {
    loops: Vec<Loop>,
    next: AtomicUsize,
}

impl Pool {
    /// Starts `threads` loops (at least one).
    pub fn start(threads: usize, name: &str) -> io::Result<Pool> {
        let mut loops = Vec::new();
        for i in 0..threads.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || run(poll, rx))?;
            loops.push(Loop { tx, waker });
        }
        Ok(Pool {
            loops,
            next: AtomicUsize::new(0),
        })
    }

    /// Hands a transfer to the next loop (round robin).
    pub fn submit(&self, job: Job) -> io::Result<()> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.loops.len();
        let l = &self.loops[i];
        l.tx.send(job)
            .map_err(|_| io::Error::other("the TFTP transfer loop has stopped"))?;
        l.waker.wake()
    }
}

struct Active {
    sock: UdpSocket,
    transfer: Transfer,
    deadline: Instant,
    done: Option<Done>,
}

/// A send on a non-blocking socket: a full socket buffer is a lost packet, which the
/// deadline repairs by sending again.
fn sender(sock: &UdpSocket) -> impl FnMut(&[u8]) -> io::Result<()> + '_ {
    move |p| match sock.send(p) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Read {
    Packet,
    Empty,
    Ended,
}

struct State {
    poll: Poll,
    active: HashMap<usize, Active>,
    deadlines: BTreeSet<(Instant, usize)>,
    next_token: usize,
}

impl State {
    fn add(&mut self, job: Job, now: Instant) {
        let Job {
            sock,
            mut transfer,
            done,
        } = job;
        let mut sock = match sock.set_nonblocking(true) {
            Ok(()) => UdpSocket::from_std(sock),
            Err(e) => return done(Err(e.into())),
        };
        let token = self.next_token;
        self.next_token = (self.next_token + 1) % (usize::MAX - 1);
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut sock, Token(token), Interest::READABLE)
        {
            return done(Err(e.into()));
        }
        let step = transfer.start(now, &mut sender(&sock));
        self.active.insert(
            token,
            Active {
                sock,
                transfer,
                deadline: now,
                done: Some(done),
            },
        );
        self.apply(token, step);
    }

    /// Records what a transfer wants next: a new deadline, or its end.
    fn apply(&mut self, token: usize, step: Step) {
        let Some(a) = self.active.get_mut(&token) else {
            return;
        };
        self.deadlines.remove(&(a.deadline, token));
        let end = match step {
            Step::Wait(at) => {
                a.deadline = at;
                self.deadlines.insert((at, token));
                return;
            }
            Step::Done(bytes) => Ok(bytes),
            Step::Failed(e) => Err(e),
        };
        if let Some(mut a) = self.active.remove(&token) {
            let _ = self.poll.registry().deregister(&mut a.sock);
            if let Some(done) = a.done.take() {
                done(end);
            }
        }
    }

    /// The packets waiting on a transfer's socket, at most [`READ_BUDGET`] of them: a peer
    /// that sends without pause must not keep the loop from its other transfers. Returns
    /// whether the socket may hold more (edge-triggered: no new event will say so).
    fn readable(&mut self, token: usize, buf: &mut [u8]) -> bool {
        for _ in 0..READ_BUDGET {
            if self.read_one(token, buf) != Read::Packet {
                return false;
            }
        }
        true
    }

    /// One packet from a transfer's socket, handled.
    fn read_one(&mut self, token: usize, buf: &mut [u8]) -> Read {
        let Some(a) = self.active.get_mut(&token) else {
            return Read::Ended;
        };
        let n = match a.sock.recv(buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Read::Empty,
            // ICMP port unreachable and the like: the client is gone.
            Err(e) => {
                self.apply(token, Step::Failed(e.into()));
                return Read::Ended;
            }
        };
        let now = Instant::now();
        let Active { sock, transfer, .. } = a;
        let step = transfer.on_packet(&buf[..n], now, &mut sender(sock));
        match step {
            Some(step @ Step::Wait(_)) => self.apply(token, step),
            Some(step) => {
                self.apply(token, step);
                return Read::Ended;
            }
            None => {}
        }
        Read::Packet
    }

    /// A loop with a single transfer waits for its next packet by polling that socket
    /// itself, as a thread per transfer did: epoll would add a system call to every block of
    /// a lock-step transfer. Gives up after [`POLL_BEFORE_SLEEP`] without a packet, or when
    /// a new transfer is handed over.
    fn spin_on_one(&mut self, buf: &mut [u8], rx: &mpsc::Receiver<Job>) {
        let Some(&token) = self.active.keys().next() else {
            return;
        };
        let mut until = Instant::now() + POLL_BEFORE_SLEEP;
        while self.active.len() == 1 {
            match self.read_one(token, buf) {
                Read::Packet => until = Instant::now() + POLL_BEFORE_SLEEP,
                Read::Ended => return,
                Read::Empty if Instant::now() >= until => return,
                Read::Empty => std::hint::spin_loop(),
            }
            while let Ok(job) = rx.try_recv() {
                self.add(job, Instant::now());
            }
            if self
                .deadlines
                .first()
                .is_some_and(|(at, _)| *at <= Instant::now())
            {
                return;
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(at, token)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, token));
            let Some(a) = self.active.get_mut(&token) else {
                continue;
            };
            let Active { sock, transfer, .. } = a;
            let step = transfer.on_timeout(now, &mut sender(sock));
            self.apply(token, step);
        }
    }
}

fn run(poll: Poll, rx: mpsc::Receiver<Job>) {
    let mut st = State {
        poll,
        active: HashMap::new(),
        deadlines: BTreeSet::new(),
        next_token: 0,
    };
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 2048];
    // Transfers whose sockets may still hold packets after their read budget.
    let mut more: Vec<usize> = Vec::new();
    loop {
        if more.is_empty() && st.active.len() == 1 {
            st.spin_on_one(&mut buf, &rx);
        }
        let now = Instant::now();
        let timeout = if more.is_empty() {
            st.deadlines
                .first()
                .map(|(at, _)| at.saturating_duration_since(now))
        } else {
            Some(Duration::ZERO)
        };
        if let Err(e) = wait(&mut st, &mut events, timeout) {
            tracing::error!(error = %e, "tftp: transfer loop cannot poll");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                loop {
                    match rx.try_recv() {
                        Ok(job) => st.add(job, Instant::now()),
                        Err(mpsc::TryRecvError::Empty) => break,
                        // The server is gone: finish what runs, then stop.
                        Err(mpsc::TryRecvError::Disconnected) if st.active.is_empty() => return,
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    }
                }
            } else if st.readable(ev.token().0, &mut buf) {
                more.push(ev.token().0);
            }
        }
        for token in std::mem::take(&mut more) {
            if st.readable(token, &mut buf) {
                more.push(token);
            }
        }
        st.expire(Instant::now());
    }
}

/// Polls for events: briefly without sleeping when the loop has few transfers, then until
/// the next deadline.
fn wait(st: &mut State, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
    // (A single transfer was already polled directly: `State::spin_on_one`.)
    if (2..=POLL_WHILE_AT_MOST).contains(&st.active.len()) {
        let until = Instant::now() + POLL_BEFORE_SLEEP;
        loop {
            st.poll.poll(events, Some(Duration::ZERO))?;
            if !events.is_empty() || Instant::now() >= until {
                break;
            }
            std::hint::spin_loop();
        }
        if !events.is_empty() {
            return Ok(());
        }
    }
    match st.poll.poll(events, timeout) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        r => r,
    }
}
