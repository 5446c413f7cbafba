//! Running a busybox applet (`ip`, `udhcpc`) and saying why it failed.

use std::process::Command;

use crate::provision::shell::BUSYBOX;

/// A busybox applet that could not run or failed.
#[derive(Debug, thiserror::Error)]
pub enum BusyboxError {
    #[error("cannot run {BUSYBOX} {args}: {source}")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`busybox {args}` {status}")]
    Failed {
        args: String,
        status: std::process::ExitStatus,
    },
}

/// Runs `busybox ARGS…`; an error unless it exits 0.
pub fn busybox(args: &[&str]) -> Result<(), BusyboxError> {
    let status = Command::new(BUSYBOX)
        .args(args)
        .status()
        .map_err(|source| BusyboxError::Spawn {
            args: args.join(" "),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(BusyboxError::Failed {
            args: args.join(" "),
            status,
        })
    }
}
