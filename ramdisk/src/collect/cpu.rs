//! CPU: `/proc/cpuinfo` (model, logical CPUs, flags, sockets) and cpufreq for the frequency.

use std::collections::BTreeSet;
use std::path::Path;

use paddock_inventory::Cpu;

use super::{CollectError, read_opt, read_req};

pub fn collect(root: &Path, architecture: &str) -> Result<Cpu, CollectError> {
    let text = read_req(root, "/proc/cpuinfo")?;
    let mut cpu = parse_cpuinfo(&text, architecture).map_err(|why| CollectError::Parse {
        path: "/proc/cpuinfo".into(),
        why: why.to_string(),
    })?;
    // IPA reports the maximum frequency when the kernel knows it (lscpu "CPU max MHz").
    if let Some(khz) = read_opt(
        root,
        "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
    )
    .and_then(|s| s.parse::<u64>().ok())
    {
        cpu.frequency = Some(format!("{}", khz / 1000));
    }
    Ok(cpu)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpuinfoError {
    #[error("no `processor` entries")]
    NoProcessor,
}

/// Parses `/proc/cpuinfo`: `count` is the number of logical CPUs (`processor` entries),
/// `socket_count` the number of distinct `physical id`s (1 when the kernel shows none).
pub fn parse_cpuinfo(text: &str, architecture: &str) -> Result<Cpu, CpuinfoError> {
    let mut count = 0u32;
    let mut model = None;
    let mut mhz = None;
    let mut flags = Vec::new();
    let mut sockets = BTreeSet::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "processor" => count += 1,
            "model name" if model.is_none() => model = Some(v.to_string()),
            "cpu MHz" if mhz.is_none() => mhz = Some(v.to_string()),
            // x86 calls them flags, arm64 features.
            "flags" | "Features" if flags.is_empty() => {
                flags = v.split_whitespace().map(str::to_string).collect()
            }
            "physical id" => {
                sockets.insert(v.to_string());
            }
            _ => {}
        }
    }
    if count == 0 {
        return Err(CpuinfoError::NoProcessor);
    }
    Ok(Cpu {
        model_name: model,
        frequency: mhz,
        count: Some(count),
        architecture: Some(architecture.to_string()),
        flags,
        socket_count: Some(u32::try_from(sockets.len().max(1)).unwrap_or(1)),
        extra: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::fixture;

    const QEMU_2: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: QEMU Virtual CPU version 2.5+\n\
        cpu MHz\t\t: 2495.310\nphysical id\t: 0\nflags\t\t: fpu de pse tsc msr\n\n\
        processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: QEMU Virtual CPU version 2.5+\n\
        cpu MHz\t\t: 2495.310\nphysical id\t: 1\nflags\t\t: fpu de pse tsc msr\n\n";

    #[test]
    fn cpuinfo_table() {
        struct Case {
            text: &'static str,
            count: u32,
            sockets: u32,
            model: Option<&'static str>,
            flags: &'static [&'static str],
        }
        let cases = [
            Case {
                text: QEMU_2,
                count: 2,
                sockets: 2,
                model: Some("QEMU Virtual CPU version 2.5+"),
                flags: &["fpu", "de", "pse", "tsc", "msr"],
            },
            Case {
                // Two cores in one socket.
                text: "processor: 0\nphysical id: 0\nflags: vmx aes\n\nprocessor: 1\nphysical id: 0\nflags: vmx aes\n",
                count: 2,
                sockets: 1,
                model: None,
                flags: &["vmx", "aes"],
            },
            Case {
                // arm64: no model name, no physical id, "Features".
                text: "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n\nprocessor\t: 1\nFeatures\t: fp asimd\n",
                count: 2,
                sockets: 1,
                model: None,
                flags: &["fp", "asimd"],
            },
        ];
        for c in cases {
            let cpu = parse_cpuinfo(c.text, "x86_64").unwrap();
            assert_eq!(cpu.count, Some(c.count), "{}", c.text);
            assert_eq!(cpu.socket_count, Some(c.sockets), "{}", c.text);
            assert_eq!(cpu.model_name.as_deref(), c.model, "{}", c.text);
            assert_eq!(cpu.flags, c.flags, "{}", c.text);
            assert_eq!(cpu.architecture.as_deref(), Some("x86_64"));
        }
        assert_eq!(
            parse_cpuinfo("", "x86_64").unwrap_err().to_string(),
            "no `processor` entries"
        );
    }

    #[test]
    fn frequency_prefers_cpufreq_max() {
        let t = tempfile::tempdir().unwrap();
        fixture::write(t.path(), "/proc/cpuinfo", QEMU_2);
        assert_eq!(
            collect(t.path(), "x86_64").unwrap().frequency.as_deref(),
            Some("2495.310")
        );
        fixture::write(
            t.path(),
            "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
            "3100000\n",
        );
        assert_eq!(
            collect(t.path(), "x86_64").unwrap().frequency.as_deref(),
            Some("3100")
        );
    }
}
