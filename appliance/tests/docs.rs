//! docs/api.md stays true: every route the routers serve is documented there, every
//! documented route is the `Service.Method` the access table says, and every documented
//! `paddock` command exists.

use std::collections::BTreeSet;
use std::path::PathBuf;

use paddock::access::{Access, access};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn api_md() -> String {
    std::fs::read_to_string(root().join("docs/api.md")).expect("docs/api.md")
}

/// `{node}`, `{*name}` … all read as one placeholder.
fn shape(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

/// The table rows of docs/api.md: (method, path, Service.Method or "public").
fn documented_routes() -> Vec<(String, String, String)> {
    api_md()
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            // | method | `path` | Service.Method | purpose |
            let [_, method, path, svc, ..] = cells.as_slice() else {
                return None;
            };
            let path = path.strip_prefix('`')?.strip_suffix('`')?;
            let method = method.to_string();
            method
                .chars()
                .all(|c| c.is_ascii_uppercase())
                .then(|| (method, path.to_string(), svc.to_string()))
        })
        .collect()
}

/// The path of every `.route("…", …)` in the routers `paddock serve` mounts.
fn served_paths() -> BTreeSet<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("appliance/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.push(root().join("inspector/src/api.rs"));
    files.push(root().join("imageserver/src/api.rs"));
    let mut paths = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text
            .find("#[cfg(test)]\nmod tests")
            .map_or(text.as_str(), |i| &text[..i]);
        for (i, _) in code.match_indices(".route(") {
            let rest = code[i + ".route(".len()..].trim_start();
            if let Some(lit) = rest.strip_prefix('"')
                && let Some(end) = lit.find('"')
            {
                paths.insert(lit[..end].to_string());
            }
        }
    }
    paths
}

#[test]
fn every_route_served_is_documented() {
    let served = served_paths();
    assert!(
        served.len() > 60,
        "the reader found the routers: {served:?}"
    );
    let documented: BTreeSet<String> = documented_routes()
        .iter()
        .map(|(_, p, _)| shape(p))
        .collect();
    let missing: Vec<&String> = served
        .iter()
        .filter(|p| !documented.contains(&shape(p)))
        .collect();
    assert!(
        missing.is_empty(),
        "served but not in docs/api.md: {missing:?}"
    );
}

#[test]
fn every_documented_route_is_the_method_the_access_table_says() {
    let rows = documented_routes();
    assert!(
        rows.len() > 60,
        "the reader found the tables: {}",
        rows.len()
    );
    let mut wrong = Vec::new();
    for (method, path, svc) in &rows {
        let concrete = path
            .replace("{node}", "7f3a8c52-1e2b-4c7d-9a6e-000000000001")
            .replace("{uuid}", "7f3a8c52-1e2b-4c7d-9a6e-000000000002")
            .replace("{mac}", "52-54-00-00-00-01");
        let concrete = shape(&concrete).replace("{}", "x");
        let want = match access(method, &concrete) {
            Access::Public => "public".to_string(),
            a => a.method().to_string(),
        };
        if !svc.starts_with(&want) {
            wrong.push(format!(
                "{method} {path}: documented {svc:?}, the table says {want}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_documented_command_exists() {
    let md = api_md();
    let cli = &md[md.find("## CLI").expect("a CLI section")..];
    let commands: Vec<&str> = cli
        .lines()
        .filter_map(|l| l.strip_prefix("- `paddock ")?.split_once('`'))
        .map(|(c, _)| c)
        .collect();
    assert!(commands.len() > 30, "{commands:?}");
    for c in commands {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paddock"))
            .args(c.split_whitespace())
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "paddock {c} --help: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
