//! A tiny HTTP/1.1 client over `std::net::TcpStream`: one request per connection
//! (`Connection: close`), `Content-Length` or chunked responses, plain `http://` only (the
//! ramdisk carries no TLS).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Responses larger than this are refused.
pub const MAX_RESPONSE: usize = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (`""` for `http://host:port`).
    pub base: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("{0:?}: only http:// URLs are supported (the ramdisk has no TLS)")]
    Scheme(String),
    #[error("{0:?}: no host")]
    NoHost(String),
    #[error("{0:?}: bad port")]
    Port(String),
}

impl Url {
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| UrlError::Scheme(s.to_string()))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            // [v6]:port
            let (h, after) = h
                .split_once(']')
                .ok_or_else(|| UrlError::NoHost(s.to_string()))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| UrlError::Port(s.to_string()))?,
                None if after.is_empty() => 80,
                None => return Err(UrlError::Port(s.to_string())),
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| UrlError::Port(s.to_string()))?,
                ),
                None => (hostport.to_string(), 80),
            }
        };
        if host.is_empty() {
            return Err(UrlError::NoHost(s.to_string()));
        }
        Ok(Url {
            host,
            port,
            base: path.trim_end_matches('/').to_string(),
        })
    }

    fn host_header(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.host_header(), self.base)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    /// The message of an error body (`{"error": {"message": …}}`, Inspector's shape), else the
    /// body as text, shortened.
    pub fn error_message(&self) -> String {
        let parsed: Option<String> = serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("error")?.get("message")?.as_str().map(str::to_string));
        parsed.unwrap_or_else(|| {
            let t = String::from_utf8_lossy(&self.body).trim().to_string();
            if t.chars().count() > 300 {
                format!("{}…", t.chars().take(300).collect::<String>())
            } else {
                t
            }
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("i/o error talking to {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bad HTTP response: {0}")]
    Protocol(String),
}

/// The request bytes.
pub fn encode_request(url: &Url, method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut r = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: paddock-agent/{}\r\nAccept: application/json\r\nConnection: close\r\n",
        url.base,
        url.host_header(),
        env!("CARGO_PKG_VERSION")
    );
    if let Some(b) = body {
        r.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    r.push_str("\r\n");
    let mut bytes = r.into_bytes();
    if let Some(b) = body {
        bytes.extend_from_slice(b);
    }
    bytes
}

/// Parses a whole response (the connection was closed by the server or the length was reached).
pub fn parse_response(raw: &[u8]) -> Result<Response, HttpError> {
    let p = |m: &str| HttpError::Protocol(m.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| p("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| p("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(p(&format!("status line {status_line:?}")));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..600).contains(s))
        .ok_or_else(|| p(&format!("status line {status_line:?}")))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "content-length" {
            length = Some(v.parse::<usize>().map_err(|_| p("bad Content-Length"))?);
        } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or_else(|| p(&format!("body shorter than Content-Length {n}")))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, HttpError> {
    let p = |m: &str| HttpError::Protocol(m.to_string());
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| p("truncated chunk size"))?;
        let size_s = std::str::from_utf8(&b[..eol]).map_err(|_| p("bad chunk size"))?;
        let size_s = size_s.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_s, 16).map_err(|_| p("bad chunk size"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(b.get(..size).ok_or_else(|| p("truncated chunk"))?);
        b = b.get(size + 2..).ok_or_else(|| p("truncated chunk"))?;
        if out.len() > MAX_RESPONSE {
            return Err(p("response too large"));
        }
    }
}

/// Sends one request over any stream and reads the whole response.
pub fn exchange<S: Read + Write>(
    stream: &mut S,
    request: &[u8],
    addr: &str,
) -> Result<Response, HttpError> {
    let io = |source| HttpError::Io {
        addr: addr.to_string(),
        source,
    };
    stream.write_all(request).map_err(io)?;
    stream.flush().map_err(io)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > MAX_RESPONSE + 16384 {
            return Err(HttpError::Protocol("response too large".into()));
        }
        // Stop early once a Content-Length body is complete (some servers linger).
        if let Ok(r) = parse_response(&raw)
            && has_complete_length(&raw, r.body.len())
        {
            return Ok(r);
        }
    }
    parse_response(&raw)
}

fn has_complete_length(raw: &[u8], body_len: usize) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    head.lines().any(|l| {
        l.strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
            == Some(body_len)
    })
}

/// How requests reach the appliance; the agent uses [`TcpClient`], tests a script.
pub trait Transport {
    fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, HttpError>;
}

/// A client of the appliance. With several appliance hosts (`paddock.url=A,B,C`) a host
/// that cannot be reached is skipped: the request goes to the next, which then stays
/// current. HTTP-level answers (5xx, 409) are not failed over; the caller retries them.
pub struct TcpClient {
    pub url: Url,
    pub others: Vec<Url>,
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
}

impl TcpClient {
    pub fn new(url: Url, connect_timeout: Duration, io_timeout: Duration) -> Self {
        Self {
            url,
            others: Vec::new(),
            connect_timeout,
            io_timeout,
        }
    }

    /// A client for several appliance hosts, the first tried first.
    pub fn with_hosts(
        urls: Vec<Url>,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Option<Self> {
        let mut it = urls.into_iter();
        let url = it.next()?;
        Some(Self {
            url,
            others: it.collect(),
            connect_timeout,
            io_timeout,
        })
    }
}

impl Transport for TcpClient {
    fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, HttpError> {
        let mut last = self.send_one(method, path, body);
        for _ in 0..self.others.len() {
            match &last {
                Err(HttpError::Connect { .. } | HttpError::Resolve { .. }) => {
                    let next = self.others.remove(0);
                    let old = std::mem::replace(&mut self.url, next);
                    self.others.push(old);
                    last = self.send_one(method, path, body);
                }
                _ => break,
            }
        }
        last
    }
}

impl TcpClient {
    fn send_one(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, HttpError> {
        let target = (self.url.host.as_str(), self.url.port);
        let addrs: Vec<_> = target
            .to_socket_addrs()
            .map_err(|source| HttpError::Resolve {
                host: self.url.host.clone(),
                source,
            })?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, self.connect_timeout) {
                Ok(mut s) => {
                    let io = |source| HttpError::Io {
                        addr: a.to_string(),
                        source,
                    };
                    s.set_read_timeout(Some(self.io_timeout)).map_err(io)?;
                    s.set_write_timeout(Some(self.io_timeout)).map_err(io)?;
                    let req = encode_request(&self.url, method, path, body);
                    return exchange(&mut s, &req, &a.to_string());
                }
                Err(e) => {
                    last = Some(HttpError::Connect {
                        addr: a.to_string(),
                        source: e,
                    })
                }
            }
        }
        Err(last.unwrap_or_else(|| HttpError::Resolve {
            host: self.url.host.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no addresses"),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let ok = [
            ("http://198.18.0.1:8080", ("198.18.0.1", 8080, "")),
            ("http://paddock.lab/", ("paddock.lab", 80, "")),
            ("http://p:81/prefix/", ("p", 81, "/prefix")),
            ("http://[fd00::1]:8080", ("fd00::1", 8080, "")),
        ];
        for (s, (h, p, b)) in ok {
            let u = Url::parse(s).unwrap();
            assert_eq!((u.host.as_str(), u.port, u.base.as_str()), (h, p, b), "{s}");
        }
        assert_eq!(
            Url::parse("http://[fd00::1]:8080").unwrap().to_string(),
            "http://[fd00::1]:8080"
        );
        assert_eq!(
            Url::parse("https://p").unwrap_err(),
            UrlError::Scheme("https://p".into())
        );
        assert_eq!(
            Url::parse("http://:80").unwrap_err(),
            UrlError::NoHost("http://:80".into())
        );
        assert_eq!(
            Url::parse("http://p:x").unwrap_err(),
            UrlError::Port("http://p:x".into())
        );
    }

    #[test]
    fn request_bytes() {
        let u = Url::parse("http://198.18.0.1:8080/pfx").unwrap();
        let r = String::from_utf8(encode_request(&u, "POST", "/v1/continue", Some(b"{}"))).unwrap();
        assert!(
            r.starts_with("POST /pfx/v1/continue HTTP/1.1\r\nHost: 198.18.0.1:8080\r\n"),
            "{r}"
        );
        assert!(
            r.contains("Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"),
            "{r}"
        );
        assert!(r.contains("Connection: close\r\n"));
        let g = String::from_utf8(encode_request(&u, "GET", "/x", None)).unwrap();
        assert!(!g.contains("Content-Length") && g.ends_with("\r\n\r\n"));
    }

    #[test]
    fn responses_table() {
        type Case<'a> = (&'a [u8], Result<(u16, &'a [u8]), &'a str>);
        let cases: &[Case] = &[
            (b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"uuid\":\"u\"}\n", Ok((200, b"{\"uuid\":\"u\"}\n"))),
            (b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy", Ok((503, b"busy"))),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n", Ok((200, b"Wikipedia"))),
            (b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", Ok((204, b""))),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", Err("shorter than Content-Length")),
            (b"SSH-2.0-OpenSSH\r\n\r\n", Err("status line")),
            (b"HTTP/1.1 200 OK\r\n", Err("no end of headers")),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", Err("bad chunk size")),
        ];
        for (raw, want) in cases {
            let got = parse_response(raw);
            match (got, want) {
                (Ok(r), Ok((s, b))) => assert_eq!((r.status, &r.body[..]), (*s, *b)),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} vs {w}"),
                (g, w) => panic!("{:?}: got {g:?}, want {w:?}", String::from_utf8_lossy(raw)),
            }
        }
    }

    /// A fake stream: records what is written, returns `reply` in small pieces.
    struct Fake {
        written: Vec<u8>,
        reply: Vec<u8>,
        pos: usize,
    }
    impl Read for Fake {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(7).min(self.reply.len() - self.pos);
            buf[..n].copy_from_slice(&self.reply[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }
    impl Write for Fake {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.written.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn exchange_over_a_stream() {
        let mut f = Fake {
            written: Vec::new(),
            reply: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}trailing junk".to_vec(),
            pos: 0,
        };
        let r = exchange(&mut f, b"GET / HTTP/1.1\r\n\r\n", "a").unwrap();
        assert_eq!((r.status, r.body), (200, b"{}".to_vec()));
        assert_eq!(f.written, b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn error_messages() {
        let r = Response {
            status: 400,
            body: br#"{"error": {"message": "Look up error: Could not find a node"}}"#.to_vec(),
        };
        assert_eq!(r.error_message(), "Look up error: Could not find a node");
        let r = Response {
            status: 500,
            body: b"  oops \n".to_vec(),
        };
        assert_eq!(r.error_message(), "oops");
    }
}
