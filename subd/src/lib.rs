//! subd: the agent on every provisioned machine.
//!
//! - [`scan`]: one pass over a root → the tree ([`paddock_image::FileSystem`]) and the
//!   object-cache listing. Every regular file is re-hashed on every pass (no mtime shortcut).
//! - [`ratelimit`]: the pure limiter (media reads counted in 512-byte blocks from
//!   `getrusage(RUSAGE_THREAD).ru_inblock`, so page-cache hits are free; a CPU share) and the
//!   shared [`ratelimit::Throttle`] the scan threads pace themselves with.
//! - [`fsbench`]: the device under the root, its O_DIRECT read speed, cached once per boot.
//! - [`scanner`]: the loop: scan, compare, bump the generation only on a difference, publish;
//!   first scan unthrottled, then nice 15 and the configured limits; pause for updates.
//! - [`fs2objectcache`]: turn an old root into a verified object cache (`.subd/objects`).
//! - [`update`]: the Update applier (an [`paddock_image::UpdateRequest`] against a root and
//!   its object cache), with the change window timed.
//! - [`triggers`]: which services an update stops, starts, reloads or reboots for (pure), and
//!   the command runner for triggers and the health check.
//! - [`lock`]: the client lock (pure, capped at 15 s).
//! - [`fetch`]: objects from an image server into the cache, at a share of the link.
//! - [`service`]: Poll, Fetch, Update, Cleanup, GetFiles, configuration: the operations,
//!   their mutual exclusion, the scanner pauses, recovery at start.
//! - [`rpc`]: the HTTP routes (`/rpc/Subd.*`).
//! - [`bind_root`]: the root seen without what is mounted on it (a private bind mount), so
//!   `/proc`, `/run` … are the root file system's own directories on a running machine.

pub mod bind_root;
pub mod fetch;
pub mod fs2objectcache;
pub mod fsbench;
pub mod lock;
pub mod ratelimit;
pub mod rpc;
pub mod scan;
pub mod scanner;
pub mod service;
pub mod triggers;
pub mod update;
pub mod vouch;

pub use ratelimit::{Limiter, Limits, Throttle, Usage};
pub use scan::{Scan, ScanOptions, ScanResult, ScanStats, default_exclusions, scan};
pub use scanner::{Generations, Scanner, ScannerConfig, ScannerHandle};
pub use service::{Configuration, Subd, SubdConfig};
