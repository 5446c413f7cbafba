//! Dominator's permitted-methods model: a certificate carries the `Service.Method` patterns its
//! holder may call, in an X.509 extension (OID 1.3.6.1.4.1.9586.100.7.1) whose value is a DER
//! `SEQUENCE OF` strings, each with exactly one `.`; groups travel the same way under
//! 1.3.6.1.4.1.9586.100.7.2. A call is allowed when one pattern glob-matches the method (Go's
//! `filepath.Match`: `*` any run of characters, `?` one). Pure: bytes in, values out.

/// The permitted-methods extension's OID.
pub const PERMITTED_METHODS_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 9586, 100, 7, 1];
/// The groups extension's OID.
pub const GROUPS_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 9586, 100, 7, 2];
/// The permitted-methods OID in dotted form (x509-parser's `to_id_string`).
pub const PERMITTED_METHODS_OID_STR: &str = "1.3.6.1.4.1.9586.100.7.1";
/// The groups OID in dotted form.
pub const GROUPS_OID_STR: &str = "1.3.6.1.4.1.9586.100.7.2";

/// More patterns than this in one certificate are refused.
pub const MAX_PATTERNS: usize = 256;
/// A longer pattern (or group name) is refused.
pub const MAX_PATTERN_BYTES: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodError {
    #[error("not a DER SEQUENCE OF strings: {0}")]
    Der(yasna::ASN1Error),
    #[error("more than {MAX_PATTERNS} entries")]
    TooMany,
    #[error("{0:?}: longer than {MAX_PATTERN_BYTES} bytes")]
    TooLong(String),
    #[error("{0:?}: a method pattern is Service.Method with exactly one '.'")]
    NotServiceMethod(String),
    #[error("{0:?}: only letters, digits, '_', '-', '*' and '?' may appear around the '.'")]
    BadCharacter(String),
    #[error("{0:?}: a group name is letters, digits, '.', '_' and '-'")]
    BadGroup(String),
}

/// Checks one pattern: `Service.Method`, exactly one `.`, both sides non-empty, from a small
/// alphabet (so a pattern can never be mistaken for anything but a glob).
pub fn check_pattern(p: &str) -> Result<(), MethodError> {
    if p.len() > MAX_PATTERN_BYTES {
        return Err(MethodError::TooLong(p.to_string()));
    }
    let Some((service, method)) = p.split_once('.') else {
        return Err(MethodError::NotServiceMethod(p.to_string()));
    };
    if service.is_empty() || method.is_empty() || method.contains('.') {
        return Err(MethodError::NotServiceMethod(p.to_string()));
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '?');
    if !service.chars().all(ok) || !method.chars().all(ok) {
        return Err(MethodError::BadCharacter(p.to_string()));
    }
    Ok(())
}

/// Checks a group name.
pub fn check_group(g: &str) -> Result<(), MethodError> {
    if g.len() > MAX_PATTERN_BYTES {
        return Err(MethodError::TooLong(g.to_string()));
    }
    if g.is_empty()
        || !g
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(MethodError::BadGroup(g.to_string()));
    }
    Ok(())
}

/// Go's `filepath.Match` for the characters a pattern may hold: `*` matches any run
/// (including `.`, which is not a path separator), `?` any one character.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The patterns a certificate or token grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions(Vec<String>);

impl Permissions {
    /// Patterns checked one by one; the first bad one is the error.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, MethodError> {
        if patterns.len() > MAX_PATTERNS {
            return Err(MethodError::TooMany);
        }
        let mut v = Vec::with_capacity(patterns.len());
        for p in patterns {
            check_pattern(p.as_ref())?;
            v.push(p.as_ref().to_string());
        }
        Ok(Permissions(v))
    }

    /// Comma-separated patterns, as `--methods` takes them (spaces around commas ignored).
    pub fn parse_list(list: &str) -> Result<Self, MethodError> {
        let v: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        Self::new(&v)
    }

    /// Whether some pattern matches `method` (`Service.Method`).
    pub fn allows(&self, method: &str) -> bool {
        self.0.iter().any(|p| glob_match(p, method))
    }

    pub fn patterns(&self) -> &[String] {
        &self.0
    }

    /// Whether everything `pattern` may match is something these permissions allow: a
    /// holder may hand out no more than it has. Decided part by part (service, method):
    /// a part of ours that is `*`, the same text, or a glob matching a wildcard-free part.
    /// Conservative: a subset it cannot prove (`Get*` under `G*`) is refused.
    pub fn covers(&self, pattern: &str) -> bool {
        let Some((svc, method)) = pattern.split_once('.') else {
            return false;
        };
        let part = |ours: &str, theirs: &str| {
            ours == "*"
                || ours == theirs
                || (!theirs.contains(['*', '?']) && glob_match(ours, theirs))
        };
        self.0.iter().any(|own| {
            own.split_once('.')
                .is_some_and(|(s, m)| part(s, svc) && part(m, method))
        })
    }

    /// Whether every pattern of `other` is covered.
    pub fn covers_all(&self, other: &Permissions) -> bool {
        other.0.iter().all(|p| self.covers(p))
    }
}

/// The extension's value: a DER `SEQUENCE OF UTF8String`.
pub fn encode_strings<S: AsRef<str>>(items: &[S]) -> Vec<u8> {
    yasna::construct_der(|w| {
        w.write_sequence_of(|w| {
            for s in items {
                w.next().write_utf8_string(s.as_ref());
            }
        })
    })
}

/// Parses a `SEQUENCE OF` UTF8String, PrintableString or IA5String (Go's `asn1.Marshal` of
/// a `[]string` writes PrintableString where it can). Nothing may follow the sequence.
pub fn decode_strings(der: &[u8]) -> Result<Vec<String>, MethodError> {
    use yasna::tags::{TAG_IA5STRING, TAG_PRINTABLESTRING, TAG_UTF8STRING};
    let mut out = Vec::new();
    // yasna's callbacks can only fail with its own error: ours waits here, and the
    // callback stops the parse with an `Invalid` that is never reported.
    let mut refused = None;
    let parsed = yasna::parse_der(der, |r| {
        r.read_sequence_of(|r| {
            let s = match r.lookahead_tag()? {
                TAG_UTF8STRING => r.read_utf8string()?,
                TAG_PRINTABLESTRING => r.read_printable_string()?,
                TAG_IA5STRING => r.read_ia5_string()?,
                _ => return Err(yasna::ASN1Error::new(yasna::ASN1ErrorKind::Invalid)),
            };
            if out.len() == MAX_PATTERNS {
                refused = Some(MethodError::TooMany);
            } else if s.len() > MAX_PATTERN_BYTES {
                refused = Some(MethodError::TooLong(s.chars().take(40).collect()));
            } else {
                out.push(s);
                return Ok(());
            }
            Err(yasna::ASN1Error::new(yasna::ASN1ErrorKind::Invalid))
        })
    });
    match (refused, parsed) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(MethodError::Der(e)),
        (None, Ok(())) => Ok(out),
    }
}

/// The permitted-methods extension's value → checked permissions.
pub fn parse_permitted_methods(der: &[u8]) -> Result<Permissions, MethodError> {
    Permissions::new(&decode_strings(der)?)
}

/// The groups extension's value → checked group names.
pub fn parse_groups(der: &[u8]) -> Result<Vec<String>, MethodError> {
    let v = decode_strings(der)?;
    for g in &v {
        check_group(g)?;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_is_filepath_match() {
        for (p, m, want) in [
            ("Subd.*", "Subd.Poll", true),
            ("Subd.*", "Subd.Update", true),
            ("Subd.*", "ImageServer.GetImage", false),
            ("*.*", "Images.Delete", true),
            ("*.Get*", "Nodes.GetNode", true),
            ("*.Get*", "Nodes.List", false),
            ("Subd.Poll", "Subd.Poll", true),
            ("Subd.Poll", "Subd.PollX", false),
            ("Sub?.Poll", "Subd.Poll", true),
            ("Subd.*", "Subd.", true),
            ("*", "Subd.Poll", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ] {
            assert_eq!(glob_match(p, m), want, "{p} {m}");
        }
    }

    #[test]
    fn patterns_need_exactly_one_dot() {
        assert!(check_pattern("Subd.*").is_ok());
        assert!(check_pattern("*.*").is_ok());
        for bad in [
            "Subd",
            "Subd.Poll.X",
            ".Poll",
            "Subd.",
            "Su bd.Poll",
            "Subd.[a]",
            "",
        ] {
            assert!(check_pattern(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encode_then_decode() {
        let v = vec!["Subd.*".to_string(), "ImageServer.GetImage".to_string()];
        let der = encode_strings(&v);
        assert_eq!(decode_strings(&der).unwrap(), v);
        let p = parse_permitted_methods(&der).unwrap();
        assert!(p.allows("Subd.Update"));
        assert!(p.allows("ImageServer.GetImage"));
        assert!(!p.allows("ImageServer.DeleteImage"));
        // Long form lengths.
        let many: Vec<String> = (0..40).map(|i| format!("Svc{i}.Method{i}")).collect();
        assert_eq!(decode_strings(&encode_strings(&many)).unwrap(), many);
    }

    #[test]
    fn go_printable_strings_decode() {
        // asn1.Marshal([]string{"Subd.*"}) in Go: SEQUENCE { PrintableString "Subd.*" }
        // ('*' is not printable, so Go writes UTF8String; '.' alone would be printable).
        let der = [
            0x30, 0x0b, 0x13, 0x09, b'S', b'u', b'b', b'd', b'.', b'P', b'o', b'l', b'l',
        ];
        assert_eq!(decode_strings(&der).unwrap(), vec!["Subd.Poll"]);
    }

    #[test]
    fn bad_der_is_an_error() {
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x80],
            &[0x30, 0x05, 0x0c, 0x01],
            &[0x31, 0x00],
            &[0x30, 0x02, 0x02, 0x00],
            &[0x30, 0x00, 0x00],
            &[0x30, 0x81, 0x01, 0x00],
            &[0x30, 0x03, 0x0c, 0x01, 0xff],
        ] {
            assert!(decode_strings(bad).is_err(), "{bad:?}");
        }
        assert_eq!(decode_strings(&[0x30, 0x00]).unwrap(), Vec::<String>::new());
        // Well-formed, but not a method pattern.
        assert!(parse_permitted_methods(&encode_strings(&["Subd"])).is_err());
    }

    #[test]
    fn strings_round_trip() {
        for v in [
            vec![],
            vec!["Subd.*".to_string()],
            vec![
                "é.ü".to_string(),
                String::new(),
                "x".repeat(MAX_PATTERN_BYTES),
            ],
            (0..MAX_PATTERNS).map(|i| format!("S{i}.M")).collect(),
        ] {
            let der = encode_strings(&v);
            assert_eq!(decode_strings(&der).unwrap(), v, "{der:?}");
        }
    }

    #[test]
    fn trailing_bytes_wrong_tags_and_limits_are_refused() {
        let good = encode_strings(&["Subd.Poll"]);
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(
            decode_strings(&trailing),
            Err(MethodError::Der(_))
        ));
        // A SET, not a SEQUENCE.
        let mut set = good.clone();
        set[0] = 0x31;
        assert!(matches!(decode_strings(&set), Err(MethodError::Der(_))));
        // Elements that are not strings: an OCTET STRING, an INTEGER, a BMPString.
        for tag in [0x04, 0x02, 0x1e] {
            let mut element = good.clone();
            element[2] = tag;
            assert!(
                matches!(decode_strings(&element), Err(MethodError::Der(_))),
                "{tag:#x}"
            );
        }
        let many: Vec<String> = (0..=MAX_PATTERNS).map(|i| format!("S{i}.M")).collect();
        assert_eq!(
            decode_strings(&encode_strings(&many)),
            Err(MethodError::TooMany)
        );
        let long = "x".repeat(MAX_PATTERN_BYTES + 1);
        assert_eq!(
            decode_strings(&encode_strings(&[&long])),
            Err(MethodError::TooLong("x".repeat(40)))
        );
    }

    #[test]
    fn a_holder_hands_out_no_more_than_it_has() {
        let p = |l: &str| Permissions::parse_list(l).unwrap();
        let admin = p("*.*");
        let tokens = p("Tokens.*,Nodes.Get,*.List*");
        for (want, by_admin, by_tokens) in [
            ("Nodes.Get", true, true),
            ("Tokens.Create", true, true),
            ("Nodes.List", true, true),
            ("Images.ListAll", true, true),
            ("*.List*", true, true),
            ("Nodes.*", true, false),
            ("*.*", true, false),
            ("Nodes.Get*", true, false),
            ("Nodes.Patch", true, false),
        ] {
            assert_eq!(admin.covers(want), by_admin, "admin {want}");
            assert_eq!(tokens.covers(want), by_tokens, "tokens {want}");
        }
        assert!(admin.covers_all(&tokens));
        assert!(!tokens.covers_all(&admin));
    }
}
