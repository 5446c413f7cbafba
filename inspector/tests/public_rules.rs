//! The rule engine on introspection rules as their public sources wrote them, each with the
//! node before and after (or the error processing ends with), as Ironic Inspector would
//! leave them. Sources:
//! - Inspector's `doc/source/user/usage.rst` (openstack/ironic-inspector), its
//!   `test/functional.py` and `test/unit/test_rules.py` (data shaped as `test/base.py`);
//! - TripleO's profile matching (openstack/tripleo-docs,
//!   `deploy-guide/source/provisioning/profile_matching.rst`);
//! - Kayobe's rules (openstack/kayobe, `ansible/inventory/group_vars/all/inspector` as of
//!   commit cdfb2ec4, the Inspector format, with the Ansible variables rendered);
//! - tempest's (openstack/ironic-tempest-plugin, `ironic_tempest_plugin/rules/
//!   basic_ops_rule.json` and `tests/scenario/test_introspection_discovery.py`).
//!
//! The rule sets are in `tests/rules/*.json`, quoted as their sources wrote them (Kayobe's
//! rendered from its YAML with the variables below).

use paddock_inspector::node::{Node, Secrets};
use paddock_inspector::patch;
use paddock_inspector::rules::{self, Rule};
use serde_json::{Value, json};
use uuid::Uuid;

const GIB: u64 = 1 << 30;

/// A rule set of `tests/rules/`.
macro_rules! rules {
    ($name:literal) => {
        serde_json::from_str::<Value>(include_str!(concat!("rules/", $name, ".json")))
            .expect(concat!($name, ".json is JSON"))
    };
}

/// The node attributes a case states, before and after.
const SHOWN: [&str; 8] = [
    "name",
    "driver",
    "driver_info",
    "properties",
    "extra",
    "traits",
    "resource_class",
    "power_interface",
];

struct Case {
    /// Where the rules come from.
    source: &'static str,
    /// As written there (a list of rules, in import order).
    rules: Value,
    /// The processed introspection data.
    data: Value,
    /// The node before (any of `SHOWN`; the rest empty).
    before: Value,
    /// The node after: every attribute of `SHOWN`.
    after: Value,
    /// The error processing ends with, if it fails.
    failure: Option<&'static str>,
}

fn node(before: &Value) -> Node {
    let mut n = Node::new(Uuid::nil(), 0);
    let mut ops: Vec<Value> = Vec::new();
    for (k, v) in before.as_object().expect("an object") {
        if k == "traits" {
            n.traits = serde_json::from_value(v.clone()).unwrap();
        } else {
            ops.push(json!({"op": "add", "path": format!("/{k}"), "value": v}));
        }
    }
    let opts = patch::Options {
        ident: "node",
        reset_interfaces: None,
    };
    patch::patch(&n, &Value::Array(ops), &opts).expect("a valid node")
}

fn shown(n: &Node) -> Value {
    let view = n.view(Secrets::Plain);
    Value::Object(
        SHOWN
            .iter()
            .map(|k| (k.to_string(), view[*k].clone()))
            .collect(),
    )
}

fn run(cases: Vec<Case>) {
    for case in cases {
        let rules: Vec<Rule> = case
            .rules
            .as_array()
            .expect("a list of rules")
            .iter()
            .enumerate()
            .map(|(i, r)| {
                rules::validate(r).unwrap_or_else(|e| panic!("{}: rule {i}: {e}", case.source));
                Rule {
                    uuid: Uuid::from_u128(i as u128 + 1),
                    description: r["description"].as_str().map(String::from),
                    scope: r["scope"].as_str().map(String::from),
                    conditions: r["conditions"].as_array().cloned().unwrap_or_default(),
                    actions: r["actions"].as_array().cloned().unwrap_or_default(),
                    created_at: 0,
                }
            })
            .collect();
        let before = node(&case.before);
        let applied = rules::apply(&rules, &case.data, &before);
        assert_eq!(
            applied.failure_message().as_deref(),
            case.failure,
            "{}: failure",
            case.source
        );
        assert_eq!(
            shown(&applied.node),
            case.after,
            "{}: the node after",
            case.source
        );
    }
}

/// The node's attributes after, from the few a case changes.
fn after(changes: Value) -> Value {
    let mut all = json!({
        "name": null, "driver": null, "driver_info": {}, "properties": {}, "extra": {},
        "traits": [], "resource_class": null, "power_interface": null
    });
    for (k, v) in changes.as_object().unwrap() {
        all[k] = v.clone();
    }
    all
}

#[test]
fn inspector_documentation() {
    // usage.rst, "Discovery": the rules that give a discovered node its driver and
    // credentials, and the auto_discovered rule; "Actions": formatting from the data.
    let ipmi = rules!("usage_discovery");
    let discovered = rules!("usage_auto_discovered");
    let formatted = rules!("usage_formatting");
    let enrolled = json!({"driver": "fake-hardware", "driver_info": {"ipmi_address": "192.0.2.1"}});
    run(vec![
        Case {
            source: "usage.rst Discovery, a discovered node",
            rules: ipmi.clone(),
            data: json!({"auto_discovered": true}),
            before: enrolled.clone(),
            after: after(json!({"driver": "ipmi", "driver_info": {
                "deploy_kernel": "<glance uuid>", "deploy_ramdisk": "<glance uuid>",
                "ipmi_address": "192.0.2.1", "ipmi_username": "username", "ipmi_password": "password"
            }})),
            failure: None,
        },
        Case {
            source: "usage.rst Discovery, a node with credentials keeps them",
            rules: ipmi,
            data: json!({}),
            before: json!({"driver": "redfish", "driver_info": {
                "ipmi_username": "admin", "ipmi_password": "x", "deploy_kernel": "k"}}),
            // Neither rule's conditions all hold: the deploy rule wants both empty.
            after: after(json!({"driver": "redfish", "driver_info": {
                "deploy_kernel": "k", "ipmi_username": "admin", "ipmi_password": "x"
            }})),
            failure: None,
        },
        Case {
            source: "usage.rst auto_discovered, a discovered node",
            rules: discovered.clone(),
            data: json!({"auto_discovered": true, "inventory": {}}),
            before: enrolled.clone(),
            after: after(json!({"driver": "ipmi", "driver_info": {"ipmi_address": "192.0.2.1"}})),
            failure: None,
        },
        Case {
            source: "usage.rst auto_discovered, an enrolled node (the field is missing)",
            rules: discovered,
            data: json!({"inventory": {}}),
            before: json!({"driver": "ipmi"}),
            after: after(json!({"driver": "ipmi"})),
            failure: None,
        },
        Case {
            source: "usage.rst formatting, the doc's root_device (not in IPA's data)",
            rules: formatted.clone(),
            data: json!({"inventory": {"bmc_address": "192.0.2.9"},
                         "root_disk": {"serial": "S1"}}),
            before: json!({}),
            after: after(json!({"driver_info": {"ipmi_address": "192.0.2.9"}})),
            failure: Some(
                "Invalid formatting variable key provided in value {data[root_device][serial]}: 'root_device'",
            ),
        },
        Case {
            source: "usage.rst formatting, data that has root_device",
            rules: formatted,
            data: json!({"inventory": {"bmc_address": "192.0.2.9"},
                         "root_device": {"serial": "S1"}}),
            before: json!({}),
            after: after(json!({"driver_info": {"ipmi_address": "192.0.2.9"},
                                "properties": {"root_device": {"serial": "S1"}}})),
            failure: None,
        },
    ]);
}

/// Inspector's `test/base.py` inventory, processed: what its functional tests post.
fn inspector_test_data(bmc: &str) -> Value {
    json!({
        "boot_interface": "01-11-22-33-44-55-66",
        "inventory": {
            "interfaces": [
                {"name": "eth1", "mac_address": "11:22:33:44:55:66", "ipv4_address": "1.2.1.2",
                 "lldp": [[1, "04112233aabbcc"], [2, "07373334"], [3, "003c"]]},
                {"name": "eth2", "mac_address": "12:12:21:12:21:12"},
                {"name": "eth3", "mac_address": "66:55:44:33:22:11", "ipv4_address": "1.2.1.1"},
                {"name": "ib0", "mac_address": "7c:fe:90:29:26:52", "ipv4_address": "1.2.1.3",
                 "client_id": "ff:00:00:00:00:00:02:00:00:02:c9:00:7c:fe:90:03:00:29:26:52"}
            ],
            "disks": [
                {"name": "/dev/sda", "model": "Big Data Disk", "size": 1000 * GIB},
                {"name": "/dev/sdb", "model": "Small OS Disk", "size": 20 * GIB}
            ],
            "cpu": {"count": 4, "architecture": "x86_64"},
            "memory": {"physical_mb": 12288},
            "bmc_address": bmc,
            "bmc_v6address": "2001:1234:1234:1234:1234:1234:1234:1234/64"
        },
        "root_disk": {"name": "/dev/sda", "model": "Big Data Disk", "size": 1000 * GIB, "wwn": null},
        "interfaces": {"eth1": {"ip": "1.2.1.2", "mac": "11:22:33:44:55:66", "client_id": null, "pxe": true}},
        "ipmi_address": bmc,
        "local_gb": 999,
        "cpus": 4,
        "cpu_arch": "x86_64",
        "memory_mb": 12288
    })
}

#[test]
fn inspector_functional_and_unit_tests() {
    // functional.py test_introspection_rules and test_conditions_scheme_actions_path.
    let introspection_rules = rules!("functional_introspection_rules");
    let scheme_rules = rules!("functional_scheme_actions_path");
    // test/base.py NodeTestBase's node.
    let base_node = json!({"driver": "ipmi", "driver_info": {"ipmi_address": "1.2.3.4"},
                           "properties": {"cpu_arch": "i386", "local_gb": 40}, "extra": {}});
    let mut with_loopback = inspector_test_data("1.2.3.4");
    with_loopback["inventory"]["interfaces"][1]["ipv4_address"] = json!("127.0.0.1");
    run(vec![
        Case {
            source: "functional.py test_introspection_rules",
            rules: introspection_rules.clone(),
            data: inspector_test_data("1.2.3.4"),
            before: json!({"extra": {"bar": "foo"}}),
            after: after(json!({"extra": {"bar": "foo", "foo": "bar"}})),
            failure: None,
        },
        Case {
            source: "functional.py test_introspection_rules, a loopback address among the interfaces",
            rules: introspection_rules,
            data: with_loopback,
            before: json!({"extra": {"bar": "foo"}}),
            after: after(json!({"extra": {"bar": "foo"}})),
            failure: None,
        },
        Case {
            source: "functional.py test_conditions_scheme_actions_path",
            rules: scheme_rules,
            data: inspector_test_data("1.2.3.5"),
            before: base_node.clone(),
            after: after(
                json!({"driver": "ipmi", "driver_info": {"ipmi_address": "1.2.3.5"},
                                "properties": {"cpu_arch": "i386", "local_gb": 40},
                                "extra": {"foo": "bar"}}),
            ),
            failure: None,
        },
    ]);
    // test_rules.py TestCheckConditionsMultiple: `interfaces[*].ip` eq 1.2.3.4 over these
    // addresses, for any (the default), all and first.
    let sets: [(&[&str], [bool; 3]); 4] = [
        (&["1.1.1.1", "1.2.3.4", "1.3.2.2"], [true, false, false]),
        (&["1.2.3.4"], [true, true, true]),
        (&["1.1.1.1", "1.3.2.2"], [false, false, false]),
        (&["1.2.3.4", "1.3.2.2"], [true, false, true]),
    ];
    let mut cases = Vec::new();
    for (ips, want) in sets {
        for (multiple, holds) in ["any", "all", "first"].into_iter().zip(want) {
            cases.push(Case {
                source: "test_rules.py TestCheckConditionsMultiple",
                rules: json!([{
                    "conditions": [{"op": "eq", "field": "interfaces[*].ip", "value": "1.2.3.4",
                                    "multiple": multiple}],
                    "actions": [{"action": "fail", "message": "boom!"}]
                }]),
                data: json!({"interfaces": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()}),
                before: json!({}),
                after: after(json!({})),
                failure: holds.then_some("boom!"),
            });
        }
    }
    run(cases);
}

#[test]
fn tripleo_profile_matching() {
    // profile_matching.rst, "Example of introspection rules".
    let profiles = rules!("tripleo_profile_matching");
    let caps = |c: &str| json!({"properties": {"capabilities": c}});
    let data =
        |memory_mb: u64, local_gb: u64| json!({"memory_mb": memory_mb, "local_gb": local_gb});
    run(vec![
        Case {
            source: "TripleO profile matching, too little memory",
            rules: profiles.clone(),
            data: data(2048, 100),
            before: caps("boot_option:local"),
            after: after(caps("boot_option:local")),
            failure: Some("Memory too low, expected at least 4 GiB"),
        },
        Case {
            source: "TripleO profile matching, a storage node",
            rules: profiles.clone(),
            data: data(16384, 2000),
            before: caps("boot_option:local,cpu_vt:true"),
            after: after(caps("boot_option:local,cpu_vt:true,profile:swift-storage")),
            failure: None,
        },
        Case {
            source: "TripleO profile matching, compute or controller: the profile is removed",
            rules: profiles.clone(),
            data: data(16384, 500),
            before: caps("profile:compute,boot_option:local"),
            after: after(caps(
                "boot_option:local,compute_profile:1,control_profile:1",
            )),
            failure: None,
        },
        Case {
            source: "TripleO profile matching, a small disk: nothing",
            rules: profiles,
            data: data(16384, 20),
            before: json!({}),
            after: after(json!({})),
            failure: None,
        },
    ]);
}

/// Kayobe's rules (group_vars/all/inspector at cdfb2ec4), rendered as Ansible renders them
/// with `inspector_rule_var_ipmi_username: admin`, `…_ipmi_password: secret`,
/// `…_deploy_kernel: http://x/ipa.kernel`, `…_deploy_ramdisk: http://x/ipa.initramfs`,
/// `…_lldp_switch_port_interface: eth0`, `…_redfish_verify_ca: true`.
fn kayobe_rules() -> Value {
    rules!("kayobe")
}

fn kayobe_data(port: &str) -> Value {
    json!({
        "inventory": {
            "interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01"}],
            "bmc_address": "10.0.0.21",
            "system_vendor": {"manufacturer": "Dell Inc.", "serial_number": "7XQ1", "product_name": "PowerEdge R640"}
        },
        "root_disk": {"name": "/dev/sda", "serial": "S3EV", "size": 480 * GIB},
        "boot_interface": "01-52-54-00-00-00-01",
        "all_interfaces": {"eth0": {"ip": "10.1.0.21", "mac": "52:54:00:00:00:01", "pxe": true,
                                    "lldp_processed": {"switch_port_description": port}}}
    })
}

#[test]
fn kayobe() {
    let vendor = json!({"manufacturer": "Dell Inc.", "serial_number": "7XQ1", "product_name": "PowerEdge R640"});
    let info = json!({
        "deploy_kernel": "http://x/ipa.kernel", "deploy_ramdisk": "http://x/ipa.initramfs",
        "redfish_verify_ca": true,
        "ipmi_address": "10.0.0.21", "ipmi_username": "admin", "ipmi_password": "secret",
        "redfish_address": "10.0.0.21", "redfish_username": "admin", "redfish_password": "secret"
    });
    let enrolled = json!({"driver": "fake-hardware", "driver_info": {"ipmi_address": "10.0.0.21"}});
    run(vec![
        Case {
            source: "Kayobe rules, a discovered node",
            rules: kayobe_rules(),
            data: kayobe_data("compute-0"),
            before: enrolled.clone(),
            after: after(json!({
                "name": "compute-0", "driver": "fake-hardware", "driver_info": info.clone(),
                "properties": {"root_device": {"serial": "S3EV"}},
                "extra": {"pxe_interface_mac": "01-52-54-00-00-00-01", "system_vendor": vendor.clone()}
            })),
            failure: None,
        },
        Case {
            source: "Kayobe rules, a Dell switch sending the interface name (no name set)",
            rules: kayobe_rules(),
            data: kayobe_data("TenGigabitEthernet 1/1/1"),
            before: enrolled,
            after: after(json!({
                "driver": "fake-hardware", "driver_info": info,
                "properties": {"root_device": {"serial": "S3EV"}},
                "extra": {"pxe_interface_mac": "01-52-54-00-00-00-01", "system_vendor": vendor}
            })),
            failure: None,
        },
        Case {
            // "Save introspection data to Ironic node": "{data}" is the data's Python repr.
            source: "Kayobe inspector_rule_save_data",
            rules: rules!("kayobe_save_data"),
            data: json!({"inventory": {"bmc_address": null, "cpu": {"count": 2, "flags": ["vmx"]}},
                         "memory_mb": 2048.0, "auto_discovered": true, "name": "it's"}),
            before: json!({}),
            after: after(json!({"extra": {"introspection_data":
                "{'inventory': {'bmc_address': None, 'cpu': {'count': 2, 'flags': ['vmx']}}, 'memory_mb': 2048.0, 'auto_discovered': True, 'name': \"it's\"}"
            }})),
            failure: None,
        },
    ]);
}

#[test]
fn tempest() {
    // ironic_tempest_plugin/rules/basic_ops_rule.json; test_introspection_discovery.py's
    // rule, with its configuration's drivers (auto_discovery_default_driver fake-hardware,
    // target ipmi) and node name.
    let basic = rules!("tempest_basic_ops_rule");
    let discovery = rules!("tempest_discovery");
    run(vec![
        Case {
            source: "tempest basic_ops_rule.json",
            rules: basic.clone(),
            data: json!({"memory_mb": 1024, "local_gb": 19}),
            before: json!({}),
            after: after(json!({"extra": {"rule_success": "yes"}})),
            failure: None,
        },
        Case {
            source: "tempest basic_ops_rule.json, a diskless node",
            rules: basic,
            data: json!({"memory_mb": 1024, "local_gb": 0}),
            before: json!({}),
            after: after(json!({})),
            failure: None,
        },
        Case {
            source: "tempest discovery rule",
            rules: discovery.clone(),
            data: json!({"auto_discovered": true}),
            before: json!({"driver": "fake-hardware", "power_interface": "fake"}),
            // /driver implies reset_interfaces: the old driver's interfaces are forgotten.
            after: after(
                json!({"name": "node-0", "driver": "ipmi", "extra": {"discovered": "yes"}}),
            ),
            failure: None,
        },
        Case {
            source: "tempest discovery rule, an enrolled node",
            rules: discovery,
            data: json!({}),
            before: json!({"driver": "fake-hardware", "power_interface": "fake"}),
            after: after(json!({"driver": "fake-hardware", "power_interface": "fake"})),
            failure: None,
        },
    ]);
}
