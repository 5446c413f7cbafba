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
    /// Host programs for birth, rebirth and clean, carried with their libraries (names are
    /// looked up in /usr/sbin, /usr/bin, /sbin, /bin). Default: sfdisk, wipefs, blkid,
    /// blkdiscard, mkfs.ext4, mkfs.fat.
    #[arg(long, env = "PADDOCK_RAMDISK_TOOLS", value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Carry no host programs (an inspection-only ramdisk).
    #[arg(long, conflicts_with = "tools")]
    no_tools: bool,
    /// Static programs carried as /bin/<name> (repeatable): paddock-subd and fs2objectcache
    /// for birth and rebirth.
    #[arg(long = "program")]
    programs: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mut spec = BuildSpec::new(&a.agent, &a.out, &a.cache);
    spec.busybox = a.busybox;
    if let Some(m) = a.modules {
        spec.modules = m;
    }
    spec.modules.extend(a.add_modules);
    if !a.no_tools {
        let names = a.tools.unwrap_or_else(|| {
            initramfs::DEFAULT_TOOLS
                .iter()
                .map(|s| s.to_string())
                .collect()
        });
        for n in names.iter().filter(|n| !n.is_empty()) {
            let path = initramfs::find_tool(n).with_context(|| {
                format!(
                    "tool {n} is not installed (scripts/install-deps.sh installs fdisk, util-linux, e2fsprogs and dosfstools)"
                )
            })?;
            spec.tools.push(path);
        }
    }
    spec.programs = a.programs;
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
    if !spec.tools.is_empty() || !spec.programs.is_empty() {
        let names = |v: &[PathBuf]| {
            v.iter()
                .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!("tools    {} (with their libraries)", names(&spec.tools));
        println!("programs {}", names(&spec.programs));
    }
    if built.decompressed_modules {
        println!("note     the package's modules were compressed; they are stored decompressed");
    }
    Ok(())
}
