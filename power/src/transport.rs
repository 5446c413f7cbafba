//! What the Redfish driver's pure core and its HTTP shell share: where the BMC is and how
//! its certificate is checked, one request and its answer, and the [`Transport`] that
//! carries them. Its own module so that the core ([`crate::redfish`]) can default to the
//! shell while the shell needs nothing of the core.

use serde_json::Value;

use crate::{Credentials, PowerError};

/// A BMC spoken to over Redfish.
#[derive(Debug, Clone)]
pub struct RedfishBmc {
    /// `https://host[:port]` (or `http://`); with no scheme, `https://`.
    pub address: String,
    /// The System's id or path (`/redfish/v1/Systems/…`); `None`: the only one there is.
    pub system: Option<String>,
    pub credentials: Credentials,
    pub tls: TlsVerify,
}

/// How the BMC's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsVerify {
    /// Against the public web roots (webpki-roots).
    Verify,
    /// Against the CA certificates in this PEM file (a BMC's self-signed certificate).
    CaFile(std::path::PathBuf),
    /// Not at all (many BMCs ship self-signed certificates); the connection is still
    /// encrypted.
    Insecure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Patch,
}

/// One request to the BMC, relative to its base address.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: Method,
    /// An absolute path (`/redfish/v1/…`).
    pub path: String,
    pub body: Option<Value>,
    pub if_match: Option<String>,
}

impl Request {
    pub fn get(path: &str) -> Request {
        Request {
            method: Method::Get,
            path: path.to_string(),
            body: None,
            if_match: None,
        }
    }
}

/// The BMC's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub etag: Option<String>,
    pub body: Vec<u8>,
}

/// Sends a request and brings back the answer, whatever its status; a failure here is one
/// of reaching the BMC (unreachable, TLS).
pub trait Transport: Send + Sync {
    fn send(&self, request: &Request) -> Result<Response, PowerError>;
}
