//! Object ids and the on-disk layout shared by the image server's store and subd's cache.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha512};

/// The SHA-512 of an object's bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId(pub [u8; 64]);

impl ObjectId {
    pub fn of(bytes: &[u8]) -> Self {
        ObjectId(Sha512::digest(bytes).into())
    }

    pub fn from_hasher(h: Sha512) -> Self {
        ObjectId(h.finalize().into())
    }

    /// The object's path under a cache or store root: `xx/yy/<124 hex digits>`.
    pub fn path(&self) -> String {
        let hex = hex::encode(self.0);
        format!("{}/{}/{}", &hex[0..2], &hex[2..4], &hex[4..])
    }

    /// Parses a path made by [`ObjectId::path`] (relative to the root). Names ending in `~`
    /// (temporary) or with a `~N~` copy suffix are not objects.
    pub fn from_path(rel: &str) -> Option<Self> {
        let mut parts = rel.split('/');
        let (a, b, c) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || a.len() != 2 || b.len() != 2 || c.len() != 124 {
            return None;
        }
        format!("{a}{b}{c}").parse().ok()
    }

    /// Short form for logs and listings.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..8])
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.short())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not an object id (128 lower-case hex digits): {0:?}")]
pub struct BadObjectId(pub String);

impl FromStr for ObjectId {
    type Err = BadObjectId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadObjectId(s.chars().take(140).collect());
        if s.len() != 128 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(bad());
        }
        let mut id = [0u8; 64];
        hex::decode_to_slice(s, &mut id).map_err(|_| bad())?;
        Ok(ObjectId(id))
    }
}

impl Serialize for ObjectId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ObjectId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips() {
        let id = ObjectId::of(b"hello\n");
        // sha512sum of "hello\n"
        assert!(
            id.to_string()
                .starts_with("e7c22b994c59d9cf2b48e549b1e24666636045930d3da7c1acb299d1c3b7f931")
        );
        let p = id.path();
        assert_eq!(&p[0..6], "e7/c2/");
        assert_eq!(p.len(), 2 + 1 + 2 + 1 + 124);
        assert_eq!(ObjectId::from_path(&p), Some(id));
        assert_eq!(ObjectId::from_path(&format!("{p}~")), None);
        assert_eq!(ObjectId::from_path(&format!("{p}~1~")), None);
        assert_eq!(ObjectId::from_path("e7/c2"), None);
        assert!("E7".repeat(64).parse::<ObjectId>().is_err());
        assert!("zz".repeat(64).parse::<ObjectId>().is_err());
        let j = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<ObjectId>(&j).unwrap(), id);
    }
}
