//! Provisioning in a running appliance, through the real CLI and curl: a node
//! walks provision → the agent's `next` (birth) → step reports → register (the MDB holds the
//! machine) → clean → unknown, with its boot script checked at each state; requests the
//! state refuses change nothing; an inspection rule's `set-image` puts a node in birth as
//! its introspection finishes (the one-boot path); and a birth against a real `paddock-subd`
//! (`cargo build -p paddock-subd` first) is synced by the dominator, whose census gives
//! `subd_synced`, and hands over to the local disk (an unnamed node, whose dominator
//! entries reach its timeline through its `node-<8 hex>` hostname); the console's forms
//! change the record only from the same origin; and a run times out only once its ramdisk
//! has reported.

mod support;

use serde_json::{Value, json};
use support::*;

const MAC: &str = "52:54:00:16:00:01";

struct Setup {
    link: Link,
    scratch: Scratch,
    _app: Appliance,
}

impl Setup {
    fn start() -> Setup {
        Setup::start_with("")
    }

    /// With `extra` appended to the configuration.
    fn start_with(extra: &str) -> Setup {
        require(&["curl", "ip", "tar"]);
        let link = Link::new();
        let scratch = Scratch::new(&link.tag);
        let config = base_config(
            &link,
            &scratch,
            &format!(
                "[tftp]\nenabled = false\n[boot.discovery]\nkernel = \"{PUBLIC_URL}/k\"\ninitrd = \"{PUBLIC_URL}/i\"\n{extra}"
            ),
        );
        let app = Appliance::start(&link.server, &scratch, &config);
        let s = Setup {
            link,
            scratch,
            _app: app,
        };
        s.add_image("test/a");
        s
    }

    /// A tiny full image (what a full image needs, and a filter).
    fn add_image(&self, name: &str) {
        let root = self.scratch.path("root");
        sh_ok(&format!(
            "mkdir -p {r}/etc {r}/usr/bin {r}/tmp && echo 'root:x:0:0::/root:/bin/sh' > {r}/etc/passwd && echo hi > {r}/usr/bin/hello",
            r = root.display()
        ));
        let tar = self.scratch.path("image.tar");
        sh_ok(&format!(
            "tar -C {} -cf {} etc usr tmp",
            root.display(),
            tar.display()
        ));
        let filter = self.scratch.path("filter");
        std::fs::write(&filter, "/tmp/.*\n").unwrap();
        self.cli_ok(&format!(
            "image add {name} {} --filter {}",
            tar.display(),
            filter.display()
        ));
    }

    #[track_caller]
    fn cli_ok(&self, args: &str) -> String {
        cli_ok(&self.link.server, args)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Resp {
        let text = body.map(|b| b.to_string());
        http(
            &self.link.server,
            &self.scratch,
            method,
            path,
            text.as_deref(),
            &[],
        )
    }

    #[track_caller]
    fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let r = self.call(method, path, body);
        assert!(r.status < 300, "{method} {path}: {} {}", r.status, r.body);
        if r.body.trim().is_empty() {
            Value::Null
        } else {
            r.json()
        }
    }

    /// A refused call: its status and message; the record is as it was.
    #[track_caller]
    fn refused(&self, method: &str, path: &str, body: Option<Value>, status: u16, says: &str) {
        let before = self.record("r1");
        let r = self.call(method, path, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        let message = r.error();
        assert!(message.contains(says), "{method} {path}: {message}");
        assert_eq!(
            self.record("r1"),
            before,
            "{method} {path} changed the record"
        );
    }

    fn record(&self, node: &str) -> Value {
        self.ok("GET", &format!("/api/v1/nodes/{node}/provisioning"), None)
    }

    fn script(&self) -> String {
        let r = self.call("GET", &format!("/boot/{MAC}.ipxe"), None);
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    fn report(&self, node: &str, event: Value) -> Value {
        self.ok(
            "POST",
            &format!("/api/v1/provision/{node}/report"),
            Some(json!({"event": event})),
        )
    }

    /// A console form posted with curl (`form`: urlencoded, may be empty), with these extra
    /// headers; redirects are not followed.
    fn form(&self, path: &str, form: &str, headers: &[&str]) -> Resp {
        let mut cmd = format!("curl -s -i -X POST '{PUBLIC_URL}{path}'");
        for h in headers {
            cmd.push_str(&format!(" -H '{h}'"));
        }
        cmd.push_str(&format!(
            " -H 'content-type: application/x-www-form-urlencoded' --data-raw '{form}'"
        ));
        curl(&self.link.server, &cmd)
    }

    fn page(&self, path: &str) -> String {
        let r = self.call("GET", path, None);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.body
    }

    fn next(&self, macs: &[&str]) -> Value {
        self.ok(
            "POST",
            "/api/v1/provision/next",
            Some(json!({"macs": macs})),
        )
    }
}

fn assert_ramdisk(script: &str, mode: Option<&str>) {
    assert!(
        script.contains(&format!("kernel {PUBLIC_URL}/k ")),
        "{script}"
    );
    match mode {
        Some(m) => assert!(script.contains(&format!(" paddock.mode={m} ")), "{script}"),
        None => assert!(!script.contains("paddock.mode="), "{script}"),
    }
}

#[test]
fn a_node_walks_through_provisioning_and_bad_requests_change_nothing() {
    let s = Setup::start();
    let node = s.ok(
        "POST",
        "/api/v1/nodes",
        Some(json!({"name": "r1", "macs": [MAC]})),
    );
    let uuid = node["uuid"].as_str().unwrap().to_string();
    // Never provisioned: unknown, and it boots as before (the local disk).
    assert_eq!(s.record("r1")["state"], "unknown");
    let local = s.script();
    assert!(
        local.contains("sanboot --no-describe --drive 0x80"),
        "{local}"
    );
    assert!(
        local.contains("chain file://PADDOCK-ESP/EFI/BOOT/BOOTX64.EFI"),
        "{local}"
    );
    assert!(!local.contains("kernel "), "{local}");

    // Refused: nothing changes.
    s.refused(
        "POST",
        "/api/v1/nodes/r1/provision",
        Some(json!({"image": "test/none"})),
        404,
        "no image \"test/none\"",
    );
    s.refused(
        "POST",
        "/api/v1/nodes/r1/provision",
        Some(json!({})),
        400,
        "name the image",
    );
    s.refused(
        "POST",
        "/api/v1/nodes/r1/provision",
        Some(json!({"image": "../etc"})),
        400,
        "",
    );
    s.refused(
        "POST",
        "/api/v1/nodes/r1/reimage",
        Some(json!({"image": "test/a"})),
        409,
        "the node has no image installed: use provision",
    );
    assert_eq!(
        s.call(
            "POST",
            "/api/v1/nodes/nope/provision",
            Some(json!({"image": "test/a"}))
        )
        .status,
        404
    );
    assert!(!s.script().contains("kernel "), "still the local disk");

    // provision → birth: the ramdisk in birth mode.
    let out = s.cli_ok("node provision r1 --image test/a");
    assert!(out.contains("provision   birth (image test/a)"), "{out}");
    let birth = s.record("r1");
    assert_eq!(
        (birth["state"].as_str(), birth["image"].as_str()),
        (Some("birth"), Some("test/a"))
    );
    assert_ramdisk(&s.script(), Some("birth"));
    // Again: nothing changes; another image while it runs: refused.
    let again = s.ok(
        "POST",
        "/api/v1/nodes/r1/provision",
        Some(json!({"image": "test/a"})),
    );
    assert_eq!(again, birth, "a repeated request changes nothing");
    s.refused(
        "POST",
        &format!("/api/v1/nodes/{uuid}/reimage"),
        Some(json!({"image": "test/a"})),
        409,
        "the node is in birth (image test/a)",
    );

    // The agent: next by any MAC (any case), then its reports.
    let next = s.next(&["52:54:00:99:99:99", &MAC.to_uppercase()]);
    assert_eq!(next["node"], uuid.as_str());
    assert_eq!(next["mode"], "birth");
    assert_eq!(next["image"], "test/a");
    assert!(next["image_bytes"].as_u64().unwrap() > 0, "{next}");
    assert_eq!(next["hostname"], "r1");
    assert_eq!(next["filter"], json!(["/tmp/.*"]));
    assert_eq!(next["subd_port"], 6969);
    assert_eq!(next["appliance_url"], PUBLIC_URL);
    assert_eq!(next["root_device_hints"], Value::Null);
    let nobody = s.next(&["52:54:00:99:99:99"]);
    assert_eq!(
        (nobody["node"].clone(), nobody["mode"].clone()),
        (Value::Null, Value::Null)
    );
    assert_eq!(
        s.call(
            "POST",
            "/api/v1/provision/next",
            Some(json!({"macs": ["nonsense"]}))
        )
        .status,
        400
    );
    for step in ["choose_disk", "partition", "filesystems", "start_subd"] {
        let r = s.report(&uuid, json!({"event": "step_done", "step": step}));
        assert_eq!(r["last_step"], step, "{r}");
    }
    // What the agent may not send, or what its state refuses: nothing changes.
    s.refused(
        "POST",
        "/api/v1/provision/r1/report",
        Some(json!({"event": {"event": "subd_synced", "image": "test/a"}})),
        400,
        "not a report the agent sends",
    );
    s.refused(
        "POST",
        "/api/v1/provision/r1/report",
        Some(json!({"event": {"event": "clean_requested"}})),
        400,
        "not a report the agent sends",
    );
    s.refused(
        "POST",
        "/api/v1/provision/r1/report",
        Some(json!({"event": {"event": "step_done", "step": "boot_loader"}})),
        409,
        "the dominator has not reported it synced",
    );
    s.refused(
        "POST",
        "/api/v1/provision/r1/report",
        Some(json!({"event": {"event": "step_done", "step": "wipe"}})),
        409,
        "step wipe is not a step of birth",
    );
    s.refused(
        "POST",
        "/api/v1/provision/r1/register",
        Some(json!({"address": "198.18.0.150; reboot"})),
        400,
        "is not an IP address",
    );
    let mdb = s.ok("GET", "/rpc/Mdb.ListMachines", None);
    assert!(
        !mdb.to_string().contains("\"Hostname\":\"r1\""),
        "a refused register wrote the MDB: {mdb}"
    );

    // register: the MDB holds the machine, and the step is done.
    let r = s.ok(
        "POST",
        "/api/v1/provision/r1/register",
        Some(json!({"address": "198.18.0.150"})),
    );
    assert_eq!(
        (r["last_step"].as_str(), r["synced"].as_bool()),
        (Some("register"), Some(false))
    );
    let mdb = s.ok("GET", "/rpc/Mdb.ListMachines", None);
    let machine = mdb["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["machine"]["Hostname"] == "r1")
        .unwrap_or_else(|| panic!("no r1 in the MDB: {mdb}"))
        .clone();
    assert_eq!(machine["machine"]["IpAddress"], "198.18.0.150");
    assert_eq!(machine["machine"]["RequiredImage"], "test/a");
    assert_eq!(machine["machine"]["Tags"]["NodeUuid"], uuid.as_str());
    // The agent polls the record for `synced`.
    let polled = s.ok("GET", &format!("/api/v1/provision/{uuid}"), None);
    assert_eq!(polled["synced"], false);

    // clean, from a run: the ramdisk in clean mode, then unknown again.
    let out = s.cli_ok("node clean r1");
    assert!(out.contains("provision   clean"), "{out}");
    assert_ramdisk(&s.script(), Some("clean"));
    let next = s.next(&[MAC]);
    assert_eq!(
        (next["mode"].as_str(), next["image"].clone()),
        (Some("clean"), Value::Null)
    );
    s.report("r1", json!({"event": "step_done", "step": "wipe"}));
    let done = s.report("r1", json!({"event": "clean_done"}));
    assert_eq!(done["state"], "unknown");
    // Repeated, the report changes nothing and is no error.
    assert_eq!(s.report("r1", json!({"event": "clean_done"})), done);
    // Unknown after a clean: the node waits in the discovery ramdisk.
    assert_ramdisk(&s.script(), None);
    assert_eq!(s.next(&[MAC])["mode"], Value::Null);
    s.refused(
        "POST",
        "/api/v1/provision/r1/register",
        Some(json!({"address": "198.18.0.150"})),
        409,
        "does not apply to a node in unknown",
    );

    // The operator sees the state and every transition on the timeline.
    let show = s.cli_ok("node show r1");
    assert!(show.contains("provision   unknown"), "{show}");
    for line in [
        "unknown → birth: provisioning requested (image test/a)",
        "birth → birth: step register done (image test/a)",
        "birth → clean: clean requested",
        "clean → unknown: clean done",
    ] {
        assert!(show.contains(line), "{line:?} missing:\n{show}");
    }
    // reimage [--image]: from an error keeps the failed run's image.
    s.cli_ok("node provision r1 --image test/a");
    s.report(
        "r1",
        json!({"event": "step_failed", "step": "choose_disk", "message": "no disk of 4 GiB or more"}),
    );
    let show = s.cli_ok("node show r1");
    assert!(
        show.contains("birth failed at choose_disk: no disk of 4 GiB or more"),
        "{show}"
    );
    assert_ramdisk(&s.script(), None);
    let out = s.cli_ok("node reimage r1");
    assert!(out.contains("provision   rebirth (image test/a)"), "{out}");
    assert_ramdisk(&s.script(), Some("rebirth"));
    let bad = cli(&s.link.server, "node reimage r1 --image test/none");
    assert!(!bad.status.success());
}

#[test]
fn a_rule_provisions_the_node_as_its_inspection_finishes() {
    let s = Setup::start();
    let bad = s.call(
        "POST",
        "/v1/rules",
        Some(json!({"conditions": [], "actions": [{"action": "set-image", "image": 7}]})),
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.error().contains("set-image"), "{}", bad.body);
    s.ok(
        "POST",
        "/v1/rules",
        Some(json!({"description": "provision", "conditions": [],
                    "actions": [{"action": "set-image", "image": "test/a"}]})),
    );
    // An unknown machine boots the discovery ramdisk, posts its inventory (auto-enrolment
    // and the rules), and its next question finds it in birth: the same boot goes on.
    assert_ramdisk(&s.script(), None);
    let inventory = inventory(&[MAC], 2, 2048, &[20]);
    s.ok("POST", "/v1/continue", Some(inventory));
    let next = s.next(&[MAC]);
    assert_eq!(next["mode"], "birth", "{next}");
    assert_eq!(next["image"], "test/a");
    let uuid = next["node"].as_str().unwrap().to_string();
    assert_eq!(next["hostname"], format!("node-{}", &uuid[..8]));
    let record = s.record(&uuid);
    assert_eq!(record["state"], "birth");
    assert_ramdisk(&s.script(), Some("birth"));
    // The wish is acted on once: cleaned, the node stays unknown whatever else changes.
    s.cli_ok(&format!("node clean {uuid}"));
    s.report(&uuid, json!({"event": "clean_done"}));
    s.ok(
        "PATCH",
        &format!("/api/v1/nodes/{uuid}"),
        Some(json!([{"op": "add", "path": "/extra/rack", "value": "r9"}])),
    );
    assert_eq!(s.next(&[MAC])["mode"], Value::Null);
    assert_eq!(s.record(&uuid)["state"], "unknown");
    let timeline = s.ok("GET", &format!("/api/v1/nodes/{uuid}"), None)["timeline"].to_string();
    assert!(
        timeline.contains("unknown → birth: provisioning requested (image test/a)"),
        "{timeline}"
    );
}

/// Waits up to `secs` for `f`, naming what was awaited.
#[track_caller]
fn wait_long(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The whole birth against a real `paddock-subd` on an empty root: register, the dominator
/// pushes the image, its census gives `subd_synced`, the agent's last steps make the node
/// healthy, and its boot script serves the local disk.
#[test]
fn a_birth_is_synced_by_the_dominator_and_hands_over() {
    let s = Setup::start();
    // An unnamed node: its hostname (and its MDB machine, and its sub) is node-<8 hex>.
    let uuid = s.ok("POST", "/api/v1/nodes", Some(json!({"macs": [MAC]})))["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let host = format!("node-{}", &uuid[..8]);
    s.cli_ok(&format!("node provision {uuid} --image test/a"));
    assert_eq!(s.next(&[MAC])["hostname"], host.as_str());
    for step in ["choose_disk", "partition", "filesystems"] {
        s.report(&uuid, json!({"event": "step_done", "step": step}));
    }
    // The target: an empty file system, subd on it.
    let root = s.scratch.path("target");
    let _subd = start_subd(&s.link.server, &s.scratch, &root, "--exclude '/tmp/.*'");
    s.report(&uuid, json!({"event": "step_done", "step": "start_subd"}));
    s.ok(
        "POST",
        &format!("/api/v1/provision/{uuid}/register"),
        Some(json!({"address": "127.0.0.2"})),
    );
    // The agent polls its record until the dominator has synced the image.
    wait_long("the dominator to sync r2 to test/a", 180, || {
        s.ok("GET", &format!("/api/v1/provision/{uuid}"), None)["synced"] == true
    });
    assert_eq!(
        std::fs::read_to_string(root.join("usr/bin/hello")).unwrap(),
        "hi\n"
    );
    // Steps after the sync, then hand-over: healthy, the local disk.
    assert_ramdisk(&s.script(), Some("birth"));
    for step in ["boot_loader", "identity", "hand_over"] {
        s.report(&uuid, json!({"event": "step_done", "step": step}));
    }
    let healthy = s.record(&uuid);
    assert_eq!(
        (healthy["state"].as_str(), healthy["image"].as_str()),
        (Some("healthy"), Some("test/a"))
    );
    let local = s.script();
    assert!(
        local.contains("is provisioned: booting from the local disk"),
        "{local}"
    );
    assert!(
        local.contains("sanboot --no-describe --drive 0x80"),
        "{local}"
    );
    assert_eq!(s.next(&[MAC])["mode"], Value::Null);
    // Provisioned: provision is refused, reimage starts a rebirth.
    let r = s.call(
        "POST",
        &format!("/api/v1/nodes/{uuid}/provision"),
        Some(json!({"image": "test/a"})),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.error().contains("use reimage"), "{}", r.body);
    let out = s.cli_ok(&format!("node reimage {uuid}"));
    assert!(out.contains("provision   rebirth (image test/a)"), "{out}");
    assert_ramdisk(&s.script(), Some("rebirth"));
    // The dominator's entries reached the unnamed node's timeline by its hostname.
    let timeline = s.ok("GET", &format!("/api/v1/nodes/{uuid}"), None)["timeline"].clone();
    assert!(
        timeline
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "dominator"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("dominator: synced to test/a"))),
        "no dominator entry on {host}'s timeline: {timeline}"
    );
    let show = s.cli_ok(&format!("node show {uuid}"));
    assert!(
        show.contains("birth → birth: subd synced to test/a"),
        "{show}"
    );
    assert!(
        show.contains("birth → healthy: step hand_over done (image test/a)"),
        "{show}"
    );
}

/// The node page shows the provisioning state and its forms; a form from another site is
/// refused and changes nothing; one from the console itself goes through the API's own
/// request (303 back to the node), and a refusal shows the API's 409 message.
#[test]
fn the_console_provisions_a_node_from_the_same_origin_only() {
    let s = Setup::start();
    let uuid = s.ok(
        "POST",
        "/api/v1/nodes",
        Some(json!({"name": "r1", "macs": [MAC]})),
    )["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let page = s.page("/ui/nodes/r1");
    assert!(page.contains("<h2>Provisioning</h2>"), "{page}");
    assert!(page.contains("never provisioned by Paddock"), "{page}");
    assert!(
        page.contains(&format!(r#"action="/ui/nodes/{uuid}/provision""#)),
        "{page}"
    );
    assert!(
        page.contains(r#"<option value="test/a">test/a</option>"#),
        "{page}"
    );
    let before = s.record("r1");
    let ours = format!("Origin: {PUBLIC_URL}");

    // From another site: refused, whether the browser says so by Origin or by Sec-Fetch-Site.
    for headers in [
        vec!["Origin: http://evil.example"],
        vec!["Sec-Fetch-Site: cross-site"],
        vec!["Origin: http://evil.example", "Sec-Fetch-Site: same-origin"],
    ] {
        for (path, form) in [
            ("/ui/nodes/r1/provision", "image=test%2Fa"),
            ("/ui/nodes/r1/clean", ""),
        ] {
            let r = s.form(path, form, &headers);
            assert_eq!(r.status, 403, "{path} {headers:?}: {}", r.body);
            assert!(r.body.contains("another site"), "{}", r.body);
        }
    }
    assert_eq!(
        s.record("r1"),
        before,
        "a cross-site form changed the record"
    );

    // From the console: provision, back to the node's page.
    let r = s.form(
        "/ui/nodes/r1/provision",
        "image=test%2Fa",
        &[&ours, "Sec-Fetch-Site: same-origin"],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.header("location"),
        Some(format!("/ui/nodes/{uuid}").as_str())
    );
    let birth = s.record("r1");
    assert_eq!(
        (birth["state"].as_str(), birth["image"].as_str()),
        (Some("birth"), Some("test/a"))
    );
    assert_ramdisk(&s.script(), Some("birth"));
    let page = s.page(&format!("/ui/nodes/{uuid}"));
    assert!(
        page.contains(r#"<span class="state badge tone-busy birth">birth</span>"#),
        "{page}"
    );
    assert!(!page.contains("never provisioned"), "{page}");

    // Refused by the state: the API's status and message, nothing changed.
    let r = s.form("/ui/nodes/r1/reimage", "image=", &[&ours]);
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.body
            .contains("the node is in birth (image test/a): wait for it to end"),
        "{}",
        r.body
    );
    let r = s.form("/ui/nodes/nope/clean", "", &[&ours]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("no node nope"), "{}", r.body);
    assert_eq!(s.record("r1"), birth);

    // A failure shows on the page with its step; re-image keeps the failed run's image.
    s.report(
        "r1",
        json!({"event": "step_failed", "step": "partition", "message": "sfdisk: <no> disk"}),
    );
    let page = s.page("/ui/nodes/r1");
    assert!(
        page.contains("birth failed at partition: sfdisk: &lt;no&gt; disk"),
        "{page}"
    );
    let r = s.form("/ui/nodes/r1/reimage", "image=", &[]);
    assert_eq!(
        r.status, 303,
        "no Origin (a form posted by hand): {}",
        r.body
    );
    let rebirth = s.record("r1");
    assert_eq!(
        (rebirth["state"].as_str(), rebirth["image"].as_str()),
        (Some("rebirth"), Some("test/a"))
    );
    // Clean, from the console.
    let r = s.form("/ui/nodes/r1/clean", "", &[&ours]);
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(s.record("r1")["state"], "clean");
    assert_ramdisk(&s.script(), Some("clean"));
    let show = s.cli_ok("node show r1");
    for line in [
        "unknown → birth: provisioning requested (image test/a)",
        "error → rebirth: re-image requested (image test/a, was test/a)",
        "rebirth → clean: clean requested",
    ] {
        assert!(show.contains(line), "{line:?} missing:\n{show}");
    }
}

/// A run's clock starts at its ramdisk's first report: a node whose machine never boots
/// stays in birth however long; once `provision/next` has answered its mode, a run that
/// goes quiet for `step_timeout_secs` ends in error at the step that was due, on the
/// timeline; waiting for the dominator's sync has its own, longer timeout.
#[test]
fn a_run_times_out_only_once_its_ramdisk_has_reported() {
    let s = Setup::start_with("[provisioning]\nstep_timeout_secs = 2\nsync_timeout_secs = 600\n");
    s.ok(
        "POST",
        "/api/v1/nodes",
        Some(json!({"name": "r1", "macs": [MAC]})),
    );
    s.cli_ok("node provision r1 --image test/a");
    // Powered off, nothing times out: exact on a manual clock in the provisioning module's
    // own test; here the record has no start yet.
    let waiting = s.record("r1");
    assert_eq!(waiting["state"], "birth", "{waiting}");
    assert!(waiting.get("started_ms").is_none(), "{waiting}");
    // The machine boots the ramdisk and asks: the clock starts.
    assert_eq!(s.next(&[MAC])["mode"], "birth");
    let started = s.record("r1");
    assert!(started["started_ms"].as_u64().is_some(), "{started}");
    wait_for("the run to time out", || s.record("r1")["state"] == "error");
    let failed = s.record("r1");
    assert_eq!(
        (failed["operation"].as_str(), failed["step"].as_str()),
        (Some("birth"), Some("choose_disk")),
        "{failed}"
    );
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("(timeout 2 s)"),
        "{failed}"
    );
    assert_ramdisk(&s.script(), None);
    let show = s.cli_ok("node show r1");
    assert!(
        show.contains("birth → birth: the ramdisk started the run (image test/a)"),
        "{show}"
    );
    assert!(
        show.contains("birth → error: step choose_disk timed out: no report for"),
        "{show}"
    );

    // Again, up to register: waiting for the sync, the step timeout no longer applies.
    s.cli_ok("node provision r1 --image test/a");
    assert_eq!(s.next(&[MAC])["mode"], "birth");
    for step in ["choose_disk", "partition", "filesystems", "start_subd"] {
        s.report("r1", json!({"event": "step_done", "step": step}));
    }
    s.ok(
        "POST",
        "/api/v1/provision/r1/register",
        Some(json!({"address": "198.18.0.150"})),
    );
    // Registered: the run waits for the sync. That the step timeout no longer applies
    // then is the provisioning module's manual-clock test, to the millisecond.
    let syncing = s.record("r1");
    assert_eq!(
        (syncing["state"].as_str(), syncing["last_step"].as_str()),
        (Some("birth"), Some("register")),
        "{syncing}"
    );
}
