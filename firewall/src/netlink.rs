//! The fast path for set membership: element adds and deletes sent as one nfnetlink batch
//! over a netlink socket that stays open.
//!
//! Why not `nft` for these too: spawning nft costs about 4 ms, and a batch that deletes an
//! element makes the kernel wait for an RCU grace period when that nft process closes its
//! socket (12–20 ms measured with Debian's nft 1.0.6 on Linux 6.x). A socket that stays
//! open pays neither on the request path. The batch is atomic exactly as nft's is (the
//! kernel commits all of it or none), and every message is acknowledged, so an error names
//! the elements and the kernel's reason. Tables, chains and rules still go through nft.
//!
//! Any number of elements fits: an element list's length field is 16 bits, so a long run is
//! split across several messages (at most [`MACS_PER_MESSAGE`] each, as libnftnl splits
//! its own), all inside one batch. The kernel reads a batch from one datagram, so the
//! socket's send buffer is raised to hold the whole batch and its receive buffer to hold
//! every answer; the batch is never sent in parts. Every length is checked: one that does
//! not fit its field is an error ([`Error::TooLong`]), never a wrapped number.
//!
//! The encoder and the acknowledgement parser are pure; [`SetLink`] is the thin shell.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, GetSockOpt, MsgFlags, NetlinkAddr, SetSockOpt, SockFlag, SockProtocol, SockType,
    bind, getsockopt, recv, sendto, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use paddock_inventory::MacAddr;

use crate::{SetName, TABLE};

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_INET: u8 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
/// Interface names are matched as 16 bytes (IFNAMSIZ), zero-padded.
const IFNAMSIZ: usize = 16;

/// An element list holds at most this many bytes. Its length field is 16 bits (65,535);
/// libnftnl fills a message up to that and starts the next, we start the next well before.
pub const MAX_LIST_BYTES: usize = 16 * 1024;
/// One MAC in an element list: the list element, key and value headers, six bytes padded
/// to eight.
const MAC_ELEMENT_BYTES: usize = 20;
/// The most MACs one NEWSETELEM or DELSETELEM message carries.
pub const MACS_PER_MESSAGE: usize = (MAX_LIST_BYTES - 4) / MAC_ELEMENT_BYTES;
/// Receive-buffer room for one acknowledgement (36 bytes and the socket buffer around them).
const ACK_ROOM: usize = 1024;
/// The largest answer: a refusal echoes the refused message (at most an element list and
/// its headers), well under this.
const RX_BYTES: usize = 64 * 1024;
/// The kernel takes a datagram only if it is 32 bytes smaller than the send buffer; a page
/// more than that is plenty.
const SEND_SLACK: usize = 4096;

/// What can go wrong encoding a batch or exchanging it with nf_tables.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a netlink {what} of {len} bytes does not fit its length field (at most {max})")]
    TooLong {
        what: &'static str,
        len: usize,
        max: u64,
    },
    #[error("nf_tables refused {what} in inet {TABLE}: {}", io::Error::from_raw_os_error(*.errno))]
    Refused { what: String, errno: i32 },
    #[error("netlink socket: {what}: {source}")]
    Socket {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("nf_tables did not answer in 2 s")]
    Timeout,
    #[error(
        "nf_tables' answers overflowed the socket's receive buffer: the batch's outcome is unknown"
    )]
    Overrun,
    #[error("nf_tables' answer is malformed: {0}")]
    Answer(#[from] AnswerError),
}

/// How the kernel's answer to a batch is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("short netlink header ({0} bytes)")]
    ShortHeader(usize),
    #[error("bad netlink length {0}")]
    BadLength(u32),
    #[error("short netlink error message")]
    ShortError,
}

impl Error {
    /// The kernel's errno, when it refused something.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Wraps a socket call's error with what was being done.
fn socket_error<E: Into<io::Error>>(what: impl Into<String>) -> impl FnOnce(E) -> Error {
    let what = what.into();
    move |e| Error::Socket {
        what,
        source: e.into(),
    }
}

fn len16(what: &'static str, len: usize) -> Result<u16, Error> {
    u16::try_from(len).map_err(|_| Error::TooLong {
        what,
        len,
        max: u16::MAX.into(),
    })
}

fn len32(what: &'static str, len: usize) -> Result<u32, Error> {
    u32::try_from(len).map_err(|_| Error::TooLong {
        what,
        len,
        max: u32::MAX.into(),
    })
}

/// One membership change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Element {
    pub add: bool,
    pub set: SetName,
    pub mac: MacAddr,
}

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) -> Result<(), Error> {
    let len = len16("attribute", 4 + payload.len())?;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
    Ok(())
}

fn nested(
    buf: &mut Vec<u8>,
    kind: u16,
    inner: impl FnOnce(&mut Vec<u8>) -> Result<(), Error>,
) -> Result<(), Error> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    inner(buf)?;
    let len = len16("nested attribute", buf.len() - start)?;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    Ok(())
}

fn message(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), Error>,
) -> Result<(), Error> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version 0, resource id (big-endian).
    buf.push(family);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    body(buf)?;
    let len = len32("message", buf.len() - start)?;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    Ok(())
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A batch ready to send: begin, acknowledged messages, end.
#[derive(Debug)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// Each acknowledged message's sequence number and what it does (an error names it).
    pub messages: Vec<(u32, String)>,
    /// The first sequence number after the batch's own.
    pub next_seq: u32,
    /// The begin message's sequence number: answers outside `first_seq..next_seq` belong to
    /// another batch.
    pub first_seq: u32,
}

impl Batch {
    /// Starts a batch whose begin message is numbered `seq`.
    fn begin(seq: u32) -> Result<Self, Error> {
        let mut bytes = Vec::with_capacity(256);
        message(
            &mut bytes,
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            seq,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| Ok(()),
        )?;
        Ok(Batch {
            bytes,
            messages: Vec::new(),
            next_seq: seq.wrapping_add(1),
            first_seq: seq,
        })
    }

    /// Adds one acknowledged element message (`kind` NEWSETELEM or DELSETELEM) on `set`.
    fn elements(
        &mut self,
        kind: u16,
        set: &str,
        what: String,
        elements: impl FnOnce(&mut Vec<u8>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let flags = if kind == NFT_MSG_NEWSETELEM {
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK
        } else {
            NLM_F_REQUEST | NLM_F_ACK
        };
        let seq = self.next_seq;
        message(
            &mut self.bytes,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            flags,
            seq,
            NFPROTO_INET,
            0,
            |b| {
                attr(b, NFTA_SET_ELEM_LIST_TABLE, &cstr(TABLE))?;
                attr(b, NFTA_SET_ELEM_LIST_SET, &cstr(set))?;
                elements(b)
            },
        )?;
        self.messages.push((seq, what));
        self.next_seq = seq.wrapping_add(1);
        Ok(())
    }

    /// Closes the batch.
    fn end(mut self) -> Result<Self, Error> {
        message(
            &mut self.bytes,
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            self.next_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
            |_| Ok(()),
        )?;
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(self)
    }

    /// What the acknowledged message `seq` does ("the batch" for any other).
    fn what(&self, seq: u32) -> String {
        self.messages
            .iter()
            .find(|(s, _)| *s == seq)
            .map_or_else(|| "the batch".into(), |(_, w)| w.clone())
    }
}

/// The batch for these changes, its messages numbered from `seq`: batch begin, for each run
/// of changes to the same set in the same direction one acknowledged message per
/// [`MACS_PER_MESSAGE`] elements, batch end.
pub fn encode(seq: u32, changes: &[Element]) -> Result<Batch, Error> {
    let mut batch = Batch::begin(seq)?;
    for run in changes.chunk_by(|a, b| a.add == b.add && a.set == b.set) {
        let (kind, verb, prep) = if run[0].add {
            (NFT_MSG_NEWSETELEM, "adding", "to")
        } else {
            (NFT_MSG_DELSETELEM, "deleting", "from")
        };
        let set = run[0].set.as_str();
        let parts = run.len().div_ceil(MACS_PER_MESSAGE);
        for (i, part) in run.chunks(MACS_PER_MESSAGE).enumerate() {
            let mut what = format!("{verb} {} element(s) {prep} set {set}", part.len());
            if parts > 1 {
                what += &format!(" (part {} of {parts}, {} in all)", i + 1, run.len());
            }
            batch.elements(kind, set, what, |b| {
                nested(b, NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
                    part.iter().try_for_each(|e| {
                        nested(b, NFTA_LIST_ELEM, |b| {
                            nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &e.mac.0))
                        })
                    })
                })
            })?;
        }
    }
    batch.end()
}

/// The batch that flushes the `leader` set and, with a timeout, puts `iface` back in it
/// for that long (milliseconds): one atomic refresh of the leader's right to serve.
pub fn encode_leader(seq: u32, iface: &str, timeout_ms: Option<u64>) -> Result<Batch, Error> {
    let mut batch = Batch::begin(seq)?;
    // No element list: a flush of the set.
    batch.elements(
        NFT_MSG_DELSETELEM,
        "leader",
        "flushing the leader set".into(),
        |_| Ok(()),
    )?;
    if let Some(ms) = timeout_ms {
        let mut key = [0u8; IFNAMSIZ];
        let name = &iface.as_bytes()[..iface.len().min(IFNAMSIZ - 1)];
        key[..name.len()].copy_from_slice(name);
        batch.elements(
            NFT_MSG_NEWSETELEM,
            "leader",
            format!("putting {iface} in the leader set"),
            |b| {
                nested(b, NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
                    nested(b, NFTA_LIST_ELEM, |b| {
                        nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &key))?;
                        attr(b, NFTA_SET_ELEM_TIMEOUT, &ms.max(1).to_be_bytes())
                    })
                })
            },
        )?;
    }
    batch.end()
}

/// What the kernel said about one message: `(seq, errno)`, errno 0 for an acknowledgement.
pub fn parse_acks(mut bytes: &[u8]) -> Result<Vec<(u32, i32)>, AnswerError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 16 {
            return Err(AnswerError::ShortHeader(bytes.len()));
        }
        let len = u32::from_ne_bytes(bytes[0..4].try_into().unwrap_or_default());
        let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
        let len = match usize::try_from(len) {
            Ok(l) if (16..=bytes.len()).contains(&l) => l,
            _ => return Err(AnswerError::BadLength(len)),
        };
        if kind == NLMSG_ERROR {
            if len < 20 {
                return Err(AnswerError::ShortError);
            }
            // Wrapping: a (bogus) i32::MIN stays an error instead of overflowing.
            let errno =
                i32::from_ne_bytes(bytes[16..20].try_into().unwrap_or_default()).wrapping_neg();
            // The error carries the offending request's header: its sequence number.
            let seq = if len >= 36 {
                u32::from_ne_bytes(bytes[28..32].try_into().unwrap_or_default())
            } else {
                u32::from_ne_bytes(bytes[8..12].try_into().unwrap_or_default())
            };
            out.push((seq, errno));
        }
        bytes = &bytes[len.next_multiple_of(4).min(bytes.len())..];
    }
    Ok(out)
}

/// A netlink socket to nf_tables that stays open for the appliance's lifetime.
#[derive(Debug)]
pub struct SetLink {
    fd: OwnedFd,
    seq: u32,
    /// The socket's buffer sizes as the kernel reports them (grown for big batches).
    sndbuf: usize,
    rcvbuf: usize,
}

impl SetLink {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, Error> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(socket_error("opening a netfilter netlink socket"))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(socket_error("binding"))?;
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(2, 0))
            .map_err(socket_error("setting the receive timeout"))?;
        let sndbuf = getsockopt(&fd, sockopt::SndBuf).map_err(socket_error("SO_SNDBUF"))?;
        let rcvbuf = getsockopt(&fd, sockopt::RcvBuf).map_err(socket_error("SO_RCVBUF"))?;
        Ok(SetLink {
            fd,
            seq: 1,
            sndbuf,
            rcvbuf,
        })
    }

    /// A socket in the named network namespace (`/run/netns/NAME`): opened from a thread
    /// that enters the namespace; the socket stays bound to it.
    pub fn open_in_netns(ns: &str) -> Result<Self, Error> {
        let path = format!("/run/netns/{ns}");
        let entering = format!("entering network namespace {ns}");
        std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(&path).map_err(socket_error(entering.clone()))?;
                nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(socket_error(entering.clone()))?;
                SetLink::open()
            })
            .join()
            .unwrap_or_else(|_| {
                Err(socket_error(entering.clone())(io::Error::other(
                    "thread panicked",
                )))
            })
        })
    }

    /// Flushes the `leader` set and (with a timeout) puts `iface` back for that long.
    pub fn refresh_leader(
        &mut self,
        iface: &str,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        let ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let batch = encode_leader(self.seq, iface, ms)?;
        self.exchange(&batch)
    }

    /// Applies the changes as one atomic batch. An error names the kernel's reason (a
    /// missing table or set is `No such file or directory`: the caller rebuilds with nft).
    pub fn apply(&mut self, changes: &[Element]) -> Result<(), Error> {
        if changes.is_empty() {
            return Ok(());
        }
        let batch = encode(self.seq, changes)?;
        self.exchange(&batch)
    }

    /// Grows the socket's buffers so the batch goes out as one datagram (the kernel reads
    /// a batch from one) and every answer to it fits, the refusals that echo their message
    /// included. SO_*BUFFORCE (CAP_NET_ADMIN, which changing nf_tables needs anyway) goes
    /// past `net.core.[wr]mem_max`; without it the plain option is tried.
    fn make_room(&mut self, batch: &Batch) -> Result<(), Error> {
        let send = batch.bytes.len() + SEND_SLACK;
        if send > self.sndbuf {
            self.sndbuf = grow(&self.fd, sockopt::SndBufForce, sockopt::SndBuf, send)?;
        }
        let answers = batch.messages.len() * ACK_ROOM + 2 * batch.bytes.len();
        if answers > self.rcvbuf {
            self.rcvbuf = grow(&self.fd, sockopt::RcvBufForce, sockopt::RcvBuf, answers)?;
        }
        Ok(())
    }

    /// Sends a batch and waits for the acknowledgement of each of its messages. A refusal
    /// names the first refused message.
    fn exchange(&mut self, batch: &Batch) -> Result<(), Error> {
        self.seq = batch.next_seq;
        self.make_room(batch)?;
        // Answers an earlier batch left behind (it timed out or overran) are not this one's.
        let mut rx = vec![0u8; RX_BYTES];
        while recv(self.fd.as_raw_fd(), &mut rx, MsgFlags::MSG_DONTWAIT).is_ok_and(|n| n > 0) {}
        sendto(
            self.fd.as_raw_fd(),
            &batch.bytes,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(socket_error(format!(
            "sending a batch of {} bytes (send buffer {} bytes)",
            batch.bytes.len(),
            self.sndbuf
        )))?;
        let mut pending: BTreeSet<u32> = batch.messages.iter().map(|(s, _)| *s).collect();
        let mut first_error = None;
        let ours = |seq: u32| in_batch(batch.first_seq, batch.next_seq, seq);
        while !pending.is_empty() {
            let n = match recv(self.fd.as_raw_fd(), &mut rx, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EAGAIN) => return Err(Error::Timeout),
                Err(Errno::ENOBUFS) => return Err(Error::Overrun),
                Err(e) => return Err(socket_error("receiving nf_tables' answer")(e)),
            };
            for (seq, errno) in parse_acks(&rx[..n])? {
                if !ours(seq) {
                    continue;
                }
                if errno != 0 && first_error.is_none() {
                    first_error = Some((seq, errno));
                }
                // A refusal of the batch itself (begin or end): no other answer comes.
                if !pending.remove(&seq) && errno != 0 {
                    pending.clear();
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some((seq, errno)) => Err(Error::Refused {
                what: batch.what(seq),
                errno,
            }),
        }
    }
}

/// Whether `seq` is one of a batch's numbers, `first..next` (sequence numbers wrap).
fn in_batch(first: u32, next: u32, seq: u32) -> bool {
    seq.wrapping_sub(first) < next.wrapping_sub(first)
}

/// Raises a socket buffer to at least `want` bytes (forced, else within the system's
/// maximum); returns the size the kernel then reports.
fn grow<F, P>(fd: &OwnedFd, force: F, plain: P, want: usize) -> Result<usize, Error>
where
    F: SetSockOpt<Val = usize>,
    P: SetSockOpt<Val = usize> + GetSockOpt<Val = usize> + Copy,
{
    if setsockopt(fd, force, &want).is_err() {
        setsockopt(fd, plain, &want).map_err(socket_error(format!(
            "raising a socket buffer to {want} bytes"
        )))?;
    }
    getsockopt(fd, plain).map_err(socket_error("reading a socket buffer's size"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn answers_of_another_batch_are_not_this_ones() {
        use super::in_batch;
        for (first, next, seq, ours) in [
            (7, 10, 7, true),
            (7, 10, 9, true),
            (7, 10, 10, false),
            (7, 10, 6, false),
            (u32::MAX - 1, 2, u32::MAX, true),
            (u32::MAX - 1, 2, 1, true),
            (u32::MAX - 1, 2, 2, false),
            (u32::MAX - 1, 2, u32::MAX - 2, false),
        ] {
            assert_eq!(in_batch(first, next, seq), ours, "{seq} in {first}..{next}");
        }
    }

    use super::*;

    fn seqs(batch: &Batch) -> Vec<u32> {
        batch.messages.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn encodes_what_nft_sends_for_one_delete() {
        // Recorded with strace from `nft delete element inet t s { 52:54:00:00:00:01 }`
        // (nft 1.0.6): the DELSETELEM message of 60 bytes. Ours differs only in names, the
        // ACK flag and the sequence number.
        let batch = encode(
            7,
            &[Element {
                add: false,
                set: SetName::Deny,
                mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
            }],
        )
        .unwrap();
        assert_eq!(seqs(&batch), vec![8]);
        assert_eq!(batch.next_seq, 10, "begin 7, delete 8, end 9");
        let buf = batch.bytes;
        // begin (20) + delete + end (20).
        let del = &buf[20..buf.len() - 20];
        assert_eq!(
            usize::try_from(u32::from_ne_bytes(del[0..4].try_into().unwrap())).unwrap(),
            del.len()
        );
        assert_eq!(u16::from_ne_bytes([del[4], del[5]]), 0x0a0e);
        assert_eq!(
            u16::from_ne_bytes([del[6], del[7]]),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(u32::from_ne_bytes(del[8..12].try_into().unwrap()), 8);
        assert_eq!(&del[16..20], &[1, 0, 0, 0]);
        // table "paddock\0" (12 bytes incl. header), set "deny\0" (9 → 12), elements.
        let attrs = &del[20..];
        assert_eq!(&attrs[0..4], &[12, 0, 1, 0]);
        assert_eq!(&attrs[4..12], b"paddock\0");
        assert_eq!(&attrs[12..16], &[9, 0, 2, 0]);
        assert_eq!(&attrs[16..21], b"deny\0");
        // The same nesting as nft's: 18 00 03 80 | 14 00 01 80 | 10 00 01 80 | 0a 00 01 00 mac pad
        assert_eq!(
            &attrs[24..],
            &[
                0x18, 0, 3, 0x80, 0x14, 0, 1, 0x80, 0x10, 0, 1, 0x80, 0x0a, 0, 1, 0, 0x52, 0x54, 0,
                0, 0, 1, 0, 0
            ]
        );
        // Batch begin and end carry the nftables subsystem as resource id.
        assert_eq!(u16::from_ne_bytes([buf[4], buf[5]]), NFNL_MSG_BATCH_BEGIN);
        assert_eq!(&buf[18..20], &[0, 10]);
        let end = &buf[buf.len() - 20..];
        assert_eq!(u16::from_ne_bytes([end[4], end[5]]), NFNL_MSG_BATCH_END);
    }

    #[test]
    fn one_message_per_run_of_the_same_set_and_direction() {
        let e = |add, set, n| Element {
            add,
            set,
            mac: MacAddr([2, 0, 0, 0, 0, n]),
        };
        let batch = encode(
            1,
            &[
                e(false, SetName::Deny, 1),
                e(false, SetName::Deny, 2),
                e(true, SetName::Allow, 1),
                e(true, SetName::Allow, 2),
                e(true, SetName::Deny, 3),
            ],
        )
        .unwrap();
        assert_eq!(seqs(&batch), vec![2, 3, 4]);
        assert_eq!(batch.messages[0].1, "deleting 2 element(s) from set deny");
    }

    /// Walks a batch: each message's type, sequence number and, for element messages, the
    /// length of its element list and the MACs in it.
    fn walk(bytes: &[u8]) -> Vec<(u16, u32, usize, Vec<[u8; 6]>)> {
        let word = |b: &[u8], at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let len = usize::try_from(u32::from_ne_bytes(rest[0..4].try_into().unwrap())).unwrap();
            let (msg, tail) = rest.split_at(len);
            let seq = u32::from_ne_bytes(msg[8..12].try_into().unwrap());
            let (mut list_len, mut macs) = (0, Vec::new());
            let mut attrs = &msg[20..];
            while !attrs.is_empty() {
                let alen = usize::from(word(attrs, 0));
                if word(attrs, 2) == NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED {
                    list_len = alen;
                    // Each element: list element (4) + key (4) + value (4 + 6 + 2 padding).
                    for elem in attrs[4..alen].chunks(MAC_ELEMENT_BYTES) {
                        assert_eq!(usize::from(word(elem, 0)), MAC_ELEMENT_BYTES);
                        macs.push(elem[12..18].try_into().unwrap());
                    }
                }
                attrs = &attrs[alen.next_multiple_of(4)..];
            }
            out.push((word(msg, 4), seq, list_len, macs));
            rest = tail;
        }
        out
    }

    #[test]
    fn long_runs_split_into_messages_that_fit() {
        let mac = |i: u32| {
            let b = i.to_be_bytes();
            MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
        };
        for (n, messages) in [(1, 1), (MACS_PER_MESSAGE, 1), (3_400, 5), (100_000, 123)] {
            let n = u32::try_from(n).unwrap();
            let changes: Vec<Element> = (0..n)
                .map(|i| Element {
                    add: true,
                    set: SetName::Deny,
                    mac: mac(i),
                })
                .chain([Element {
                    add: false,
                    set: SetName::Allow,
                    mac: mac(n),
                }])
                .collect();
            let batch = encode(40, &changes).unwrap();
            let walked = walk(&batch.bytes);
            // One batch: begin, the element messages numbered on, end.
            assert_eq!(walked[0].0, NFNL_MSG_BATCH_BEGIN);
            assert_eq!(walked.last().unwrap().0, NFNL_MSG_BATCH_END);
            let body = &walked[1..walked.len() - 1];
            assert_eq!(body.len(), messages + 1, "{n} MACs");
            assert_eq!(
                seqs(&batch),
                (41..42 + u32::try_from(messages).unwrap()).collect::<Vec<_>>()
            );
            for (kind, _, list_len, _) in &body[..messages] {
                assert_eq!(*kind, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM);
                assert!(*list_len <= MAX_LIST_BYTES, "{list_len}");
            }
            let sent: Vec<[u8; 6]> = body.iter().flat_map(|m| m.3.clone()).collect();
            let want: Vec<[u8; 6]> = changes.iter().map(|e| e.mac.0).collect();
            assert_eq!(sent, want, "every MAC once, in order");
            assert_eq!(
                body[messages].0,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELSETELEM
            );
        }
        let batch = encode(
            1,
            &[Element {
                add: true,
                set: SetName::Deny,
                mac: mac(0),
            }; 3_400],
        )
        .unwrap();
        assert_eq!(
            batch.messages[4].1,
            "adding 124 element(s) to set deny (part 5 of 5, 3400 in all)"
        );
    }

    #[test]
    fn a_length_that_does_not_fit_is_an_error_not_a_wrap() {
        let mut buf = Vec::new();
        let e = attr(&mut buf, 1, &[0; 65_532]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLong {
                    what: "attribute",
                    len: 65_536,
                    max: 65_535
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "a netlink attribute of 65536 bytes does not fit its length field (at most 65535)"
        );
        attr(&mut buf, 1, &[0; 65_531]).unwrap();
        let e = nested(&mut buf, 3, |b| {
            (0..4_000).try_for_each(|_| attr(b, 1, &[0; 16]))
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLong {
                    what: "nested attribute",
                    len: 80_004,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn parses_acks_and_errors() {
        let mut b = Vec::new();
        for (seq, err) in [(3u32, 0i32), (4, -2)] {
            b.extend_from_slice(&36u32.to_ne_bytes());
            b.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            b.extend_from_slice(&0u16.to_ne_bytes());
            b.extend_from_slice(&seq.to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            b.extend_from_slice(&err.to_ne_bytes());
            // the request's header
            b.extend_from_slice(&60u32.to_ne_bytes());
            b.extend_from_slice(&0x0a0eu16.to_ne_bytes());
            b.extend_from_slice(&0u16.to_ne_bytes());
            b.extend_from_slice(&seq.to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
        }
        assert_eq!(parse_acks(&b).unwrap(), vec![(3, 0), (4, 2)]);
        assert!(parse_acks(&b[..10]).is_err());
        let mut bad = b.clone();
        bad[0] = 200;
        assert!(parse_acks(&bad).is_err());
    }

    #[test]
    fn parse_acks_survives_errno_i32_min() {
        // Found by the `netlink_acks` fuzz target: an error message whose error field is
        // i32::MIN overflowed the negation.
        let crash: &[u8] = &[
            0x24, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0xff, 0x00, 0x00, 0x00, 0x80, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x39, 0xff, 0xff, 0xff, 0xfe, 0xfe, 0xef, 0xff, 0x00, 0x12, 0x00,
            0x00, 0x00, 0x02, 0x00, 0x12, 0x41, 0x64, 0x00, 0x00, 0x00, 0x21, 0x00, 0x00, 0x03,
            0x01, 0x00, 0x00, 0x00, 0x00,
        ];
        let _ = parse_acks(crash);
        let mut b = Vec::new();
        b.extend_from_slice(&20u32.to_ne_bytes());
        b.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&5u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&i32::MIN.to_ne_bytes());
        let acks = parse_acks(&b).unwrap();
        assert_eq!(acks.len(), 1);
        assert_eq!(acks[0].0, 5);
        assert_ne!(acks[0].1, 0, "still an error");
    }
}
