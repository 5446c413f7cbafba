//! Paddock's DHCPv4 server, and DHCPv6 in [`v6`].
//!
//! The decision of what to answer is pure: [`Server::handle`] takes a decoded request, the
//! address it arrived on and the time, updates the in-memory [`Leases`] and returns an
//! [`Outcome`] (a reply, where to send it, and the lease change that must be durable before
//! the reply goes out). The [`shell`] owns the sockets and the store; it persists lease changes
//! and only then sends the ACK.

#[cfg(feature = "shell")]
mod batch;
pub mod leases;
pub mod packet;
pub mod pxe;
pub mod ratelimit;
pub mod relays;
pub mod server;
#[cfg(feature = "shell")]
pub mod shell;
pub mod v6;

pub use leases::{Lease, LeaseState, Leases, Pick, Pool, Relay, Reservation, Subnet, SubnetError};
pub use paddock_inventory::MacAddr;
pub use pxe::{Arch, BootChoice, BootPolicy, Signed};
pub use ratelimit::{RateLimitError, RateLimits};
pub use relays::Relays;
pub use server::{
    Admission, AllowAll, ClientPolicy, LeaseChange, LimitKind, Limited, Outcome, Server,
    ServerConfig,
};
