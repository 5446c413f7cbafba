//! Who is calling, and what they may call: from a certificate rustls has already verified
//! against the CA (chain and validity), from an operator token, or from an agent token.

use sha2::{Digest, Sha256};

use crate::methods::{self, MethodError, Permissions};

/// How the caller proved who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// A client certificate chaining to the appliance's CA.
    Certificate,
    /// An operator token issued by `paddock certs token`.
    Token,
    /// A ramdisk agent's per-boot token.
    Agent,
}

/// A caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The certificate's CN or the token's name (the audit log's "who").
    pub user: String,
    pub methods: Permissions,
    pub groups: Vec<String>,
    pub proof: Proof,
}

impl Identity {
    /// Whether this caller may call `method` (`Service.Method`).
    pub fn may(&self, method: &str) -> bool {
        self.methods.allows(method)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("certificate does not parse: {0}")]
    Parse(String),
    #[error("certificate has no common name")]
    NoName,
    #[error("permitted-methods extension: {0}")]
    Methods(MethodError),
    #[error("groups extension: {0}")]
    Groups(MethodError),
    #[error("the {0} extension appears more than once")]
    Duplicate(&'static str),
}

/// The identity a verified certificate (DER) carries: CN = user, the permitted-methods
/// extension's patterns (none: the certificate names someone who may call nothing), the
/// groups. A malformed extension is an error, never "no permissions" by accident.
pub fn from_certificate(der: &[u8]) -> Result<Identity, IdentityError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| IdentityError::Parse(e.to_string()))?;
    let user = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or(IdentityError::NoName)?
        .to_string();
    let (mut perms, mut groups) = (None, None);
    // Two copies of an extension could be read differently by two parsers: refused.
    for ext in cert.extensions() {
        let oid = ext.oid.to_id_string();
        if oid == methods::PERMITTED_METHODS_OID_STR {
            if perms.is_some() {
                return Err(IdentityError::Duplicate("permitted-methods"));
            }
            perms =
                Some(methods::parse_permitted_methods(ext.value).map_err(IdentityError::Methods)?);
        } else if oid == methods::GROUPS_OID_STR {
            if groups.is_some() {
                return Err(IdentityError::Duplicate("groups"));
            }
            groups = Some(methods::parse_groups(ext.value).map_err(IdentityError::Groups)?);
        }
    }
    let (perms, groups) = (perms.unwrap_or_default(), groups.unwrap_or_default());
    Ok(Identity {
        user,
        methods: perms,
        groups,
        proof: Proof::Certificate,
    })
}

/// The DNS names and IP addresses a certificate (DER) answers for.
pub fn subject_alt_names(der: &[u8]) -> Result<Vec<String>, IdentityError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| IdentityError::Parse(e.to_string()))?;
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => out.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => out.push(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()),
                    16 => {
                        let mut a = [0u8; 16];
                        a.copy_from_slice(b);
                        out.push(std::net::Ipv6Addr::from(a).to_string());
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(out)
}

/// A certificate's SHA-256 fingerprint, lowercase hex (what the agent's kernel command line
/// pins the CA by).
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// Why a PEM text yielded no certificates.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("PEM: {0}")]
    Parse(#[from] rustls_pki_types::pem::Error),
    #[error("no certificate in the PEM text")]
    Empty,
}

/// The certificates in a PEM text, DER.
pub fn pem_certificates(pem: &str) -> Result<Vec<Vec<u8>>, PemError> {
    use rustls_pki_types::pem::PemObject;
    let certs: Result<Vec<_>, _> =
        rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    let certs = certs?;
    if certs.is_empty() {
        return Err(PemError::Empty);
    }
    Ok(certs.into_iter().map(|c| c.as_ref().to_vec()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca;

    #[test]
    fn a_duplicated_extension_is_refused() {
        use rcgen::{CertificateParams, CustomExtension, KeyPair};
        let mut p = CertificateParams::new(vec![]).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "twice");
        for list in [&["Nodes.Get"][..], &["*.*"][..]] {
            p.custom_extensions.push(CustomExtension::from_oid_content(
                methods::PERMITTED_METHODS_OID,
                methods::encode_strings(list),
            ));
        }
        let key = KeyPair::generate().unwrap();
        let der = p.self_signed(&key).unwrap().der().to_vec();
        let e = from_certificate(&der).unwrap_err();
        assert!(
            matches!(e, IdentityError::Duplicate("permitted-methods")),
            "{e}"
        );
    }

    #[test]
    fn issued_certificates_carry_methods_and_groups() {
        let now = time::OffsetDateTime::now_utc();
        let authority = ca::new_ca("paddock-ca", now, 10).unwrap();
        let leaf = ca::issue(
            &authority,
            &ca::Request {
                name: "alice".into(),
                methods: vec!["Subd.*".into(), "ImageServer.GetImage".into()],
                groups: vec!["ops".into()],
                sans: vec!["198.18.0.1".into(), "paddock.lab".into()],
                days: 2,
            },
            now,
        )
        .unwrap();
        let der = &pem_certificates(&leaf.cert_pem).unwrap()[0];
        let id = from_certificate(der).unwrap();
        assert_eq!(id.user, "alice");
        assert_eq!(id.groups, vec!["ops"]);
        assert_eq!(
            subject_alt_names(der).unwrap(),
            vec!["198.18.0.1".to_string(), "paddock.lab".to_string()]
        );
        assert!(id.may("Subd.Update"));
        assert!(id.may("ImageServer.GetImage"));
        assert!(!id.may("Images.Delete"));
        assert_eq!(fingerprint(der).len(), 64);

        // A signed request keeps its key with the requester; the CA decides the contents.
        let (key, csr) = ca::request("bob").unwrap();
        assert!(key.contains("PRIVATE KEY"));
        let pem = ca::sign_request(
            &authority,
            &csr,
            &ca::Request {
                name: "bob".into(),
                methods: vec!["*.Get".into()],
                days: 1,
                ..Default::default()
            },
            now,
        )
        .unwrap();
        let id = from_certificate(&pem_certificates(&pem).unwrap()[0]).unwrap();
        assert_eq!(id.user, "bob");
        assert!(id.may("Nodes.Get") && !id.may("Nodes.Delete"));
    }

    #[test]
    fn bad_requests_are_refused() {
        let now = time::OffsetDateTime::now_utc();
        let authority = ca::new_ca("paddock-ca", now, 10).unwrap();
        let req = |name: &str, m: &str, san: &str, days| ca::Request {
            name: name.into(),
            methods: vec![m.into()],
            sans: if san.is_empty() {
                vec![]
            } else {
                vec![san.into()]
            },
            days,
            ..Default::default()
        };
        for r in [
            req("", "Subd.*", "", 1),
            req("-x", "Subd.*", "", 1),
            req("a b", "Subd.*", "", 1),
            req("alice", "Subd", "", 1),
            req("alice", "Subd.*", "bad name!", 1),
            req("alice", "Subd.*", "", 0),
        ] {
            assert!(ca::issue(&authority, &r, now).is_err(), "{r:?}");
        }
    }
}
