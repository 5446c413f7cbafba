//! A node's BMC from its Ironic-style `driver_info` (the keys Ironic's drivers read, so nodes
//! enrolled through the Inspector API or rules work unchanged): `redfish_address`,
//! `redfish_system_id`, `redfish_username`, `redfish_password`, `redfish_verify_ca` (true,
//! false, or a CA file), and `ipmi_address`, `ipmi_port` (623), `ipmi_username`,
//! `ipmi_password`. Pure.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::text::quote;
use crate::{Bmc, Credentials, ErrorKind, IpmiBmc, PowerError, RedfishBmc, TlsVerify};

/// IPMI's UDP port when `ipmi_port` is not set.
pub const IPMI_PORT: u16 = 623;

/// The BMC to drive for a node: Redfish when its `driver` says so (`redfish`,
/// `idrac-redfish` …) or only Redfish is configured, IPMI when its driver is `ipmi` or only
/// IPMI is configured (Redfish first when both are and the driver names neither). With no
/// address configured, `inspected` (the BMC address inspection found) is used over IPMI, as
/// Ironic Inspector records it (`ipmi_address`).
pub fn bmc_from_driver_info(
    driver: Option<&str>,
    info: &Map<String, Value>,
    inspected: Option<&str>,
) -> Result<Bmc, PowerError> {
    let text = |key: &str| -> Result<Option<String>, PowerError> {
        match info.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(setting(key, &format!("{other} is not text"))),
        }
    };
    let credentials = |prefix: &str| -> Result<Credentials, PowerError> {
        Ok(Credentials::new(
            text(&format!("{prefix}_username"))?.unwrap_or_default(),
            match info.get(&format!("{prefix}_password")) {
                Some(Value::String(s)) => s.clone(),
                _ => String::new(),
            },
        ))
    };
    let redfish = text("redfish_address")?;
    let ipmi = text("ipmi_address")?;
    let driver = driver.unwrap_or("").to_ascii_lowercase();
    let use_redfish = match (&redfish, &ipmi) {
        (Some(_), _) if driver.contains("redfish") => true,
        (_, Some(_)) if driver == "ipmi" => false,
        (Some(_), _) => true,
        _ => false,
    };
    if use_redfish {
        let tls = match info.get("redfish_verify_ca") {
            None | Some(Value::Null) | Some(Value::Bool(true)) => TlsVerify::Verify,
            Some(Value::Bool(false)) => TlsVerify::Insecure,
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" | "" => TlsVerify::Verify,
                "false" | "0" | "no" | "off" => TlsVerify::Insecure,
                _ if s.starts_with('/') => TlsVerify::CaFile(PathBuf::from(s.trim())),
                _ => {
                    return Err(setting(
                        "redfish_verify_ca",
                        "give true, false or the absolute path of a CA file",
                    ));
                }
            },
            Some(other) => return Err(setting("redfish_verify_ca", &format!("{other}?"))),
        };
        return Ok(Bmc::Redfish(RedfishBmc {
            address: redfish.unwrap_or_default(),
            system: text("redfish_system_id")?,
            credentials: credentials("redfish")?,
            tls,
        }));
    }
    let Some(host) = ipmi.or_else(|| inspected.map(str::to_string)) else {
        return Err(PowerError::new(
            ErrorKind::Unsupported,
            "the node has no BMC address: set driver_info redfish_address or ipmi_address",
        ));
    };
    let port = match text("ipmi_port")? {
        None => IPMI_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| setting("ipmi_port", "give a UDP port, 1 to 65535"))?,
    };
    let bmc = IpmiBmc::new(host, port, credentials("ipmi")?);
    bmc.validate()?;
    Ok(Bmc::Ipmi(bmc))
}

fn setting(key: &str, why: &str) -> PowerError {
    PowerError::new(
        ErrorKind::Unsupported,
        format!("driver_info {key}: {}", quote(why)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn redfish_settings_become_a_redfish_bmc() {
        let i = info(json!({
            "redfish_address": "https://10.0.0.5", "redfish_system_id": "/redfish/v1/Systems/1",
            "redfish_username": "root", "redfish_password": "calvin", "redfish_verify_ca": false,
            "ipmi_address": "10.0.0.6",
        }));
        let Bmc::Redfish(r) = bmc_from_driver_info(None, &i, None).unwrap() else {
            panic!("redfish first when the driver names neither");
        };
        assert_eq!(r.address, "https://10.0.0.5");
        assert_eq!(r.system.as_deref(), Some("/redfish/v1/Systems/1"));
        assert_eq!(r.credentials, Credentials::new("root", "calvin"));
        assert_eq!(r.tls, TlsVerify::Insecure);
        let Bmc::Ipmi(p) = bmc_from_driver_info(Some("ipmi"), &i, None).unwrap() else {
            panic!("the ipmi driver uses IPMI");
        };
        assert_eq!((p.host.as_str(), p.port), ("10.0.0.6", IPMI_PORT));
    }

    #[test]
    fn verify_ca_takes_ironics_forms() {
        for (v, want) in [
            (json!(true), TlsVerify::Verify),
            (json!("False"), TlsVerify::Insecure),
            (
                json!("/etc/bmc-ca.pem"),
                TlsVerify::CaFile("/etc/bmc-ca.pem".into()),
            ),
        ] {
            let i = info(json!({"redfish_address": "bmc", "redfish_verify_ca": v}));
            let Bmc::Redfish(r) = bmc_from_driver_info(Some("redfish"), &i, None).unwrap() else {
                panic!()
            };
            assert_eq!(r.tls, want);
        }
        let i = info(json!({"redfish_address": "bmc", "redfish_verify_ca": "maybe"}));
        let e = bmc_from_driver_info(None, &i, None).unwrap_err();
        assert!(e.message.contains("redfish_verify_ca"), "{e}");
    }

    #[test]
    fn ipmi_uses_the_inspected_address_when_none_is_set_and_checks_the_port() {
        let i = info(json!({"ipmi_username": "admin", "ipmi_password": "pw", "ipmi_port": "6230"}));
        let Bmc::Ipmi(p) = bmc_from_driver_info(Some("ipmi"), &i, Some("10.1.2.3")).unwrap() else {
            panic!()
        };
        assert_eq!((p.host.as_str(), p.port), ("10.1.2.3", 6230));
        assert_eq!(p.credentials, Credentials::new("admin", "pw"));
        let e = bmc_from_driver_info(None, &i, None).unwrap_err();
        assert!(e.message.contains("no BMC address"), "{e}");
        let bad = info(json!({"ipmi_address": "h", "ipmi_port": 70000}));
        let e = bmc_from_driver_info(None, &bad, None).unwrap_err();
        assert!(e.message.contains("ipmi_port"), "{e}");
        let bad = info(json!({"ipmi_address": "-oX"}));
        assert_eq!(
            bmc_from_driver_info(None, &bad, None).unwrap_err().kind,
            ErrorKind::Unsupported
        );
    }
}
