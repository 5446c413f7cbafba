//! The role spec: its TOML format, parsed and validated whole before anything runs.
//!
//! ```toml
//! [args]                       # global hook arguments (BlacKnight's /blacknight/args)
//! p = "head-1"
//!
//! [roles.node_controller]
//! min = 1                      # default 0
//! max = 8                      # absent: unbounded
//! priority = 10                # growth order in phase 2 (higher first), default 0
//! start = { hook = "sim/start_nc.sh", args = ["h"] }
//! stop = { hook = "sim/stop_nc.sh", args = ["h", "i"] }
//! disrupt = { hook = "may_reboot.sh", args = ["h"] }   # may its host be disrupted now? (exit 0: yes)
//! image = "minbase"            # only for roles that run on a host (no `depends`)
//! hosts = { traits = ["CUSTOM_NC"], properties = { cpu_arch = "x86_64" }, names = [] }
//! dns = { ports = [8080, { port = 8443, priority = 10, weight = 5 }] }   # SRV records
//! update = { max_parallel = 2, canary = 1 }   # how a changed image or version rolls out
//!
//! [roles.cache]
//! version = "7.2"              # a hook role's version: its hooks' `v`/`version` argument
//!
//! [roles.app]
//! min = 3
//! depends = { node_controller = 2, db = 10 }   # one dependee instance serves N dependers
//! vars = { port = 8080 }       # its files' variables
//! files = [{ path = "/etc/app/peers", template = "app/peers.j2", mode = "0640" }]
//!
//! [vars]                       # every template's variables
//! cluster = "paddock"
//!
//! [hosts.h01]                  # a host's variables, and per role
//! vars = { rack = "r1" }
//! roles = { app = { weight = 2 } }
//!
//! [[files]]                    # computed files every machine has
//! path = "/etc/motd"
//! template = "motd.j2"
//! ```
//!
//! Every error names the file, the line and the field.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use toml::Spanned;

pub use crate::model::{DnsPort, FileSpec, Hook, Role, Selector, Spec};

/// One problem in a spec file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecError {
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// The dotted path of the field (`roles.app.depends.db`), or the key found on the line
    /// for a syntax error.
    pub field: String,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        } else {
            write!(
                f,
                "{}:{}: {}: {}",
                self.file, self.line, self.field, self.message
            )
        }
    }
}

/// Every problem found in a spec file (at least one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub struct SpecErrors(pub Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    args: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    roles: BTreeMap<String, Spanned<RawRole>>,
    #[serde(default)]
    vars: toml::Table,
    #[serde(default)]
    hosts: BTreeMap<String, Spanned<RawHost>>,
    #[serde(default)]
    files: Vec<Spanned<RawFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    #[serde(default)]
    vars: toml::Table,
    #[serde(default)]
    roles: BTreeMap<String, toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    /// One source: a template, the MDB entry, or a program.
    template: Option<String>,
    #[serde(default)]
    mdb: bool,
    program: Option<String>,
    /// How long a program's output holds (none: until the machine's data changes).
    valid_secs: Option<u64>,
    /// Octal, as a string (`"0644"`).
    mode: Option<String>,
    uid: Option<u32>,
    gid: Option<u32>,
    /// Run on the machine against the new content before it replaces the old.
    check: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    min: Option<Spanned<i64>>,
    max: Option<Spanned<i64>>,
    priority: Option<Spanned<i64>>,
    start: Option<Spanned<RawHook>>,
    stop: Option<Spanned<RawHook>>,
    disrupt: Option<Spanned<RawHook>>,
    #[serde(default)]
    depends: BTreeMap<String, Spanned<i64>>,
    image: Option<Spanned<String>>,
    hosts: Option<Spanned<RawSelector>>,
    dns: Option<Spanned<RawDns>>,
    version: Option<Spanned<String>>,
    update: Option<Spanned<paddock_rollout::Policy>>,
    scale: Option<Spanned<crate::scale::Scale>>,
    #[serde(default)]
    vars: toml::Table,
    #[serde(default)]
    files: Vec<Spanned<RawFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDns {
    #[serde(default)]
    ports: Vec<RawPort>,
}

/// A port as a bare number or with its SRV priority and weight (both 0 when not given).
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a port: a number, or a table of port, priority and weight (no other keys)"
)]
enum RawPort {
    Bare(i64),
    Full(RawFullPort),
}

/// A port's table: a misspelt key (`prio`) is an error, not a priority of 0.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFullPort {
    port: i64,
    #[serde(default)]
    priority: i64,
    #[serde(default)]
    weight: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHook {
    hook: Spanned<String>,
    #[serde(default)]
    args: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelector {
    #[serde(default)]
    traits: BTreeSet<String>,
    #[serde(default)]
    properties: BTreeMap<String, String>,
    #[serde(default)]
    names: BTreeSet<String>,
}

/// `roles.<name>.dns.ports`: each port 1 to 65535 and listed once, priority and weight 0 to
/// 65535.
fn dns_ports(p: &mut Problems<'_>, name: &str, dns: Option<&Spanned<RawDns>>) -> Vec<DnsPort> {
    let Some(dns) = dns else {
        return Vec::new();
    };
    let field = format!("roles.{name}.dns.ports");
    let mut ports: Vec<DnsPort> = Vec::new();
    for raw in &dns.get_ref().ports {
        let (port, priority, weight) = match raw {
            RawPort::Bare(port) => (*port, 0, 0),
            RawPort::Full(f) => (f.port, f.priority, f.weight),
        };
        let checked = (
            u16::try_from(port).ok().filter(|p| *p > 0),
            u16::try_from(priority),
            u16::try_from(weight),
        );
        let (Some(port), Ok(priority), Ok(weight)) = checked else {
            p.add(
                dns.span(),
                &field,
                format!("port {port} (priority {priority}, weight {weight}): a port is 1 to 65535, priority and weight 0 to 65535"),
            );
            continue;
        };
        if ports.iter().any(|d| d.port == port) {
            p.add(dns.span(), &field, format!("port {port} is listed twice"));
            continue;
        }
        ports.push(DnsPort {
            port,
            priority,
            weight,
        });
    }
    ports
}

/// Spec files are read whole; past this they are refused before parsing.
pub const MAX_SPEC_BYTES: usize = 1 << 20;
/// Most roles in one spec.
pub const MAX_ROLES: usize = 1_000;
/// Largest capacity of a dependency.
pub const MAX_CAPACITY: u32 = 1_000_000;

/// A name, word or hook path that a spec or a registration may not use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0:?} is not a name: 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter")]
    Name(String),
    /// `what` says which word (`host`, `instance`, `image`, `the value`).
    #[error(
        "{what} {word:?} must be 1 to 253 of A-Z, a-z, 0-9, '.', '_', '-' and not start with '-'"
    )]
    Word { what: &'static str, word: String },
    #[error(
        "hook {0:?} must be a path relative to the hooks directory (A-Z, a-z, 0-9, '.', '_', '-', '/'; no '..', no leading '/')"
    )]
    HookPath(String),
    #[error(
        "template {0:?} must be a path relative to the templates directory (A-Z, a-z, 0-9, '.', '_', '-', '/'; no '..', no leading '/')"
    )]
    TemplatePath(String),
}

/// Role names, global argument keys: lower-case words, usable as store keys and flags.
pub fn check_name(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(NameError::Name(name.to_string()))
    }
}

/// Host names and instance ids reach hooks as arguments: letters, digits, `.`, `_`, `-`,
/// not starting with `-` (so never an option), at most 253 bytes.
pub fn check_word(what: &'static str, word: &str) -> Result<(), NameError> {
    let ok = !word.is_empty()
        && word.len() <= 253
        && !word.starts_with('-')
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(NameError::Word {
            what,
            word: word.to_string(),
        })
    }
}

fn check_hook_path(path: &str) -> Result<(), NameError> {
    if relative_path_ok(path) {
        Ok(())
    } else {
        Err(NameError::HookPath(path.to_string()))
    }
}

/// A path below a directory of ours: words of safe characters, no `..`, no leading `/`.
fn relative_path_ok(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 255
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != ".." && !part.starts_with('-'))
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

/// Where a computed file goes: an absolute, normal path (no `.`, `..` or empty parts, no
/// control characters), not `/` and not under `/.subd`.
fn file_path_problem(path: &str) -> Option<&'static str> {
    let parts_ok = path.strip_prefix('/').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .split('/')
                .all(|p| !p.is_empty() && p != "." && p != "..")
    });
    if !parts_ok || path.len() > 4096 || path.chars().any(char::is_control) {
        return Some("must be an absolute path of normal parts (no '.', '..' or '//'), not /");
    }
    if path == "/.subd" || path.starts_with("/.subd/") {
        return Some("is subd's own directory, never an update's");
    }
    None
}

/// `toml` → JSON variables (TOML dates become their text).
fn json_vars(t: &toml::Table) -> paddock_computed::Vars {
    match serde_json::to_value(t) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => paddock_computed::Vars::new(),
    }
}

/// Validates computed files (`field`: where they are declared); `seen` holds every path
/// declared so far, with where: a path is declared once in a spec.
fn files(
    p: &mut Problems<'_>,
    raw: &[Spanned<RawFile>],
    field: &str,
    seen: &mut BTreeMap<String, String>,
) -> Vec<FileSpec> {
    let mut out = Vec::new();
    for f in raw {
        let (span, r) = (f.span(), f.get_ref());
        if let Some(why) = file_path_problem(&r.path) {
            p.add(
                span.clone(),
                format!("{field}.path"),
                format!("{:?} {why}", r.path),
            );
            continue;
        }
        if let Some(other) = seen.insert(r.path.clone(), field.to_string()) {
            p.add(
                span.clone(),
                format!("{field}.path"),
                format!("{} is also declared in {other}", r.path),
            );
            continue;
        }
        let source = match (&r.template, r.mdb, &r.program) {
            (Some(t), false, None) => {
                if !relative_path_ok(t) {
                    p.add(
                        span.clone(),
                        format!("{field}.template"),
                        NameError::TemplatePath(t.clone()),
                    );
                    continue;
                }
                paddock_computed::Source::Template(t.clone())
            }
            (None, true, None) => paddock_computed::Source::Mdb,
            (None, false, Some(name)) => {
                if !relative_path_ok(name) {
                    p.add(
                        span.clone(),
                        format!("{field}.program"),
                        format!("{name:?} must be a path relative to the hooks directory"),
                    );
                    continue;
                }
                paddock_computed::Source::Program {
                    name: name.clone(),
                    valid_secs: r.valid_secs,
                }
            }
            _ => {
                p.add(
                    span.clone(),
                    format!("{field}.path"),
                    format!(
                        "{} needs exactly one of template = \"NAME\", mdb = true, program = \"NAME\"",
                        r.path
                    ),
                );
                continue;
            }
        };
        if r.valid_secs.is_some() && r.program.is_none() {
            p.add(
                span.clone(),
                format!("{field}.valid_secs"),
                "only a program's output expires",
            );
            continue;
        }
        if let Some(check) = &r.check
            && !check.first().is_some_and(|c| c.starts_with('/'))
        {
            p.add(
                span.clone(),
                format!("{field}.check"),
                "the check's first word must be an absolute path (it runs on the machine, no shell)",
            );
            continue;
        }
        let mode = match &r.mode {
            None => 0o644,
            Some(m) => match u32::from_str_radix(m, 8) {
                Ok(v) if v <= 0o7777 => v,
                _ => {
                    p.add(
                        span.clone(),
                        format!("{field}.mode"),
                        format!("{m:?} is not an octal mode (0000 to 7777)"),
                    );
                    continue;
                }
            },
        };
        out.push(FileSpec {
            path: r.path.clone(),
            source,
            check: r.check.clone(),
            mode,
            uid: r.uid.unwrap_or(0),
            gid: r.gid.unwrap_or(0),
        });
    }
    out
}

/// Byte offset → 1-based line.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// For a syntax or type error: the dotted key on the error's line, under the table header
/// above it (`roles.app.mn`), as well as the text can tell.
fn field_at(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(here) = lines.get(line.saturating_sub(1)) else {
        return String::new();
    };
    let header = lines[..line.saturating_sub(1).min(lines.len())]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    let here = here.trim();
    if here.starts_with('[') {
        return here
            .trim_matches(|c| c == '[' || c == ']')
            .trim()
            .to_string();
    }
    let key = here.split('=').next().unwrap_or("").trim();
    if key.is_empty() || !here.contains('=') {
        return header.unwrap_or_default();
    }
    match header {
        Some(h) if !h.is_empty() => format!("{h}.{key}"),
        _ => key.to_string(),
    }
}

struct Problems<'a> {
    file: &'a str,
    text: &'a str,
    list: Vec<SpecError>,
}

impl Problems<'_> {
    fn add(
        &mut self,
        span: Range<usize>,
        field: impl Into<String>,
        message: impl std::fmt::Display,
    ) {
        self.list.push(SpecError {
            file: self.file.to_string(),
            line: line_of(self.text, span.start),
            field: field.into(),
            message: message.to_string(),
        });
    }
}

fn count(
    p: &mut Problems<'_>,
    v: &Option<Spanned<i64>>,
    field: String,
    default: u32,
) -> Option<u32> {
    match v {
        None => Some(default),
        Some(n) => match u32::try_from(*n.get_ref()) {
            Ok(n) => Some(n),
            Err(_) => {
                p.add(
                    n.span(),
                    field,
                    format!("{} is not a count (0 to {})", n.get_ref(), u32::MAX),
                );
                None
            }
        },
    }
}

impl Spec {
    /// Parses and validates `text` (the contents of `file`). Nothing is partially accepted:
    /// a spec with any problem is refused with all of them.
    pub fn parse(file: &str, text: &str) -> Result<Spec, SpecErrors> {
        let mut p = Problems {
            file,
            text,
            list: Vec::new(),
        };
        if text.len() > MAX_SPEC_BYTES {
            p.add(
                0..0,
                "",
                format!(
                    "the spec is {} bytes; at most {MAX_SPEC_BYTES} are read",
                    text.len()
                ),
            );
            return Err(SpecErrors(p.list));
        }
        let raw: RawSpec = match toml::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                let start = e.span().map_or(0, |s| s.start);
                let line = line_of(text, start);
                p.list.push(SpecError {
                    file: file.to_string(),
                    line,
                    field: field_at(text, line),
                    message: e.message().trim().to_string(),
                });
                return Err(SpecErrors(p.list));
            }
        };
        let spec = validate(&mut p, raw);
        match spec {
            Some(s) if p.list.is_empty() => Ok(s),
            _ => Err(SpecErrors(p.list)),
        }
    }

    /// Roles in topological order: every depender before its dependees (roots first),
    /// ties by name. Valid specs have no cycle.
    pub fn order(&self) -> Vec<&str> {
        topo(&self.roles).unwrap_or_default()
    }
}

/// Kahn's algorithm over depender → dependee edges; `Err` holds a cycle's roles.
fn topo(roles: &BTreeMap<String, Role>) -> Result<Vec<&str>, Vec<&str>> {
    let mut indeg: BTreeMap<&str, usize> = roles.keys().map(|k| (k.as_str(), 0)).collect();
    for r in roles.values() {
        for d in r.depends.keys() {
            if let Some(n) = indeg.get_mut(d.as_str()) {
                *n += 1;
            }
        }
    }
    let mut ready: BTreeSet<&str> = indeg
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| *k)
        .collect();
    let mut out = Vec::with_capacity(roles.len());
    while let Some(r) = ready.pop_first() {
        out.push(r);
        for d in roles[r].depends.keys() {
            if let Some(n) = indeg.get_mut(d.as_str()) {
                *n -= 1;
                if *n == 0 {
                    ready.insert(d.as_str());
                }
            }
        }
    }
    if out.len() == roles.len() {
        return Ok(out);
    }
    // Walk from a role still holding an edge until a role repeats: that is a cycle.
    let left: BTreeSet<&str> = indeg
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| *k)
        .collect();
    let mut path: Vec<&str> = Vec::new();
    let mut at = *left.iter().next().unwrap_or(&"");
    while !path.contains(&at) {
        path.push(at);
        let Some(next) = roles
            .get(at)
            .and_then(|r| r.depends.keys().find(|d| left.contains(d.as_str())))
        else {
            break;
        };
        at = next.as_str();
    }
    let from = path.iter().position(|r| *r == at).unwrap_or(0);
    let mut cycle = path[from..].to_vec();
    cycle.push(at);
    Err(cycle)
}

fn validate(p: &mut Problems<'_>, raw: RawSpec) -> Option<Spec> {
    let mut args = BTreeMap::new();
    for (k, v) in raw.args {
        let field = format!("args.{k}");
        if let Err(e) = check_name(&k) {
            p.add(v.span(), &field, e);
        }
        if let Err(e) = check_word("the value", v.get_ref()) {
            p.add(v.span(), &field, e);
        }
        args.insert(k, v.into_inner());
    }
    if raw.roles.len() > MAX_ROLES {
        p.add(
            0..0,
            "roles",
            format!("{} roles; at most {MAX_ROLES}", raw.roles.len()),
        );
        return None;
    }
    let names: BTreeSet<String> = raw.roles.keys().cloned().collect();
    let mut paths: BTreeMap<String, String> = BTreeMap::new();
    let machine_files = files(p, &raw.files, "files", &mut paths);
    let mut hosts = BTreeMap::new();
    for (host, h) in &raw.hosts {
        if let Err(e) = check_word("host", host) {
            p.add(h.span(), format!("hosts.{host}"), e);
        }
        for role in h.get_ref().roles.keys() {
            if !names.contains(role) {
                p.add(
                    h.span(),
                    format!("hosts.{host}.roles.{role}"),
                    format!("no role {role} in this spec"),
                );
            }
        }
        let vars = paddock_computed::HostVars {
            vars: json_vars(&h.get_ref().vars),
            roles: h
                .get_ref()
                .roles
                .iter()
                .map(|(r, t)| (r.clone(), json_vars(t)))
                .collect(),
        };
        hosts.insert(host.clone(), vars);
    }
    let mut roles = BTreeMap::new();
    let mut spans: BTreeMap<String, (Range<usize>, Option<Range<usize>>)> = BTreeMap::new();
    for (name, raw_role) in raw.roles {
        let span = raw_role.span();
        let r = raw_role.into_inner();
        let f = |k: &str| format!("roles.{name}.{k}");
        if let Err(e) = check_name(&name) {
            p.add(span.clone(), format!("roles.{name}"), e);
        }
        let role_files = files(p, &r.files, &f("files"), &mut paths);
        let min = count(p, &r.min, f("min"), 0);
        let max = match &r.max {
            None => Some(None),
            some => count(p, some, f("max"), 0).map(Some),
        };
        let priority = match &r.priority {
            None => Some(0),
            Some(v) => match i32::try_from(*v.get_ref()) {
                Ok(n) => Some(n),
                Err(_) => {
                    p.add(
                        v.span(),
                        f("priority"),
                        format!(
                            "{} is out of range ({}..={})",
                            v.get_ref(),
                            i32::MIN,
                            i32::MAX
                        ),
                    );
                    None
                }
            },
        };
        if let (Some(min), Some(Some(max))) = (min, max)
            && min > max
        {
            let s = r.max.as_ref().map_or(span.clone(), |m| m.span());
            p.add(
                s,
                f("max"),
                format!("impossible bounds: min {min} is above max {max}"),
            );
        }
        let mut depends = BTreeMap::new();
        for (d, cap) in &r.depends {
            let field = format!("roles.{name}.depends.{d}");
            if d == &name {
                p.add(cap.span(), &field, "a role cannot depend on itself");
            } else if !names.contains(d) {
                p.add(cap.span(), &field, format!("unknown role {d:?}"));
            }
            match u32::try_from(*cap.get_ref()) {
                Ok(c) if (1..=MAX_CAPACITY).contains(&c) => {
                    depends.insert(d.clone(), c);
                }
                _ => p.add(
                    cap.span(),
                    &field,
                    format!(
                        "capacity {} must be 1 to {MAX_CAPACITY} (how many {name} instances one {d} instance serves)",
                        cap.get_ref()
                    ),
                ),
            }
        }
        let on_host = r.depends.is_empty() || r.image.is_some() || r.hosts.is_some();
        let hook = |p: &mut Problems<'_>, h: &Option<Spanned<RawHook>>, which: &str| {
            let h = h.as_ref()?;
            let field = f(which);
            if let Err(e) = check_hook_path(h.get_ref().hook.get_ref()) {
                p.add(h.get_ref().hook.span(), format!("{field}.hook"), e);
            }
            for a in &h.get_ref().args {
                let key = a.get_ref().as_str();
                match key {
                    "h" | "host" if !on_host => p.add(
                        a.span(),
                        format!("{field}.args"),
                        format!(
                            "{key:?}: role {name} has dependencies and no image or hosts, so it does not run on a host of its own"
                        ),
                    ),
                    "v" | "version" if r.version.is_none() => p.add(
                        a.span(),
                        format!("{field}.args"),
                        format!("{key:?}: role {name} declares no version"),
                    ),
                    "h" | "host" | "i" | "instance" | "v" | "version" => {}
                    other if !args.contains_key(other) => p.add(
                        a.span(),
                        format!("{field}.args"),
                        format!(
                            "{other:?} is neither h, host, i, instance, v, version nor a key of [args]"
                        ),
                    ),
                    _ => {}
                }
            }
            Some(Hook {
                path: h.get_ref().hook.get_ref().clone(),
                args: h
                    .get_ref()
                    .args
                    .iter()
                    .map(|a| a.get_ref().clone())
                    .collect(),
            })
        };
        let start = hook(p, &r.start, "start");
        let stop = hook(p, &r.stop, "stop");
        let disrupt = hook(p, &r.disrupt, "disrupt");
        let image = r.image.as_ref().map(|i| {
            if let Err(e) = check_word("image", i.get_ref()) {
                p.add(i.span(), f("image"), e);
            }
            i.get_ref().clone()
        });
        if r.start.is_none() && image.is_none() {
            p.add(
                span.clone(),
                f("start"),
                "a role needs a start hook, or an image (its hosts' subd registers it)",
            );
        }
        if r.stop.is_none() && image.is_none() {
            p.add(
                span.clone(),
                f("stop"),
                "a role without an image needs a stop hook",
            );
        }
        let hosts = match &r.hosts {
            None => Selector::default(),
            Some(s) => {
                let s = s.get_ref();
                Selector {
                    traits: s.traits.clone(),
                    properties: s.properties.clone(),
                    names: s.names.clone(),
                }
            }
        };
        let dns_ports = dns_ports(p, &name, r.dns.as_ref());
        let version = r.version.as_ref().map(|v| {
            if let Err(e) = check_word("version", v.get_ref()) {
                p.add(v.span(), f("version"), e);
            }
            if r.image.is_some() {
                p.add(
                    v.span(),
                    f("version"),
                    "an image role's version is its image: change `image` to roll it",
                );
            }
            v.get_ref().clone()
        });
        let update = match &r.update {
            None => paddock_rollout::Policy::default(),
            Some(u) => {
                for problem in u.get_ref().problems() {
                    p.add(u.span(), f("update"), problem);
                }
                u.get_ref().clone()
            }
        };
        let scale = r.scale.as_ref().map(|sc| {
            let v = sc.get_ref();
            if let Some(problem) = v.problem() {
                p.add(sc.span(), f("scale"), problem);
            }
            if let Err(e) = check_word("metric", &v.metric) {
                p.add(sc.span(), f("scale.metric"), e);
            }
            v.clone()
        });
        spans.insert(
            name.clone(),
            (span.clone(), r.max.as_ref().map(|m| m.span())),
        );
        let (Some(min), Some(max), Some(priority)) = (min, max, priority) else {
            continue;
        };
        roles.insert(
            name.clone(),
            Role {
                name: name.clone(),
                min,
                max,
                priority,
                start,
                stop,
                disrupt,
                depends,
                image,
                hosts,
                on_host,
                line: line_of(p.text, span.start),
                dns_ports,
                version,
                update,
                scale,
                vars: json_vars(&r.vars),
                files: role_files,
            },
        );
    }
    if !p.list.is_empty() {
        return None;
    }
    let spec = Spec {
        file: p.file.to_string(),
        args,
        roles,
        vars: json_vars(&raw.vars),
        hosts,
        files: machine_files,
    };
    if let Err(cycle) = topo(&spec.roles) {
        let first = cycle.first().copied().unwrap_or("");
        let span = spans.get(first).map_or(0..0, |s| s.0.clone());
        p.add(
            span,
            format!("roles.{first}.depends"),
            format!("dependency cycle: {}", cycle.join(" → ")),
        );
        return None;
    }
    match crate::engine::minimums(&spec) {
        Ok(mins) => {
            for (name, min) in &mins {
                let role = &spec.roles[name];
                if let Some(max) = role.max
                    && *min > u64::from(max)
                {
                    let span = spans[name]
                        .1
                        .clone()
                        .unwrap_or_else(|| spans[name].0.clone());
                    p.add(
                        span,
                        format!("roles.{name}.max"),
                        format!(
                            "impossible bounds: its dependers' minimums need at least {min} instances, above max {max}"
                        ),
                    );
                }
            }
        }
        Err(e) => p.add(
            spans[&e.role].0.clone(),
            format!("roles.{}", e.role),
            e.to_string(),
        ),
    }
    p.list.is_empty().then_some(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        Spec::parse("spec/x.toml", text)
            .unwrap_err()
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    const GOOD: &str = r#"
[args]
p = "head-1"

[roles.nc]
min = 1
start = { hook = "sim/start_nc.sh", args = ["h", "p"] }
stop = { hook = "sim/stop_nc.sh", args = ["h"] }

[roles.app]
min = 3
max = 10
priority = 5
start = { hook = "sim/start_app.sh", args = ["i"] }
stop = { hook = "sim/stop_app.sh", args = ["instance"] }
depends = { nc = 2 }
"#;

    #[test]
    fn a_good_spec_parses() {
        let s = Spec::parse("spec/x.toml", GOOD).unwrap();
        assert_eq!(s.roles.len(), 2);
        assert_eq!(s.roles["app"].max, Some(10));
        assert_eq!(s.roles["app"].priority, 5);
        assert_eq!(s.roles["app"].depends["nc"], 2);
        assert_eq!(s.roles["nc"].max, None);
        assert_eq!(s.roles["app"].line, 10);
        assert_eq!(s.order(), vec!["app", "nc"]);
        assert_eq!(s.args["p"], "head-1");
        assert!(s.roles["app"].dns_ports.is_empty());
    }

    #[test]
    fn dns_ports_are_bare_or_with_priority_and_weight() {
        let text = format!(
            "{GOOD}dns = {{ ports = [8080, {{ port = 8443, priority = 10, weight = 5 }}] }}\n"
        );
        let s = Spec::parse("spec/x.toml", &text).unwrap();
        let port = |port, priority, weight| DnsPort {
            port,
            priority,
            weight,
        };
        assert_eq!(
            s.roles["app"].dns_ports,
            [port(8080, 0, 0), port(8443, 10, 5)]
        );
        for (bad, want) in [
            ("[0]", "port 0 (priority 0, weight 0)"),
            ("[65536]", "port 65536"),
            ("[{ port = 1, weight = -1 }]", "weight -1"),
            ("[80, 80]", "port 80 is listed twice"),
        ] {
            let text = format!("{GOOD}dns = {{ ports = {bad} }}\n");
            let e = Spec::parse("spec/x.toml", &text).unwrap_err().to_string();
            assert!(
                e.contains("roles.app.dns.ports") && e.contains(want),
                "{bad}: {e}"
            );
        }
        let e = Spec::parse("spec/x.toml", &format!("{GOOD}dns = {{ port = 1 }}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `port`"), "{e}");
        // A misspelt key in a port's table, or a port of the wrong type, is refused, and the
        // error says what a port may be.
        for bad in ["[{ port = 8443, prio = 10 }]", "[\"8443\"]"] {
            let text = format!("{GOOD}dns = {{ ports = {bad} }}\n");
            let e = Spec::parse("spec/x.toml", &text).unwrap_err().to_string();
            assert!(
                e.contains("a port: a number, or a table of port, priority and weight"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn computed_files_and_their_variables_are_declared_and_checked() {
        let text = format!(
            "{GOOD}vars = {{ port = 8080, db = {{ pool = 5 }} }}\n\
             files = [{{ path = \"/etc/app/peers\", template = \"app/peers.j2\", mode = \"0640\" }}]\n\
             \n[vars]\ncluster = \"paddock\"\ndb = {{ pool = 1, host = \"a\" }}\n\
             \n[hosts.h01]\nvars = {{ rack = \"r1\" }}\nroles = {{ app = {{ db = {{ pool = 9 }} }} }}\n\
             \n[[files]]\npath = \"/etc/motd\"\ntemplate = \"motd.j2\"\nuid = 0\n"
        );
        let s = Spec::parse("spec/x.toml", &text).unwrap();
        assert_eq!(
            s.roles["app"].files,
            [FileSpec {
                path: "/etc/app/peers".into(),
                source: paddock_computed::Source::Template("app/peers.j2".into()),
                check: None,
                mode: 0o640,
                uid: 0,
                gid: 0,
            }]
        );
        assert_eq!(
            (s.files[0].path.as_str(), s.files[0].mode),
            ("/etc/motd", 0o644)
        );
        let decls: Vec<(String, Option<String>)> = s
            .file_decls()
            .into_iter()
            .map(|d| (d.path, d.role))
            .collect();
        assert_eq!(
            decls,
            [
                ("/etc/motd".to_string(), None),
                ("/etc/app/peers".to_string(), Some("app".to_string()))
            ]
        );
        let merged = s.var_sources().for_file("h01", Some("app"));
        assert_eq!(
            serde_json::Value::Object(merged),
            serde_json::json!({"cluster": "paddock", "db": {"pool": 9, "host": "a"}, "port": 8080, "rack": "r1"})
        );
        for (bad, want) in [
            (
                "[[files]]\npath = \"etc/x\"\ntemplate = \"t\"\n",
                "files.path: \"etc/x\" must be an absolute path",
            ),
            (
                "[[files]]\npath = \"/a/../b\"\ntemplate = \"t\"\n",
                "files.path: \"/a/../b\" must be an absolute path",
            ),
            (
                "[[files]]\npath = \"/.subd/x\"\ntemplate = \"t\"\n",
                "is subd's own directory",
            ),
            (
                "[[files]]\npath = \"/etc/app/peers\"\ntemplate = \"t\"\n",
                "roles.app.files.path: /etc/app/peers is also declared in files",
            ),
            (
                "[[files]]\npath = \"/x\"\ntemplate = \"../t\"\n",
                "files.template: template \"../t\" must be a path relative to the templates directory",
            ),
            (
                "[[files]]\npath = \"/x\"\ntemplate = \"t\"\nmode = \"0999\"\n",
                "files.mode: \"0999\" is not an octal mode",
            ),
            (
                "[[files]]\npath = \"/x\"\ntemplate = \"t\"\nowner = 1\n",
                "unknown field `owner`",
            ),
            (
                "[[files]]\npath = \"/x\"\ntemplate = \"t\"\nmdb = true\n",
                "/x needs exactly one of template",
            ),
            (
                "[[files]]\npath = \"/x\"\ntemplate = \"t\"\nvalid_secs = 5\n",
                "only a program's output expires",
            ),
            (
                "[[files]]\npath = \"/x\"\nmdb = true\ncheck = [\"nginx\", \"-t\"]\n",
                "files.check: the check's first word must be an absolute path",
            ),
            (
                "[hosts.h01]\nroles = { nope = { a = 1 } }\n",
                "hosts.h01.roles.nope: no role nope in this spec",
            ),
        ] {
            let with_role_file = format!(
                "{GOOD}files = [{{ path = \"/etc/app/peers\", template = \"p.j2\" }}]\n{bad}"
            );
            let e = Spec::parse("spec/x.toml", &with_role_file)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn a_role_declares_how_it_rolls_and_a_hook_role_its_version() {
        let text = format!(
            "{GOOD}version = \"7.2\"\nupdate = {{ max_parallel = 2, canary = 1, auto_promote = true }}\n"
        )
        .replace("args = [\"i\"]", "args = [\"i\", \"v\"]");
        let s = Spec::parse("spec/x.toml", &text).unwrap();
        let app = &s.roles["app"];
        assert_eq!(app.version.as_deref(), Some("7.2"));
        assert_eq!(
            app.update,
            paddock_rollout::Policy {
                max_parallel: 2,
                canary: 1,
                auto_promote: true,
                ..paddock_rollout::Policy::default()
            }
        );
        // Without a table, the defaults: one at a time, no canary, revert on failure.
        assert_eq!(s.roles["nc"].update, paddock_rollout::Policy::default());
        // The hook is given the version.
        let start = crate::Action {
            kind: crate::Kind::Start,
            role: "app".into(),
            instance: "app-1".into(),
            host: None,
            image: None,
            why: crate::Why::Minimum,
        };
        let argv = start.command(&s).unwrap().unwrap();
        assert_eq!(argv[1..], ["-i", "app-1", "-v", "7.2"]);
        // A `disrupt` hook is checked like the others and given the same arguments.
        let text = format!("{text}disrupt = {{ hook = \"may.sh\", args = [\"i\", \"v\"] }}\n");
        let s = Spec::parse("spec/x.toml", &text).unwrap();
        let app = &s.roles["app"];
        let hook = app.disrupt.as_ref().unwrap();
        let argv = crate::hook_argv(hook, &s, app, "app-2", Some("h1")).unwrap();
        assert_eq!(argv, ["may.sh", "-i", "app-2", "-v", "7.2"]);
        let bad = text.replace("hook = \"may.sh\"", "hook = \"/bin/sh\"");
        let e = Spec::parse("spec/x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("roles.app.disrupt.hook"), "{e}");
        for (bad, want) in [
            (
                "update = { max_parallel = 0 }",
                "roles.app.update: max_parallel: must be at least 1",
            ),
            (
                "update = { min_healthy_secs = 900 }",
                "healthy_deadline_secs: 300 must be longer",
            ),
            (
                "update = { canary = -1 }",
                "roles.app.update: invalid value: integer `-1`",
            ),
            ("update = { batch = 2 }", "unknown field `batch`"),
            ("version = \"a b\"", "roles.app.version"),
        ] {
            let e = Spec::parse("spec/x.toml", &format!("{GOOD}{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        // A hook that takes the version of a role without one.
        let e = Spec::parse(
            "spec/x.toml",
            &GOOD.replace("args = [\"i\"]", "args = [\"version\"]"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"version\": role app declares no version"),
            "{e}"
        );
    }

    /// Each bad spec → exactly the listed messages (file:line: field: message).
    #[test]
    fn bad_specs_name_file_line_and_field() {
        let cases: &[(&str, &[&str])] = &[
            (
                "[roles.a]\nmn = 1\n",
                &[
                    "spec/x.toml:2: roles.a.mn: unknown field `mn`, expected one of `min`, `max`, `priority`, `start`, `stop`, `disrupt`, `depends`, `image`, `hosts`, `dns`, `version`, `update`, `scale`, `vars`, `files`",
                ],
            ),
            (
                "[roles.a\n",
                &["spec/x.toml:1: roles.a: unclosed table, expected `]`"],
            ),
            (
                "[roles.a]\nmin = \"two\"\n",
                &["spec/x.toml:2: roles.a.min: invalid type: string \"two\", expected i64"],
            ),
            (
                "[roles.a]\nmin = -1\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &["spec/x.toml:2: roles.a.min: -1 is not a count (0 to 4294967295)"],
            ),
            (
                "[roles.a]\nmin = 3\nmax = 2\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &["spec/x.toml:3: roles.a.max: impossible bounds: min 3 is above max 2"],
            ),
            (
                "[roles.a]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\ndepends = { b = 1 }\n",
                &["spec/x.toml:4: roles.a.depends.b: unknown role \"b\""],
            ),
            (
                "[roles.a]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\ndepends = { b = 0 }\n[roles.b]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &[
                    "spec/x.toml:4: roles.a.depends.b: capacity 0 must be 1 to 1000000 (how many a instances one b instance serves)",
                ],
            ),
            (
                "[roles.a]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\ndepends = { b = 1 }\n[roles.b]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\ndepends = { c = 1 }\n[roles.c]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\ndepends = { a = 1 }\n",
                &["spec/x.toml:1: roles.a.depends: dependency cycle: a → b → c → a"],
            ),
            (
                "[roles.a]\nstart = { hook = \"../../bin/sh\" }\nstop = { hook = \"b\", args = [\"q\"] }\n",
                &[
                    "spec/x.toml:2: roles.a.start.hook: hook \"../../bin/sh\" must be a path relative to the hooks directory (A-Z, a-z, 0-9, '.', '_', '-', '/'; no '..', no leading '/')",
                    "spec/x.toml:3: roles.a.stop.args: \"q\" is neither h, host, i, instance, v, version nor a key of [args]",
                ],
            ),
            (
                "[roles.a]\nstart = { hook = \"a\", args = [\"h\"] }\nstop = { hook = \"b\" }\ndepends = { b = 1 }\nimage = \"-x\"\n[roles.b]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &[
                    "spec/x.toml:5: roles.a.image: image \"-x\" must be 1 to 253 of A-Z, a-z, 0-9, '.', '_', '-' and not start with '-'",
                ],
            ),
            (
                "[roles.a]\nstart = { hook = \"a\", args = [\"h\"] }\nstop = { hook = \"b\" }\ndepends = { b = 1 }\n[roles.b]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &[
                    "spec/x.toml:2: roles.a.start.args: \"h\": role a has dependencies and no image or hosts, so it does not run on a host of its own",
                ],
            ),
            (
                "[roles.a]\nmin = 1\n",
                &[
                    "spec/x.toml:1: roles.a.start: a role needs a start hook, or an image (its hosts' subd registers it)",
                    "spec/x.toml:1: roles.a.stop: a role without an image needs a stop hook",
                ],
            ),
            (
                // b's dependers need 4 b instances: more than its max.
                "[roles.a]\nmin = 4\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\ndepends = { b = 1 }\n[roles.b]\nmax = 3\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &[
                    "spec/x.toml:7: roles.b.max: impossible bounds: its dependers' minimums need at least 4 instances, above max 3",
                ],
            ),
            (
                "[roles.Bad]\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &[
                    "spec/x.toml:1: roles.Bad: \"Bad\" is not a name: 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter",
                ],
            ),
            (
                "[args]\nq = \"a b\"\n",
                &[
                    "spec/x.toml:2: args.q: the value \"a b\" must be 1 to 253 of A-Z, a-z, 0-9, '.', '_', '-' and not start with '-'",
                ],
            ),
            (
                "[roles.a]\npriority = 99999999999\nstart = { hook = \"a\" }\nstop = { hook = \"b\" }\n",
                &[
                    "spec/x.toml:2: roles.a.priority: 99999999999 is out of range (-2147483648..=2147483647)",
                ],
            ),
            (
                "rolez = 1\n",
                &[
                    "spec/x.toml:1: rolez: unknown field `rolez`, expected one of `args`, `roles`, `vars`, `hosts`, `files`",
                ],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(errors(text), *want, "spec:\n{text}");
        }
    }

    #[test]
    fn an_empty_spec_has_no_roles() {
        assert!(Spec::parse("f", "").unwrap().roles.is_empty());
    }

    #[test]
    fn an_oversized_spec_is_refused_before_parsing() {
        let text = "#".repeat(MAX_SPEC_BYTES + 1);
        assert_eq!(
            errors(&text),
            vec![format!(
                "spec/x.toml:1: the spec is {} bytes; at most {MAX_SPEC_BYTES} are read",
                MAX_SPEC_BYTES + 1
            )]
        );
    }

    #[test]
    fn selectors_match_on_names_traits_and_properties() {
        let host = crate::Host {
            name: "n1".into(),
            traits: ["CUSTOM_GPU".to_string()].into(),
            properties: [("cpu_arch".to_string(), "x86_64".to_string())].into(),
        };
        let mut s = Selector::default();
        assert!(s.matches(&host));
        s.traits.insert("CUSTOM_GPU".into());
        s.properties.insert("cpu_arch".into(), "x86_64".into());
        assert!(s.matches(&host));
        s.names.insert("n2".into());
        assert!(!s.matches(&host));
        s.names.insert("n1".into());
        assert!(s.matches(&host));
        s.properties.insert("cpu_arch".into(), "aarch64".into());
        assert!(!s.matches(&host));
    }
}
