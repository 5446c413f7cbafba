//! The agent's HTTP client: `ureq` (plain `http://` only: the ramdisk carries no TLS), one
//! request per connection, with the appliance's hosts tried in turn when one cannot be
//! reached.

use std::time::Duration;

/// Responses larger than this are refused.
pub const MAX_RESPONSE: usize = 1 << 20;

/// Error texts longer than this are shortened on the console and in events.
const MAX_MESSAGE_CHARS: usize = 300;

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
}

impl Client {
    /// A client for several appliance hosts, the first tried first (`None`: no host).
    /// `connect_timeout` bounds each connection attempt, `io_timeout` each read and write.
    pub fn with_hosts(
        urls: Vec<Url>,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Option<Self> {
        let mut it = urls.into_iter();
        let url = it.next()?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            // One request per connection, as before: nothing stale after an appliance restart.
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .timeout_connect(Some(connect_timeout))
            .timeout_per_read(Some(io_timeout))
            .timeout_per_write(Some(io_timeout))
            .user_agent(concat!("paddock-agent/", env!("CARGO_PKG_VERSION")))
            .accept("application/json")
            .build()
            .new_agent();
        Some(Self {
            url,
            others: it.collect(),
            agent,
        })
    }

    fn send_one(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, HttpError> {
        let err = |e| HttpError::from_ureq(&self.url, e);
        let uri = format!("{}{path}", self.url);
        let res = match (method, body) {
            ("GET", _) => self.agent.get(&uri).call(),
            (_, body) => self
                .agent
                .post(&uri)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or_default()),
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
