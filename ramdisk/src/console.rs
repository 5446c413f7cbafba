//! Progress lines on `/dev/console` (the serial console on a server): `paddock-agent: [  4.21] <text>`,
//! with the kernel's uptime so they line up with the kernel's own messages.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Console {
    debug: AtomicBool,
}

impl Default for Console {
    fn default() -> Self {
        Self::new()
    }
}

impl Console {
    pub const fn new() -> Self {
        Self {
            debug: AtomicBool::new(false),
        }
    }

    pub fn set_debug(&self, on: bool) {
        self.debug.store(on, Ordering::Relaxed);
    }

    pub fn is_debug(&self) -> bool {
        self.debug.load(Ordering::Relaxed)
    }

    pub fn say(&self, msg: &str) {
        let line = format_line(uptime(), msg);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/console")
            .and_then(|mut c| c.write_all(line.as_bytes()));
        if written.is_err() {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }

    pub fn debug(&self, msg: &str) {
        if self.is_debug() {
            self.say(msg);
        }
    }
}

fn uptime() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn format_line(uptime: Option<f64>, msg: &str) -> String {
    let mut out = String::new();
    for l in msg.lines() {
        match uptime {
            Some(u) => out.push_str(&format!("paddock-agent: [{u:8.2}] {l}\n")),
            None => out.push_str(&format!("paddock-agent: {l}\n")),
        }
    }
    if out.is_empty() {
        out.push_str("paddock-agent:\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prefixed() {
        assert_eq!(
            format_line(Some(3.2049), "mounting /proc"),
            "paddock-agent: [    3.20] mounting /proc\n"
        );
        assert_eq!(
            format_line(None, "a\nb"),
            "paddock-agent: a\npaddock-agent: b\n"
        );
    }
}
