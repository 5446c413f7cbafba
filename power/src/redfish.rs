//! The Redfish driver. The core is pure: [`Request`]s built, [`Response`]s read and
//! classified ([`check`], [`choose_system`], [`System::parse`], [`reset_type`],
//! [`boot_pxe_request`]); the [`Redfish`] driver strings them together over a [`Transport`]
//! (`ureq` in the appliance, recorded answers in the tests).
//!
//! The flow follows Ironic's redfish driver and sushy: the System is the only member of
//! `/redfish/v1/Systems` (or the one configured); power state is its `PowerState`; a power
//! action is a POST to its `#ComputerSystem.Reset` target with the first `ResetType` the BMC
//! allows (`ResetType@Redfish.AllowableValues`, else the action's `@Redfish.ActionInfo`; with
//! neither, all are assumed allowed, as sushy does); the one-time PXE boot is a PATCH of
//! `Boot` with `BootSourceOverrideTarget: Pxe`, `BootSourceOverrideEnabled: Once`, carrying
//! the System's ETag as `If-Match` when it has one.

use std::sync::Mutex;

use serde_json::{Value, json};

use crate::text::quote;
pub use crate::transport::{Method, RedfishBmc, Request, Response, TlsVerify, Transport};
use crate::{ErrorKind, PowerDriver, PowerError, PowerState, RetryPolicy};

pub const SYSTEMS: &str = "/redfish/v1/Systems";

/// The answer's status as an error when it is one, with the BMC's own message (Redfish's
/// `error.@Message.ExtendedInfo[].Message`, else `error.message`, else the text).
pub fn check(what: &str, r: &Response) -> Result<(), PowerError> {
    let kind = match r.status {
        200..=299 => return Ok(()),
        401 | 403 => ErrorKind::Credentials,
        404 | 405 | 501 => ErrorKind::Unsupported,
        429 | 500..=599 => ErrorKind::Busy,
        400..=499 => ErrorKind::Refused,
        _ => ErrorKind::BadAnswer,
    };
    let said = redfish_message(&r.body);
    let hint = match kind {
        ErrorKind::Credentials => ": check the node's BMC user name and password",
        _ => "",
    };
    let said = if said.is_empty() {
        String::new()
    } else {
        format!(": {said}")
    };
    Err(PowerError::new(
        kind,
        format!("{what}: HTTP {}{said}{hint}", r.status),
    ))
}

/// The message of a Redfish error body, quoted; empty if there is none.
pub fn redfish_message(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return quote(&String::from_utf8_lossy(body));
    };
    let err = &v["error"];
    let extended: Vec<&str> = err["@Message.ExtendedInfo"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["Message"].as_str()).collect())
        .unwrap_or_default();
    if !extended.is_empty() {
        return quote(&extended.join("; "));
    }
    quote(err["message"].as_str().unwrap_or_default())
}

fn parse_json(what: &str, r: &Response) -> Result<Value, PowerError> {
    serde_json::from_slice(&r.body).map_err(|e| {
        PowerError::new(
            ErrorKind::BadAnswer,
            format!("{what}: the answer is not JSON ({e})"),
        )
    })
}

/// A path the BMC gave (an `@odata.id`, an action target) made safe to request on the same
/// BMC: absolute, no scheme or host, no spaces, control characters, query or fragment.
pub fn bmc_path(what: &str, p: &str) -> Result<String, PowerError> {
    let ok = p.starts_with('/')
        && !p.starts_with("//")
        && p.len() <= 1024
        && p.chars()
            .all(|c| c.is_ascii_graphic() && !"?#\\".contains(c));
    if ok {
        Ok(p.to_string())
    } else {
        Err(PowerError::new(
            ErrorKind::BadAnswer,
            format!("{what}: {:?} is not a path on this BMC", quote(p)),
        ))
    }
}

/// The System to drive: `wanted` (an id, or a path under `/redfish/v1/Systems/`) when given,
/// which must be a member; else the only member.
pub fn choose_system(collection: &Value, wanted: Option<&str>) -> Result<String, PowerError> {
    let what = "the BMC's Systems collection";
    let members: Vec<&str> = collection["Members"]
        .as_array()
        .ok_or_else(|| PowerError::new(ErrorKind::BadAnswer, format!("{what} has no Members")))?
        .iter()
        .filter_map(|m| m["@odata.id"].as_str())
        .collect();
    let pick = match wanted {
        Some(w) => {
            let w = w.trim_end_matches('/');
            members.iter().copied().find(|m| {
                let m = m.trim_end_matches('/');
                m == w || m.rsplit('/').next() == Some(w)
            })
        }
        None if members.len() == 1 => Some(members[0]),
        None => None,
    };
    match pick {
        Some(p) => bmc_path(what, p),
        None => {
            let listed = members.iter().map(|m| quote(m)).collect::<Vec<_>>();
            let msg = match wanted {
                Some(w) => format!(
                    "{what} has no System {:?} (members: {})",
                    quote(w),
                    listed.join(", ")
                ),
                None if members.is_empty() => format!("{what} is empty"),
                None => format!(
                    "{what} has {} Systems ({}): name the node's one in its BMC settings",
                    members.len(),
                    listed.join(", ")
                ),
            };
            Err(PowerError::new(ErrorKind::Unsupported, msg))
        }
    }
}

/// What this driver reads of a ComputerSystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct System {
    pub path: String,
    pub power: PowerState,
    /// The `#ComputerSystem.Reset` target, if the System offers the action.
    pub reset_target: Option<String>,
    /// `ResetType@Redfish.AllowableValues`, if listed.
    pub reset_allowed: Option<Vec<String>>,
    /// The action's `@Redfish.ActionInfo`, where the allowed values are when not inline.
    pub reset_action_info: Option<String>,
    /// `Boot.BootSourceOverrideTarget@Redfish.AllowableValues`, if listed.
    pub boot_targets: Option<Vec<String>>,
    /// The ETag (header, else `@odata.etag`), for `If-Match`.
    pub etag: Option<String>,
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array().map(|a| {
        a.iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    })
}

impl System {
    pub fn parse(path: &str, r: &Response) -> Result<System, PowerError> {
        let what = format!("the System {path}");
        let v = parse_json(&what, r)?;
        let power = match v["PowerState"].as_str() {
            Some("On") | Some("Paused") => PowerState::On,
            Some("Off") => PowerState::Off,
            Some("PoweringOn") => PowerState::PoweringOn,
            Some("PoweringOff") => PowerState::PoweringOff,
            Some(other) => {
                return Err(PowerError::new(
                    ErrorKind::BadAnswer,
                    format!("{what}: unknown PowerState {:?}", quote(other)),
                ));
            }
            None => {
                return Err(PowerError::new(
                    ErrorKind::BadAnswer,
                    format!("{what} has no PowerState"),
                ));
            }
        };
        let reset = &v["Actions"]["#ComputerSystem.Reset"];
        let reset_target = match reset["target"].as_str() {
            Some(t) => Some(bmc_path(&what, t)?),
            None => None,
        };
        let reset_action_info = match reset["@Redfish.ActionInfo"].as_str() {
            Some(t) => Some(bmc_path(&what, t)?),
            None => None,
        };
        Ok(System {
            path: path.to_string(),
            power,
            reset_target,
            reset_allowed: strings(&reset["ResetType@Redfish.AllowableValues"]),
            reset_action_info,
            boot_targets: strings(&v["Boot"]["BootSourceOverrideTarget@Redfish.AllowableValues"]),
            etag: r
                .etag
                .clone()
                .or_else(|| v["@odata.etag"].as_str().map(str::to_string)),
        })
    }
}

/// The allowed `ResetType` values of an ActionInfo resource (its `ResetType` parameter).
pub fn action_info_reset_types(info: &Value) -> Option<Vec<String>> {
    info["Parameters"]
        .as_array()?
        .iter()
        .find(|p| p["Name"] == "ResetType")
        .and_then(|p| strings(&p["AllowableValues"]))
}

/// What a power call asks of the Reset action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    On,
    Off,
    Restart,
}

/// The `ResetType` for `want`: the first of its choices (Ironic's order) the BMC allows;
/// `allowed == None` means the BMC lists nothing, so the first choice is taken.
pub fn reset_type(want: Reset, allowed: Option<&[String]>) -> Result<&'static str, PowerError> {
    let choices: &[&'static str] = match want {
        Reset::On => &["On", "ForceOn"],
        Reset::Off => &["ForceOff"],
        Reset::Restart => &["ForceRestart", "PowerCycle"],
    };
    let Some(allowed) = allowed else {
        return Ok(choices[0]);
    };
    choices
        .iter()
        .copied()
        .find(|c| allowed.iter().any(|a| a == c))
        .ok_or_else(|| {
            PowerError::new(
                ErrorKind::Unsupported,
                format!(
                    "the BMC allows ResetType {} but this needs one of {}",
                    quote(&allowed.join(", ")),
                    choices.join(", ")
                ),
            )
        })
}

/// The POST of the Reset action with `reset_type`.
pub fn reset_request(system: &System, reset_type: &str) -> Result<Request, PowerError> {
    let target = system.reset_target.clone().ok_or_else(|| {
        PowerError::new(
            ErrorKind::Unsupported,
            format!(
                "the System {} has no #ComputerSystem.Reset action",
                system.path
            ),
        )
    })?;
    Ok(Request {
        method: Method::Post,
        path: target,
        body: Some(json!({ "ResetType": reset_type })),
        if_match: None,
    })
}

/// The PATCH that makes the next boot, and only it, a PXE boot.
pub fn boot_pxe_request(system: &System) -> Result<Request, PowerError> {
    if let Some(targets) = &system.boot_targets
        && !targets.iter().any(|t| t == "Pxe")
    {
        return Err(PowerError::new(
            ErrorKind::Unsupported,
            format!(
                "the System {} cannot boot from Pxe (its boot targets: {})",
                system.path,
                quote(&targets.join(", "))
            ),
        ));
    }
    Ok(Request {
        method: Method::Patch,
        path: system.path.clone(),
        body: Some(json!({
            "Boot": { "BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once" }
        })),
        if_match: system.etag.clone(),
    })
}

/// The Redfish driver over a transport.
pub struct Redfish<T = crate::http::Http> {
    transport: T,
    wanted: Option<String>,
    retry: RetryPolicy,
    sleep: fn(std::time::Duration),
    /// The System's path once found.
    system: Mutex<Option<String>>,
}

impl Redfish {
    /// The driver for `bmc` over HTTP(S).
    pub fn connect(bmc: &RedfishBmc, retry: RetryPolicy) -> Result<Redfish, PowerError> {
        let http = crate::http::Http::new(bmc)?;
        Ok(Redfish::over(http, bmc.system.clone(), retry))
    }
}

impl<T: Transport> Redfish<T> {
    pub fn over(transport: T, system: Option<String>, retry: RetryPolicy) -> Redfish<T> {
        Redfish {
            transport,
            wanted: system,
            retry,
            sleep: std::thread::sleep,
            system: Mutex::new(None),
        }
    }

    /// Replaces the pause between retries (tests).
    pub fn with_sleep(mut self, sleep: fn(std::time::Duration)) -> Redfish<T> {
        self.sleep = sleep;
        self
    }

    /// Sends with retries of transient failures (unreachable, busy) and checks the status.
    fn call(&self, what: &str, request: &Request) -> Result<Response, PowerError> {
        self.retry.run(self.sleep, || {
            let r = self.transport.send(request)?;
            check(what, &r)?;
            Ok(r)
        })
    }

    fn system_path(&self) -> Result<String, PowerError> {
        if let Some(p) = self
            .system
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(p);
        }
        let what = format!("GET {SYSTEMS}");
        let r = self.call(&what, &Request::get(SYSTEMS))?;
        let path = choose_system(&parse_json(&what, &r)?, self.wanted.as_deref())?;
        *self.system.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.clone());
        Ok(path)
    }

    /// The System as it is now.
    pub fn system(&self) -> Result<System, PowerError> {
        let path = self.system_path()?;
        let r = self.call(&format!("GET {path}"), &Request::get(&path))?;
        System::parse(&path, &r)
    }

    fn reset(&self, system: &System, want: Reset) -> Result<(), PowerError> {
        let mut allowed = system.reset_allowed.clone();
        if allowed.is_none()
            && let Some(info) = &system.reset_action_info
        {
            let what = format!("GET {info}");
            let r = self.call(&what, &Request::get(info))?;
            allowed = action_info_reset_types(&parse_json(&what, &r)?);
        }
        let reset_type = reset_type(want, allowed.as_deref())?;
        let request = reset_request(system, reset_type)?;
        self.call(
            &format!("POST {} ResetType {reset_type}", request.path),
            &request,
        )?;
        Ok(())
    }
}

impl<T: Transport> PowerDriver for Redfish<T> {
    fn status(&self) -> Result<PowerState, PowerError> {
        Ok(self.system()?.power)
    }

    fn power_on(&self) -> Result<(), PowerError> {
        let s = self.system()?;
        match s.power {
            PowerState::On | PowerState::PoweringOn => Ok(()),
            _ => self.reset(&s, Reset::On),
        }
    }

    fn power_off(&self) -> Result<(), PowerError> {
        let s = self.system()?;
        match s.power {
            PowerState::Off => Ok(()),
            _ => self.reset(&s, Reset::Off),
        }
    }

    fn reboot(&self) -> Result<(), PowerError> {
        let s = self.system()?;
        match s.power {
            PowerState::Off | PowerState::PoweringOff => self.reset(&s, Reset::On),
            _ => self.reset(&s, Reset::Restart),
        }
    }

    fn boot_pxe_once(&self) -> Result<(), PowerError> {
        let s = self.system()?;
        let request = boot_pxe_request(&s)?;
        self.call(&format!("PATCH {} Boot", s.path), &request)?;
        Ok(())
    }
}
