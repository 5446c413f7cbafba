//! The Ironic-Inspector-v1-compatible API against a running appliance: every route, the
//! status codes, the microversion headers and the error body shape.

mod support;

use serde_json::{Value, json};
use support::*;

const VERSION: &str = "X-OpenStack-Ironic-Inspector-API-Version";

struct Api {
    link: Link,
    scratch: Scratch,
    _app: Appliance,
}

impl Api {
    fn start(extra: &str) -> Self {
        Self::start_with_http("", extra)
    }

    /// `http` goes into the `[http]` table, `extra` after everything.
    fn start_with_http(http: &str, extra: &str) -> Self {
        let link = Link::new();
        let scratch = Scratch::new(&link.tag);
        let config = format!(
            "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n{http}[dhcp]\nenabled = false\n[tftp]\nenabled = false\n{extra}",
            scratch.path("data").display()
        );
        let app = Appliance::start(&link.server, &scratch, &config);
        Api {
            link,
            scratch,
            _app: app,
        }
    }
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let body = body.map(|b| b.to_string());
        http(
            &self.link.server,
            &self.scratch,
            method,
            path,
            body.as_deref(),
            headers,
        )
    }
    fn get(&self, path: &str) -> Resp {
        self.call("GET", path, None, &[])
    }
    fn post(&self, path: &str, body: &Value) -> Resp {
        self.call("POST", path, Some(body), &[])
    }
    fn raw(&self, path: &str, body: &str) -> Resp {
        http(
            &self.link.server,
            &self.scratch,
            "POST",
            path,
            Some(body),
            &[],
        )
    }
    fn node_count(&self) -> usize {
        self.get("/api/v1/nodes").json().as_array().unwrap().len()
    }
    fn create(&self, name: &str, macs: &[&str]) -> String {
        let r = self.post("/api/v1/nodes", &json!({"name": name, "macs": macs}));
        assert_eq!(r.status, 201, "{r:?}");
        r.json()["uuid"].as_str().unwrap().to_string()
    }
}

#[test]
fn versions_and_microversion_headers() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let r = api.get("/");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["versions"][0]["id"], "1.18");
    assert_eq!(
        r.header("X-OpenStack-Ironic-Inspector-API-Minimum-Version"),
        Some("1.0")
    );
    assert_eq!(
        r.header("X-OpenStack-Ironic-Inspector-API-Maximum-Version"),
        Some("1.18")
    );
    let r = api.get("/v1");
    assert_eq!(r.status, 200);
    let index = r.json();
    let names: Vec<&str> = index["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["introspection", "continue", "rules"]);
    for (v, status, text) in [
        ("1.x", 400, "Malformed API version"),
        ("2.0", 406, "Unsupported API version"),
        ("1.19", 406, "supported range is 1.0 to 1.18"),
    ] {
        let r = api.call("GET", "/v1/introspection", None, &[(VERSION, v)]);
        assert_eq!(r.status, status, "{v}");
        assert!(r.error().contains(text), "{v}: {}", r.body);
        assert_eq!(
            r.header("X-OpenStack-Ironic-Inspector-API-Maximum-Version"),
            Some("1.18"),
            "headers on errors too"
        );
    }
    assert_eq!(
        api.call("GET", "/v1/introspection", None, &[(VERSION, "latest")])
            .status,
        200
    );
    // Inspector serves every endpoint at every version in its range (main.py checks only the
    // range): the OpenStack CLI sends 1.0 by default and still lists statuses.
    for v in ["1.0", "1.7"] {
        let r = api.call("GET", "/v1/introspection", None, &[(VERSION, v)]);
        assert_eq!(r.status, 200, "{v}: {}", r.body);
    }
}

#[test]
fn introspection_lifecycle() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let mac = "52:54:00:aa:00:01";
    let uuid = api.create("r1u1", &[mac]);
    let r = api.get(&format!("/v1/introspection/{uuid}"));
    assert_eq!(r.status, 404, "never introspected");
    assert!(r.error().contains("Could not find node"));
    assert_eq!(api.get("/v1/introspection/no-such-node").status, 404);
    let r = api.call(
        "POST",
        "/v1/introspection/r1u1?manage_boot=maybe",
        None,
        &[],
    );
    assert_eq!(r.status, 400);
    assert!(r.error().contains("manage_boot"));
    let r = api.call("POST", "/v1/introspection/r1u1", None, &[]);
    assert_eq!((r.status, r.body.as_str()), (202, "{}"));
    // Status by UUID and by name (names need 1.5).
    let s = api.get(&format!("/v1/introspection/{uuid}")).json();
    assert_eq!(
        (s["state"].as_str(), s["finished"].as_bool()),
        (Some("waiting"), Some(false))
    );
    assert!(
        s["started_at"].as_str().unwrap().len() == 19
            && s["finished_at"].is_null()
            && s["error"].is_null()
    );
    assert!(
        s["links"][0]["href"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v1/introspection/{uuid}"))
    );
    assert_eq!(api.get("/v1/introspection/r1u1").status, 200);
    assert_eq!(
        api.call("GET", "/v1/introspection/r1u1", None, &[(VERSION, "1.0")])
            .status,
        200,
        "names at every version (node_cache.get_node)"
    );
    let old = api
        .call(
            "GET",
            &format!("/v1/introspection/{uuid}"),
            None,
            &[(VERSION, "1.6")],
        )
        .json();
    assert!(
        old["state"] == "waiting" && old["uuid"] == uuid.as_str(),
        "generate_introspection_status sends every field at every version: {old}"
    );
    // The ramdisk posts: processed, finished.
    let r = api.post(
        "/v1/continue",
        &inventory(&[mac, "52:54:00:aa:00:02"], 2, 512, &[10, 20]),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["uuid"], uuid.as_str());
    let s = api.get(&format!("/v1/introspection/{uuid}")).json();
    assert_eq!(
        (s["state"].as_str(), s["finished"].as_bool()),
        (Some("finished"), Some(true))
    );
    let d = api.get(&format!("/v1/introspection/{uuid}/data"));
    assert_eq!(d.status, 200);
    let d = d.json();
    assert_eq!(
        (
            d["cpus"].as_u64(),
            d["memory_mb"].as_u64(),
            d["local_gb"].as_u64()
        ),
        (Some(2), Some(512), Some(9))
    );
    assert_eq!(d["root_disk"]["name"], "/dev/vda");
    assert_eq!(d["macs"], json!([mac]));
    let raw = api.get(&format!("/v1/introspection/{uuid}/data/unprocessed"));
    assert_eq!(raw.status, 200);
    assert!(
        raw.json().get("all_interfaces").is_none(),
        "unprocessed is as posted"
    );
    assert_eq!(
        api.call(
            "GET",
            &format!("/v1/introspection/{uuid}/data/unprocessed"),
            None,
            &[(VERSION, "1.0")]
        )
        .status,
        200,
        "served at every version"
    );
    // The node now knows both NICs and its properties.
    let n = api.get(&format!("/api/v1/nodes/{uuid}")).json();
    assert_eq!(n["macs"].as_array().unwrap().len(), 2);
    assert_eq!(n["properties"]["cpus"], 2);
    assert!(
        n["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "introspection-finished")
    );
    // Reapply stored data, and with a body (1.15).
    assert_eq!(
        api.call(
            "POST",
            &format!("/v1/introspection/{uuid}/data/unprocessed"),
            None,
            &[]
        )
        .status,
        202
    );
    let r = api.post(
        &format!("/v1/introspection/{uuid}/data/unprocessed"),
        &inventory(&[mac], 8, 4096, &[50]),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        api.get(&format!("/api/v1/nodes/{uuid}")).json()["properties"]["cpus"],
        8
    );
    assert_eq!(
        api.raw(&format!("/v1/introspection/{uuid}/data/unprocessed"), "[1]")
            .status,
        400
    );
    // Listing: filters, marker, limit.
    let other = api.create("r1u2", &["52:54:00:aa:00:03"]);
    assert_eq!(
        api.call("POST", &format!("/v1/introspection/{other}"), None, &[])
            .status,
        202
    );
    let l = api.get("/v1/introspection").json();
    assert_eq!(l["introspection"].as_array().unwrap().len(), 2);
    let l = api.get("/v1/introspection?state=waiting").json();
    assert_eq!(l["introspection"].as_array().unwrap().len(), 1);
    assert_eq!(l["introspection"][0]["uuid"], other.as_str());
    let l = api.get("/v1/introspection?limit=1").json();
    let first = l["introspection"][0]["uuid"].as_str().unwrap().to_string();
    let l = api.get(&format!("/v1/introspection?marker={first}")).json();
    assert_eq!(l["introspection"].as_array().unwrap().len(), 1);
    assert_ne!(l["introspection"][0]["uuid"], first.as_str());
    for bad in [
        "state=bogus",
        "limit=abc",
        "limit=5000",
        "marker=00000000-0000-0000-0000-000000000009",
        "marker=nope",
    ] {
        let r = api.get(&format!("/v1/introspection?{bad}"));
        assert_eq!(r.status, 400, "{bad}");
        r.error();
    }
    assert_eq!(
        api.call(
            "GET",
            "/v1/introspection?state=waiting",
            None,
            &[(VERSION, "1.0")]
        )
        .status,
        200
    );
    // Abort: a waiting node is aborted; its ramdisk's inventory is then refused.
    assert_eq!(
        api.call(
            "POST",
            &format!("/v1/introspection/{other}/abort"),
            None,
            &[]
        )
        .status,
        202
    );
    let s = api.get(&format!("/v1/introspection/{other}")).json();
    assert_eq!(
        (s["state"].as_str(), s["error"].as_str()),
        (Some("error"), Some("Canceled by operator"))
    );
    let r = api.post(
        "/v1/continue",
        &inventory(&["52:54:00:aa:00:03"], 1, 256, &[]),
    );
    assert_eq!(r.status, 400);
    assert!(r.error().contains("not under introspection"), "{}", r.body);
    let s = api.get(&format!("/v1/introspection/{other}")).json();
    assert_eq!(
        s["error"], "Canceled by operator",
        "the refused post changed nothing"
    );
    // Aborting what is not running is refused; aborting an unknown node is 404.
    assert_eq!(
        api.call(
            "POST",
            &format!("/v1/introspection/{uuid}/abort"),
            None,
            &[]
        )
        .status,
        400
    );
    assert_eq!(
        api.call("POST", "/v1/introspection/ghost/abort", None, &[])
            .status,
        404
    );
    assert_eq!(api.get("/v1/introspection/ghost/data").status, 404);
}

#[test]
fn continue_refuses_bad_bodies_and_changes_nothing() {
    require(&["curl", "ip"]);
    let api = Api::start("[inspector]\nmax_body_bytes = 20000\n");
    let cases: &[(&str, u16, &str)] = &[
        ("{not json", 400, "not valid JSON"),
        ("[1, 2]", 400, "must be a JSON object"),
        ("{}", 400, "Hardware inventory is empty or missing"),
        // Inspector runs `ramdisk_error` first: the ramdisk's own error is what is reported.
        (
            r#"{"error": "collector disks: /sys/block unreadable"}"#,
            400,
            "Ramdisk reported error: collector disks: /sys/block unreadable",
        ),
        (
            r#"{"inventory": {"interfaces": []}}"#,
            400,
            "No network interfaces provided",
        ),
        (r#"{"inventory": {"interfaces": "eth0"}}"#, 400, "IPA shape"),
        (
            r#"{"inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01"}], "disks": {"sda": 1}}}"#,
            400,
            "IPA shape",
        ),
        (
            r#"{"inventory": {"interfaces": [{"name": "lo"}]}}"#,
            400,
            "No suitable interfaces",
        ),
    ];
    for (body, status, text) in cases {
        let r = api.raw("/v1/continue", body);
        assert_eq!(r.status, *status, "{body}: {}", r.body);
        assert!(r.error().contains(text), "{body}: {}", r.body);
    }
    let big = format!(
        r#"{{"inventory": {{"interfaces": [], "pad": "{}"}}}}"#,
        "x".repeat(30_000)
    );
    let r = api.raw("/v1/continue", &big);
    assert_eq!(r.status, 413);
    assert!(r.error().contains("larger than 20000 bytes"));
    assert_eq!(api.node_count(), 0, "no bad body created a node");
}

#[test]
fn unknown_machines_are_enrolled_once_and_ramdisk_errors_end_in_error() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let body = inventory(&["52:54:00:bb:00:01"], 4, 2048, &[40]);
    let r = api.post("/v1/continue", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let uuid = r.json()["uuid"].as_str().unwrap().to_string();
    // The same post again (an agent retrying after a lost answer) gets the same node.
    let again = api.post("/v1/continue", &body);
    assert_eq!(
        (again.status, again.json()["uuid"].as_str()),
        (200, Some(uuid.as_str()))
    );
    assert_eq!(api.node_count(), 1);
    let n = api.get(&format!("/api/v1/nodes/{uuid}")).json();
    assert_eq!(n["auto_discovered"], true);
    assert_eq!(n["introspection"]["state"], "finished");
    let kinds: Vec<&str> = n["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    for k in [
        "enrolled",
        "inventory-received",
        "hooks",
        "introspection-finished",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    // A ramdisk that reports an error: the machine is enrolled and ends in error with it.
    let mut failing = inventory(&["52:54:00:bb:00:02"], 1, 512, &[]);
    failing["error"] = json!("collector disks: /sys/block unreadable");
    let r = api.post("/v1/continue", &failing);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("collector disks: /sys/block unreadable"));
    let nodes = api.get("/api/v1/nodes").json();
    let failed = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["macs"][0] == "52:54:00:bb:00:02")
        .expect("enrolled");
    assert_eq!(failed["introspection"]["state"], "error");
    assert_eq!(
        failed["introspection"]["error"],
        "Ramdisk reported error: collector disks: /sys/block unreadable"
    );
}

#[test]
fn auto_enrolment_can_be_turned_off() {
    require(&["curl", "ip"]);
    let api = Api::start("[inspector]\nauto_enrol = false\n");
    let r = api.post(
        "/v1/continue",
        &inventory(&["52:54:00:cc:00:01"], 1, 512, &[]),
    );
    assert_eq!(r.status, 400);
    assert!(r.error().contains("Could not find a node"), "{}", r.body);
    assert_eq!(api.node_count(), 0);
}

#[test]
fn rules_crud_and_effect() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let bad = api.post("/v1/rules", &json!({"conditions": [], "actions": []}));
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.error(),
        "Validation failed for actions: [] is too short"
    );
    assert_eq!(api.raw("/v1/rules", "{oops").status, 400);
    let rule = json!({
        "uuid": "7f3a8c52-1e2b-4c7d-9a6e-000000000001",
        "description": "tag big machines",
        "conditions": [{"op": "ge", "field": "memory_mb", "value": 1024}],
        "actions": [{"action": "set-attribute", "path": "/extra/size", "value": "big-{data[cpus]}"}]
    });
    let r = api.post("/v1/rules", &rule);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["conditions"][0]["multiple"], "any");
    assert_eq!(r.json()["conditions"][0]["invert"], false);
    assert_eq!(api.post("/v1/rules", &rule).status, 409, "duplicate UUID");
    let mut older = rule.clone();
    older["uuid"] = json!("7f3a8c52-1e2b-4c7d-9a6e-000000000002");
    assert_eq!(
        api.call("POST", "/v1/rules", Some(&older), &[(VERSION, "1.5")])
            .status,
        200,
        "201 only from 1.6"
    );
    assert_eq!(
        api.call("GET", "/v1/rules", None, &[(VERSION, "1.0")])
            .status,
        200
    );
    let list = api.get("/v1/rules").json();
    assert_eq!(list["rules"].as_array().unwrap().len(), 2);
    assert!(list["rules"][0].get("conditions").is_none(), "short form");
    let one = api.get("/v1/rules/7f3a8c52-1e2b-4c7d-9a6e-000000000001");
    assert_eq!(
        (one.status, one.json()["description"].as_str()),
        (200, Some("tag big machines"))
    );
    // The rule runs on processing.
    let r = api.post(
        "/v1/continue",
        &inventory(&["52:54:00:dd:00:01"], 3, 2048, &[8]),
    );
    let uuid = r.json()["uuid"].as_str().unwrap().to_string();
    assert_eq!(
        api.get(&format!("/api/v1/nodes/{uuid}")).json()["extra"]["size"],
        "big-3"
    );
    let d = api.call(
        "DELETE",
        "/v1/rules/7f3a8c52-1e2b-4c7d-9a6e-000000000001",
        None,
        &[],
    );
    // Inspector's Flask sends `Content-Length: 0`; hyper drops the header on 204 as RFC 9110
    // requires, and the body is empty either way.
    assert_eq!((d.status, d.body.as_str()), (204, ""));
    let d = api.call(
        "DELETE",
        "/v1/rules/7f3a8c52-1e2b-4c7d-9a6e-000000000001",
        None,
        &[],
    );
    assert_eq!(d.status, 404);
    assert!(d.error().contains("not found"));
    assert_eq!(api.call("DELETE", "/v1/rules", None, &[]).status, 204);
    assert_eq!(api.get("/v1/rules").json()["rules"], json!([]));
    // A failing rule ends processing in error.
    api.post(
        "/v1/rules",
        &json!({"actions": [{"action": "fail", "message": "no machines today"}]}),
    );
    let r = api.post(
        "/v1/continue",
        &inventory(&["52:54:00:dd:00:02"], 1, 512, &[]),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error(), "no machines today");
}

#[test]
fn introspection_times_out() {
    require(&["curl", "ip"]);
    let api = Api::start("[inspector]\ntimeout_secs = 10\nclean_up_period_secs = 1\n");
    let uuid = api.create("slow", &["52:54:00:ee:00:01"]);
    assert_eq!(
        api.call("POST", "/v1/introspection/slow", None, &[]).status,
        202
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = api.get(&format!("/v1/introspection/{uuid}")).json();
        if s["state"] == "error" {
            assert_eq!(s["error"], "Introspection timeout");
            assert_eq!(s["finished"], true);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no timeout: {s}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

#[test]
fn agent_endpoints() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let uuid = api.create("agent", &["52:54:00:ff:00:01"]);
    api.call("POST", "/v1/introspection/agent", None, &[]);
    assert_eq!(
        api.get(&format!("/api/v1/agent/{uuid}/next")).json()["action"],
        "wait"
    );
    let r = api.post(
        "/api/v1/agent/events",
        &json!({"mac": "52:54:00:ff:00:01", "step": "booted", "message": "ramdisk up"}),
    );
    assert_eq!(r.status, 204);
    assert_eq!(
        api.post("/api/v1/agent/events", &json!({"mac": "zz", "step": "x"}))
            .status,
        400
    );
    api.post(
        "/v1/continue",
        &inventory(&["52:54:00:ff:00:01"], 1, 512, &[]),
    );
    assert_eq!(
        api.get(&format!("/api/v1/agent/{uuid}/next")).json()["action"],
        "poweroff"
    );
    assert_eq!(api.get("/api/v1/agent/ghost/next").status, 404);
    let n = api.get(&format!("/api/v1/nodes/{uuid}")).json();
    assert!(
        n["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "ramdisk-booted" && e["message"] == "ramdisk up")
    );
}

#[test]
fn console_and_cli_show_nodes_and_timelines() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    // Text from the machine (its inventory) is untrusted: the console escapes it.
    let mut inv = inventory(&["52:54:00:12:00:01"], 2, 1024, &[16]);
    inv["inventory"]["system_vendor"]["product_name"] = json!("<b>bold</b>");
    let r = api.post("/v1/continue", &inv);
    let uuid = r.json()["uuid"].as_str().unwrap().to_string();
    let hostile = api.post(
        "/api/v1/nodes",
        &json!({"name": "<b>bold</b>", "macs": ["52:54:00:12:00:02"]}),
    );
    assert_eq!(hostile.status, 400, "names are Ironic's logical names");
    let list = api.get("/ui");
    assert_eq!(list.status, 200);
    assert!(
        list.body.contains(&uuid) && list.body.contains("finished"),
        "{}",
        list.body
    );
    let detail = api.get(&format!("/ui/nodes/{uuid}"));
    assert_eq!(detail.status, 200);
    assert!(
        detail.body.contains("&lt;b&gt;bold&lt;/b&gt;") && !detail.body.contains("<b>bold</b>"),
        "inventory text is escaped: {}",
        detail.body
    );
    for needle in [
        "Hardware",
        "Raw inventory",
        "QEMU",
        "1.0 GiB",
        "/dev/vda",
        "52:54:00:12:00:01",
        "Timeline",
        "inventory-received",
        "introspection-finished",
    ] {
        assert!(
            detail.body.contains(needle),
            "{needle} missing from the node page"
        );
    }
    assert_eq!(api.get("/ui/nodes/ghost").status, 404);
    // The CLI against the same API.
    let bin = env!("CARGO_BIN_EXE_paddock");
    let out = api
        .link
        .server
        .sh_ok(&format!("{bin} node list --api {PUBLIC_URL}"));
    assert!(out.contains(&uuid) && out.contains("finished"), "{out}");
    let out = api
        .link
        .server
        .sh_ok(&format!("{bin} node show {uuid} --api {PUBLIC_URL}"));
    assert!(
        out.contains("introspection-finished") && out.contains("\"memory_mb\":1024"),
        "{out}"
    );
    let r = api
        .link
        .server
        .sh(&format!("{bin} node inspect ghost --api {PUBLIC_URL}"));
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("404: Could not find node ghost"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    api.link
        .server
        .sh_ok(&format!("{bin} node inspect {uuid} --api {PUBLIC_URL}"));
    assert_eq!(
        api.get(&format!("/v1/introspection/{uuid}")).json()["state"],
        "waiting"
    );
    api.link
        .server
        .sh_ok(&format!("{bin} node abort {uuid} --api {PUBLIC_URL}"));
    assert_eq!(
        api.get(&format!("/v1/introspection/{uuid}")).json()["error"],
        "Canceled by operator"
    );
}

/// A batch load: 200 machines post their inventories at once; every one is enrolled
/// exactly once and no request fails. The throughput is printed (a figure, not a pass mark).
#[test]
fn two_hundred_machines_enrol_at_once() {
    require(&["curl", "ip", "xargs"]);
    // Two hundred machines from one namespace share one address: on a real network each has
    // its own, so the per-source connection cap is lifted here.
    let api = Api::start_with_http("max_connections_per_source = 0\n", "");
    let dir = api.scratch.path("inventories");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..200u32 {
        let macs = [
            format!("52:54:01:{:02x}:{:02x}:01", i / 256, i % 256),
            format!("52:54:01:{:02x}:{:02x}:02", i / 256, i % 256),
        ];
        let body = inventory(
            &[&macs[0], &macs[1]],
            1 + i % 8,
            1024 * (1 + u64::from(i % 4)),
            &[20, 40],
        );
        std::fs::write(dir.join(format!("{i:03}.json")), body.to_string()).unwrap();
    }
    let started = std::time::Instant::now();
    let out = api.link.server.sh_ok(&format!(
        "ls {d}/*.json | xargs -P 200 -I{{}} curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Content-Type: application/json' --data-binary @{{}} {PUBLIC_URL}/v1/continue",
        d = dir.display()
    ));
    let took = started.elapsed();
    let codes: Vec<&str> = out.lines().collect();
    assert_eq!(codes.len(), 200);
    assert!(
        codes.iter().all(|c| *c == "200"),
        "non-200 answers: {:?}",
        codes.iter().filter(|c| **c != "200").collect::<Vec<_>>()
    );
    println!(
        "200 concurrent /v1/continue: {:.2} s, {:.0} inventories/s",
        took.as_secs_f64(),
        200.0 / took.as_secs_f64()
    );
    let nodes = api.get("/api/v1/nodes").json();
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), 200, "each machine enrolled exactly once");
    assert!(
        nodes
            .iter()
            .all(|n| n["introspection"]["state"] == "finished"
                && n["macs"].as_array().unwrap().len() == 2)
    );
}

impl Api {
    fn patch(&self, node: &str, ops: &Value) -> Resp {
        self.call("PATCH", &format!("/api/v1/nodes/{node}"), Some(ops), &[])
    }
    fn node(&self, ident: &str) -> Value {
        let r = self.get(&format!("/api/v1/nodes/{ident}"));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }
    fn rule(&self, rule: &Value) {
        let r = self.post("/v1/rules", rule);
        assert_eq!(r.status, 201, "{rule}: {}", r.body);
    }
    fn introspect(&self, node: &str) {
        let r = self.call("POST", &format!("/v1/introspection/{node}"), None, &[]);
        assert_eq!(r.status, 202, "{}", r.body);
    }
}

/// Difference 1: `set-attribute` of the paths rules use to give a machine its BMC and
/// driver, which Inspector sends to Ironic as a node PATCH (`plugins/rules.py`
/// `SetAttributeAction`), is kept — BMC settings typed, the rest of `driver_info` and other
/// Ironic attributes as given — or refused with Ironic's message, never dropped. Rules:
/// Inspector's `doc/source/user/usage.rst` ("Set IPMI driver_info if no credentials", "Set
/// deploy info if not already set on node"), `test/functional.py`
/// `test_conditions_scheme_actions_path` (`/driver_info/ipmi_address` from
/// `{data[inventory][bmc_address]}`), Kayobe's Redfish rules
/// (`ansible/inventory/group_vars/all/inspector`, before its move to Ironic's rules).
#[test]
fn set_attribute_keeps_bmc_settings_and_ironic_attributes() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    for rule in [
        json!({
            "description": "Set IPMI driver_info if no credentials",
            "actions": [
                {"action": "set-attribute", "path": "driver", "value": "ipmi"},
                {"action": "set-attribute", "path": "driver_info/ipmi_username", "value": "username"},
                {"action": "set-attribute", "path": "driver_info/ipmi_password", "value": "password"}
            ],
            "conditions": [
                {"op": "is-empty", "field": "node://driver_info.ipmi_password"},
                {"op": "is-empty", "field": "node://driver_info.ipmi_username"}
            ]
        }),
        json!({
            "description": "Set deploy info if not already set on node",
            "actions": [
                {"action": "set-attribute", "path": "driver_info/deploy_kernel", "value": "<glance uuid>"},
                {"action": "set-attribute", "path": "driver_info/deploy_ramdisk", "value": "<glance uuid>"}
            ],
            "conditions": [
                {"op": "is-empty", "field": "node://driver_info.deploy_ramdisk"},
                {"op": "is-empty", "field": "node://driver_info.deploy_kernel"}
            ]
        }),
        json!({
            "conditions": [{"field": "data://inventory.cpu.count", "op": "eq", "value": 4}],
            "actions": [{"action": "set-attribute", "path": "/driver_info/ipmi_address",
                         "value": "{data[inventory][bmc_address]}"}]
        }),
        json!({
            "description": "Set Redfish address",
            "conditions": [{"field": "node://driver_info.redfish_address", "op": "is-empty"}],
            "actions": [{"action": "set-attribute", "path": "driver_info/redfish_address",
                         "value": "{data[inventory][bmc_address]}"}]
        }),
        json!({
            "description": "Set Redfish Verify CA",
            "conditions": [{"field": "node://driver_info.redfish_verify_ca", "op": "is-empty"}],
            "actions": [{"action": "set-attribute", "path": "driver_info/redfish_verify_ca", "value": true}]
        }),
        json!({"actions": [{"action": "set-attribute", "path": "/resource_class", "value": "baremetal"}]}),
    ] {
        api.rule(&rule);
    }
    let mut body = inventory(&["52:54:00:a0:00:01"], 4, 2048, &[40]);
    body["inventory"]["bmc_address"] = json!("192.0.2.55");
    let r = api.post("/v1/continue", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let n = api.node(r.json()["uuid"].as_str().unwrap());
    assert_eq!(n["introspection"]["state"], "finished");
    assert_eq!(n["driver"], "ipmi");
    assert_eq!(n["resource_class"], "baremetal");
    assert_eq!(
        n["driver_info"],
        json!({
            "deploy_kernel": "<glance uuid>",
            "deploy_ramdisk": "<glance uuid>",
            "redfish_verify_ca": true,
            "ipmi_address": "192.0.2.55",
            "ipmi_username": "username",
            "ipmi_password": "******",
            "redfish_address": "192.0.2.55"
        }),
        "BMC settings kept (the password masked in answers, as Ironic shows it)"
    );
    // What Ironic would refuse fails processing with its message (Inspector: 500).
    api.call("DELETE", "/v1/rules", None, &[]);
    api.rule(
        &json!({"actions": [{"action": "set-attribute", "path": "/chassis_uuid", "value": "x"}]}),
    );
    let r = api.post(
        "/v1/continue",
        &inventory(&["52:54:00:a0:00:02"], 1, 512, &[]),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "Unexpected exception BadRequestException during processing: Cannot patch /chassis_uuid: Paddock has no chassis"
    );
    // A name another node has: Ironic answers 409 and Inspector fails; the node keeps its
    // own name and ends in error (not stuck waiting on a write that cannot succeed).
    api.create("taken", &["52:54:00:a0:00:09"]);
    api.call("DELETE", "/v1/rules", None, &[]);
    api.rule(&json!({"actions": [
        {"action": "set-attribute", "path": "/extra/before", "value": 1},
        {"action": "set-attribute", "path": "/name", "value": "taken"}
    ]}));
    let r = api.post(
        "/v1/continue",
        &inventory(&["52:54:00:a0:00:03"], 1, 512, &[]),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "Unexpected exception ConflictException during processing: A node with name taken already exists."
    );
    let n = api
        .get("/api/v1/nodes")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["macs"][0] == "52:54:00:a0:00:03")
        .cloned()
        .unwrap();
    assert_eq!(
        (
            n["name"].clone(),
            n["extra"]["before"].clone(),
            n["introspection"]["state"].clone()
        ),
        (json!(null), json!(1), json!("error"))
    );
}

/// Difference 2: nodes are prepared before introspection with Ironic's node PATCH
/// (`api/controllers/v1/node.py` `patch`; JSON patch as python-json-patch applies it) and
/// `paddock node set`; rules see what was set. Scope as Inspector's `usage.rst` ("Scope")
/// and `rules.py` `check_scope` describe it; operator capabilities kept through the
/// `capabilities` hook (`update_capabilities`).
#[test]
fn nodes_are_prepared_with_ironic_patch() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let gpu = api.create("gpu1", &["52:54:00:a1:00:01"]);
    api.create("cpu1", &["52:54:00:a1:00:02"]);
    let r = api.patch(
        "gpu1",
        &json!([
            {"op": "add", "path": "/properties/inspection_scope", "value": "gpu"},
            {"op": "add", "path": "/properties/capabilities", "value": "profile:compute,boot_option:local"},
            {"op": "add", "path": "/extra/rack", "value": "r1"},
            {"op": "add", "path": "/driver", "value": "ipmi"},
            {"op": "add", "path": "/driver_info/ipmi_address", "value": "192.0.2.70"},
            {"op": "add", "path": "/driver_info/ipmi_password", "value": "s3cret"},
            {"op": "add", "path": "/resource_class", "value": "baremetal.gpu"}
        ]),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let n = r.json();
    assert_eq!(n["uuid"], gpu.as_str());
    assert_eq!(n["properties"]["inspection_scope"], "gpu");
    assert_eq!(n["extra"]["rack"], "r1");
    assert_eq!(n["driver_info"]["ipmi_address"], "192.0.2.70");
    assert_eq!(n["driver_info"]["ipmi_password"], "******");
    assert_eq!(n["resource_class"], "baremetal.gpu");
    // Ironic's refusals, in Ironic's error shape (and Paddock's); nothing of them applies.
    let cases = [
        (
            json!([{"op": "replace", "path": "/uuid", "value": "x"}]),
            400,
            "Cannot patch /uuid. Only the following can be updated: ",
        ),
        (
            json!([{"op": "add", "path": "/extra/rack", "value": "r9"}, {"op": "add", "path": "/name", "value": "not valid"}]),
            400,
            "Node gpu1: Cannot change name to invalid name 'not valid'",
        ),
        (
            json!([{"op": "add", "path": "/extra/rack", "value": "r9"}, {"op": "add", "path": "/extra/a/b", "value": 1}]),
            400,
            "Couldn't apply patch '{'op': 'add', 'path': '/extra/a/b', 'value': 1}'. Reason: member 'a' not found in {'rack': 'r9'}",
        ),
        (
            json!([{"op": "move", "path": "/extra/rack"}]),
            400,
            "Schema error for patch: 'move' is not one of ['add', 'replace', 'remove']",
        ),
        (
            json!([{"op": "add", "path": "/macs/-", "value": "52:54:00:a1:00:02"}]),
            409,
            "A port with MAC address 52:54:00:a1:00:02 already exists.",
        ),
        (
            json!([{"op": "add", "path": "/name", "value": "cpu1"}]),
            409,
            "A node with name cpu1 already exists.",
        ),
    ];
    for (ops, status, text) in cases {
        let r = api.patch("gpu1", &ops);
        assert_eq!(r.status, status, "{ops}: {}", r.body);
        assert!(r.error().starts_with(text), "{ops}: {}", r.body);
        let fault: Value =
            serde_json::from_str(r.json()["error_message"].as_str().unwrap()).unwrap();
        assert_eq!(
            (fault["faultstring"].as_str(), fault["faultcode"].as_str()),
            (Some(r.error().as_str()), Some("Client"))
        );
    }
    assert_eq!(
        api.node("gpu1")["extra"],
        json!({"rack": "r1"}),
        "all or nothing"
    );
    let r = api.patch("ghost", &json!([]));
    assert_eq!(
        (r.status, r.error().as_str()),
        (404, "Node ghost could not be found.")
    );
    // MACs through PATCH keep the MAC index: a MAC added is taken, a MAC removed is free.
    assert_eq!(
        api.patch(
            "gpu1",
            &json!([{"op": "add", "path": "/macs/-", "value": "52:54:00:a1:00:09"}])
        )
        .status,
        200
    );
    assert_eq!(
        api.post("/api/v1/nodes", &json!({"macs": ["52:54:00:a1:00:09"]}))
            .status,
        409
    );
    assert_eq!(
        api.patch("gpu1", &json!([{"op": "remove", "path": "/macs/1"}]))
            .status,
        200
    );
    assert_eq!(
        api.post("/api/v1/nodes", &json!({"macs": ["52:54:00:a1:00:09"]}))
            .status,
        201
    );
    // The CLI, as `baremetal node set`.
    let bin = env!("CARGO_BIN_EXE_paddock");
    let out = api.link.server.sh_ok(&format!(
        "{bin} node set cpu1 --api {PUBLIC_URL} --property inspection_scope=cpu --property memory_mb=1024 \
         --driver redfish --driver-info redfish_address=https://192.0.2.71 --extra 'tags=[\"a\"]'"
    ));
    assert!(out.contains("node cpu1 updated"), "{out}");
    let cpu = api.node("cpu1");
    assert_eq!(
        cpu["properties"],
        json!({"inspection_scope": "cpu", "memory_mb": 1024})
    );
    assert_eq!(cpu["driver"], "redfish");
    assert_eq!(cpu["driver_info"]["redfish_address"], "https://192.0.2.71");
    assert_eq!(cpu["extra"]["tags"], json!(["a"]));
    assert!(
        cpu["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "updated")
    );
    let r = api.link.server.sh(&format!(
        "{bin} node set cpu1 --api {PUBLIC_URL} --name 'bad name'"
    ));
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr)
            .contains("400: Node cpu1: Cannot change name to invalid name 'bad name'")
    );
    // Rules see what was set: a scoped rule applies to nodes of its scope only.
    api.rule(&json!({"description": "gpu only", "scope": "gpu",
        "actions": [{"action": "set-attribute", "path": "/extra/scoped", "value": "yes"}]}));
    api.rule(&json!({"description": "everyone",
        "conditions": [{"op": "eq", "field": "node://driver_info.ipmi_address", "value": "192.0.2.70"}],
        "actions": [{"action": "set-attribute", "path": "/extra/bmc_known", "value": "yes"}]}));
    for (node, mac) in [("gpu1", "52:54:00:a1:00:01"), ("cpu1", "52:54:00:a1:00:02")] {
        api.introspect(node);
        let r = api.post("/v1/continue", &inventory(&[mac], 2, 1024, &[20]));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let (g, c) = (api.node("gpu1"), api.node("cpu1"));
    assert_eq!(
        (g["extra"]["scoped"].as_str(), c["extra"].get("scoped")),
        (Some("yes"), None)
    );
    assert_eq!(
        (
            g["extra"]["bmc_known"].as_str(),
            c["extra"].get("bmc_known")
        ),
        (Some("yes"), None)
    );
    assert_eq!(
        g["properties"]["capabilities"],
        "profile:compute,boot_option:local,boot_mode:bios,cpu_aes:true",
        "the operator's capabilities kept, the inventory's added after them"
    );
}

/// Difference 3: conditions as Inspector's `rules.py` `check_conditions` and
/// `plugins/rules.py` evaluate them. The first rule is `test/functional.py`
/// `test_introspection_rules`' as written, on data shaped as its `test/base.py`.
#[test]
fn conditions_are_evaluated_as_inspector_evaluates_them() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let functional: Value = serde_json::from_str(include_str!(
        "../../inspector/tests/rules/functional_introspection_rules.json"
    ))
    .unwrap();
    api.rule(&functional[0]);
    let extra_rule = |name: &str, condition: Value| {
        json!({"description": name, "conditions": [condition],
               "actions": [{"action": "set-attribute", "path": format!("/extra/{name}"), "value": true}]})
    };
    for rule in [
        // The field is coerced to the rule value's type: "4" eq 4 holds, 4 eq "4" does not.
        extra_rule(
            "str_eq_int",
            json!({"op": "eq", "field": "inventory.cpu.count", "value": 4}),
        ),
        extra_rule(
            "int_eq_str",
            json!({"op": "eq", "field": "cpus", "value": "4"}),
        ),
        // A missing field skips the rule, whatever invert says.
        extra_rule(
            "missing_inverted",
            json!({"op": "eq", "field": "no.such", "value": 1, "invert": true}),
        ),
        // `interfaces` is a dict keyed by name; `[*]` over it finds nothing.
        extra_rule(
            "by_name",
            json!({"op": "eq", "field": "interfaces.eth1.ip", "value": "192.0.2.1"}),
        ),
        extra_rule(
            "star_on_dict",
            json!({"op": "is-empty", "field": "interfaces[*].ip", "invert": true}),
        ),
        // `first` is the first interface that has the key (eth2 has none).
        extra_rule(
            "first",
            json!({"op": "eq", "field": "inventory.interfaces[*].ipv4_address",
                                   "value": "192.0.2.1", "multiple": "first"}),
        ),
    ] {
        api.rule(&rule);
    }
    let body = |n: u8, third_ip: &str| {
        let mac = |i: u8| format!("52:54:00:a2:{n:02x}:{i:02x}");
        json!({
            "boot_interface": format!("01-{}", mac(1).replace(':', "-")),
            "inventory": {
                "interfaces": [
                    {"name": "eth2", "mac_address": mac(2)},
                    {"name": "eth1", "mac_address": mac(1), "ipv4_address": "192.0.2.1"},
                    {"name": "eth3", "mac_address": mac(3), "ipv4_address": third_ip}
                ],
                "disks": [
                    {"name": "/dev/sda", "model": "Big Data Disk", "size": 1000u64 << 30},
                    {"name": "/dev/sdb", "model": "Small OS Disk", "size": 20u64 << 30}
                ],
                "cpu": {"count": "4", "architecture": "x86_64"},
                "memory": {"physical_mb": 12288},
                "bmc_address": null
            },
            "root_disk": {"name": "/dev/sda", "model": "Big Data Disk", "size": 1000u64 << 30, "wwn": null}
        })
    };
    let r = api.post("/v1/continue", &body(1, "192.0.2.2"));
    assert_eq!(r.status, 200, "{}", r.body);
    let extra = api.node(r.json()["uuid"].as_str().unwrap())["extra"].clone();
    assert_eq!(
        extra,
        json!({"foo": "bar", "str_eq_int": true, "by_name": true, "first": true}),
        "Inspector's functional rule applies; only the conditions Inspector finds true hold"
    );
    // invert applies to each value: one loopback address is enough to fail `all`.
    let r = api.post("/v1/continue", &body(2, "127.0.0.1"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        api.node(r.json()["uuid"].as_str().unwrap())["extra"].get("foo"),
        None
    );
}

/// Difference 4: action values are formatted as Python's `str.format(data=…)`
/// (`rules.py` `_format_value`): `None` for a present null, a dict or a list member by
/// member (keys too), `str()` of what a field holds.
#[test]
fn values_are_formatted_as_python_formats_them() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    api.rule(&json!({"actions": [
        {"action": "set-attribute", "path": "/extra/v6", "value": "{data[inventory][bmc_v6address]}"},
        {"action": "set-attribute", "path": "/extra/by_arch",
         "value": {"{data[inventory][cpu][architecture]}": ["{data[memory_mb]}", 1, null]}},
        {"action": "set-attribute", "path": "/extra/flags", "value": "{data[inventory][cpu][flags]}"},
        {"action": "set-attribute", "path": "/extra/padded", "value": "{data[cpus]:03d}"}
    ]}));
    let mut body = inventory(&["52:54:00:a3:00:01"], 2, 2048, &[10]);
    body["inventory"]["bmc_v6address"] = json!(null);
    let r = api.post("/v1/continue", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        api.node(r.json()["uuid"].as_str().unwrap())["extra"],
        json!({"v6": "None", "by_arch": {"x86_64": ["2048", 1, null]},
               "flags": "['fpu', 'aes']", "padded": "002"})
    );
}

/// Difference 5: what Inspector refuses at rule creation (`rules.py`
/// `_validate_conditions`: the JSON path parsed by jsonpath_rw, the operator's parameters
/// by `plugins/base.py` `WithValidation.validate`) is refused with its message, and nothing
/// is stored. Where Inspector crashes (in-net over a null address: 500), Paddock fails the
/// processing with Inspector's text and answers 400 (README, "Where Paddock differs").
#[test]
fn rules_are_refused_as_inspector_refuses_them() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let fail = json!([{"action": "fail", "message": "m"}]);
    let cases = [
        (
            json!({"conditions": [{"op": "is-empty", "field": "node://driver_info/ipmi_password"}], "actions": fail}),
            "Unable to parse field JSON path node://driver_info/ipmi_password: Error on line 1, col 11: Unexpected character: / ",
        ),
        (
            json!({"conditions": [{"op": "eq", "field": "memory_mb", "value": 1, "foo": 2}], "actions": fail}),
            "Invalid parameters for operator eq: unexpected parameter(s): foo",
        ),
        (
            json!({"conditions": [{"op": "eq", "field": "memory_mb"}], "actions": fail}),
            "Invalid parameters for operator eq: missing required parameter(s): value",
        ),
        (
            json!({"actions": [{"action": "set-capability", "name": "profile", "value": "x", "unique": true}]}),
            "Invalid parameters for action set-capability: unexpected parameter(s): unique",
        ),
    ];
    for (rule, want) in cases {
        let r = api.post("/v1/rules", &rule);
        assert_eq!((r.status, r.error()), (400, want.to_string()), "{rule}");
    }
    assert_eq!(api.get("/v1/rules").json()["rules"], json!([]));
    api.rule(&json!({"conditions": [{"op": "in-net", "field": "inventory.bmc_address", "value": "10.0.0.0/8"}],
                     "actions": fail}));
    let mut body = inventory(&["52:54:00:a4:00:01"], 1, 512, &[]);
    body["inventory"]["bmc_address"] = json!(null);
    let r = api.post("/v1/continue", &body);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "Unexpected exception AddrFormatError during processing: failed to detect a valid IP address from None"
    );
}

/// Difference 6: IPA-shaped bodies with numbers as strings are processed, as Inspector's
/// hooks read them (`plugins/standard.py` `SchedulerHook`: `int(inventory['cpu']['count'])`,
/// `int(inventory['memory']['physical_mb'])`); the stored data keeps them as posted.
#[test]
fn numbers_sent_as_strings_are_processed() {
    require(&["curl", "ip"]);
    let api = Api::start("");
    let mut body = inventory(&["52:54:00:a5:00:01"], 4, 2048, &[40]);
    body["inventory"]["cpu"]["count"] = json!("4");
    body["inventory"]["memory"]["physical_mb"] = json!("2048");
    body["inventory"]["disks"][0]["size"] = json!((40u64 << 30).to_string());
    body["inventory"]["interfaces"][0]["speed_mbps"] = json!("1000");
    let r = api.post("/v1/continue", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let uuid = r.json()["uuid"].as_str().unwrap().to_string();
    let n = api.node(&uuid);
    assert_eq!(n["introspection"]["state"], "finished");
    assert_eq!(
        (
            n["properties"]["cpus"].clone(),
            n["properties"]["memory_mb"].clone(),
            n["properties"]["local_gb"].clone()
        ),
        (json!(4), json!(2048), json!(39))
    );
    let data = api.get(&format!("/v1/introspection/{uuid}/data")).json();
    assert_eq!(data["inventory"]["cpu"]["count"], "4", "as posted");
    assert_eq!(
        (data["cpus"].clone(), data["memory_mb"].clone()),
        (json!(4), json!(2048))
    );
}
