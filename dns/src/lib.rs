//! Service-discovery DNS: every machine, role instance and service findable by name, from
//! live state.
//!
//! All but [`server`] is pure: time is passed in, and no other module does I/O.
//! - [`name`]: which texts may become DNS labels, and the reverse-zone names of a subnet;
//! - [`membership`]: who of a service's registered instances stands in its records, under
//!   the removal hysteresis (a limited number of self-removals per window, a delay for the
//!   last member; hard removals at once);
//! - [`zone`]: the zones as a function of the machines, the members and the service ports,
//!   their serials, and the answer each zone gives to a question;
//! - [`notify`]: telling secondaries of new serials (NOTIFY), retried, given up after five;
//! - [`rrl`]: response rate limiting per source netblock over UDP;
//! - [`wire`]: DNS messages in and out (hickory-proto), answered from the zones;
//! - [`cache`]: answers kept as bytes per snapshot, the UDP fast path;
//! - [`server`]: the async shell, UDP and TCP on each listen address.
//!
//! Names, for a forward zone `paddock.internal.`:
//! - `<machine>.paddock.internal.` and `<uuid>.node.paddock.internal.`: A (and AAAA when
//!   known), TXT with the node's UUID;
//! - `<instance>.inst.paddock.internal.`: A of the host it runs on, TXT with its role;
//! - `<role>.svc.paddock.internal.`: the addresses of the members in service, a TXT per
//!   member (`verifying:<instance>` for one out of service, so that a service whose members
//!   are all out answers NODATA, not NXDOMAIN), and SRV per member and declared port, also
//!   at `_<role>._tcp.paddock.internal.`;
//! - PTR in the reverse zones of the configured subnets, to the machine's name.

pub mod cache;
pub mod membership;
pub mod name;
pub mod notify;
pub mod rrl;
pub mod server;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod wire;
pub mod zone;

pub use membership::{Carried, Membership, Policy, Report};
pub use zone::{
    Answer, Inputs, Machine, Member, QType, RData, RType, Record, ServicePort, Skipped, Soa, Stamp,
    Zone, ZoneConfig, Zones, next_serial,
};
