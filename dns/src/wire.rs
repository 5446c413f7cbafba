//! Questions in, answers out, as bytes: DNS messages parsed and written with hickory-proto,
//! answered from one [`Zones`]. Pure: the server hands in the bytes, the transport and the
//! asker's address, and sends what comes back.
//!
//! - A message that does not parse, or is itself a response, gets no answer at all (no
//!   reflection of garbage); other opcodes get NOTIMP, more or fewer than one question
//!   FORMERR, a class other than IN REFUSED.
//! - Names outside our zones get REFUSED: we recurse for nobody.
//! - Over UDP an answer fits the asker's size: 512 bytes, or what its EDNS(0) OPT offers
//!   (at most 4096). Additional records go first; if the answer still does not fit it is
//!   sent empty with TC set, so the asker retries over TCP.
//! - Zone transfers only to addresses in the transfer ACL, REFUSED to anyone else: AXFR over
//!   TCP; IXFR over TCP with the changes since the asker's serial while the zone's history
//!   reaches back to it, the whole zone otherwise (RFC 1995 §4); IXFR over UDP gets the
//!   current SOA alone, which tells the asker to come over TCP.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{self, DNSClass, Name, RecordType};
use ipnet::IpNet;

use crate::zone::{Answer, QType, RData, RType, Record, Zone, Zones};

/// The UDP size we offer in our own OPT record (the DNS flag day 2020 figure).
const OUR_UDP_SIZE: u16 = 1_232;
/// The largest UDP answer we send, whatever the asker offers.
const MAX_UDP: usize = 4_096;
/// Records per message of a zone transfer (a message must stay under 64 KiB).
const TRANSFER_CHUNK: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Nothing: the message was not a question we answer.
    Drop,
    /// One message.
    One(Vec<u8>),
    /// The messages of a zone transfer over TCP, in order; the asker will be at `serial`.
    /// `incremental`: only the changes since the asker's serial (IXFR), not the whole zone.
    Transfer {
        apex: String,
        serial: u32,
        incremental: bool,
        messages: Vec<Vec<u8>>,
    },
}

/// Who may transfer the zones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferAcl(pub Vec<IpNet>);

impl TransferAcl {
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(&ip))
    }
}

/// The reply to `query` (the bytes of one DNS message) from `source` over `transport`.
pub fn respond(
    zones: &Zones,
    acl: &TransferAcl,
    query: &[u8],
    transport: Transport,
    source: IpAddr,
) -> Reply {
    let Ok(request) = Message::from_vec(query) else {
        return Reply::Drop;
    };
    if request.metadata.message_type != MessageType::Query {
        return Reply::Drop;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.add_queries(request.queries.iter().cloned());
    let limit = match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp => request
            .edns
            .as_ref()
            .map_or(512, |e| usize::from(e.max_payload()).clamp(512, MAX_UDP)),
    };
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(OUR_UDP_SIZE);
        response.set_edns(edns);
    }
    if request.metadata.op_code != OpCode::Query {
        return finish(response, ResponseCode::NotImp, limit);
    }
    let [question] = request.queries.as_slice() else {
        return finish(response, ResponseCode::FormErr, limit);
    };
    let qname = ascii(question.name());
    match question.query_type() {
        RecordType::AXFR | RecordType::IXFR => {
            // IXFR carries the asker's SOA in the authority section.
            let since = (question.query_type() == RecordType::IXFR)
                .then(|| {
                    request.authorities.iter().find_map(|r| match &r.data {
                        rr::RData::SOA(soa) => Some(soa.serial),
                        _ => None,
                    })
                })
                .flatten();
            let asked = Transfer {
                apex: &qname,
                ixfr: question.query_type() == RecordType::IXFR,
                since,
            };
            return transfer(zones, acl, response, &asked, transport, source);
        }
        _ if question.query_class() != DNSClass::IN => {
            return finish(response, ResponseCode::Refused, limit);
        }
        _ => {}
    }
    match zones.answer(&qname, qtype(question.query_type())) {
        Answer::Records {
            answers,
            additional,
            ..
        } => {
            response.metadata.authoritative = true;
            response.add_answers(answers.iter().map(record));
            response.add_additionals(additional.iter().map(record));
            finish(response, ResponseCode::NoError, limit)
        }
        Answer::NoData { zone } => negative(response, zone, ResponseCode::NoError, limit),
        Answer::NxDomain { zone } => negative(response, zone, ResponseCode::NXDomain, limit),
        Answer::NotOurs => finish(response, ResponseCode::Refused, limit),
    }
}

/// The answer to a question over the rate limit that slips through: empty, with TC, so a
/// real client asks again over TCP. `None` where [`respond`] would not answer either.
pub fn slipped(query: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.truncation = true;
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.add_queries(request.queries.iter().cloned());
    response.to_vec().ok().filter(|b| b.len() <= 512)
}

/// Where the first question's name ends in a message (the offset of its type), reading
/// only plain labels: `None` for a compression pointer, an extended label type, a name
/// longer than 255 bytes or a message that ends first.
pub fn question_name_end(q: &[u8]) -> Option<usize> {
    let mut at = 12;
    loop {
        let len = usize::from(*q.get(at)?);
        if len == 0 {
            return Some(at + 1);
        }
        if len > 63 {
            return None;
        }
        at += 1 + len;
        if at - 12 > 255 {
            return None;
        }
    }
}

/// A NOTIFY of `zone` at `serial` (RFC 1996): the zone's SOA as the question and the
/// answer.
pub fn notify(zone: &Zone, serial: u32, id: u16) -> Option<Vec<u8>> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Notify);
    m.metadata.authoritative = true;
    m.add_query(Query::query(name(&zone.apex), RecordType::SOA));
    m.add_answer(record(&zone.soa_at(serial)));
    m.to_vec().ok()
}

/// The zone and ID a NOTIFY answer is for; `None` for anything else.
pub fn notify_answer(bytes: &[u8]) -> Option<(String, u16)> {
    let m = Message::from_vec(bytes).ok()?;
    let is_answer = m.metadata.message_type == MessageType::Response
        && m.metadata.op_code == OpCode::Notify
        && m.metadata.response_code == ResponseCode::NoError;
    let [q] = m.queries.as_slice() else {
        return None;
    };
    is_answer.then(|| (ascii(q.name()), m.metadata.id))
}

/// A question for `apex`'s SOA with `id`: how a primary learns which serial a secondary
/// serves.
pub fn soa_query(apex: &str, id: u16) -> Option<Vec<u8>> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(apex).ok()?, RecordType::SOA));
    m.to_vec().ok()
}

/// The serial an answer to [`soa_query`] with `id` carries; `None` for anything else (an
/// error, a referral, another ID).
pub fn soa_serial(bytes: &[u8], id: u16) -> Option<u32> {
    let m = Message::from_vec(bytes).ok()?;
    if m.metadata.message_type != MessageType::Response
        || m.metadata.id != id
        || m.metadata.response_code != ResponseCode::NoError
    {
        return None;
    }
    m.answers.iter().find_map(|r| match &r.data {
        rr::RData::SOA(soa) => Some(soa.serial),
        _ => None,
    })
}

/// A name as our zones spell names: ASCII, lower case, with the trailing dot.
fn ascii(name: &Name) -> String {
    let mut s = name.to_ascii().to_ascii_lowercase();
    if !s.ends_with('.') {
        s.push('.');
    }
    s
}

fn qtype(t: RecordType) -> QType {
    match t {
        RecordType::SOA => QType::Type(RType::Soa),
        RecordType::NS => QType::Type(RType::Ns),
        RecordType::A => QType::Type(RType::A),
        RecordType::AAAA => QType::Type(RType::Aaaa),
        RecordType::TXT => QType::Type(RType::Txt),
        RecordType::SRV => QType::Type(RType::Srv),
        RecordType::PTR => QType::Type(RType::Ptr),
        RecordType::ANY => QType::Any,
        _ => QType::Other,
    }
}

/// Our names are checked labels joined by dots, so they always parse; the root stands in
/// should one ever not.
fn name(text: &str) -> Name {
    Name::from_ascii(text).unwrap_or_else(|_| Name::root())
}

fn record(r: &Record) -> rr::Record {
    let data = match &r.data {
        RData::Soa(s) => rr::RData::SOA(SOA::new(
            name(&s.mname),
            name(&s.rname),
            s.serial,
            i32::try_from(s.refresh).unwrap_or(i32::MAX),
            i32::try_from(s.retry).unwrap_or(i32::MAX),
            i32::try_from(s.expire).unwrap_or(i32::MAX),
            s.minimum,
        )),
        RData::Ns(n) => rr::RData::NS(NS(name(n))),
        RData::A(a) => rr::RData::A(A(*a)),
        RData::Aaaa(a) => rr::RData::AAAA(AAAA(*a)),
        RData::Txt(t) => rr::RData::TXT(TXT::new(vec![t.clone()])),
        RData::Srv {
            priority,
            weight,
            port,
            target,
        } => rr::RData::SRV(SRV::new(*priority, *weight, *port, name(target))),
        RData::Ptr(n) => rr::RData::PTR(PTR(name(n))),
    };
    rr::Record::from_rdata(name(&r.name), r.ttl, data)
}

/// NODATA or NXDOMAIN: authoritative, the zone's SOA in the authority section.
fn negative(mut response: Message, zone: &Zone, code: ResponseCode, limit: usize) -> Reply {
    response.metadata.authoritative = true;
    response.add_authority(record(&zone.soa()));
    finish(response, code, limit)
}

/// Writes the response within `limit` bytes: without its additional records if it must,
/// else empty and truncated.
fn finish(mut response: Message, code: ResponseCode, limit: usize) -> Reply {
    response.metadata.response_code = code;
    let fits = |m: &Message| m.to_vec().ok().filter(|b| b.len() <= limit);
    if let Some(bytes) = fits(&response) {
        return Reply::One(bytes);
    }
    response.additionals.clear();
    if let Some(bytes) = fits(&response) {
        return Reply::One(bytes);
    }
    match fits(&response.truncate()) {
        Some(bytes) => Reply::One(bytes),
        None => Reply::Drop,
    }
}

/// A transfer asked for: the zone, and for IXFR the asker's serial.
struct Transfer<'a> {
    apex: &'a str,
    ixfr: bool,
    since: Option<u32>,
}

/// AXFR: the SOA, every record, the SOA again. IXFR: the SOA, then per change the old SOA,
/// what went, the new SOA, what came, and the SOA again; or the whole zone when the history
/// does not reach the asker's serial. In messages of [`TRANSFER_CHUNK`] records.
fn transfer(
    zones: &Zones,
    acl: &TransferAcl,
    response: Message,
    asked: &Transfer<'_>,
    transport: Transport,
    source: IpAddr,
) -> Reply {
    let limit = usize::from(u16::MAX);
    if !acl.allows(source) {
        return finish(response, ResponseCode::Refused, limit);
    }
    let Some(zone) = zones.zones.iter().find(|z| z.apex == asked.apex) else {
        return finish(response, ResponseCode::NotAuth, limit);
    };
    let mut records: Vec<rr::Record> = Vec::new();
    let mut incremental = false;
    match (transport, asked.ixfr) {
        (Transport::Udp, false) => return finish(response, ResponseCode::FormErr, limit),
        // Over UDP only "you are current" or "come over TCP", both the current SOA alone.
        (Transport::Udp, true) => records.push(record(&zone.soa())),
        (Transport::Tcp, _) => {
            let chain = asked
                .since
                .filter(|_| asked.ixfr)
                .and_then(|serial| zone.changes_since(serial));
            match chain {
                Some(deltas) if deltas.is_empty() => records.push(record(&zone.soa())),
                Some(deltas) => {
                    incremental = true;
                    records.push(record(&zone.soa()));
                    for d in deltas {
                        records.push(record(&zone.soa_at(d.from)));
                        records.extend(d.removed.iter().map(record));
                        records.push(record(&zone.soa_at(d.to)));
                        records.extend(d.added.iter().map(record));
                    }
                    records.push(record(&zone.soa()));
                }
                None => {
                    records.extend(zone.records().map(|r| record(&r)));
                    records.push(record(&zone.soa()));
                }
            }
        }
    }
    let mut messages = Vec::new();
    for chunk in records.chunks(TRANSFER_CHUNK) {
        let mut m = response.clone();
        m.metadata.authoritative = true;
        m.add_answers(chunk.iter().cloned());
        match m.to_vec() {
            Ok(bytes) if bytes.len() <= limit => messages.push(bytes),
            _ => return finish(response, ResponseCode::ServFail, limit),
        }
    }
    match transport {
        Transport::Udp => Reply::One(messages.swap_remove(0)),
        Transport::Tcp => Reply::Transfer {
            apex: zone.apex.clone(),
            serial: zone.serial,
            incremental,
            messages,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::{at, web_zones, zones};

    fn ask(name: &str, t: RecordType, edns: Option<u16>) -> Vec<u8> {
        crate::testing::question(4242, name, t, edns, false)
    }

    fn one(reply: Reply) -> Message {
        match reply {
            Reply::One(b) => Message::from_vec(&b).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 9));

    #[test]
    fn an_answer_is_authoritative_and_echoes_the_question() {
        let z = zones(3);
        let acl = TransferAcl::default();
        let q = ask("NODE-1.paddock.internal.", RecordType::A, None);
        let m = one(respond(&z, &acl, &q, Transport::Udp, HERE));
        assert_eq!(m.metadata.id, 4242);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert!(m.metadata.authoritative);
        assert_eq!(m.queries[0].name().to_ascii(), "NODE-1.paddock.internal.");
        assert_eq!(m.answers.len(), 1);
        let q = ask("nobody.paddock.internal.", RecordType::A, None);
        let m = one(respond(&z, &acl, &q, Transport::Udp, HERE));
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(m.authorities[0].record_type(), RecordType::SOA);
        let q = ask("example.com.", RecordType::A, None);
        let m = one(respond(&z, &acl, &q, Transport::Udp, HERE));
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert!(!m.metadata.authoritative);
    }

    #[test]
    fn garbage_and_responses_get_nothing() {
        let z = zones(1);
        let acl = TransferAcl::default();
        for junk in [&b""[..], &[0u8; 5], &[0xff; 40]] {
            assert_eq!(respond(&z, &acl, junk, Transport::Udp, HERE), Reply::Drop);
        }
        // A compression pointer that points at itself.
        let mut q = ask("node-0.paddock.internal.", RecordType::A, None);
        q.truncate(12);
        q.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(respond(&z, &acl, &q, Transport::Udp, HERE), Reply::Drop);
        let mut m =
            Message::from_vec(&ask("node-0.paddock.internal.", RecordType::A, None)).unwrap();
        m.metadata.message_type = MessageType::Response;
        assert_eq!(
            respond(&z, &acl, &m.to_vec().unwrap(), Transport::Udp, HERE),
            Reply::Drop
        );
    }

    #[test]
    fn udp_answers_fit_the_askers_size_or_are_truncated() {
        // 100 members: 100 addresses for the service, 1.6 KB of answers.
        let z = zones(100);
        let acl = TransferAcl::default();
        let q = ask("web.svc.paddock.internal.", RecordType::A, None);
        let Reply::One(b) = respond(&z, &acl, &q, Transport::Udp, HERE) else {
            panic!()
        };
        assert!(b.len() <= 512, "{} bytes", b.len());
        let m = Message::from_vec(&b).unwrap();
        assert!(m.metadata.truncation && m.answers.is_empty());
        // The asker offers 4096 (EDNS): all of it, and an OPT back.
        let q = ask("web.svc.paddock.internal.", RecordType::A, Some(4096));
        let m = one(respond(&z, &acl, &q, Transport::Udp, HERE));
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 100);
        assert!(m.edns.is_some(), "OPT answered with OPT");
        // Over TCP the size is no matter.
        let q = ask("web.svc.paddock.internal.", RecordType::A, None);
        assert_eq!(
            one(respond(&z, &acl, &q, Transport::Tcp, HERE))
                .answers
                .len(),
            100
        );
        // ANY gets one record set.
        let q = ask("web.svc.paddock.internal.", RecordType::ANY, Some(4096));
        let m = one(respond(&z, &acl, &q, Transport::Udp, HERE));
        let types: std::collections::BTreeSet<RecordType> =
            m.answers.iter().map(|r| r.record_type()).collect();
        assert_eq!(types.len(), 1, "{types:?}");
    }

    fn ixfr(since: u32) -> Vec<u8> {
        let mut m = Message::from_vec(&ask("paddock.internal.", RecordType::IXFR, None)).unwrap();
        let soa = SOA::new(
            name("ns1.paddock.internal."),
            name("hostmaster.paddock.internal."),
            since,
            30,
            60,
            2_592_000,
            30,
        );
        m.add_authority(rr::Record::from_rdata(
            name("paddock.internal."),
            30,
            rr::RData::SOA(soa),
        ));
        m.to_vec().unwrap()
    }

    /// Every answer record of a reply, across its messages: `(type, SOA serial or 0)`.
    fn transferred(reply: Reply) -> Vec<(RecordType, u32)> {
        let messages = match reply {
            Reply::One(b) => vec![b],
            Reply::Transfer { messages, .. } => messages,
            Reply::Drop => panic!("dropped"),
        };
        messages
            .iter()
            .flat_map(|b| Message::from_vec(b).unwrap().answers)
            .map(|r| match &r.data {
                rr::RData::SOA(soa) => (RecordType::SOA, soa.serial),
                other => (other.record_type(), 0),
            })
            .collect()
    }

    #[test]
    fn ixfr_sends_the_changes_since_the_askers_serial() {
        let acl = TransferAcl(vec!["198.18.0.0/24".parse().unwrap()]);
        let z1 = zones(3);
        let s1 = z1.zones[0].serial;
        // One more machine a minute later, then its instance out of service: two changes.
        let mut z2 = web_zones(4, None, 60);
        z2.stamp(Some(&z1), at(60));
        let mut z3 = web_zones(4, Some(3), 120);
        z3.stamp(Some(&z2), at(120));
        let (s2, s3) = (z2.zones[0].serial, z3.zones[0].serial);
        assert!(s1 < s2 && s2 < s3, "{s1} {s2} {s3}");
        let tcp = |q: &[u8]| transferred(respond(&z3, &acl, q, Transport::Tcp, HERE));
        let soa = |s: u32| (RecordType::SOA, s);
        let got = tcp(&ixfr(s1));
        // SOA(now); SOA(s1), nothing went, SOA(s2), what node-3 and web-3 brought; then
        // SOA(s2), the service's A and TXT of web-3 went, SOA(s3), verifying:web-3 came;
        // SOA(now).
        assert_eq!(got.first(), Some(&soa(s3)));
        assert_eq!(got[1], soa(s1));
        assert_eq!(got[2], soa(s2), "nothing removed by the first change");
        let second = got.iter().rposition(|r| *r == soa(s2)).unwrap();
        assert_eq!(
            got[second + 1..second + 3],
            [(RecordType::A, 0), (RecordType::TXT, 0)],
            "web-3's address and TXT left the service"
        );
        assert_eq!(got[second + 3], soa(s3));
        assert_eq!(
            got[second + 4],
            (RecordType::TXT, 0),
            "verifying:web-3 came"
        );
        assert_eq!(got.last(), Some(&soa(s3)));
        assert_eq!(got.len(), second + 6);
        // Current already: the SOA alone. Unknown serial: the whole zone.
        assert_eq!(tcp(&ixfr(s3)), [soa(s3)]);
        let whole = tcp(&ixfr(7));
        assert_eq!(
            (whole.first(), whole.last()),
            (Some(&soa(s3)), Some(&soa(s3)))
        );
        assert_eq!(
            whole.len(),
            transferred(respond(
                &z3,
                &acl,
                &ask("paddock.internal.", RecordType::AXFR, None),
                Transport::Tcp,
                HERE
            ))
            .len()
        );
        // Over UDP: the SOA alone, whatever the serial.
        assert_eq!(
            transferred(respond(&z3, &acl, &ixfr(s1), Transport::Udp, HERE)),
            [soa(s3)]
        );
        // Outside the ACL: refused.
        let outsider: IpAddr = "198.18.1.9".parse().unwrap();
        let m = one(respond(&z3, &acl, &ixfr(s1), Transport::Tcp, outsider));
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    }

    #[test]
    fn a_secondarys_serial_is_read_from_its_soa_answer_with_the_same_id() {
        let z = zones(2);
        let acl = TransferAcl::default();
        let q = soa_query("paddock.internal.", 41).unwrap();
        let answer = match respond(&z, &acl, &q, Transport::Udp, HERE) {
            Reply::One(bytes) => bytes,
            other => panic!("{other:?}"),
        };
        assert_eq!(soa_serial(&answer, 41), Some(z.zones[0].serial));
        assert_eq!(soa_serial(&answer, 42), None, "another question's answer");
        assert_eq!(soa_serial(&q, 41), None, "a question is no answer");
        let refused = match respond(
            &z,
            &acl,
            &soa_query("example.", 43).unwrap(),
            Transport::Udp,
            HERE,
        ) {
            Reply::One(bytes) => bytes,
            other => panic!("{other:?}"),
        };
        assert_eq!(soa_serial(&refused, 43), None);
        assert_eq!(soa_serial(b"junk", 41), None);
    }

    #[test]
    fn a_notify_carries_the_soa_and_its_answer_is_recognised() {
        let z = zones(2);
        let bytes = notify(&z.zones[0], 99, 7).unwrap();
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.metadata.op_code, OpCode::Notify);
        assert_eq!(m.queries[0].query_type(), RecordType::SOA);
        let rr::RData::SOA(soa) = &m.answers[0].data else {
            panic!("{m:?}")
        };
        assert_eq!(soa.serial, 99);
        // What a secondary answers: the same message as a response.
        let mut answer = m.clone();
        answer.metadata.message_type = MessageType::Response;
        answer.answers.clear();
        let answer = answer.to_vec().unwrap();
        assert_eq!(
            notify_answer(&answer),
            Some(("paddock.internal.".to_string(), 7))
        );
        assert_eq!(notify_answer(&bytes), None, "a NOTIFY is no answer");
        assert_eq!(notify_answer(b"junk"), None);
        // A NOTIFY sent to us gets NOTIMP: we are nobody's secondary.
        let acl = TransferAcl::default();
        let m = one(respond(&z, &acl, &bytes, Transport::Udp, HERE));
        assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    }

    #[test]
    fn a_slipped_answer_is_empty_and_truncated() {
        let q = ask("node-1.paddock.internal.", RecordType::A, None);
        let m = Message::from_vec(&slipped(&q).unwrap()).unwrap();
        assert!(m.metadata.truncation && m.answers.is_empty());
        assert_eq!((m.metadata.id, m.queries.len()), (4242, 1));
        assert_eq!(slipped(b"junk"), None);
    }

    #[test]
    fn transfers_only_over_tcp_and_only_to_the_acl() {
        let z = zones(600);
        let acl = TransferAcl(vec!["198.18.0.0/24".parse().unwrap()]);
        let q = ask("paddock.internal.", RecordType::AXFR, None);
        let outsider: IpAddr = "198.18.1.9".parse().unwrap();
        let m = one(respond(&z, &acl, &q, Transport::Tcp, outsider));
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert!(m.answers.is_empty());
        let m = one(respond(&z, &acl, &q, Transport::Udp, HERE));
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        let Reply::Transfer { messages, .. } = respond(&z, &acl, &q, Transport::Tcp, HERE) else {
            panic!("no transfer")
        };
        let records: Vec<rr::Record> = messages
            .iter()
            .flat_map(|b| Message::from_vec(b).unwrap().answers)
            .collect();
        assert!(messages.len() > 1, "{} messages", messages.len());
        assert_eq!(records.first().unwrap().record_type(), RecordType::SOA);
        assert_eq!(records.last().unwrap().record_type(), RecordType::SOA);
        // SOA, NS, ns1's A; per machine two names with A + TXT, its instance's A + TXT,
        // and the service's A + TXT; the closing SOA.
        assert_eq!(records.len(), 1 + 1 + 1 + 600 * 8 + 1);
        let q = ask("node-1.paddock.internal.", RecordType::AXFR, None);
        let m = one(respond(&z, &acl, &q, Transport::Tcp, HERE));
        assert_eq!(m.metadata.response_code, ResponseCode::NotAuth);
    }
}
