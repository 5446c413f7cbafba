//! The TFTP protocol: read requests (RFC 1350) with option negotiation (RFC 2347) for
//! blksize (RFC 2348), timeout and tsize (RFC 2349) and windowsize (RFC 7440).
//!
//! Parsing, negotiation and the transfer itself ([`Transfer`], a state machine fed packets
//! and time) are pure; [`crate::pool`] drives many transfers per thread.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

pub const RRQ: u16 = 1;
pub const WRQ: u16 = 2;
pub const DATA: u16 = 3;
pub const ACK: u16 = 4;
pub const ERROR: u16 = 5;
pub const OACK: u16 = 6;

/// TFTP error codes (RFC 1350 §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    NotDefined = 0,
    FileNotFound = 1,
    AccessViolation = 2,
    IllegalOperation = 4,
    /// RFC 2347: option negotiation failed.
    BadOptions = 8,
}

/// A request as sent by a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub write: bool,
    pub filename: String,
    pub mode: String,
    /// Options in the order sent, names lower-cased.
    pub options: Vec<(String, String)>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("packet too short")]
    Short,
    #[error("not a read or write request (opcode {0})")]
    NotRequest(u16),
    #[error("request fields are not NUL-terminated text")]
    Malformed,
    #[error("transfer mode {0:?} is not octet or netascii")]
    Mode(String),
}

/// Parses an RRQ/WRQ.
pub fn parse_request(buf: &[u8]) -> Result<Request, ParseError> {
    if buf.len() < 4 {
        return Err(ParseError::Short);
    }
    let op = u16::from_be_bytes([buf[0], buf[1]]);
    if op != RRQ && op != WRQ {
        return Err(ParseError::NotRequest(op));
    }
    let body = &buf[2..];
    if body.last() != Some(&0) {
        return Err(ParseError::Malformed);
    }
    let mut fields = body[..body.len() - 1]
        .split(|b| *b == 0)
        .map(|f| std::str::from_utf8(f).map_err(|_| ParseError::Malformed));
    let filename = fields.next().ok_or(ParseError::Malformed)??.to_string();
    let mode = fields
        .next()
        .ok_or(ParseError::Malformed)??
        .to_ascii_lowercase();
    if mode != "octet" && mode != "netascii" {
        return Err(ParseError::Mode(mode));
    }
    let mut options = Vec::new();
    loop {
        match (fields.next(), fields.next()) {
            (Some(k), Some(v)) => options.push((k?.to_ascii_lowercase(), v?.to_string())),
            (None, _) => break,
            (Some(_), None) => return Err(ParseError::Malformed),
        }
    }
    Ok(Request {
        write: op == WRQ,
        filename,
        mode,
        options,
    })
}

/// Server limits on what clients may ask for.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_block_size: u16,
    pub max_window_size: u16,
    pub default_timeout: Duration,
}

/// The parameters of a transfer after negotiation, and the OACK options (if any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub block_size: usize,
    pub window_size: usize,
    pub timeout: Duration,
    pub oack: Vec<(String, String)>,
}

/// The longest per-packet timeout a client may ask for (seconds).
pub const TIMEOUT_MAX: u64 = 30;
/// The most bytes a transfer's window may hold (RFC 7440 lets the server grant a smaller
/// window than asked): with thousands of transfers, what a window holds is what they cost.
pub const WINDOW_BYTES_MAX: usize = 128 << 10;

/// Accepts the options we support, clamped to our limits (RFC 2347: unknown ones are ignored).
pub fn negotiate(req: &Request, size: Option<u64>, limits: Limits) -> Negotiated {
    let mut n = negotiate_options(req, size, limits);
    let fits = (WINDOW_BYTES_MAX / (n.block_size + 4)).max(1);
    if n.window_size > fits {
        n.window_size = fits;
        for (k, v) in &mut n.oack {
            if k == "windowsize" {
                *v = fits.to_string();
            }
        }
    }
    n
}

fn negotiate_options(req: &Request, size: Option<u64>, limits: Limits) -> Negotiated {
    let mut n = Negotiated {
        block_size: 512,
        window_size: 1,
        timeout: limits.default_timeout,
        oack: Vec::new(),
    };
    for (k, v) in &req.options {
        match k.as_str() {
            "blksize" => {
                if let Ok(b) = v.parse::<u32>()
                    && b >= 8
                {
                    let b = b.min(65464).min(u32::from(limits.max_block_size));
                    n.block_size = b as usize;
                    n.oack.push((k.clone(), b.to_string()));
                }
            }
            "windowsize" => {
                if let Ok(w) = v.parse::<u32>()
                    && (1..=65535).contains(&w)
                {
                    let w = w.min(u32::from(limits.max_window_size.max(1)));
                    n.window_size = w as usize;
                    n.oack.push((k.clone(), w.to_string()));
                }
            }
            "timeout" => {
                // RFC 2349 allows 1–255 s; longer than TIMEOUT_MAX would let one silent client
                // hold a transfer slot for minutes, so such a request is not acknowledged (the
                // option is then not in the OACK, and the server's default applies).
                if let Ok(t) = v.parse::<u64>()
                    && (1..=TIMEOUT_MAX).contains(&t)
                {
                    n.timeout = Duration::from_secs(t);
                    n.oack.push((k.clone(), t.to_string()));
                }
            }
            "tsize" => {
                if let Some(s) = size {
                    n.oack.push((k.clone(), s.to_string()));
                }
            }
            _ => {}
        }
    }
    n
}

pub fn error_packet(code: ErrorCode, msg: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + msg.len());
    p.extend_from_slice(&ERROR.to_be_bytes());
    p.extend_from_slice(&(code as u16).to_be_bytes());
    p.extend_from_slice(msg.as_bytes());
    p.push(0);
    p
}

pub fn oack_packet(opts: &[(String, String)]) -> Vec<u8> {
    let mut p = OACK.to_be_bytes().to_vec();
    for (k, v) in opts {
        p.extend_from_slice(k.as_bytes());
        p.push(0);
        p.extend_from_slice(v.as_bytes());
        p.push(0);
    }
    p
}

/// What a transfer sends: a reader with a known size.
pub struct Source {
    pub reader: Box<dyn Read + Send>,
    pub size: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("no acknowledgement after {0} tries")]
    TimedOut(u32),
    #[error("client sent error: {0}")]
    ClientError(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

const MAX_TRIES: u32 = 5;

/// What a transfer wants next from the loop that drives it.
#[derive(Debug)]
pub enum Step {
    /// Waiting for an acknowledgement until this instant (then [`Transfer::on_timeout`]).
    Wait(Instant),
    /// The whole file was sent and acknowledged: this many bytes.
    Done(u64),
    Failed(TransferError),
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// The OACK was sent; it is acknowledged with ACK 0.
    Oack,
    Data,
}

/// One read transfer as a state machine, driven by the packets the client sends and by time,
/// both passed in; it sends through the function it is given (the connected socket of the
/// transfer in the server). Lock-step or windowed (RFC 7440): the window is sent whole, an
/// ACK of any block in it slides it, and a window that is not acknowledged within the
/// negotiated timeout is sent again, at most [`MAX_TRIES`] times.
pub struct Transfer {
    src: Source,
    n: Negotiated,
    phase: Phase,
    /// `window[i]` is the DATA packet of block `base + i`.
    window: VecDeque<Vec<u8>>,
    base: u64,
    next: u64,
    eof: bool,
    sent_bytes: u64,
    tries: u32,
}

impl Transfer {
    pub fn new(src: Source, n: Negotiated) -> Self {
        let window = VecDeque::with_capacity(n.window_size);
        Transfer {
            src,
            phase: if n.oack.is_empty() {
                Phase::Data
            } else {
                Phase::Oack
            },
            n,
            window,
            base: 1,
            next: 1,
            eof: false,
            sent_bytes: 0,
            tries: 0,
        }
    }

    /// Sends the OACK, or the first window.
    pub fn start(&mut self, now: Instant, send: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> Step {
        self.transmit(now, send)
    }

    fn transmit(&mut self, now: Instant, send: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> Step {
        let sent = match self.phase {
            Phase::Oack => send(&oack_packet(&self.n.oack)),
            Phase::Data => {
                if let Err(e) = self.fill() {
                    return Step::Failed(e.into());
                }
                if self.window.is_empty() {
                    return Step::Done(self.sent_bytes);
                }
                self.window.iter().try_for_each(|p| send(p))
            }
        };
        match sent {
            Ok(()) => Step::Wait(now + self.n.timeout),
            Err(e) => Step::Failed(e.into()),
        }
    }

    /// Reads the file until the window is full or the file ends.
    fn fill(&mut self) -> io::Result<()> {
        while !self.eof && self.window.len() < self.n.window_size {
            let bs = self.n.block_size;
            let mut pkt = Vec::with_capacity(4 + bs);
            pkt.extend_from_slice(&DATA.to_be_bytes());
            // Block numbers wrap at 2^16 (RFC 1350 says nothing; every client expects it).
            pkt.extend_from_slice(&((self.next & 0xffff) as u16).to_be_bytes());
            pkt.resize(4 + bs, 0);
            let mut filled = 0;
            while filled < bs {
                let r = self.src.reader.read(&mut pkt[4 + filled..])?;
                if r == 0 {
                    break;
                }
                filled += r;
            }
            pkt.truncate(4 + filled);
            self.eof = filled < bs;
            self.sent_bytes += filled as u64;
            self.window.push_back(pkt);
            self.next += 1;
        }
        Ok(())
    }

    /// A packet from the client. Anything that is not an ACK of the OACK or of a block of
    /// the window (a duplicate, a stray) changes nothing and keeps the deadline.
    pub fn on_packet(
        &mut self,
        pkt: &[u8],
        now: Instant,
        send: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Option<Step> {
        if pkt.len() < 4 {
            return None;
        }
        let op = u16::from_be_bytes([pkt[0], pkt[1]]);
        let num = u16::from_be_bytes([pkt[2], pkt[3]]);
        if op == ERROR {
            let msg = String::from_utf8_lossy(&pkt[4..])
                .trim_end_matches('\0')
                .to_string();
            return Some(Step::Failed(TransferError::ClientError(msg)));
        }
        if op != ACK {
            return None;
        }
        match self.phase {
            Phase::Oack if num == 0 => self.phase = Phase::Data,
            Phase::Oack => return None,
            Phase::Data => {
                // Which block of the window does this ACK name? (block numbers wrap)
                let off = u64::from(num.wrapping_sub((self.base & 0xffff) as u16));
                let count = u64::try_from(self.window.len()).unwrap_or(u64::MAX);
                if off >= count {
                    return None; // an ACK of an earlier block: a duplicate
                }
                let acked = usize::try_from(off + 1).unwrap_or(self.window.len());
                self.window.drain(..acked);
                self.base += off + 1;
                if self.eof && self.window.is_empty() {
                    return Some(Step::Done(self.sent_bytes));
                }
            }
        }
        self.tries = 0;
        Some(self.transmit(now, send))
    }

    /// The deadline passed with no acknowledgement: send again, or give up.
    pub fn on_timeout(
        &mut self,
        now: Instant,
        send: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Step {
        self.tries += 1;
        if self.tries >= MAX_TRIES {
            return Step::Failed(TransferError::TimedOut(self.tries));
        }
        self.transmit(now, send)
    }
}

/// The address a transfer replies from: the listen address, never a wildcard-chosen one
/// (some PXE ROMs drop replies from an unexpected address).
pub fn transfer_socket(listen: SocketAddr, peer: SocketAddr) -> std::io::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddr::new(listen.ip(), 0))?;
    sock.connect(peer)?;
    // Room for a whole window: a send that would block is a lost packet, repaired only by
    // the timeout.
    use nix::sys::socket::{setsockopt, sockopt};
    let room = 4 * WINDOW_BYTES_MAX;
    if setsockopt(&sock, sockopt::SndBufForce, &room).is_err() {
        let _ = setsockopt(&sock, sockopt::SndBuf, &room);
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(parts: &[&str]) -> Vec<u8> {
        let mut p = RRQ.to_be_bytes().to_vec();
        for s in parts {
            p.extend_from_slice(s.as_bytes());
            p.push(0);
        }
        p
    }

    #[test]
    fn parses_requests() {
        let r = parse_request(&rrq(&[
            "undionly.kpxe",
            "OCTET",
            "blksize",
            "1468",
            "tsize",
            "0",
        ]))
        .unwrap();
        assert_eq!(r.filename, "undionly.kpxe");
        assert_eq!(r.mode, "octet");
        assert_eq!(
            r.options,
            [
                ("blksize".into(), "1468".into()),
                ("tsize".into(), "0".into())
            ]
        );
        assert!(!r.write);
        let bad: &[(&[u8], ParseError)] = &[
            (b"\x00", ParseError::Short),
            (b"\x00\x03\x00\x01abc", ParseError::NotRequest(3)),
            (b"\x00\x01file\x00octet", ParseError::Malformed),
            (b"\x00\x01file\x00mail\x00", ParseError::Mode("mail".into())),
            (
                b"\x00\x01file\x00octet\x00blksize\x00",
                ParseError::Malformed,
            ),
            (b"\x00\x01\xff\xfe\x00octet\x00", ParseError::Malformed),
        ];
        for (b, want) in bad {
            assert_eq!(&parse_request(b).unwrap_err(), want, "{b:?}");
        }
    }

    fn limits(max_block_size: u16, max_window_size: u16) -> Limits {
        Limits {
            max_block_size,
            max_window_size,
            default_timeout: Duration::from_secs(3),
        }
    }

    #[test]
    fn negotiates_within_limits() {
        let limits = limits(1468, 8);
        let req = parse_request(&rrq(&[
            "f",
            "octet",
            "blksize",
            "9000",
            "windowsize",
            "64",
            "timeout",
            "7",
            "tsize",
            "0",
            "multicast",
            "x",
        ]))
        .unwrap();
        let n = negotiate(&req, Some(1234), limits);
        assert_eq!(
            (n.block_size, n.window_size, n.timeout),
            (1468, 8, Duration::from_secs(7))
        );
        let oack: Vec<(&str, &str)> = n
            .oack
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            oack,
            [
                ("blksize", "1468"),
                ("windowsize", "8"),
                ("timeout", "7"),
                ("tsize", "1234")
            ]
        );
        // Out-of-range values are ignored, not answered.
        let req = parse_request(&rrq(&[
            "f",
            "octet",
            "blksize",
            "4",
            "windowsize",
            "0",
            "timeout",
            "999",
        ]))
        .unwrap();
        let n = negotiate(&req, None, limits);
        assert_eq!((n.block_size, n.window_size, n.oack.len()), (512, 1, 0));
        // A client may not hold a slot for minutes, nor a window of megabytes.
        let big = self::limits(65464, 64);
        let req = parse_request(&rrq(&[
            "f",
            "octet",
            "blksize",
            "65464",
            "windowsize",
            "64",
            "timeout",
            "255",
        ]))
        .unwrap();
        let n = negotiate(&req, None, big);
        assert_eq!((n.block_size, n.window_size), (65464, 2));
        assert_eq!(n.timeout, Duration::from_secs(3), "timeout 255 not granted");
        assert!(n.window_size * (n.block_size + 4) <= WINDOW_BYTES_MAX);
        assert_eq!(
            n.oack,
            [
                ("blksize".to_string(), "65464".to_string()),
                ("windowsize".to_string(), "2".to_string())
            ]
        );
    }

    fn source(data: Vec<u8>) -> Source {
        Source {
            reader: Box::new(std::io::Cursor::new(data)),
            size: None,
        }
    }

    /// A whole transfer against a scripted client, time passed in: a lost ACK and a
    /// block-number wrap.
    #[test]
    fn windowed_transfer_with_retransmission_and_wrap() {
        let data: Vec<u8> = (0..(70_000u32 * 8 + 3)).map(|i| (i % 251) as u8).collect();
        let n = Negotiated {
            block_size: 8,
            window_size: 4,
            timeout: Duration::from_millis(200),
            oack: vec![("blksize".into(), "8".into())],
        };
        let mut t = Transfer::new(source(data.clone()), n);
        let out = std::cell::RefCell::new(Vec::<Vec<u8>>::new());
        let mut push = |p: &[u8]| -> io::Result<()> {
            out.borrow_mut().push(p.to_vec());
            Ok(())
        };
        let mut now = Instant::now();
        let step = t.start(now, &mut push);
        assert!(matches!(step, Step::Wait(at) if at == now + Duration::from_millis(200)));
        let oack = out.take();
        assert_eq!(oack.len(), 1);
        assert_eq!(u16::from_be_bytes([oack[0][0], oack[0][1]]), OACK);
        assert_eq!(&oack[0][2..], b"blksize\x008\x00");
        assert!(
            t.on_packet(&[0, 4, 0, 1], now, &mut push).is_none(),
            "not ACK 0"
        );
        let mut step = t.on_packet(&[0, 4, 0, 0], now, &mut push).unwrap();
        let mut got = Vec::new();
        let mut expect: u16 = 1;
        let mut dropped_once = false;
        loop {
            match step {
                Step::Done(bytes) => {
                    assert_eq!(bytes, data.len() as u64);
                    break;
                }
                Step::Failed(e) => panic!("{e}"),
                Step::Wait(_) => {}
            }
            let mut ack = None;
            for p in out.take() {
                assert_eq!(u16::from_be_bytes([p[0], p[1]]), DATA);
                let num = u16::from_be_bytes([p[2], p[3]]);
                if num == expect {
                    got.extend_from_slice(&p[4..]);
                    expect = expect.wrapping_add(1);
                }
                let last = p.len() - 4 < 8;
                // ACK the end of each window of 4 (again when it is resent).
                if num == expect.wrapping_sub(1) && (num % 4 == 0 || last) {
                    ack = Some(num);
                }
            }
            let num = ack.expect("every window ends in a block the client acknowledges");
            step = if num == 400 && !dropped_once {
                // That ACK is "lost": the deadline passes and the window is sent again.
                dropped_once = true;
                now += Duration::from_millis(200);
                t.on_timeout(now, &mut push)
            } else {
                t.on_packet(&[0, 4, (num >> 8) as u8, num as u8], now, &mut push)
                    .unwrap()
            };
        }
        assert!(dropped_once);
        assert_eq!(
            got, data,
            "every byte, in order, across the 16-bit block-number wrap"
        );
    }

    #[test]
    fn duplicates_are_ignored_and_silence_or_an_error_ends_a_transfer() {
        let n = Negotiated {
            block_size: 512,
            window_size: 1,
            timeout: Duration::from_secs(1),
            oack: Vec::new(),
        };
        let sent = std::cell::Cell::new(0);
        let mut count = |_: &[u8]| -> io::Result<()> {
            sent.set(sent.get() + 1);
            Ok(())
        };
        let now = Instant::now();
        let mut t = Transfer::new(source(vec![7; 2000]), n.clone());
        assert!(matches!(t.start(now, &mut count), Step::Wait(_)));
        assert!(matches!(
            t.on_packet(&[0, 4, 0, 1], now, &mut count),
            Some(Step::Wait(_))
        ));
        // An ACK of block 1 again (a duplicate) and garbage change nothing.
        assert!(t.on_packet(&[0, 4, 0, 1], now, &mut count).is_none());
        assert!(t.on_packet(&[0, 3], now, &mut count).is_none());
        for i in 1..MAX_TRIES {
            assert!(
                matches!(t.on_timeout(now, &mut count), Step::Wait(_)),
                "try {i}"
            );
        }
        assert!(matches!(
            t.on_timeout(now, &mut count),
            Step::Failed(TransferError::TimedOut(5))
        ));
        assert_eq!(
            sent.get(),
            2 + 4,
            "each timeout but the last sent the window again"
        );
        let mut t = Transfer::new(source(vec![7; 2000]), n);
        t.start(now, &mut count);
        let err = t.on_packet(b"\x00\x05\x00\x00disk full\x00", now, &mut count);
        assert!(
            matches!(err, Some(Step::Failed(TransferError::ClientError(ref m))) if m == "disk full"),
            "{err:?}"
        );
    }
}
