//! Scans a root once, as subd's scanner does, and prints what it cost (bench/scan.sh).
//!
//! ```text
//! paddock-subd-scan [options] ROOT
//!   --threads N         hashing threads (default 2 unthrottled, 1 throttled)
//!   --io-percent P      limit media reads to P % of the device speed
//!   --device-speed B    the device speed in bytes/s (default: measured, cached per boot)
//!   --fsbench-dir DIR   where the measured speed is cached (default /run/paddock-subd/fsbench)
//!   --cpu-percent P     limit CPU to P % of one CPU
//!   --max-seconds S     stop after S seconds; the rates are over what was read
//!   --exclude REGEX     a scan exclusion (repeatable; start-anchored)
//!   --default-exclusions  add Dominator's default exclusions (/tmp/.*, /var/log/.*, ...)
//!   --measure-device    only measure the device under ROOT (O_DIRECT, not cached) and exit;
//!                       prints `fsbench source=… bytes_per_s=… blocks_per_s=… MB/s=…`
//! ```
//! Prints `scan files=… bytes=… objects=… seconds=… MB/s=… media_bytes=… media_MB/s=…
//! [target_MB/s=…] complete=… unstable=… errors=…`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use paddock_image::Filter;
use paddock_subd::fsbench::{self, DeviceSpeed};
use paddock_subd::ratelimit::{IoMeasure, Limits, Throttle};
use paddock_subd::scan::{self, ScanOptions};

const USAGE: &str = "usage: paddock-subd-scan [--threads N] [--io-percent P] [--device-speed B] \
[--fsbench-dir DIR] [--cpu-percent P] [--max-seconds S] [--exclude REGEX]... [--default-exclusions] \
[--measure-device] ROOT";

#[derive(Default)]
struct Args {
    root: Option<PathBuf>,
    threads: Option<usize>,
    io_percent: Option<f64>,
    device_speed: Option<u64>,
    fsbench_dir: Option<PathBuf>,
    cpu_percent: Option<f64>,
    max_seconds: Option<f64>,
    exclude: Vec<String>,
    default_exclusions: bool,
    measure_device: bool,
}

fn parse() -> Result<Args> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--threads" => a.threads = Some(val("--threads")?.parse()?),
            "--io-percent" => a.io_percent = Some(val("--io-percent")?.parse()?),
            "--device-speed" => a.device_speed = Some(val("--device-speed")?.parse()?),
            "--fsbench-dir" => a.fsbench_dir = Some(val("--fsbench-dir")?.into()),
            "--cpu-percent" => a.cpu_percent = Some(val("--cpu-percent")?.parse()?),
            "--max-seconds" => a.max_seconds = Some(val("--max-seconds")?.parse()?),
            "--exclude" => a.exclude.push(val("--exclude")?),
            "--default-exclusions" => a.default_exclusions = true,
            "--measure-device" => a.measure_device = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with('-') => bail!("unknown option {s}\n{USAGE}"),
            _ if a.root.is_some() => bail!("one ROOT only\n{USAGE}"),
            _ => a.root = Some(arg.into()),
        }
    }
    Ok(a)
}

fn mb(bytes: f64, secs: f64) -> f64 {
    bytes / 1e6 / secs.max(1e-9)
}

fn run() -> Result<()> {
    let a = parse()?;
    let root = a.root.clone().context(USAGE)?;
    if a.measure_device {
        let (s, source) = fsbench::measure_root(&root, fsbench::MAX_BYTES)
            .context("measuring the device speed")?;
        println!(
            "fsbench source={source} bytes_per_s={} blocks_per_s={} MB/s={:.1}",
            s.bytes_per_sec,
            s.blocks_per_sec,
            s.bytes_per_sec as f64 / 1e6
        );
        return Ok(());
    }
    let mut lines = a.exclude.clone();
    if a.default_exclusions {
        lines.extend(scan::DEFAULT_EXCLUSIONS.iter().map(|s| s.to_string()));
    }
    let exclusions = Filter::from_lines(lines)?;

    let device = match (a.io_percent, a.device_speed) {
        (None, _) => None,
        (Some(_), Some(b)) => Some(DeviceSpeed {
            bytes_per_sec: b,
            blocks_per_sec: b / 512,
        }),
        (Some(_), None) => {
            let dir = a
                .fsbench_dir
                .clone()
                .unwrap_or_else(|| fsbench::DEFAULT_CACHE_DIR.into());
            Some(fsbench::read_speed(&root, &dir).context("measuring the device speed")?)
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limits = Limits {
        io_bytes_per_sec: device
            .zip(a.io_percent)
            .and_then(|(d, p)| Limits::io_percent(d.bytes_per_sec, p)),
        cpu_share: a.cpu_percent.and_then(|p| Limits::cpu_percent(p, cpus)),
    };
    let throttle = Throttle::new(limits, device.map_or(IoMeasure::Blocks, |d| d.io_measure()));
    let mut opts = ScanOptions::new(&exclusions);
    opts.threads = a
        .threads
        .unwrap_or(if limits.is_unlimited() { 2 } else { 1 });
    opts.throttle = Some(&throttle);
    opts.deadline = a
        .max_seconds
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let r = scan::scan(&root, &opts)?;
    let st = &r.stats;
    let secs = st.elapsed.as_secs_f64();
    let target = limits
        .io_bytes_per_sec
        .map(|t| format!(" target_MB/s={:.2}", t / 1e6))
        .unwrap_or_default();
    println!(
        "scan files={} bytes={} objects={} seconds={:.3} MB/s={:.1} media_bytes={} media_MB/s={:.2}{} \
         cpu_s={:.3} slept_s={:.3} complete={} unstable={} errors={}",
        st.files,
        st.bytes,
        r.scan.objects.len(),
        secs,
        mb(st.bytes as f64, secs),
        st.media_bytes,
        mb(st.media_bytes as f64, secs),
        target,
        st.cpu.as_secs_f64(),
        st.slept.as_secs_f64(),
        st.complete,
        st.unstable.len(),
        st.error_count,
    );
    for e in &st.errors {
        eprintln!("warning: {e}");
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paddock-subd-scan: {e:#}");
            ExitCode::FAILURE
        }
    }
}
