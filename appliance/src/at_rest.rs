//! Secrets at rest. The data directory holds the store (the CA's key, the agent-token key,
//! token digests) and this host's key: it is created for its owner alone, an existing one
//! is brought down to that, and a private key that others may read stops the appliance
//! from starting (a key someone else could already have copied is not fixed by a chmod).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, bail};

/// The data directory's mode.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` (and its parents) with mode 0700, or brings an existing one down to it.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .with_context(|| format!("creating data_dir {}", dir.display()))?;
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            dir = %dir.display(),
            mode = format!("{:o}", mode & 0o777),
            "data_dir was open to other users; set to 0700"
        );
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
            .with_context(|| format!("chmod 700 {}", dir.display()))?;
    }
    Ok(())
}

/// Refuses a private key file that its group or other users may read or write.
pub fn check_key(path: &Path) -> anyhow::Result<()> {
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} is a private key with mode {:o}: other users may have read it. Make a new \
             key (`paddock certs init` again for this host's) or, if you are sure nobody \
             did, `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_data_dir_is_its_owners_alone() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/data");
        private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
    }

    #[test]
    fn a_key_others_may_read_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let k = t.path().join("host.key");
        std::fs::write(&k, "key").unwrap();
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = check_key(&k).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        check_key(&k).unwrap();
        assert!(check_key(&t.path().join("absent")).is_err());
    }
}
