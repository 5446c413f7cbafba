//! `/metrics` is one OpenMetrics text: each domain adds its own families to it.

use prometheus_client::registry::Registry;

/// `text` (ending in `# EOF`) with `registry`'s families added before the end marker; `text`
/// unchanged should either not encode.
pub fn append(text: String, registry: &Registry) -> String {
    let mut ours = String::new();
    if prometheus_client::encoding::text::encode(&mut ours, registry).is_err() {
        return text;
    }
    match text.strip_suffix("# EOF\n") {
        Some(head) => format!("{head}{ours}"),
        None => text,
    }
}
