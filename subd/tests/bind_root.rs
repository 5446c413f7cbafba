//! `--bind-root`: on a root with a file system mounted on one of its directories, subd's
//! tree has that directory as the root file system holds it (with what lies under the
//! mount), and nothing of the mounted file system; without it the directory is left out,
//! which on a running machine made `/proc`, `/run` … look missing to every plan. Runs the
//! real binary (a mount namespace is per process); needs root to mount.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paddock_subd::service::PollResponse;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

/// The paths of the tree subd reports for `root` (after its first scan).
fn tree_paths(root: &Path, bind: &str) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paddock-subd"))
        .args(["--insecure", "--listen", "127.0.0.1:0", bind, "--root"])
        .arg(root)
        .args(["--no-default-exclusions", "--min-cycle-ms", "100"])
        .args(["--fsbench-dir"])
        .arg(root.parent().unwrap().join("fsbench"))
        .args(["--device-speed", "1073741824"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("paddock-subd");
    let out = child.stdout.take().unwrap();
    let _running = Running(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("paddock-subd: listening on ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let t = Instant::now();
    loop {
        let r: PollResponse = agent
            .post(&format!("http://{addr}/rpc/Subd.Poll"))
            .send_json(serde_json::json!({"have_generation": 0}))
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
        if let Some(fs) = r.file_system {
            let mut paths: Vec<String> = fs
                .names()
                .into_values()
                .flatten()
                .map(String::from)
                .collect();
            paths.sort();
            return paths;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no scan in 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bind_root_sees_mount_points_as_the_root_file_system_holds_them() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("m")).unwrap();
    std::fs::write(root.join("m/under"), b"on the root file system\n").unwrap();
    std::fs::write(root.join("top"), b"top\n").unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(root.join("m"))
        .status()
        .expect("mount");
    assert!(st.success(), "mounting a tmpfs (run as root)");
    let _unmount = Unmount(&root.join("m"));
    std::fs::write(root.join("m/inner"), b"on the tmpfs\n").unwrap();

    let plain = tree_paths(&root, "--no-bind-root");
    assert!(plain.contains(&"/top".to_string()), "{plain:?}");
    assert!(
        !plain.iter().any(|p| p.starts_with("/m")),
        "without --bind-root the mount point is left out: {plain:?}"
    );

    let bound = tree_paths(&root, "--bind-root");
    assert!(bound.contains(&"/top".to_string()), "{bound:?}");
    assert!(bound.contains(&"/m".to_string()), "{bound:?}");
    assert!(bound.contains(&"/m/under".to_string()), "{bound:?}");
    assert!(
        !bound.contains(&"/m/inner".to_string()),
        "nothing of the mounted file system: {bound:?}"
    );
    // The bind stayed in subd's namespace: the test's view still has the tmpfs.
    assert!(root.join("m/inner").exists() && !root.join("m/under").exists());
}
