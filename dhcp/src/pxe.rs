//! What a PXE client is told to boot: the numeric client architecture (option 93) picks a
//! file from an IANA table; HTTP-boot architectures get a URL; iPXE gets its per-machine
//! script URL so it does not load itself again (no boot loop).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::MacAddr;

/// Client system architecture, the numeric value of option 93 (IANA "Processor Architecture
/// Types"). Matched by number, never by the `PXEClient:Arch:xxxxx` text of option 60.
pub type Arch = u16;

/// IANA names, for logs and the console.
pub fn arch_name(arch: Arch) -> &'static str {
    match arch {
        0 => "x86 BIOS",
        1 => "NEC/PC98",
        2 => "Itanium",
        3 => "DEC Alpha",
        4 => "Arc x86",
        5 => "Intel Lean Client",
        6 => "x86 UEFI",
        7 => "x64 UEFI",
        8 => "EFI Xscale",
        9 => "x64 UEFI (EBC)",
        10 => "ARM 32-bit UEFI",
        11 => "ARM 64-bit UEFI",
        12 => "PowerPC Open Firmware",
        13 => "PowerPC ePAPR",
        14 => "POWER OPAL v3",
        15 => "x86 UEFI HTTP",
        16 => "x64 UEFI HTTP",
        17 => "EBC UEFI HTTP",
        18 => "ARM 32-bit UEFI HTTP",
        19 => "ARM 64-bit UEFI HTTP",
        20 => "x86 BIOS HTTP",
        21 => "ARM 32-bit U-Boot",
        22 => "ARM 64-bit U-Boot",
        23 => "ARM 32-bit U-Boot HTTP",
        24 => "ARM 64-bit U-Boot HTTP",
        25 => "RISC-V 32-bit UEFI",
        26 => "RISC-V 32-bit UEFI HTTP",
        27 => "RISC-V 64-bit UEFI",
        28 => "RISC-V 64-bit UEFI HTTP",
        29 => "RISC-V 128-bit UEFI",
        30 => "RISC-V 128-bit UEFI HTTP",
        31 => "s390 Basic",
        32 => "s390 Extended",
        33 => "MIPS 32-bit UEFI",
        34 => "MIPS 64-bit UEFI",
        35 => "Sunway 32-bit UEFI",
        36 => "Sunway 64-bit UEFI",
        37 => "LoongArch 32-bit UEFI",
        38 => "LoongArch 32-bit UEFI HTTP",
        39 => "LoongArch 64-bit UEFI",
        40 => "LoongArch 64-bit UEFI HTTP",
        41 => "ARM rpiboot",
        _ => "unassigned",
    }
}

/// Architectures that boot over HTTP (UEFI HTTP Boot and friends): they get a URL.
pub fn is_http_boot(arch: Arch) -> bool {
    matches!(arch, 15..=20 | 23 | 24 | 26 | 28 | 30 | 38 | 40)
}

/// The default boot file per architecture; files for HTTP architectures are served from the
/// HTTP boot assets, the others from the TFTP root. Debian's `ipxe` package ships the x86 ones.
pub fn default_table() -> BTreeMap<Arch, String> {
    [
        (0, "undionly.kpxe"),
        (6, "ipxe-i386.efi"),
        (7, "snponly.efi"),
        (9, "snponly.efi"),
        (10, "ipxe-arm32.efi"),
        (11, "ipxe-arm64.efi"),
        (15, "ipxe-i386.efi"),
        (16, "ipxe.efi"),
        (18, "ipxe-arm32.efi"),
        (19, "ipxe-arm64.efi"),
    ]
    .into_iter()
    .map(|(a, f)| (a, f.to_string()))
    .collect()
}

/// The signed first stage per architecture, for machines that enforce Secure Boot: shim
/// (signed by the UEFI CA that firmware trusts), which loads the signed GRUB beside it
/// (`grubx64.efi`). Debian's `shim-signed` and `grub-efi-amd64-signed` ship them.
pub fn default_signed_table() -> BTreeMap<Arch, String> {
    [(7, "shimx64.efi"), (9, "shimx64.efi")]
        .into_iter()
        .map(|(a, f)| (a, f.to_string()))
        .collect()
}

/// Which machines boot the signed chain (shim → GRUB) instead of iPXE: firmware does not say
/// whether it enforces Secure Boot, so the operator does, by network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Signed {
    #[default]
    Nowhere,
    Everywhere,
    /// Machines whose address is in one of these networks.
    In(Vec<Ipv4Net>),
}

/// Everything the boot decision needs, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootPolicy {
    /// Architecture → boot file name (the default table with the operator's overrides).
    pub table: BTreeMap<Arch, String>,
    /// Base URL of the appliance's HTTP server as machines reach it, without a trailing `/`.
    pub public_url: String,
    /// The TFTP server address to put in siaddr/option 66; `None`: the address the request
    /// arrived on.
    pub tftp_server: Option<Ipv4Addr>,
    /// Architecture → the signed first stage ([`default_signed_table`]).
    pub signed_table: BTreeMap<Arch, String>,
    /// Where machines boot the signed chain.
    pub signed: Signed,
}

/// What the client sent that matters for booting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PxeRequest {
    pub arch: Option<Arch>,
    /// Option 60 starts with `PXEClient`.
    pub pxe_client: bool,
    /// Option 60 starts with `HTTPClient`.
    pub http_client: bool,
    /// Option 77 says `iPXE`, or option 175 (iPXE's encapsulated options) is present.
    pub ipxe: bool,
}

/// What to tell the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootChoice {
    /// A file on the TFTP server: siaddr, `file`, options 66 and 67.
    Tftp { server: Ipv4Addr, file: String },
    /// A URL: `file` and option 67, with option 60 `HTTPClient` for UEFI HTTP boot.
    Http { url: String, http_client: bool },
}

/// Why a PXE client got no boot file (it still gets an address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoBoot {
    NotPxe,
    UnknownArch(Arch),
}

impl BootPolicy {
    pub fn new(public_url: &str, overrides: &BTreeMap<Arch, String>) -> Self {
        let mut table = default_table();
        table.extend(overrides.iter().map(|(a, f)| (*a, f.clone())));
        BootPolicy {
            table,
            public_url: public_url.trim_end_matches('/').to_string(),
            tftp_server: None,
            signed_table: default_signed_table(),
            signed: Signed::Nowhere,
        }
    }

    /// Whether a machine given `addr` boots the signed chain.
    pub fn signs(&self, addr: Ipv4Addr) -> bool {
        match &self.signed {
            Signed::Nowhere => false,
            Signed::Everywhere => true,
            Signed::In(nets) => nets.iter().any(|n| n.contains(&addr)),
        }
    }

    /// URL of a machine's iPXE script.
    pub fn script_url(&self, mac: MacAddr) -> String {
        format!("{}/boot/{}.ipxe", self.public_url, mac)
    }

    /// URL of a boot asset served over HTTP.
    pub fn asset_url(&self, file: &str) -> String {
        format!("{}/boot/assets/{}", self.public_url, file)
    }

    /// `signed`: the machine must boot signed binaries ([`Self::signs`]); architectures
    /// with no signed first stage (BIOS has no Secure Boot) boot as the others.
    pub fn choose(
        &self,
        req: &PxeRequest,
        mac: MacAddr,
        local: Ipv4Addr,
        signed: bool,
    ) -> Result<BootChoice, NoBoot> {
        if req.ipxe {
            return Ok(BootChoice::Http {
                url: self.script_url(mac),
                http_client: req.http_client,
            });
        }
        if !(req.pxe_client || req.http_client || req.arch.is_some()) {
            return Err(NoBoot::NotPxe);
        }
        // A client that says HTTPClient but sends no arch is most likely x64 HTTP boot.
        let arch = req.arch.unwrap_or(if req.http_client { 16 } else { 0 });
        let shim = signed.then(|| self.signed_table.get(&arch)).flatten();
        if let Some(file) = shim
            && !req.http_client
        {
            return Ok(BootChoice::Tftp {
                server: self.tftp_server.unwrap_or(local),
                file: file.clone(),
            });
        }
        let file = self.table.get(&arch).ok_or(NoBoot::UnknownArch(arch))?;
        if is_http_boot(arch) || req.http_client {
            Ok(BootChoice::Http {
                url: self.asset_url(file),
                http_client: true,
            })
        } else {
            Ok(BootChoice::Tftp {
                server: self.tftp_server.unwrap_or(local),
                file: file.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

    fn pxe(arch: Option<Arch>) -> PxeRequest {
        PxeRequest {
            arch,
            pxe_client: true,
            ..PxeRequest::default()
        }
    }

    #[test]
    fn arch_table() {
        let p = BootPolicy::new("http://198.18.0.1:8080/", &BTreeMap::new());
        let tftp = |f: &str| {
            Ok(BootChoice::Tftp {
                server: LOCAL,
                file: f.into(),
            })
        };
        let http = |f: &str| {
            Ok(BootChoice::Http {
                url: format!("http://198.18.0.1:8080/boot/assets/{f}"),
                http_client: true,
            })
        };
        let cases: &[(Option<Arch>, Result<BootChoice, NoBoot>)] = &[
            (Some(0), tftp("undionly.kpxe")),
            (None, tftp("undionly.kpxe")),
            (Some(6), tftp("ipxe-i386.efi")),
            (Some(7), tftp("snponly.efi")),
            (Some(9), tftp("snponly.efi")),
            (Some(10), tftp("ipxe-arm32.efi")),
            (Some(11), tftp("ipxe-arm64.efi")),
            (Some(15), http("ipxe-i386.efi")),
            (Some(16), http("ipxe.efi")),
            (Some(19), http("ipxe-arm64.efi")),
            (Some(2), Err(NoBoot::UnknownArch(2))),
            (Some(4242), Err(NoBoot::UnknownArch(4242))),
        ];
        for (arch, want) in cases {
            assert_eq!(
                &p.choose(&pxe(*arch), MAC, LOCAL, false),
                want,
                "arch {arch:?}"
            );
        }
    }

    #[test]
    fn overrides_win_and_tftp_server_can_be_set() {
        let mut o = BTreeMap::new();
        o.insert(7, "ipxe.efi".to_string());
        o.insert(2, "elilo.efi".to_string());
        let mut p = BootPolicy::new("http://a", &o);
        p.tftp_server = Some(Ipv4Addr::new(198, 18, 0, 9));
        let want = |f: &str| {
            Ok(BootChoice::Tftp {
                server: Ipv4Addr::new(198, 18, 0, 9),
                file: f.into(),
            })
        };
        assert_eq!(p.choose(&pxe(Some(7)), MAC, LOCAL, false), want("ipxe.efi"));
        assert_eq!(
            p.choose(&pxe(Some(2)), MAC, LOCAL, false),
            want("elilo.efi")
        );
    }

    #[test]
    fn machines_that_must_sign_get_shim_where_their_arch_has_one() {
        let mut p = BootPolicy::new("http://198.18.0.1:8080", &BTreeMap::new());
        p.signed = Signed::In(vec!["198.18.0.0/25".parse().unwrap()]);
        assert!(p.signs(Ipv4Addr::new(198, 18, 0, 100)));
        assert!(!p.signs(Ipv4Addr::new(198, 18, 0, 200)));
        let tftp = |f: &str| {
            Ok(BootChoice::Tftp {
                server: LOCAL,
                file: f.into(),
            })
        };
        // x64 UEFI gets shim; BIOS (no Secure Boot) its usual loader; unsigned machines iPXE.
        assert_eq!(
            p.choose(&pxe(Some(7)), MAC, LOCAL, true),
            tftp("shimx64.efi")
        );
        assert_eq!(
            p.choose(&pxe(Some(9)), MAC, LOCAL, true),
            tftp("shimx64.efi")
        );
        assert_eq!(
            p.choose(&pxe(Some(0)), MAC, LOCAL, true),
            tftp("undionly.kpxe")
        );
        assert_eq!(
            p.choose(&pxe(Some(7)), MAC, LOCAL, false),
            tftp("snponly.efi")
        );
        p.signed = Signed::Everywhere;
        assert!(p.signs(Ipv4Addr::new(198, 19, 1, 1)));
        p.signed = Signed::Nowhere;
        assert!(!p.signs(Ipv4Addr::new(198, 18, 0, 100)));
    }

    #[test]
    fn ipxe_gets_its_script_whatever_the_arch() {
        let p = BootPolicy::new("http://198.18.0.1:8080", &BTreeMap::new());
        for arch in [None, Some(0), Some(7), Some(16)] {
            let req = PxeRequest {
                ipxe: true,
                ..pxe(arch)
            };
            assert_eq!(
                p.choose(&req, MAC, LOCAL, false),
                Ok(BootChoice::Http {
                    url: "http://198.18.0.1:8080/boot/52:54:00:00:00:01.ipxe".into(),
                    http_client: false
                })
            );
        }
    }

    #[test]
    fn plain_dhcp_clients_get_no_boot_file() {
        let p = BootPolicy::new("http://a", &BTreeMap::new());
        assert_eq!(
            p.choose(&PxeRequest::default(), MAC, LOCAL, false),
            Err(NoBoot::NotPxe)
        );
    }
}
