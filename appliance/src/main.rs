//! `paddock`: the appliance (`paddock serve`) and its command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use paddock::config::{FileConfig, Overrides};
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
    /// Nodes of a running appliance.
    Node {
        /// The appliance's HTTP base URL.
        #[arg(
            long,
            env = "PADDOCK_API",
            default_value = "http://127.0.0.1:8080",
            global = true
        )]
        api: String,
        #[command(subcommand)]
        cmd: NodeCmd,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Every node with its state and scheduling properties.
    List,
    /// One node (UUID or name) with its timeline.
    Show { node: String },
    /// Start an introspection: the node boots the discovery ramdisk at its next PXE boot.
    Inspect { node: String },
    /// Abort a running introspection.
    Abort { node: String },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Validate a configuration file and explain every problem found.
    Check { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Config {
            cmd: ConfigCmd::Check { file },
        } => match FileConfig::load(&file).and_then(FileConfig::validate) {
            Ok(c) => {
                println!("{}: ok", file.display());
                println!("  data_dir   {}", c.data_dir.display());
                println!("  http       {} (public {})", c.http_listen, c.public_url);
                match &c.dhcp {
                    Some(d) => println!(
                        "  dhcp       on {} port {}: {} subnet(s), {} reservation(s)",
                        d.interfaces.join(","),
                        d.port,
                        d.subnets.len(),
                        d.reservations.len()
                    ),
                    None => println!("  dhcp       off"),
                }
                match &c.tftp {
                    Some(t) => println!(
                        "  tftp       {} serving {}",
                        t.listen
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                            .join(","),
                        t.server
                            .roots
                            .iter()
                            .map(|r| r.display().to_string())
                            .collect::<Vec<_>>()
                            .join(":")
                    ),
                    None => println!("  tftp       off"),
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: invalid configuration", file.display());
                for p in e.problems {
                    eprintln!("  - {p}");
                }
                ExitCode::from(2)
            }
        },
        Cmd::Node { api, cmd } => {
            let res = match cmd {
                NodeCmd::List => paddock::cli::node_list(&api),
                NodeCmd::Show { node } => paddock::cli::node_show(&api, &node),
                NodeCmd::Inspect { node } => paddock::cli::node_inspect(&api, &node),
                NodeCmd::Abort { node } => paddock::cli::node_abort(&api, &node),
            };
            match res {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("paddock: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Serve { config, overrides } => {
            let file = match &config {
                Some(path) => FileConfig::load(path),
                None => Ok(FileConfig::default()),
            };
            let validated = file.and_then(|mut f| {
                f.apply(&overrides);
                f.validate()
            });
            let cfg = match validated {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("paddock: invalid configuration");
                    for p in e.problems {
                        eprintln!("  - {p}");
                    }
                    return ExitCode::from(2);
                }
            };
            serve::init_logging(cfg.log_format);
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("paddock: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(serve::run(cfg)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("paddock: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
