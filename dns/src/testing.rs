//! Zones for the crate's unit tests.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};

use crate::zone::{Inputs, Machine, Member, ZoneConfig, Zones};

/// `machines` machines, each running an instance of role `web`, all in service.
pub fn zones(machines: u32) -> Zones {
    web_zones(machines, None, 0)
}

/// `machines` machines (`node-<i>`, 198.18.0.<i>) each running an instance `web-<i>` of
/// role `web`, `web-<out>` out of service, stamped `secs` seconds after the first build.
pub fn web_zones(machines: u32, out: Option<u32>, secs: i64) -> Zones {
    let cfg = ZoneConfig {
        origin: "paddock.internal.".into(),
        ttl: 30,
        name_servers: vec![("ns1".into(), "198.18.0.1".parse().unwrap())],
        hostmaster: "hostmaster.paddock.internal.".into(),
        reverse: vec!["198.18.0.0/16".parse().unwrap()],
    };
    let mut inputs = Inputs::default();
    for i in 0..machines {
        inputs.machines.push(Machine {
            name: format!("node-{i}"),
            uuid: format!("uuid-{i}"),
            ipv4: Some(std::net::Ipv4Addr::from(0xc612_0000 + i)),
            ipv6: None,
        });
        inputs.members.push(Member {
            role: "web".into(),
            instance: format!("web-{i}"),
            host: Some(format!("node-{i}")),
            in_service: out != Some(i),
        });
    }
    let mut z = Zones::build(&cfg, &inputs);
    z.stamp(None, at(secs));
    z
}

/// `secs` seconds after the tests' epoch.
pub fn at(secs: i64) -> paddock_clock::UnixMs {
    paddock_clock::UnixMs(1_800_000_000_000 + secs * 1_000)
}

/// A question as a resolver sends it: `id`, RD as given, an OPT offering `edns` if given.
pub fn question(id: u16, name: &str, t: RecordType, edns: Option<u16>, rd: bool) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = rd;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}
