//! Dominator's filter files: one regular expression per line, anchored at the start only
//! (`/etc/fstab` also matches `/etc/fstab.bak`; write `/etc/fstab$` for exactly that path).
//! Blank lines and lines starting with `#` are ignored; a line `!` inverts the filter (a
//! match then means "include"). A filtered path is left out of an image when it is built
//! and is never changed or deleted on a machine. No filter at all means a sparse image.

use std::collections::BTreeSet;

use regex::RegexSet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::tree::parent;

#[derive(Clone, Debug)]
pub struct Filter {
    lines: Vec<String>,
    invert: bool,
    set: RegexSet,
}

#[derive(Debug, thiserror::Error)]
#[error("filter line {line}: {text:?} is not a valid regular expression: {why}")]
pub struct FilterError {
    pub line: usize,
    pub text: String,
    pub why: String,
}

impl Filter {
    /// Parses a filter file.
    pub fn parse(text: &str) -> Result<Self, FilterError> {
        Self::from_lines(text.lines().map(str::to_string))
    }

    /// Builds a filter from its lines (comments and blank lines are dropped).
    pub fn from_lines(lines: impl IntoIterator<Item = String>) -> Result<Self, FilterError> {
        let mut kept = Vec::new();
        let mut invert = false;
        let mut numbered = Vec::new();
        for (n, raw) in lines.into_iter().enumerate() {
            let l = raw.trim_end_matches(['\r', '\n']);
            if l.trim().is_empty() || l.starts_with('#') {
                continue;
            }
            if l.trim() == "!" {
                invert = true;
                kept.push("!".to_string());
                continue;
            }
            regex::Regex::new(&format!("^(?:{l})")).map_err(|e| FilterError {
                line: n + 1,
                text: l.into(),
                why: e.to_string(),
            })?;
            numbered.push(format!("^(?:{l})"));
            kept.push(l.to_string());
        }
        let set = RegexSet::new(&numbered).map_err(|e| FilterError {
            line: 0,
            text: String::new(),
            why: e.to_string(),
        })?;
        Ok(Filter {
            lines: kept,
            invert,
            set,
        })
    }

    /// A filter that matches nothing (a full, non-sparse image with nothing filtered).
    pub fn empty() -> Self {
        Filter {
            lines: Vec::new(),
            invert: false,
            set: RegexSet::empty(),
        }
    }

    /// True when the path is filtered: left out of images, never touched on machines.
    pub fn matches(&self, path: &str) -> bool {
        self.set.is_match(path) != self.invert
    }

    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The directories that may hold a filtered path whether or not a scan shows one: the
    /// ancestors of each line's literal start (`/etc/paddock/subd(|/.*)$` → `/etc/paddock`,
    /// `/etc`; `/home/.*` → `/home`). subd leaves filtered paths out of its scans, so a
    /// directory holding only them looks empty; these must not be removed. An inverted filter
    /// names what is kept, so it says nothing here.
    pub fn holders(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        if self.invert {
            return out;
        }
        for line in &self.lines {
            let lit = literal_start(line);
            // `/home/`: /home itself holds what follows; `/etc/paddock/sub`: its parent.
            let mut q = match lit.strip_suffix('/') {
                Some(dir) if !dir.is_empty() => Some(dir),
                _ => parent(&lit),
            };
            while let Some(a) = q {
                if !a.starts_with('/') || !out.insert(a.to_string()) {
                    break;
                }
                q = parent(a);
            }
        }
        out
    }
}

/// The text a regular expression matches literally from its start: up to the first
/// metacharacter, an escaped punctuation mark taken as itself, and without a last character
/// that a `?`, `*` or `{` makes optional.
fn literal_start(re: &str) -> String {
    let mut out = String::new();
    let mut chars = re.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) if e.is_ascii_punctuation() => out.push(e),
                _ => break,
            },
            '?' | '*' | '{' => {
                out.pop();
                break;
            }
            '.' | '^' | '$' | '+' | '(' | ')' | '[' | ']' | '|' | '}' => break,
            c => out.push(c),
        }
    }
    out
}

impl PartialEq for Filter {
    fn eq(&self, other: &Self) -> bool {
        self.lines == other.lines
    }
}

impl Eq for Filter {}

impl Serialize for Filter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.lines.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Filter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Filter::from_lines(Vec::<String>::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_anchored_only() {
        let f = Filter::parse(
            "# logs\n/var/log/.*\n\n/etc/fstab\n/etc/hosts$\n/opt(|/.*)$\n.*\\.pyc\n",
        )
        .unwrap();
        assert!(f.matches("/var/log/syslog"));
        assert!(!f.matches("/var/log"), "`/var/log/.*` needs the slash");
        assert!(f.matches("/etc/fstab") && f.matches("/etc/fstab.bak"));
        assert!(f.matches("/etc/hosts") && !f.matches("/etc/hosts.allow"));
        assert!(f.matches("/opt") && f.matches("/opt/x") && !f.matches("/optional"));
        assert!(f.matches("/usr/lib/a.pyc"));
        assert!(!f.matches("/x/var/log/y"), "anchored at the start");
        assert_eq!(f.lines().len(), 5);
    }

    #[test]
    fn inverted() {
        let f = Filter::parse("!\n/etc/.*\n").unwrap();
        assert!(!f.matches("/etc/passwd"), "a match includes");
        assert!(f.matches("/usr/bin/ls"), "everything else is filtered");
        let back: Filter = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
        assert!(back.matches("/usr/bin/ls"));
    }

    #[test]
    fn the_holders_of_filtered_paths_are_the_ancestors_of_each_literal_start() {
        let f = Filter::parse(
            "/etc/paddock/subd(|/.*)$\n/etc/systemd/system/paddock-subd\\.service$\n/home/.*\n\
             /var/lib/paddock(|/.*)$\n/opt/ab?c\n.*\\.pyc\n/run/.*\n",
        )
        .unwrap();
        let want: BTreeSet<String> = [
            "/",
            "/etc",
            "/etc/paddock",
            "/etc/systemd",
            "/etc/systemd/system",
            "/home",
            "/opt",
            "/run",
            "/var",
            "/var/lib",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(f.holders(), want);
        assert_eq!(literal_start("/etc/x\\.y$"), "/etc/x.y");
        assert_eq!(literal_start("/opt/ab?c"), "/opt/a");
        assert_eq!(literal_start(".*"), "");
        assert!(Filter::parse("!\n/etc/.*\n").unwrap().holders().is_empty());
    }

    #[test]
    fn bad_regex_names_the_line() {
        let e = Filter::parse("/ok\n# c\n/bad(\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().contains("/bad("));
        assert!(!Filter::empty().matches("/anything"));
    }
}
