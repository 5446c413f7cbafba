//! subd, the agent on every provisioned machine: scans its root, answers Poll, fetches
//! objects, applies updates, runs triggers and the health check (see `paddock_subd::rpc`).
//!
//! ```text
//! paddock-subd --ca FILE --cert FILE --key FILE [options]
//! paddock-subd --insecure [options]
//!   --ca FILE               the CA (PEM) the object servers' certificates must chain to
//!                           (and the callers', unless --client-ca names others)
//!   --client-ca FILE        the CAs (PEM) callers' certificates must chain to: the
//!                           appliance's CA and its subd CA (default: --ca)
//!   --cert FILE             this machine's certificate (PEM): served to callers, and
//!                           presented to object servers (it needs ObjectServer.GetObjects)
//!   --key FILE              its private key (PEM)
//!   --root DIR              the root it keeps in compliance (default /)
//!   --bind-root             work through a private bind mount of the root, so what is
//!                           mounted on it (/proc, /run …) is not in the way (default for /)
//!   --no-bind-root          work on the root as it is
//!   --listen ADDR           host:port (default 0.0.0.0:6969; port 0 picks one)
//!   --insecure              serve plain HTTP, every method open to anyone who reaches
//!                           the port (Dominator's insecure mode; a lab only)
//!   --trigger-command CMD   run as `CMD SERVICE stop|start|reload|restart` (default service)
//!   --reboot-command CMD    after a rebooting update's triggers succeed (default reboot)
//!   --health-command CMD    run after every update; its result is in the next Poll
//!   --command-timeout S     kill a trigger or health command after S seconds (default 300)
//!   --link-speed B          the link in bytes/s (default: /sys/class/net; unknown = unlimited)
//!   --network-percent P     fetch share of the link (default 10)
//!   --scan-percent P        scan media reads after the first scan, % of the device (default 2)
//!   --cpu-percent P         scan CPU after the first scan (default 50)
//!   --device-speed B        the device read speed in bytes/s (default: measured once per boot)
//!   --fsbench-dir DIR       where the measured speed is cached (default /run/paddock-subd/fsbench)
//!   --exclude REGEX         a scan exclusion (repeatable; replaces Dominator's defaults)
//!   --no-default-exclusions scan everything (unless --exclude)
//!   --min-cycle-ms N        shortest scan cycle (default 1000)
//! ```
//! Over TLS a caller must present a certificate from the CA (else the handshake fails) and
//! may call `Subd.<Method>` only if its permitted methods match it (`Subd.*` for a
//! dominator); a denied call is a 403 naming the method and the caller
//! (`paddock_subd::rpc::authorize`). subd refuses to start without all three of `--ca`,
//! `--cert`, `--key` unless `--insecure`, which it then says loudly.
//!
//! Prints `paddock-subd: listening on ADDR` once it serves. Logs go to standard error
//! (`PADDOCK_LOG`, default `info`). `PADDOCK_SUBD_TEST_STEP_DELAY_MS` (tests only) sleeps
//! after each update operation, so a test can kill subd in the middle of an update.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use paddock_subd::triggers::split_command;
use paddock_subd::{Subd, SubdConfig};

const USAGE: &str = "usage: paddock-subd (--ca FILE [--client-ca FILE] --cert FILE --key FILE | --insecure) [--root DIR] [--bind-root|--no-bind-root] [--listen ADDR] \
[--trigger-command CMD] [--reboot-command CMD] [--health-command CMD] [--command-timeout S] \
[--link-speed B] [--network-percent P] [--scan-percent P] [--cpu-percent P] [--device-speed B] \
[--fsbench-dir DIR] [--exclude REGEX]... [--no-default-exclusions] [--min-cycle-ms N]";

const INSECURE: &str = "refusing to start without TLS: pass --ca FILE --cert FILE --key FILE \
(the CA that signs the dominator's certificate, and this machine's certificate and key), or \
--insecure to serve plain HTTP, where anyone who reaches the port can rewrite this machine \
(on a trusted, isolated lab network only)";

const WARNING: &str = "paddock-subd: WARNING: --insecure: serving plain HTTP with every \
method open; anyone who can reach this port can rewrite this machine";

/// How subd is reached.
enum Security {
    /// The CA and our certificate; whom we take calls from (the CA's PEM, or `--client-ca`'s).
    Tls(paddock_security::tls::Material, String),
    Insecure,
}

struct Args {
    config: SubdConfig,
    /// Work through [`paddock_subd::bind_root::private_view`].
    bind_root: bool,
    listen: String,
    security: Security,
}

fn parse() -> Result<Args> {
    let mut root = PathBuf::from("/");
    let mut listen = "0.0.0.0:6969".to_string();
    let mut insecure = false;
    let (mut ca, mut cert, mut key) = (None, None, None);
    let mut client_ca: Option<PathBuf> = None;
    let mut bind_root = None;
    let mut trigger = None;
    let mut reboot = None;
    let mut health = None;
    let mut timeout = None;
    let mut link = None;
    let mut net_pct = None;
    let mut scan_pct = None;
    let mut cpu_pct = None;
    let mut device = None;
    let mut fsbench = None;
    let mut exclude: Vec<String> = Vec::new();
    let mut no_defaults = false;
    let mut min_cycle = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--root" => root = val("--root")?.into(),
            "--listen" => listen = val("--listen")?,
            "--insecure" => insecure = true,
            "--ca" => ca = Some(PathBuf::from(val("--ca")?)),
            "--client-ca" => client_ca = Some(PathBuf::from(val("--client-ca")?)),
            "--cert" => cert = Some(PathBuf::from(val("--cert")?)),
            "--key" => key = Some(PathBuf::from(val("--key")?)),
            "--bind-root" => bind_root = Some(true),
            "--no-bind-root" => bind_root = Some(false),
            "--trigger-command" => trigger = Some(val("--trigger-command")?),
            "--reboot-command" => reboot = Some(val("--reboot-command")?),
            "--health-command" => health = Some(val("--health-command")?),
            "--command-timeout" => timeout = Some(val("--command-timeout")?.parse::<f64>()?),
            "--link-speed" => link = Some(val("--link-speed")?.parse::<u64>()?),
            "--network-percent" => net_pct = Some(val("--network-percent")?.parse::<f64>()?),
            "--scan-percent" => scan_pct = Some(val("--scan-percent")?.parse::<f64>()?),
            "--cpu-percent" => cpu_pct = Some(val("--cpu-percent")?.parse::<f64>()?),
            "--device-speed" => device = Some(val("--device-speed")?.parse::<u64>()?),
            "--fsbench-dir" => fsbench = Some(PathBuf::from(val("--fsbench-dir")?)),
            "--exclude" => exclude.push(val("--exclude")?),
            "--no-default-exclusions" => no_defaults = true,
            "--min-cycle-ms" => min_cycle = Some(val("--min-cycle-ms")?.parse::<u64>()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s => bail!("unknown argument {s}\n{USAGE}"),
        }
    }
    let security = match (ca, cert, key, insecure) {
        (None, None, None, true) => Security::Insecure,
        (None, None, None, false) => bail!("{INSECURE}"),
        (Some(ca), Some(cert), Some(key), false) => {
            let m = paddock_security::tls::Material::read(&ca, &cert, &key)
                .map_err(anyhow::Error::msg)?;
            let clients = match &client_ca {
                Some(p) => std::fs::read_to_string(p)
                    .with_context(|| format!("--client-ca {}", p.display()))?,
                None => m.ca_pem.clone(),
            };
            Security::Tls(m, clients)
        }
        (_, _, _, true) => bail!("--insecure and --ca/--cert/--key exclude each other"),
        _ => bail!("TLS needs all three of --ca, --cert and --key"),
    };
    let bind_root = bind_root.unwrap_or(root == std::path::Path::new("/"));
    let mut c = SubdConfig::new(root);
    if let Some(t) = trigger {
        c.trigger_command = split_command(&t);
        if c.trigger_command.is_empty() {
            bail!("--trigger-command is empty");
        }
    }
    if let Some(r) = reboot {
        c.reboot_command = split_command(&r);
    }
    c.health_command = health.map(|h| split_command(&h)).filter(|h| !h.is_empty());
    if let Some(t) = timeout {
        c.command_timeout = Duration::try_from_secs_f64(t).context("--command-timeout")?;
    }
    c.link_bytes_per_sec = link;
    if let Some(p) = net_pct {
        c.configuration.network_speed_percent = p;
    }
    if let Some(p) = scan_pct {
        c.configuration.scan_speed_percent = p;
    }
    if let Some(p) = cpu_pct {
        c.configuration.cpu_percent = p;
    }
    if !exclude.is_empty() || no_defaults {
        c.configuration.scan_exclusions = exclude;
    }
    c.scanner.device_speed = device;
    if let Some(d) = fsbench {
        c.scanner.fsbench_dir = d;
    }
    if let Some(ms) = min_cycle {
        c.scanner.min_cycle = Duration::from_millis(ms);
    }
    if let Ok(ms) = std::env::var("PADDOCK_SUBD_TEST_STEP_DELAY_MS") {
        c.step_delay =
            Duration::from_millis(ms.parse().context("PADDOCK_SUBD_TEST_STEP_DELAY_MS")?);
    }
    if let Security::Tls(m, _) = &security {
        c.object_tls = Some(
            paddock_security::tls::ureq_tls(&m.ca_pem, Some((&m.cert_pem, &m.key_pem)))
                .map_err(anyhow::Error::msg)?,
        );
    }
    c.configuration.check()?;
    Ok(Args {
        config: c,
        bind_root,
        listen,
        security,
    })
}

fn run() -> Result<()> {
    let mut args = parse()?;
    let tls = match &args.security {
        Security::Tls(m, clients) => Some(
            paddock_security::tls::server_config_for_clients(
                m,
                paddock_security::tls::ClientAuth::Required,
                clients,
            )
            .map_err(anyhow::Error::msg)?,
        ),
        Security::Insecure => {
            eprintln!("{WARNING}");
            None
        }
    };
    // Before any thread: only threads started afterwards share the new mount namespace.
    if args.bind_root {
        let at = std::path::Path::new(paddock_subd::bind_root::DEFAULT_AT);
        args.config.root = paddock_subd::bind_root::private_view(&args.config.root, at)
            .context("--bind-root (pass --no-bind-root to work on the root as it is)")?;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("PADDOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let root = args.config.root.display().to_string();
    let subd = Subd::start(args.config).with_context(|| format!("starting on {root}"))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr()?;
        match tls {
            Some(_) => tracing::info!(%addr, root = %root, "serving over TLS"),
            None => tracing::warn!(%addr, root = %root, "INSECURE: serving plain HTTP, every method open (--insecure)"),
        }
        println!("paddock-subd: listening on {addr}");
        std::io::stdout().flush()?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = paddock_subd::rpc::serve(listener, subd, tls) => r.context("serving")?,
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
            _ = term.recv() => tracing::info!("terminated"),
        }
        anyhow::Ok(())
    })?;
    // Dropping the runtime waits for an update in progress to finish.
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paddock-subd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
