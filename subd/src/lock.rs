//! The client lock (Dominator's `sub/rpcd/lib.go`, `getClientLock`): a controller that polls
//! or fetches with `lock_for_ms` holds the sub for that long (at most [`MAX_LOCK_MS`]), and
//! another client's Fetch, Update, Cleanup or locking Poll is refused meanwhile, so two
//! controllers cannot fight over one machine. Pure: the time is passed in (milliseconds from
//! any origin the caller keeps).

/// The longest a client may hold the lock (Dominator's 15 s cap).
pub const MAX_LOCK_MS: u64 = 15_000;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientLock {
    holder: Option<(String, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("another client ({holder}) has the lock for {ms_left} ms more")]
pub struct Locked {
    pub holder: String,
    pub ms_left: u64,
}

pub use paddock_subd_proto::LockState;

impl ClientLock {
    /// Refuses when another client holds the lock at `now`.
    pub fn check(&self, client: &str, now: u64) -> Result<(), Locked> {
        match &self.holder {
            Some((h, until)) if h != client && *until > now => Err(Locked {
                holder: h.clone(),
                ms_left: until - now,
            }),
            _ => Ok(()),
        }
    }

    /// Takes (or extends, or shortens) the lock for `lock_for_ms` (capped at
    /// [`MAX_LOCK_MS`]); 0 takes nothing and only checks. Refused while another client
    /// holds it.
    pub fn acquire(&mut self, client: &str, lock_for_ms: u64, now: u64) -> Result<(), Locked> {
        self.check(client, now)?;
        if lock_for_ms > 0 {
            self.holder = Some((client.to_string(), now + lock_for_ms.min(MAX_LOCK_MS)));
        }
        Ok(())
    }

    pub fn state(&self, client: &str, now: u64) -> LockState {
        match &self.holder {
            Some((h, until)) if *until > now => LockState {
                held: true,
                by_caller: h == client,
                holder: Some(h.clone()),
                ms_left: until - now,
            },
            _ => LockState::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_over_time() {
        let mut l = ClientLock::default();
        // (client, lock_for, now, accepted, then held by, ms left for "a")
        let steps: &[(&str, u64, u64, bool, Option<&str>)] = &[
            ("a", 0, 0, true, None),          // a plain call takes nothing
            ("a", 5_000, 0, true, Some("a")), // a takes it
            ("b", 0, 1_000, false, Some("a")),
            ("b", 1_000, 4_999, false, Some("a")),
            ("a", 0, 4_999, true, Some("a")), // the holder goes on
            ("b", 0, 5_000, true, None),      // expired: free again
            ("b", 60_000, 5_000, true, Some("b")),
            ("a", 0, 5_000 + MAX_LOCK_MS - 1, false, Some("b")), // capped at 15 s
            ("a", 0, 5_000 + MAX_LOCK_MS, true, None),
            ("a", 10_000, 30_000, true, Some("a")),
            ("a", 1, 30_000, true, Some("a")), // the holder may shorten it
            ("b", 0, 30_001, true, None),
        ];
        for (i, (client, lock_for, now, ok, held)) in steps.iter().enumerate() {
            let r = l.acquire(client, *lock_for, *now);
            assert_eq!(r.is_ok(), *ok, "step {i}: {r:?}");
            let st = l.state("a", *now);
            assert_eq!(st.holder.as_deref(), *held, "step {i}");
            assert_eq!(st.held, held.is_some(), "step {i}");
            assert_eq!(st.by_caller, *held == Some("a"), "step {i}");
        }
        let mut l = ClientLock::default();
        l.acquire("a", 2_000, 100).unwrap();
        assert_eq!(
            l.check("b", 600),
            Err(Locked {
                holder: "a".into(),
                ms_left: 1_500
            })
        );
        assert!(l.check("a", 600).is_ok());
    }
}
