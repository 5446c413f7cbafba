//! Paddock's security model: Dominator's mutual TLS with per-method certificate
//! permissions, plus the agent's per-boot tokens and operator tokens.
//!
//! Pure cores: [`methods`] (the extension's DER, method globs), [`token`] (agent and operator
//! tokens), [`identity`] (a verified certificate → who and what it may call). Shells:
//! [`ca`] (rcgen: the CA, issuing, signing requests), [`tls`] (the rustls listener every
//! service uses and the clients' configurations), [`limits`] (what one client may hold of
//! a listener).

pub mod ca;
pub mod identity;
pub mod keepalive;
pub mod limits;
pub mod methods;
pub mod tls;
pub mod token;

pub use identity::{Identity, Proof};
pub use methods::Permissions;
