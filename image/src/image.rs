//! An image (a tree, its filter and triggers, and who made it when) and the MDB, the list of
//! machines and the images they must run, in Dominator's JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::filter::Filter;
use crate::tree::FileSystem;
use crate::triggers::Triggers;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    pub name: String,
    pub fs: FileSystem,
    /// `None`: a sparse image (never deletes what it does not name).
    #[serde(default)]
    pub filter: Option<Filter>,
    #[serde(default)]
    pub triggers: Triggers,
    pub created_on_ms: i64,
    #[serde(default)]
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

impl Image {
    /// An image of `fs` with no triggers, made by no one at the epoch and never expiring: all
    /// that planning needs, so tests, fuzzers and benches build theirs this way.
    pub fn new(name: impl Into<String>, fs: FileSystem, filter: Option<Filter>) -> Image {
        Image {
            name: name.into(),
            fs,
            filter,
            triggers: Triggers::default(),
            created_on_ms: 0,
            created_by: String::new(),
            expires_at_ms: None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad image name {0:?}: use letters, digits and . _ - + @ in /-separated parts (no leading /, no . or .. parts, at most 255 bytes)"
)]
pub struct BadImageName(pub String);

/// Image names are POSIX-like paths (`debian/minbase.1`), usable as file names below the
/// image directory.
pub fn check_name(name: &str) -> Result<(), BadImageName> {
    check_bounded(
        name,
        |name| {
            name.split('/').all(|p| {
                !p.is_empty()
                    && p != "."
                    && p != ".."
                    && !p.starts_with('.')
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-+@".contains(&b))
            })
        },
        BadImageName,
    )
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad name {0:?}: use only letters, digits and - . _ ~ (RFC 3986 unreserved characters, as Ironic), 1 to 255 of them"
)]
pub struct BadName(pub String);

/// Ironic's logical names (`api_utils.is_valid_logical_name`): 1–255 RFC 3986 unreserved
/// characters. Node names and MDB hostnames both follow it, so a name can never carry a
/// newline, `${…}`, `#`, `||` or a space into a boot script, a shell or a URL.
pub fn check_logical_name(name: &str) -> Result<(), BadName> {
    check_bounded(
        name,
        |name| {
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        },
        BadName,
    )
}

/// `Ok` for a name of 1 to 255 bytes that `valid` accepts, else `bad` of the name clipped to
/// 300 characters (an error message never carries a name of any length).
fn check_bounded<E>(
    name: &str,
    valid: impl FnOnce(&str) -> bool,
    bad: fn(String) -> E,
) -> Result<(), E> {
    if !name.is_empty() && name.len() <= 255 && valid(name) {
        Ok(())
    } else {
        Err(bad(name.chars().take(300).collect()))
    }
}

/// One machine in the MDB. Unknown fields are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Machine {
    pub hostname: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip_address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub required_image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub planned_image: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_updates: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// The MDB: machines by hostname.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mdb {
    pub machines: BTreeMap<String, Machine>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MdbError {
    #[error("MDB is not a JSON array of machines: {0}")]
    Json(String),
    #[error("MDB machine {0} has no Hostname")]
    NoHostname(usize),
    #[error("MDB names {0:?} twice")]
    Duplicate(String),
    #[error("MDB machine {0}: hostname {1}")]
    BadHostname(usize, BadName),
}

impl Mdb {
    pub fn parse(json: &str) -> Result<Self, MdbError> {
        let list: Vec<Machine> =
            serde_json::from_str(json).map_err(|e| MdbError::Json(e.to_string()))?;
        Self::from_machines(list)
    }

    pub fn from_machines(list: Vec<Machine>) -> Result<Self, MdbError> {
        let mut machines = BTreeMap::new();
        for (i, m) in list.into_iter().enumerate() {
            if m.hostname.trim().is_empty() {
                return Err(MdbError::NoHostname(i));
            }
            check_logical_name(&m.hostname).map_err(|e| MdbError::BadHostname(i, e))?;
            let h = m.hostname.clone();
            if machines.insert(h.clone(), m).is_some() {
                return Err(MdbError::Duplicate(h));
            }
        }
        Ok(Mdb { machines })
    }

    /// Dominator's JSON, one machine per line, in hostname order.
    pub fn to_json(&self) -> String {
        let mut s = String::from("[\n");
        let n = self.machines.len();
        for (i, m) in self.machines.values().enumerate() {
            s.push_str("  ");
            s.push_str(&serde_json::to_string(m).unwrap_or_default());
            if i + 1 < n {
                s.push(',');
            }
            s.push('\n');
        }
        s.push_str("]\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["minbase", "debian/minbase.1", "a-b_c+d@e"] {
            check_name(ok).unwrap();
        }
        for bad in [
            "",
            "/abs",
            "a//b",
            "a/../b",
            "..",
            ".hidden",
            "a b",
            "x/",
            &"a".repeat(256),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mdb_is_dominators_json() {
        // The design document's example, plus a field Paddock does not know.
        let text = r#"[ {"Hostname": "mailhost", "RequiredImage": "mail.0", "PlannedImage": "mail.1"},
  {"Hostname": "compute0", "IpAddress": "10.0.0.5", "RequiredImage": "ubuntu-14.04",
   "DisableUpdates": false, "OwnerGroups": ["ops"], "Tags": {"DisableSafetyCheck": ""},
   "Location": "rack 4"} ]"#;
        let m = Mdb::parse(text).unwrap();
        assert_eq!(m.machines.len(), 2);
        assert_eq!(m.machines["compute0"].ip_address, "10.0.0.5");
        assert_eq!(m.machines["compute0"].tags["DisableSafetyCheck"], "");
        assert_eq!(m.machines["mailhost"].planned_image, "mail.1");
        assert_eq!(Mdb::parse(&m.to_json()).unwrap(), m);
        assert!(matches!(Mdb::parse("{}"), Err(MdbError::Json(_))));
        assert!(matches!(
            Mdb::parse("[{\"RequiredImage\": \"x\"}]"),
            Err(MdbError::Json(_))
        ));
        assert!(matches!(
            Mdb::parse("[{\"Hostname\": \" \"}]"),
            Err(MdbError::NoHostname(0))
        ));
        assert!(matches!(
            Mdb::parse("[{\"Hostname\": \"a\"}, {\"Hostname\": \"a\"}]"),
            Err(MdbError::Duplicate(_))
        ));
        assert!(matches!(
            Mdb::parse("[{\"Hostname\": \"ok\"}, {\"Hostname\": \"r1\\nshell\"}]"),
            Err(MdbError::BadHostname(1, _))
        ));
    }

    #[test]
    fn logical_names_are_ironics() {
        for ok in ["r1u7", "rack-1.u_7~b", "A", &"a".repeat(255)] {
            check_logical_name(ok).unwrap();
        }
        for bad in [
            "",
            "r1\nshell\n#",
            "r1${net0/mac}",
            "r1#x",
            "a||b",
            "a b",
            "a/b",
            "a%20",
            "é",
            &"a".repeat(256),
        ] {
            let e = check_logical_name(bad).unwrap_err();
            assert!(
                e.to_string().contains("RFC 3986 unreserved"),
                "{bad:?}: {e}"
            );
        }
    }
}
