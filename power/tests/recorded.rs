//! Both drivers against answers recorded from the real emulators (sushy-tools 2.2.0 over
//! libvirt, virtualbmc 3.3.0 with ipmitool 1.8.19; `tests/fixtures/`, recorded through
//! `scripts/bmc-harness.sh`), error answers included. No network: the Redfish driver runs
//! over a transport that replays `.http` recordings (`curl -si`), the IPMI driver over a
//! runner that replays `ipmitool`'s stdout, stderr and exit status.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use paddock_power::ipmi::{self, Op, Output, Runner};
use paddock_power::redfish::{self, Method, Request, Response, Transport};
use paddock_power::{
    Credentials, ErrorKind, Ipmi, IpmiBmc, PowerDriver, PowerError, PowerState, Redfish,
    RetryPolicy,
};
use serde_json::{Value, json};

const SYSTEM: &str = "/redfish/v1/Systems/78b858c4-9755-49b3-bc40-553ba79cebf5";

fn fixture(path: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A `curl -si` recording: status line, headers, blank line, body.
fn http(name: &str) -> Response {
    let raw = fixture(&format!("redfish/{name}.http"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{name}: no end of headers"));
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let etag = lines
        .filter_map(|l| l.split_once(": "))
        .find(|(k, _)| k.eq_ignore_ascii_case("etag"))
        .map(|(_, v)| v.to_string());
    Response {
        status,
        etag,
        body: raw[split + 4..].to_vec(),
    }
}

/// A recorded System with `edit` applied to its JSON (for BMCs that list other values).
fn edited(name: &str, edit: impl FnOnce(&mut Value)) -> Response {
    let mut r = http(name);
    let mut v: Value = serde_json::from_slice(&r.body).unwrap();
    edit(&mut v);
    r.body = serde_json::to_vec(&v).unwrap();
    r
}

/// Replays one answer per request, in order, and keeps the requests.
#[derive(Default)]
struct Replay {
    answers: Mutex<VecDeque<Result<Response, PowerError>>>,
    sent: Mutex<Vec<Request>>,
}

impl Replay {
    fn new(answers: Vec<Result<Response, PowerError>>) -> Replay {
        Replay {
            answers: Mutex::new(answers.into()),
            sent: Mutex::default(),
        }
    }
}

impl Transport for &Replay {
    fn send(&self, request: &Request) -> Result<Response, PowerError> {
        self.sent.lock().unwrap().push(request.clone());
        self.answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| panic!("no recorded answer left for {request:?}"))
    }
}

/// Replays these recordings, in order.
fn recorded(names: &[&str]) -> Replay {
    Replay::new(names.iter().map(|n| Ok(http(n))).collect())
}

fn no_sleep(_: Duration) {}

fn redfish(replay: &Replay) -> Redfish<&Replay> {
    Redfish::over(replay, None, RetryPolicy::default()).with_sleep(no_sleep)
}

/// The requests sent, as `METHOD path body`.
fn sent(replay: &Replay) -> Vec<String> {
    replay
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            let m = match r.method {
                Method::Get => "GET",
                Method::Post => "POST",
                Method::Patch => "PATCH",
            };
            match &r.body {
                Some(b) => format!("{m} {} {b}", r.path),
                None => format!("{m} {}", r.path),
            }
        })
        .collect()
}

#[test]
fn redfish_status_reads_the_only_system_of_the_collection() {
    let replay = recorded(&["systems", "system-off"]);
    let d = redfish(&replay);
    assert_eq!(d.status().unwrap(), PowerState::Off);
    assert_eq!(
        sent(&replay),
        ["GET /redfish/v1/Systems", &format!("GET {SYSTEM}")]
    );
    // The System's path is found once.
    replay
        .answers
        .lock()
        .unwrap()
        .push_back(Ok(http("system-on")));
    assert_eq!(d.status().unwrap(), PowerState::On);
    assert_eq!(sent(&replay).len(), 3);
}

#[test]
fn redfish_power_on_posts_the_reset_the_bmc_allows_and_skips_a_machine_already_on() {
    let replay = recorded(&["systems", "system-off", "reset-on", "system-on"]);
    let d = redfish(&replay);
    d.power_on().unwrap();
    d.power_on().unwrap();
    assert_eq!(
        sent(&replay),
        [
            "GET /redfish/v1/Systems".to_string(),
            format!("GET {SYSTEM}"),
            format!("POST {SYSTEM}/Actions/ComputerSystem.Reset {{\"ResetType\":\"On\"}}"),
            format!("GET {SYSTEM}"),
        ]
    );
}

#[test]
fn redfish_power_off_is_force_off_and_reboot_is_force_restart_or_on() {
    let replay = recorded(&[
        "systems",
        "system-on",
        "reset-forceoff",
        "system-on",
        "reset-on",
        "system-off",
        "reset-on",
        "system-off",
    ]);
    let d = redfish(&replay);
    d.power_off().unwrap();
    d.reboot().unwrap();
    d.reboot().unwrap();
    d.power_off().unwrap();
    let posts: Vec<String> = sent(&replay)
        .into_iter()
        .filter(|s| s.starts_with("POST"))
        .collect();
    let reset = format!("POST {SYSTEM}/Actions/ComputerSystem.Reset");
    assert_eq!(
        posts,
        [
            format!("{reset} {{\"ResetType\":\"ForceOff\"}}"),
            format!("{reset} {{\"ResetType\":\"ForceRestart\"}}"),
            format!("{reset} {{\"ResetType\":\"On\"}}"),
        ]
    );
}

#[test]
fn redfish_boot_to_pxe_once_patches_boot() {
    let replay = recorded(&["systems", "system-on", "boot-pxe"]);
    redfish(&replay).boot_pxe_once().unwrap();
    let s = replay.sent.lock().unwrap();
    assert_eq!(s[2].method, Method::Patch);
    assert_eq!(s[2].path, SYSTEM);
    assert_eq!(
        s[2].body,
        Some(
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}})
        )
    );
    assert_eq!(s[2].if_match, None, "sushy-tools sends no ETag");
    // After the recorded PATCH sushy-tools shows the override.
    let after: Value = serde_json::from_slice(&http("system-on-pxe").body).unwrap();
    assert_eq!(after["Boot"]["BootSourceOverrideTarget"], "Pxe");
}

#[test]
fn redfish_boot_override_carries_the_etag_and_needs_pxe_among_the_targets() {
    let mut with_tag = http("system-on");
    with_tag.etag = Some("W/\"abc\"".into());
    let system = redfish::System::parse(SYSTEM, &with_tag).unwrap();
    assert_eq!(
        redfish::boot_pxe_request(&system)
            .unwrap()
            .if_match
            .as_deref(),
        Some("W/\"abc\"")
    );
    let no_pxe = edited("system-on", |v| {
        v["Boot"]["BootSourceOverrideTarget@Redfish.AllowableValues"] = json!(["Hdd", "Cd"])
    });
    let system = redfish::System::parse(SYSTEM, &no_pxe).unwrap();
    let e = redfish::boot_pxe_request(&system).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("Hdd, Cd"), "{e}");
}

#[test]
fn redfish_wrong_password_is_a_credentials_error_and_is_not_retried() {
    let replay = recorded(&["wrong-password"]);
    let e = redfish(&replay).status().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.message.contains("HTTP 401"), "{e}");
    assert!(e.message.contains("Incorrect username or password"), "{e}");
    assert!(
        e.message
            .contains("check the node's BMC user name and password"),
        "{e}"
    );
    assert_eq!(
        sent(&replay).len(),
        1,
        "a wrong password is never tried again"
    );
}

#[test]
fn redfish_a_missing_system_is_unsupported_with_the_bmcs_message() {
    let e = redfish::check("GET x", &http("no-such-system")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("HTTP 404"), "{e}");
    assert!(
        e.message
            .contains("no domain with matching name 'no-such-system'"),
        "{e}"
    );
    // A configured System that is not a member is refused before any request to it.
    let replay = recorded(&["systems"]);
    let d = Redfish::over(&replay, Some("no-such-system".into()), RetryPolicy::ONCE);
    let e = d.status().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains(SYSTEM), "the members are listed: {e}");
    // By id or by path, a member is found.
    let id = SYSTEM.rsplit('/').next().unwrap();
    let collection: Value = serde_json::from_slice(&http("systems").body).unwrap();
    assert_eq!(
        redfish::choose_system(&collection, Some(id)).unwrap(),
        SYSTEM
    );
    assert_eq!(
        redfish::choose_system(&collection, Some(SYSTEM)).unwrap(),
        SYSTEM
    );
}

#[test]
fn redfish_several_systems_need_one_named() {
    let two = json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}, {"@odata.id": "/redfish/v1/Systems/2"}]});
    let e = redfish::choose_system(&two, None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("2 Systems"), "{e}");
    assert_eq!(
        redfish::choose_system(&two, Some("2")).unwrap(),
        "/redfish/v1/Systems/2"
    );
    let e = redfish::choose_system(&json!({"Members": []}), None).unwrap_err();
    assert!(e.message.contains("empty"), "{e}");
}

#[test]
fn redfish_reset_types_follow_the_allowable_values() {
    // A BMC without ForceRestart restarts with PowerCycle.
    let replay = Replay::new(vec![
        Ok(http("systems")),
        Ok(edited("system-on", |v| {
            v["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] =
                json!(["On", "ForceOff", "PowerCycle"])
        })),
        Ok(http("reset-on")),
    ]);
    redfish(&replay).reboot().unwrap();
    assert!(sent(&replay)[2].ends_with("{\"ResetType\":\"PowerCycle\"}"));
    // One that cannot force off says so, with what it allows.
    let replay = Replay::new(vec![
        Ok(http("systems")),
        Ok(edited("system-on", |v| {
            v["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] =
                json!(["On", "GracefulShutdown"])
        })),
    ]);
    let e = redfish(&replay).power_off().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("On, GracefulShutdown"), "{e}");
    assert_eq!(sent(&replay).len(), 2, "nothing was posted");
    // With no list at all, the first choice is sent (as sushy does).
    assert_eq!(redfish::reset_type(redfish::Reset::On, None).unwrap(), "On");
    // ForceOn serves when On is not allowed.
    let allowed = vec!["ForceOn".to_string()];
    assert_eq!(
        redfish::reset_type(redfish::Reset::On, Some(&allowed)).unwrap(),
        "ForceOn"
    );
}

#[test]
fn redfish_allowed_reset_types_are_read_from_action_info_when_not_inline() {
    let info = "/redfish/v1/Systems/1/ResetActionInfo";
    let replay = Replay::new(vec![
        Ok(http("systems")),
        Ok(edited("system-off", |v| {
            let reset = &mut v["Actions"]["#ComputerSystem.Reset"];
            reset
                .as_object_mut()
                .unwrap()
                .remove("ResetType@Redfish.AllowableValues");
            reset["@Redfish.ActionInfo"] = json!(info);
        })),
        Ok(Response {
            status: 200,
            etag: None,
            body: serde_json::to_vec(&json!({"Parameters": [
                {"Name": "ResetType", "AllowableValues": ["ForceOn", "ForceOff"]}
            ]}))
            .unwrap(),
        }),
        Ok(http("reset-on")),
    ]);
    redfish(&replay).power_on().unwrap();
    let s = sent(&replay);
    assert_eq!(s[2], format!("GET {info}"));
    assert!(s[3].ends_with("{\"ResetType\":\"ForceOn\"}"), "{s:?}");
}

#[test]
fn redfish_busy_answers_and_unreachable_bmcs_are_retried_a_bounded_number_of_times() {
    let busy = Response {
        status: 503,
        etag: None,
        body: br#"{"error":{"message":"try later"}}"#.to_vec(),
    };
    let replay = Replay::new(vec![Ok(busy), Ok(http("systems")), Ok(http("system-on"))]);
    assert_eq!(redfish(&replay).status().unwrap(), PowerState::On);
    assert_eq!(sent(&replay).len(), 3);

    let down = || {
        Err(PowerError::new(
            ErrorKind::Unreachable,
            "connection refused",
        ))
    };
    let replay = Replay::new(vec![down(), down(), down(), down()]);
    let e = redfish(&replay).status().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable);
    assert_eq!(sent(&replay).len(), 3, "the default policy tries 3 times");
    assert!(e.message.contains("after 3 tries"), "{e}");
}

#[test]
fn redfish_bad_answers_are_named() {
    let cases: Vec<(Response, &str)> = vec![
        (
            Response {
                status: 200,
                etag: None,
                body: b"<html>".to_vec(),
            },
            "not JSON",
        ),
        (
            edited("system-on", |v| v["PowerState"] = json!("Sideways")),
            "unknown PowerState",
        ),
        (
            edited("system-on", |v| {
                v.as_object_mut().unwrap().remove("PowerState");
            }),
            "no PowerState",
        ),
        (
            edited("system-on", |v| {
                v["Actions"]["#ComputerSystem.Reset"]["target"] = json!("http://elsewhere/reset")
            }),
            "not a path on this BMC",
        ),
    ];
    for (answer, says) in cases {
        let e = redfish::System::parse(SYSTEM, &answer).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadAnswer);
        assert!(e.message.contains(says), "{e}");
    }
    let redirect = Response {
        status: 302,
        etag: None,
        body: vec![],
    };
    assert_eq!(
        redfish::check("GET x", &redirect).unwrap_err().kind,
        ErrorKind::BadAnswer
    );
    let conflict = Response {
        status: 409,
        etag: None,
        body: br#"{"error":{"@Message.ExtendedInfo":[{"Message":"The system is in POST."}]}}"#
            .to_vec(),
    };
    let e = redfish::check("POST x", &conflict).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Refused);
    assert!(
        e.message.ends_with("HTTP 409: The system is in POST."),
        "{e}"
    );
}

// --- IPMI ---------------------------------------------------------------------------------

/// Replays recorded `ipmitool` runs, one per call, and checks each asks what was recorded.
struct Recorded(Mutex<VecDeque<(Op, &'static str)>>);

impl Recorded {
    fn new(runs: &[(Op, &'static str)]) -> Recorded {
        Recorded(Mutex::new(runs.iter().copied().collect()))
    }
    fn left(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

fn ipmi_output(name: &str) -> Output {
    let text = |ext: &str| String::from_utf8(fixture(&format!("ipmi/{name}.{ext}"))).unwrap();
    Output {
        success: text("rc").trim() == "0",
        stdout: text("stdout"),
        stderr: text("stderr"),
    }
}

impl Runner for &Recorded {
    fn run(&self, _bmc: &IpmiBmc, op: Op) -> Result<Output, PowerError> {
        let (expected, name) = self
            .0
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| panic!("no recorded run left for {op:?}"));
        assert_eq!(op, expected, "recorded run {name}");
        Ok(ipmi_output(name))
    }
}

fn bmc() -> IpmiBmc {
    IpmiBmc::new(
        "198.19.60.1",
        6230,
        Credentials::new("admin", "paddock-bmc-secret"),
    )
}

fn ipmi(runs: &Recorded) -> Ipmi<&Recorded> {
    Ipmi::with_runner(bmc(), runs, RetryPolicy::default())
        .unwrap()
        .with_sleep(no_sleep)
}

#[test]
fn ipmitool_arguments_carry_no_password() {
    let args = ipmi::argv(&bmc(), Op::BootPxe);
    assert_eq!(
        args,
        [
            "-I",
            "lanplus",
            "-H",
            "198.19.60.1",
            "-p",
            "6230",
            "-U",
            "admin",
            "-E",
            "-N",
            "2",
            "-R",
            "2",
            "-v",
            "chassis",
            "bootdev",
            "pxe"
        ]
    );
    assert!(!args.iter().any(|a| a.contains("paddock-bmc-secret")));
    assert_eq!(&ipmi::argv(&bmc(), Op::Status)[14..], ["power", "status"]);
    assert_eq!(&ipmi::argv(&bmc(), Op::Reset)[14..], ["power", "reset"]);
}

#[test]
fn ipmi_settings_that_ipmitool_could_misread_are_refused() {
    let mut b = bmc();
    b.host = "-oProxyCommand=x".into();
    assert_eq!(b.validate().unwrap_err().kind, ErrorKind::Unsupported);
    let mut b = bmc();
    b.host = "bmc 1".into();
    assert!(b.validate().is_err());
    let mut b = bmc();
    b.credentials = Credentials::new("admin", "x".repeat(21));
    assert!(b.validate().is_err());
    let mut b = bmc();
    b.credentials = Credentials::new("a".repeat(17), "x");
    assert!(b.validate().is_err());
    assert!(bmc().validate().is_ok());
}

#[test]
fn ipmi_status_on_and_off_are_read_from_the_recorded_output() {
    let runs = Recorded::new(&[
        (Op::Status, "power-status-off"),
        (Op::Status, "power-status-on"),
    ]);
    let d = ipmi(&runs);
    assert_eq!(d.status().unwrap(), PowerState::Off);
    assert_eq!(d.status().unwrap(), PowerState::On);
}

#[test]
fn ipmi_power_on_off_reboot_and_pxe_run_the_recorded_commands() {
    let runs = Recorded::new(&[
        (Op::Status, "power-status-off"),
        (Op::On, "power-on"),
        (Op::Status, "power-status-on"),
        (Op::Status, "power-status-on"),
        (Op::Reset, "power-reset"),
        (Op::Status, "power-status-off"),
        (Op::On, "power-on"),
        (Op::BootPxe, "bootdev-pxe"),
        (Op::Status, "power-status-on"),
        (Op::Off, "power-off"),
        (Op::Status, "power-status-off"),
    ]);
    let d = ipmi(&runs);
    d.power_on().unwrap();
    d.power_on().unwrap(); // already on: only the status
    d.reboot().unwrap(); // on: reset
    d.reboot().unwrap(); // off: on
    d.boot_pxe_once().unwrap();
    d.power_off().unwrap();
    d.power_off().unwrap(); // already off
    assert_eq!(runs.left(), 0);
}

#[test]
fn ipmi_wrong_password_and_wrong_user_are_credentials_errors_never_retried() {
    for name in ["wrong-password", "wrong-user"] {
        let runs = Recorded::new(&[(Op::Status, name)]);
        let e = ipmi(&runs).status().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Credentials, "{name}: {e}");
        assert!(
            e.message
                .contains("check the node's BMC user name and password"),
            "{e}"
        );
        assert!(
            e.message.contains("RAKP"),
            "the BMC's reason is quoted: {e}"
        );
        assert_eq!(runs.left(), 0);
    }
}

#[test]
fn ipmi_unreachable_bmc_is_named_and_retried_a_bounded_number_of_times() {
    let runs = Recorded::new(&[(Op::Status, "unreachable"); 3]);
    let e = ipmi(&runs).status().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(e.message.contains("198.19.60.1:6230"), "{e}");
    assert!(e.message.contains("after 3 tries"), "{e}");
    assert_eq!(runs.left(), 0);
}

#[test]
fn ipmi_a_command_the_bmc_does_not_implement_is_unsupported() {
    // virtualbmc refuses `power cycle`; with -v, successful runs also print "Invalid command"
    // for ipmitool's own probe, which must not count.
    let e = ipmi::interpret(Op::Reset, "bmc", &ipmi_output("power-cycle")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("Invalid data field in request"), "{e}");
    assert!(
        ipmi_output("power-status-on")
            .stderr
            .contains("Invalid command")
    );
    assert_eq!(
        ipmi::interpret(Op::Status, "bmc", &ipmi_output("power-status-on")).unwrap(),
        Some(PowerState::On)
    );
}

#[test]
fn ipmi_unexpected_output_is_a_bad_answer() {
    let odd = Output {
        success: true,
        stdout: "Chassis Power is \u{1b}[31msideways\n".into(),
        stderr: String::new(),
    };
    let e = ipmi::interpret(Op::Status, "bmc", &odd).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadAnswer);
    assert!(
        !e.message.contains('\u{1b}'),
        "BMC text is quoted without control characters"
    );
    let e = ipmi::interpret(Op::On, "bmc", &ipmi_output("power-off")).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::BadAnswer,
        "off's answer does not confirm on"
    );
}
