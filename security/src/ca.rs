//! The appliance's CA (rcgen): creating it, issuing certificates that carry Dominator's
//! permitted-methods and groups extensions, and signing requests whose keys stay elsewhere.
//! Time is passed in; keys come from the system's random source.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, CidrSubnet,
    CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::methods::{self, MethodError, Permissions};

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("methods: {0}")]
    Methods(#[from] MethodError),
    #[error("{0:?}: a certificate name is letters, digits, '.', '_', '-' and '@' (1 to 64)")]
    BadName(String),
    #[error("{0:?}: not a DNS name or IP address")]
    BadSan(String),
    #[error("validity must be 1 to 36500 days, not {0}")]
    BadDays(i64),
}

/// A CA: its certificate and key, both PEM.
#[derive(Clone)]
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A certificate and its key, PEM (the key is empty when a request was signed).
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What to put in a certificate.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The subject's CN: the user (Dominator's convention) or the service's name.
    pub name: String,
    pub methods: Vec<String>,
    pub groups: Vec<String>,
    /// DNS names and IP addresses a server certificate answers for.
    pub sans: Vec<String>,
    pub days: i64,
}

/// Checks a certificate's name (it becomes the audit log's "who").
pub fn check_name(name: &str) -> Result<(), CaError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if ok {
        Ok(())
    } else {
        Err(CaError::BadName(name.to_string()))
    }
}

fn serial() -> SerialNumber {
    let mut b = crate::token::random::<16>();
    b[0] &= 0x7f;
    SerialNumber::from_slice(&b)
}

fn base_params(name: &str, now: OffsetDateTime, days: i64) -> Result<CertificateParams, CaError> {
    check_name(name)?;
    if !(1..=36_500).contains(&days) {
        return Err(CaError::BadDays(days));
    }
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    p.distinguished_name = dn;
    // An hour of slack for clocks a little behind ours.
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(days);
    p.serial_number = Some(serial());
    Ok(p)
}

/// A new CA named `name`, valid for `days`.
pub fn new_ca(name: &str, now: OffsetDateTime, days: i64) -> Result<Ca, CaError> {
    let mut p = base_params(name, now, days)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate()?;
    let cert = p.self_signed(&key)?;
    Ok(Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A CA that signs only subd certificates: a root of its own (so that clients of the
/// appliance, which trust the host CA alone, never accept a subd certificate as an
/// appliance), whose name constraints exclude `excluded` (the appliance's addresses and
/// names) and loopback, for verifiers that check them.
pub fn new_subd_ca(
    name: &str,
    now: OffsetDateTime,
    days: i64,
    excluded: &[String],
) -> Result<Ca, CaError> {
    let mut p = base_params(name, now, days)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut out = vec![
        GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix([127, 0, 0, 0].into(), 8)),
        GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
            std::net::Ipv6Addr::LOCALHOST.into(),
            128,
        )),
        GeneralSubtree::DnsName("localhost".into()),
    ];
    for e in excluded {
        match e.parse::<IpAddr>() {
            Ok(ip) if !ip.is_unspecified() => {
                let prefix = if ip.is_ipv4() { 32 } else { 128 };
                out.push(GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                    ip, prefix,
                )));
            }
            Ok(_) => {}
            Err(_) => out.push(GeneralSubtree::DnsName(e.clone())),
        }
    }
    p.name_constraints = Some(NameConstraints {
        permitted_subtrees: Vec::new(),
        excluded_subtrees: out,
    });
    let key = KeyPair::generate()?;
    let cert = p.self_signed(&key)?;
    Ok(Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Whether `name` reads as an address (`10.0.0.1`, `::1`, `0x7f.1`, `2130706433`): such a
/// name is never put in a certificate as a DNS name, where some clients would take it for
/// the address.
pub fn looks_like_address(name: &str) -> bool {
    let n = name.trim().trim_end_matches('.');
    n.parse::<IpAddr>().is_ok()
        || n.contains(':')
        || (!n.is_empty()
            && n.split('.').all(|label| {
                !label.is_empty()
                    && (label.chars().all(|c| c.is_ascii_digit())
                        || label
                            .strip_prefix("0x")
                            .or_else(|| label.strip_prefix("0X"))
                            .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit())))
            }))
}

fn leaf_params(req: &Request, now: OffsetDateTime) -> Result<CertificateParams, CaError> {
    let mut p = base_params(&req.name, now, req.days)?;
    let perms = Permissions::new(&req.methods)?;
    for g in &req.groups {
        methods::check_group(g)?;
    }
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ClientAuth,
        ExtendedKeyUsagePurpose::ServerAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    for s in &req.sans {
        let san = match s.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                let dns = s.trim();
                let ok = !dns.is_empty()
                    && dns.len() <= 253
                    && dns
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
                if !ok {
                    return Err(CaError::BadSan(s.clone()));
                }
                SanType::DnsName(dns.try_into().map_err(|_| CaError::BadSan(s.clone()))?)
            }
        };
        p.subject_alt_names.push(san);
    }
    if !perms.patterns().is_empty() {
        p.custom_extensions.push(CustomExtension::from_oid_content(
            methods::PERMITTED_METHODS_OID,
            methods::encode_strings(perms.patterns()),
        ));
    }
    if !req.groups.is_empty() {
        p.custom_extensions.push(CustomExtension::from_oid_content(
            methods::GROUPS_OID,
            methods::encode_strings(&req.groups),
        ));
    }
    Ok(p)
}

fn issuer(ca: &Ca) -> Result<Issuer<'static, KeyPair>, CaError> {
    let key = KeyPair::from_pem(&ca.key_pem)?;
    Ok(Issuer::from_ca_cert_pem(&ca.cert_pem, key)?)
}

/// Issues a certificate and a new key for `req`.
pub fn issue(ca: &Ca, req: &Request, now: OffsetDateTime) -> Result<Issued, CaError> {
    let p = leaf_params(req, now)?;
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer(ca)?)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Signs a request (PEM) with `req`'s contents: only the request's public key is used, so
/// the key never leaves the host that made it, and nothing the requester wrote is trusted.
pub fn sign_request(
    ca: &Ca,
    csr_pem: &str,
    req: &Request,
    now: OffsetDateTime,
) -> Result<String, CaError> {
    let csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
    let p = leaf_params(req, now)?;
    let cert = p.signed_by(&csr.public_key, &issuer(ca)?)?;
    Ok(cert.pem())
}

/// A key and a signing request for `name` (the key stays with the caller).
pub fn request(name: &str) -> Result<(String, String), CaError> {
    check_name(name)?;
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    p.distinguished_name = dn;
    let csr = p.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn names_that_read_as_addresses() {
        for (name, want) in [
            ("127.0.0.1", true),
            ("198.18.0.1.", true),
            ("2130706433", true),
            ("0x7f.1", true),
            ("::1", true),
            ("fe80::1", true),
            ("web-1", false),
            ("web1.lab", false),
            ("1web", false),
            ("node-127.0.0.1", false),
        ] {
            assert_eq!(looks_like_address(name), want, "{name}");
        }
    }

    /// A subd certificate naming an excluded address fails verification by its name
    /// constraints; one naming the machine's own address passes.
    #[test]
    fn the_subd_ca_cannot_vouch_for_the_appliance() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
        let now = OffsetDateTime::now_utc();
        let subd_ca = new_subd_ca("paddock-subd-ca", now, 10, &["198.18.0.1".into()]).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for der in crate::identity::pem_certificates(&subd_ca.cert_pem).unwrap() {
            roots.add(CertificateDer::from(der)).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let verify = |addr: &str| {
            let leaf = issue(
                &subd_ca,
                &Request {
                    name: "web-1".into(),
                    methods: vec!["Subd.Poll".into()],
                    sans: vec![addr.into()],
                    days: 1,
                    ..Request::default()
                },
                now,
            )
            .unwrap();
            let der = crate::identity::pem_certificates(&leaf.cert_pem).unwrap()[0].clone();
            verifier.verify_server_cert(
                &CertificateDer::from(der),
                &[],
                &ServerName::try_from(addr.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        assert!(verify("198.18.0.66").is_ok());
        for appliance in ["198.18.0.1", "127.0.0.1"] {
            let e = verify(appliance).unwrap_err();
            assert!(
                format!("{e:?}").contains("NameConstraint"),
                "{appliance}: {e:?}"
            );
        }
    }
}
