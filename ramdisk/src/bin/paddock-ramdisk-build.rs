//! `paddock-ramdisk-build --agent PATH --out DIR [--cache DIR] [--modules a,b] …`
//!
//! Builds `vmlinuz` and `initrd.img` (reproducibly) with the library's `initramfs::build`, the
//! same function `paddock ramdisk build` will call.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use paddock_ramdisk::initramfs::{self, BuildSpec, KernelSource};

#[derive(Parser, Debug)]
#[command(
    name = "paddock-ramdisk-build",
    version,
    about = "Build the Paddock introspection ramdisk (vmlinuz + initrd.img)"
)]
struct Args {
    /// The static agent binary (becomes /init).
    #[arg(long, env = "PADDOCK_RAMDISK_AGENT")]
    agent: PathBuf,
    /// Output directory for vmlinuz and initrd.img.
    #[arg(long, env = "PADDOCK_RAMDISK_OUT")]
    out: PathBuf,
    /// Where kernel packages are downloaded and extracted.
    #[arg(
        long,
        env = "PADDOCK_RAMDISK_CACHE",
        default_value = "/var/cache/paddock/ramdisk"
    )]
    cache: PathBuf,
    /// Drivers to carry (their dependencies are added). Default: virtio, e1000/e1000e/igb/ixgbe,
    /// ahci, nvme, sd_mod.
    #[arg(long, env = "PADDOCK_RAMDISK_MODULES", value_delimiter = ',')]
    modules: Option<Vec<String>>,
    /// Extra drivers on top of the default set.
    #[arg(long, value_delimiter = ',')]
    add_modules: Vec<String>,
    /// Kernel package (a metapackage is resolved with apt-cache depends).
    #[arg(
        long,
        env = "PADDOCK_RAMDISK_KERNEL_PACKAGE",
        default_value = "linux-image-amd64"
    )]
    kernel_package: String,
    /// Use an already extracted kernel package tree instead of apt.
    #[arg(long, conflicts_with = "kernel_package")]
    kernel_tree: Option<PathBuf>,
    /// A static busybox (Debian busybox-static).
    #[arg(long, env = "PADDOCK_RAMDISK_BUSYBOX", default_value = "/bin/busybox")]
    busybox: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mut spec = BuildSpec::new(&a.agent, &a.out, &a.cache);
    spec.busybox = a.busybox;
    if let Some(m) = a.modules {
        spec.modules = m;
    }
    spec.modules.extend(a.add_modules);
    spec.kernel = match a.kernel_tree {
        Some(t) => KernelSource::Extracted(t),
        None => KernelSource::Apt {
            package: a.kernel_package,
        },
    };
    let built = initramfs::build(&spec).context("building the ramdisk")?;
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    println!("kernel   {}", built.kernel_version);
    println!(
        "vmlinuz  {} ({} bytes)",
        built.vmlinuz.display(),
        size(&built.vmlinuz)
    );
    println!(
        "initrd   {} ({} bytes)",
        built.initrd.display(),
        size(&built.initrd)
    );
    println!(
        "modules  {} (load order): {}",
        built.modules.len(),
        built.modules.join(" ")
    );
    if !built.builtin.is_empty() {
        println!("built in {}", built.builtin.join(" "));
    }
    if built.decompressed_modules {
        println!("note     the package's modules were compressed; they are stored decompressed");
    }
    Ok(())
}
