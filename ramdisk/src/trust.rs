//! The appliance's CA, pinned by the kernel command line. Boot assets stay on
//! plain HTTP (firmware cannot do better), so the agent fetches the CA's PEM in the clear
//! (`paddock.ca_url`) and trusts it only if its first certificate's SHA-256 is the one the
//! boot script wrote (`paddock.ca_fingerprint`); that CA is then the only root its TLS
//! client knows. A CA that is missing or does not match stops the agent: it never falls back
//! to an unverified connection.

use std::time::Duration;

use paddock_security::identity;
use ureq::tls::TlsConfig;

use crate::cmdline::Cmdline;
use crate::http::{Transport, Url, UrlError};
use crate::provision::client::{self, CallError};

/// A CA PEM larger than this is refused.
pub const MAX_CA_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "paddock.url is https:// but the kernel command line has no usable {0}: the agent does not talk TLS without a pinned CA"
    )]
    Missing(&'static str),
    #[error("paddock.ca_url: {0}")]
    Url(#[from] UrlError),
    #[error("cannot fetch the appliance's CA: {0}")]
    Fetch(String),
    #[error("the appliance's CA at {url} is {len} bytes, more than {MAX_CA_BYTES}: refused")]
    TooLarge { url: String, len: usize },
    #[error("the appliance's CA at {url} is not a PEM certificate: not UTF-8: {source}")]
    NotUtf8 {
        url: String,
        source: std::str::Utf8Error,
    },
    #[error("the appliance's CA at {url} is not a PEM certificate: {source}")]
    NotPem {
        url: String,
        source: identity::PemError,
    },
    #[error(
        "the CA at {url} has SHA-256 {got}, but the kernel command line pins {want}: refusing to talk to the appliance (someone may be impersonating it, or the boot script is stale)"
    )]
    Mismatch {
        url: String,
        want: String,
        got: String,
    },
    #[error(
        "the CA at {url} holds {count} certificates: only the pinned one may be trusted, and it must come alone"
    )]
    NotAlone { url: String, count: usize },
    #[error("the appliance's CA at {url}: {source}")]
    Tls {
        url: String,
        source: paddock_security::tls::TlsError,
    },
}

/// Whether any of the appliance's URLs is `https://` (then the CA is needed).
pub fn needs_tls(urls: &[Url]) -> bool {
    urls.iter().any(|u| u.tls)
}

/// Where the CA is (every host's copy, the boot script's host first) and the fingerprint
/// it must have, from the command line.
pub fn pinned(cmd: &Cmdline) -> Result<(Vec<Url>, String), TrustError> {
    let urls = cmd
        .ca_url
        .as_deref()
        .ok_or(TrustError::Missing("paddock.ca_url"))?;
    let want = cmd
        .ca_fingerprint
        .clone()
        .ok_or(TrustError::Missing("paddock.ca_fingerprint"))?;
    let urls = urls
        .split(',')
        .map(Url::parse)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((urls, want))
}

/// Checks a fetched CA against the pinned fingerprint (of its certificate, DER); returns the
/// PEM text. It must hold that one certificate alone: every certificate of the text becomes
/// a root of the agent's client, so one more, added by whoever answered this plain-HTTP
/// request, would be trusted without a pin.
pub fn check_ca(url: &str, body: &[u8], want: &str) -> Result<String, TrustError> {
    if body.len() > MAX_CA_BYTES {
        return Err(TrustError::TooLarge {
            url: url.to_string(),
            len: body.len(),
        });
    }
    let pem = std::str::from_utf8(body).map_err(|source| TrustError::NotUtf8 {
        url: url.to_string(),
        source,
    })?;
    let ders = identity::pem_certificates(pem).map_err(|source| TrustError::NotPem {
        url: url.to_string(),
        source,
    })?;
    if ders.len() != 1 {
        return Err(TrustError::NotAlone {
            url: url.to_string(),
            count: ders.len(),
        });
    }
    let got = identity::fingerprint(&ders[0]);
    if !got.eq_ignore_ascii_case(want) {
        return Err(TrustError::Mismatch {
            url: url.to_string(),
            want: want.to_string(),
            got,
        });
    }
    Ok(pem.to_string())
}

/// The TLS configuration of the agent's client: `ca_pem` the only root (rustls with ring).
pub fn tls_config(url: &str, ca_pem: &str) -> Result<TlsConfig, TrustError> {
    paddock_security::tls::ureq_tls(ca_pem, None).map_err(|source| TrustError::Tls {
        url: url.to_string(),
        source,
    })
}

/// Fetches the CA over `t` (a plain client of `paddock.ca_url`), retried as the provisioning
/// calls are (`tries`, 0: until an answer), checks it and makes the TLS configuration.
pub fn fetch(
    t: &mut dyn Transport,
    url: &Url,
    want: &str,
    tries: u32,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<TlsConfig, TrustError> {
    let shown = url.to_string();
    let r = client::call(t, "GET", "", None, tries, pause).map_err(|e| match e {
        CallError::Refused {
            status, message, ..
        } => TrustError::Fetch(format!("{shown} answered HTTP {status}: {message}")),
        e => TrustError::Fetch(e.to_string()),
    })?;
    let pem = check_ca(&shown, &r.body, want)?;
    tls_config(&shown, &pem)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::tests::{Script, assert_jittered, refused, resp};
    use crate::cmdline;
    use paddock_security::ca;

    /// A CA, and a server certificate for `sans` it issued (cert, key).
    pub(crate) fn authority(sans: &[&str]) -> (ca::Ca, ca::Issued) {
        let now = time::OffsetDateTime::now_utc();
        let authority = ca::new_ca("paddock-test-ca", now, 2).unwrap();
        let server = ca::issue(
            &authority,
            &ca::Request {
                name: "paddock".into(),
                sans: sans.iter().map(|s| s.to_string()).collect(),
                days: 1,
                ..Default::default()
            },
            now,
        )
        .unwrap();
        (authority, server)
    }

    fn fp(pem: &str) -> String {
        identity::fingerprint(&identity::pem_certificates(pem).unwrap()[0])
    }

    #[test]
    fn the_pinned_ca_is_the_only_one_accepted() {
        let (a, _) = authority(&[]);
        let (other, _) = authority(&[]);
        let want = fp(&a.cert_pem);
        let url = "http://198.18.0.1:8080/boot/ca.pem";
        assert_eq!(
            check_ca(url, a.cert_pem.as_bytes(), &want).unwrap(),
            a.cert_pem
        );
        assert!(tls_config(url, &a.cert_pem).is_ok());
        // The pinned certificate with another after it: the other would be a root too.
        let two = format!("{}{}", a.cert_pem, other.cert_pem);
        assert!(matches!(
            check_ca(url, two.as_bytes(), &want),
            Err(TrustError::NotAlone { count: 2, .. })
        ));
        let e = check_ca(url, other.cert_pem.as_bytes(), &want).unwrap_err();
        assert!(
            matches!(&e, TrustError::Mismatch { got, .. } if *got == fp(&other.cert_pem)),
            "{e}"
        );
        assert!(e.to_string().contains("refusing"), "{e}");
        for bad in [
            &b""[..],
            b"hello",
            b"\xff\xfe",
            b"-----BEGIN CERTIFICATE-----\nxx\n",
        ] {
            assert!(
                matches!(
                    check_ca(url, bad, &want),
                    Err(TrustError::NotPem { .. } | TrustError::NotUtf8 { .. })
                ),
                "{bad:?}"
            );
        }
        let big = format!("{}{}", a.cert_pem, " ".repeat(MAX_CA_BYTES));
        assert!(matches!(
            check_ca(url, big.as_bytes(), &want),
            Err(TrustError::TooLarge { .. })
        ));
    }

    #[test]
    fn https_needs_both_pins() {
        let urls = |s: &str| {
            s.split(',')
                .map(|u| Url::parse(u).unwrap())
                .collect::<Vec<_>>()
        };
        assert!(!needs_tls(&urls("http://a:8080,http://b:8080")));
        assert!(needs_tls(&urls("http://a:8080,https://b:8443")));
        let fp = "0".repeat(64);
        let ok = cmdline::parse(&format!(
            "paddock.url=https://a:8443 paddock.ca_url=http://a:8080/boot/ca.pem paddock.ca_fingerprint={fp}"
        ));
        let (u, f) = pinned(&ok).unwrap();
        assert_eq!(
            (u.iter().map(ToString::to_string).collect::<Vec<_>>(), f),
            (vec!["http://a:8080/boot/ca.pem".to_string()], fp.clone())
        );
        // Several hosts: every copy, in order; one that is not http:// is left out.
        let ha = cmdline::parse(&format!(
            "paddock.url=https://a:8443,https://b:8443 paddock.ca_url=http://a:8080/boot/ca.pem,https://x/ca.pem,http://b:8080/boot/ca.pem paddock.ca_fingerprint={fp}"
        ));
        let (u, _) = pinned(&ha).unwrap();
        assert_eq!(
            u.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["http://a:8080/boot/ca.pem", "http://b:8080/boot/ca.pem"]
        );
        assert_eq!(ha.warnings.len(), 1, "{:?}", ha.warnings);
        let no_url = cmdline::parse(&format!("paddock.ca_fingerprint={fp}"));
        assert!(matches!(
            pinned(&no_url).unwrap_err(),
            TrustError::Missing("paddock.ca_url")
        ));
        let no_fp = cmdline::parse("paddock.ca_url=http://a/ca.pem paddock.ca_fingerprint=xyz");
        assert!(matches!(
            pinned(&no_fp).unwrap_err(),
            TrustError::Missing("paddock.ca_fingerprint")
        ));
    }

    #[test]
    fn fetching_retries_then_checks() {
        let (a, _) = authority(&[]);
        let want = fp(&a.cert_pem);
        let url = Url::parse("http://198.18.0.1:8080/boot/ca.pem").unwrap();
        let body = a.cert_pem.as_str();
        let mut s = Script::new(vec![refused(), resp(503, "starting"), resp(200, body)]);
        let mut pauses = Vec::new();
        assert!(fetch(&mut s, &url, &want, 0, &mut |d, _| pauses.push(d)).is_ok());
        assert_jittered(&pauses, &[1, 2], "CA fetch");
        assert_eq!(s.requests[0].0, "GET");
        assert_eq!(s.requests[0].1, "");
        let mut s = Script::new(vec![resp(404, "no CA here")]);
        let e = fetch(&mut s, &url, &want, 0, &mut |_, _| {}).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot fetch the appliance's CA: http://198.18.0.1:8080/boot/ca.pem answered HTTP 404: no CA here"
        );
        let mut s = Script::new(vec![resp(200, body)]);
        let e = fetch(&mut s, &url, &"0".repeat(64), 0, &mut |_, _| {}).unwrap_err();
        assert!(matches!(e, TrustError::Mismatch { .. }), "{e}");
    }
}
