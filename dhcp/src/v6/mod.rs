//! DHCPv6 (RFC 8415) for the provisioning network: non-temporary addresses (IA_NA) from
//! pools and reservations, DNS, and boot file URLs (RFC 5970) for PXE clients. As for
//! DHCPv4, the decision is pure ([`server::Server6::handle`]) and the [`shell`] makes each
//! lease durable before its reply leaves.

pub mod client;
pub mod leases;
pub mod packet;
#[cfg(feature = "shell")]
pub mod ra;
pub mod server;
#[cfg(feature = "shell")]
pub mod shell;

pub use client::{Binding6, Dhcp6Client, Step6};
pub use leases::{Client6, Lease6, Leases6, Pool6, Reservation6, Subnet6, Subnet6Error};
pub use server::{Boot6, Outcome6, Server6, Server6Config, Via6};
