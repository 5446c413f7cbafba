//! The agent token check on whatever an Authorization header carries: no panic; a token
//! that checks was minted by the key (the same claim re-minted with the nonce it carries
//! checks too), and no token checks under another key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_security::token::{AgentKey, check_agent, check_agent_for, mint_agent, operator_digest};

fuzz_target!(|data: &[u8]| {
    let key = AgentKey::from_bytes([0x5a; 32]);
    let other = AgentKey::from_bytes([0xa5; 32]);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = operator_digest(text);
    let _ = check_agent_for(&key, text, 1_000, &["52:54:00:00:00:01".into()]);
    if let Ok(claim) = check_agent(&key, text, 1_000) {
        assert!(claim.expires_ms > 1_000);
        assert!(check_agent(&other, text, 1_000).is_err());
        assert_eq!(claim.mac.len(), 12);
    }
    // A minted token always checks until it expires, and never after.
    if data.len() >= 8 {
        let nonce: [u8; 8] = data[..8].try_into().unwrap();
        let t = mint_agent(&key, "52:54:00:00:00:01", 2_000, nonce).unwrap();
        assert!(check_agent(&key, &t, 1_999).is_ok());
        assert!(check_agent(&key, &t, 2_000).is_err());
    }
});
