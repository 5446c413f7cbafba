//! The one HTTP client of Paddock's own APIs.
//!
//! [`Builder`] makes the `ureq` agent every caller of our APIs uses (the CLI, the ramdisk's
//! agent, subd's object fetch, image replication, the tests): the CA as the only root, a
//! client certificate or a bearer token, timeouts, error statuses as answers rather than
//! transport errors. [`Client`] adds typed calls: a JSON answer read as the API's own type,
//! an error answer as its `{"error": {"message"}}` envelope, every answer read up to a size
//! bound.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use ureq;

/// The largest answer a typed call reads (a list of 10,000 nodes is a few MiB).
pub const MAX_ANSWER: u64 = 64 << 20;

/// How an agent is built. Defaults: no TLS roots of our own (plain HTTP, or the system's
/// roots), no credential, a 10 s connect timeout, no overall timeout.
#[derive(Clone, Default)]
pub struct Builder {
    tls: Option<ureq::tls::TlsConfig>,
    token: Option<String>,
    connect: Option<Duration>,
    global: Option<Duration>,
    io: Option<Duration>,
    fresh_connections: bool,
    user_agent: Option<&'static str>,
    accept: Option<&'static str>,
}

impl Builder {
    pub fn new() -> Self {
        Builder::default()
    }

    /// TLS as `paddock_security::tls::ureq_tls` makes it: the appliance's CA as the only
    /// root, and our certificate when we have one.
    pub fn tls(mut self, tls: Option<ureq::tls::TlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// `Authorization: Bearer <token>` on every request.
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect = Some(d);
        self
    }

    /// The whole of one call, answer included.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.global = Some(d);
        self
    }

    /// Each read and each write.
    pub fn io_timeout(mut self, d: Duration) -> Self {
        self.io = Some(d);
        self
    }

    /// One request per connection: nothing stale is reused after a server restarts.
    pub fn fresh_connections(mut self) -> Self {
        self.fresh_connections = true;
        self
    }

    /// `User-Agent` (default: ureq's).
    pub fn user_agent(mut self, ua: &'static str) -> Self {
        self.user_agent = Some(ua);
        self
    }

    /// `Accept` (default: `*/*`).
    pub fn accept(mut self, accept: &'static str) -> Self {
        self.accept = Some(accept);
        self
    }

    pub fn agent(self) -> ureq::Agent {
        let mut b = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(self.connect.unwrap_or(Duration::from_secs(10))))
            .timeout_global(self.global)
            .timeout_per_read(self.io)
            .timeout_per_write(self.io);
        if self.fresh_connections {
            b = b.max_idle_connections(0).max_idle_connections_per_host(0);
        }
        if let Some(ua) = self.user_agent {
            b = b.user_agent(ua);
        }
        if let Some(a) = self.accept {
            b = b.accept(a);
        }
        if let Some(tls) = self.tls {
            b = b.tls_config(tls);
        }
        if let Some(token) = self.token {
            b = b.middleware(
                move |mut req: ureq::http::Request<ureq::SendBody>,
                      next: ureq::middleware::MiddlewareNext| {
                    if let Ok(v) = format!("Bearer {token}").parse() {
                        req.headers_mut()
                            .insert(ureq::http::header::AUTHORIZATION, v);
                    }
                    next.handle(req)
                },
            );
        }
        b.build().into()
    }

    /// A typed client of the API at `base` (`https://host:8443`).
    pub fn client(self, base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            agent: self.agent(),
            max_answer: MAX_ANSWER,
        }
    }
}

/// Why a call to one of our APIs failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach the appliance at {api} (set --api or PADDOCK_API)")]
    Unreachable {
        api: String,
        #[source]
        source: ureq::Error,
    },
    /// The API answered with an error status.
    #[error("{method} {path}: {status}: {message}")]
    Api {
        method: &'static str,
        path: String,
        status: u16,
        message: String,
    },
    #[error("{method} {path}: reading the answer: {source}")]
    Read {
        method: &'static str,
        path: String,
        #[source]
        source: ureq::Error,
    },
    #[error("{method} {path}: the answer is not what was expected: {source}")]
    Decode {
        method: &'static str,
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl CallError {
    /// The status of an error answer (none when there was no answer).
    pub fn status(&self) -> Option<u16> {
        match self {
            CallError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A typed client of one API base URL.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    max_answer: u64,
}

impl Client {
    /// The same agent (credentials, timeouts) for the API at another base URL.
    pub fn at(&self, base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            ..self.clone()
        }
    }

    /// Answers larger than `bytes` are refused (a read error), not held in memory.
    pub fn with_max_answer(mut self, bytes: u64) -> Self {
        self.max_answer = bytes;
        self
    }

    /// A call: `method` (`GET`, `POST`, `PATCH`, `DELETE`) and `path` (`/v1/rules`).
    pub fn call(&self, method: &'static str, path: impl Into<String>) -> Call<'_> {
        Call {
            client: self,
            method,
            path: path.into(),
            query: Vec::new(),
        }
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.call("GET", path).send()
    }

    pub fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, CallError> {
        self.call("POST", path).send_json(body)
    }
}

/// One request; the answer is read as `T`.
pub struct Call<'a> {
    client: &'a Client,
    method: &'static str,
    path: String,
    query: Vec<(String, String)>,
}

impl Call<'_> {
    pub fn query(mut self, key: &str, value: &str) -> Self {
        self.query.push((key.to_string(), value.to_string()));
        self
    }

    pub fn url(&self) -> String {
        format!("{}{}", self.client.base, self.path)
    }

    fn unreachable(&self, source: ureq::Error) -> CallError {
        CallError::Unreachable {
            api: self.client.base.clone(),
            source,
        }
    }

    /// Sends no body.
    pub fn send<T: DeserializeOwned>(self) -> Result<T, CallError> {
        let (agent, url, q) = (&self.client.agent, self.url(), self.query.clone());
        let resp = match self.method {
            "POST" => agent.post(&url).query_pairs(q).send_empty(),
            "DELETE" => agent.delete(&url).query_pairs(q).call(),
            _ => agent.get(&url).query_pairs(q).call(),
        }
        .map_err(|e| self.unreachable(e))?;
        self.answer(resp)
    }

    /// Sends a JSON body (`POST`, `PATCH` or `PUT`).
    pub fn send_json<T: DeserializeOwned>(self, body: &impl Serialize) -> Result<T, CallError> {
        let (agent, url, q) = (&self.client.agent, self.url(), self.query.clone());
        let resp = match self.method {
            "PATCH" => agent.patch(&url).query_pairs(q).send_json(body),
            "PUT" => agent.put(&url).query_pairs(q).send_json(body),
            _ => agent.post(&url).query_pairs(q).send_json(body),
        }
        .map_err(|e| self.unreachable(e))?;
        self.answer(resp)
    }

    /// `POST`s a stream (an image upload).
    pub fn send_reader<T: DeserializeOwned>(
        self,
        content_type: &str,
        body: &mut dyn std::io::Read,
    ) -> Result<T, CallError> {
        let resp = self
            .client
            .agent
            .post(self.url())
            .query_pairs(self.query.clone())
            .header("content-type", content_type)
            .send(ureq::SendBody::from_reader(body))
            .map_err(|e| self.unreachable(e))?;
        self.answer(resp)
    }

    /// An error status becomes [`CallError::Api`] with the envelope's message; anything else
    /// is read as `T` (an empty body as JSON `null`).
    fn answer<T: DeserializeOwned>(
        self,
        resp: ureq::http::Response<ureq::Body>,
    ) -> Result<T, CallError> {
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .with_config()
            .limit(self.client.max_answer)
            .read_to_vec()
            .map_err(|source| CallError::Read {
                method: self.method,
                path: self.path.clone(),
                source,
            })?;
        if status >= 400 {
            return Err(CallError::Api {
                method: self.method,
                path: self.path,
                status,
                message: paddock_wire::error_message(&body),
            });
        }
        let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
            b"null"
        } else {
            &body
        };
        serde_json::from_slice(body).map_err(|source| CallError::Decode {
            method: self.method,
            path: self.path,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    /// A one-shot HTTP server on 127.0.0.1: answers each connection with `answer` and
    /// hands back the request head it read.
    fn serve(answers: Vec<String>) -> (String, std::thread::JoinHandle<Vec<String>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        let h = std::thread::spawn(move || {
            let mut heads = Vec::new();
            for answer in answers {
                let (mut s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    head.push_str(&line);
                }
                heads.push(head);
                s.write_all(answer.as_bytes()).unwrap();
            }
            heads
        });
        (base, h)
    }

    fn answer(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[test]
    fn a_typed_call_reads_the_answer_and_sends_the_token() {
        let (base, server) = serve(vec![answer("200 OK", r#"{"n": 3}"#)]);
        #[derive(serde::Deserialize)]
        struct N {
            n: u32,
        }
        let c = Builder::new().token(Some("t0k".into())).client(&base);
        let n: N = c.call("GET", "/x").query("a", "b c").send().unwrap();
        assert_eq!(n.n, 3);
        let head = &server.join().unwrap()[0];
        assert!(head.starts_with("GET /x?a=b%20c HTTP/1.1"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("authorization: bearer t0k"),
            "{head}"
        );
    }

    #[test]
    fn an_error_answer_is_its_envelope_message() {
        let (base, server) = serve(vec![answer(
            "404 Not Found",
            r#"{"error": {"message": "no node x"}}"#,
        )]);
        let e = Builder::new()
            .client(&base)
            .get::<serde_json::Value>("/v1/nodes/x")
            .unwrap_err();
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.to_string(), "GET /v1/nodes/x: 404: no node x");
        server.join().unwrap();
    }

    #[test]
    fn an_answer_past_the_bound_is_refused() {
        let big = format!("[{}0]", "0,".repeat(600));
        let (base, server) = serve(vec![answer("200 OK", &big)]);
        let e = Builder::new()
            .client(&base)
            .with_max_answer(1_000)
            .get::<Vec<u32>>("/big")
            .unwrap_err();
        assert!(matches!(e, CallError::Read { .. }), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn an_empty_answer_is_null() {
        let (base, server) = serve(vec![answer("204 No Content", "")]);
        let v: Option<u32> = Builder::new()
            .client(&base)
            .call("POST", "/x")
            .send()
            .unwrap();
        assert_eq!(v, None);
        server.join().unwrap();
    }

    #[test]
    fn nobody_listening_is_unreachable() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        let e = Builder::new()
            .connect_timeout(Duration::from_secs(2))
            .client(&base)
            .get::<serde_json::Value>("/")
            .unwrap_err();
        assert!(matches!(e, CallError::Unreachable { .. }), "{e}");
    }
}
