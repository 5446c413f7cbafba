//! The TFTP protocol: read requests (RFC 1350) with option negotiation (RFC 2347) for
//! blksize (RFC 2348), timeout and tsize (RFC 2349) and windowsize (RFC 7440).
//!
//! Parsing and negotiation are pure; a transfer is one blocking thread with its own socket
//! (a new transfer ID), which costs two system calls per window — the same as tftp-hpa.

use std::io::Read;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

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

/// Accepts the options we support, clamped to our limits (RFC 2347: unknown ones are ignored).
pub fn negotiate(req: &Request, size: Option<u64>, limits: Limits) -> Negotiated {
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
                if let Ok(t) = v.parse::<u64>()
                    && (1..=255).contains(&t)
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

/// Waits for an ACK of a block in `[base, base + count)` (mod 2^16); returns how many blocks
/// (from `base`) it covers, or `None` on timeout.
fn wait_ack(
    sock: &UdpSocket,
    base: u64,
    count: u64,
    buf: &mut [u8],
) -> Result<Option<u64>, TransferError> {
    loop {
        match recv_soon(sock, buf) {
            Ok(n) if n >= 4 => {
                let op = u16::from_be_bytes([buf[0], buf[1]]);
                let num = u16::from_be_bytes([buf[2], buf[3]]);
                if op == ERROR {
                    let msg = String::from_utf8_lossy(&buf[4..n])
                        .trim_end_matches('\0')
                        .to_string();
                    return Err(TransferError::ClientError(msg));
                }
                if op != ACK {
                    continue;
                }
                // Which block of the window does this ACK name? (block numbers wrap)
                let off = u64::from(num.wrapping_sub(base as u16));
                if off < count {
                    return Ok(Some(off + 1));
                }
                // An ACK for an earlier block (a duplicate): keep waiting.
            }
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How long a transfer polls for an ACK before it sleeps in `recv`. A lock-step client
/// answers within tens of microseconds; waking a sleeping thread (and CPU) costs as much
/// again, so a short poll halves the round trip on an idle appliance.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(200);

/// `recv`, polling without blocking for [`POLL_BEFORE_SLEEP`] first.
fn recv_soon(sock: &UdpSocket, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let until = std::time::Instant::now() + POLL_BEFORE_SLEEP;
    loop {
        match nix::sys::socket::recv(
            sock.as_raw_fd(),
            buf,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EAGAIN) if std::time::Instant::now() < until => {
                std::hint::spin_loop()
            }
            Err(nix::errno::Errno::EAGAIN) => return sock.recv(buf),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends `src` to the peer `sock` is connected to.
pub fn send(sock: &UdpSocket, mut src: Source, n: &Negotiated) -> Result<u64, TransferError> {
    sock.set_read_timeout(Some(n.timeout))?;
    let mut buf = vec![0u8; 1024];
    if !n.oack.is_empty() {
        let oack = oack_packet(&n.oack);
        let mut tries = 0;
        loop {
            sock.send(&oack)?;
            // The OACK is acknowledged with ACK 0.
            match wait_ack(sock, 0, 1, &mut buf)? {
                Some(_) => break,
                None => {
                    tries += 1;
                    if tries >= MAX_TRIES {
                        return Err(TransferError::TimedOut(tries));
                    }
                }
            }
        }
    }
    // `window[i]` is the DATA packet of block `base + i`.
    let mut window: std::collections::VecDeque<Vec<u8>> =
        std::collections::VecDeque::with_capacity(n.window_size);
    let mut base: u64 = 1;
    let mut next: u64 = 1;
    let mut eof = false;
    let mut sent_bytes = 0u64;
    loop {
        while !eof && window.len() < n.window_size {
            let mut pkt = Vec::with_capacity(4 + n.block_size);
            pkt.extend_from_slice(&DATA.to_be_bytes());
            pkt.extend_from_slice(&(next as u16).to_be_bytes());
            let mut filled = 0;
            pkt.resize(4 + n.block_size, 0);
            while filled < n.block_size {
                let r = src.reader.read(&mut pkt[4 + filled..])?;
                if r == 0 {
                    break;
                }
                filled += r;
            }
            pkt.truncate(4 + filled);
            eof = filled < n.block_size;
            sent_bytes += filled as u64;
            window.push_back(pkt);
            next += 1;
        }
        if window.is_empty() {
            return Ok(sent_bytes);
        }
        let mut tries = 0;
        let acked = loop {
            for p in &window {
                sock.send(p)?;
            }
            match wait_ack(sock, base, window.len() as u64, &mut buf)? {
                Some(k) => break k,
                None => {
                    tries += 1;
                    if tries >= MAX_TRIES {
                        return Err(TransferError::TimedOut(tries));
                    }
                }
            }
        };
        window.drain(..acked as usize);
        base += acked;
        if eof && window.is_empty() {
            return Ok(sent_bytes);
        }
    }
}

/// The address a transfer replies from: the listen address, never a wildcard-chosen one
/// (some PXE ROMs drop replies from an unexpected address).
pub fn transfer_socket(listen: SocketAddr, peer: SocketAddr) -> std::io::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddr::new(listen.ip(), 0))?;
    sock.connect(peer)?;
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

    #[test]
    fn negotiates_within_limits() {
        let limits = Limits {
            max_block_size: 1468,
            max_window_size: 8,
            default_timeout: Duration::from_secs(3),
        };
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
    }

    /// A whole transfer over loopback against a scripted client, with a lost ACK and a
    /// block-number wrap.
    #[test]
    fn windowed_transfer_with_retransmission_and_wrap() {
        let data: Vec<u8> = (0..(70_000u32 * 8 + 3)).map(|i| (i % 251) as u8).collect();
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        server.connect(client.local_addr().unwrap()).unwrap();
        client.connect(server.local_addr().unwrap()).unwrap();
        let n = Negotiated {
            block_size: 8,
            window_size: 4,
            timeout: Duration::from_millis(200),
            oack: vec![("blksize".into(), "8".into())],
        };
        let src_data = data.clone();
        let t = std::thread::spawn(move || {
            send(
                &server,
                Source {
                    reader: Box::new(std::io::Cursor::new(src_data)),
                    size: None,
                },
                &n,
            )
            .unwrap()
        });
        let mut buf = [0u8; 64];
        let m = client.recv(&mut buf).unwrap();
        assert_eq!(u16::from_be_bytes([buf[0], buf[1]]), OACK);
        assert_eq!(&buf[2..m], b"blksize\x008\x00");
        client.send(&[0, 4, 0, 0]).unwrap();
        let mut got = Vec::new();
        let mut expect: u16 = 1;
        let mut dropped_once = false;
        loop {
            let m = client.recv(&mut buf).unwrap();
            assert_eq!(u16::from_be_bytes([buf[0], buf[1]]), DATA);
            let num = u16::from_be_bytes([buf[2], buf[3]]);
            if num == expect {
                got.extend_from_slice(&buf[4..m]);
                expect = expect.wrapping_add(1);
            }
            let last = m - 4 < 8;
            // ACK the end of each window of 4 (again when it is resent), except once: that ACK
            // is "lost" and the server must resend the window.
            if num == expect.wrapping_sub(1) && (num % 4 == 0 || last) {
                if num == 400 && !dropped_once {
                    dropped_once = true;
                    continue;
                }
                client.send(&[0, 4, buf[2], buf[3]]).unwrap();
                if last {
                    break;
                }
            }
        }
        assert_eq!(t.join().unwrap(), data.len() as u64);
        assert_eq!(
            got, data,
            "every byte, in order, across the 16-bit block-number wrap"
        );
    }
}
