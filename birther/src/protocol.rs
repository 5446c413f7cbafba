//! The agent protocol of provisioning: what the ramdisk's agent and the appliance say to
//! each other over HTTP, as serde types both sides use (the appliance serves them in
//! `appliance/src/provisioning.rs`, the agent calls them from the ramdisk). Plain data:
//! nothing here decides anything; [`crate::state`] does.
//!
//! | route | request | answer |
//! |---|---|---|
//! | `POST /api/v1/provision/next` | [`NextRequest`] | [`NextAnswer`] |
//! | `POST /api/v1/provision/{node}/report` | [`ReportRequest`] | the node's [`Provisioning`] |
//! | `POST /api/v1/provision/{node}/register` | [`RegisterRequest`] | the node's [`Provisioning`] |
//! | `GET /api/v1/provision/{node}` | — | the node's [`Provisioning`] (poll it for `synced`) |
//!
//! Errors are the `{"error": {"message"}}` envelope of every Paddock API: 404 for an
//! unknown node, 400 for a malformed body or an event the agent may not send, 409 for an
//! event the node's state refuses (the state machine's message; nothing changed).

use serde::{Deserialize, Serialize};

use crate::state::{Event, Operation};

pub use crate::state::Provisioning;

/// The port subd listens on when the appliance does not say otherwise (Dominator's).
pub const SUBD_PORT: u16 = 6969;

/// `POST /api/v1/provision/next`: which node the agent runs on, found by any of its MACs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextRequest {
    /// Every NIC's MAC (`52:54:00:ab:00:01`, any case).
    pub macs: Vec<String>,
}

/// What the agent must do now. `mode: None`: nothing (an unknown machine, or a node with
/// no run under way): the agent powers off or waits as after an inspection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NextAnswer {
    /// The node's UUID; `None` when no node has any of the MACs.
    pub node: Option<String>,
    /// `birth`, `rebirth` or `clean`.
    pub mode: Option<Operation>,
    /// The image a birth or rebirth installs.
    pub image: Option<String>,
    /// The image's size (bytes of its files), for the disk choice; 0 without an image.
    #[serde(default)]
    pub image_bytes: u64,
    /// The installed system's hostname, also its MDB entry's (the node's name, else
    /// `node-<first 8 hex digits of its UUID>`); empty without a node.
    #[serde(default)]
    pub hostname: String,
    /// The node's root device hints (Ironic's `properties.root_device`), if any.
    #[serde(default)]
    pub root_device_hints: Option<serde_json::Value>,
    /// Where subd must listen (the dominator connects there).
    #[serde(default = "subd_port")]
    pub subd_port: u16,
    /// The image's filter, one start-anchored regular expression a line (empty: a sparse
    /// image, or none): paths subd must leave alone.
    #[serde(default)]
    pub filter: Vec<String>,
    /// Paths the dominator places on this machine (its computed files, `/etc/hostname`
    /// among them when the spec computes it): the ramdisk writes none of them itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub computed: Vec<String>,
    /// The appliance's base URL (reports, the image server's objects).
    pub appliance_url: String,
    /// subd's trust material when the appliance runs with TLS: the ramdisk starts subd with
    /// it and installs it in the target's `/etc/paddock/subd/`. `None`: an insecure appliance
    /// (subd runs `--insecure`, as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subd_trust: Option<SubdTrust>,
}

/// What subd needs to serve TLS and trust only the appliance: the appliance's CA, and subd's
/// own certificate and key, PEM (`--ca`, `--cert`, `--key`). Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubdTrust {
    /// The appliance's CA: subd calls only servers with a certificate from it.
    pub ca_pem: String,
    /// Whom subd takes calls from: the CA and the subd CA (the dominator, and the ramdisk
    /// polling its own subd with subd's certificate). Empty from an appliance that has no
    /// subd CA: then the CA alone.
    #[serde(default)]
    pub client_ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for SubdTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubdTrust")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

fn subd_port() -> u16 {
    SUBD_PORT
}

impl NextAnswer {
    /// Nothing to do: no node, or no run under way.
    pub fn nothing(appliance_url: &str) -> NextAnswer {
        NextAnswer {
            node: None,
            mode: None,
            image: None,
            image_bytes: 0,
            hostname: String::new(),
            root_device_hints: None,
            subd_port: SUBD_PORT,
            filter: Vec::new(),
            computed: Vec::new(),
            appliance_url: appliance_url.to_string(),
            subd_trust: None,
        }
    }
}

/// `POST /api/v1/provision/{node}/report`: a step of the run. The agent may send
/// [`Event::StepDone`], [`Event::StepFailed`] and [`Event::CleanDone`] only
/// ([`ReportRequest::agent_may_send`]); requests and `subd_synced` are refused (400).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportRequest {
    pub event: Event,
}

impl ReportRequest {
    /// Whether the event is a report of the ramdisk's own (not an operator's request, not
    /// the dominator's word).
    pub fn agent_may_send(&self) -> bool {
        matches!(
            self.event,
            Event::StepDone { .. } | Event::StepFailed { .. } | Event::CleanDone
        )
    }
}

/// `POST /api/v1/provision/{node}/register`: subd runs on the target at `address`; the
/// appliance puts the MDB machine (hostname, this address, the run's image as
/// RequiredImage) and records [`crate::Step::Register`] done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The machine's IP address (where the dominator reaches subd).
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Step;
    use serde_json::json;

    /// The JSON on the wire, as both sides read and write it.
    #[test]
    fn wire_shapes() {
        let next: NextRequest =
            serde_json::from_value(json!({"macs": ["52:54:00:AB:00:01"]})).unwrap();
        assert_eq!(next.macs, ["52:54:00:AB:00:01"]);
        let answer = NextAnswer {
            node: Some("0b6c2a4e-0000-0000-0000-000000000001".into()),
            mode: Some(Operation::Birth),
            image: Some("debian/a".into()),
            image_bytes: 7,
            hostname: "r1u7".into(),
            root_device_hints: Some(json!({"serial": "disk0"})),
            subd_port: 6969,
            filter: vec!["/tmp/.*".into()],
            computed: Vec::new(),
            appliance_url: "http://198.18.0.1:8080".into(),
            subd_trust: None,
        };
        let v = serde_json::to_value(&answer).unwrap();
        assert_eq!(
            v,
            json!({"node": "0b6c2a4e-0000-0000-0000-000000000001", "mode": "birth",
                   "image": "debian/a", "image_bytes": 7, "hostname": "r1u7",
                   "root_device_hints": {"serial": "disk0"}, "subd_port": 6969,
                   "filter": ["/tmp/.*"], "appliance_url": "http://198.18.0.1:8080"})
        );
        assert_eq!(serde_json::from_value::<NextAnswer>(v).unwrap(), answer);
        let nothing = serde_json::to_value(NextAnswer::nothing("http://a")).unwrap();
        assert_eq!(
            nothing,
            json!({"node": null, "mode": null, "image": null, "image_bytes": 0, "hostname": "",
                   "root_device_hints": null, "subd_port": 6969, "filter": [],
                   "appliance_url": "http://a"})
        );
        // With TLS: subd's trust material, absent from the JSON when there is none.
        let trusted = NextAnswer {
            subd_trust: Some(SubdTrust {
                ca_pem: "CA".into(),
                client_ca_pem: "CA".into(),
                cert_pem: "CERT".into(),
                key_pem: "-----BEGIN PRIVATE KEY-----\nsecret".into(),
            }),
            ..answer
        };
        let v = serde_json::to_value(&trusted).unwrap();
        assert_eq!(
            v["subd_trust"],
            json!({"ca_pem": "CA", "client_ca_pem": "CA", "cert_pem": "CERT",
                   "key_pem": "-----BEGIN PRIVATE KEY-----\nsecret"})
        );
        assert_eq!(serde_json::from_value::<NextAnswer>(v).unwrap(), trusted);
        // An older appliance's answer, without client_ca_pem, still reads.
        let old: SubdTrust =
            serde_json::from_value(json!({"ca_pem": "CA", "cert_pem": "CERT", "key_pem": "KEY"}))
                .unwrap();
        assert_eq!(old.client_ca_pem, "");
        let shown = format!("{trusted:?}");
        assert!(
            !shown.contains("secret") && shown.contains("<redacted>"),
            "{shown}"
        );
        for (mode, text) in [
            (Operation::Birth, "birth"),
            (Operation::Rebirth, "rebirth"),
            (Operation::Clean, "clean"),
        ] {
            assert_eq!(serde_json::to_value(mode).unwrap(), text);
        }
        let report: ReportRequest =
            serde_json::from_value(json!({"event": {"event": "step_done", "step": "partition"}}))
                .unwrap();
        assert_eq!(
            report.event,
            Event::StepDone {
                step: Step::Partition
            }
        );
        let register: RegisterRequest =
            serde_json::from_value(json!({"address": "198.18.0.150"})).unwrap();
        assert_eq!(register.address, "198.18.0.150");
    }

    #[test]
    fn the_agent_sends_only_its_own_reports() {
        let may = |event: Event| ReportRequest { event }.agent_may_send();
        assert!(may(Event::StepDone { step: Step::Wipe }));
        assert!(may(Event::StepFailed {
            step: Step::Partition,
            message: "no disk".into()
        }));
        assert!(may(Event::CleanDone));
        assert!(!may(Event::SubdSynced { image: "a".into() }));
        assert!(!may(Event::ProvisionRequested { image: "a".into() }));
        assert!(!may(Event::ReimageRequested { image: None }));
        assert!(!may(Event::CleanRequested));
    }
}
