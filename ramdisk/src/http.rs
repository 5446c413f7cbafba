//! The agent's HTTP client: `ureq`, one request per connection, with the appliance's hosts
//! tried in turn when one cannot be reached. `http://` as before; `https://` only with the
//! TLS configuration the agent made from the appliance's pinned CA ([`crate::trust`]): a
//! client without one refuses `https://` rather than trust anything else. With an agent token
//! every request carries `Authorization: Bearer <token>`.

use std::time::Duration;

use ureq::tls::TlsConfig;

/// Responses larger than this are refused.
pub const MAX_RESPONSE: usize = 1 << 20;

/// Error texts longer than this are shortened on the console and in events.
const MAX_MESSAGE_CHARS: usize = 300;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `https://` (else `http://`).
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (`""` for `http://host:port`).
    pub base: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("{0:?}: only http:// and https:// URLs are supported")]
    Scheme(String),
    #[error("{0:?}: no host")]
    NoHost(String),
    #[error("{0:?}: bad port")]
    Port(String),
}

impl Url {
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        let (tls, rest) = match (s.strip_prefix("http://"), s.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(UrlError::Scheme(s.to_string())),
        };
        let default_port = if tls { 443 } else { 80 };
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
                None if after.is_empty() => default_port,
                None => return Err(UrlError::Port(s.to_string())),
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| UrlError::Port(s.to_string()))?,
                ),
                None => (hostport.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(UrlError::NoHost(s.to_string()));
        }
        Ok(Url {
            tls,
            host,
            port,
            base: path.trim_end_matches('/').to_string(),
        })
    }

    fn default_port(&self) -> u16 {
        if self.tls { 443 } else { 80 }
    }

    fn host_header(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == self.default_port() {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.host_header(), self.base)
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
        let t = paddock_wire::error_message(&self.body);
        if t.chars().count() > MAX_MESSAGE_CHARS {
            format!("{}…", t.chars().take(MAX_MESSAGE_CHARS).collect::<String>())
        } else {
            t
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: ureq::Error,
    },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: ureq::Error,
    },
    #[error("error talking to {addr}: {source}")]
    Exchange {
        addr: String,
        #[source]
        source: ureq::Error,
    },
}

impl HttpError {
    /// Sorts a `ureq` error: the host could not be found or reached (the next host is
    /// tried), or the exchange itself failed.
    fn from_ureq(url: &Url, source: ureq::Error) -> Self {
        use std::io::ErrorKind as K;
        use ureq::Timeout as T;
        let addr = format!("{}:{}", url.host, url.port);
        match &source {
            ureq::Error::HostNotFound | ureq::Error::Timeout(T::Resolve) => HttpError::Resolve {
                host: url.host.clone(),
                source,
            },
            ureq::Error::ConnectionFailed | ureq::Error::Timeout(T::Connect) => {
                HttpError::Connect { addr, source }
            }
            ureq::Error::Io(e)
                if matches!(
                    e.kind(),
                    K::ConnectionRefused
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                        | K::AddrNotAvailable
                ) =>
            {
                HttpError::Connect { addr, source }
            }
            _ => HttpError::Exchange { addr, source },
        }
    }

    /// Whether another host may answer where this one could not.
    fn unreachable(&self) -> bool {
        matches!(self, HttpError::Connect { .. } | HttpError::Resolve { .. })
    }
}

/// How requests reach the appliance; the agent uses [`Client`], tests a script.
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
pub struct Client {
    pub url: Url,
    pub others: Vec<Url>,
    agent: ureq::Agent,
    /// Made with a TLS configuration (else `https://` is refused).
    tls: bool,
    /// The agent token (`Authorization: Bearer …` on every request).
    token: Option<String>,
}

impl Client {
    /// A client for several appliance hosts, the first tried first (`None`: no host).
    /// `connect_timeout` bounds each connection attempt, `io_timeout` each read and write.
    pub fn with_hosts(
        urls: Vec<Url>,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Option<Self> {
        Self::with_tls(urls, connect_timeout, io_timeout, None)
    }

    /// As [`Client::with_hosts`], and `https://` verified with `tls` (the appliance's CA as
    /// the only root: `paddock_security::tls::ureq_tls`).
    pub fn with_tls(
        urls: Vec<Url>,
        connect_timeout: Duration,
        io_timeout: Duration,
        tls: Option<TlsConfig>,
    ) -> Option<Self> {
        let mut it = urls.into_iter();
        let url = it.next()?;
        let secured = tls.is_some();
        let agent = paddock_client::Builder::new()
            .tls(tls)
            // One request per connection: nothing stale after an appliance restart.
            .fresh_connections()
            .connect_timeout(connect_timeout)
            .io_timeout(io_timeout)
            .user_agent(concat!("paddock-agent/", env!("CARGO_PKG_VERSION")))
            .accept("application/json")
            .agent();
        Some(Self {
            url,
            others: it.collect(),
            agent,
            tls: secured,
            token: None,
        })
    }

    /// Sends `Authorization: Bearer <token>` with every request (`None`: no header).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    fn send_one(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, HttpError> {
        let err = |e| HttpError::from_ureq(&self.url, e);
        if self.url.tls && !self.tls {
            return Err(HttpError::Exchange {
                addr: format!("{}:{}", self.url.host, self.url.port),
                source: ureq::Error::Other(
                    "https:// needs the appliance's CA (paddock.ca_url, paddock.ca_fingerprint); \
                     refusing to trust any other"
                        .into(),
                ),
            });
        }
        let uri = format!("{}{path}", self.url);
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let res = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&uri);
                if let Some(b) = &bearer {
                    r = r.header("Authorization", b);
                }
                r.call()
            }
            (_, body) => {
                let mut r = self
                    .agent
                    .post(&uri)
                    .header("Content-Type", "application/json");
                if let Some(b) = &bearer {
                    r = r.header("Authorization", b);
                }
                r.send(body.unwrap_or_default())
            }
        };
        let mut res = res.map_err(err)?;
        let status = res.status().as_u16();
        let body = res
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE as u64)
            .read_to_vec()
            .map_err(err)?;
        Ok(Response { status, body })
    }
}

impl Transport for Client {
    fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, HttpError> {
        let mut last = self.send_one(method, path, body);
        for _ in 0..self.others.len() {
            if !last.as_ref().is_err_and(HttpError::unreachable) {
                break;
            }
            let next = self.others.remove(0);
            let old = std::mem::replace(&mut self.url, next);
            self.others.push(old);
            last = self.send_one(method, path, body);
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    #[test]
    fn urls() {
        let ok = [
            ("http://198.18.0.1:8080", ("198.18.0.1", 8080, "")),
            ("http://paddock.lab/", ("paddock.lab", 80, "")),
            ("http://p:81/prefix/", ("p", 81, "/prefix")),
            ("http://[fd00::1]:8080", ("fd00::1", 8080, "")),
            ("https://198.18.0.1:8443", ("198.18.0.1", 8443, "")),
            ("https://paddock.lab/api/", ("paddock.lab", 443, "/api")),
            ("https://[fd00::1]", ("fd00::1", 443, "")),
        ];
        for (s, (h, p, b)) in ok {
            let u = Url::parse(s).unwrap();
            assert_eq!((u.host.as_str(), u.port, u.base.as_str()), (h, p, b), "{s}");
            assert_eq!(u.tls, s.starts_with("https://"), "{s}");
        }
        for (s, shown) in [
            ("http://[fd00::1]:8080", "http://[fd00::1]:8080"),
            ("http://p:80/x", "http://p/x"),
            ("https://p:443", "https://p"),
            ("https://p:8443/x/", "https://p:8443/x"),
            ("https://p:80", "https://p:80"),
        ] {
            assert_eq!(Url::parse(s).unwrap().to_string(), shown, "{s}");
        }
        assert_eq!(
            Url::parse("ftp://p").unwrap_err(),
            UrlError::Scheme("ftp://p".into())
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

    /// A one-shot HTTP server on a free port: answers each connection with `reply` and
    /// sends back what it was asked (request line, headers, body).
    fn serve(replies: Vec<&'static [u8]>) -> (Url, std::sync::mpsc::Receiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for reply in replies {
                let (s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s);
                let mut head = String::new();
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                r.read_exact(&mut body).unwrap();
                head.push_str(&String::from_utf8_lossy(&body));
                r.get_mut().write_all(reply).unwrap();
                tx.send(head).unwrap();
            }
        });
        (
            Url::parse(&format!("http://127.0.0.1:{port}/pfx")).unwrap(),
            rx,
        )
    }

    /// A port nothing listens on.
    fn closed_port() -> Url {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        Url::parse(&format!("http://127.0.0.1:{port}")).unwrap()
    }

    fn client(urls: Vec<Url>) -> Client {
        Client::with_hosts(urls, Duration::from_secs(2), Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn requests_and_responses() {
        let (url, asked) = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"uuid\":\"u\"}\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n",
            b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
        ]);
        let mut c = client(vec![url]);
        let r = c.send("POST", "/v1/continue", Some(b"{}")).unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"{\"uuid\":\"u\"}\n"[..]));
        let head = asked.recv().unwrap();
        assert!(
            head.starts_with("POST /pfx/v1/continue HTTP/1.1\r\n"),
            "{head}"
        );
        let lower = head.to_ascii_lowercase();
        for h in [
            "content-type: application/json\r\n",
            "content-length: 2\r\n",
            "accept: application/json\r\n",
            "user-agent: paddock-agent/",
        ] {
            assert!(lower.contains(h), "{h}: {head}");
        }
        assert!(head.ends_with("\r\n\r\n{}"), "{head}");
        let r = c.send("GET", "/x", None).unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"Wikipedia"[..]));
        assert!(asked.recv().unwrap().starts_with("GET /pfx/x HTTP/1.1\r\n"));
        let r = c.send("GET", "/x", None).unwrap();
        assert_eq!((r.status, &r.body[..]), (503, &b"busy"[..]));
        assert_eq!(c.send("GET", "/x", None).unwrap().status, 204);
        assert_eq!(
            c.send("GET", "/x", None).unwrap().status,
            302,
            "not followed"
        );
    }

    #[test]
    fn an_unreachable_host_fails_over_to_the_next() {
        let (url, _asked) = serve(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]);
        let dead = closed_port();
        let mut c = client(vec![dead.clone(), url.clone()]);
        assert_eq!(c.send("GET", "/x", None).unwrap().status, 200);
        assert_eq!((c.url.clone(), c.others.clone()), (url, vec![dead.clone()]));
        // Alone, the dead host is an error naming it.
        let e = client(vec![dead.clone()])
            .send("GET", "/x", None)
            .unwrap_err();
        assert!(matches!(e, HttpError::Connect { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot connect to 127.0.0.1:{}: ", dead.port)),
            "{e}"
        );
    }

    #[test]
    fn a_response_over_the_limit_is_refused() {
        let big: &'static [u8] = Box::leak(
            [
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    MAX_RESPONSE + 1
                )
                .as_bytes(),
                &vec![b'x'; MAX_RESPONSE + 1],
            ]
            .concat()
            .into_boxed_slice(),
        );
        let (url, _asked) = serve(vec![big]);
        let e = client(vec![url]).send("GET", "/x", None).unwrap_err();
        assert!(matches!(e, HttpError::Exchange { .. }), "{e:?}");
    }

    /// A one-shot HTTPS server on a free port with a certificate `ca` issued for 127.0.0.1:
    /// answers `204` and sends back the request's head; a failed handshake sends its error.
    fn serve_tls(
        ca: &paddock_security::ca::Ca,
        server: &paddock_security::ca::Issued,
    ) -> (Url, std::sync::mpsc::Receiver<Result<String, String>>) {
        use paddock_security::tls::{ClientAuth, Material, server_config};
        let config = server_config(
            &Material {
                ca_pem: ca.cert_pem.clone(),
                cert_pem: server.cert_pem.clone(),
                key_pem: server.key_pem.clone(),
            },
            ClientAuth::Optional,
        )
        .unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (tcp, _) = l.accept().unwrap();
            let conn = rustls::ServerConnection::new(config).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match tls.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    Ok(_) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                }
            }
            let _ = tls.write_all(b"HTTP/1.1 204 No Content\r\n\r\n");
            let _ = tls.flush();
            tls.conn.send_close_notify();
            let _ = tls.flush();
            let _ = tx.send(Ok(String::from_utf8_lossy(&head).into_owned()));
        });
        (
            Url::parse(&format!("https://127.0.0.1:{port}/pfx")).unwrap(),
            rx,
        )
    }

    #[test]
    fn https_with_the_pinned_ca_and_the_token() {
        let (ca, server) = crate::trust::tests::authority(&["127.0.0.1"]);
        let (url, asked) = serve_tls(&ca, &server);
        let tls = crate::trust::tls_config("test", &ca.cert_pem).unwrap();
        let mut c = Client::with_tls(
            vec![url],
            Duration::from_secs(2),
            Duration::from_secs(5),
            Some(tls),
        )
        .unwrap()
        .with_token(Some("pa1.abc".into()));
        assert_eq!(
            c.send("POST", "/v1/continue", Some(b"{}")).unwrap().status,
            204
        );
        let head = asked.recv().unwrap().unwrap();
        assert!(
            head.starts_with("POST /pfx/v1/continue HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("\r\nauthorization: bearer pa1.abc\r\n"),
            "{head}"
        );

        // A server whose certificate another CA issued is refused at the handshake.
        let refused = |url: Url, trusted_pem: &str| {
            let tls = crate::trust::tls_config("test", trusted_pem).unwrap();
            let e = Client::with_tls(
                vec![url],
                Duration::from_secs(2),
                Duration::from_secs(5),
                Some(tls),
            )
            .unwrap()
            .send("POST", "/v1/continue", Some(b"{}"))
            .unwrap_err();
            assert!(matches!(e, HttpError::Exchange { .. }), "{e:?}");
        };
        let (other, _) = crate::trust::tests::authority(&[]);
        let (url, asked) = serve_tls(&ca, &server);
        refused(url, &other.cert_pem);
        assert!(asked.recv().unwrap().is_err());

        // A machine's subd certificate (from the subd CA, for this very address) is no
        // appliance's: the agent, trusting the appliance's CA alone, refuses it.
        let now = time::OffsetDateTime::now_utc();
        let subd_ca = paddock_security::ca::new_subd_ca("paddock-subd-ca", now, 1, &[]).unwrap();
        let subd = paddock_security::ca::issue(
            &subd_ca,
            &paddock_security::ca::Request {
                name: "web-1".into(),
                methods: vec!["Subd.Poll".into()],
                sans: vec!["127.0.0.1".into()],
                days: 1,
                ..Default::default()
            },
            now,
        )
        .unwrap();
        let (url, asked) = serve_tls(&ca, &subd);
        refused(url, &ca.cert_pem);
        assert!(asked.recv().unwrap().is_err(), "the inventory went out");

        // Without the CA, https:// is refused before connecting.
        let e = client(vec![Url::parse("https://127.0.0.1:1").unwrap()])
            .send("GET", "/x", None)
            .unwrap_err();
        assert!(e.to_string().contains("needs the appliance's CA"), "{e}");
    }

    #[test]
    fn plain_http_carries_the_token_only_when_given() {
        let reply: &'static [u8] = b"HTTP/1.1 204 No Content\r\n\r\n";
        let (url, asked) = serve(vec![reply, reply]);
        let mut c = client(vec![url.clone()]);
        c.send("GET", "/x", None).unwrap();
        assert!(
            !asked
                .recv()
                .unwrap()
                .to_ascii_lowercase()
                .contains("authorization")
        );
        let mut c = client(vec![url]).with_token(Some("pa1.t".into()));
        c.send("GET", "/x", None).unwrap();
        assert!(
            asked
                .recv()
                .unwrap()
                .to_ascii_lowercase()
                .contains("authorization: bearer pa1.t\r\n")
        );
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
        let r = Response {
            status: 502,
            body: vec![b'y'; 400],
        };
        assert_eq!(r.error_message().chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}
