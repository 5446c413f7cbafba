//! A machine's page, the parts an operator reads first: hardware cards from its inventory
//! (CPU, memory, each disk with the root-disk choice, each NIC with speed, address and the
//! switch port LLDP named, the BMC), and the progress of the run under way (the step of its
//! steps, and during the sync the bytes fetched of the plan's total, the rate and the time
//! left). Pure: the records and the time come in, markup goes out.

use maud::{Markup, html};
use paddock_birther::{Operation, Provisioning, State as Prov, Step};
use paddock_dominator::{FetchProgress, SubStatus};
use paddock_inspector::node::Node;
use paddock_inventory::{Interface, IntrospectionData};

use crate::console_style::bytes;

/// The run under way on a machine, as far as its records say.
#[derive(Clone, Debug, PartialEq)]
pub struct RunProgress {
    pub operation: Operation,
    pub image: Option<String>,
    /// Steps done, of `steps`.
    pub done: usize,
    pub steps: usize,
    /// The step under way (none once all are done).
    pub current: Option<Step>,
    /// Whether the machine has booted the ramdisk for this run yet.
    pub started: bool,
    /// The fetch of the sync step, when one runs.
    pub fetch: Option<FetchProgress>,
}

impl RunProgress {
    /// The run of `record`, if one is under way; `sub` is the dominator's view of the
    /// machine's subd (the sync step's fetch).
    pub fn of(record: &Provisioning, sub: Option<&SubStatus>) -> Option<RunProgress> {
        let (operation, image, last, synced) = match &record.state {
            Prov::Birth(r) => (
                Operation::Birth,
                Some(r.image.clone()),
                r.last_step,
                r.synced,
            ),
            Prov::Rebirth(r) => (
                Operation::Rebirth,
                Some(r.image.clone()),
                r.last_step,
                r.synced,
            ),
            Prov::Clean { last_step } => (Operation::Clean, None, *last_step, false),
            _ => return None,
        };
        let steps = operation.steps();
        let mut done = last
            .and_then(|l| steps.iter().position(|s| *s == l))
            .map_or(0, |i| i + 1);
        // The sync is the dominator's step: the ramdisk reports the step after it only. The
        // record learns of it just after the census does: a sub already synced to the run's
        // image has done the step.
        let sub_synced = sub.is_some_and(|s| {
            matches!(&s.state, paddock_dominator::SubState::Synced { image: to } if Some(to) == image.as_ref())
        });
        if (synced || sub_synced)
            && let Some(i) = steps.iter().position(|s| *s == Step::Sync)
        {
            done = done.max(i + 1);
        }
        let current = steps.get(done).copied();
        let fetch = (current == Some(Step::Sync))
            .then(|| sub.and_then(|s| s.fetch.clone()))
            .flatten();
        Some(RunProgress {
            operation,
            image,
            done,
            steps: steps.len(),
            current,
            started: record.started_ms.is_some(),
            fetch,
        })
    }

    /// The share of the run done, 0 to 1: whole steps, and the fetched share of the sync.
    pub fn fraction(&self) -> f64 {
        let within = self
            .fetch
            .as_ref()
            .filter(|f| f.bytes_total > 0)
            .map_or(0.0, |f| f.bytes_done as f64 / f.bytes_total as f64);
        ((self.done as f64 + within) / self.steps.max(1) as f64).clamp(0.0, 1.0)
    }

    /// The fetch's rate so far (bytes per second), once it has run a moment.
    pub fn rate(&self) -> Option<f64> {
        let f = self.fetch.as_ref()?;
        let secs = f.at_ms.saturating_sub(f.started_ms) as f64 / 1000.0;
        (secs >= 0.5 && f.bytes_done > 0).then(|| f.bytes_done as f64 / secs)
    }

    /// The fetch's time left at its rate so far (seconds).
    pub fn eta_secs(&self) -> Option<u64> {
        let f = self.fetch.as_ref()?;
        let left = f.bytes_total.saturating_sub(f.bytes_done) as f64;
        self.rate().map(|r| (left / r).ceil() as u64)
    }
}

/// The progress bar and its sentence (`id="run-progress"`; the bar's `value` is the
/// percentage done, for people and for tests).
pub fn progress(p: &RunProgress) -> Markup {
    let percent = (p.fraction() * 100.0).round() as u32;
    let step = p.current.map_or("finishing", Step::as_str);
    html! {
        div #run-progress .card {
            p {
                strong { (p.operation.as_str()) }
                @if let Some(image) = &p.image { " of " code { (image) } }
                " · step " (p.done.min(p.steps - 1) + 1) " of " (p.steps) ": "
                span #run-step { (step) }
            }
            progress #run-bar max="100" value=(percent) aria-label="run progress" { (percent) " %" }
            " " span #run-percent { (percent) " %" }
            @if !p.started {
                p.muted { "Waiting for the machine to boot the ramdisk." }
            }
            @if let Some(f) = &p.fetch {
                p #run-fetch {
                    @if f.done {
                        (bytes(f.bytes_total)) " fetched in " (duration(f.at_ms.saturating_sub(f.started_ms) / 1000))
                        "; the update is next"
                    } @else {
                        (bytes(f.bytes_done)) " of " (bytes(f.bytes_total)) " fetched"
                        @if let Some(r) = p.rate() { " · " (bytes(r as u64)) "/s" }
                        @if let Some(eta) = p.eta_secs() { " · about " (duration(eta)) " left" }
                    }
                }
            }
        }
    }
}

/// Seconds as `42 s`, `3 min 5 s`, `2 h 10 min`.
pub fn duration(secs: u64) -> String {
    match secs {
        0..=59 => format!("{secs} s"),
        60..=3599 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// What LLDP says about the switch port a NIC is cabled to: the switch (its system name,
/// else its chassis ID) and the port (its ID, else its description).
pub fn switch_port(nic: &Interface) -> Option<(String, String)> {
    paddock_inventory::lldp::switch_port(nic.lldp.as_deref()?)
}

/// The hardware cards (`id="inventory"`), and the raw inventory one click away.
pub fn hardware(n: &Node, data: &IntrospectionData) -> Markup {
    let inv = data.inventory.clone().unwrap_or_default();
    let vendor = inv.system_vendor.clone().unwrap_or_default();
    let firmware = vendor.firmware.clone().unwrap_or_default();
    let cpu = inv.cpu.clone().unwrap_or_default();
    let memory = inv.memory.clone().unwrap_or_default();
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    let root = data.root_disk.as_ref().map(|d| d.name.as_str());
    let pxe = n.pxe_mac.map(|m| m.to_string());
    let bmc = n.bmc_address.clone().or_else(|| inv.bmc_address.clone());
    let raw = serde_json::to_string_pretty(&inv).unwrap_or_default();
    html! {
        section #inventory aria-label="hardware" {
            div.cards {
                div.card {
                    h3 { "System" }
                    p { (text(&vendor.manufacturer)) " " (text(&vendor.product_name)) }
                    @if let Some(serial) = vendor.serial_number.as_ref().filter(|s| !s.is_empty()) {
                        p.muted { "serial " (serial) }
                    }
                    p.muted {
                        "firmware " (text(&firmware.vendor)) " " (text(&firmware.version))
                        @if let Some(b) = &inv.boot { " · " (b.current_boot_mode) " boot" }
                    }
                }
                div.card {
                    h3 { "CPU" }
                    p { (cpu.count.map_or("-".into(), |c| c.to_string())) " × " (text(&cpu.model_name)) }
                    p.muted {
                        (text(&cpu.architecture))
                        @if let Some(f) = &cpu.frequency { " · " (f) " MHz" }
                        @if let Some(s) = cpu.socket_count { " · " (s) " socket(s)" }
                    }
                }
                div.card {
                    h3 { "Memory" }
                    p.big { (memory.physical_mb.map_or_else(|| "-".into(), |mb| bytes(mb.saturating_mul(1 << 20)))) }
                    @if let Some(total) = memory.total { p.muted { (bytes(total)) " usable" } }
                }
                div.card {
                    h3 { "BMC" }
                    p { (bmc.as_deref().unwrap_or("none known")) }
                }
            }
            h3 { "Disks (" (inv.disks.len()) ")" }
            table #disks {
                tr { th { "Name" } th { "Size" } th { "Model" } th { "Kind" } th { "Serial" } th { "Root disk" } }
                @for d in &inv.disks {
                    tr {
                        td { code { (d.name) } }
                        td { (bytes(d.size)) }
                        td { (text(&d.model)) }
                        td { (if d.rotational { "HDD" } else { "SSD" }) }
                        td { (text(&d.serial)) }
                        td { @if root == Some(d.name.as_str()) { (crate::console_style::badge("root")) } }
                    }
                }
            }
            h3 { "Network interfaces (" (inv.interfaces.len()) ")" }
            table #nics {
                tr { th { "Name" } th { "MAC" } th { "Speed" } th { "Address" } th { "Cabled to" } th { "Driver" } }
                @for i in &inv.interfaces {
                    tr {
                        td {
                            (i.name)
                            @if i.mac_address.is_some() && i.mac_address.as_ref().map(|m| m.to_ascii_lowercase()) == pxe {
                                " " (crate::console_style::badge("pxe"))
                            }
                        }
                        td { code { (text(&i.mac_address)) } }
                        td { (i.speed_mbps.map_or_else(|| "-".into(), speed)) }
                        td { (text(&i.ipv4_address)) }
                        td { @match switch_port(i) {
                            Some((sw, port)) => { "switch " (sw) " port " (port) }
                            None => { span.muted { "unknown" } }
                        } }
                        td { (text(&i.driver)) }
                    }
                }
            }
            details {
                summary { "Raw inventory (JSON)" }
                pre { (raw) }
            }
        }
    }
}

/// The node's hardware in one line, from its properties: `4 CPUs · 8.0 GiB · 99 GiB disk
/// · x86_64`.
pub fn headline(n: &Node) -> String {
    let num = |k: &str| n.properties.get(k).and_then(serde_json::Value::as_u64);
    let mut parts = Vec::new();
    if let Some(c) = num("cpus") {
        parts.push(format!("{c} CPUs"));
    }
    if let Some(mb) = num("memory_mb") {
        parts.push(bytes(mb.saturating_mul(1 << 20)));
    }
    if let Some(gb) = num("local_gb") {
        parts.push(format!("{gb} GiB disk"));
    }
    if let Some(a) = n.properties.get("cpu_arch").and_then(|v| v.as_str()) {
        parts.push(a.to_string());
    }
    if parts.is_empty() {
        "not inspected yet".into()
    } else {
        parts.join(" · ")
    }
}

/// A timeline entry's kind with its icon (the tone of what happened; the icon is drawn by
/// the stylesheet, the text says it).
pub fn event_kind(kind: &str, error: bool) -> Markup {
    let tone = if error {
        crate::console_style::Tone::Bad
    } else {
        crate::console_style::Tone::Idle
    };
    html! { span class={ "badge " (tone.class()) } { (kind) } }
}

/// The machine's image compliance: its sub's state and what it last said, or why there is
/// none (no subd: never installed by Paddock, or not yet registered).
pub fn compliance(sub: Option<&SubStatus>) -> Markup {
    html! {
        @match sub {
            None => p.muted { "No subd known for this machine: the dominator keeps only installed machines." },
            Some(s) => {
                p {
                    (crate::console_style::badge(s.state.name())) " " (s.summary)
                    @if let Some(image) = &s.required_image { " · required image " code { (image) } }
                }
                @if let Some(h) = &s.health {
                    p.muted { "health check after updating to " code { (h.image) } ": " (if h.passed { "passed" } else { "failed" }) }
                }
                p { a href={ "/ui/subs/" (s.hostname) } { "Its files, drift and last updates" } }
            }
        }
    }
}

/// A link speed: `100 Mb/s`, `10 Gb/s`.
fn speed(mbps: u64) -> String {
    if mbps >= 1000 && mbps.is_multiple_of(1000) {
        format!("{} Gb/s", mbps / 1000)
    } else {
        format!("{mbps} Mb/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_birther::state::Run;

    fn record(state: Prov) -> Provisioning {
        Provisioning {
            state,
            since_ms: 0,
            updated_ms: 0,
            started_ms: Some(1),
        }
    }

    fn birth(last: Option<Step>, synced: bool) -> Provisioning {
        record(Prov::Birth(Run {
            image: "debian/a".into(),
            previous_image: None,
            last_step: last,
            synced,
        }))
    }

    fn fetching(done: u64, total: u64, secs: u64) -> SubStatus {
        let mut s = crate::dominator::test_sub(
            "web-1",
            paddock_dominator::SubState::Fetching {
                objects: 3,
                bytes: total,
            },
        );
        s.fetch = Some(FetchProgress {
            bytes_done: done,
            bytes_total: total,
            started_ms: 10_000,
            at_ms: 10_000 + secs * 1000,
            done: done == total,
        });
        s
    }

    #[test]
    fn a_run_moves_through_its_steps_and_the_sync_by_the_bytes_fetched() {
        let start = RunProgress::of(&birth(None, false), None).unwrap();
        assert_eq!((start.done, start.steps), (0, 9));
        assert_eq!(start.current, Some(Step::ChooseDisk));
        assert_eq!(start.fraction(), 0.0);
        // Registered: the sync is under way; half its bytes make half a step more.
        let sub = fetching(500, 1000, 5);
        let sync = RunProgress::of(&birth(Some(Step::Register), false), Some(&sub)).unwrap();
        assert_eq!(sync.current, Some(Step::Sync));
        assert!(
            (sync.fraction() - 5.5 / 9.0).abs() < 1e-9,
            "{}",
            sync.fraction()
        );
        assert_eq!(sync.rate(), Some(100.0));
        assert_eq!(sync.eta_secs(), Some(5));
        let html = progress(&sync).into_string();
        assert!(html.contains("value=\"61\""), "{html}");
        assert!(html.contains("500 B of 1000 B fetched"), "{html}");
        assert!(html.contains("about 5 s left"), "{html}");
        // Fetched: the whole sync step's share, until the update proves it synced.
        let fetched = RunProgress::of(
            &birth(Some(Step::Register), false),
            Some(&fetching(1000, 1000, 10)),
        )
        .unwrap();
        assert!((fetched.fraction() - 6.0 / 9.0).abs() < 1e-9);
        let html = progress(&fetched).into_string();
        assert!(
            html.contains("1000 B fetched in 10 s; the update is next"),
            "{html}"
        );
        // Synced, before the ramdisk reports the next step: the sync counts as done, and a
        // fetch the sub reports then is not this run's.
        let synced = RunProgress::of(&birth(Some(Step::Register), true), Some(&sub)).unwrap();
        assert_eq!(synced.current, Some(Step::BootLoader));
        assert_eq!(synced.fetch, None);
        assert!(synced.fraction() > sync.fraction());
        // The census says synced to the run's image before the record does: done all the same
        // (and not for another image).
        let synced_to = |image: &str| {
            crate::dominator::test_sub(
                "web-1",
                paddock_dominator::SubState::Synced {
                    image: image.into(),
                },
            )
        };
        let early = RunProgress::of(
            &birth(Some(Step::Register), false),
            Some(&synced_to("debian/a")),
        );
        assert_eq!(early.unwrap().current, Some(Step::BootLoader));
        let other = RunProgress::of(
            &birth(Some(Step::Register), false),
            Some(&synced_to("debian/old")),
        );
        assert_eq!(other.unwrap().current, Some(Step::Sync));
        let last = RunProgress::of(&birth(Some(Step::HandOver), true), None).unwrap();
        assert_eq!(last.fraction(), 1.0);
        assert!(progress(&last).into_string().contains("finishing"));
        assert_eq!(
            RunProgress::of(&record(Prov::Healthy { image: "a".into() }), None),
            None
        );
    }

    #[test]
    fn lldp_names_the_switch_and_port_and_no_tlvs_name_nothing() {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let named = Interface {
            name: "eth0".into(),
            lldp: Some(vec![(2, hex(b"\x05swp7")), (5, hex(b"leaf-1"))]),
            ..Interface::default()
        };
        assert_eq!(switch_port(&named), Some(("leaf-1".into(), "swp7".into())));
        assert_eq!(switch_port(&Interface::default()), None);
    }

    #[test]
    fn hardware_cards_escape_what_the_machine_sent() {
        let n = Node::new(uuid::Uuid::from_u128(1), 1_700_000_000);
        let data: IntrospectionData = serde_json::from_value(serde_json::json!({
            "inventory": {
                "cpu": {"count": 4, "model_name": "<b>x</b>", "architecture": "x86_64"},
                "memory": {"physical_mb": 8192},
                "disks": [{"name": "/dev/vda", "size": 107374182400u64, "rotational": false}],
                "interfaces": [{"name": "eth0", "mac_address": "52:54:00:c0:50:01", "speed_mbps": 10000}]
            },
            "root_disk": {"name": "/dev/vda", "size": 107374182400u64}
        }))
        .unwrap();
        let html = hardware(&n, &data).into_string();
        assert!(!html.contains("<b>x"), "{html}");
        for want in [
            "4 × &lt;b&gt;x",
            "8.0 GiB",
            "100.0 GiB",
            "SSD",
            "10 Gb/s",
            ">root<",
        ] {
            assert!(html.contains(want), "{want}: {html}");
        }
    }
}
