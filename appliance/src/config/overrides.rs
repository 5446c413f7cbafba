//! Flags and environment variables, each overriding the file.

use std::path::PathBuf;

use clap::Args;

use super::file::FileConfig;

/// Flags and environment variables; each overrides the file.
#[derive(Debug, Default, Clone, Args)]
pub struct Overrides {
    /// Where the store (leases, nodes) lives.
    #[arg(long, env = "PADDOCK_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Log format: human or json.
    #[arg(long, env = "PADDOCK_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// HTTP listen address (boot scripts, assets, API, console).
    #[arg(long, env = "PADDOCK_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// The HTTP base URL as machines reach it, e.g. http://198.18.0.1:8080.
    #[arg(long, env = "PADDOCK_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Directory served at /boot/assets/ (with Range support).
    #[arg(long, env = "PADDOCK_ASSETS_DIR")]
    pub assets_dir: Option<PathBuf>,
    /// Run the DHCP server.
    #[arg(long, env = "PADDOCK_DHCP_ENABLED")]
    pub dhcp_enabled: Option<bool>,
    /// Interfaces to serve DHCP on, comma-separated.
    #[arg(long, env = "PADDOCK_DHCP_INTERFACES", value_delimiter = ',')]
    pub dhcp_interfaces: Option<Vec<String>>,
    /// UDP port of the DHCP server.
    #[arg(long, env = "PADDOCK_DHCP_PORT")]
    pub dhcp_port: Option<u16>,
    /// Run the TFTP server.
    #[arg(long, env = "PADDOCK_TFTP_ENABLED")]
    pub tftp_enabled: Option<bool>,
    /// TFTP listen addresses (ip:port), comma-separated; one server per address.
    #[arg(long, env = "PADDOCK_TFTP_LISTEN", value_delimiter = ',')]
    pub tftp_listen: Option<Vec<String>>,
    /// TFTP roots, comma-separated, searched in order.
    #[arg(long, env = "PADDOCK_TFTP_ROOTS", value_delimiter = ',')]
    pub tftp_roots: Option<Vec<PathBuf>>,
    /// Most TFTP transfers at once.
    #[arg(long, env = "PADDOCK_TFTP_MAX_TRANSFERS")]
    pub tftp_max_transfers: Option<usize>,
    /// Discovery ramdisk kernel URL.
    #[arg(long, env = "PADDOCK_DISCOVERY_KERNEL")]
    pub discovery_kernel: Option<String>,
    /// Discovery ramdisk initrd URL.
    #[arg(long, env = "PADDOCK_DISCOVERY_INITRD")]
    pub discovery_initrd: Option<String>,
    /// Extra kernel command line for the discovery ramdisk.
    #[arg(long, env = "PADDOCK_DISCOVERY_CMDLINE")]
    pub discovery_cmdline: Option<String>,
    /// Timeline entries kept for every node and every MAC.
    #[arg(long, env = "PADDOCK_TIMELINE_KEEP_PER_SUBJECT")]
    pub timeline_keep_per_subject: Option<usize>,
    /// Also keep every timeline entry of each node's last introspection.
    #[arg(long, env = "PADDOCK_TIMELINE_KEEP_LAST_INTROSPECTION")]
    pub timeline_keep_last_introspection: Option<bool>,
    /// Serve plain HTTP with every method open to anyone (a lab on an isolated network only).
    #[arg(long, env = "PADDOCK_INSECURE")]
    pub insecure: Option<bool>,
    /// Seconds between timeline prunings.
    #[arg(long, env = "PADDOCK_TIMELINE_PRUNE_EVERY_SECS")]
    pub timeline_prune_every_secs: Option<u64>,
}

impl FileConfig {
    /// Lays the flags and environment over the file.
    pub fn apply(&mut self, o: &Overrides) {
        override_with(&mut self.data_dir, &o.data_dir);
        override_with(&mut self.log_format, &o.log_format);
        override_with(&mut self.http.listen, &o.http_listen);
        override_with(&mut self.http.public_url, &o.public_url);
        override_with(&mut self.http.assets_dir, &o.assets_dir);
        override_with(&mut self.security.insecure, &o.insecure);
        override_with(&mut self.dhcp.enabled, &o.dhcp_enabled);
        override_with(&mut self.dhcp.port, &o.dhcp_port);
        override_with(&mut self.tftp.enabled, &o.tftp_enabled);
        override_with(&mut self.tftp.max_transfers, &o.tftp_max_transfers);
        override_with(&mut self.boot.discovery.kernel, &o.discovery_kernel);
        override_with(&mut self.boot.discovery.initrd, &o.discovery_initrd);
        override_with(&mut self.boot.discovery.cmdline, &o.discovery_cmdline);
        override_with(
            &mut self.timeline.keep_per_subject,
            &o.timeline_keep_per_subject,
        );
        override_with(
            &mut self.timeline.keep_last_introspection,
            &o.timeline_keep_last_introspection,
        );
        override_with(
            &mut self.timeline.prune_every_secs,
            &o.timeline_prune_every_secs,
        );
        if let Some(v) = &o.dhcp_interfaces {
            self.dhcp.interfaces = v.clone();
        }
        if let Some(v) = &o.tftp_listen {
            self.tftp.listen = v.clone();
        }
        if let Some(v) = &o.tftp_roots {
            self.tftp.root = None;
            self.tftp.roots = v.clone();
        }
    }
}

fn override_with<T: Clone>(dst: &mut Option<T>, src: &Option<T>) {
    if src.is_some() {
        dst.clone_from(src);
    }
}
