//! The house keeps its shape. The import map stays one-way: inside `appliance/src` every
//! module sits on a layer and imports only from its own layer or below, and no crate of the
//! workspace has an import circle between its modules. And no function of the appliance
//! grows past 150 lines, nor `serve::run`, the recipe, past 80; and no crate's code outside
//! its tests returns a bare `String` as an error. Read from the sources, so a
//! new module must be placed on a layer here before it builds green, and a growing function
//! is split when it grows, not found later.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. A module not listed fails the test: place it.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base: the runtime, leadership, files at rest, and the pure tables",
        &[
            "runtime",
            "leader",
            "at_rest",
            "assets",
            "audit",
            "cluster",
            "access",
            "browser",
            "metrics",
            "schema",
            "backup",
            "setting",
            "pool_claims",
        ],
    ),
    (
        "domains: store-aware shells, each owning its configuration section and routes",
        &[
            "boot",
            "images",
            "census",
            "agent_tokens",
            "security",
            "power",
            "provisioning",
            "pxe_filter",
            "dominator",
            "rollouts",
            "roles",
            "disruption",
            "computed",
            "dhcp",
            "dhcp6",
            "dns_zones",
            "dns",
            "inspection",
        ],
    ),
    ("config: assembles the domains' sections", &["config"]),
    (
        "console: the web pages",
        &[
            "console",
            "console_access",
            "console_charts",
            "console_dashboard",
            "console_history",
            "console_images",
            "console_list",
            "console_live",
            "console_machine",
            "console_nodes",
            "console_power",
            "console_rules",
            "console_subs",
            "console_style",
            "roles_page",
        ],
    ),
    ("http: the router and its listeners", &["http"]),
    (
        "cli: the client and the commands",
        &[
            "cli",
            "certs_cli",
            "roles_cli",
            "dns_cli",
            "rollouts_cli",
            "init_cli",
        ],
    ),
    ("serve: the recipe", &["serve"]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `src` with its code outside tests ([`without_tests`]), `bin`
/// folders included when `with_bins`; not the files of modules declared for tests only
/// (`#[cfg(test)] mod name;`).
fn rust_files(src: &Path, with_bins: bool) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                if with_bins || p.file_name().is_some_and(|n| n != "bin") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((p, text));
            }
        }
    }
    let test_only: Vec<PathBuf> = out
        .iter()
        .flat_map(|(p, text)| {
            // `lib.rs`, `main.rs` and `mod.rs` hold their modules beside them; `a.rs` in `a/`.
            let home = match p.file_stem().and_then(|s| s.to_str()) {
                Some("lib" | "main" | "mod") => p.parent().unwrap().to_path_buf(),
                _ => p.with_extension(""),
            };
            test_modules(text)
                .into_iter()
                .map(move |m| home.join(m))
                .collect::<Vec<_>>()
        })
        .collect();
    out.retain(|(p, _)| {
        !test_only
            .iter()
            .any(|m| p.starts_with(m) || *p == m.with_extension("rs"))
    });
    out.into_iter()
        .map(|(p, text)| (p, without_tests(&text)))
        .collect()
}

/// Whether `line` is an attribute that compiles what follows for tests only:
/// `#[cfg(test)]` or `#[cfg(all(test, …))]` at column 0.
fn test_only(line: &str) -> bool {
    line == "#[cfg(test)]"
        || (line.starts_with("#[cfg(all(")
            && line.contains("test")
            && !line.contains("not(")
            && line.ends_with(")]"))
}

/// The items after a [`test_only`] attribute (past further attributes and comments), each
/// as its first line's index and whether it is a declaration ending in `;`.
fn test_items(lines: &[&str]) -> Vec<(usize, bool)> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !test_only(l) {
            continue;
        }
        if let Some(j) = (i + 1..lines.len())
            .find(|&j| !(lines[j].starts_with("#[") || lines[j].trim_start().starts_with("//")))
        {
            out.push((j, lines[j].trim_end().ends_with(';')));
        }
    }
    out
}

/// An item's line without its visibility.
fn unqualified(line: &str) -> &str {
    ["pub(crate) ", "pub(super) ", "pub "]
        .iter()
        .fold(line, |l, v| l.trim_start_matches(v))
}

/// The names of the modules `text` declares for tests only, in files of their own.
fn test_modules(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    test_items(&lines)
        .into_iter()
        .filter(|&(_, declaration)| declaration)
        .filter_map(|(j, _)| {
            let item = unqualified(lines[j]);
            item.strip_prefix("mod ")
                .map(|m| m.trim_end_matches(';').trim().to_string())
        })
        .collect()
}

/// Every `.rs` file under `dir`, as (top-level module name, text without its tests).
fn modules(src: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (p, code) in rust_files(src, false) {
        let rel = p.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        out.push((top, code));
    }
    out
}

/// `text` without what is compiled for tests only (each `#[cfg(test)]` item: a module or
/// function to its `}` at column 0, a declaration on its line) and without its comments;
/// code after a test item is kept.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut blank = vec![false; lines.len()];
    for (start, declaration) in test_items(&lines) {
        // The attribute and what follows it, to the item's `}` at column 0 (or its own
        // line, for a declaration or a one-line item).
        let from = lines[..start]
            .iter()
            .rposition(|l| test_only(l))
            .unwrap_or(start);
        let one_line = declaration || lines[start].trim_end().ends_with('}');
        let end = if one_line {
            start
        } else {
            // Its closing line at column 0: the `}` of a module or function, or the `};`,
            // `];`, `);` of a multi-line `use`, `const` or call.
            let item = unqualified(lines[start]);
            let block = [
                "mod ",
                "fn ",
                "async fn ",
                "const fn ",
                "impl",
                "struct ",
                "enum ",
            ]
            .iter()
            .any(|k| item.starts_with(k));
            (start + 1..lines.len())
                .find(|&j| {
                    if block {
                        lines[j] == "}"
                    } else {
                        lines[j].starts_with(['}', ']', ')'])
                    }
                })
                .unwrap_or(lines.len() - 1)
        };
        blank[from..=end].iter_mut().for_each(|b| *b = true);
    }
    lines
        .iter()
        .zip(blank)
        .map(|(l, b)| {
            if b {
                ""
            } else {
                l.split_once("//").map_or(*l, |(a, _)| a)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names through `crate::` (paths and brace groups).
fn imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                out.insert(ident(item));
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let names: BTreeSet<String> = mods.iter().map(|(m, _)| m.clone()).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in mods {
        let e = g.entry(m.clone()).or_default();
        e.extend(
            imports(&code)
                .into_iter()
                .filter(|t| *t != m && names.contains(t)),
        );
    }
    g
}

/// A circle in `g`, if there is one (depth-first search).
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for t in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(t, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn appliance_modules_import_only_from_their_layer_or_below() {
    let g = graph(&root().join("appliance/src"));
    let rank = |m: &str| LAYERS.iter().position(|(_, ms)| ms.contains(&m));
    let mut problems = Vec::new();
    for (m, targets) in &g {
        let Some(r) = rank(m) else {
            problems.push(format!("{m} is on no layer: add it to LAYERS"));
            continue;
        };
        for t in targets {
            if let Some(tr) = rank(t)
                && tr > r
            {
                problems.push(format!(
                    "{m} ({}) imports {t} ({}), a layer above",
                    LAYERS[r].0, LAYERS[tr].0
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut circles = Vec::new();
    for src in crate_sources() {
        if let Some(c) = circle(&graph(&src)) {
            circles.push(format!("{}: {}", src.display(), c.join(" → ")));
        }
    }
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn the_reader_sees_paths_and_groups_but_not_comments_or_tests() {
    let code = without_tests(
        "use crate::a::X;\nuse crate::{b, c::Y};\n// crate::d\nfn f() { crate::e::g(); }\n\
         #[cfg(test)]\nmod tests { use crate::h; }\n#[cfg(test)]\nmod more {\n    use crate::i;\n}\nfn z() { crate::z::q(); }\n",
    );
    assert_eq!(
        imports(&code).into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "e", "z"]
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(circle(&g).unwrap(), ["a", "b", "a"]);

    // Test items of other shapes: a module declared public to the crate, attributes and
    // comments between, a function, and a declaration whose file is left out.
    let code = "#[cfg(test)]\npub(crate) mod fixture {\n    use crate::j;\n}\n\
                #[cfg(test)]\n// why\n#[allow(clippy::x)]\nmod tests {\n    use crate::k;\n}\n\
                #[cfg(test)]\npub(crate) fn helper() {\n    crate::l::m();\n}\n\
                #[cfg(test)]\nmod testing;\nmod kept;\nfn y() { crate::y::q(); }\n\
                #[cfg(test)]\nuse crate::{\n    n,\n    o,\n};\nfn w() { crate::w::q(); }\n\
                #[cfg(all(test, feature = \"x\"))]\nmod gated {\n    use crate::p;\n}\n\
                #[cfg(not(test))]\nfn v() { crate::v::q(); }\n";
    assert_eq!(
        imports(&without_tests(code))
            .into_iter()
            .collect::<Vec<_>>(),
        ["v", "w", "y"]
    );
    assert_eq!(test_modules(code), ["testing"]);
}

/// Every non-test function under `src` (`main.rs` and binaries included), as (file, name,
/// lines from its signature to its closing brace). Read as rustfmt lays code out: a body
/// ends at the first `}` line at the indentation of its `fn`.
fn function_lengths(src: &Path) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for (p, code) in rust_files(src, true) {
        let file = p.strip_prefix(src).unwrap().display().to_string();
        for (name, lines) in lengths(&code) {
            out.push((file.clone(), name, lines));
        }
    }
    out
}

/// The functions of `code` with bodies, and the lines each spans.
fn lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let after_fn = body
            .split_once("fn ")
            .filter(|(before, _)| {
                before.split_whitespace().all(|w| {
                    w.starts_with("pub")
                        || ["async", "const", "unsafe", "extern", "\"C\""].contains(&w)
                })
            })
            .map(|(_, rest)| rest);
        let Some(rest) = after_fn else { continue };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // Where the signature ends: a body opens, a declaration ends, or a one-line body.
        let Some(open) = (i..lines.len()).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';') || t.ends_with('}')
        }) else {
            continue;
        };
        let t = lines[open].trim_end();
        if t.ends_with(';') {
            continue;
        }
        if t.ends_with('}') {
            out.push((name, open - i + 1));
            continue;
        }
        let closing = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == closing) {
            out.push((name, end - i + 1));
        }
    }
    out
}

#[test]
fn no_function_of_the_appliance_outgrows_a_screenful_or_two() {
    let all = function_lengths(&root().join("appliance/src"));
    let long: Vec<String> = all
        .iter()
        .filter(|(_, _, n)| *n > 150)
        .map(|(f, name, n)| format!("{f}: {name} is {n} lines (at most 150)"))
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
    let run = all
        .iter()
        .find(|(f, name, _)| f == "serve.rs" && name == "run")
        .expect("serve.rs has its fn run");
    assert!(
        run.2 < 80,
        "serve::run is {} lines: it is the recipe, keep it under 80 (move a step into Core)",
        run.2
    );
}

#[test]
fn the_length_reader_finds_bodies_and_skips_declarations() {
    let code = "pub async fn a() {\n    let x = 1;\n}\nfn b() -> u8 { 1 }\n\
                trait T {\n    fn c(&self);\n    fn d(&self)\n    where\n        Self: Sized,\n    {\n        0\n    }\n}\n\
                pub(crate) fn e(\n    x: u8,\n) -> u8 {\n    x\n}\n";
    assert_eq!(
        lengths(code),
        [
            ("a".to_string(), 3),
            ("b".to_string(), 1),
            ("d".to_string(), 6),
            ("e".to_string(), 5)
        ]
    );
}

/// The error type of every `Result<T, E>` (or `Result::<T, E>`) written in `code` whose `E`
/// is a bare string: `String`, `Box<str>`, a `&str` or a `Cow` of one, whatever its
/// lifetime.
fn string_errors(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("Result") {
        if code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[i + "Result".len()..];
        let Some(args) = rest.strip_prefix('<').or_else(|| rest.strip_prefix("::<")) else {
            continue;
        };
        let (parts, end) = top_level(args);
        if let (Some(e), [_, .., error]) = (end, parts.as_slice())
            && bare_string(error.trim())
        {
            out.push(format!(
                "Result<{}>",
                args[..e].split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
    }
    out
}

/// `s` split at its commas outside brackets, up to the first bracket it closes (whose
/// index comes second; `None` when it closes none).
fn top_level(s: &str) -> (Vec<&str>, Option<usize>) {
    let (mut depth, mut start, mut parts) = (0usize, 0, Vec::new());
    for (j, c) in s.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth == 0 => {
                parts.push(&s[start..j]);
                return (parts, Some(j));
            }
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    (parts, None)
}

/// `String`, `Box<str>`, `&str`, `&'a str`, `Cow<'_, str>` …, or a tuple holding one
/// (`(Code, String)`: a string error with a tag).
fn bare_string(ty: &str) -> bool {
    let ty: String = ty.split_whitespace().collect();
    if let Some(inner) = ty.strip_prefix('(').and_then(|t| t.strip_suffix(')')) {
        return top_level(inner).0.into_iter().any(bare_string);
    }
    let borrowed = |t: &str| {
        t.strip_prefix('&').is_some_and(|r| {
            r == "str" || (r.starts_with('\'') && r.ends_with("str") && !r.contains(['<', ':']))
        })
    };
    ty == "String"
        || ty == "Box<str>"
        || borrowed(&ty)
        || ty
            .strip_prefix("Cow<")
            .and_then(|r| r.strip_suffix("str>"))
            .is_some_and(|lt| lt.is_empty() || lt.ends_with(','))
}

/// Every crate's `src` folder (the storm bench's too).
fn crate_sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root()).unwrap() {
        let dir = e.unwrap().path();
        for src in [dir.join("src"), dir.join("storm/src")] {
            if src.is_dir() {
                out.push(src);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_crate_returns_a_bare_string_as_its_error() {
    let mut found = Vec::new();
    for src in crate_sources() {
        for (p, code) in rust_files(&src, true) {
            for r in string_errors(&code) {
                found.push(format!(
                    "{}: {r}",
                    p.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "give these errors a type (thiserror):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_error_reader_sees_the_second_argument_only() {
    let code = "fn a() -> Result<HashMap<String, String>, Error> {}\n\
                fn b() -> Result<(u8, u16), String> {}\n\
                fn c() -> io::Result<String> {}\n\
                fn d() -> MyResult<u8, String> {}\n\
                fn e() -> Result<u8, &'static str> {}\n\
                let f = Result::<u8, String>::Ok(1);\n\
                fn g() -> Result<&'static str, Error> {}\n\
                fn h<'a>() -> Result<u8, &'a str> {}\n\
                fn i() -> Result<u8, Cow<'static, str>> {}\n\
                fn j() -> Result<u8, Box<str>> {}\n\
                fn k() -> Result<u8, Box<dyn Error>> {}\n\
                fn l() -> Result<u8, (Code, String)> {}\n\
                fn m() -> Result<u8, (Code, Vec<u8>)> {}\n";
    assert_eq!(
        string_errors(code),
        [
            "Result<(u8, u16), String>",
            "Result<u8, &'static str>",
            "Result<u8, String>",
            "Result<u8, &'a str>",
            "Result<u8, Cow<'static, str>>",
            "Result<u8, Box<str>>",
            "Result<u8, (Code, String)>"
        ]
    );
}
