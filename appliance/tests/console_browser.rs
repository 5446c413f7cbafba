//! The web console in a real browser: Debian's headless Chromium driven through chromedriver
//! (WebDriver) against the real `paddock serve`, both on 127.0.0.1 (the appliance runs with
//! DHCP, TFTP and the PXE filter off, so it touches no interface of the host). Machines enrol
//! the way the agent enrols them, by posting introspection data to `/v1/continue`.
//!
//! It asserts what an operator sees: a machine enrolled while the list is open appears without
//! a reload; its page shows its inventory and timeline; starting an introspection from the page
//! changes its state, and the agent's report then finishes it live; a rule with a bad condition
//! created from the rules page shows the validation's error; a tarball uploaded from the
//! images page appears with its sizes, and is deleted from there once confirmed. Every page
//! is saved as a PNG under
//! `target/console-screenshots/`, and any error in the browser's console fails the test.
//!
//! Needs root (Chromium runs with `--no-sandbox`), `chromium` and `chromium-driver`
//! (`scripts/install-deps.sh`).

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, Locator};
use serde_json::{Value, json};
use support::{Scratch, inventory, require};

/// How long any awaited condition may take.
const DEADLINE: Duration = Duration::from_secs(20);

/// A free TCP port on 127.0.0.1 (bound, then released for the child to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A child process killed (and reaped) on drop; its log is printed if the test failed.
struct Proc {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).expect("log file");
        let child = cmd
            .stdout(file.try_clone().expect("dup"))
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc { child, name, log }
    }

    /// Polls `url` with curl until it answers 2xx; fails if the process exits or the
    /// deadline passes.
    fn wait_http(&mut self, url: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let ok = Command::new("curl")
                .args(["-sf", "-m", "1", "-o", "/dev/null", url])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited with {status}:\n{}", self.name, self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer {url}:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.log_text());
        }
    }
}

/// A chromedriver command beyond WebDriver's: a POST to `session/<id>/<path>` with `body`.
/// Its (Selenium's) log command, `se/log`, reads the browser's console since the last call;
/// `goog/cdp/execute` runs a Chrome DevTools command (the colour scheme a page is shown in).
#[derive(Debug)]
struct Chromedriver(&'static str, Value);

impl WebDriverCompatibleCommand for Chromedriver {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or_default(),
            self.0
        ))
    }
    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.1.to_string()))
    }
}

/// The browser's console since the last call.
fn browser_log() -> Chromedriver {
    Chromedriver("se/log", json!({"type": "browser"}))
}

/// The accessibility check run in each page (axe-core's serious rules that apply here).
const A11Y: &str = include_str!("support/a11y.js");

/// What keyboard-only navigation must reach: every visible link, button and control, keyed
/// by what it is (a live region swapped meanwhile holds equal elements, not the same ones).
const ACTIONABLE: &str = r#"
window.__key = function (el) {
  return [el.tagName, el.getAttribute('href') || '', el.getAttribute('name') || '',
          el.getAttribute('value') || '', el.getAttribute('formaction') || '',
          (el.textContent || '').trim().slice(0, 60)].join('|');
};
window.__actionable = function () {
  return Array.from(document.querySelectorAll(
      'a[href], button, input:not([type=hidden]), select, textarea, summary'))
    .filter(el => el.getClientRects().length && !el.disabled && el.tabIndex >= 0
                  && getComputedStyle(el).visibility !== 'hidden');
};
window.__reached = new Set();
document.addEventListener('focusin', e => window.__reached.add(window.__key(e.target)), true);
document.activeElement && document.activeElement.blur();
return window.__actionable().length;
"#;

/// The browser, the appliance it looks at, and where screenshots go.
struct Session {
    browser: Client,
    base: String,
    shots: PathBuf,
    /// Console entries seen so far that were not errors.
    seen: usize,
}

impl Session {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn goto(&self, path: &str) {
        self.browser.goto(&self.url(path)).await.expect("goto");
    }

    /// Fails on any error the browser's console holds (messages at level SEVERE: script
    /// errors, failed loads, `console.error`).
    async fn no_console_errors(&mut self, during: &str) {
        let entries = self
            .browser
            .issue_cmd(browser_log())
            .await
            .expect("browser log");
        let entries = entries.as_array().cloned().unwrap_or_default();
        let errors: Vec<&Value> = entries
            .iter()
            .filter(|e| e["level"].as_str() == Some("SEVERE"))
            .collect();
        assert!(
            errors.is_empty(),
            "browser console errors {during}: {errors:#?}"
        );
        self.seen += entries.len();
    }

    /// Saves the page as `target/console-screenshots/<name>.png`, after checking the console.
    async fn shot(&mut self, name: &str) {
        self.no_console_errors(name).await;
        let png = self.browser.screenshot().await.expect("screenshot");
        std::fs::write(self.shots.join(format!("{name}.png")), png).expect("write screenshot");
    }

    /// Polls `script` (a function body returning a value) until `ok` holds of its value.
    async fn wait_js(&self, what: &str, script: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let v = self.browser.execute(script, vec![]).await.expect("execute");
            if ok(&v) {
                return v;
            }
            if Instant::now() >= deadline {
                let page = self
                    .browser
                    .execute("return document.body.innerText;", vec![])
                    .await
                    .unwrap_or_default();
                panic!(
                    "timed out waiting for {what} (last: {v}); the page:\n{}",
                    page.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the first element matching `css`, or null.
    async fn text(&self, css: &str) -> Value {
        self.browser
            .execute(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                vec![json!(css)],
            )
            .await
            .expect("execute")
    }

    /// Clicks the element matching `css` (a link or a form's button). A live region swapped
    /// between finding and clicking leaves a stale element: found again and clicked, a few
    /// times at most.
    async fn click(&self, css: &str) {
        for _ in 0..5 {
            let e = self
                .browser
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no {css} on the page: {e}"));
            match e.click().await {
                Err(e) if e.is_stale_element_reference() => {}
                r => return r.map(drop).expect("click"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: stale after 5 tries");
    }

    /// Waits until an element matches `css`.
    async fn wait_present(&self, what: &str, css: &str) {
        let script = format!("return document.querySelector({}) !== null;", json!(css));
        self.wait_js(what, &script, |v| v == true).await;
    }

    /// Types `text` into the element matching `css` (a file input takes a path).
    async fn type_into(&self, css: &str, text: &str) {
        self.browser
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
            .send_keys(text)
            .await
            .expect("type");
    }

    /// Asserts that the text of the element matching `css` holds every one of `wants`.
    async fn text_has(&self, css: &str, wants: &[&str]) {
        let text = self.text(css).await;
        let text = text.as_str().unwrap_or_default();
        for want in wants {
            assert!(text.contains(want), "{css} lacks {want:?}: {text}");
        }
    }

    /// Marks the document; [`Session::not_reloaded`] then proves it was not reloaded.
    async fn mark(&self) {
        self.browser
            .execute("window.__notReloaded = 'yes'; return null;", vec![])
            .await
            .expect("mark");
    }

    async fn not_reloaded(&self) {
        let v = self
            .browser
            .execute("return window.__notReloaded || null;", vec![])
            .await
            .expect("execute");
        assert_eq!(v, json!("yes"), "the page was reloaded");
    }

    /// Waits for the page's event stream to be open, so changes from now on are pushed.
    async fn wait_live(&self) {
        self.wait_js(
            "the live stream",
            "const e = document.getElementById('live-status'); return e ? e.textContent : null;",
            |v| v == "live",
        )
        .await;
    }

    /// Shows pages in the light or the dark scheme (`prefers-color-scheme`).
    async fn scheme(&self, scheme: &str) {
        self.browser
            .issue_cmd(Chromedriver(
                "goog/cdp/execute",
                json!({
                    "cmd": "Emulation.setEmulatedMedia",
                    "params": {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
                }),
            ))
            .await
            .expect("emulate the colour scheme");
        let dark = self
            .browser
            .execute(
                "return matchMedia('(prefers-color-scheme: dark)').matches;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(dark, json!(scheme == "dark"), "the scheme took");
    }

    /// The accessibility check's violations on the page as shown now.
    async fn a11y(&self, page: &str) {
        let found = self
            .browser
            .execute(A11Y, vec![])
            .await
            .expect("a11y check");
        let found = found.as_array().cloned().unwrap_or_default();
        assert!(
            found.is_empty(),
            "{page}: accessibility violations:\n{}",
            found
                .iter()
                .map(|v| v.as_str().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Tabs through the page with the keyboard alone: every visible link, button and
    /// control takes the focus on the way. Returns how many there were.
    async fn keyboard(&self, page: &str) -> u64 {
        let (n, missed) = self.tab_through().await;
        assert_eq!(
            missed,
            json!([]),
            "{page}: keyboard navigation does not reach these"
        );
        n
    }

    /// Presses Tab once more than the page has links and controls; returns how many it has,
    /// and those the focus never reached.
    async fn tab_through(&self) -> (u64, Value) {
        use fantoccini::actions::{InputSource, KeyAction, KeyActions};
        use fantoccini::key::Key;
        let n = self
            .browser
            .execute(ACTIONABLE, vec![])
            .await
            .expect("actionable")
            .as_u64()
            .unwrap_or(0);
        let mut keys = KeyActions::new("keyboard".into());
        for _ in 0..n + 2 {
            keys = keys
                .then(KeyAction::Down {
                    value: Key::Tab.into(),
                })
                .then(KeyAction::Up {
                    value: Key::Tab.into(),
                });
        }
        self.browser.perform_actions(keys).await.expect("Tab");
        let missed = self
            .browser
            .execute(
                "return window.__actionable().map(window.__key).filter(k => !window.__reached.has(k));",
                vec![],
            )
            .await
            .expect("missed");
        (n, missed)
    }

    /// A page as an operator may see it: at a laptop's and a desktop's size, light and
    /// dark, each screenshotted and checked for accessibility; and navigated by keyboard.
    async fn review(&mut self, path: &str, name: &str) -> u64 {
        self.goto(path).await;
        let mut actions = 0;
        for (w, h) in [(1280, 800), (1920, 1080)] {
            self.browser
                .set_window_size(w, h)
                .await
                .expect("window size");
            for scheme in ["light", "dark"] {
                self.scheme(scheme).await;
                self.a11y(&format!("{path} at {w}x{h}, {scheme}")).await;
                self.shot(&format!("{name}-{w}x{h}-{scheme}")).await;
            }
        }
        self.scheme("light").await;
        actions += self.keyboard(path).await;
        actions
    }
}

/// Posts an introspection report as the agent does; returns the node's UUID.
fn report(base: &str, mac: &str) -> String {
    report_body(base, inventory(&[mac], 4, 8192, &[100]))
}

/// Posts `body` to `/v1/continue`; returns the node's UUID.
fn report_body(base: &str, body: Value) -> String {
    let body = body.to_string();
    let out = Command::new("curl")
        .args([
            "-sf",
            "-m",
            "10",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &body,
            &format!("{base}/v1/continue"),
        ])
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "/v1/continue failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    v["uuid"].as_str().expect("uuid").to_string()
}

fn screenshots_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshots dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    require(&["curl", "chromium", "chromedriver"]);
    let started = Instant::now();
    let scratch = Scratch::new("console-browser");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let config = scratch.path("paddock.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[dhcp]\nenabled = false\n[tftp]\nenabled = false\n",
            scratch.path("data").display()
        ),
    )
    .unwrap();
    let mut app = Proc::spawn(
        "paddock",
        Command::new(env!("CARGO_BIN_EXE_paddock"))
            .env("PADDOCK_INSECURE", "true")
            .args(["serve", "--config"])
            .arg(&config)
            .env("PADDOCK_LOG", "info"),
        scratch.path("paddock.log"),
    );
    app.wait_http(&format!("{base}/healthz"));

    let driver_port = free_port();
    let mut driver = Proc::spawn(
        "chromedriver",
        Command::new("chromedriver").arg(format!("--port={driver_port}")),
        scratch.path("chromedriver.log"),
    );
    let driver_url = format!("http://127.0.0.1:{driver_port}");
    driver.wait_http(&format!("{driver_url}/status"));

    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": "/usr/lib/chromium/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,800", "--no-first-run",
                format!("--user-data-dir={}", scratch.path("chromium").display()),
            ],
        },
        "goog:loggingPrefs": {"browser": "ALL"},
    });
    let caps = caps.as_object().cloned().unwrap();
    let browser =
        fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&driver_url)
            .await
            .expect("a WebDriver session with Chromium");
    let mut s = Session {
        browser,
        base: base.clone(),
        shots: screenshots_dir(),
        seen: 0,
    };

    // The console log is read for real: an error logged in the page is seen.
    s.goto("/ui").await;
    s.browser
        .execute("console.error('paddock-probe'); return null;", vec![])
        .await
        .unwrap();
    let probe = s
        .browser
        .issue_cmd(browser_log())
        .await
        .expect("browser log");
    assert!(
        probe.to_string().contains("paddock-probe") && probe.to_string().contains("SEVERE"),
        "the browser log does not show console errors: {probe}"
    );

    // The accessibility check and the keyboard walk find what they look for: a button with
    // no name, faint text and a link the keyboard cannot reach, put in the page.
    s.browser
        .execute(
            "document.body.insertAdjacentHTML('beforeend', '<button></button><p style=\"color:#c8c8c8\">faint</p><div inert><a href=\"#x\">unreachable</a></div>'); return null;",
            vec![],
        )
        .await
        .unwrap();
    let found = s.browser.execute(A11Y, vec![]).await.unwrap().to_string();
    assert!(
        found.contains("name: button") && found.contains("color-contrast: p \\\"faint\\\""),
        "the accessibility check missed the probes: {found}"
    );
    let (_, missed) = s.tab_through().await;
    assert!(
        missed.to_string().contains("unreachable"),
        "the keyboard walk missed the probe: {missed}"
    );
    s.goto("/ui").await;

    // 1. The machines list, empty; a machine enrols while it is open and appears by itself.
    s.wait_live().await;
    s.shot("machines-empty").await;
    s.mark().await;
    let uuid = report(&base, "52:54:00:c0:50:01");
    let row = format!("tr[data-node=\"{uuid}\"]");
    s.wait_present("the enrolled machine in the list", &row)
        .await;
    s.not_reloaded().await;
    let state = s.text(&format!("{row} .state")).await;
    assert_eq!(state, json!("finished"), "state in the list");
    s.shot("machines").await;

    // 2. Its page: inventory in readable units and the timeline.
    s.click(&format!("{row} a")).await;
    s.wait_present("the machine's page", "#inventory").await;
    s.text_has(
        "#inventory",
        &[
            "QEMU",
            "8.0 GiB",
            "4 × QEMU Virtual CPU",
            "/dev/vda",
            "52:54:00:c0:50:01",
        ],
    )
    .await;
    let rows = s
        .browser
        .find_all(Locator::Css("#timeline tr"))
        .await
        .expect("timeline rows");
    assert!(rows.len() >= 2, "a header and at least one entry");
    let timeline = s.text("#timeline").await;
    assert!(
        timeline
            .as_str()
            .is_some_and(|t| t.contains("finished") || t.contains("enrol")),
        "timeline: {timeline}"
    );
    s.wait_live().await;
    s.shot("machine").await;

    // 3. Start an introspection from the page: the state changes (waiting); the agent's next
    //    report then finishes it, shown live with its timeline entry.
    // No BMC: the page says the machine is inspected at its next PXE boot (manage_boot off).
    s.text_has("[data-live-region=summary]", &["no BMC"]).await;
    s.click("form[action$=\"/introspect\"] button").await;
    s.wait_js(
        "the waiting state",
        "const e = document.querySelector('[data-live-region=summary] .state'); return e ? e.textContent : null;",
        |v| v == "waiting",
    )
    .await;
    s.wait_live().await;
    s.shot("machine-introspecting").await;
    let entries_before = s
        .browser
        .find_all(Locator::Css("#timeline tr"))
        .await
        .unwrap()
        .len();
    s.mark().await;
    // Reported again at once, often within the same second as the first report: its entries
    // add to the timeline (they once replaced the first report's, filed under the same
    // second and index).
    assert_eq!(report(&base, "52:54:00:c0:50:01"), uuid);
    s.wait_js(
        "the finished state, live",
        "const e = document.querySelector('[data-live-region=summary] .state'); return e ? e.textContent : null;",
        |v| v == "finished",
    )
    .await;
    s.wait_js(
        "new timeline entries, live",
        "return document.querySelectorAll('#timeline tr').length;",
        |v| v.as_u64().is_some_and(|n| n as usize > entries_before),
    )
    .await;
    s.not_reloaded().await;
    s.shot("machine-reintrospected").await;

    // 4. A rule with a bad condition: the validation's error is shown, the text kept.
    s.goto("/ui/rules").await;
    s.shot("rules").await;
    let bad = r#"{"description": "bad", "conditions": [{"op": "no-such-op", "field": "memory_mb", "value": 1}], "actions": [{"action": "add-trait", "name": "CUSTOM_X"}]}"#;
    let area = s
        .browser
        .find(Locator::Id("rule-json"))
        .await
        .expect("the rule text area");
    area.clear().await.expect("clear");
    area.send_keys(bad).await.expect("type");
    s.click("form[action=\"/ui/rules\"] button").await;
    let error = s
        .wait_js(
            "the rule's error",
            "const e = document.getElementById('rule-error'); return e ? e.textContent : null;",
            |v| v.is_string(),
        )
        .await;
    assert!(
        error.as_str().is_some_and(|e| e.contains("no-such-op")),
        "error: {error}"
    );
    let kept = s
        .browser
        .execute("return document.getElementById('rule-json').value;", vec![])
        .await
        .unwrap();
    assert_eq!(kept, json!(bad));
    // The error is in the page, not the console.
    s.shot("rules-error").await;
    assert!(
        s.browser.find(Locator::Css("#rules")).await.is_err(),
        "no rule was created"
    );

    // 5. An image uploaded from the page appears with its sizes, without a reload.
    let tree = scratch.path("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/hostname"), "console\n").unwrap();
    std::fs::write(tree.join("etc/motd"), vec![b'x'; 3000]).unwrap();
    let tarball = scratch.path("upload.tar");
    support::sh_ok(&format!(
        "tar -C {} -cf {} .",
        tree.display(),
        tarball.display()
    ));
    s.goto("/ui/images").await;
    s.wait_live().await;
    s.shot("images-empty").await;
    s.mark().await;
    s.type_into("#upload input[name=name]", "console/upload.1")
        .await;
    s.type_into(
        "#upload input[name=tarball]",
        &tarball.display().to_string(),
    )
    .await;
    s.click("#upload button").await;
    let image_row = "tr[data-image=\"console/upload.1\"]";
    s.wait_present("the uploaded image in the list", image_row)
        .await;
    s.not_reloaded().await;
    let cells = s
        .browser
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0] + ' td')).map(c => c.textContent);",
            vec![json!(image_row)],
        )
        .await
        .unwrap();
    // Image, Files, Bytes: two files of 8 and 3,000 bytes.
    assert_eq!(cells[0], json!("console/upload.1"), "{cells}");
    assert_eq!(cells[1], json!("2"), "{cells}");
    assert_eq!(cells[2], json!("2.9 KiB"), "{cells}");
    let bar = s
        .browser
        .execute(
            "return document.getElementById('upload-progress').value;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(bar, json!(100), "the progress bar");
    s.shot("images").await;

    // 5b. Deleting it asks first; confirmed, it leaves the list and its name is retired.
    s.click(&format!("{image_row} form button")).await;
    s.wait_present("the confirmation page", "form input[name=confirm]")
        .await;
    s.text_has("body", &["Delete image console/upload.1?"])
        .await;
    s.shot("image-delete-confirm").await;
    s.click("form button[type=submit]").await;
    let gone = format!(
        "return location.pathname === '/ui/images' && document.getElementById('images') !== null && document.querySelector({}) === null;",
        json!(image_row)
    );
    s.wait_js("the image gone from the list", &gone, |v| v == true)
        .await;
    s.text_has("[data-live-region=images]", &["console/upload.1"])
        .await;
    s.shot("image-deleted").await;

    // 6. The dashboard counts the machine and names this host.
    s.goto("/ui/dashboard").await;
    s.wait_live().await;
    s.text_has(
        "[data-live-region=dashboard]",
        &[
            "one host: this host serves PXE",
            "Nothing needs you",
            "Machines",
            "subs synced to their required image",
            "Per minute, the last hour",
        ],
    )
    .await;
    s.shot("dashboard").await;

    // 7. Every other page renders without a console error.
    for (path, name) in [
        ("/ui/leases", "leases"),
        ("/ui/firewall", "firewall"),
        ("/ui/mdb", "mdb"),
        ("/ui/subs", "subs"),
    ] {
        // Each at once: the live pages left behind hold no connection (six live pages
        // have been open by now, the browser's limit per host).
        let t = Instant::now();
        s.goto(path).await;
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{path} took {:?}: a page left behind still holds its stream",
            t.elapsed()
        );
        s.shot(name).await;
    }

    // 8. A run's progress, live: the machine is provisioned; as the ramdisk reports its steps
    //    the bar on its page moves, without a reload.
    support::sh_ok(&format!(
        "curl -sf -H 'Content-Type: application/x-tar' --data-binary @{} '{base}/ui/images?name=console/run.1'",
        tarball.display()
    ));
    support::sh_ok(&format!(
        "curl -sf -H 'Content-Type: application/json' -d '{{\"image\": \"console/run.1\"}}' {base}/api/v1/nodes/{uuid}/provision"
    ));
    s.goto(&format!("/ui/nodes/{uuid}")).await;
    s.wait_live().await;
    s.wait_present("the run's progress bar", "#run-bar").await;
    s.text_has(
        "#run-progress",
        &["birth of console/run.1", "step 1 of 9", "choose_disk"],
    )
    .await;
    s.mark().await;
    let bar = "const e = document.getElementById('run-bar'); return e ? e.value : null;";
    let mut last = s.wait_js("the bar at 0", bar, |v| v == 0).await;
    for step in ["choose_disk", "partition", "filesystems"] {
        let body = json!({"event": {"event": "step_done", "step": step}}).to_string();
        support::sh_ok(&format!(
            "curl -sf -H 'Content-Type: application/json' -d '{body}' {base}/api/v1/provision/{uuid}/report"
        ));
        let before = last.as_u64().unwrap_or(0);
        last = s
            .wait_js(&format!("the bar past {before} after {step}"), bar, |v| {
                v.as_u64().is_some_and(|v| v > before)
            })
            .await;
    }
    s.not_reloaded().await;
    assert_eq!(last, json!(33), "three steps of nine");
    s.text_has("#run-step", &["start_subd"]).await;
    // Tall enough to show the hardware cards too (the README's picture of a machine).
    s.browser
        .set_window_size(1280, 1500)
        .await
        .expect("window size");
    s.shot("machine-progress").await;
    s.browser
        .set_window_size(1280, 800)
        .await
        .expect("window size");

    // 9. A bulk action from the list: the machine ticked, "Introspect" asks first, naming
    //    it; confirmed, each machine's outcome is shown.
    s.goto("/ui").await;
    s.wait_live().await;
    s.click(&format!("{row} input[name=node]")).await;
    s.click("button[formaction=\"/ui/bulk/introspect\"]").await;
    s.wait_present("the bulk confirmation", "form input[name=confirm]")
        .await;
    s.text_has("main", &["Introspect: 1 machine(s)?", &uuid])
        .await;
    s.shot("bulk-confirm").await;
    s.click("form button[type=submit]").await;
    s.wait_present("the bulk outcome", "#bulk-summary").await;
    s.text_has("#bulk-summary", &["Introspect: 1 done, 0 refused."])
        .await;
    s.shot("bulk-done").await;

    // 10. Every page, reviewed: two sizes, light and dark, screenshots, the accessibility
    //     check and keyboard-only navigation; with a few more machines, one whose ramdisk
    //     failed (the dashboard's "needs attention" list, the list's error column).
    for i in 2..8u32 {
        let mut body = inventory(
            &[&format!("52:54:00:c0:50:0{i}")],
            2 * i,
            4096 * u64::from(i),
            &[50 * u64::from(i)],
        );
        if i == 7 {
            // The processing fails, and says so to the agent: its answer is an error.
            body["error"] = json!("the disk /dev/vda did not answer");
            support::sh(&format!(
                "curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary '{body}' {base}/v1/continue"
            ));
            continue;
        }
        report_body(&base, body);
    }
    let pages = [
        ("/ui/dashboard".to_string(), "review-dashboard"),
        ("/ui".to_string(), "review-machines"),
        (format!("/ui/nodes/{uuid}"), "review-machine"),
        ("/ui/rules".to_string(), "review-rules"),
        ("/ui/leases".to_string(), "review-leases"),
        ("/ui/firewall".to_string(), "review-firewall"),
        ("/ui/images".to_string(), "review-images"),
        ("/ui/images/console/run.1".to_string(), "review-image"),
        ("/ui/mdb".to_string(), "review-mdb"),
        ("/ui/subs".to_string(), "review-subs"),
        ("/ui/roles".to_string(), "review-roles"),
        ("/ui/audit".to_string(), "review-audit"),
        ("/ui/login".to_string(), "review-login"),
    ];
    let mut reached = 0;
    for (path, name) in &pages {
        reached += s.review(path, name).await;
    }
    eprintln!(
        "console review: {} pages at 2 sizes, light and dark: no accessibility violation; \
         keyboard reached all {reached} links and controls",
        pages.len()
    );
    s.browser.close().await.expect("close the session");
    drop(driver);
    drop(app);
    eprintln!(
        "console browser test: {} console entries, none an error; screenshots in {}; {:.1} s",
        s.seen,
        s.shots.display(),
        started.elapsed().as_secs_f64()
    );
}
