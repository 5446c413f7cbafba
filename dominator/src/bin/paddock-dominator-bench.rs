//! The dominator at fleet scale (bench/dominator.sh): a simulated fleet that speaks subd's
//! RPC over HTTP, and the real [`Herd`] with [`HttpSubRpc`] keeping it on an image.
//!
//! ```text
//! paddock-dominator-bench scan DIR TREE.json
//!     scan DIR once with subd's scanner; write its tree as JSON
//! paddock-dominator-bench certs DIR
//!     a CA and the dominator's certificate, for --tls DIR
//! paddock-dominator-bench sim TREE.json --subs N [--listen 0.0.0.0:6969] [--tls DIR]
//!     serve N subs, each holding TREE, each at its own loopback address (sub i at
//!     127.1.0.1 + i, port 6969; the connection's local address picks the sub), plus
//!     /bench/{stats,mark,bump_all,churn} for the driver (always plain HTTP); with --tls,
//!     the subs speak mutual TLS, each with a certificate of its own from DIR's CA
//! paddock-dominator-bench profile TREE.json
//!     where a full poll's CPU and memory go in the herd: parsing the answer, planning it
//! paddock-dominator-bench herd TREE.json --subs N [--sim 127.0.0.1:6969]
//!     [--poll-interval-ms 100] [--poll-slots 200] [--churn-permille 10] [--cycles 3]
//!     [--tls DIR]
//!     drive the Herd against the simulator (over mutual TLS with DIR's certificates);
//!     prints `dominator subs=N tls=on|off short_poll_cycle_s=… full_polls_per_s=…
//!     rss_per_sub_kib=… connections_per_cycle=…`
//! ```
//!
//! The simulated sub answers a poll as subd does (the tree only when the caller's
//! generation differs; subd's binary answer to a caller that asks for it, as the herd does,
//! else JSON); the full answer's tree part is encoded once and shared, so the simulator's
//! CPU goes to HTTP and not to re-encoding one tree.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Json;
use axum::extract::State;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use paddock_dominator::{
    Census, Desired, Herd, HttpSubRpc, ImageSource, Limits, Policy, Polled, PreparedImage,
    RpcError, SubRpc, SubSpec, SubState,
};
use paddock_image::{FileSystem, Filter, Image, Inode, ObjectId, UpdateRequest};
use paddock_subd::rpc::{POLL_MEDIA_TYPE, poll_binary};
use paddock_subd::service::{
    CleanupReply, FetchReply, FetchRequest, PollRequest, PollResponse, UpdateReport,
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

#[path = "paddock-dominator-bench/computed.rs"]
mod computed;
#[path = "paddock-dominator-bench/tls.rs"]
mod tls;

const IMAGE: &str = "debian/minbase";
const FIRST_SUB: Ipv4Addr = Ipv4Addr::new(127, 1, 0, 1);
const SUB_PORT: u16 = 6969;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("scan") if args.len() == 3 => scan(Path::new(&args[1]), Path::new(&args[2])),
        Some("profile") if args.len() == 2 => profile(&args[1]),
        Some("certs") if args.len() == 2 => tls::certs(Path::new(&args[1])),
        Some("sim") if args.len() >= 2 => Opts::parse(&args[2..]).and_then(|o| sim(&args[1], o)),
        Some("herd") if args.len() >= 2 => Opts::parse(&args[2..]).and_then(|o| herd(&args[1], o)),
        _ => Err(BenchError::Usage),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paddock-dominator-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, BenchError>;

/// What stopped the bench; each names the option, file, address or phase.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(
        "usage: paddock-dominator-bench scan DIR TREE.json | certs DIR | sim TREE.json \
         --subs N [--listen ADDR] [--tls DIR] | herd TREE.json --subs N [--sim ADDR] \
         [--poll-interval-ms MS] [--poll-slots N] [--churn-permille P] [--cycles N] \
         [--batch N] [--full-polls N] [--tls DIR] [--computed OBJECTS_DIR]; the simulator \
         takes --computed too (any value): its subs then hold the computed files"
    )]
    Usage,
    #[error("computed files: {0}")]
    Computed(String),
    #[error("{0} needs a value")]
    NoValue(String),
    #[error("{flag} {value}: {source}")]
    Number {
        flag: String,
        value: String,
        source: std::num::ParseIntError,
    },
    #[error("{flag} {value}: {source}")]
    TooLarge {
        flag: String,
        value: String,
        source: std::num::TryFromIntError,
    },
    #[error("unknown option {0}")]
    UnknownOption(String),
    #[error("--subs: 1 to 1048576")]
    SubsRange,
    #[error(transparent)]
    Scan(#[from] paddock_subd::scan::ScanError),
    #[error("scan of {}: {stats:?}", dir.display())]
    ScanIncomplete {
        dir: std::path::PathBuf,
        stats: Box<paddock_subd::scan::ScanStats>,
    },
    #[error("{}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Tree {
        path: String,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Ca(#[from] paddock_security::ca::CaError),
    #[error(transparent)]
    Tls(#[from] paddock_security::tls::TlsError),
    #[error(transparent)]
    PollBinary(#[from] poll_binary::BadAnswer),
    #[error("no tree")]
    NoTree,
    #[error("no regular file in the tree")]
    NoRegularFile,
    #[error("the tree does not plan empty: {0:?}")]
    PlansChanges(Box<paddock_dominator::PlanSummary>),
    #[error("the drifted tree plans empty")]
    DriftPlansEmpty,
    #[error("PollResponse's JSON does not start with generation and scan_count")]
    AnswerHead,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error("{url}: {source}")]
    Driver { url: String, source: ureq::Error },
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    #[error("{what}: not done after {} s", limit.as_secs())]
    NotDone { what: String, limit: Duration },
    #[error("the simulator has {got} subs, not {want}")]
    SimulatorSubs { got: u64, want: usize },
}

struct Opts {
    subs: usize,
    listen: String,
    sim: String,
    poll_interval_ms: u64,
    poll_slots: usize,
    churn_permille: u64,
    cycles: usize,
    batch: usize,
    full_polls: usize,
    /// Mutual TLS with the certificates in this directory.
    tls: Option<std::path::PathBuf>,
    /// Every sub has two computed files (the herd's object store in this directory).
    computed: Option<std::path::PathBuf>,
}

impl Opts {
    fn parse(args: &[String]) -> Res<Opts> {
        let mut o = Opts {
            subs: 10_000,
            listen: format!("0.0.0.0:{SUB_PORT}"),
            sim: format!("127.0.0.1:{SUB_PORT}"),
            poll_interval_ms: 100,
            poll_slots: Limits::default().poll_slots,
            churn_permille: 10,
            cycles: 3,
            batch: 500,
            full_polls: 2_000,
            tls: None,
            computed: None,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let v = it.next().ok_or_else(|| BenchError::NoValue(flag.clone()))?;
            let num = || {
                v.parse::<u64>().map_err(|source| BenchError::Number {
                    flag: flag.clone(),
                    value: v.clone(),
                    source,
                })
            };
            let count = || {
                usize::try_from(num()?).map_err(|source| BenchError::TooLarge {
                    flag: flag.clone(),
                    value: v.clone(),
                    source,
                })
            };
            match flag.as_str() {
                "--subs" => o.subs = count()?,
                "--listen" => o.listen = v.clone(),
                "--sim" => o.sim = v.clone(),
                "--poll-interval-ms" => o.poll_interval_ms = num()?,
                "--poll-slots" => o.poll_slots = count()?,
                "--churn-permille" => o.churn_permille = num()?,
                "--cycles" => o.cycles = count()?,
                "--batch" => o.batch = count()?.max(1),
                "--full-polls" => o.full_polls = count()?.max(1),
                "--tls" => o.tls = Some(v.into()),
                "--computed" => o.computed = Some(v.into()),
                _ => return Err(BenchError::UnknownOption(flag.clone())),
            }
        }
        if o.subs == 0 || o.subs > 1 << 20 {
            return Err(BenchError::SubsRange);
        }
        Ok(o)
    }
}

/// Which sub's address `local` is (by number; it may be past the last sub).
fn sub_index(local: SocketAddr) -> Option<usize> {
    let SocketAddr::V4(a) = local else {
        return None;
    };
    let i = u32::from(*a.ip()).checked_sub(u32::from(FIRST_SUB))?;
    usize::try_from(i).ok()
}

/// Sub `i`'s loopback address.
fn hostname(i: usize) -> String {
    format!("sub{i:07}")
}

fn sub_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(FIRST_SUB) + u32::try_from(i).unwrap_or(u32::MAX))
}

fn scan(dir: &Path, out: &Path) -> Res<()> {
    let filter = Filter::empty();
    let mut o = paddock_subd::scan::ScanOptions::new(&filter);
    o.threads = 2;
    let r = paddock_subd::scan::scan(dir, &o)?;
    if !r.stats.complete || !r.stats.errors.is_empty() {
        return Err(BenchError::ScanIncomplete {
            dir: dir.to_path_buf(),
            stats: Box::new(r.stats),
        });
    }
    let json = serde_json::to_vec(&r.scan.fs)?;
    std::fs::write(out, &json).map_err(|source| BenchError::File {
        path: out.to_path_buf(),
        source,
    })?;
    eprintln!(
        "# tree of {}: {} paths, {} inodes, {} bytes of JSON",
        dir.display(),
        r.scan.fs.paths.len(),
        r.scan.fs.inodes.len(),
        json.len()
    );
    Ok(())
}

fn load_tree(path: &str) -> Res<FileSystem> {
    let bytes = std::fs::read(path).map_err(|source| BenchError::File {
        path: path.into(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| BenchError::Tree {
        path: path.to_string(),
        source,
    })
}

/// This process's resident set (VmRSS), KiB.
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's CPU time (user + system), ms (clock ticks of 10 ms).
fn cpu_ms() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // After the name: state(0) … utime(11) stime(12).
    (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) * 10
}

/// The image every sub is kept on: the tree, as a full image.
fn minbase_image(fs: FileSystem) -> Image {
    Image::new(IMAGE, fs, Some(Filter::empty()))
}

/// A full poll's answer, as subd sends it.
fn full_answer(fs: FileSystem) -> Res<Vec<u8>> {
    serde_json::to_vec(&PollResponse {
        free_space: Some(1 << 40),
        file_system_follows: true,
        file_system: Some(fs),
        object_cache: Some(Default::default()),
        ..PollResponse::default()
    })
    .map_err(BenchError::from)
}

fn profile(tree: &str) -> Res<()> {
    const RUNS: usize = 20;
    let image = Arc::new(minbase_image(load_tree(tree)?));
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3 / RUNS as f64;
    let json = full_answer(image.fs.clone())?;
    let empty = Default::default();
    let binary = poll_binary::encode(
        &PollResponse {
            free_space: Some(1 << 40),
            file_system_follows: true,
            ..PollResponse::default()
        },
        Some((&image.fs, &empty)),
    )?;

    let t = Instant::now();
    for _ in 0..RUNS {
        let r: PollResponse = serde_json::from_slice(&json)?;
        std::hint::black_box(r);
    }
    let parse_json = ms(t);
    let (rss0, t) = (rss_kib(), Instant::now());
    let mut held = Vec::new();
    for _ in 0..RUNS {
        held.push(poll_binary::decode(&binary)?);
    }
    let parse = ms(t);
    let per_tree = rss_kib().saturating_sub(rss0) / RUNS as u64;
    let t = Instant::now();
    let prepared = PreparedImage::new(image.clone());
    let prepare = t.elapsed().as_secs_f64() * 1e3;

    let t = Instant::now();
    for r in &held {
        let fs = r.file_system.as_ref().ok_or(BenchError::NoTree)?;
        let c = paddock_dominator::compute(fs, &empty, &prepared, None, Some(1 << 40));
        if !c.summary.empty {
            return Err(BenchError::PlansChanges(Box::new(c.summary)));
        }
    }
    let plan = ms(t);
    // A drifted sub (one file's content changed): the walk fails, the planner plans.
    let mut drifted = image.fs.clone();
    let ino = drifted
        .inodes
        .iter()
        .find(|(_, i)| i.object().is_some())
        .map(|(n, _)| *n)
        .ok_or(BenchError::NoRegularFile)?;
    if let Some(Inode::Regular { object, .. }) = drifted.inodes.get_mut(&ino) {
        *object = Some(ObjectId::of(b"drift"));
    }
    let t = Instant::now();
    for _ in 0..RUNS {
        let c = paddock_dominator::compute(&drifted, &empty, &prepared, None, Some(1 << 40));
        if c.summary.empty {
            return Err(BenchError::DriftPlansEmpty);
        }
    }
    let plan_drifted = ms(t);
    let t = Instant::now();
    drop(held);
    let free = ms(t);
    println!(
        "# a full poll in the herd: decoding {} bytes of binary answer {parse:.1} ms (the \
         same answer as {} bytes of JSON: {parse_json:.1} ms); planning an unchanged sub \
         {plan:.2} ms, a drifted one (the planner) {plan_drifted:.1} ms; freeing the tree \
         {free:.2} ms; a decoded tree holds {per_tree} KiB; the image prepared once in \
         {prepare:.1} ms",
        binary.len(),
        json.len(),
    );
    Ok(())
}

// --- the simulated fleet --------------------------------------------------------------

#[derive(Default)]
struct SimSub {
    generation: AtomicU64,
    scan_count: AtomicU64,
    polls: AtomicU64,
    /// The generation the caller said it has, at its last poll.
    have: AtomicU64,
}

struct Sim {
    subs: Vec<SimSub>,
    /// The full poll answer's JSON after `{"generation":G,"scan_count":S,`.
    full_tail: Vec<u8>,
    /// The binary answer's tree part ([`poll_binary::encode_scan`]).
    binary_scan: Vec<u8>,
    /// Each sub holds its computed files: its tree is made and encoded per full poll.
    computed: Option<Image>,
    mark: Mutex<Vec<u64>>,
    churn_permille: AtomicU64,
    /// The next sub whose generation moves.
    cursor: AtomicUsize,
    polls: AtomicU64,
    full: AtomicU64,
    others: AtomicU64,
    bad_address: AtomicU64,
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(0);

/// The local address a connection came in on: which sub was called.
#[derive(Clone, Copy, Debug)]
struct Local(SocketAddr);

impl Connected<IncomingStream<'_, TcpListener>> for Local {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        Local(
            stream
                .io()
                .local_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0))),
        )
    }
}

/// What the driver reads of the simulator.
#[derive(Serialize, Deserialize, Debug, Default, Clone, Copy)]
struct Stats {
    subs: u64,
    polls: u64,
    full_polls: u64,
    connections: u64,
    /// Fetch, Update and Cleanup calls (none, while every sub equals the image).
    other_calls: u64,
    bad_address: u64,
    /// Subs polled since the last mark.
    covered: u64,
    /// Subs whose caller has their current generation.
    current: u64,
    cpu_ms: u64,
}

impl Sim {
    fn sub(&self, local: SocketAddr) -> Option<&SimSub> {
        let s = self.subs.get(sub_index(local)?);
        if s.is_none() {
            self.bad_address.fetch_add(1, Ordering::Relaxed);
        }
        s
    }

    fn bump_next(&self) {
        let i = self.cursor.fetch_add(1, Ordering::Relaxed) % self.subs.len();
        self.subs[i].generation.fetch_add(1, Ordering::Relaxed);
    }

    fn stats(&self) -> Stats {
        let mark = self.mark.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = Stats {
            subs: self.subs.len() as u64,
            polls: self.polls.load(Ordering::Relaxed),
            full_polls: self.full.load(Ordering::Relaxed),
            connections: CONNECTIONS.load(Ordering::Relaxed),
            other_calls: self.others.load(Ordering::Relaxed),
            bad_address: self.bad_address.load(Ordering::Relaxed),
            cpu_ms: cpu_ms(),
            ..Stats::default()
        };
        for (s, m) in self.subs.iter().zip(mark.iter()) {
            st.covered += u64::from(s.polls.load(Ordering::Relaxed) > *m);
            st.current +=
                u64::from(s.have.load(Ordering::Relaxed) == s.generation.load(Ordering::Relaxed));
        }
        st
    }
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn sim_poll(
    State(sim): State<Arc<Sim>>,
    ConnectInfo(Local(local)): ConnectInfo<Local>,
    headers: HeaderMap,
    Json(req): Json<PollRequest>,
) -> Response {
    let Some(s) = sim.sub(local) else {
        return (axum::http::StatusCode::NOT_FOUND, "no sub at this address").into_response();
    };
    sim.polls.fetch_add(1, Ordering::Relaxed);
    s.polls.fetch_add(1, Ordering::Relaxed);
    s.have.store(req.have_generation, Ordering::Relaxed);
    let generation = s.generation.load(Ordering::Relaxed);
    let scan_count = s.scan_count.fetch_add(1, Ordering::Relaxed) + 1;
    let full = req.have_generation != generation && !req.short_poll_only;
    if poll_binary::accepted(&headers) {
        let status = PollResponse {
            generation,
            scan_count,
            free_space: Some(1 << 40),
            file_system_follows: full,
            ..PollResponse::default()
        };
        let mut body = poll_binary::encode_status(&status).unwrap_or_default();
        if full {
            sim.full.fetch_add(1, Ordering::Relaxed);
            match (&sim.computed, sub_index(local)) {
                (Some(base), Some(i)) => {
                    let fs = computed::sub_tree(base, i, computed::MOTD);
                    let scan = poll_binary::encode_scan(Some((&fs, &Default::default())));
                    body.extend_from_slice(&scan.unwrap_or_default());
                }
                _ => body.extend_from_slice(&sim.binary_scan),
            }
        } else {
            body.push(0);
        }
        return ([(header::CONTENT_TYPE, POLL_MEDIA_TYPE)], body).into_response();
    }
    if full {
        sim.full.fetch_add(1, Ordering::Relaxed);
        let head = format!("{{\"generation\":{generation},\"scan_count\":{scan_count},");
        let mut body = Vec::with_capacity(head.len() + sim.full_tail.len());
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(&sim.full_tail);
        return json_response(body);
    }
    let r = PollResponse {
        generation,
        scan_count,
        free_space: Some(1 << 40),
        ..PollResponse::default()
    };
    json_response(serde_json::to_vec(&r).unwrap_or_default())
}

async fn sim_fetch(State(sim): State<Arc<Sim>>) -> Json<FetchReply> {
    sim.others.fetch_add(1, Ordering::Relaxed);
    Json(FetchReply::default())
}

async fn sim_update(State(sim): State<Arc<Sim>>) -> Json<UpdateReport> {
    sim.others.fetch_add(1, Ordering::Relaxed);
    Json(UpdateReport::default())
}

async fn sim_cleanup(State(sim): State<Arc<Sim>>) -> Json<CleanupReply> {
    sim.others.fetch_add(1, Ordering::Relaxed);
    Json(CleanupReply::default())
}

async fn sim_stats(State(sim): State<Arc<Sim>>) -> Json<Stats> {
    Json(sim.stats())
}

async fn sim_mark(State(sim): State<Arc<Sim>>) -> Json<Stats> {
    *sim.mark.lock().unwrap_or_else(|p| p.into_inner()) = sim
        .subs
        .iter()
        .map(|s| s.polls.load(Ordering::Relaxed))
        .collect();
    Json(sim.stats())
}

/// Moves the generation of the next `count` subs (in turn).
async fn sim_bump(State(sim): State<Arc<Sim>>, Json(count): Json<u64>) -> Json<Stats> {
    for _ in 0..count {
        sim.bump_next();
    }
    Json(sim.stats())
}

async fn sim_churn(State(sim): State<Arc<Sim>>, Json(permille): Json<u64>) -> Json<Stats> {
    sim.churn_permille.store(permille, Ordering::Relaxed);
    Json(sim.stats())
}

/// Bumps the generation of `churn_permille` ‰ of the subs each second, in turn, in steps
/// of 100 ms.
async fn churn(sim: Arc<Sim>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut owed = 0u64;
    loop {
        tick.tick().await;
        owed += sim.churn_permille.load(Ordering::Relaxed) * sim.subs.len() as u64;
        // Per 100 ms: permille × subs / 1000 / 10.
        while owed >= 10_000 {
            owed -= 10_000;
            sim.bump_next();
        }
    }
}

fn sim(tree: &str, o: Opts) -> Res<()> {
    let fs = load_tree(tree)?;
    let computed = o.computed.as_ref().map(|_| minbase_image(fs.clone()));
    let binary_scan = poll_binary::encode_scan(Some((&fs, &Default::default())))?;
    let template = full_answer(fs)?;
    let head = br#"{"generation":0,"scan_count":0,"#;
    let full_tail = template
        .strip_prefix(head.as_slice())
        .ok_or(BenchError::AnswerHead)?
        .to_vec();
    let sim = Arc::new(Sim {
        subs: (0..o.subs)
            .map(|_| SimSub {
                generation: AtomicU64::new(1),
                scan_count: AtomicU64::new(1),
                ..SimSub::default()
            })
            .collect(),
        full_tail,
        binary_scan,
        computed,
        mark: Mutex::new(vec![0; o.subs]),
        churn_permille: AtomicU64::new(0),
        cursor: AtomicUsize::new(0),
        polls: AtomicU64::new(0),
        full: AtomicU64::new(0),
        others: AtomicU64::new(0),
        bad_address: AtomicU64::new(0),
    });
    let app = axum::Router::new()
        .route("/rpc/Subd.Poll", post(sim_poll))
        .route("/rpc/Subd.Fetch", post(sim_fetch))
        .route("/rpc/Subd.Update", post(sim_update))
        .route("/rpc/Subd.Cleanup", post(sim_cleanup))
        .route("/bench/stats", get(sim_stats))
        .route("/bench/mark", post(sim_mark))
        .route("/bench/bump", post(sim_bump))
        .route("/bench/churn", post(sim_churn))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(sim.clone());
    let configs = match &o.tls {
        Some(dir) => {
            let t = Instant::now();
            let c = tls::servers(dir, o.subs)?;
            eprintln!(
                "# simulator: {} sub certificates issued in {:.1} s",
                o.subs,
                t.elapsed().as_secs_f64()
            );
            Some(Arc::new(c))
        }
        None => None,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&o.listen)
            .await
            .map_err(|source| BenchError::Listen {
                address: o.listen.clone(),
                source,
            })?;
        eprintln!(
            "# simulator: {} subs at {}..{} port {SUB_PORT}, full answer {} bytes binary \
             ({} as JSON)",
            o.subs,
            sub_ip(0),
            sub_ip(o.subs - 1),
            sim.binary_scan.len(),
            sim.full_tail.len()
        );
        tokio::spawn(churn(sim));
        match configs {
            Some(configs) => tls::serve(listener, app, configs, sub_index).await,
            None => axum::serve(listener, app.into_make_service_with_connect_info::<Local>())
                .await
                .map_err(BenchError::from),
        }
    })
}

// --- the driver -----------------------------------------------------------------------

/// The one image, from memory.
struct OneImage(Arc<Image>);

#[async_trait]
impl ImageSource for OneImage {
    async fn image(&self, name: &str) -> Result<Option<Arc<Image>>, RpcError> {
        Ok((name == self.0.name).then(|| self.0.clone()))
    }
}

/// [`HttpSubRpc`], timing its polls.
struct Timed {
    inner: HttpSubRpc,
    polls: AtomicU64,
    poll_us: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Timed {
    fn failed(&self, e: &RpcError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.0.clone());
    }
}

#[async_trait]
impl SubRpc for Timed {
    async fn poll(&self, address: &str, req: PollRequest) -> Result<PollResponse, RpcError> {
        self.inner.poll(address, req).await
    }

    async fn poll_gated(
        &self,
        address: &str,
        req: PollRequest,
        trees: &Arc<Semaphore>,
    ) -> Result<Polled, RpcError> {
        let t = Instant::now();
        let r = self.inner.poll_gated(address, req, trees).await;
        let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.poll_us.fetch_add(us, Ordering::Relaxed);
        if let Err(e) = &r {
            self.failed(e);
        }
        r
    }

    async fn fetch(&self, address: &str, req: FetchRequest) -> Result<FetchReply, RpcError> {
        self.inner.fetch(address, req).await
    }

    async fn update(&self, address: &str, req: UpdateRequest) -> Result<UpdateReport, RpcError> {
        self.inner.update(address, req).await
    }

    async fn cleanup(&self, address: &str, objects: Vec<ObjectId>) -> Result<(), RpcError> {
        self.inner.cleanup(address, objects).await
    }
}

struct Driver {
    agent: ureq::Agent,
    base: String,
}

impl Driver {
    fn call(&self, path: &str, body: Option<serde_json::Value>) -> Res<Stats> {
        let url = format!("{}{path}", self.base);
        let r = match body {
            Some(b) => self.agent.post(&url).send_json(b),
            None => self.agent.get(&url).call(),
        };
        let failed = |source| BenchError::Driver {
            url: url.clone(),
            source,
        };
        let mut resp = r.map_err(failed)?;
        resp.body_mut().read_json().map_err(failed)
    }

    async fn stats(
        self: &Arc<Self>,
        path: &'static str,
        body: Option<serde_json::Value>,
    ) -> Res<Stats> {
        let d = self.clone();
        tokio::task::spawn_blocking(move || d.call(path, body)).await?
    }
}

/// Subs per state in the census.
fn states(census: &Census) -> BTreeMap<String, usize> {
    let c = census.read().unwrap_or_else(|p| p.into_inner());
    let mut m = BTreeMap::new();
    for s in c.values() {
        let k = match &s.state {
            SubState::Synced { .. } => "synced".to_string(),
            other => other.to_string().chars().take(60).collect(),
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

fn synced(census: &Census) -> usize {
    let c = census.read().unwrap_or_else(|p| p.into_inner());
    c.values()
        .filter(|s| matches!(s.state, SubState::Synced { .. }))
        .count()
}

/// Waits (up to `limit`) until `done` holds, checking every 50 ms.
async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> Res<bool>) -> Res<()> {
    let t = Instant::now();
    while !done()? {
        if t.elapsed() > limit {
            return Err(BenchError::NotDone {
                what: what.to_string(),
                limit,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn herd(tree: &str, o: Opts) -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let image = Arc::new(minbase_image(load_tree(tree)?));
    let driver = Arc::new(Driver {
        agent: ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into(),
        base: format!("http://{}", o.sim),
    });
    rt.block_on(async move {
        let n = o.subs;
        let limit = Duration::from_secs(1800);
        let sim0 = driver.stats("/bench/stats", None).await?;
        if sim0.subs != n as u64 {
            return Err(BenchError::SimulatorSubs {
                got: sim0.subs,
                want: n,
            });
        }
        driver.stats("/bench/churn", Some(0.into())).await?;

        let rss0 = rss_kib();
        // With computed files, rendered first: the renderer and the overlays count in the
        // memory per sub.
        let mut renderer = match &o.computed {
            Some(dir) => Some(computed::Renderer::new(n, dir)?),
            None => None,
        };
        let overlays = match &mut renderer {
            Some(r) => {
                let first = r.render(computed::MOTD)?;
                eprintln!(
                    "# computed: {} files of {n} subs rendered in {:.2} s, {} objects written",
                    first.files, first.seconds, first.new_objects
                );
                first.overlays
            }
            None => Vec::new(),
        };
        let specs: Vec<SubSpec> = (0..n)
            .map(|i| SubSpec {
                hostname: hostname(i),
                address: format!("{}:{SUB_PORT}", sub_ip(i)),
                desired: Desired {
                    required_image: Some(IMAGE.into()),
                    computed: overlays.get(i).cloned(),
                    ..Desired::default()
                },
                safety_clearance: 0,
            })
            .collect();
        drop(overlays);
        let rpc = Arc::new(Timed {
            inner: match &o.tls {
                Some(dir) => HttpSubRpc::with_tls(
                    "paddock-dominator-bench",
                    Duration::from_secs(10),
                    tls::client(dir)?,
                ),
                None => HttpSubRpc::new("paddock-dominator-bench", Duration::from_secs(10)),
            },
            polls: AtomicU64::new(0),
            poll_us: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            last_error: Mutex::new(None),
        });
        let census = Census::default();
        let policy = Policy {
            poll_interval_ms: o.poll_interval_ms,
            ..Policy::default()
        };
        let limits = Limits {
            poll_slots: o.poll_slots,
            ..Limits::default()
        };
        let herd = Herd::new(
            rpc.clone(),
            Arc::new(OneImage(image)),
            policy,
            limits,
            census.clone(),
        );
        let (specs_tx, specs_rx) = watch::channel(Vec::new());
        let (stop_tx, stop_rx) = watch::channel(false);
        let epoch = Instant::now();
        let now_ms = move || u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let running = tokio::spawn(herd.run(specs_rx, stop_rx, now_ms));

        // 1. First contact: every sub's tree travels and is planned, `batch` subs at a time
        // (the herd holds every tree it got until planned, and plans queue behind polls:
        // all at once, 10,000 trees would be held together).
        let (t, cpu) = (Instant::now(), cpu_ms());
        let mut added = 0;
        while added < n {
            added = (added + o.batch).min(n);
            specs_tx.send_replace(specs[..added].to_vec());
            until(limit, "the first sync", || Ok(synced(&census) == added)).await?;
        }
        drop(specs);
        let sync_s = t.elapsed().as_secs_f64();
        let s1 = driver.stats("/bench/stats", None).await?;
        eprintln!(
            "# {n} subs: first sync in {sync_s:.1} s, {} full polls ({:.0}/s), herd CPU {} ms, \
             simulator CPU {} ms",
            s1.full_polls - sim0.full_polls,
            (s1.full_polls - sim0.full_polls) as f64 / sync_s,
            cpu_ms() - cpu,
            s1.cpu_ms - sim0.cpu_ms
        );

        // Memory with every sub synced (and short polls running).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss_synced = rss_kib();
        let rss_per_sub = (rss_synced.saturating_sub(rss0)) as f64 / n as f64;
        eprintln!(
            "# RSS before the herd {rss0} KiB, with {n} synced subs {rss_synced} KiB \
             ({rss_per_sub:.1} KiB per sub)"
        );

        // 2. Short polls, with churn: each cycle ends when every sub was polled once.
        driver
            .stats("/bench/churn", Some(o.churn_permille.into()))
            .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut cycles = Vec::new();
        let mut connections = Vec::new();
        for _ in 0..o.cycles {
            let (t, cpu, us, calls) = (
                Instant::now(),
                cpu_ms(),
                rpc.poll_us.load(Ordering::Relaxed),
                rpc.polls.load(Ordering::Relaxed),
            );
            let m = driver
                .stats("/bench/mark", Some(serde_json::Value::Null))
                .await?;
            let d = driver.clone();
            let mut last = m;
            let wait = until(limit, "a short-poll cycle", || {
                last = d.call("/bench/stats", None)?;
                Ok(last.covered == n as u64)
            });
            wait.await?;
            let secs = t.elapsed().as_secs_f64();
            let polls = last.polls - m.polls;
            let calls = rpc.polls.load(Ordering::Relaxed) - calls;
            eprintln!(
                "# short-poll cycle: {secs:.2} s, {polls} polls ({:.0}/s, {} of them full), \
                 {} connections, mean poll {:.1} ms; CPU per poll: herd {:.0} µs, \
                 simulator {:.0} µs",
                polls as f64 / secs,
                last.full_polls - m.full_polls,
                last.connections - m.connections,
                (rpc.poll_us.load(Ordering::Relaxed) - us) as f64 / calls.max(1) as f64 / 1e3,
                (cpu_ms() - cpu) as f64 * 1e3 / polls.max(1) as f64,
                (last.cpu_ms - m.cpu_ms) as f64 * 1e3 / polls.max(1) as f64,
            );
            cycles.push(secs);
            connections.push(last.connections - m.connections);
        }
        let cycle = cycles.iter().sum::<f64>() / cycles.len().max(1) as f64;
        let connections_per_cycle =
            connections.iter().sum::<u64>() as f64 / connections.len().max(1) as f64;

        // 3. Generations move, `batch` subs at a time, until `full_polls` trees travelled:
        // each batch's trees are sent and planned before the next moves.
        driver.stats("/bench/churn", Some(0.into())).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        until(limit, "resync after churn", || Ok(synced(&census) == n)).await?;
        let (t, cpu, us, calls) = (
            Instant::now(),
            cpu_ms(),
            rpc.poll_us.load(Ordering::Relaxed),
            rpc.polls.load(Ordering::Relaxed),
        );
        let b = driver.stats("/bench/stats", None).await?;
        let mut bumped = 0;
        while bumped < o.full_polls {
            let k = o.batch.min(n).min(o.full_polls - bumped);
            bumped += k;
            let before = driver.stats("/bench/bump", Some((k as u64).into())).await?;
            let d = driver.clone();
            until(limit, "the batch's trees sent", || {
                let now = d.call("/bench/stats", None)?;
                Ok(now.full_polls - before.full_polls >= k as u64)
            })
            .await?;
            until(limit, "every sub synced again", || Ok(synced(&census) == n)).await?;
        }
        let secs = t.elapsed().as_secs_f64();
        let last = driver.stats("/bench/stats", None).await?;
        let full = last.full_polls - b.full_polls;
        let full_per_s = full as f64 / secs;
        let calls = rpc.polls.load(Ordering::Relaxed) - calls;
        eprintln!(
            "# generations moved {batch} at a time: {full} full polls and plans in {secs:.2} s \
             ({full_per_s:.0}/s, {} polls in all), mean poll {:.1} ms; CPU per full poll: \
             herd {:.0} µs, simulator {:.0} µs; RSS now {} KiB",
            last.polls - b.polls,
            (rpc.poll_us.load(Ordering::Relaxed) - us) as f64 / calls.max(1) as f64 / 1e3,
            (cpu_ms() - cpu) as f64 * 1e3 / full.max(1) as f64,
            (last.cpu_ms - b.cpu_ms) as f64 * 1e3 / full.max(1) as f64,
            rss_kib(),
            batch = o.batch,
        );
        eprintln!(
            "# poll errors {} (last: {:?}); Fetch/Update/Cleanup calls {}; states {:?}",
            rpc.errors.load(Ordering::Relaxed),
            rpc.last_error.lock().unwrap_or_else(|p| p.into_inner()),
            last.other_calls,
            states(&census)
        );
        let _ = stop_tx.send(true);
        let _ = running.await;
        if let Some(r) = &mut renderer {
            // A variable every file of every host uses changes.
            let again = r.render(computed::MOTD_CHANGED)?;
            eprintln!(
                "# computed: after a change of a variable every file uses, {} files rendered \
                 and {} new objects written in {:.2} s",
                again.files, again.new_objects, again.seconds
            );
            // Its own line only: planning lays each sub's files over a copy of the image's
            // tree, so its full polls are not the plain run's and must not read as them.
            println!(
                "dominator computed subs={n} files={} render_s={:.2} short_poll_cycle_s={cycle:.2} \
                 full_polls_per_s={full_per_s:.0} rss_per_sub_kib={rss_per_sub:.1}",
                again.files, again.seconds
            );
            return Ok(());
        }
        println!(
            "dominator subs={n} tls={} poll_interval_ms={} short_poll_cycle_s={cycle:.2} \
             full_polls_per_s={full_per_s:.0} rss_per_sub_kib={rss_per_sub:.1} \
             connections_per_cycle={connections_per_cycle:.0}",
            if o.tls.is_some() { "on" } else { "off" },
            o.poll_interval_ms,
        );
        Ok(())
    })
}
