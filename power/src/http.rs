//! The Redfish driver's shell: requests over `ureq` (rustls), basic auth, per-BMC TLS
//! verification, bounded times and answer sizes.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

use crate::text::quote;
use crate::transport::{Method, RedfishBmc, Request, Response, TlsVerify, Transport};
use crate::{ErrorKind, PowerError};

/// A BMC's answer larger than this is refused (a System is a few KiB).
const MAX_BODY: u64 = 4 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Http {
    agent: ureq::Agent,
    base: String,
    authorization: String,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http").field("base", &self.base).finish()
    }
}

/// `address` as a base URL: a scheme (`https://` if none) and an authority, nothing after.
pub fn base_url(address: &str) -> Result<String, PowerError> {
    let a = address.trim();
    let (scheme, rest) = match a.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r.trim_end_matches('/')),
        None => ("https".to_string(), a.trim_end_matches('/')),
    };
    let bad = |why: &str| {
        PowerError::new(
            ErrorKind::Unsupported,
            format!("BMC address {:?}: {why}", quote(address)),
        )
    };
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http or https"));
    }
    if rest.is_empty()
        || !rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]_%".contains(c))
    {
        return Err(bad(
            "give only a host and optional port, like https://10.0.0.5:443",
        ));
    }
    Ok(format!("{scheme}://{rest}"))
}

impl Http {
    pub fn new(bmc: &RedfishBmc) -> Result<Http, PowerError> {
        let tls = match &bmc.tls {
            TlsVerify::Verify => TlsConfig::builder().build(),
            TlsVerify::Insecure => TlsConfig::builder().disable_verification(true).build(),
            TlsVerify::CaFile(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    PowerError::new(
                        ErrorKind::Tls,
                        format!("cannot read the BMC's CA file {}: {e}", path.display()),
                    )
                })?;
                let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(PowerError::new(
                        ErrorKind::Tls,
                        format!("the CA file {} holds no PEM certificate", path.display()),
                    ));
                }
                TlsConfig::builder()
                    .root_certs(RootCerts::Specific(Arc::new(certs)))
                    .build()
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT))
            .tls_config(tls)
            .build()
            .into();
        let pair = format!(
            "{}:{}",
            bmc.credentials.username,
            bmc.credentials.password.expose()
        );
        Ok(Http {
            agent,
            base: base_url(&bmc.address)?,
            authorization: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ),
        })
    }
}

/// A failure to get an answer, classified.
fn transport_error(url: &str, e: ureq::Error) -> PowerError {
    use std::io::ErrorKind as Io;
    let kind = match &e {
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) | ureq::Error::Pem(_) => ErrorKind::Tls,
        ureq::Error::Io(io) if io.kind() == Io::InvalidData => ErrorKind::Tls,
        ureq::Error::Io(_)
        | ureq::Error::Timeout(_)
        | ureq::Error::HostNotFound
        | ureq::Error::ConnectionFailed => ErrorKind::Unreachable,
        ureq::Error::BodyExceedsLimit(_) | ureq::Error::Protocol(_) => ErrorKind::BadAnswer,
        _ => ErrorKind::Unreachable,
    };
    let hint = match kind {
        ErrorKind::Tls => {
            ": give the BMC's CA certificate, or turn TLS verification off for this BMC"
        }
        ErrorKind::Unreachable => ": check the BMC address and that the BMC is up",
        _ => "",
    };
    PowerError::new(kind, format!("{url}: {e}{hint}"))
}

impl Transport for Http {
    fn send(&self, r: &Request) -> Result<Response, PowerError> {
        let url = format!("{}{}", self.base, r.path);
        let result = match (r.method, &r.body) {
            (Method::Get, _) => self
                .agent
                .get(&url)
                .header("Authorization", &self.authorization)
                .header("Accept", "application/json")
                .call(),
            (method, body) => {
                let builder = match method {
                    Method::Post => self.agent.post(&url),
                    _ => self.agent.patch(&url),
                };
                let mut builder = builder
                    .header("Authorization", &self.authorization)
                    .header("Accept", "application/json")
                    .header("Content-Type", "application/json");
                if let Some(tag) = &r.if_match {
                    builder = builder.header("If-Match", tag);
                }
                let body = body.as_ref().map(|b| b.to_string()).unwrap_or_default();
                builder.send(body.as_bytes())
            }
        };
        let mut resp = result.map_err(|e| transport_error(&url, e))?;
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| transport_error(&url, e))?;
        Ok(Response { status, etag, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_base_urls_and_anything_else_is_refused() {
        assert_eq!(base_url("10.0.0.5").unwrap(), "https://10.0.0.5");
        assert_eq!(
            base_url("HTTP://198.19.60.1:8000/").unwrap(),
            "http://198.19.60.1:8000"
        );
        assert_eq!(
            base_url("https://[fd00::5]:443").unwrap(),
            "https://[fd00::5]:443"
        );
        for bad in [
            "ftp://x",
            "https://",
            "https://h/redfish",
            "https://h?x",
            "h h",
            "https://u:p@h",
        ] {
            let e = base_url(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Unsupported, "{bad}");
        }
    }

    #[test]
    fn the_debug_of_the_transport_shows_no_authorization() {
        let bmc = RedfishBmc {
            address: "https://bmc".into(),
            system: None,
            credentials: crate::Credentials::new("admin", "s3cret-pass"),
            tls: TlsVerify::Insecure,
        };
        let http = Http::new(&bmc).unwrap();
        let shown = format!("{http:?}");
        assert!(
            !shown.contains("Basic") && !shown.contains("s3cret"),
            "{shown}"
        );
        let encoded = base64::engine::general_purpose::STANDARD.encode("admin:s3cret-pass");
        assert_eq!(http.authorization, format!("Basic {encoded}"));
    }
}
