//! `paddock`: the appliance (`paddock serve`) and its command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use paddock::config::{FileConfig, Overrides, defaults};
use paddock::serve;

#[derive(Parser)]
#[command(
    name = "paddock",
    version,
    about = "Bare-metal provisioning appliance: PXE, inspection, images"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Certificates and tokens: the CA, this host's certificate, operators' identities.
    Certs {
        /// The TOML configuration file (the store and `[security]` it names); before or
        /// after the subcommand (`paddock certs init --config FILE`). Default:
        /// /etc/paddock/paddock.toml when it exists.
        #[arg(long, short, env = "PADDOCK_CONFIG", global = true)]
        config: Option<PathBuf>,
        #[command(flatten)]
        overrides: Box<Overrides>,
        #[command(subcommand)]
        cmd: paddock::certs_cli::CertsCmd,
    },
    /// The audit log: who called which mutating method on what, when, with what result.
    Audit {
        #[command(flatten)]
        api: Api,
        /// The newest N entries.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Write a working /etc/paddock/paddock.toml for this host's provisioning interface
    /// (subnet, pool, router, DNS zone: derived from the interface, or given), then run
    /// `certs init`. Asks only when several interfaces qualify and a terminal is attached.
    Init(paddock::init_cli::InitArgs),
    /// Write a consistent backup (the store with the CA, nodes, leases, images' index, rules
    /// and spec; this host's certificates; the image objects; the configuration file) into
    /// one tar file, while the appliance serves.
    Backup {
        /// The backup file to write (written whole or not at all).
        file: PathBuf,
        /// The TOML configuration file (where the store and directories are; copied too).
        /// Default: /etc/paddock/paddock.toml when it exists.
        #[arg(long, short, env = "PADDOCK_CONFIG")]
        config: Option<PathBuf>,
        /// Leave the image objects out (the backup names their directory instead).
        #[arg(long)]
        no_objects: bool,
        #[command(flatten)]
        overrides: Box<Overrides>,
    },
    /// Restore a backup onto a fresh data directory (or an empty etcd cluster), with the
    /// appliance stopped. A configuration file that already exists is kept, and the backup's
    /// copy is written beside it as `<file>.from-backup`; the package's untouched default is
    /// replaced (on a new host, restore before `paddock init`).
    Restore {
        file: PathBuf,
        /// The configuration file to fill (default: /etc/paddock/paddock.toml when it exists).
        #[arg(long, short, env = "PADDOCK_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        overrides: Box<Overrides>,
    },
    /// Run the appliance: DHCP, TFTP, HTTP boot and the API.
    Serve {
        /// The TOML configuration file.
        #[arg(long, short, env = "PADDOCK_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        overrides: Box<Overrides>,
    },
    /// Work with configuration files.
    Config {
        #[command(subcommand)]
        cmd: ConfigCmd,
    },
    /// The discovery ramdisk.
    Ramdisk {
        #[command(subcommand)]
        cmd: RamdiskCmd,
    },
    /// The PXE filter of a running appliance.
    Firewall {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: FirewallCmd,
    },
    /// The role spec: check files, preview the plan, apply, show, the rounds.
    Spec {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: paddock::roles_cli::SpecCmd,
    },
    /// The census of role instances and hosts (registrations kept alive by leases).
    Census {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: Option<paddock::roles_cli::CensusCmd>,
    },
    /// What the appliance's DNS server serves: the zones, a machine's or instance's names,
    /// the secondaries.
    Dns {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: paddock::dns_cli::DnsCmd,
    },
    /// Image roles' rolling updates: status, promote, pause, resume, revert, history.
    Rollout {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: paddock::rollouts_cli::RolloutCmd,
    },
    /// Nodes of a running appliance.
    Node {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// Images on a running appliance's image server.
    Image {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// The MDB (machines and the images they must run) of a running appliance.
    Mdb {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: MdbCmd,
    },
    /// The subs (provisioned machines) the dominator keeps on their images.
    Sub {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: SubCmd,
    },
    /// The dominator of a running appliance: its state, pause and resume.
    Dominator {
        #[command(flatten)]
        api: Api,
        #[command(subcommand)]
        cmd: DominatorCmd,
    },
}

#[derive(Subcommand)]
enum SubCmd {
    /// Every sub with its address, state and failures (the leader's census).
    List,
    /// One sub: its state with the reason, the image it must run.
    Show { hostname: String },
    /// Hold this sub's updates (kept in the store; any host may be asked).
    Pause {
        hostname: String,
        /// Why, for whoever reads the state (one line).
        #[arg(long)]
        reason: String,
    },
    /// Let this sub's updates go ahead again.
    Resume { hostname: String },
    /// Let an update held as unsafe go ahead, once.
    ClearSafety { hostname: String },
    /// Put this sub on another image (its RequiredImage in the MDB); picked up at once.
    Update {
        hostname: String,
        /// The image it must run (it must exist).
        #[arg(long)]
        image: String,
    },
    /// Its computed files: each one's source, object and age, or why it cannot be made.
    Files { hostname: String },
}

#[derive(Subcommand)]
enum DominatorCmd {
    /// Enabled, leading, paused, and the subs per state.
    Status,
    /// Hold every update of every sub.
    Pause {
        /// Why, for whoever reads the state (one line).
        #[arg(long)]
        reason: String,
    },
    /// Let updates go ahead again.
    Resume,
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Add an image from a tarball (tar, tar.gz or tar.zst), with a progress bar and a summary.
    Add {
        /// The image name, e.g. debian/minbase.1 (never reusable once deleted).
        name: String,
        tarball: PathBuf,
        /// A filter file (Dominator's: one start-anchored regex per line). Without one the
        /// image is sparse: it never deletes files it does not name.
        #[arg(long)]
        filter: Option<PathBuf>,
        /// A trigger file (Dominator's JSON).
        #[arg(long)]
        triggers: Option<PathBuf>,
        /// Remove the image after this many seconds.
        #[arg(long)]
        expires_in: Option<i64>,
    },
    /// Every image.
    List,
    /// One image: sizes, objects shared with other images, filter, triggers.
    Show { name: String },
    /// Delete an image (its name is retired).
    Delete { name: String },
    /// Delete the objects no image uses.
    Gc,
    /// Re-read every object of an image and report damaged or missing ones.
    Check { name: String },
}

#[derive(Subcommand)]
enum MdbCmd {
    /// Every machine with where it came from (file, API, inspector).
    List,
    /// Add or replace a machine.
    Set {
        hostname: String,
        #[arg(long)]
        ip: Option<String>,
        #[arg(long)]
        required_image: Option<String>,
        #[arg(long)]
        planned_image: Option<String>,
        #[arg(long)]
        disable_updates: bool,
    },
    /// Remove a machine.
    Delete { hostname: String },
}

/// Where a running appliance's API is.
#[derive(clap::Args)]
struct Api {
    /// The appliance's API base URL (HTTPS unless it runs insecure). Default: the one this
    /// host's configuration serves (`[security] public_url`), else https://127.0.0.1:8443.
    #[arg(long = "api", env = "PADDOCK_API", global = true)]
    url: Option<String>,
    /// This host's appliance configuration, where the API's address and certificates are
    /// taken from when not given (default: /etc/paddock/paddock.toml when it exists).
    #[arg(long, short, env = "PADDOCK_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// The CA certificate the appliance's is checked against (default: the local
    /// appliance's, `<data_dir>/certs/ca.pem`).
    #[arg(long, env = "PADDOCK_CA", global = true)]
    ca: Option<PathBuf>,
    /// A client certificate (default: the local appliance's `<data_dir>/certs/admin.pem`
    /// when it exists and no token is given).
    #[arg(long, env = "PADDOCK_CERT", global = true)]
    cert: Option<PathBuf>,
    /// The client certificate's key (default: the certificate's name with .key).
    #[arg(long, env = "PADDOCK_KEY", global = true)]
    key: Option<PathBuf>,
    /// An operator token (`paddock certs token`), sent as a bearer token.
    #[arg(long, env = "PADDOCK_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
}

impl Api {
    /// The client of the appliance these flags name, with their credentials.
    fn connect(&self) -> anyhow::Result<paddock::cli::Client> {
        // This host's configuration is read only for what the flags leave out; with the
        // address given, one that does not load only leaves the certificates' default.
        let local = match &self.url {
            None => local_api(self.config.clone())?,
            Some(url) if !url.starts_with("https://") => LocalApi::fallback(),
            Some(_) if self.ca.is_some() && (self.cert.is_some() || self.token.is_some()) => {
                LocalApi::fallback()
            }
            Some(_) => local_api(self.config.clone()).unwrap_or_else(|_| LocalApi::fallback()),
        };
        let url = self.url.clone().unwrap_or(local.url);
        let mut creds = paddock::cli::Credentials {
            token: self.token.clone(),
            ..Default::default()
        };
        if url.starts_with("https://") {
            let ca = self
                .ca
                .clone()
                .unwrap_or_else(|| local.certs.join("ca.pem"));
            creds.ca_pem = Some(std::fs::read_to_string(&ca).map_err(|e| {
                anyhow::anyhow!("{}: {e} (give --ca, or PADDOCK_CA)", ca.display())
            })?);
            let cert = self.cert.clone().or_else(|| {
                let d = local.certs.join("admin.pem");
                (self.token.is_none() && d.exists()).then_some(d)
            });
            if let Some(c) = cert {
                let k = self.key.clone().unwrap_or_else(|| c.with_extension("key"));
                let read = |p: &PathBuf| {
                    std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
                };
                creds.identity = Some((read(&c)?, read(&k)?));
            }
        }
        paddock::cli::client(&url, &creds)
    }
}

/// The configuration file a command reads: the one given, else this host's when it exists
/// (`None`: the built-in defaults).
fn config_path(given: Option<PathBuf>) -> Option<PathBuf> {
    given.or_else(|| {
        let host = PathBuf::from(paddock::init_cli::CONFIG);
        host.is_file().then_some(host)
    })
}

/// The API this host's appliance serves and the directory of its certificates.
struct LocalApi {
    url: String,
    certs: PathBuf,
}

impl LocalApi {
    /// With no configuration file: the packaged appliance's defaults.
    fn fallback() -> Self {
        LocalApi {
            url: "https://127.0.0.1:8443".into(),
            certs: PathBuf::from(defaults::DATA_DIR).join(defaults::SECURITY_SUBDIR),
        }
    }
}

/// The local appliance's API, from its configuration file (see [`config_path`]): its HTTPS
/// address and certificates with TLS on, its HTTP address with TLS off.
fn local_api(config: Option<PathBuf>) -> anyhow::Result<LocalApi> {
    let Some(path) = config_path(config) else {
        return Ok(LocalApi::fallback());
    };
    let cfg = FileConfig::load(&path)
        .and_then(FileConfig::validate)
        .map_err(|e| {
            anyhow::anyhow!(
                "{} (this host's configuration, read for the API's address): {} (fix it, or give --api)",
                path.display(),
                e.problems.join("; ")
            )
        })?;
    Ok(LocalApi {
        url: cfg.api_url().to_string(),
        certs: cfg.certs_dir(),
    })
}

#[derive(Subcommand)]
enum RamdiskCmd {
    /// Build the discovery ramdisk (vmlinuz + initrd.img) from Debian's linux-image-amd64, the
    /// static agent and busybox; the same inputs give the same bytes.
    Build {
        /// The static agent binary (`scripts/build-ramdisk.sh` builds it), which becomes /init.
        #[arg(long)]
        agent: PathBuf,
        /// Output directory for vmlinuz and initrd.img.
        #[arg(long)]
        out: PathBuf,
        /// Where kernel packages are downloaded and extracted.
        #[arg(long, default_value = "/var/cache/paddock/ramdisk")]
        cache: PathBuf,
        /// Extra drivers to carry, on top of the default set (virtio, e1000/e1000e, igb, ixgbe, ahci, nvme).
        #[arg(long, value_delimiter = ',')]
        add_modules: Vec<String>,
        /// A static busybox.
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
    },
}

#[derive(Subcommand)]
enum FirewallCmd {
    /// The sets, the pass rule, the last sync and the drift repaired.
    Status,
}

#[derive(Subcommand)]
// Parsed once per run: the size of `Set` costs nothing.
#[allow(clippy::large_enum_variant)]
enum NodeCmd {
    /// Every node with its state and scheduling properties.
    List,
    /// One node (UUID or name) with its timeline.
    Show { node: String },
    /// Start an introspection: the node boots the discovery ramdisk at its next PXE boot.
    Inspect { node: String },
    /// Abort a running introspection.
    Abort { node: String },
    /// Install an image on a node that has none: it boots the ramdisk in birth mode (or, if
    /// it is being inspected, goes on to birth in the same boot).
    Provision {
        node: String,
        #[arg(long)]
        image: String,
    },
    /// Re-install a provisioned node, reusing what its disk holds: another image, or the
    /// one it has.
    Reimage {
        node: String,
        #[arg(long)]
        image: Option<String>,
    },
    /// Wipe the node's disk (partition table and signatures) and return it to idle.
    Clean { node: String },
    /// Power through the node's BMC (driver_info redfish_* or ipmi_*): on, off, cycle
    /// (reset, or on when off) or status. Power-ons wait for the appliance's throttle.
    Power {
        node: String,
        #[arg(value_parser = ["on", "off", "cycle", "status"])]
        action: String,
    },
    /// Set node attributes, as `baremetal node set` does (one PATCH, Ironic's semantics).
    Set {
        node: String,
        #[arg(long)]
        name: Option<String>,
        /// Ironic's hardware type (`ipmi`, `redfish`, …).
        #[arg(long)]
        driver: Option<String>,
        #[arg(long)]
        resource_class: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// The BMC address lookup uses.
        #[arg(long)]
        bmc_address: Option<String>,
        /// `KEY=VALUE` (the value as JSON when it reads as JSON); repeatable.
        #[arg(long = "property", value_name = "KEY=VALUE")]
        properties: Vec<String>,
        #[arg(long = "extra", value_name = "KEY=VALUE")]
        extra: Vec<String>,
        /// BMC settings (`ipmi_address`, `redfish_password`, …) and other driver settings.
        #[arg(long = "driver-info", value_name = "KEY=VALUE")]
        driver_info: Vec<String>,
        #[arg(long = "instance-info", value_name = "KEY=VALUE")]
        instance_info: Vec<String>,
        /// With --driver: forget the node's `*_interface`s.
        #[arg(long)]
        reset_interfaces: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Validate a configuration file and explain every problem found, with the flags and
    /// `PADDOCK_*` variables `serve` would lay over it.
    Check {
        file: PathBuf,
        #[command(flatten)]
        overrides: Box<Overrides>,
    },
}

/// The file (or none) with the flags and environment laid over it, validated; every problem
/// is printed and the exit code returned.
fn load_config(
    config: Option<&std::path::Path>,
    overrides: &Overrides,
) -> Result<paddock::config::Config, ExitCode> {
    let file = match config {
        Some(path) => FileConfig::load(path),
        None => Ok(FileConfig::default()),
    };
    file.and_then(|mut f| {
        f.apply(overrides);
        f.validate()
    })
    .map_err(|e| {
        match config {
            Some(path) => eprintln!("paddock: invalid configuration in {}", path.display()),
            None => eprintln!(
                "paddock: invalid configuration (no --config given: the built-in defaults)"
            ),
        }
        for p in e.problems {
            eprintln!("  - {p}");
        }
        ExitCode::from(2)
    })
}

fn report(res: anyhow::Result<()>) -> ExitCode {
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paddock: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Config {
            cmd: ConfigCmd::Check { file, overrides },
        } => config_check(&file, &overrides),
        Cmd::Ramdisk { cmd } => report(ramdisk(cmd)),
        // A key and request made on an operator's own machine: no appliance, no configuration.
        Cmd::Certs {
            cmd: paddock::certs_cli::CertsCmd::Request { name, out },
            ..
        } => report(paddock::certs_cli::request(&name, &out)),
        Cmd::Certs {
            config,
            overrides,
            cmd,
        } => match load_config(config_path(config).as_deref(), &overrides) {
            Ok(cfg) => report(block_on(paddock::certs_cli::run(&cfg, cmd))),
            Err(code) => code,
        },
        Cmd::Init(args) => report(block_on(paddock::init_cli::run(&args))),
        Cmd::Backup {
            file,
            config,
            no_objects,
            overrides,
        } => {
            let config = config_path(config);
            match load_config(config.as_deref(), &overrides) {
                Ok(cfg) => report(block_on(backup(&cfg, &file, config, !no_objects))),
                Err(code) => code,
            }
        }
        Cmd::Restore {
            file,
            config,
            overrides,
        } => {
            let config = config_path(config);
            match restore_config(config.as_deref(), &file, &overrides) {
                Ok((cfg, replace)) => report(block_on(restore(&cfg, &file, config, replace))),
                Err(code) => code,
            }
        }
        Cmd::Serve { config, overrides } => match load_config(config.as_deref(), &overrides) {
            Ok(cfg) => {
                serve::init_logging(cfg.log_format);
                let res = block_on(serve::run(cfg));
                if let Err(e) = &res {
                    tracing::error!("{e:#}");
                }
                report(res)
            }
            Err(code) => code,
        },
        // `spec check` reads files only: no appliance, no credentials.
        Cmd::Spec {
            cmd: paddock::roles_cli::SpecCmd::Check { files },
            ..
        } => report(paddock::roles_cli::spec_check(&files)),
        Cmd::Spec { api, cmd } => report(api.connect().and_then(|c| spec(&c, cmd))),
        Cmd::Census { api, cmd } => report(api.connect().and_then(|c| census(&c, cmd))),
        Cmd::Dns { api, cmd } => report(api.connect().and_then(|c| paddock::dns_cli::dns(&c, cmd))),
        Cmd::Rollout { api, cmd } => report(
            api.connect()
                .and_then(|c| paddock::rollouts_cli::rollout(&c, cmd)),
        ),
        Cmd::Audit { api, limit, json } => report(
            api.connect()
                .and_then(|c| paddock::cli::audit(&c, limit, json).map_err(Into::into)),
        ),
        Cmd::Firewall {
            api,
            cmd: FirewallCmd::Status,
        } => report(
            api.connect()
                .and_then(|c| paddock::cli::firewall_status(&c)),
        ),
        Cmd::Image { api, cmd } => report(api.connect().and_then(|c| image(&c, cmd))),
        Cmd::Mdb { api, cmd } => report(api.connect().and_then(|c| mdb(&c, cmd))),
        Cmd::Sub { api, cmd } => report(api.connect().and_then(|c| sub(&c, cmd))),
        Cmd::Dominator { api, cmd } => report(api.connect().and_then(|c| dominator(&c, cmd))),
        Cmd::Node { api, cmd } => report(api.connect().and_then(|c| node(&c, cmd))),
    }
}

/// Runs `f` on a fresh runtime (commands that talk to the store or serve).
fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Runtime::new()
        .map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))?
        .block_on(f)
}

async fn backup(
    cfg: &paddock::config::Config,
    file: &std::path::Path,
    config: Option<PathBuf>,
    with_objects: bool,
) -> anyhow::Result<()> {
    use paddock::backup::StoreSource;
    // A single host's SQLite file is read beside the serving process; etcd through a client.
    let store = match &cfg.cluster {
        None => StoreSource::Sqlite(cfg.data_dir.join("store.db")),
        Some(c) => StoreSource::Open(paddock::cluster::open_store(&cfg.data_dir, Some(c)).await?),
    };
    let w = paddock::backup::write(file, cfg.backup_sources(store, config, with_objects)).await?;
    let m = &w.manifest;
    println!(
        "{}: {} keys at revision {}, {} files, {} bytes",
        file.display(),
        m.keys,
        m.revision,
        w.files,
        w.bytes
    );
    if !m.objects {
        println!(
            "image objects not included: they stay in {:?}",
            m.objects_dir
        );
    }
    Ok(())
}

/// The configuration a restore fills: the one at `config`, or, when that is only the
/// package's untouched default (which the backup's replaces), the backup's own: its data
/// directory, certificates, images and cluster are where the restored appliance will look.
fn restore_config(
    config: Option<&std::path::Path>,
    file: &std::path::Path,
    overrides: &Overrides,
) -> Result<(paddock::config::Config, bool), ExitCode> {
    let replace = config.is_some_and(paddock::init_cli::is_packaged_default);
    let backed_up = if replace {
        match paddock::backup::config_in(file) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("paddock: {e:#}");
                return Err(ExitCode::FAILURE);
            }
        }
    } else {
        None
    };
    let Some(text) = backed_up else {
        return load_config(config, overrides).map(|c| (c, false));
    };
    FileConfig::parse(&text)
        .and_then(|mut f| {
            f.apply(overrides);
            f.validate()
        })
        .map(|c| (c, true))
        .map_err(|e| {
            eprintln!("paddock: the backup's configuration is invalid here");
            for p in e.problems {
                eprintln!("  - {p}");
            }
            ExitCode::from(2)
        })
}

async fn restore(
    cfg: &paddock::config::Config,
    file: &std::path::Path,
    config: Option<PathBuf>,
    replace_config: bool,
) -> anyhow::Result<()> {
    // The appliance must not be serving the store being filled.
    let _lock = paddock::cluster::hold_store_lock(&cfg.data_dir, cfg.cluster.as_ref())?;
    let store = paddock::cluster::open_store(&cfg.data_dir, cfg.cluster.as_ref()).await?;
    let r = paddock::backup::restore(
        file,
        paddock::backup::Targets {
            store,
            certs_dir: cfg.certs_dir(),
            objects_dir: cfg.images.dir.clone(),
            replace_config,
            config_file: config,
        },
    )
    .await?;
    println!(
        "restored {} keys (revision {} of the backup, written by paddock {}), {} certificate files, {} image objects",
        r.keys, r.manifest.revision, r.manifest.paddock, r.certs, r.objects
    );
    if let Some(c) = r.config {
        println!("the backup's configuration: {}", c.display());
    }
    if !r.manifest.objects {
        println!(
            "the backup holds no image objects: copy {:?} from the old host into {}",
            r.manifest.objects_dir,
            cfg.images.dir.display()
        );
    }
    println!("next: paddock serve (or systemctl start paddock)");
    Ok(())
}

fn config_check(file: &std::path::Path, overrides: &Overrides) -> ExitCode {
    let checked = FileConfig::load(file).and_then(|mut f| {
        f.apply(overrides);
        f.validate()
    });
    match checked {
        Ok(c) => {
            println!("{}: ok", file.display());
            print!("{}", paddock::config::summary(&c));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: invalid configuration", file.display());
            for p in e.problems {
                eprintln!("  - {p}");
            }
            ExitCode::from(2)
        }
    }
}

fn ramdisk(cmd: RamdiskCmd) -> anyhow::Result<()> {
    let RamdiskCmd::Build {
        agent,
        out,
        cache,
        add_modules,
        busybox,
    } = cmd;
    let mut spec = paddock_ramdisk::initramfs::BuildSpec::new(&agent, &out, &cache);
    spec.busybox = busybox;
    spec.modules.extend(add_modules);
    let b = paddock_ramdisk::initramfs::build(&spec)
        .map_err(|e| anyhow::anyhow!("building the ramdisk: {e}"))?;
    println!("kernel   {}", b.kernel_version);
    println!("vmlinuz  {}", b.vmlinuz.display());
    println!("initrd   {}", b.initrd.display());
    println!("modules  {}", b.modules.join(" "));
    Ok(())
}

fn image(api: &paddock::cli::Client, cmd: ImageCmd) -> anyhow::Result<()> {
    use paddock::cli;
    match cmd {
        ImageCmd::Add {
            name,
            tarball,
            filter,
            triggers,
            expires_in,
        } => cli::image_add(
            api,
            &cli::ImageAdd {
                name: &name,
                tarball: &tarball,
                filter: filter.as_deref(),
                triggers: triggers.as_deref(),
                expires_in_secs: expires_in,
            },
        ),
        ImageCmd::List => cli::image_list(api),
        ImageCmd::Show { name } => cli::image_show(api, &name),
        ImageCmd::Delete { name } => cli::image_delete(api, &name),
        ImageCmd::Gc => cli::image_gc(api),
        ImageCmd::Check { name } => cli::image_check(api, &name),
    }
}

fn mdb(api: &paddock::cli::Client, cmd: MdbCmd) -> anyhow::Result<()> {
    use paddock::cli;
    match cmd {
        MdbCmd::List => cli::mdb_list(api),
        MdbCmd::Set {
            hostname,
            ip,
            required_image,
            planned_image,
            disable_updates,
        } => cli::mdb_set(
            api,
            &paddock_image::Machine {
                hostname,
                ip_address: ip.unwrap_or_default(),
                required_image: required_image.unwrap_or_default(),
                planned_image: planned_image.unwrap_or_default(),
                disable_updates,
                ..paddock_image::Machine::default()
            },
        ),
        MdbCmd::Delete { hostname } => cli::mdb_delete(api, &hostname),
    }
}

fn sub(api: &paddock::cli::Client, cmd: SubCmd) -> anyhow::Result<()> {
    use paddock::cli;
    match cmd {
        SubCmd::List => cli::sub_list(api),
        SubCmd::Show { hostname } => cli::sub_show(api, &hostname),
        SubCmd::Pause { hostname, reason } => cli::sub_pause(api, &hostname, &reason),
        SubCmd::Resume { hostname } => cli::sub_resume(api, &hostname),
        SubCmd::ClearSafety { hostname } => cli::sub_clear_safety(api, &hostname),
        SubCmd::Update { hostname, image } => cli::sub_update(api, &hostname, &image),
        SubCmd::Files { hostname } => cli::sub_files(api, &hostname),
    }
}

fn dominator(api: &paddock::cli::Client, cmd: DominatorCmd) -> anyhow::Result<()> {
    use paddock::cli;
    match cmd {
        DominatorCmd::Status => cli::dominator_status(api),
        DominatorCmd::Pause { reason } => cli::dominator_pause(api, &reason),
        DominatorCmd::Resume => cli::dominator_resume(api),
    }
}

fn spec(api: &paddock::cli::Client, cmd: paddock::roles_cli::SpecCmd) -> anyhow::Result<()> {
    use paddock::roles_cli::{self as r, SpecCmd};
    match cmd {
        SpecCmd::Check { files } => r::spec_check(&files),
        SpecCmd::Plan { file } => r::spec_plan(api, file.as_deref()),
        SpecCmd::Apply { file } => r::spec_apply(api, &file),
        SpecCmd::Show => r::spec_show(api),
        SpecCmd::Render { host, path, json } => r::spec_render(api, &host, path.as_deref(), json),
        SpecCmd::Rounds {
            limit,
            json,
            shadow,
        } => r::spec_rounds(api, limit, json, shadow),
        SpecCmd::Shadow { cmd } => r::shadow(api, cmd),
        SpecCmd::Replay { at_ms, spec } => r::spec_replay(api, at_ms, spec.as_deref()),
    }
}

fn census(
    api: &paddock::cli::Client,
    cmd: Option<paddock::roles_cli::CensusCmd>,
) -> anyhow::Result<()> {
    use paddock::roles_cli::{self as r, CensusCmd};
    match cmd {
        None => r::census_list(api),
        Some(CensusCmd::Hold {
            url,
            role,
            instance,
            host,
            status,
            metrics,
            metrics_file,
            ttl,
        }) => r::census_hold(
            &url.as_deref().map_or_else(|| api.clone(), |u| api.at(u)),
            paddock::census::Register {
                role,
                instance,
                host,
                status,
                metrics: metrics.into_iter().collect(),
                ttl_secs: Some(ttl),
            },
            metrics_file,
        ),
    }
}

fn node(api: &paddock::cli::Client, cmd: NodeCmd) -> anyhow::Result<()> {
    use paddock::cli;
    match cmd {
        NodeCmd::List => cli::node_list(api),
        NodeCmd::Show { node } => cli::node_show(api, &node),
        NodeCmd::Inspect { node } => cli::node_inspect(api, &node),
        NodeCmd::Abort { node } => cli::node_abort(api, &node),
        NodeCmd::Provision { node, image } => cli::node_provision(api, &node, &image),
        NodeCmd::Reimage { node, image } => cli::node_reimage(api, &node, image.as_deref()),
        NodeCmd::Clean { node } => cli::node_clean(api, &node),
        NodeCmd::Power { node, action } => cli::node_power(api, &node, &action),
        NodeCmd::Set {
            node,
            name,
            driver,
            resource_class,
            description,
            bmc_address,
            properties,
            extra,
            driver_info,
            instance_info,
            reset_interfaces,
        } => cli::node_set(
            api,
            &node,
            &cli::NodeSet {
                name: name.as_deref(),
                driver: driver.as_deref(),
                resource_class: resource_class.as_deref(),
                description: description.as_deref(),
                bmc_address: bmc_address.as_deref(),
                properties: &properties,
                extra: &extra,
                driver_info: &driver_info,
                instance_info: &instance_info,
                reset_interfaces,
            },
        ),
    }
}
