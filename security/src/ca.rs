//! The appliance's CA (rcgen): creating it, issuing certificates that carry Dominator's
//! permitted-methods and groups extensions, and signing requests whose keys stay elsewhere.
//! Time is passed in; keys come from the system's random source.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, CustomExtension,
    DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType, SerialNumber,
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
