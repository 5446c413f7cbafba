//! A connection's two clocks between requests: how long it may wait for its next request
//! (`idle_timeout`: a kept-alive connection a client comes back to) and how long a request's
//! headers may take once their first byte came (`header_read_timeout`: a slow client holding
//! a connection). hyper has one timer for both, so a client calling less often than the
//! header timeout would pay a new connection (and a TLS handshake) per call; this core keeps
//! them apart, with time passed in, and [`crate::tls`] runs it.

use std::time::Duration;

use tokio::time::Instant;

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the next request since then.
    Idle(Instant),
    /// Reading a request's head since then (accept, for the first request: the handshake
    /// counts too).
    Head(Instant),
    /// Requests being answered (their responses not yet all sent).
    Busy(usize),
}

/// Which clock ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No request came within the idle timeout: close it, nothing is lost.
    Idle,
    /// A request's head did not arrive within the header timeout.
    Head,
}

#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    phase: Phase,
    header: Duration,
    idle: Duration,
}

impl Keepalive {
    /// A connection accepted at `accepted`: its first request's head is due within `header`.
    pub fn new(accepted: Instant, header: Duration, idle: Duration) -> Keepalive {
        Keepalive {
            phase: Phase::Head(accepted),
            header,
            idle,
        }
    }

    /// Bytes arrived from the client at `now`. Returns whether the deadline moved.
    pub fn bytes_read(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::Idle(_) => {
                self.phase = Phase::Head(now);
                true
            }
            Phase::Head(_) | Phase::Busy(_) => false,
        }
    }

    /// A request's head was read.
    pub fn request(&mut self) {
        self.phase = match self.phase {
            Phase::Busy(n) => Phase::Busy(n.saturating_add(1)),
            Phase::Idle(_) | Phase::Head(_) => Phase::Busy(1),
        };
    }

    /// A response was sent (or abandoned) at `now`. Returns whether the deadline moved.
    pub fn response_done(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::Busy(n) if n > 1 => {
                self.phase = Phase::Busy(n - 1);
                false
            }
            Phase::Busy(_) => {
                self.phase = Phase::Idle(now);
                true
            }
            Phase::Idle(_) | Phase::Head(_) => false,
        }
    }

    /// When a clock runs out, if one runs (none while requests are answered).
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Idle(since) => Some(since + self.idle),
            Phase::Head(since) => Some(since + self.header),
            Phase::Busy(_) => None,
        }
    }

    /// Which clock has run out at `now`, if any.
    pub fn expired(&self, now: Instant) -> Option<Expiry> {
        let due = self.deadline()?;
        (now >= due).then_some(match self.phase {
            Phase::Idle(_) => Expiry::Idle,
            _ => Expiry::Head,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(90);
    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_request_is_due_within_the_header_timeout_of_accept() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(t0, HEADER, IDLE);
        // Bytes of the first head move nothing: the clock started at accept.
        assert!(!k.bytes_read(t0 + 5 * S));
        assert_eq!(k.deadline(), Some(t0 + HEADER));
        assert_eq!(k.expired(t0 + 9 * S), None);
        assert_eq!(k.expired(t0 + 10 * S), Some(Expiry::Head));
    }

    #[test]
    fn a_kept_alive_connection_waits_for_the_idle_timeout_not_the_header_timeout() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(t0, HEADER, IDLE);
        k.request();
        assert_eq!(k.deadline(), None, "no clock while a request is answered");
        assert_eq!(k.expired(t0 + 3600 * S), None);
        assert!(k.response_done(t0 + S));
        // A poll every 30 s keeps its connection.
        assert_eq!(k.expired(t0 + 31 * S), None);
        assert_eq!(k.deadline(), Some(t0 + S + IDLE));
        assert_eq!(k.expired(t0 + S + IDLE), Some(Expiry::Idle));
    }

    #[test]
    fn the_next_requests_head_gets_the_header_timeout_from_its_first_byte() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(t0, HEADER, IDLE);
        k.request();
        k.response_done(t0 + S);
        assert!(k.bytes_read(t0 + 40 * S));
        assert!(
            !k.bytes_read(t0 + 41 * S),
            "later bytes of the same head move nothing"
        );
        assert_eq!(k.deadline(), Some(t0 + 50 * S));
        assert_eq!(k.expired(t0 + 50 * S), Some(Expiry::Head));
        k.request();
        assert_eq!(k.expired(t0 + 60 * S), None);
    }

    #[test]
    fn pipelined_requests_keep_the_connection_busy_until_the_last_answer() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(t0, HEADER, IDLE);
        k.request();
        k.request();
        assert!(!k.response_done(t0 + S));
        assert_eq!(k.deadline(), None);
        assert!(k.response_done(t0 + 2 * S));
        assert_eq!(k.deadline(), Some(t0 + 2 * S + IDLE));
        // A stray completion changes nothing.
        assert!(!k.response_done(t0 + 3 * S));
        assert_eq!(k.deadline(), Some(t0 + 2 * S + IDLE));
    }
}
