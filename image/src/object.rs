//! Object ids and the on-disk layout shared by the image server's store and subd's cache.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The SHA-512 of an object's bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId(pub [u8; 64]);

/// SHA-512 over an object's bytes as they stream past: what subd hashes at a fetch, a scan
/// or an update, and the image server at an ingest.
///
/// ring's implementation rather than the `sha2` crate's: on a CPU without AVX2 (the lab's
/// emulated guests, older servers) ring's assembly hashes about 1.9× faster (310 against 167
/// MiB/s under QEMU's TCG with its default CPU model); with AVX2 the two are equal.
pub struct ObjectHasher(ring::digest::Context);

impl ObjectHasher {
    pub fn new() -> Self {
        ObjectHasher(ring::digest::Context::new(&ring::digest::SHA512))
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> ObjectId {
        let digest = self.0.finish();
        let mut id = [0u8; 64];
        id.copy_from_slice(digest.as_ref());
        ObjectId(id)
    }
}

impl Default for ObjectHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ObjectId {
    pub fn of(bytes: &[u8]) -> Self {
        let mut h = ObjectHasher::new();
        h.update(bytes);
        h.finish()
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

    #[test]
    fn a_streamed_hash_is_the_sha512_of_the_whole() {
        // sha512sum of nothing
        assert!(
            ObjectHasher::new()
                .finish()
                .to_string()
                .starts_with("cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce")
        );
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut h = ObjectHasher::new();
        for piece in bytes.chunks(4_099) {
            h.update(piece);
        }
        assert_eq!(h.finish(), ObjectId::of(&bytes));
        assert_ne!(ObjectId::of(&bytes[1..]), ObjectId::of(&bytes));
    }
}
