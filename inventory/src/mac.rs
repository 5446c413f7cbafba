//! Ethernet hardware addresses, written `aa:bb:cc:dd:ee:ff` everywhere Paddock shows or parses one.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{input:?} is not a MAC address; write six hex pairs like 52:54:00:12:34:56")]
pub struct MacParseError {
    input: String,
}

impl MacAddr {
    /// The first six bytes of a DHCP `chaddr`, if it is long enough.
    pub fn from_chaddr(chaddr: &[u8]) -> Option<Self> {
        chaddr.get(..6)?.try_into().ok().map(MacAddr)
    }

    /// Lower-case hex without separators (`525400123456`), for keys and file names.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = MacParseError;

    /// Accepts `aa:bb:cc:dd:ee:ff`, `aa-bb-cc-dd-ee-ff` and `aabbccddeeff`, any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacParseError {
            input: s.chars().take(64).collect(),
        };
        let hex: String = if s.len() == 17 {
            let bytes = s.as_bytes();
            let sep = bytes[2];
            if !(sep == b':' || sep == b'-') || (2..17).step_by(3).any(|i| bytes[i] != sep) {
                return Err(err());
            }
            s.split(sep as char).collect()
        } else if s.len() == 12 {
            s.to_string()
        } else {
            return Err(err());
        };
        let mut out = [0u8; 6];
        for (i, o) in out.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).ok_or_else(err)?;
            if !pair.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err());
            }
            *o = u8::from_str_radix(pair, 16).map_err(|_| err())?;
        }
        Ok(MacAddr(out))
    }
}

impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_spellings() {
        let m = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0xab]);
        for s in ["52:54:00:12:34:ab", "52-54-00-12-34-AB", "5254001234ab"] {
            assert_eq!(s.parse::<MacAddr>().unwrap(), m, "{s}");
        }
        assert_eq!(m.to_string(), "52:54:00:12:34:ab");
        assert_eq!(m.to_hex(), "5254001234ab");
    }

    #[test]
    fn rejects_everything_else() {
        for s in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:zz",
            "52:54-00:12:34:ab",
            "5254001234a",
            "+2:54:00:12:34:ab",
            "52:54:00:12:34:ab:",
            "é2:54:00:12:34:a",
            "52545400123é",
        ] {
            assert!(s.parse::<MacAddr>().is_err(), "{s:?} parsed");
        }
    }
}
