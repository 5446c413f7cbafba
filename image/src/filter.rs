//! Dominator's filter files: one regular expression per line, anchored at the start only
//! (`/etc/fstab` also matches `/etc/fstab.bak`; write `/etc/fstab$` for exactly that path).
//! Blank lines and lines starting with `#` are ignored; a line `!` inverts the filter (a
//! match then means "include"). A filtered path is left out of an image when it is built
//! and is never changed or deleted on a machine. No filter at all means a sparse image.

use regex::RegexSet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
    fn bad_regex_names_the_line() {
        let e = Filter::parse("/ok\n# c\n/bad(\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().contains("/bad("));
        assert!(!Filter::empty().matches("/anything"));
    }
}
