//! Agent tokens on an untrusted boot network. A boot script's token is signed (stateless to
//! mint, so a boot storm writes nothing until machines call), and then:
//!
//! - **bound to the lease**: when the MAC holds a DHCP lease on this host, the script
//!   carries a token only when fetched from the lease's address, and a call is refused when
//!   the lease is on another address than the caller's;
//! - **claimed once**: the first call with a token records its source address under
//!   `security/agent-claims/<mac>-<nonce>`; a call from any other address is refused, and
//!   the machine's timeline says so;
//! - **short-lived, renewed by use**: an unclaimed token lives `[security]
//!   agent_token_ttl_secs` from its minting; a claimed one as long as its machine calls at
//!   least that often;
//! - **revocable**: per machine (`security/agent-revoked/<mac>`: tokens minted before are
//!   void) and all at once, by rotating the signing key.
//!
//! - **forgotten once dead**: a claim idle for longer than the lifetime, whose token has
//!   expired too, can vouch for no call, and the leader deletes it ([`sweep`], every minute),
//!   so boots, and anyone fetching boot scripts, leave no keys behind for good.
//!
//! [`decide`] is the pure rule; [`AgentTokens`] applies it over the store.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use paddock_inventory::MacAddr;
use paddock_security::token::{self, AgentClaim, AgentKey};
use paddock_store::{Compare, Op, Store, Txn};
use serde::{Deserialize, Serialize};

pub const CLAIMS: &str = "security/agent-claims/";
pub const REVOKED: &str = "security/agent-revoked/";

/// A token's first use: who claimed it, and when it was last used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub addr: IpAddr,
    pub claimed_ms: i64,
    pub last_ms: i64,
    /// When the claimed token itself expires (claims written before this was kept: `None`).
    /// A claim is swept only after it: deleted sooner, its token could be claimed again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_ms: Option<i64>,
}

/// What one call with a valid signature comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The first use: record this claim.
    Claim(Claim),
    /// A use that extends the token's life: write this claim back.
    Renew(Claim),
    Valid,
    /// Refused; `conflict` when another address claimed the token first (a timeline entry).
    Refused {
        why: String,
        conflict: bool,
    },
}

/// What [`decide`] looks at besides the token.
#[derive(Debug, Clone, Copy)]
pub struct Use<'a> {
    pub claim: Option<&'a Claim>,
    /// The call's source address.
    pub caller: IpAddr,
    /// The address the MAC's lease holds, when this host knows one.
    pub lease: Option<IpAddr>,
    /// Tokens minted before this are void.
    pub revoked_ms: Option<i64>,
    pub now_ms: i64,
    /// The life of an unclaimed token, and the longest pause between a claimed one's uses.
    pub ttl_ms: i64,
}

/// Whether a boot script fetched from `from` may carry a token for a MAC whose lease here
/// is `lease`: not when the lease is on another address (someone else asks for that
/// machine's script). A MAC without a lease here (DHCP from a peer host or elsewhere, or
/// none yet) gets one: anyone could take a lease for it by sending DHCP with it, and the
/// token is bound anyway to its first caller and, once the MAC has a lease, to that.
pub fn may_mint(lease: Option<IpAddr>, from: Option<IpAddr>) -> bool {
    lease.is_none_or(|l| from == Some(l))
}

/// Decides one call. `token` has a valid signature.
pub fn decide(token: &AgentClaim, u: Use<'_>) -> Verdict {
    let refuse = |why: String| Verdict::Refused {
        why,
        conflict: false,
    };
    let expires = i64::try_from(token.expires_ms).unwrap_or(i64::MAX);
    let minted = expires.saturating_sub(u.ttl_ms);
    if let Some(lease) = u.lease
        && lease != u.caller
    {
        return refuse(format!(
            "agent token: the machine's lease is {lease}, this call came from {}",
            u.caller
        ));
    }
    if u.revoked_ms.is_some_and(|r| minted <= r) {
        return refuse("agent token: revoked".into());
    }
    match u.claim {
        None if u.now_ms >= expires => refuse("agent token: expired before its first use".into()),
        None => Verdict::Claim(Claim {
            addr: u.caller,
            claimed_ms: u.now_ms,
            last_ms: u.now_ms,
            token_expires_ms: Some(expires),
        }),
        Some(c) if c.addr != u.caller => Verdict::Refused {
            why: format!(
                "agent token: claimed by {} first; refused for {}",
                c.addr, u.caller
            ),
            conflict: true,
        },
        Some(c) if u.now_ms >= c.last_ms.saturating_add(u.ttl_ms) => {
            refuse("agent token: expired (unused for longer than its lifetime)".into())
        }
        // Written back a quarter of the way in, not at every call.
        Some(c) if u.now_ms.saturating_sub(c.last_ms) >= u.ttl_ms / 4 => Verdict::Renew(Claim {
            last_ms: u.now_ms,
            ..c.clone()
        }),
        Some(_) => Verdict::Valid,
    }
}

/// Deletes the claims whose last use is `ttl_ms` or more before `now_ms` ([`decide`] refuses
/// them) and whose tokens have expired too, so that no call can claim those tokens afresh.
/// A claim that does not say when its token expires is kept for twice the lifetime (a
/// token expires a lifetime after minting, before its claim). Each delete holds only if the
/// claim was not renewed meanwhile. Returns how many went.
pub async fn sweep(store: &dyn Store, ttl_ms: i64, now_ms: i64) -> anyhow::Result<usize> {
    let mut gone = 0;
    for kv in store.range(CLAIMS).await? {
        let Ok(c) = serde_json::from_slice::<Claim>(&kv.value) else {
            continue;
        };
        let token_gone = match c.token_expires_ms {
            Some(t) => now_ms >= t,
            None => now_ms >= c.last_ms.saturating_add(ttl_ms.saturating_mul(2)),
        };
        if now_ms < c.last_ms.saturating_add(ttl_ms) || !token_gone {
            continue;
        }
        let txn = Txn {
            compare: vec![Compare::ModRevision {
                key: kv.key.clone(),
                revision: kv.mod_revision,
            }],
            success: vec![Op::delete(kv.key)],
            failure: vec![],
        };
        if store.txn(txn).await?.succeeded {
            gone += 1;
        }
    }
    Ok(gone)
}

/// On the leader, every minute: [`sweep`].
pub fn start(rt: &mut crate::runtime::Runtime, ttl: Duration) {
    let store = rt.context().store.clone();
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    rt.every_while_leading("agent tokens: sweep", Duration::from_secs(60), move |_| {
        let store = store.clone();
        async move {
            match sweep(store.as_ref(), ttl_ms, paddock_wire::unix_ms()).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(deleted = n, "agent tokens: dead claims swept"),
                Err(e) => tracing::warn!(error = %e, "agent tokens: sweeping claims failed"),
            }
        }
    });
}

fn claim_key(t: &AgentClaim) -> String {
    format!("{CLAIMS}{}-{}", t.mac, t.nonce)
}

/// The signing key, as the store has it (read again every few seconds, so a rotation on
/// one host reaches the others).
struct CachedKey {
    key: AgentKey,
    read: tokio::time::Instant,
}

/// Agent tokens over the store.
pub struct AgentTokens {
    store: Arc<dyn Store>,
    key: RwLock<CachedKey>,
    pub ttl: Duration,
}

const KEY_REFRESH: Duration = Duration::from_secs(5);

impl AgentTokens {
    pub fn new(store: Arc<dyn Store>, key: AgentKey, ttl: Duration) -> Self {
        AgentTokens {
            store,
            key: RwLock::new(CachedKey {
                key,
                read: tokio::time::Instant::now(),
            }),
            ttl,
        }
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// The signing key, refreshed from the store when the cached copy is old.
    async fn key(&self) -> anyhow::Result<AgentKey> {
        {
            let c = self.key.read().unwrap_or_else(|p| p.into_inner());
            if c.read.elapsed() < KEY_REFRESH {
                return Ok(c.key.clone());
            }
        }
        let key = ensure_agent_key(self.store.as_ref()).await?;
        *self.key.write().unwrap_or_else(|p| p.into_inner()) = CachedKey {
            key: key.clone(),
            read: tokio::time::Instant::now(),
        };
        Ok(key)
    }

    /// A token for `mac`, usable first within the lifetime.
    pub async fn mint(&self, mac: &str) -> anyhow::Result<Option<String>> {
        let expires = u64::try_from(paddock_wire::unix_ms()).unwrap_or(0)
            + u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX / 2);
        Ok(token::mint_agent(
            &self.key().await?,
            mac,
            expires,
            token::random::<8>(),
        ))
    }

    /// Checks one call with `tok` from `caller`; `lease` gives the address a MAC's lease
    /// holds, when this host knows one. The MAC the token speaks for, or why it is refused.
    pub async fn check(
        &self,
        tok: &str,
        caller: IpAddr,
        lease: impl FnOnce(MacAddr) -> Option<IpAddr>,
    ) -> Result<MacAddr, Refusal> {
        let key = self.key().await.map_err(Refusal::Key)?;
        let t = token::verify_agent(&key, tok)?;
        let mac: MacAddr = t.mac.parse().map_err(|_| Refusal::Mac)?;
        let claim = match self.store.get(&claim_key(&t)).await? {
            Some(kv) => {
                Some(serde_json::from_slice::<Claim>(&kv.value).map_err(|_| Refusal::Claim)?)
            }
            None => None,
        };
        let revoked_ms = match self.store.get(&format!("{REVOKED}{}", t.mac)).await? {
            Some(kv) => std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|v| v.parse().ok()),
            None => None,
        };
        let verdict = decide(
            &t,
            Use {
                claim: claim.as_ref(),
                caller,
                lease: lease(mac),
                revoked_ms,
                now_ms: paddock_wire::unix_ms(),
                ttl_ms: self.ttl_ms(),
            },
        );
        let write = |c: &Claim| serde_json::to_vec(c).unwrap_or_default();
        match verdict {
            Verdict::Valid => Ok(mac),
            Verdict::Renew(c) => {
                self.store.put(&claim_key(&t), write(&c)).await?;
                Ok(mac)
            }
            Verdict::Claim(c) => {
                // Two first calls at once: the store decides which came first.
                if self.store.create(&claim_key(&t), write(&c)).await? {
                    Ok(mac)
                } else {
                    Err(Refusal::Raced)
                }
            }
            Verdict::Refused { why, conflict } => {
                if conflict {
                    self.conflict(mac, &why).await;
                }
                Err(Refusal::Verdict(why))
            }
        }
    }

    /// Files a refused second claimant on the machine's timeline.
    async fn conflict(&self, mac: MacAddr, why: &str) {
        let op = paddock_inspector::service::timeline_op(
            paddock_inspector::service::Subject::Mac(mac),
            "agent-token-conflict",
            why,
            true,
        );
        let txn = Txn {
            success: vec![op],
            ..Txn::default()
        };
        if let Err(e) = self.store.txn(txn).await {
            tracing::warn!(error = %e, "agent token: the conflict was not filed");
        }
        tracing::warn!(%mac, %why, "agent token: a second claimant refused");
    }

    /// Voids every token minted so far for `macs`.
    pub async fn revoke(&self, macs: &[String]) -> anyhow::Result<usize> {
        let now = paddock_wire::unix_ms().to_string();
        let mut n = 0;
        for m in macs {
            let Some(mac) = token::mac_key(m) else {
                continue;
            };
            self.store
                .put(&format!("{REVOKED}{mac}"), now.clone().into_bytes())
                .await?;
            for kv in self.store.range(&format!("{CLAIMS}{mac}-")).await? {
                self.store.delete(&kv.key).await?;
            }
            n += 1;
        }
        Ok(n)
    }

    /// A new signing key: every outstanding token is void on every host within seconds.
    pub async fn rotate(&self) -> anyhow::Result<()> {
        let k = AgentKey::from_bytes(token::random::<32>());
        self.store.put(AGENT_KEY, k.to_hex().into_bytes()).await?;
        *self.key.write().unwrap_or_else(|p| p.into_inner()) = CachedKey {
            key: k,
            read: tokio::time::Instant::now(),
        };
        Ok(())
    }
}

/// Where the shared agent-token key lives in the store.
pub const AGENT_KEY: &str = "security/agent-key";

/// The shared agent-token key, created if absent.
pub async fn ensure_agent_key(store: &dyn Store) -> anyhow::Result<AgentKey> {
    if let Some(kv) = store.get(AGENT_KEY).await? {
        return Ok(AgentKey::from_hex(std::str::from_utf8(&kv.value)?)?);
    }
    let k = AgentKey::from_bytes(token::random::<32>());
    if store.create(AGENT_KEY, k.to_hex().into_bytes()).await? {
        return Ok(k);
    }
    let kv = store
        .get(AGENT_KEY)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the agent key vanished"))?;
    Ok(AgentKey::from_hex(std::str::from_utf8(&kv.value)?)?)
}

/// Why an agent token is refused for a call.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("agent token: the key is unavailable ({0:#})")]
    Key(anyhow::Error),
    #[error("agent token: {0}")]
    Token(#[from] token::TokenError),
    #[error("agent token: malformed MAC")]
    Mac,
    #[error("agent token: store: {0}")]
    Store(#[from] paddock_store::StoreError),
    #[error("agent token: its claim does not parse")]
    Claim,
    #[error("agent token: claimed by another call at the same moment")]
    Raced,
    /// The pure decision's reason (a second address, expiry, revocation …).
    #[error("{0}")]
    Verdict(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: i64 = 1_800_000;

    /// A claim is deleted once idle for the lifetime and its token expired; others stay.
    #[tokio::test]
    async fn dead_claims_are_swept_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap();
        let claim = |last_ms, token_expires_ms| {
            serde_json::to_vec(&Claim {
                addr: "198.18.0.101".parse().unwrap(),
                claimed_ms: 0,
                last_ms,
                token_expires_ms,
            })
            .unwrap()
        };
        let now = 10 * TTL;
        for (key, value) in [
            // Idle for the lifetime, its token expired: dead.
            ("01", claim(now - TTL, Some(now - TTL))),
            // Used a millisecond later: alive.
            ("02", claim(now - TTL + 1, Some(now - TTL))),
            // Idle, but its token (a lifetime longer then) still valid: kept.
            ("03", claim(now - TTL, Some(now + 1))),
            // Written before the token's expiry was kept: twice the lifetime.
            ("04", claim(now - TTL, None)),
            ("05", claim(now - 2 * TTL, None)),
        ] {
            store
                .put(&format!("{CLAIMS}525400770001-{key}"), value)
                .await
                .unwrap();
        }
        assert_eq!(sweep(&store, TTL, now).await.unwrap(), 2);
        let left: Vec<String> = store
            .range(CLAIMS)
            .await
            .unwrap()
            .into_iter()
            .map(|kv| kv.key.trim_start_matches(CLAIMS).to_string())
            .collect();
        assert_eq!(
            left,
            ["525400770001-02", "525400770001-03", "525400770001-04"]
        );
        assert_eq!(sweep(&store, TTL, now).await.unwrap(), 0, "nothing more");
    }

    fn token(expires_ms: u64) -> AgentClaim {
        AgentClaim {
            mac: "525400770001".into(),
            expires_ms,
            nonce: "0102030405060708".into(),
        }
    }

    #[test]
    fn a_leased_machines_script_carries_a_token_only_to_its_lease() {
        let a: IpAddr = "198.18.0.101".parse().unwrap();
        let b: IpAddr = "198.18.0.102".parse().unwrap();
        assert!(may_mint(Some(a), Some(a)));
        assert!(!may_mint(Some(a), Some(b)));
        assert!(!may_mint(Some(a), None));
        assert!(may_mint(None, Some(b)));
    }

    #[test]
    fn one_machine_one_token() {
        let a: IpAddr = "198.18.0.101".parse().unwrap();
        let b: IpAddr = "198.18.0.102".parse().unwrap();
        let now = 10_000_000;
        let t = token(u64::try_from(now + TTL / 2).unwrap());
        let base = Use {
            claim: None,
            caller: a,
            lease: None,
            revoked_ms: None,
            now_ms: now,
            ttl_ms: TTL,
        };
        let claimed = Claim {
            addr: a,
            claimed_ms: now - 1000,
            last_ms: now - 1000,
            token_expires_ms: None,
        };
        let refused = |v: Verdict, want_conflict: bool| {
            assert!(
                matches!(v, Verdict::Refused { conflict, .. } if conflict == want_conflict),
                "{v:?}"
            )
        };
        // The first call claims it; later ones from the same address pass.
        assert!(matches!(decide(&t, base), Verdict::Claim(c) if c.addr == a));
        let with = Use {
            claim: Some(&claimed),
            ..base
        };
        assert_eq!(decide(&t, with), Verdict::Valid);
        // Another address: refused, and it is a conflict worth filing.
        refused(decide(&t, Use { caller: b, ..with }), true);
        // The lease moved: refused before anything else.
        refused(
            decide(
                &t,
                Use {
                    lease: Some(b),
                    ..base
                },
            ),
            false,
        );
        assert!(matches!(
            decide(
                &t,
                Use {
                    lease: Some(a),
                    ..base
                }
            ),
            Verdict::Claim(_)
        ));
        // Revoked after it was minted: void; revoked before: not this token's business.
        refused(
            decide(
                &t,
                Use {
                    revoked_ms: Some(now),
                    ..with
                },
            ),
            false,
        );
        assert_eq!(
            decide(
                &t,
                Use {
                    revoked_ms: Some(now - TTL),
                    ..with
                }
            ),
            Verdict::Valid
        );
        // Unclaimed past its expiry: void. Claimed: lives while used.
        let late = now + TTL;
        refused(
            decide(
                &t,
                Use {
                    now_ms: late,
                    ..base
                },
            ),
            false,
        );
        let recent = Claim {
            last_ms: late - TTL / 2,
            ..claimed.clone()
        };
        assert!(matches!(
            decide(&t, Use { claim: Some(&recent), now_ms: late, ..base }),
            Verdict::Renew(c) if c.last_ms == late
        ));
        refused(
            decide(
                &t,
                Use {
                    claim: Some(&claimed),
                    now_ms: late + TTL,
                    ..base
                },
            ),
            false,
        );
    }
}
