//! What an agent on the boot network controls, decoded as the appliance decodes it: the
//! request line (method and path, raw and percent-decoded as axum's `Path` gives handlers),
//! the JSON bodies of the agent's routes, an inventory processed for the token's MAC, and
//! the numbers a token's claim is judged by.
//!
//! Input: `<method byte> <path> NUL <body>`. Checks: no panic; a path's route decision is the
//! same for any method it is asked with twice; an inventory processed for a speaker adds no
//! MAC to the node, leaves its PXE MAC the speaker's and takes no BMC address it was not
//! told to trust; a subd certificate's names never
//! read as an address or name the appliance; a claim decision never panics on extreme times.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use paddock::access;
use paddock::agent_tokens::{Claim, Use, decide};
use paddock_birther::protocol::{NextRequest, RegisterRequest, ReportRequest};
use paddock_inspector::node::{Introspection, Node};
use paddock_inspector::processing::{Input, process};
use paddock_inspector::state::State;
use paddock_inventory::{IntrospectionData, MacAddr};
use paddock_security::token::AgentClaim;

const METHODS: [&str; 5] = ["GET", "POST", "PATCH", "DELETE", "HEAD"];

/// `%XX` decoded (what axum's `Path` does to a segment); `None` for text that is not UTF-8
/// once decoded (axum refuses it).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| char::from(*c).to_digit(16)),
                b.get(i + 2).and_then(|c| char::from(*c).to_digit(16)),
            )
        {
            out.push(u8::try_from(h * 16 + l).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(m) % METHODS.len()];
    let (path, body) = match rest.iter().position(|&c| c == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    // The route decision: total, and a function of its input.
    let a = access::access(method, path);
    assert_eq!(a, access::access(method, path));
    let _ = (a.method(), a.mutates());
    if let Some(decoded) = percent_decode(path) {
        let _ = access::access(method, &decoded);
        for seg in decoded.split('/') {
            let names = paddock::security::subd_names(
                &[seg, "fallback-node"],
                &[seg.to_string(), "198.18.0.66".into()],
                &["198.18.0.1".into(), "paddock.lab".into()],
            );
            if let Ok((name, sans)) = names {
                assert!(!paddock_security::ca::looks_like_address(&name), "{name}");
                for s in &sans {
                    assert!(s != "198.18.0.1" && !s.eq_ignore_ascii_case("paddock.lab"));
                    if let Ok(ip) = s.parse::<IpAddr>() {
                        assert!(!ip.is_loopback() && !ip.is_unspecified(), "{s}");
                    } else {
                        assert!(!paddock_security::ca::looks_like_address(s), "{s}");
                    }
                }
            }
        }
    }
    // The agent's bodies.
    let _ = serde_json::from_slice::<NextRequest>(body);
    let _ = serde_json::from_slice::<ReportRequest>(body);
    let _ = serde_json::from_slice::<RegisterRequest>(body);
    // An inventory from the token's machine: it speaks for that MAC alone.
    if let Ok((inv, raw)) = IntrospectionData::read(body) {
        let speaker: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let mut node = Node::new(uuid::Uuid::nil(), 0);
        node.macs = vec![speaker];
        node.introspection = Some(Introspection {
            state: State::Waiting,
            started_at: Some(0),
            finished_at: None,
            error: None,
            manage_boot: false,
            set_image: None,
        });
        let input = Input {
            data: &inv,
            body,
            raw: &raw,
            enrolled: false,
            pre_failure: None,
            speaker: Some(speaker),
            trust_bmc: false,
        };
        let out = process(input, node, &[]).conclude(1);
        assert_eq!(out.node.macs, vec![speaker], "agent data added a MAC");
        assert_eq!(out.node.bmc_address, None, "an untrusted BMC address was taken");
        if out.result.is_ok() {
            assert_eq!(out.node.pxe_mac, Some(speaker));
        }
    }
    // A claim judged at extreme times and addresses: a verdict, never a panic.
    if body.len() >= 33 {
        let n = |i: usize| i64::from_le_bytes(body[i..i + 8].try_into().unwrap());
        let claim = Claim {
            addr: IpAddr::from([body[32], 0, 0, 1]),
            claimed_ms: n(0),
            last_ms: n(8),
            token_expires_ms: Some(n(24)),
        };
        let token = AgentClaim {
            mac: "525400000001".into(),
            expires_ms: n(16).unsigned_abs(),
            nonce: "0000000000000000".into(),
        };
        for with_claim in [None, Some(&claim)] {
            let _ = decide(
                &token,
                Use {
                    claim: with_claim,
                    caller: IpAddr::from([body[32] ^ 1, 0, 0, 1]),
                    lease: None,
                    revoked_ms: Some(n(24)),
                    now_ms: n(24) ^ n(0),
                    ttl_ms: n(8).rem_euclid(1 << 40),
                },
            );
        }
    }
});
