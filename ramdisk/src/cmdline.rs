//! The kernel command line the appliance's boot script gives the ramdisk.
//!
//! | parameter | meaning |
//! |---|---|
//! | `BOOTIF=01-aa-bb-cc-dd-ee-ff` | the NIC the machine PXE-booted from (pxelinux form; plain MACs accepted) |
//! | `paddock.url=http://host:port[,http://host2:port…]` | the appliance's base URL (required); several hosts of an HA appliance, comma-separated, tried in turn |
//! | `paddock.collectors=default[,pci-devices][,lldp]` | collectors to run (`default` when absent) |
//! | `paddock.log=info\|debug` | console verbosity |
//! | `paddock.lldp=1` | listen for LLDP frames on every NIC (also collector `lldp`) |
//! | `paddock.lldp_timeout=<seconds>` | how long to listen (default 10; switches send every 30 s by default) |
//! | `paddock.mode=birth\|rebirth\|clean` | provision instead of inspecting (the boot script of a node in that state); the details come from `provision/next` |
//! | `paddock.bench_tar=http://…/image.tar` | `bench/provision.sh`'s baseline only: lay the disk out as a birth would, stream the tarball onto the new root with busybox `wget -O- \| tar -x`, print the times, power off (no inspection, no report) |

use std::time::Duration;

use paddock_birther::Operation;
use paddock_inventory::normalise_mac;

/// Collectors the agent knows.
pub const KNOWN_COLLECTORS: &[&str] = &["default", "pci-devices", "lldp"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Info,
    Debug,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmdline {
    /// BOOTIF as given (posted as `boot_interface`).
    pub bootif_raw: Option<String>,
    /// BOOTIF as a MAC, `aa:bb:cc:dd:ee:ff`.
    pub boot_mac: Option<String>,
    pub url: Option<String>,
    /// As asked for (posted as `configuration.collectors`).
    pub collectors: Vec<String>,
    pub log: LogLevel,
    pub lldp: bool,
    pub lldp_timeout: Duration,
    /// `paddock.mode=`: a provisioning run instead of an inspection.
    pub mode: Option<Operation>,
    /// `paddock.bench_tar=`: the provisioning bench's baseline run instead of anything else.
    pub bench_tar: Option<String>,
    /// Problems that make the introspection fail (posted in `error`): unknown collectors.
    pub errors: Vec<String>,
    /// Problems only worth a console line.
    pub warnings: Vec<String>,
}

/// Splits a command line into words, honouring double quotes (`a="b c"`); stops at `--`.
pub fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    if cur == "--" {
                        return out;
                    }
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any && cur != "--" {
        out.push(cur);
    }
    out
}

pub fn parse(s: &str) -> Cmdline {
    let mut c = Cmdline {
        bootif_raw: None,
        boot_mac: None,
        url: None,
        collectors: vec!["default".into()],
        log: LogLevel::Info,
        lldp: false,
        lldp_timeout: Duration::from_secs(10),
        mode: None,
        bench_tar: None,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    for w in words(s) {
        let Some((k, v)) = w.split_once('=') else {
            continue;
        };
        match k {
            "BOOTIF" => match normalise_mac(v) {
                Some(mac) => {
                    c.bootif_raw = Some(v.to_string());
                    c.boot_mac = Some(mac);
                }
                None => c
                    .warnings
                    .push(format!("BOOTIF={v} is not a MAC; trying every NIC")),
            },
            "paddock.url" => c.url = Some(v.trim_end_matches('/').to_string()),
            "paddock.collectors" => {
                c.collectors = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                for name in &c.collectors {
                    if !KNOWN_COLLECTORS.contains(&name.as_str()) {
                        c.errors.push(format!(
                            "unknown collector '{name}' in paddock.collectors (known: {})",
                            KNOWN_COLLECTORS.join(", ")
                        ));
                    }
                }
                if c.collectors.iter().any(|n| n == "lldp") {
                    c.lldp = true;
                }
            }
            "paddock.log" => match v {
                "info" => c.log = LogLevel::Info,
                "debug" => c.log = LogLevel::Debug,
                _ => c.warnings.push(format!(
                    "paddock.log={v} is neither info nor debug; using info"
                )),
            },
            "paddock.lldp" => c.lldp = matches!(v, "1" | "true" | "yes" | "on"),
            "paddock.lldp_timeout" => match v.parse::<u64>() {
                Ok(s) if (1..=300).contains(&s) => c.lldp_timeout = Duration::from_secs(s),
                _ => c.warnings.push(format!(
                    "paddock.lldp_timeout={v} is not 1..300 seconds; using 10"
                )),
            },
            "paddock.bench_tar" => match v {
                u if u.starts_with("http://") && u.len() > "http://".len() => {
                    c.bench_tar = Some(u.to_string())
                }
                _ => c.warnings.push(format!(
                    "paddock.bench_tar={v} is not an http:// URL; ignoring it"
                )),
            },
            "paddock.mode" => match crate::provision::parse_mode(v) {
                Some(m) => c.mode = Some(m),
                None => c.warnings.push(format!(
                    "paddock.mode={v} is not birth, rebirth or clean; inspecting instead"
                )),
            },
            _ => {}
        }
    }
    c
}

impl Cmdline {
    pub fn wants(&self, collector: &str) -> bool {
        self.collectors.iter().any(|c| c == collector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_honour_quotes_and_dashdash() {
        let cases: &[(&str, &[&str])] = &[
            ("a b  c\n", &["a", "b", "c"]),
            (r#"x="1 2" y=3"#, &["x=1 2", "y=3"]),
            ("a -- b", &["a"]),
            ("", &[]),
        ];
        for (s, want) in cases {
            assert_eq!(words(s), *want, "{s}");
        }
    }

    #[test]
    fn parse_table() {
        struct Case {
            line: &'static str,
            mac: Option<&'static str>,
            url: Option<&'static str>,
            collectors: &'static [&'static str],
            log: LogLevel,
            lldp: bool,
            errors: usize,
            warnings: usize,
        }
        let cases = [
            Case {
                line: "BOOT_IMAGE=/vmlinuz initrd=initrd BOOTIF=01-52-54-00-12-34-56 paddock.url=http://198.18.0.1:8080 console=ttyS0",
                mac: Some("52:54:00:12:34:56"),
                url: Some("http://198.18.0.1:8080"),
                collectors: &["default"],
                log: LogLevel::Info,
                lldp: false,
                errors: 0,
                warnings: 0,
            },
            Case {
                line: "BOOTIF=52:54:00:AB:00:01 paddock.url=http://p/ paddock.log=debug paddock.collectors=default,pci-devices,lldp",
                mac: Some("52:54:00:ab:00:01"),
                url: Some("http://p"),
                collectors: &["default", "pci-devices", "lldp"],
                log: LogLevel::Debug,
                lldp: true,
                errors: 0,
                warnings: 0,
            },
            Case {
                line: "BOOTIF=nonsense paddock.collectors=default,logs,extra-hardware paddock.log=loud paddock.lldp=1 paddock.lldp_timeout=0",
                mac: None,
                url: None,
                collectors: &["default", "logs", "extra-hardware"],
                log: LogLevel::Info,
                lldp: true,
                errors: 2,
                warnings: 3,
            },
        ];
        for c in cases {
            let p = parse(c.line);
            assert_eq!(p.boot_mac.as_deref(), c.mac, "{}", c.line);
            assert_eq!(p.url.as_deref(), c.url, "{}", c.line);
            assert_eq!(p.collectors, c.collectors, "{}", c.line);
            assert_eq!(p.log, c.log, "{}", c.line);
            assert_eq!(p.lldp, c.lldp, "{}", c.line);
            assert_eq!(p.errors.len(), c.errors, "{}: {:?}", c.line, p.errors);
            assert_eq!(p.warnings.len(), c.warnings, "{}: {:?}", c.line, p.warnings);
        }
        let p = parse("paddock.collectors=default,bogus");
        assert_eq!(
            p.errors,
            vec![
                "unknown collector 'bogus' in paddock.collectors (known: default, pci-devices, lldp)"
            ]
        );
        assert_eq!(parse("paddock.mode=birth").mode, Some(Operation::Birth));
        assert_eq!(
            parse("paddock.bench_tar=http://198.18.0.1:8080/boot/assets/a.tar").bench_tar,
            Some("http://198.18.0.1:8080/boot/assets/a.tar".into())
        );
        let p = parse("paddock.bench_tar=ftp://x/a.tar");
        assert_eq!((p.bench_tar, p.warnings.len()), (None, 1));
        assert_eq!(parse("paddock.mode=rebirth").mode, Some(Operation::Rebirth));
        assert_eq!(parse("paddock.mode=clean").mode, Some(Operation::Clean));
        let p = parse("paddock.mode=healthy");
        assert_eq!(p.mode, None);
        assert_eq!(p.warnings.len(), 1);
        assert_eq!(parse("").mode, None);
        assert_eq!(
            parse("BOOTIF=01-52-54-00-12-34-56").bootif_raw.as_deref(),
            Some("01-52-54-00-12-34-56")
        );
    }
}
