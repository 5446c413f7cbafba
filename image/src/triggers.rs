//! Dominator's trigger files: a JSON array of `{MatchLines, Service, SortName, DoReboot,
//! DoReload, HighImpact}`. Lines starting with `#`, `//` or `!` are comments. Match lines
//! are start-anchored regular expressions, as in filters.

use regex::RegexSet;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Trigger {
    pub match_lines: Vec<String>,
    pub service: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sort_name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub do_reboot: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub do_reload: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub high_impact: bool,
}

/// The triggers of an image, compiled for matching.
#[derive(Clone, Debug, Default)]
pub struct Triggers {
    list: Vec<Trigger>,
    sets: Vec<RegexSet>,
}

#[derive(Debug, thiserror::Error)]
pub enum TriggersError {
    #[error("trigger file is not a JSON array of triggers: {0}")]
    Json(String),
    #[error(
        "trigger {index} ({service:?}): match line {line:?} is not a valid regular expression: {why}"
    )]
    Regex {
        index: usize,
        service: String,
        line: String,
        why: String,
    },
    #[error("trigger {0} has no Service")]
    NoService(usize),
}

impl Triggers {
    /// Parses a trigger file (comment lines allowed).
    pub fn parse(text: &str) -> Result<Self, TriggersError> {
        let json: String = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                !(t.starts_with('#') || t.starts_with("//") || t.starts_with('!'))
            })
            .collect::<Vec<_>>()
            .join("\n");
        let list: Vec<Trigger> =
            serde_json::from_str(&json).map_err(|e| TriggersError::Json(e.to_string()))?;
        Self::new(list)
    }

    pub fn new(list: Vec<Trigger>) -> Result<Self, TriggersError> {
        let mut sets = Vec::with_capacity(list.len());
        for (index, t) in list.iter().enumerate() {
            if t.service.trim().is_empty() {
                return Err(TriggersError::NoService(index));
            }
            let anchored: Vec<String> = t.match_lines.iter().map(|l| format!("^(?:{l})")).collect();
            for (l, a) in t.match_lines.iter().zip(&anchored) {
                regex::Regex::new(a).map_err(|e| TriggersError::Regex {
                    index,
                    service: t.service.clone(),
                    line: l.clone(),
                    why: e.to_string(),
                })?;
            }
            sets.push(RegexSet::new(&anchored).map_err(|e| TriggersError::Regex {
                index,
                service: t.service.clone(),
                line: String::new(),
                why: e.to_string(),
            })?);
        }
        Ok(Triggers { list, sets })
    }

    pub fn list(&self) -> &[Trigger] {
        &self.list
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The triggers any of these paths match, in the order they run: by `SortName` (or
    /// `Service` when it has none), comparing digit runs as numbers (version sort).
    pub fn matching<'a>(&self, paths: impl IntoIterator<Item = &'a str>) -> Vec<&Trigger> {
        let mut hit = vec![false; self.list.len()];
        for p in paths {
            for (i, s) in self.sets.iter().enumerate() {
                if !hit[i] && s.is_match(p) {
                    hit[i] = true;
                }
            }
        }
        let mut out: Vec<&Trigger> = self
            .list
            .iter()
            .zip(hit)
            .filter_map(|(t, h)| h.then_some(t))
            .collect();
        out.sort_by(|a, b| version_cmp(sort_key(a), sort_key(b)));
        out
    }

    /// Dominator's merge of old and new triggers (used for the stop phase of an update):
    /// keyed on (Service, DoReload), MatchLines unioned, DoReboot and HighImpact ORed.
    pub fn merge(&self, other: &Triggers) -> Triggers {
        let mut out: Vec<Trigger> = Vec::new();
        for t in self.list.iter().chain(other.list.iter()) {
            match out
                .iter_mut()
                .find(|o| o.service == t.service && o.do_reload == t.do_reload)
            {
                Some(o) => {
                    for l in &t.match_lines {
                        if !o.match_lines.contains(l) {
                            o.match_lines.push(l.clone());
                        }
                    }
                    o.do_reboot |= t.do_reboot;
                    o.high_impact |= t.high_impact;
                    if o.sort_name.is_empty() {
                        o.sort_name = t.sort_name.clone();
                    }
                }
                None => out.push(t.clone()),
            }
        }
        // Both inputs compiled, so their union does.
        Triggers::new(out).unwrap_or_default()
    }
}

impl PartialEq for Triggers {
    fn eq(&self, other: &Self) -> bool {
        self.list == other.list
    }
}

impl Eq for Triggers {}

impl Serialize for Triggers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.list.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Triggers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Triggers::new(Vec::<Trigger>::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

fn sort_key(t: &Trigger) -> &str {
    if t.sort_name.is_empty() {
        &t.service
    } else {
        &t.sort_name
    }
}

/// Version order: digit runs compare as numbers, everything else byte by byte.
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, _) => return std::cmp::Ordering::Less,
            (_, None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let na = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let nb = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let da = trim_zeros(&a[..na]);
                let db = trim_zeros(&b[..nb]);
                let o = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
                if o != std::cmp::Ordering::Equal {
                    return o;
                }
                a = &a[na..];
                b = &b[nb..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|c| **c == b'0').count();
    &d[n.min(d.len().saturating_sub(1))..]
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESIGN_DOC: &str = r#"# the design document's example, without its trailing comma
[ {"MatchLines": ["/etc/ssh/.*"], "Service": "ssh", "DoReload": true},
  // sshd itself restarts the service
  {"MatchLines": ["/usr/sbin/sshd"], "Service": "ssh"},
  {"MatchLines": ["/lib/modules/.*", "/boot/vmlinuz-.*"], "Service": "kernel-upgrade",
   "DoReboot": true, "HighImpact": true} ]
"#;

    #[test]
    fn parses_dominator_files_with_comments() {
        let t = Triggers::parse(DESIGN_DOC).unwrap();
        assert_eq!(t.list().len(), 3);
        assert!(t.list()[0].do_reload && t.list()[2].do_reboot && t.list()[2].high_impact);
        let m = t.matching(["/etc/ssh/sshd_config"]);
        assert_eq!(m.len(), 1);
        assert!(m[0].do_reload);
        let m = t.matching(["/boot/vmlinuz-6.1", "/usr/sbin/sshd", "/etc/motd"]);
        let names: Vec<&str> = m.iter().map(|t| t.service.as_str()).collect();
        assert_eq!(names, vec!["kernel-upgrade", "ssh"]);
        assert!(
            t.matching(["/x/etc/ssh/y"]).is_empty(),
            "anchored at the start"
        );
        let back: Triggers = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn errors_are_clear() {
        assert!(matches!(
            Triggers::parse("[{\"MatchLines\": [\"/a\"]}]"),
            Err(TriggersError::Json(_))
        ));
        assert!(matches!(
            Triggers::parse("[{\"MatchLines\": [\"/a\"], \"Service\": \"\"}]"),
            Err(TriggersError::NoService(0))
        ));
        let e = Triggers::parse("[{\"MatchLines\": [\"/a(\"], \"Service\": \"x\"}]").unwrap_err();
        assert!(
            e.to_string().contains("\"x\"") && e.to_string().contains("/a("),
            "{e}"
        );
        assert!(matches!(Triggers::parse("{}"), Err(TriggersError::Json(_))));
    }

    #[test]
    fn merge_and_sort() {
        let old = Triggers::parse(r#"[{"MatchLines": ["/a"], "Service": "s"}, {"MatchLines": ["/r"], "Service": "s", "DoReload": true}]"#).unwrap();
        let new = Triggers::parse(r#"[{"MatchLines": ["/b"], "Service": "s", "HighImpact": true}, {"MatchLines": ["/c"], "Service": "t"}]"#).unwrap();
        let m = old.merge(&new);
        assert_eq!(m.list().len(), 3);
        assert_eq!(m.list()[0].match_lines, vec!["/a", "/b"]);
        assert!(m.list()[0].high_impact);
        assert!(m.list()[1].do_reload);
        assert_eq!(version_cmp("svc10", "svc9"), std::cmp::Ordering::Greater);
        assert_eq!(version_cmp("a2b", "a02b"), std::cmp::Ordering::Equal);
        assert_eq!(version_cmp("a", "b"), std::cmp::Ordering::Less);
    }
}
