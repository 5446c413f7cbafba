//! The zones as a function of live state, and the answers they give: table tests without I/O.

use std::collections::BTreeMap;

use paddock_clock::UnixMs;

use paddock_dns::{
    Answer, Inputs, Machine, Member, QType, RData, RType, ServicePort, Zone, ZoneConfig, Zones,
    next_serial,
};

const ORIGIN: &str = "paddock.internal.";

fn config() -> ZoneConfig {
    ZoneConfig {
        origin: ORIGIN.into(),
        ttl: 30,
        name_servers: vec![("ns1".into(), "198.18.0.1".parse().unwrap())],
        hostmaster: "hostmaster.paddock.internal.".into(),
        reverse: vec!["198.18.0.0/24".parse().unwrap()],
    }
}

fn machine(name: &str, uuid: &str, ipv4: Option<&str>) -> Machine {
    Machine {
        name: name.into(),
        uuid: uuid.into(),
        ipv4: ipv4.map(|a| a.parse().unwrap()),
        ipv6: None,
    }
}

fn member(role: &str, instance: &str, host: &str, in_service: bool) -> Member {
    Member {
        role: role.into(),
        instance: instance.into(),
        host: Some(host.into()),
        in_service,
    }
}

/// Three machines (one with an IPv6 address too, one without any address), two hostile
/// names, a name clash; role `db` with two members in service and one out, and a port;
/// role `web` whose only member is out.
fn inputs() -> Inputs {
    let mut a = machine("Node-A", "aaaa-1", Some("198.18.0.101"));
    a.ipv6 = Some("2001:db8::101".parse().unwrap());
    Inputs {
        machines: vec![
            a,
            machine("node-b", "bbbb-2", Some("198.18.0.102")),
            machine("node-c", "cccc-3", None),
            machine("evil.example.com", "dddd-4", Some("198.18.0.104")),
            machine("<script>", "eeee-5", Some("198.18.0.105")),
            machine("node-b", "ffff-6", Some("198.18.0.106")),
            machine("svc", "9999-7", Some("198.18.0.107")),
        ],
        members: vec![
            member("db", "db1", "node-a", true),
            member("db", "db2", "node-b", true),
            member("db", "db3", "node-c", false),
            member("web", "web1", "node-a", false),
            member("replica", "db1", "node-b", true),
        ],
        ports: BTreeMap::from([(
            "db".to_string(),
            vec![ServicePort {
                port: 5432,
                priority: 10,
                weight: 5,
            }],
        )]),
    }
}

fn built() -> Zones {
    let mut z = Zones::build(&config(), &inputs());
    z.stamp(None, UnixMs(1_800_000_000_000));
    z
}

/// The answer's records as `(name, data)`, or the kind of negative answer.
fn ask(z: &Zones, name: &str, t: QType) -> Result<Vec<(String, RData)>, &'static str> {
    match z.answer(name, t) {
        Answer::Records { answers, .. } => {
            Ok(answers.into_iter().map(|r| (r.name, r.data)).collect())
        }
        Answer::NoData { .. } => Err("NODATA"),
        Answer::NxDomain { .. } => Err("NXDOMAIN"),
        Answer::NotOurs => Err("REFUSED"),
    }
}

/// The record data of an answer, or the kind of negative answer.
type Want = Result<Vec<RData>, &'static str>;

fn data(z: &Zones, name: &str, t: RType) -> Want {
    ask(z, name, QType::Type(t)).map(|v| v.into_iter().map(|(_, d)| d).collect())
}

fn a(s: &str) -> RData {
    RData::A(s.parse().unwrap())
}

fn txt(s: &str) -> RData {
    RData::Txt(s.into())
}

#[test]
fn machines_answer_by_name_and_by_uuid() {
    let z = built();
    let table: &[(&str, RType, Want)] = &[
        (
            "node-a.paddock.internal.",
            RType::A,
            Ok(vec![a("198.18.0.101")]),
        ),
        (
            "NODE-A.Paddock.Internal.",
            RType::A,
            Ok(vec![a("198.18.0.101")]),
        ),
        (
            "node-a.paddock.internal.",
            RType::Aaaa,
            Ok(vec![RData::Aaaa("2001:db8::101".parse().unwrap())]),
        ),
        (
            "node-a.paddock.internal.",
            RType::Txt,
            Ok(vec![txt("aaaa-1")]),
        ),
        (
            "aaaa-1.node.paddock.internal.",
            RType::A,
            Ok(vec![a("198.18.0.101")]),
        ),
        (
            "node-b.paddock.internal.",
            RType::A,
            Ok(vec![a("198.18.0.102")]),
        ),
        // Known but without an address: the name exists, the A does not.
        ("node-c.paddock.internal.", RType::A, Err("NODATA")),
        (
            "node-c.paddock.internal.",
            RType::Txt,
            Ok(vec![txt("cccc-3")]),
        ),
        ("node-b.paddock.internal.", RType::Srv, Err("NODATA")),
        ("nobody.paddock.internal.", RType::A, Err("NXDOMAIN")),
        ("ffff-6.node.paddock.internal.", RType::A, Err("NXDOMAIN")),
        ("example.com.", RType::A, Err("REFUSED")),
        ("internal.", RType::A, Err("REFUSED")),
        // Empty non-terminals: names exist below them.
        ("node.paddock.internal.", RType::A, Err("NODATA")),
        ("svc.paddock.internal.", RType::A, Err("NODATA")),
        ("_tcp.paddock.internal.", RType::Srv, Err("NODATA")),
        ("paddock.internal.", RType::A, Err("NODATA")),
        (
            "paddock.internal.",
            RType::Ns,
            Ok(vec![RData::Ns("ns1.paddock.internal.".into())]),
        ),
        ("ns1.paddock.internal.", RType::A, Ok(vec![a("198.18.0.1")])),
    ];
    for (name, t, want) in table {
        assert_eq!(&data(&z, name, *t), want, "{name} {t:?}");
    }
}

#[test]
fn hostile_clashing_and_reserved_names_are_skipped_with_a_reason() {
    let z = built();
    let why: Vec<(&str, &str)> = z
        .skipped
        .iter()
        .map(|s| (s.what.as_str(), s.why.as_str()))
        .collect();
    assert_eq!(z.skipped.len(), 5, "{why:#?}");
    for (what, reason) in [
        ("\"evil.example.com\"", "not a DNS label"),
        ("\"<script>\"", "not a DNS label"),
        ("ffff-6", "belongs to machine bbbb-2"),
        ("\"svc\"", "keeps for itself"),
        (
            "instance \"db1\" of role \"replica\"",
            "instance of role \"db\"",
        ),
    ] {
        assert!(
            why.iter()
                .any(|(w, r)| w.contains(what) && r.contains(reason)),
            "{what}: {reason} not in {why:#?}"
        );
    }
    // No record anywhere carries the hostile names.
    for zone in &z.zones {
        for r in zone.records() {
            let text = format!("{r:?}");
            assert!(!text.contains("evil") && !text.contains('<'), "{text}");
        }
    }
}

#[test]
fn instances_and_services_follow_membership_with_srv_and_its_additionals() {
    let z = built();
    assert_eq!(
        data(&z, "db2.inst.paddock.internal.", RType::A),
        Ok(vec![a("198.18.0.102")])
    );
    assert_eq!(
        data(&z, "db2.inst.paddock.internal.", RType::Txt),
        Ok(vec![txt("db")])
    );
    // An instance out of service keeps its own names.
    assert_eq!(
        data(&z, "db3.inst.paddock.internal.", RType::Txt),
        Ok(vec![txt("db")])
    );
    // The service: the addresses of the members in service only, a TXT per member.
    assert_eq!(
        data(&z, "db.svc.paddock.internal.", RType::A),
        Ok(vec![a("198.18.0.101"), a("198.18.0.102")])
    );
    assert_eq!(
        data(&z, "db.svc.paddock.internal.", RType::Txt),
        Ok(vec![txt("db1"), txt("db2"), txt("verifying:db3")])
    );
    // SRV at the service name (as CNS) and at RFC 2782's, priority and weight kept.
    let srv = |target: &str| RData::Srv {
        priority: 10,
        weight: 5,
        port: 5432,
        target: target.into(),
    };
    let want = vec![
        srv("db1.inst.paddock.internal."),
        srv("db2.inst.paddock.internal."),
    ];
    assert_eq!(
        data(&z, "db.svc.paddock.internal.", RType::Srv),
        Ok(want.clone())
    );
    assert_eq!(data(&z, "_db._tcp.paddock.internal.", RType::Srv), Ok(want));
    let Answer::Records { additional, .. } =
        z.answer("_db._tcp.paddock.internal.", QType::Type(RType::Srv))
    else {
        panic!("no SRV answer");
    };
    let extra: Vec<(String, RData)> = additional.into_iter().map(|r| (r.name, r.data)).collect();
    assert!(extra.contains(&("db1.inst.paddock.internal.".into(), a("198.18.0.101"))));
    assert!(extra.contains(&("db2.inst.paddock.internal.".into(), a("198.18.0.102"))));
    assert!(extra.contains(&(
        "db1.inst.paddock.internal.".into(),
        RData::Aaaa("2001:db8::101".parse().unwrap())
    )));
    // A service with members but none in service: NODATA for addresses, never NXDOMAIN.
    assert_eq!(
        data(&z, "web.svc.paddock.internal.", RType::A),
        Err("NODATA")
    );
    assert_eq!(
        data(&z, "web.svc.paddock.internal.", RType::Txt),
        Ok(vec![txt("verifying:web1")])
    );
    assert_eq!(
        data(&z, "_web._tcp.paddock.internal.", RType::Srv),
        Err("NXDOMAIN")
    );
    assert_eq!(
        data(&z, "nope.svc.paddock.internal.", RType::A),
        Err("NXDOMAIN")
    );
}

#[test]
fn reverse_zones_point_at_the_machines_names() {
    let z = built();
    assert_eq!(
        data(&z, "101.0.18.198.in-addr.arpa.", RType::Ptr),
        Ok(vec![RData::Ptr("node-a.paddock.internal.".into())])
    );
    // The skipped machines' addresses have no PTR; the clashing one's either.
    for owner in ["104", "105", "106"] {
        let q = format!("{owner}.0.18.198.in-addr.arpa.");
        assert_eq!(data(&z, &q, RType::Ptr), Err("NXDOMAIN"), "{q}");
    }
    assert_eq!(
        data(&z, "0.18.198.in-addr.arpa.", RType::Ns),
        Ok(vec![RData::Ns("ns1.paddock.internal.".into())])
    );
    assert_eq!(
        data(&z, "1.1.18.198.in-addr.arpa.", RType::Ptr),
        Err("REFUSED")
    );
    let apexes: Vec<&str> = z.zones.iter().map(|z| z.apex.as_str()).collect();
    assert_eq!(apexes, [ORIGIN, "0.18.198.in-addr.arpa."]);
}

#[test]
fn negative_answers_carry_the_soa_and_any_gets_one_record_set() {
    let z = built();
    let Answer::NxDomain { zone } = z.answer("nobody.paddock.internal.", QType::Type(RType::A))
    else {
        panic!("not NXDOMAIN");
    };
    let soa = zone.soa();
    assert_eq!(soa.name, ORIGIN);
    let RData::Soa(fields) = soa.data else {
        panic!("{soa:?}");
    };
    let (mname, serial, minimum) = (fields.mname, fields.serial, fields.minimum);
    assert_eq!(
        (mname.as_str(), serial, minimum),
        ("ns1.paddock.internal.", 1_800_000_000, 30)
    );
    // ANY: one record set, not everything the name has (RFC 8482).
    let any = ask(&z, "node-a.paddock.internal.", QType::Any).unwrap();
    let types: std::collections::BTreeSet<RType> = any.iter().map(|(_, d)| d.rtype()).collect();
    assert_eq!(types.len(), 1, "{any:?}");
    assert_eq!(
        ask(&z, "node-a.paddock.internal.", QType::Other),
        Err("NODATA")
    );
    assert_eq!(
        data(&z, ORIGIN, RType::Soa).map(|v| v.len()),
        Ok(1),
        "the SOA at the apex"
    );
    assert_eq!(
        data(&z, "node-a.paddock.internal.", RType::Soa),
        Err("NODATA")
    );
}

fn serials(z: &Zones) -> Vec<u32> {
    z.zones.iter().map(|z: &Zone| z.serial).collect()
}

#[test]
fn serials_move_only_with_the_records_and_always_forward() {
    let t0 = UnixMs(1_800_000_000_000);
    let later = |ms: i64| UnixMs(t0.0 + ms);
    let mut first = Zones::build(&config(), &inputs());
    first.stamp(None, t0);
    assert_eq!(serials(&first), [1_800_000_000, 1_800_000_000]);
    // The same state later: unchanged.
    let mut same = Zones::build(&config(), &inputs());
    same.stamp(Some(&first), later(3_600_000));
    assert_eq!(serials(&same), serials(&first));
    // A member leaves its service within the same second: the forward zone moves by one,
    // the reverse zone (no PTR changed) keeps its serial.
    let mut i = inputs();
    i.members[1].in_service = false;
    let mut changed = Zones::build(&config(), &i);
    changed.stamp(Some(&same), later(500));
    assert_eq!(serials(&changed), [1_800_000_001, 1_800_000_000]);
    // A new machine with an address a minute later: both move, to the time.
    i.machines
        .push(machine("node-d", "abcd-8", Some("198.18.0.110")));
    let mut grown = Zones::build(&config(), &i);
    grown.stamp(Some(&changed), later(60_000));
    assert_eq!(serials(&grown), [1_800_000_060, 1_800_000_060]);
    // The clock set back: still forward.
    assert_eq!(
        next_serial(1_800_000_060, later(-86_400_000)),
        1_800_000_061
    );
    // Across the 2^32 wrap (RFC 1982): forward too.
    assert_eq!(next_serial(u32::MAX, UnixMs(0)), 0);
    assert_eq!(next_serial(u32::MAX - 5, UnixMs(10_000)), 10);
}

/// Three hosts' view of one appliance: the leader stamps and publishes, a follower takes
/// the published serials for the same records, holds while its records differ, and goes
/// on alone (never back) once it has heard nothing for too long.
#[test]
fn hosts_serve_the_same_zones_under_the_leaders_serials() {
    let t0 = UnixMs(1_800_000_000_000);
    let at = |s: i64| UnixMs(t0.0 + s * 1_000);
    let none = std::collections::BTreeMap::new();
    let mut leader = Zones::build(&config(), &inputs());
    assert!(leader.stamp_in_step(None, &none, true, t0));
    let published = leader.stamps();
    assert_eq!(published.len(), 2);
    // A follower that started a little later (its first zones are empty, serial 0) builds
    // the same records: it takes the leader's serials, not its own clock's.
    let empty = Zones::build(&config(), &Inputs::default());
    let mut follower = Zones::build(&config(), &inputs());
    assert!(follower.stamp_in_step(Some(&empty), &published, false, at(7)));
    assert_eq!(serials(&follower), serials(&leader));
    assert_eq!(follower.stamps(), published);
    // A change the follower reads before the leader has published it: it holds.
    let mut i = inputs();
    i.members[1].in_service = false;
    let mut early = Zones::build(&config(), &i);
    assert!(!early.stamp_in_step(Some(&follower), &published, false, at(30)));
    // The leader stamps and publishes it; the follower takes it, and can hand out the
    // change as an incremental transfer between the same serials as the leader.
    let mut next = Zones::build(&config(), &i);
    assert!(next.stamp_in_step(Some(&leader), &published, true, at(30)));
    let published2 = next.stamps();
    let mut caught_up = Zones::build(&config(), &i);
    assert!(caught_up.stamp_in_step(Some(&follower), &published2, false, at(31)));
    assert_eq!(serials(&caught_up), [1_800_000_030, 1_800_000_000]);
    let chain = caught_up.zones[0].changes_since(leader.zones[0].serial);
    assert_eq!(chain, next.zones[0].changes_since(leader.zones[0].serial));
    assert_eq!(chain.map(|c| c.len()), Some(1));
    // The leader is gone; a change, and the follower is told to go on alone: past both
    // its own and the last published serial.
    i.members[0].in_service = false;
    let mut alone = Zones::build(&config(), &i);
    assert!(alone.stamp_in_step(Some(&caught_up), &published2, true, at(30)));
    assert_eq!(serials(&alone), [1_800_000_031, 1_800_000_000]);
    // A new leader whose records are not the published ones, though unchanged for it,
    // moves the serial so that the others, serving the published ones, see a change.
    let mut stale = Zones::build(&config(), &inputs());
    assert!(stale.stamp_in_step(Some(&leader), &published2, true, at(40)));
    assert_eq!(serials(&stale), [1_800_000_040, 1_800_000_000]);
    // A published serial behind what a host serves never takes it back.
    let mut ahead = Zones::build(&config(), &i);
    assert!(ahead.stamp_in_step(Some(&alone), &published2, false, at(50)));
    assert_eq!(serials(&ahead), serials(&alone));
}

#[test]
fn the_history_keeps_the_last_changes_chained_to_the_serial() {
    let mut i = inputs();
    let mut z = Zones::build(&config(), &i);
    z.stamp(None, UnixMs(1_800_000_000_000));
    let first = z.zones[0].serial;
    let mut serials = vec![first];
    for n in 0..70 {
        i.members[0].in_service = n % 2 == 0;
        let mut next = Zones::build(&config(), &i);
        next.stamp(Some(&z), UnixMs(1_800_000_000_000 + n * 10));
        serials.push(next.zones[0].serial);
        z = next;
    }
    let forward = &z.zones[0];
    assert_eq!(forward.changes_since(forward.serial), Some(vec![]));
    // 70 changes, 64 kept: the oldest 6 serials are out of reach.
    assert_eq!(forward.changes_since(serials[6]).map(|c| c.len()), Some(64));
    assert!(forward.changes_since(serials[5]).is_none());
    assert!(forward.changes_since(first).is_none());
    let chain = forward.changes_since(serials[60]).unwrap();
    assert_eq!(chain.len(), 10);
    assert_eq!(chain[0].from, serials[60]);
    assert_eq!(chain[9].to, forward.serial);
    // Each change flips db1 in or out of the service: its A, AAAA, TXT and two SRV (the
    // service's name and _db._tcp) one way, the verifying TXT the other.
    assert_eq!(chain[0].removed.len() + chain[0].added.len(), 6);
    // The reverse zone never changed: no history.
    assert_eq!(z.zones[1].changes_since(z.zones[1].serial), Some(vec![]));
    assert!(z.zones[1].changes_since(first + 1).is_none());
}

#[test]
fn names_of_a_machine_or_an_instance_and_records_in_zone_file_form() {
    let z = built();
    let show = |subject: &str| -> Vec<String> {
        z.names_of(subject)
            .iter()
            .map(|r| format!("{} {} {}", r.name, r.data.rtype(), r.data))
            .collect()
    };
    let a = show("node-a");
    assert!(
        a.contains(&"node-a.paddock.internal. A 198.18.0.101".to_string()),
        "{a:#?}"
    );
    assert!(
        a.contains(&"node-a.paddock.internal. TXT \"aaaa-1\"".to_string()),
        "{a:#?}"
    );
    assert!(
        a.contains(&"101.0.18.198.in-addr.arpa. PTR node-a.paddock.internal.".to_string()),
        "{a:#?}"
    );
    // By UUID: its A, AAAA and TXT, and the TXT of the machine name that carries it.
    assert_eq!(show("aaaa-1").len(), 4);
    let db3 = show("db3");
    assert!(
        db3.contains(&"db3.inst.paddock.internal. TXT \"db\"".to_string()),
        "{db3:#?}"
    );
    assert!(
        db3.contains(&"db.svc.paddock.internal. TXT \"verifying:db3\"".to_string()),
        "{db3:#?}"
    );
    let db1 = show("db1");
    assert!(
        db1.contains(
            &"_db._tcp.paddock.internal. SRV 10 5 5432 db1.inst.paddock.internal.".to_string()
        ),
        "{db1:#?}"
    );
    assert!(show("nobody").is_empty());
    assert!(show("<script>").is_empty());
    let soa = z.zones[0].soa();
    assert_eq!(
        soa.data.to_string(),
        "ns1.paddock.internal. hostmaster.paddock.internal. 1800000000 30 60 2592000 30"
    );
}
