//! The image model (pure: no I/O beyond what callers pass in).
//!
//! - [`tree`]: a file-system tree as Dominator models it: an inode table (directories,
//!   regular files with their SHA-512 object, symlinks, devices, fifos) and the paths that
//!   name each inode (several paths on one inode = hard links).
//! - [`object`]: object ids (SHA-512 of the content) and the cache layout `xx/yy/<rest>`.
//! - [`filter`]: Dominator's filter files (one start-anchored regex per line, `!` inverts).
//! - [`triggers`]: Dominator's trigger files (JSON, comment lines allowed).
//! - [`plan`]: the update planner: `plan(sub tree, sub object cache, image) → UpdateRequest`.
//! - [`image`]: an image (tree + filter + triggers + metadata) and the MDB format.

pub mod filter;
pub mod image;
pub mod object;
pub mod plan;
pub mod tree;
pub mod triggers;

pub use filter::Filter;
pub use image::{BadName, Image, Machine, Mdb, check_logical_name};
pub use object::{ObjectHasher, ObjectId};
pub use plan::{UpdateRequest, plan};
pub use tree::{FileSystem, Inode, Mtime, SpecialKind};
pub use triggers::{Trigger, Triggers};
