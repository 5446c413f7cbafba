//! What one client may hold of a listener, authenticated or not: connections per listener
//! and per source address, time from accept to the end of a request's headers, and a
//! minimum rate for request bodies. The accept loop in [`crate::tls`] applies them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// Limits on every connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections at once on the listener; more are closed at accept.
    pub max_connections: usize,
    /// Connections at once from one source address (0: no cap), so that one host holding
    /// its share leaves the rest to the others.
    pub max_per_source: usize,
    /// Time for a TLS handshake.
    pub handshake_timeout: Duration,
    /// Time from accept to the end of the first request's headers (a silent connection is
    /// closed then), and from the first byte of each later request to the end of its headers.
    pub header_read_timeout: Duration,
    /// Time a kept-alive connection waits for its next request before it is closed: longer
    /// than our clients keep an idle connection (90 s), so that they close it first.
    pub idle_timeout: Duration,
    /// Bytes per second a request body must keep up, counted over the time spent waiting
    /// for the client (not while the handler is busy), after `header_read_timeout` of
    /// grace; 0: no minimum.
    pub min_body_rate: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_per_source: 128,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            min_body_rate: 1024,
        }
    }
}

/// Connections held per source address.
#[derive(Debug, Default)]
pub struct SourceSlots {
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in [`SourceSlots`]; given back when dropped.
#[derive(Debug)]
pub struct SourceSlot {
    slots: Arc<SourceSlots>,
    ip: IpAddr,
}

impl SourceSlots {
    /// A slot for `ip`, unless it holds `max` already (`max` 0: always).
    pub fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<SourceSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(ip).or_insert(0);
        if max != 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            slots: self.clone(),
            ip,
        })
    }

    /// Connections `ip` holds now.
    pub fn held(&self, ip: IpAddr) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// The error a body too slow to keep up ends with.
#[derive(Debug, thiserror::Error)]
#[error("request body slower than {0} bytes/s: cut")]
pub struct TooSlow(pub u64);

/// The allowance for waiting on the client: `grace` plus one second per `rate` bytes
/// received, less the time already waited. Pure, for the table test.
pub fn wait_allowed(grace: Duration, rate: u64, received: u64, waited: Duration) -> Duration {
    if rate == 0 {
        return Duration::MAX;
    }
    let earned = Duration::from_secs_f64(received as f64 / rate as f64);
    grace.saturating_add(earned).saturating_sub(waited)
}

/// A request body that must arrive at a minimum rate. Only time spent waiting for the
/// client counts: a handler that reads slowly (hashing, writing to disk) slows no one down.
pub struct MinRate<B> {
    inner: B,
    rate: u64,
    grace: Duration,
    received: u64,
    waited: Duration,
    /// Since when we are waiting, and until when we may.
    waiting: Option<(Instant, Pin<Box<Sleep>>)>,
}

impl<B> MinRate<B> {
    pub fn new(inner: B, rate: u64, grace: Duration) -> Self {
        MinRate {
            inner,
            rate,
            grace,
            received: 0,
            waited: Duration::ZERO,
            waiting: None,
        }
    }
}

impl<B> Body for MinRate<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some((since, _)) = this.waiting.take() {
                    this.waited += since.elapsed();
                }
                if let Some(Ok(f)) = &frame
                    && let Some(d) = f.data_ref()
                {
                    this.received += d.len() as u64;
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending if this.rate == 0 => Poll::Pending,
            Poll::Pending => {
                let (rate, grace, received, waited) =
                    (this.rate, this.grace, this.received, this.waited);
                let (_, sleep) = this.waiting.get_or_insert_with(|| {
                    let allowed = wait_allowed(grace, rate, received, waited);
                    let now = Instant::now();
                    let until = now.checked_add(allowed).unwrap_or(now + grace);
                    (now, Box::pin(tokio::time::sleep_until(until)))
                });
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(TooSlow(rate).into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_holds_its_share_and_gives_it_back() {
        let slots = Arc::new(SourceSlots::default());
        let a: IpAddr = "198.18.0.2".parse().unwrap();
        let b: IpAddr = "198.18.0.3".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| slots.take(a, 3).unwrap()).collect();
        assert!(slots.take(a, 3).is_none(), "a holds its share");
        assert!(slots.take(b, 3).is_some(), "b is not held back by a");
        assert!(slots.take(a, 0).is_some(), "0: no cap");
        drop(held);
        assert_eq!(slots.held(a), 0);
        assert!(slots.take(a, 3).is_some());
    }

    #[test]
    fn the_wait_allowed_grows_with_what_arrived() {
        let s = Duration::from_secs;
        for (grace, rate, received, waited, want) in [
            (s(10), 1024, 0, s(0), s(10)),
            (s(10), 1024, 0, s(4), s(6)),
            (s(10), 1024, 10_240, s(4), s(16)),
            (s(10), 1024, 0, s(11), s(0)),
            (s(10), 0, 0, s(11), Duration::MAX),
        ] {
            assert_eq!(
                wait_allowed(grace, rate, received, waited),
                want,
                "{grace:?} {rate} {received} {waited:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_is_cut_and_one_that_keeps_up_is_not() {
        use http_body_util::BodyExt;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let body = MinRate::new(
            http_body_util::StreamBody::new(tokio_stream_adapter(rx)),
            100,
            Duration::from_secs(2),
        );
        let reader = tokio::spawn(async move {
            body.collect()
                .await
                .map(|c| c.to_bytes().len())
                .map_err(|e| e.to_string())
        });
        // 300 bytes in the first second earn three more seconds of waiting.
        tx.send(Ok(Frame::data(Bytes::from(vec![0; 300]))))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        tx.send(Ok(Frame::data(Bytes::from(vec![0; 10]))))
            .await
            .unwrap();
        // Then nothing: cut once the allowance (2 + 3.1 s, less the 4 s waited) runs out.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let out = reader.await.unwrap();
        let err = out.unwrap_err();
        assert!(err.contains("slower than 100"), "{err}");
        drop(tx);
    }

    /// An mpsc receiver as a stream, without another dependency.
    fn tokio_stream_adapter<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
