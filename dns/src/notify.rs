//! Telling secondaries that a zone changed (NOTIFY, RFC 1996), as a pure state machine: the
//! shell feeds it the zones' serials, the answers and the transfers it sees, and sends what
//! [`Notifier::due`] returns.
//!
//! Each (secondary, zone) is told each new serial until it answers; unanswered, the NOTIFY
//! is sent again after 1, 2, 4 and 8 s, and after [`MAX_ATTEMPTS`] the secondary is given
//! up on (Triton CNS's rule) until it transfers the zone again, which shows it is back.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use paddock_clock::UnixMs;

/// NOTIFYs sent for one serial before the secondary is given up on.
pub const MAX_ATTEMPTS: u32 = 5;
/// The wait before the first resend; it doubles with each.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Where one secondary stands with one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerZone {
    pub peer: SocketAddr,
    pub apex: String,
    /// The serial it was last told of or is being told of.
    pub announcing: Option<u32>,
    /// The last serial it acknowledged a NOTIFY for.
    pub acknowledged: Option<u32>,
    /// The serial its last transfer from us brought it to, and when.
    pub transferred: Option<(u32, UnixMs)>,
    /// NOTIFYs sent for `announcing` without an answer.
    pub attempts: u32,
    /// No more NOTIFYs until it transfers again.
    pub given_up: bool,
    next_at: Option<UnixMs>,
    /// The ID of the last NOTIFY sent, to match its answer.
    id: u16,
}

/// A NOTIFY to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    pub peer: SocketAddr,
    pub apex: String,
    pub serial: u32,
    pub id: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notifier {
    secondaries: Vec<SocketAddr>,
    peers: BTreeMap<(SocketAddr, String), PeerZone>,
    next_id: u16,
}

impl Notifier {
    /// Secondaries to tell about each of `apexes`, and of every zone that appears later.
    pub fn new(secondaries: &[SocketAddr], apexes: &[String]) -> Self {
        let mut n = Notifier {
            secondaries: secondaries.to_vec(),
            peers: BTreeMap::new(),
            next_id: 1,
        };
        for apex in apexes {
            n.track(apex);
        }
        n
    }

    /// Each secondary's state with `apex`, from now on.
    fn track(&mut self, apex: &str) {
        for peer in &self.secondaries {
            self.peers
                .entry((*peer, apex.to_string()))
                .or_insert_with(|| PeerZone {
                    peer: *peer,
                    apex: apex.to_string(),
                    announcing: None,
                    acknowledged: None,
                    transferred: None,
                    attempts: 0,
                    given_up: false,
                    next_at: None,
                    id: 0,
                });
        }
    }

    /// The zones' serials now: a secondary not yet told of its zone's serial is told now.
    pub fn serials<'a>(&mut self, now: UnixMs, zones: impl IntoIterator<Item = (&'a str, u32)>) {
        let zones: BTreeMap<&str, u32> = zones.into_iter().collect();
        for apex in zones.keys() {
            self.track(apex);
        }
        for p in self.peers.values_mut() {
            let Some(serial) = zones.get(p.apex.as_str()).copied() else {
                continue;
            };
            let current =
                p.transferred.is_some_and(|(s, _)| s == serial) || p.acknowledged == Some(serial);
            if p.announcing == Some(serial) || current {
                continue;
            }
            p.announcing = Some(serial);
            p.attempts = 0;
            if !p.given_up {
                p.next_at = Some(now);
            }
        }
    }

    /// The NOTIFYs due at `now`; each is counted as an attempt and its resend scheduled.
    pub fn due(&mut self, now: UnixMs) -> Vec<Notify> {
        let mut out = Vec::new();
        for p in self.peers.values_mut() {
            let (Some(at), Some(serial)) = (p.next_at, p.announcing) else {
                continue;
            };
            if at > now || p.given_up {
                continue;
            }
            if p.attempts >= MAX_ATTEMPTS {
                p.given_up = true;
                p.next_at = None;
                continue;
            }
            p.attempts += 1;
            p.id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            // 1, 2, 4, 8 s; after the last attempt, one more wait to see it unanswered.
            p.next_at = Some(now.after(FIRST_RETRY * (1 << (p.attempts - 1))));
            out.push(Notify {
                peer: p.peer,
                apex: p.apex.clone(),
                serial,
                id: p.id,
            });
        }
        out
    }

    /// A NOTIFY answer from `peer` with `id` for `apex`; answers that match nothing sent are
    /// ignored.
    pub fn answered(&mut self, peer: SocketAddr, apex: &str, id: u16) {
        if let Some(p) = self.peers.get_mut(&(peer, apex.to_string()))
            && p.id == id
            && p.next_at.is_some()
        {
            p.acknowledged = p.announcing;
            p.attempts = 0;
            p.next_at = None;
        }
    }

    /// A secondary at `ip` transferred `apex` up to `serial`: it is back (if given up on) and
    /// needs no NOTIFY for that serial.
    pub fn transferred(&mut self, ip: IpAddr, apex: &str, serial: u32, now: UnixMs) {
        for p in self
            .peers
            .values_mut()
            .filter(|p| p.peer.ip() == ip && p.apex == apex)
        {
            p.transferred = Some((serial, now));
            p.given_up = false;
            if p.announcing.is_none_or(|a| a == serial) {
                p.announcing = Some(serial);
                p.attempts = 0;
                p.next_at = None;
            } else {
                // A newer serial came meanwhile: tell it now.
                p.attempts = 0;
                p.next_at = Some(now);
            }
        }
    }

    /// When [`Notifier::due`] next has work.
    pub fn next_wake(&self) -> Option<UnixMs> {
        self.peers
            .values()
            .filter(|p| !p.given_up)
            .filter_map(|p| p.next_at)
            .min()
    }

    /// Every secondary and zone, for operators.
    pub fn peers(&self) -> impl Iterator<Item = &PeerZone> {
        self.peers.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONE: &str = "paddock.internal.";

    fn at(ms: i64) -> UnixMs {
        UnixMs(ms)
    }

    fn peer() -> SocketAddr {
        "198.18.0.53:53".parse().unwrap()
    }

    fn one() -> Notifier {
        Notifier::new(&[peer()], &[ZONE.to_string()])
    }

    fn serials(n: &[Notify]) -> Vec<u32> {
        n.iter().map(|x| x.serial).collect()
    }

    #[test]
    fn a_new_serial_is_told_until_answered() {
        let mut n = one();
        n.serials(at(0), [(ZONE, 7)]);
        let sent = n.due(at(0));
        assert_eq!(serials(&sent), [7]);
        assert!(n.due(at(999)).is_empty(), "not before the resend time");
        assert_eq!(n.next_wake(), Some(at(1_000)));
        let again = n.due(at(1_000));
        assert_eq!(serials(&again), [7]);
        assert_ne!(again[0].id, sent[0].id);
        // An answer to the old ID is not this one's.
        n.answered(peer(), ZONE, sent[0].id);
        assert_eq!(n.next_wake(), Some(at(3_000)));
        n.answered(peer(), ZONE, again[0].id);
        assert_eq!(n.next_wake(), None);
        assert!(n.due(at(100_000)).is_empty());
        assert_eq!(n.peers().next().unwrap().acknowledged, Some(7));
        // The same serial again: nothing; a new one: told.
        n.serials(at(5_000), [(ZONE, 7)]);
        assert!(n.due(at(5_000)).is_empty());
        n.serials(at(6_000), [(ZONE, 8)]);
        assert_eq!(serials(&n.due(at(6_000))), [8]);
    }

    #[test]
    fn a_zone_that_appears_later_is_told_too() {
        let mut n = Notifier::new(&[peer()], &[]);
        n.serials(at(0), []);
        assert!(n.due(at(0)).is_empty());
        n.serials(at(10), [(ZONE, 3)]);
        assert_eq!(serials(&n.due(at(10))), [3]);
    }

    #[test]
    fn five_unanswered_give_up_until_a_transfer() {
        let mut n = one();
        n.serials(at(0), [(ZONE, 7)]);
        let mut sent_at = Vec::new();
        let mut t = 0;
        while t < 60_000 {
            if !n.due(at(t)).is_empty() {
                sent_at.push(t);
            }
            t += 100;
        }
        assert_eq!(sent_at, [0, 1_000, 3_000, 7_000, 15_000]);
        let p = n.peers().next().unwrap();
        assert!(p.given_up && p.attempts == MAX_ATTEMPTS, "{p:?}");
        // New serials are not told while given up.
        n.serials(at(70_000), [(ZONE, 9)]);
        assert!(n.due(at(70_000)).is_empty());
        assert_eq!(n.next_wake(), None);
        // It transfers serial 9 (it was back after all): resumed, nothing owed.
        n.transferred(peer().ip(), ZONE, 9, at(71_000));
        assert!(n.due(at(71_000)).is_empty());
        n.serials(at(72_000), [(ZONE, 10)]);
        assert_eq!(serials(&n.due(at(72_000))), [10]);
    }

    #[test]
    fn a_transfer_of_an_older_serial_still_owes_the_newer_one() {
        let mut n = one();
        n.serials(at(0), [(ZONE, 7)]);
        n.due(at(0));
        n.serials(at(100), [(ZONE, 8)]);
        n.transferred(peer().ip(), ZONE, 7, at(200));
        assert_eq!(serials(&n.due(at(200))), [8]);
        // Another address's transfer is not this peer's.
        n.transferred("198.18.0.99".parse().unwrap(), ZONE, 8, at(300));
        assert_eq!(n.peers().next().unwrap().transferred.map(|t| t.0), Some(7));
    }

    #[test]
    fn zones_and_peers_are_told_apart() {
        let other: SocketAddr = "198.18.0.54:5353".parse().unwrap();
        let rev = "0.18.198.in-addr.arpa.".to_string();
        let mut n = Notifier::new(&[peer(), other], &[ZONE.to_string(), rev.clone()]);
        n.serials(at(0), [(ZONE, 7), (rev.as_str(), 3)]);
        let sent = n.due(at(0));
        assert_eq!(sent.len(), 4);
        let to_other: Vec<&Notify> = sent.iter().filter(|s| s.peer == other).collect();
        n.answered(
            other,
            ZONE,
            to_other.iter().find(|s| s.apex == ZONE).unwrap().id,
        );
        // The other's reverse zone and both of the first peer's are still owed.
        let resent = n.due(at(1_000));
        assert_eq!(resent.len(), 3);
        assert!(!resent.iter().any(|s| s.peer == other && s.apex == ZONE));
    }
}
