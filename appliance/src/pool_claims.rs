//! Pools claimed per host. The hosts of one appliance share the lease records, and only the
//! leader answers DHCP; a new leader's lease table is the one it loaded at its start, so the
//! hosts' pools must not overlap, or a new leader could hand out an address the old one had
//! bound since. Each host records its pools under `cluster/<family>/<host>` and refuses to
//! start when another host's overlap them.
//!
//! The check and the claim are one transaction: every claim also rewrites
//! `cluster/<family>-epoch`, and a claim commits only if that key is as it was when the
//! others' pools were read, so two hosts starting at once with overlapping pools cannot both
//! pass (the loser reads again and sees the winner's).

use std::fmt::Display;
use std::sync::Arc;

use anyhow::{Context, bail};
use paddock_store::{Compare, Op, Store, Txn};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A pool: its first and last address (or their numbers), inclusive.
pub type Span<T> = (T, T);

/// Records `mine` as `host`'s pools of `family` (`pools` for DHCPv4, `pools6` for DHCPv6),
/// unless another host's overlap them; `show` prints an address for the error.
pub async fn claim<T, S>(
    store: &Arc<dyn Store>,
    family: &str,
    host: &str,
    mine: &[Span<T>],
    show: impl Fn(&T) -> S,
) -> anyhow::Result<()>
where
    T: PartialOrd + Serialize + DeserializeOwned,
    S: Display,
{
    let prefix = format!("cluster/{family}/");
    let epoch = format!("cluster/{family}-epoch");
    loop {
        let seen = store.get(&epoch).await?.map_or(0, |kv| kv.mod_revision);
        for kv in store.range(&prefix).await? {
            let other = kv.key.trim_start_matches(&prefix);
            if other == host {
                continue;
            }
            let theirs: Vec<Span<T>> = serde_json::from_slice(&kv.value)
                .with_context(|| format!("{}: not a list of pools; fix or delete it", kv.key))?;
            if let Some(((a, b), (c, e))) = overlap(mine, &theirs) {
                bail!(
                    "DHCP pool {}-{} overlaps host {other}'s pool {}-{}: hosts of one appliance need disjoint pools",
                    show(a),
                    show(b),
                    show(c),
                    show(e)
                );
            }
        }
        let claimed = store
            .txn(Txn {
                compare: vec![Compare::ModRevision {
                    key: epoch.clone(),
                    revision: seen,
                }],
                success: vec![
                    Op::put(format!("{prefix}{host}"), serde_json::to_vec(mine)?),
                    Op::put(epoch.clone(), host.as_bytes().to_vec()),
                ],
                failure: vec![],
            })
            .await?;
        if claimed.succeeded {
            return Ok(());
        }
        // Another host claimed in between: read its pools too.
    }
}

/// The first of `mine` that overlaps one of `theirs`, with it.
fn overlap<'a, T: PartialOrd>(
    mine: &'a [Span<T>],
    theirs: &'a [Span<T>],
) -> Option<(&'a Span<T>, &'a Span<T>)> {
    mine.iter().find_map(|m| {
        theirs
            .iter()
            .find(|t| m.0 <= t.1 && t.0 <= m.1)
            .map(|t| (m, t))
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let s: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        (dir, s)
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn disjoint_pools_are_claimed_and_an_overlap_is_refused() {
        let (_dir, s) = store();
        let a = [(v6("2001:db8::100"), v6("2001:db8::1ff"))];
        let b = [(v6("2001:db8::200"), v6("2001:db8::2ff"))];
        let c = [(v6("2001:db8::2f0"), v6("2001:db8::300"))];
        claim(&s, "pools6", "h1", &a, |x| *x).await.unwrap();
        claim(&s, "pools6", "h2", &b, |x| *x).await.unwrap();
        // A host claims again at every start: its own record is not an overlap.
        claim(&s, "pools6", "h1", &a, |x| *x).await.unwrap();
        let err = claim(&s, "pools6", "h3", &c, |x| *x).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("2001:db8::2f0-2001:db8::300 overlaps host h2's pool"),
            "{err}"
        );
        assert!(s.get("cluster/pools6/h3").await.unwrap().is_none());
        // The families are apart: the same numbers as DHCPv4 pools do not clash.
        claim(&s, "pools", "h3", &[(1u32, 2u32)], |x| *x)
            .await
            .unwrap();
    }

    /// Two hosts starting at once with overlapping pools: their reads and writes interleave
    /// (each store call yields), and never do both claims hold.
    #[tokio::test]
    async fn two_hosts_claiming_at_once_never_both_win() {
        let (_dir, s) = store();
        for round in 0..10 {
            let family = format!("pools-{round}");
            let (one, two) = tokio::join!(
                claim(&s, &family, "h1", &[(10u32, 20u32)], |x| *x),
                claim(&s, &family, "h2", &[(15u32, 30u32)], |x| *x),
            );
            assert!(one.is_ok() != two.is_ok(), "round {round}: {one:?} {two:?}");
            let err = one.err().or(two.err()).unwrap();
            assert!(err.to_string().contains("overlaps host"), "{err}");
        }
    }

    #[tokio::test]
    async fn an_unreadable_record_stops_the_claim() {
        let (_dir, s) = store();
        s.put("cluster/pools/h9", b"garbage".to_vec())
            .await
            .unwrap();
        let err = claim(&s, "pools", "h1", &[(1u32, 2u32)], |x| *x)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cluster/pools/h9"), "{err}");
    }
}
