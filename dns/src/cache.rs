//! Answers remembered as bytes, per zones snapshot: the UDP fast path.
//!
//! Most questions are the same few forms (one question, class IN, no EDNS or a plain OPT), so
//! the first answer to a name and type is kept as a template; later askers get a copy with
//! their ID, their RD bit and their spelling of the name (the question is copied as sent,
//! which DNS 0x20 case-randomising resolvers check) written in. The template is made by
//! [`wire::respond`] itself, from the question in lower case, so both paths give the same
//! answer by construction; anything unusual (other opcodes, several questions, OPT options
//! beyond the plain, transfers) takes the full path every time. A new zones snapshot empties
//! the cache; so does reaching [`MAX_ENTRIES`] (random names cannot grow it without bound).
//!
//! Measured (bench/dns.sh, 2 cores, one tokio socket then): 82k questions/s without it,
//! 96k with it; the full path's parse, the zone lookup's allocations and hickory's name
//! encoding are what it saves.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate::wire::{self, Reply, TransferAcl, Transport};
use crate::zone::Zones;

/// Templates kept per answering loop before the cache starts again.
pub const MAX_ENTRIES: usize = 200_000;

/// Templates by key: the name as sent, lower-cased, then the type (2 bytes) and whether the
/// question carried an OPT record (1 byte), so that a lookup borrows a reused buffer.
type Templates = HashMap<Vec<u8>, Vec<u8>, foldhash::fast::RandomState>;

/// A question in its common form.
struct Plain<'a> {
    id: [u8; 2],
    rd: bool,
    /// The question's name as sent (wire form, offset 12).
    name: &'a [u8],
    qtype: u16,
    /// The EDNS(0) size offered, if an OPT record came.
    edns: Option<u16>,
}

/// Reads `q` if it is a plain question: header, one IN question, at most one OPT record
/// with version 0, no DO bit and no options. Anything else: `None`.
fn plain(q: &[u8]) -> Option<Plain<'_>> {
    let header = q.get(..12)?;
    let flags = u16::from_be_bytes([header[2], header[3]]);
    // QR 0, opcode 0, and no bits but RD (and CD/AD, which we do not act on).
    if flags & 0xF800 != 0 {
        return None;
    }
    let count = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
        return None;
    }
    let mut at = wire::question_name_end(q)?;
    let name = &q[12..at];
    let fixed = q.get(at..at + 4)?;
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
    // IN only; no transfers (TCP, the full path).
    if qclass != 1 || qtype == 251 || qtype == 252 {
        return None;
    }
    at += 4;
    let edns = if count(10) == 1 {
        // OPT: root name, type 41, class = size, TTL = ext-rcode/version/flags, no options.
        let opt = q.get(at..at + 11)?;
        let plain_opt = opt[0] == 0
            && opt[1..3] == [0, 41]
            && opt[5..9] == [0, 0, 0, 0]
            && opt[9..11] == [0, 0];
        if !plain_opt {
            return None;
        }
        at += 11;
        Some(u16::from_be_bytes([opt[3], opt[4]]))
    } else {
        None
    };
    if at != q.len() {
        return None;
    }
    Some(Plain {
        id: [header[0], header[1]],
        rd: flags & 0x0100 != 0,
        name,
        qtype,
        edns,
    })
}

/// One answering loop's cache.
#[derive(Default)]
pub struct AnswerCache {
    zones: Option<Arc<Zones>>,
    templates: Templates,
    key: Vec<u8>,
}

impl AnswerCache {
    /// The reply to a UDP question, from the cache where it can be.
    pub fn respond(
        &mut self,
        zones: &Arc<Zones>,
        acl: &TransferAcl,
        query: &[u8],
        source: IpAddr,
    ) -> Reply {
        let mut out = Vec::new();
        match self.answer_into(zones, acl, query, source, &mut out) {
            Some(reply) => reply,
            None => Reply::One(out),
        }
    }

    /// Appends the answer to `out` when the cache has it (`None`); otherwise the full path's
    /// reply, `out` untouched.
    pub fn answer_into(
        &mut self,
        zones: &Arc<Zones>,
        acl: &TransferAcl,
        query: &[u8],
        source: IpAddr,
        out: &mut Vec<u8>,
    ) -> Option<Reply> {
        let full = || Some(wire::respond(zones, acl, query, Transport::Udp, source));
        let Some(p) = plain(query) else {
            return full();
        };
        if !self.zones.as_ref().is_some_and(|z| Arc::ptr_eq(z, zones)) {
            self.zones = Some(zones.clone());
            self.templates.clear();
        }
        if self.templates.len() >= MAX_ENTRIES {
            self.templates.clear();
        }
        let limit = p
            .edns
            .map_or(512, |size| usize::from(size).clamp(512, 4_096));
        self.key.clear();
        self.key.extend(p.name.iter().map(u8::to_ascii_lowercase));
        self.key.extend_from_slice(&p.qtype.to_be_bytes());
        self.key.push(u8::from(p.edns.is_some()));
        if !self.templates.contains_key(self.key.as_slice()) {
            let name = &self.key[..p.name.len()];
            let Some(t) = template(zones, acl, &p, name, source) else {
                return full();
            };
            self.templates.insert(self.key.clone(), t);
        }
        match self.templates.get(self.key.as_slice()) {
            Some(t) if t.len() <= limit => {
                let at = out.len();
                out.extend_from_slice(t);
                let answer = &mut out[at..];
                answer[0..2].copy_from_slice(&p.id);
                if p.rd {
                    answer[2] |= 0x01;
                }
                answer[12..12 + p.name.len()].copy_from_slice(p.name);
                None
            }
            // Larger than this asker takes: the full path truncates as it must.
            _ => full(),
        }
    }
}

/// The answer to the lower-cased form of `p` (ID 0, RD clear), with the largest UDP size,
/// as the full path gives it; `None` if that path gives none.
fn template(
    zones: &Zones,
    acl: &TransferAcl,
    p: &Plain<'_>,
    name: &[u8],
    source: IpAddr,
) -> Option<Vec<u8>> {
    let mut q = Vec::with_capacity(12 + name.len() + 4 + 11);
    let additional: u8 = p.edns.is_some().into();
    q.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, additional]);
    q.extend_from_slice(name);
    q.extend_from_slice(&p.qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    if p.edns.is_some() {
        q.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
    }
    match wire::respond(zones, acl, &q, Transport::Udp, source) {
        Reply::One(bytes) if bytes.len() >= 12 + name.len() => Some(bytes),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Message;
    use hickory_proto::rr::RecordType;

    fn zones(n: u32) -> Arc<Zones> {
        Arc::new(crate::testing::zones(n))
    }

    use crate::testing::question as ask;

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 9));

    /// The reply as a message with its records' owner names in lower case: the fast path
    /// compresses them into the question as the asker spelled it (as NSD and BIND answer),
    /// hickory's encoder writes them out when the spelling differs; DNS names compare without
    /// regard to case, so both are the same answer.
    fn normal(reply: Reply) -> Option<Message> {
        let Reply::One(bytes) = reply else {
            return None;
        };
        let mut m = Message::from_vec(&bytes).unwrap();
        for r in m
            .answers
            .iter_mut()
            .chain(m.authorities.iter_mut())
            .chain(m.additionals.iter_mut())
        {
            r.name = r.name.to_lowercase();
        }
        Some(m)
    }

    /// Every question is answered as the full path answers it (byte for byte when spelled
    /// in lower case), the first time and from the template after.
    #[test]
    fn the_cache_answers_exactly_as_the_full_path() {
        let z = zones(100);
        let acl = TransferAcl::default();
        let mut cache = AnswerCache::default();
        let mut id = 1;
        for name in [
            "node-7.paddock.internal.",
            "NoDe-7.PADDOCK.internal.",
            "web.svc.paddock.internal.",
            "nobody.paddock.internal.",
            "paddock.internal.",
            "example.com.",
            "7.0.18.198.in-addr.arpa.",
        ] {
            for t in [
                RecordType::A,
                RecordType::TXT,
                RecordType::SRV,
                RecordType::SOA,
                RecordType::MX,
                RecordType::PTR,
                RecordType::ANY,
            ] {
                for edns in [None, Some(512), Some(1232), Some(4096)] {
                    for rd in [false, true] {
                        for _ in 0..2 {
                            id += 1;
                            let q = ask(id, name, t, edns, rd);
                            let full = wire::respond(&z, &acl, &q, Transport::Udp, HERE);
                            let fast = cache.respond(&z, &acl, &q, HERE);
                            let what = format!("{name} {t} {edns:?} rd={rd}");
                            if name == name.to_lowercase() {
                                assert_eq!(fast, full, "{what}");
                            }
                            if let Reply::One(b) = &fast {
                                assert_eq!(
                                    &b[12..12 + name.len() + 1],
                                    &q[12..12 + name.len() + 1]
                                );
                            }
                            assert_eq!(normal(fast), normal(full), "{what}");
                        }
                    }
                }
            }
        }
        assert!(cache.templates.len() > 50, "{}", cache.templates.len());
    }

    #[test]
    fn a_new_snapshot_empties_the_cache_and_unusual_questions_bypass_it() {
        let acl = TransferAcl::default();
        let mut cache = AnswerCache::default();
        let before = zones(3);
        let q = ask(5, "node-3.paddock.internal.", RecordType::A, None, false);
        let Reply::One(nx) = cache.respond(&before, &acl, &q, HERE) else {
            panic!()
        };
        assert_eq!(
            Message::from_vec(&nx)
                .unwrap()
                .metadata
                .response_code
                .to_string(),
            "Non-Existent Domain"
        );
        let after = zones(4);
        let Reply::One(yes) = cache.respond(&after, &acl, &q, HERE) else {
            panic!()
        };
        assert_eq!(Message::from_vec(&yes).unwrap().answers.len(), 1);
        // Junk, a response, and a question with the DO bit: the full path (which drops or
        // answers as it does).
        for odd in [b"junk".to_vec(), {
            let mut r = q.clone();
            r[2] |= 0x80;
            r
        }] {
            assert_eq!(
                cache.respond(&after, &acl, &odd, HERE),
                wire::respond(&after, &acl, &odd, Transport::Udp, HERE)
            );
        }
        let mut m = Message::from_vec(&ask(
            6,
            "node-1.paddock.internal.",
            RecordType::A,
            Some(1232),
            false,
        ))
        .unwrap();
        if let Some(e) = m.edns.as_mut() {
            e.set_dnssec_ok(true);
        }
        let dnssec = m.to_vec().unwrap();
        assert!(plain(&dnssec).is_none());
        assert_eq!(
            cache.respond(&after, &acl, &dnssec, HERE),
            wire::respond(&after, &acl, &dnssec, Transport::Udp, HERE)
        );
    }

    #[test]
    fn a_large_answer_is_truncated_for_a_small_asker_from_the_cache_too() {
        let z = zones(100);
        let acl = TransferAcl::default();
        let mut cache = AnswerCache::default();
        let big = ask(
            9,
            "web.svc.paddock.internal.",
            RecordType::A,
            Some(4096),
            false,
        );
        let small = ask(
            10,
            "web.svc.paddock.internal.",
            RecordType::A,
            Some(600),
            false,
        );
        assert_eq!(
            cache.respond(&z, &acl, &big, HERE),
            wire::respond(&z, &acl, &big, Transport::Udp, HERE)
        );
        let Reply::One(b) = cache.respond(&z, &acl, &small, HERE) else {
            panic!()
        };
        assert!(b.len() <= 600);
        assert!(Message::from_vec(&b).unwrap().metadata.truncation);
    }
}
