//! Tokens.
//!
//! **Agent tokens** (Ironic's agent-token idea): minted when a boot script is served, put on
//! the ramdisk's kernel command line, and required on `/v1/continue` and the agent's routes.
//! They are stateless, so a boot storm writes nothing: `pa1.<mac>.<expires_ms>.<nonce>.<tag>`
//! where `tag` is HMAC-SHA256 under a key every appliance host shares through the store. A
//! token names the MAC the script was served to; the routes check that MAC against the
//! machine the call is about.
//!
//! **Operator tokens**: `po1.<64 hex>`, random; only their SHA-256 is stored, with the name
//! and methods they grant.
//!
//! Pure: keys, nonces and time are passed in.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

const AGENT_PREFIX: &str = "pa1";
const OPERATOR_PREFIX: &str = "po1";
/// Longer tokens are refused before anything is parsed.
pub const MAX_TOKEN_BYTES: usize = 160;

/// The key agent tokens are signed with (32 random bytes, shared by the appliance's hosts).
#[derive(Clone)]
pub struct AgentKey([u8; 32]);

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    pub fn from_bytes(b: [u8; 32]) -> Self {
        AgentKey(b)
    }

    /// From 64 hex digits (how the store keeps it).
    pub fn from_hex(s: &str) -> Result<Self, TokenError> {
        let v = hex::decode(s.trim()).map_err(|_| TokenError::Malformed)?;
        let b: [u8; 32] = v.try_into().map_err(|_| TokenError::Malformed)?;
        Ok(AgentKey(b))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn mac(&self, body: &str) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(body.as_bytes());
        m
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("token signature does not verify")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token issued for another machine")]
    OtherMachine,
}

/// What a valid agent token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentClaim {
    /// The boot MAC, 12 lowercase hex digits.
    pub mac: String,
    pub expires_ms: u64,
    /// The token's nonce (16 hex digits): names this token among the MAC's.
    pub nonce: String,
}

/// Normalises a MAC (`aa:bb:…`, `aa-bb-…` or bare hex) to 12 lowercase hex digits.
pub fn mac_key(mac: &str) -> Option<String> {
    let h: String = mac
        .chars()
        .filter(|c| !matches!(c, ':' | '-'))
        .collect::<String>()
        .to_ascii_lowercase();
    (h.len() == 12 && h.chars().all(|c| c.is_ascii_hexdigit())).then_some(h)
}

/// Mints an agent token for `mac`, valid until `expires_ms`; `nonce` makes each boot's token
/// its own.
pub fn mint_agent(key: &AgentKey, mac: &str, expires_ms: u64, nonce: [u8; 8]) -> Option<String> {
    let mac = mac_key(mac)?;
    let body = format!("{AGENT_PREFIX}.{mac}.{expires_ms}.{}", hex::encode(nonce));
    let tag = key.mac(&body).finalize().into_bytes();
    Some(format!("{body}.{}", hex::encode(tag)))
}

/// Checks an agent token: format, signature (constant-time), expiry.
pub fn check_agent(key: &AgentKey, token: &str, now_ms: u64) -> Result<AgentClaim, TokenError> {
    let claim = verify_agent(key, token)?;
    if now_ms >= claim.expires_ms {
        return Err(TokenError::Expired);
    }
    Ok(claim)
}

/// Checks an agent token's format and signature (constant-time), not its expiry: for a
/// token whose life the appliance extends while its machine uses it.
pub fn verify_agent(key: &AgentKey, token: &str) -> Result<AgentClaim, TokenError> {
    if token.len() > MAX_TOKEN_BYTES || !token.is_ascii() {
        return Err(TokenError::Malformed);
    }
    let (body, tag) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
    let mut parts = body.split('.');
    let (Some(AGENT_PREFIX), Some(mac), Some(exp), Some(nonce), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(TokenError::Malformed);
    };
    let hexes = |s: &str, n: usize| {
        s.len() == n
            && s.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    };
    if !hexes(mac, 12) || !hexes(nonce, 16) || !hexes(tag, 64) {
        return Err(TokenError::Malformed);
    }
    if exp.is_empty() || exp.len() > 20 || !exp.chars().all(|c| c.is_ascii_digit()) {
        return Err(TokenError::Malformed);
    }
    let expires_ms: u64 = exp.parse().map_err(|_| TokenError::Malformed)?;
    let tag = hex::decode(tag).map_err(|_| TokenError::Malformed)?;
    key.mac(body)
        .verify_slice(&tag)
        .map_err(|_| TokenError::BadSignature)?;
    Ok(AgentClaim {
        mac: mac.to_string(),
        expires_ms,
        nonce: nonce.to_string(),
    })
}

/// Checks a token and that it was minted for one of `macs`.
pub fn check_agent_for(
    key: &AgentKey,
    token: &str,
    now_ms: u64,
    macs: &[String],
) -> Result<AgentClaim, TokenError> {
    let claim = check_agent(key, token, now_ms)?;
    if macs
        .iter()
        .filter_map(|m| mac_key(m))
        .any(|m| m == claim.mac)
    {
        Ok(claim)
    } else {
        Err(TokenError::OtherMachine)
    }
}

/// A new operator token from 32 random bytes.
pub fn operator_token(random: [u8; 32]) -> String {
    format!("{OPERATOR_PREFIX}.{}", hex::encode(random))
}

/// The digest an operator token is stored under, or `None` if it is not one.
pub fn operator_digest(token: &str) -> Option<String> {
    let rest = token.strip_prefix("po1.")?;
    if rest.len() != 64 || !rest.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some(hex::encode(Sha256::digest(token.as_bytes())))
}

/// `n` bytes from the system's random source.
pub fn random<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut b = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source failed");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AgentKey {
        AgentKey::from_bytes([7; 32])
    }

    #[test]
    fn minted_tokens_check() {
        let t = mint_agent(&key(), "52:54:00:AA:bb:01", 2_000, [1; 8]).unwrap();
        let c = check_agent(&key(), &t, 1_000).unwrap();
        assert_eq!(c.mac, "525400aabb01");
        assert_eq!(c.expires_ms, 2_000);
        assert_eq!(
            check_agent_for(&key(), &t, 1_000, &["52-54-00-aa-bb-01".into()]).unwrap(),
            c
        );
        assert_eq!(
            check_agent_for(&key(), &t, 1_000, &["52:54:00:aa:bb:02".into()]),
            Err(TokenError::OtherMachine)
        );
        assert_eq!(check_agent(&key(), &t, 2_000), Err(TokenError::Expired));
        let other = AgentKey::from_bytes([8; 32]);
        assert_eq!(
            check_agent(&other, &t, 1_000),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn tampering_is_caught() {
        let t = mint_agent(&key(), "525400aabb01", 2_000, [1; 8]).unwrap();
        // A later expiry with the old tag.
        let forged = t.replacen(".2000.", ".9000.", 1);
        assert_eq!(
            check_agent(&key(), &forged, 1_000),
            Err(TokenError::BadSignature)
        );
        let forged = t.replacen("525400aabb01", "525400aabb02", 1);
        assert_eq!(
            check_agent(&key(), &forged, 1_000),
            Err(TokenError::BadSignature)
        );
        for bad in [
            "",
            "pa1",
            "pa1.x.y.z.w",
            &t[..t.len() - 1],
            &format!("{t}.x"),
            &t.to_uppercase(),
            &"a".repeat(500),
        ] {
            assert!(check_agent(&key(), bad, 1_000).is_err(), "{bad}");
        }
    }

    #[test]
    fn operator_tokens() {
        let t = operator_token([3; 32]);
        let d = operator_digest(&t).unwrap();
        assert_eq!(d.len(), 64);
        assert_ne!(d, operator_digest(&operator_token([4; 32])).unwrap());
        assert_eq!(operator_digest("po1.zz"), None);
        assert_eq!(operator_digest(&t.replace("po1", "pa1")), None);
        assert_ne!(random::<32>(), random::<32>());
    }

    #[test]
    fn key_hex_round_trip() {
        let k = AgentKey::from_hex(&key().to_hex()).unwrap();
        let t = mint_agent(&k, "525400aabb01", 2_000, [1; 8]).unwrap();
        assert!(check_agent(&key(), &t, 0).is_ok());
        assert!(AgentKey::from_hex("00").is_err());
    }
}
