//! `fs2objectcache [--threads N] ROOT`: turns the tree at ROOT (not `/`) into an object
//! cache at `ROOT/.subd/objects`, removing everything else (see
//! `paddock_subd::fs2objectcache`). Exits 1 if anything could not be converted.

use std::path::PathBuf;
use std::process::ExitCode;

use paddock_subd::fs2objectcache::convert;

const USAGE: &str = "usage: fs2objectcache [--threads N] ROOT";

fn main() -> ExitCode {
    let mut threads = 2usize;
    let mut root: Option<PathBuf> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" => match it.next().and_then(|v| v.parse().ok()) {
                Some(n) => threads = n,
                None => {
                    eprintln!("--threads needs a number\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            s if s.starts_with('-') || root.is_some() => {
                eprintln!("unexpected argument {s}\n{USAGE}");
                return ExitCode::from(2);
            }
            _ => root = Some(a.into()),
        }
    }
    let Some(root) = root else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let started = std::time::Instant::now();
    let s = match convert(&root, threads) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fs2objectcache: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "fs2objectcache {}: {} files ({} bytes) → {} objects ({} duplicate files), {} extra links, \
         {} empty files, {} symlinks/devices/fifos/sockets, {} directories removed in {:.1} s",
        root.display(),
        s.files,
        s.bytes,
        s.objects,
        s.duplicates,
        s.links,
        s.empty,
        s.others,
        s.dirs,
        started.elapsed().as_secs_f64()
    );
    for p in &s.other_fs {
        println!("left in place (another file system): {}", p.display());
    }
    for e in s.errors.iter().take(20) {
        eprintln!("error: {e}");
    }
    if s.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("fs2objectcache: {} errors", s.errors.len());
        ExitCode::FAILURE
    }
}
