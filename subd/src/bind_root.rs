//! The root without what is mounted on it (Dominator's subd does the same). On a running
//! machine `/proc`, `/sys`, `/dev`, `/run` (and `/boot/efi`, `/tmp` …) are other file
//! systems; the scan never crosses into one, so through `/` itself those directories would
//! look missing and every plan would try to make them. subd therefore works through a
//! non-recursive bind mount of its root, made in a mount namespace of its own: there every
//! mount point is the plain directory of the root file system under it, which is what the
//! image describes and what an update may change, and nobody else sees the bind.
//!
//! Must be called before any thread is started: a mount namespace is per thread, and only
//! threads started after [`private_view`] inherit it.

use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

/// Where the view is made by default (`/run` is a tmpfs, gone at the next boot).
pub const DEFAULT_AT: &str = "/run/paddock-subd/root";

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("a mount namespace of its own (unshare): {0} (subd needs to run as root)")]
    Unshare(nix::Error),
    #[error("making mounts private in subd's namespace: {0}")]
    Private(nix::Error),
    #[error("making {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("binding {0} at {1}: {2}")]
    Bind(PathBuf, PathBuf, nix::Error),
}

/// Enters a new mount namespace (mounts private, so nothing leaks back) and binds `root`,
/// without what is mounted below it, at `at`; returns `at`, the root to work through.
pub fn private_view(root: &Path, at: &Path) -> Result<PathBuf, BindError> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(BindError::Unshare)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(BindError::Private)?;
    std::fs::create_dir_all(at).map_err(|e| BindError::Dir(at.to_path_buf(), e))?;
    mount(Some(root), at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| BindError::Bind(root.to_path_buf(), at.to_path_buf(), e))?;
    Ok(at.to_path_buf())
}
