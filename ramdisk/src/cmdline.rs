//! The kernel command line the appliance's boot script gives the ramdisk.
//!
//! | parameter | meaning |
//! |---|---|
//! | `BOOTIF=01-aa-bb-cc-dd-ee-ff` | the NIC the machine PXE-booted from (pxelinux form; plain MACs accepted) |
//! | `paddock.url=http[s]://host:port[,http[s]://host2:port…]` | the appliance's base URL (required); several hosts of an HA appliance, comma-separated, tried in turn; `https://` needs the two `paddock.ca_*` below |
//! | `paddock.ca_url=http://host:port/boot/ca.pem[,http://host2:port/boot/ca.pem…]` | where the appliance's CA certificate (PEM) is, over plain HTTP: fetched at start when a `paddock.url` is `https://`; several hosts of an HA appliance, comma-separated, tried in turn (any host's copy does: it is checked against the fingerprint) |
//! | `paddock.ca_fingerprint=<64 hex digits>` | the SHA-256 of that CA certificate's DER: a CA that does not match is refused (the agent stops; it never goes on unverified) |
//! | `paddock.token=<agent token>` | sent as `Authorization: Bearer <token>` on every call to the appliance (at most 160 of `a-z`, `0-9`, `.`) |
//! | `paddock.collectors=default[,pci-devices][,lldp]` | collectors to run (`default` when absent) |
//! | `paddock.log=info\|debug` | console verbosity |
//! | `paddock.lldp=1` | listen for LLDP frames on every NIC (also collector `lldp`) |
//! | `paddock.lldp_timeout=<seconds>` | how long to listen (default 10; switches send every 30 s by default) |
//! | `paddock.mode=birth\|rebirth\|clean` | provision instead of inspecting (the boot script of a node in that state); the details come from `provision/next` |
//! | `paddock.bench_tar=http://…/image.tar` | `bench/provision.sh`'s baseline only: lay the disk out as a birth would, stream the tarball onto the new root with busybox `wget -O- \| tar -x`, print the times, power off (no inspection, no report) |

use std::time::Duration;

use paddock_birther::Operation;
use paddock_inventory::normalise_mac;

/// The longest agent token accepted (`paddock_security::token::MAX_TOKEN_BYTES`).
pub const MAX_TOKEN_CHARS: usize = 160;

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
    /// `paddock.ca_url=`: the appliance's CA (PEM), plain `http://`; several hosts'
    /// copies comma-separated.
    pub ca_url: Option<String>,
    /// `paddock.ca_fingerprint=`: the CA certificate's SHA-256, 64 lowercase hex digits.
    pub ca_fingerprint: Option<String>,
    /// `paddock.token=`: the agent token (never printed: [`redacted`]).
    pub token: Option<String>,
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
        ca_url: None,
        ca_fingerprint: None,
        token: None,
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
            "paddock.ca_url" => {
                let mut ok = Vec::new();
                for u in v.split(',').filter(|u| !u.is_empty()) {
                    match crate::http::Url::parse(u) {
                        Ok(parsed) if !parsed.tls => ok.push(u),
                        _ => c.warnings.push(format!(
                            "paddock.ca_url={u} is not an http:// URL (the CA is fetched in the clear and checked by its fingerprint); ignoring it"
                        )),
                    }
                }
                if !ok.is_empty() {
                    c.ca_url = Some(ok.join(","));
                }
            }
            "paddock.ca_fingerprint" => match fingerprint(v) {
                Some(f) => c.ca_fingerprint = Some(f),
                None => c.warnings.push(format!(
                    "paddock.ca_fingerprint={v} is not a SHA-256 (64 hex digits); ignoring it"
                )),
            },
            "paddock.token" => {
                if token_ok(v) {
                    c.token = Some(v.to_string());
                } else {
                    c.warnings.push(format!(
                        "paddock.token is not an agent token (1 to {MAX_TOKEN_CHARS} of a-z, 0-9, '.'); calls go without one"
                    ));
                }
            }
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

/// A SHA-256 fingerprint as 64 lowercase hex digits (any case, `:` separators allowed).
pub fn fingerprint(v: &str) -> Option<String> {
    let f: String = v
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    (f.len() == 64 && f.chars().all(|c| c.is_ascii_hexdigit())).then_some(f)
}

/// Whether `v` can be an agent token (what the appliance mints: `pa1.<mac>.<ms>.<nonce>.<tag>`).
pub fn token_ok(v: &str) -> bool {
    (1..=MAX_TOKEN_CHARS).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.')
}

/// The command line with the agent token's value hidden (for the console).
pub fn redacted(line: &str) -> String {
    const KEY: &str = "paddock.token=";
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find(KEY) {
        let start = i + KEY.len();
        out.push_str(&rest[..start]);
        out.push_str("<redacted>");
        let end = rest[start..]
            .find(char::is_whitespace)
            .map_or(rest.len(), |e| start + e);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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

    #[test]
    fn tls_parameters() {
        let fp = "ab".repeat(32);
        let token =
            "pa1.525400123456.1764000000000.0102030405060708.".to_string() + &"c".repeat(64);
        let p = parse(&format!(
            "paddock.url=https://198.18.0.1:8443,https://198.18.0.2:8443 \
             paddock.ca_url=http://198.18.0.1:8080/boot/ca.pem paddock.ca_fingerprint={fp} \
             paddock.token={token}"
        ));
        assert_eq!(
            p.url.as_deref(),
            Some("https://198.18.0.1:8443,https://198.18.0.2:8443")
        );
        assert_eq!(
            p.ca_url.as_deref(),
            Some("http://198.18.0.1:8080/boot/ca.pem")
        );
        assert_eq!(p.ca_fingerprint.as_deref(), Some(fp.as_str()));
        assert_eq!(p.token.as_deref(), Some(token.as_str()));
        assert_eq!((p.errors.len(), p.warnings.len()), (0, 0), "{p:?}");
        // Upper case and colons (openssl's form) are the same fingerprint.
        let colons = fp
            .to_uppercase()
            .as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(
            parse(&format!("paddock.ca_fingerprint={colons}")).ca_fingerprint,
            Some(fp.clone())
        );
        // Insecure appliances pass none of them.
        let p = parse("paddock.url=http://198.18.0.1:8080");
        assert_eq!((p.ca_url, p.ca_fingerprint, p.token), (None, None, None));
        // Bad values are ignored with a warning each (the start then refuses TLS without them).
        for bad in [
            "paddock.ca_url=https://198.18.0.1:8443/boot/ca.pem",
            "paddock.ca_url=ftp://x/ca.pem",
            "paddock.ca_fingerprint=abcd",
            &format!("paddock.ca_fingerprint={}", "g".repeat(64)),
            "paddock.token=",
            "paddock.token=PA1.X",
            "paddock.token=a/b",
            &format!("paddock.token={}", "a".repeat(161)),
        ] {
            let p = parse(bad);
            assert_eq!(
                (p.ca_url, p.ca_fingerprint, p.token, p.warnings.len()),
                (None, None, None, 1),
                "{bad}"
            );
        }
        assert!(token_ok(&"a".repeat(160)));
    }

    #[test]
    fn the_token_is_never_shown() {
        assert_eq!(
            redacted("a paddock.token=pa1.x.y b paddock.url=http://p paddock.token=z"),
            "a paddock.token=<redacted> b paddock.url=http://p paddock.token=<redacted>"
        );
        assert_eq!(redacted("paddock.token=secret"), "paddock.token=<redacted>");
        assert_eq!(redacted("no token\n"), "no token\n");
    }
}
