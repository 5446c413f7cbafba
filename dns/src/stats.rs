//! What the server counts, for `/metrics`: questions by type, answers by code, what the rate
//! limit held back, transfers by kind. Each answering thread counts a batch locally and adds
//! it to the shared counters once per batch, so that two threads do not fight over one
//! cache line per question.

use std::sync::atomic::{AtomicU64, Ordering};

/// The question types counted apart; the rest are `other`.
pub const TYPES: [(&str, u16); 11] = [
    ("A", 1),
    ("NS", 2),
    ("SOA", 6),
    ("PTR", 12),
    ("TXT", 16),
    ("AAAA", 28),
    ("SRV", 33),
    ("IXFR", 251),
    ("AXFR", 252),
    ("ANY", 255),
    ("other", 0),
];

/// The answer codes counted apart (by RCODE value); `dropped` is no answer at all.
pub const CODES: [&str; 8] = [
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "other", "dropped",
];

#[derive(Debug, Default)]
pub struct Stats {
    pub questions: [AtomicU64; TYPES.len()],
    pub answers: [AtomicU64; CODES.len()],
    pub slipped: AtomicU64,
    pub limited: AtomicU64,
    pub transfers_full: AtomicU64,
    pub transfers_incremental: AtomicU64,
}

/// One thread's counts since its last flush.
#[derive(Debug, Default)]
pub struct Tally {
    questions: [u64; TYPES.len()],
    answers: [u64; CODES.len()],
    slipped: u64,
    limited: u64,
}

impl Tally {
    /// A question of `qtype` (if it could be read) and the answer sent (`None`: none).
    pub fn count(&mut self, qtype: Option<u16>, answer: Option<&[u8]>) {
        let t = qtype
            .and_then(|q| TYPES.iter().position(|(_, v)| *v == q))
            .unwrap_or(TYPES.len() - 1);
        self.questions[t] += 1;
        let code = match answer {
            None => CODES.len() - 1,
            Some(a) => match a.get(3).map(|b| b & 0x0F) {
                Some(c @ 0..=5) => usize::from(c),
                _ => CODES.len() - 2,
            },
        };
        self.answers[code] += 1;
    }

    pub fn slipped(&mut self) {
        self.slipped += 1;
    }

    pub fn limited(&mut self) {
        self.limited += 1;
    }

    /// Adds the tally to `stats` and starts again.
    pub fn flush(&mut self, stats: &Stats) {
        for (a, n) in stats.questions.iter().zip(self.questions) {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        }
        for (a, n) in stats.answers.iter().zip(self.answers) {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        }
        stats.slipped.fetch_add(self.slipped, Ordering::Relaxed);
        stats.limited.fetch_add(self.limited, Ordering::Relaxed);
        *self = Tally::default();
    }
}

/// The type of a message's first question, read without parsing the rest.
pub fn question_type(q: &[u8]) -> Option<u16> {
    let at = crate::wire::question_name_end(q)?;
    Some(u16::from_be_bytes([*q.get(at)?, *q.get(at + 1)?]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_and_answers_are_counted_by_type_and_code() {
        let stats = Stats::default();
        let mut t = Tally::default();
        let q = crate::testing::question(
            1,
            "a.paddock.internal.",
            hickory_proto::rr::RecordType::SRV,
            None,
            false,
        );
        assert_eq!(question_type(&q), Some(33));
        assert_eq!(question_type(b"short"), None);
        let mut nx = q.clone();
        nx[3] = 0x83;
        t.count(question_type(&q), Some(&nx));
        t.count(Some(99), None);
        t.count(None, Some(&q));
        t.limited();
        t.flush(&stats);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(get(&stats.questions[6]), 1, "SRV");
        assert_eq!(get(&stats.questions[10]), 2, "other");
        assert_eq!(get(&stats.answers[3]), 1, "NXDOMAIN");
        assert_eq!(get(&stats.answers[0]), 1, "NOERROR");
        assert_eq!(get(&stats.answers[7]), 1, "dropped");
        assert_eq!(get(&stats.limited), 1);
        t.flush(&stats);
        assert_eq!(get(&stats.answers[7]), 1, "a flush starts the tally again");
    }
}
