//! Bytes from the network through the DNS server's answer path, and names from outside
//! through the zone builder.
//! - the input as a DNS message → `wire::respond` over UDP and TCP, from inside and outside
//!   the transfer ACL (IXFR with any serial reaches the zone's change history): no panic; a
//!   reply parses, keeps the question's ID and is a response; a UDP reply fits 512 bytes, or
//!   the EDNS(0) size the question offered (at most 4096); `wire::slipped` (the rate
//!   limit's empty TC answer) fits 512; `wire::notify_answer` never panics; the UDP answer
//!   cache (`cache::AnswerCache`, asked twice: template made, then used) answers whenever the
//!   full path does, within the same size;
//! - the input's lines as machine names and instance names → `Zones::build`: every name in
//!   the zones is a chain of checked labels within its zone, and a query for each answers.
#![no_main]

use std::net::IpAddr;
use std::sync::OnceLock;

use hickory_proto::op::Message;
use libfuzzer_sys::fuzz_target;
use paddock_clock::UnixMs;
use paddock_dns::wire::{self, Reply, TransferAcl, Transport};
use paddock_dns::{Inputs, Machine, Member, QType, RType, ServicePort, ZoneConfig, Zones};

fn config() -> ZoneConfig {
    ZoneConfig {
        origin: "paddock.internal.".into(),
        ttl: 30,
        name_servers: vec![("ns1".into(), "198.18.0.1".parse().unwrap())],
        hostmaster: "hostmaster.paddock.internal.".into(),
        reverse: vec!["198.18.0.0/16".parse().unwrap()],
    }
}

fn inputs(names: &[&str]) -> Inputs {
    let mut i = Inputs::default();
    for (n, name) in names.iter().enumerate() {
        let n = u32::try_from(n).unwrap_or(0);
        i.machines.push(Machine {
            name: (*name).to_string(),
            uuid: format!("{n:08x}-0000-4000-8000-000000000000"),
            ipv4: Some(std::net::Ipv4Addr::from(0xc612_0000 + n)),
            ipv6: None,
        });
        i.members.push(Member {
            role: (*name).to_string(),
            instance: format!("{name}-{n}"),
            host: Some((*name).to_string()),
            in_service: n % 3 != 0,
        });
        i.ports.insert(
            (*name).to_string(),
            vec![ServicePort {
                port: 80,
                priority: 1,
                weight: 2,
            }],
        );
    }
    i
}

fn zones() -> &'static Zones {
    static ZONES: OnceLock<Zones> = OnceLock::new();
    ZONES.get_or_init(|| {
        let names: Vec<String> = (0..40).map(|i| format!("node-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut z = Zones::build(&config(), &inputs(&names));
        z.stamp(None, UnixMs(1_800_000_000_000));
        // Three changes, so IXFR has a history to walk.
        for n in 1..4 {
            let mut next = Zones::build(&config(), &inputs(&names[..40 - n]));
            next.stamp(Some(&z), UnixMs(1_800_000_000_000 + i64::try_from(n).unwrap_or(0) * 1_000));
            z = next;
        }
        z
    })
}

fn check_reply(query: &[u8], reply: &[u8], transport: Transport) {
    let m = Message::from_vec(reply).expect("a reply parses");
    let q = Message::from_vec(query).expect("only parsed questions are answered");
    assert_eq!(m.metadata.id, q.metadata.id);
    assert_eq!(
        m.metadata.message_type,
        hickory_proto::op::MessageType::Response
    );
    if transport == Transport::Udp {
        let limit = q
            .edns
            .as_ref()
            .map_or(512, |e| usize::from(e.max_payload()).clamp(512, 4096));
        assert!(reply.len() <= limit, "{} > {limit}", reply.len());
    }
}

fuzz_target!(|data: &[u8]| {
    let acl = TransferAcl(vec!["198.18.0.0/24".parse().unwrap()]);
    let inside: IpAddr = "198.18.0.9".parse().unwrap();
    let outside: IpAddr = "203.0.113.9".parse().unwrap();
    for (transport, from) in [
        (Transport::Udp, inside),
        (Transport::Tcp, inside),
        (Transport::Tcp, outside),
    ] {
        match wire::respond(zones(), &acl, data, transport, from) {
            Reply::Drop => {}
            Reply::One(r) => check_reply(data, &r, transport),
            Reply::Transfer { messages, .. } => {
                assert!(transport == Transport::Tcp && from == inside);
                for m in messages {
                    assert!(m.len() <= usize::from(u16::MAX));
                    check_reply(data, &m, transport);
                }
            }
        }
    }

    let mut cache = paddock_dns::cache::AnswerCache::default();
    let shared = std::sync::Arc::new(zones().clone());
    for _ in 0..2 {
        let full = wire::respond(zones(), &acl, data, Transport::Udp, inside);
        match (cache.respond(&shared, &acl, data, inside), full) {
            (Reply::One(c), Reply::One(f)) => {
                check_reply(data, &c, Transport::Udp);
                // The cache compresses names into the question as spelled; hickory writes a
                // differently spelled name out: never longer.
                assert!(c.len() <= f.len(), "{} > {}", c.len(), f.len());
            }
            (Reply::Drop, Reply::Drop) => {}
            (c, f) => panic!("cache {c:?} against full {f:?}"),
        }
    }
    if let Some(r) = wire::slipped(data) {
        assert!(r.len() <= 512);
        check_reply(data, &r, Transport::Udp);
    }
    let _ = wire::notify_answer(data);

    let text = String::from_utf8_lossy(data);
    let names: Vec<&str> = text.lines().take(64).collect();
    let mut z = Zones::build(&config(), &inputs(&names));
    z.stamp(None, UnixMs(0));
    for zone in &z.zones {
        for r in zone.records() {
            assert!(
                paddock_dns::name::within(&r.name, &zone.apex),
                "{} outside {}",
                r.name,
                zone.apex
            );
            assert!(paddock_dns::name::absolute(&r.name).as_deref() == Ok(r.name.as_str()));
            assert!(!matches!(
                z.answer(&r.name, QType::Type(RType::A)),
                paddock_dns::Answer::NotOurs | paddock_dns::Answer::NxDomain { .. }
            ));
        }
    }
});
