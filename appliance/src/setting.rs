//! Reading a configuration file's values. A value that does not parse adds a problem naming
//! its setting and is left out, so that one `config check` lists every mistake at once. A
//! leaf: the configuration module and the domains that define their own sections use it.

use std::str::FromStr;

/// `text` (trimmed) parsed, or a problem `what: "text": why`.
pub fn parse<T: FromStr>(p: &mut Vec<String>, what: &str, text: &str) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    match text.trim().parse() {
        Ok(v) => Some(v),
        Err(e) => {
            p.push(format!("{what}: {text:?}: {e}"));
            None
        }
    }
}

/// Each of `texts` parsed, the problems named `what[i]`.
pub fn parse_each<T: FromStr>(p: &mut Vec<String>, what: &str, texts: &[String]) -> Vec<T>
where
    T::Err: std::fmt::Display,
{
    texts
        .iter()
        .enumerate()
        .filter_map(|(i, t)| parse(p, &format!("{what}[{i}]"), t))
        .collect()
}

/// Each of `texts` a `START-END` range with both ends parsed, the problems named `what[i]`;
/// `like` is an example for the problem.
pub fn ranges<T: FromStr>(
    p: &mut Vec<String>,
    what: &str,
    texts: &[String],
    like: &str,
) -> Vec<(T, T)>
where
    T::Err: std::fmt::Display,
{
    let mut ranges = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let what = format!("{what}[{i}]");
        let Some((a, b)) = text.split_once('-') else {
            p.push(format!("{what}: {text:?} is not a range like {like}"));
            continue;
        };
        if let (Some(start), Some(end)) = (parse(p, &what, a), parse(p, &what, b)) {
            ranges.push((start, end));
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn each_bad_value_is_a_problem_named_by_its_setting() {
        let mut p = Vec::new();
        assert_eq!(parse::<u16>(&mut p, "port", " 67 "), Some(67));
        let texts = ["198.18.0.1".to_string(), "x".into(), "198.18.0.3".into()];
        let ips: Vec<Ipv4Addr> = parse_each(&mut p, "dns", &texts);
        assert_eq!(ips.len(), 2);
        let texts = [
            "198.18.0.9-198.18.0.20".to_string(),
            "nonsense".into(),
            "1.2.3.4-y".into(),
        ];
        let pools: Vec<(Ipv4Addr, Ipv4Addr)> = ranges(&mut p, "pools", &texts, "A-B");
        let last_octets = pools.iter().map(|(a, b)| (a.octets()[3], b.octets()[3]));
        assert_eq!(last_octets.collect::<Vec<_>>(), [(9, 20)]);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("dns[1]: \"x\": "), "{p:?}");
        assert_eq!(p[1], "pools[1]: \"nonsense\" is not a range like A-B");
        assert!(p[2].starts_with("pools[2]: \"y\": "), "{p:?}");
    }
}
