//! The console's actions in a running appliance, through curl as a browser's forms would
//! post them: a node's power buttons (through the API's own path, off and cycle confirmed
//! first, a node without a BMC shows none), with the throttle on the dashboard; deleting an
//! image, confirmed first; pausing and resuming the dominator, all of it or one sub. Each form
//! changes the state from the same origin only (a cross-site post is refused with 403 and
//! changes nothing), and pages escape what nodes and BMCs said. A node's power record
//! reaches its page live (a `power` event on `/ui/events` naming the node only).

mod support;

use serde_json::{Value, json};
use support::*;

/// A running appliance in its namespace. Fields drop in order: the appliance is killed
/// before its namespace and scratch directory go.
struct Setup {
    _app: Appliance,
    scratch: Scratch,
    link: Link,
}

impl Setup {
    fn start() -> Setup {
        require(&["curl", "ip"]);
        let link = Link::new();
        let scratch = Scratch::new(&link.tag);
        let config = base_config(&link, &scratch, "[tftp]\nenabled = false\n");
        let app = Appliance::start(&link.server, &scratch, &config);
        Setup {
            _app: app,
            scratch,
            link,
        }
    }

    /// An API call with a JSON body that must succeed: its answer.
    #[track_caller]
    fn api(&self, method: &str, path: &str, body: Value) -> Value {
        let b = body.to_string();
        let r = http(
            &self.link.server,
            &self.scratch,
            method,
            path,
            Some(&b),
            &[],
        );
        assert!(r.status < 300, "{method} {path}: {} {}", r.status, r.body);
        r.json()
    }

    /// A console form (urlencoded) posted by curl with these extra headers, redirects not
    /// followed.
    fn form(&self, path: &str, form: &str, headers: &[&str]) -> Resp {
        let extra: String = headers.iter().map(|h| format!(" -H '{h}'")).collect();
        let cmd = format!(
            "curl -s -i -X POST '{PUBLIC_URL}{path}'{extra} --data-raw '{form}' -H 'content-type: application/x-www-form-urlencoded'"
        );
        curl(&self.link.server, &cmd)
    }

    /// A console form from the console's own pages (`Origin` this appliance).
    fn ours(&self, path: &str, form: &str) -> Resp {
        self.form(path, form, &[&format!("Origin: {PUBLIC_URL}")])
    }

    #[track_caller]
    fn page(&self, path: &str) -> String {
        let r = http(&self.link.server, &self.scratch, "GET", path, None, &[]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.body
    }

    /// The part of a page between `from` and `to` (both present).
    #[track_caller]
    fn part(&self, path: &str, from: &str, to: &str) -> String {
        let page = self.page(path);
        let start = page.find(from).unwrap_or_else(|| panic!("{from}: {page}"));
        let len = page[start..]
            .find(to)
            .unwrap_or_else(|| panic!("{to}: {page}"));
        page[start..start + len].to_string()
    }
}

const CROSS_SITE: [&[&str]; 3] = [
    &["Origin: http://evil.example"],
    &["Sec-Fetch-Site: cross-site"],
    &["Origin: http://evil.example", "Sec-Fetch-Site: same-origin"],
];

/// An answer with this status whose page says `says`.
#[track_caller]
fn answered(r: &Resp, status: u16, says: &str) {
    assert_eq!(r.status, status, "{says:?}: {}", r.body);
    assert!(r.body.contains(says), "{says:?} missing: {}", r.body);
}

/// A form done: 303 to `to`.
#[track_caller]
fn redirected(r: &Resp, to: &str) {
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some(to));
}

/// The power part of a node's page.
fn power_part(s: &Setup, node: &str) -> String {
    s.part(
        &format!("/ui/nodes/{node}"),
        "<h2>Power</h2>",
        "<h2>Timeline</h2>",
    )
}

#[test]
fn power_buttons_post_through_the_api_from_the_same_origin_only() {
    let s = Setup::start();
    // A Redfish BMC that nothing answers (connection refused at once), and a node without one.
    let created = s.api(
        "POST",
        "/api/v1/nodes",
        json!({"name": "r1u1", "driver": "redfish", "bmc_address": "127.0.0.1",
            "driver_info": {"redfish_address": "http://127.0.0.1:1",
                "redfish_username": "admin", "redfish_password": "pw-never-shown-7c1"}}),
    );
    s.api(
        "POST",
        "/api/v1/nodes",
        json!({"name": "bare", "macs": ["52:54:00:20:00:01"]}),
    );
    let part = power_part(&s, "r1u1");
    assert!(
        part.contains("redfish <code>http://127.0.0.1:1</code>"),
        "{part}"
    );
    assert!(part.contains(r#"<td class="state">unknown</td>"#), "{part}");
    for a in ["on", "off", "cycle", "status"] {
        assert!(part.contains(&format!(r#"value="{a}""#)), "{a}: {part}");
    }
    let page = s.page("/ui/nodes/r1u1");
    assert!(!page.contains("pw-never-shown-7c1"), "the password shown");
    let bare = power_part(&s, "bare");
    assert!(bare.contains("No BMC"), "{bare}");
    assert!(!bare.contains("<form"), "{bare}");

    // From another site: refused, nothing asked of the BMC, nothing recorded.
    let before = power_part(&s, "r1u1");
    for headers in CROSS_SITE {
        for form in ["action=status", "action=off&confirm=yes", "action=on"] {
            let r = s.form("/ui/nodes/r1u1/power", form, headers);
            answered(&r, 403, "a form from another site was refused");
        }
    }
    assert_eq!(power_part(&s, "r1u1"), before, "a cross-site form acted");

    // Status from the console: the API's error, then on the page (escaped text only).
    let r = s.ours("/ui/nodes/r1u1/power", "action=status");
    answered(&r, 502, "node r1u1: power status: BMC unreachable");
    let part = power_part(&s, "r1u1");
    assert!(part.contains("Status error"), "{part}");
    assert!(part.contains("BMC unreachable"), "{part}");
    assert!(!part.contains("Last action"), "{part}");

    // Off and cycle ask first: the confirmation changes nothing.
    for action in ["off", "cycle"] {
        let r = s.ours("/ui/nodes/r1u1/power", &format!("action={action}"));
        answered(
            &r,
            200,
            r#"<input type="hidden" name="confirm" value="yes">"#,
        );
        answered(&r, 200, &format!(r#"name="action" value="{action}""#));
    }
    assert!(!power_part(&s, "r1u1").contains("Last action"));
    let r = s.ours("/ui/nodes/r1u1/power", "action=off&confirm=yes");
    answered(&r, 502, "node r1u1: power off: BMC unreachable");
    let part = power_part(&s, "r1u1");
    assert!(part.contains("Last action"), "{part}");
    assert!(part.contains("off at "), "{part}");

    // No BMC, or no such action: the API's refusal.
    let r = s.ours("/ui/nodes/bare/power", "action=status");
    answered(&r, 409, "the node has no BMC to manage");
    let r = s.ours("/ui/nodes/r1u1/power", "action=%3Cb%3Eexplode");
    answered(&r, 400, "unknown power action &quot;&lt;b&gt;explode&quot;");
    assert!(!r.body.contains("<b>"), "{}", r.body);

    // The node's page follows its power record live: a status read is a `power` event that
    // names the node (and nothing the BMC said).
    let uuid = created["uuid"].as_str().unwrap();
    let events = s.scratch.path("events.txt");
    let out = s.link.server.sh(&format!(
        "timeout 8 curl -sN {PUBLIC_URL}/ui/events > {e} & sleep 1; \
         curl -s -o /dev/null -X POST {PUBLIC_URL}/ui/nodes/r1u1/power -d action=status; wait",
        e = events.display()
    ));
    let stream = std::fs::read_to_string(&events).unwrap_or_default();
    assert!(
        stream.contains(&format!("event: power\ndata: {{\"subject\":\"{uuid}\"}}")),
        "{stream} {out:?}"
    );
    assert!(!stream.contains("unreachable"), "{stream}");

    // The throttle on the dashboard.
    let dash = s.page("/ui/dashboard");
    assert!(dash.contains("0 power-on(s) queued"), "{dash}");
}

/// The images table's row of `name`, if listed.
fn listed(s: &Setup, name: &str) -> bool {
    s.page("/ui/images")
        .contains(&format!(r#"<tr data-image="{name}">"#))
}

#[test]
fn an_image_is_deleted_from_the_images_page_once_confirmed() {
    let s = Setup::start();
    let tree = s.scratch.path("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/hostname"), "actions\n").unwrap();
    let tar = s.scratch.path("image.tar");
    sh_ok(&format!(
        "tar -C {} -cf {} .",
        tree.display(),
        tar.display()
    ));
    let r = curl(
        &s.link.server,
        &format!(
            "curl -s -i -X POST '{PUBLIC_URL}/ui/images?name=test/del.1' -H 'Origin: {PUBLIC_URL}' -H 'content-type: application/x-tar' --data-binary @{}",
            tar.display()
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(listed(&s, "test/del.1"));
    let page = s.page("/ui/images");
    assert!(
        page.contains(r#"<form class="inline" method="post" action="/ui/images/test/del.1">"#),
        "{page}"
    );
    assert!(
        s.page("/ui/images/test/del.1")
            .contains(r#"action="/ui/images/test/del.1""#),
        "the image's page has the button too"
    );

    // From another site: refused, the image stays.
    for headers in CROSS_SITE {
        let r = s.form(
            "/ui/images/test/del.1",
            "action=delete&confirm=yes",
            headers,
        );
        answered(&r, 403, "a form from another site was refused");
    }
    assert!(listed(&s, "test/del.1"), "a cross-site form deleted it");

    // Asked first: the confirmation page deletes nothing.
    let r = s.ours("/ui/images/test/del.1", "action=delete");
    answered(&r, 200, "Delete image <code>test/del.1</code>?");
    answered(
        &r,
        200,
        r#"<input type="hidden" name="confirm" value="yes">"#,
    );
    assert!(listed(&s, "test/del.1"), "asking deleted it");
    let r = s.ours("/ui/images/test/del.1", "action=explode&confirm=yes");
    answered(&r, 400, "the only action on an image is delete");

    // Confirmed: through the image server's delete; the name is retired.
    let r = s.ours("/ui/images/test/del.1", "action=delete&confirm=yes");
    redirected(&r, "/ui/images");
    assert!(!listed(&s, "test/del.1"), "still listed");
    let page = s.part("/ui/images", "<h2>Retired names</h2>", "</p>");
    assert!(page.contains("test/del.1"), "{page}");
    // Refused by the image server: its status and message, escaped.
    let r = s.ours("/ui/images/test/del.1", "action=delete&confirm=yes");
    answered(&r, 404, "no image &quot;test/del.1&quot;");
    let r = s.ours("/ui/images/%3Cb%3Ex", "action=delete&confirm=yes");
    answered(&r, 404, "no image &quot;&lt;b&gt;x&quot;");
    assert!(!r.body.contains("<b>x"), "{}", r.body);
}

/// `Dominator.Status`'s pause (`null` when not paused).
fn paused(s: &Setup) -> Value {
    let r = http(
        &s.link.server,
        &s.scratch,
        "GET",
        "/rpc/Dominator.Status",
        None,
        &[],
    );
    r.json()["paused"].clone()
}

#[test]
fn the_dominator_is_paused_and_resumed_from_the_subs_pages() {
    let s = Setup::start();
    s.api(
        "POST",
        "/rpc/Mdb.SetMachine",
        json!({"Hostname": "h1", "IpAddress": "127.0.0.1", "RequiredImage": "none/yet"}),
    );
    let subs = s.page("/ui/subs");
    assert!(
        subs.contains(r#"<form class="pause" method="post" action="/ui/subs">"#),
        "{subs}"
    );
    assert!(subs.contains("Pause all updates"), "{subs}");

    // From another site: refused, nothing paused.
    for headers in CROSS_SITE {
        for (path, form) in [
            ("/ui/subs", "action=pause&confirm=yes&reason=x"),
            ("/ui/subs/h1/pause", "action=pause&confirm=yes&reason=x"),
        ] {
            answered(
                &s.form(path, form, headers),
                403,
                "a form from another site was refused",
            );
        }
    }
    assert_eq!(paused(&s), Value::Null);

    // A pause asks first, for its reason; without one the API's refusal.
    let r = s.ours("/ui/subs", "action=pause");
    answered(&r, 200, r#"<input type="text" name="reason" required"#);
    answered(
        &r,
        200,
        r#"<input type="hidden" name="confirm" value="yes">"#,
    );
    assert_eq!(paused(&s), Value::Null, "asking paused it");
    let r = s.ours("/ui/subs", "action=pause&confirm=yes&reason=");
    answered(&r, 400, "a reason is required");
    let r = s.ours("/ui/subs", "action=stop");
    answered(&r, 400, "the dominator's actions are pause and resume");

    // Confirmed, with a reason that is shown as text.
    let r = s.ours(
        "/ui/subs",
        "action=pause&confirm=yes&reason=%3Cscript%3Efreeze%3C%2Fscript%3E",
    );
    redirected(&r, "/ui/subs");
    assert_eq!(paused(&s)["reason"], "<script>freeze</script>");
    let subs = s.page("/ui/subs");
    assert!(
        subs.contains("&lt;script&gt;freeze&lt;/script&gt;"),
        "{subs}"
    );
    assert!(!subs.contains("<script>freeze"), "{subs}");
    assert!(subs.contains("Resume all updates"), "{subs}");
    // Resuming needs no confirmation.
    redirected(&s.ours("/ui/subs", "action=resume"), "/ui/subs");
    assert_eq!(paused(&s), Value::Null);

    // One sub: paused once confirmed, shown on its page, resumed.
    wait_for("h1 in the census", || {
        http(&s.link.server, &s.scratch, "GET", "/ui/subs/h1", None, &[]).status == 200
    });
    let r = s.ours("/ui/subs/h1/pause", "action=pause");
    answered(&r, 200, "Pause sub h1?");
    answered(&r, 200, r#"action="/ui/subs/h1/pause""#);
    let page = s.page("/ui/subs/h1");
    assert!(page.contains("<th>Paused</th><td>no</td>"), "{page}");
    let r = s.ours(
        "/ui/subs/h1/pause",
        "action=pause&confirm=yes&reason=disk%20swap",
    );
    redirected(&r, "/ui/subs/h1");
    let page = s.page("/ui/subs/h1");
    assert!(page.contains("<th>Paused</th><td>disk swap</td>"), "{page}");
    assert!(page.contains("Resume this sub"), "{page}");
    redirected(&s.ours("/ui/subs/h1/pause", "action=resume"), "/ui/subs/h1");
    let page = s.page("/ui/subs/h1");
    assert!(page.contains("<th>Paused</th><td>no</td>"), "{page}");
    // A name the dominator refuses: its message, escaped.
    let r = s.ours(
        "/ui/subs/%3Cb%3E/pause",
        "action=pause&confirm=yes&reason=x",
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(!r.body.contains("<b>"), "{}", r.body);
}
