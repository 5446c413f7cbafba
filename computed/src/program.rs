//! A program generator's output, and when it must be made again.

use paddock_clock::UnixMs;
use serde::{Deserialize, Serialize};

/// What a program printed for one machine's file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generated {
    pub content: Vec<u8>,
    /// A digest of the data the program was given: other data, other output.
    pub inputs: String,
    pub at: UnixMs,
    /// How long the output holds (none: until the inputs change).
    pub valid_secs: Option<u64>,
}

/// Whether the program must run again for data whose digest is `inputs` at `now`: never run,
/// other inputs, or its validity is over (at the instant it ends, not a millisecond later).
pub fn stale(g: Option<&Generated>, inputs: &str, now: UnixMs) -> bool {
    let Some(g) = g else { return true };
    if g.inputs != inputs {
        return true;
    }
    match g.valid_secs {
        Some(secs) => now.since(g.at).as_secs() >= secs,
        None => false,
    }
}
