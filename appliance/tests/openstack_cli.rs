//! Compatibility with the real OpenStack CLI: `python-openstackclient` with the
//! `python-ironic-inspector-client` plugin (pinned, in a venv made by
//! `scripts/openstack-venv.sh`), pointed at a running appliance with `--inspector-url` and no
//! authentication, runs every `openstack baremetal introspection …` command at the plugin's
//! default API version (it sends 1.0) and at the newest version it knows (1.13).

mod support;

use serde_json::{Value, json};
use support::*;

/// The venv's bin directory (made on first use; pip fetches from the package registry).
fn openstack_bin() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/openstack-venv.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .expect("run scripts/openstack-venv.sh");
    assert!(
        out.status.success(),
        "scripts/openstack-venv.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

struct Cli<'a> {
    ns: &'a Ns,
    bin: &'a str,
    version: &'a str,
}

impl Cli<'_> {
    /// Runs `openstack baremetal introspection ARGS` and returns its stdout; panics with
    /// the CLI's own error text when it fails.
    fn run(&self, args: &str) -> String {
        let cmd = format!(
            "{bin}/openstack --os-auth-type none --inspector-url {PUBLIC_URL} \
             --inspector-api-version {v} baremetal introspection {args}",
            bin = self.bin,
            v = self.version
        );
        let out = self.ns.sh(&cmd);
        assert!(
            out.status.success(),
            "`openstack baremetal introspection {args}` at {} failed:\n{}{}",
            self.version,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn json(&self, args: &str) -> Value {
        let text = self.run(&format!("{args} -f json"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args}: {e}: {text}"))
    }
}

#[test]
fn every_introspection_command_of_the_openstack_cli_works() {
    require(&["curl", "ip"]);
    let bin = openstack_bin();
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n[dhcp]\nenabled = false\n[tftp]\nenabled = false\n",
        scratch.path("data").display()
    );
    let _app = Appliance::start(&link.server, &scratch, &config);
    let api = |method: &str, path: &str, body: Option<&Value>| {
        let body = body.map(Value::to_string);
        http(&link.server, &scratch, method, path, body.as_deref(), &[])
    };
    for (i, version) in ["1", "1.13"].into_iter().enumerate() {
        let cli = Cli {
            ns: &link.server,
            bin: &bin,
            version,
        };
        let (name, mac) = (format!("rack1-u{i}"), format!("52:54:00:0c:00:1{i}"));
        let r = api(
            "POST",
            "/api/v1/nodes",
            Some(&json!({"name": name, "macs": [mac]})),
        );
        assert_eq!(r.status, 201, "{r:?}");
        let uuid = r.json()["uuid"].as_str().unwrap().to_string();

        // start, status, list
        cli.run(&format!("start {name}"));
        let s = cli.json(&format!("status {name}"));
        assert_eq!(
            (s["state"].as_str(), s["finished"].as_bool()),
            (Some("waiting"), Some(false)),
            "{s}"
        );
        let list = cli.json("list");
        assert!(
            list.as_array()
                .unwrap()
                .iter()
                .any(|n| n["UUID"] == uuid.as_str()),
            "{version}: {list}"
        );
        // The ramdisk posts its inventory; the CLI sees the result and the data.
        let r = api(
            "POST",
            "/v1/continue",
            Some(&inventory(&[&mac], 2, 1024, &[20])),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let s = cli.json(&format!("status {uuid}"));
        assert_eq!(
            (s["state"].as_str(), s["error"].clone()),
            (Some("finished"), Value::Null),
            "{s}"
        );
        let saved = scratch.path(&format!("data-{i}.json"));
        cli.run(&format!("data save {name} --file {}", saved.display()));
        let data: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
        assert_eq!(data["inventory"]["cpu"]["count"], 2);
        let ifaces = cli.json(&format!("interface list {name}"));
        assert_eq!(ifaces[0]["Interface"], "eth0", "{ifaces}");
        assert_eq!(ifaces[0]["MAC Address"], mac.as_str(), "{ifaces}");
        let iface = cli.json(&format!("interface show {name} eth0"));
        assert_eq!(iface["mac"], mac.as_str(), "{iface}");
        // reprocess: the stored data is processed again.
        cli.run(&format!("reprocess {name}"));
        let s = cli.json(&format!("status {name}"));
        assert_eq!(s["state"], "finished", "{s}");
        // abort a second introspection
        cli.run(&format!("start {uuid}"));
        cli.run(&format!("abort {name}"));
        let s = cli.json(&format!("status {name}"));
        assert_eq!(
            (s["state"].as_str(), s["error"].as_str()),
            (Some("error"), Some("Canceled by operator")),
            "{s}"
        );

        // rules: import (a list, as the docs write them), list, show, delete, purge
        let rules = scratch.path(&format!("rules-{i}.json"));
        let imported = json!([
            {"description": "big memory", "conditions": [
                {"op": "ge", "field": "memory_mb", "value": 1024}],
             "actions": [{"action": "set-capability", "name": "profile", "value": "large"}]},
            {"uuid": format!("5b4c3a2d-1e0f-4a9b-8c7d-00000000000{i}"), "description": "always",
             "conditions": [], "actions": [{"action": "add-trait", "name": "CUSTOM_SEEN"}]}
        ]);
        std::fs::write(&rules, imported.to_string()).unwrap();
        let made = cli.json(&format!("rule import {}", rules.display()));
        assert_eq!(made.as_array().unwrap().len(), 2, "{made}");
        let listed = cli.json("rule list");
        assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
        let fixed = format!("5b4c3a2d-1e0f-4a9b-8c7d-00000000000{i}");
        let shown = cli.json(&format!("rule show {fixed}"));
        assert_eq!(shown["description"], "always", "{shown}");
        assert_eq!(shown["actions"][0]["action"], "add-trait", "{shown}");
        cli.run(&format!("rule delete {fixed}"));
        assert_eq!(cli.json("rule list").as_array().unwrap().len(), 1);
        cli.run("rule purge");
        assert_eq!(cli.json("rule list").as_array().unwrap().len(), 0);
    }
}
