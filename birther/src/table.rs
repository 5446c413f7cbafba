//! Table tests' common check: a row wants a value or an error starting with some text.

use std::fmt::{Debug, Display};

/// Checks one row's outcome: both `Ok` → the pair, for the caller to compare; both `Err` →
/// the error must start with `start`; a mix fails the test.
pub fn row<T: Debug, E: Display + Debug, W: Debug>(
    what: &str,
    got: Result<T, E>,
    want: Result<W, &str>,
) -> Option<(T, W)> {
    match (got, want) {
        (Ok(got), Ok(want)) => Some((got, want)),
        (Err(e), Err(start)) => {
            let e = e.to_string();
            assert!(e.starts_with(start), "{what}: {e}");
            None
        }
        (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
    }
}
