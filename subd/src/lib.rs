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

pub mod fs2objectcache;
pub mod fsbench;
pub mod ratelimit;
pub mod scan;
pub mod scanner;

pub use ratelimit::{Limiter, Limits, Throttle, Usage};
pub use scan::{Scan, ScanOptions, ScanResult, ScanStats, default_exclusions, scan};
pub use scanner::{Generations, Scanner, ScannerConfig, ScannerHandle};
