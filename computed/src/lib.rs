//! Computed files (Dominator's computed files and `filegen-server`, verwalter's per-node
//! templates), the pure part: what a machine's file is made from, and making it.
//!
//! - [`vars`]: variables merged in verwalter's order, `spec < role < host < host-role`, two
//!   levels deep (a table in both merges its keys; deeper, the later value wins whole).
//! - [`data`]: what a template sees for one machine ([`data::Site::data`]): the machine
//!   (name, UUID, addresses, facts, traits, MDB entry), its roles and instances, every
//!   role's members (the peers), and the merged variables.
//! - [`render`]: strict rendering; an undefined variable is an error naming the template,
//!   the line and the variable, never an empty string.
//! - [`files`]: which files a machine has (its own, and its roles'), what each is made
//!   from (a template, the MDB entry, a program) and their contents.
//! - [`program`]: when a program's output must be made again (inputs changed, or its
//!   validity ran out).
//!
//! No I/O, no clock: the appliance reads the store, the census and the files, and passes
//! the time in.

pub mod data;
pub mod files;
pub mod program;
pub mod render;
pub mod vars;

pub use data::{Machine, Member, Site};
pub use files::{FileDecl, MakeError, RunProgram, Source, files_of, make_host};
pub use program::{Generated, stale};
pub use render::{RenderError, Templates, render};
pub use vars::{HostVars, VarSources, Vars, merge};
