//! Command-line clients of a running appliance's API (`paddock node …`).

use anyhow::{Context, bail};
use serde_json::Value;

/// Calls the API; an `{"error": {"message"}}` answer becomes the error text.
fn call(api: &str, method: &str, path: &str) -> anyhow::Result<Value> {
    let url = format!("{}{path}", api.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .build()
        .into();
    let resp = match method {
        "POST" => agent.post(&url).send_empty(),
        _ => agent.get(&url).call(),
    }
    .with_context(|| format!("cannot reach the appliance at {api} (set --api or PADDOCK_API)"))?;
    answer(method, path, resp)
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn node_list(api: &str) -> anyhow::Result<()> {
    let nodes = call(api, "GET", "/api/v1/nodes")?;
    println!(
        "{:<36}  {:<16}  {:<10}  {:>4}  {:>7}  {:>6}  MACS",
        "UUID", "NAME", "STATE", "CPUS", "MEM_MB", "DISK_G"
    );
    for n in nodes.as_array().into_iter().flatten() {
        println!(
            "{:<36}  {:<16}  {:<10}  {:>4}  {:>7}  {:>6}  {}",
            s(&n["uuid"]),
            s(&n["name"]),
            s(&n["introspection"]["state"]),
            s(&n["properties"]["cpus"]),
            s(&n["properties"]["memory_mb"]),
            s(&n["properties"]["local_gb"]),
            n["macs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    Ok(())
}

pub fn node_show(api: &str, node: &str) -> anyhow::Result<()> {
    let n = call(api, "GET", &format!("/api/v1/nodes/{node}"))?;
    println!("uuid        {}", s(&n["uuid"]));
    println!("name        {}", s(&n["name"]));
    println!("state       {}", s(&n["introspection"]["state"]));
    println!("error       {}", s(&n["introspection"]["error"]));
    println!(
        "macs        {}",
        n["macs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("bmc         {}", s(&n["bmc_address"]));
    println!("driver      {}", s(&n["driver"]));
    println!("driver_info {}", n["driver_info"]);
    println!("properties  {}", n["properties"]);
    println!("extra       {}", n["extra"]);
    println!("timeline:");
    for e in n["timeline"].as_array().into_iter().flatten() {
        let at = e["at_ms"].as_i64().unwrap_or(0);
        let mark = if e["error"] == Value::Bool(true) {
            "!"
        } else {
            " "
        };
        println!(
            "  {}.{:03} {mark} {:<24} {}",
            paddock_inspector::node::iso(at / 1000),
            at % 1000,
            s(&e["kind"]),
            s(&e["message"])
        );
    }
    Ok(())
}

/// What `paddock node set` changes, as `baremetal node set` takes it.
#[derive(Debug, Default)]
pub struct NodeSet<'a> {
    pub name: Option<&'a str>,
    pub driver: Option<&'a str>,
    pub resource_class: Option<&'a str>,
    pub description: Option<&'a str>,
    pub bmc_address: Option<&'a str>,
    /// `KEY=VALUE` each.
    pub properties: &'a [String],
    pub extra: &'a [String],
    pub driver_info: &'a [String],
    pub instance_info: &'a [String],
    pub reset_interfaces: bool,
}

/// The JSON patch `paddock node set` sends: an `add` per attribute. A `KEY=VALUE` value is
/// JSON when it reads as JSON (`cpus=4` is 4, `root_device={"serial": "x"}` an object) and
/// text otherwise, as ironicclient's `split_and_deserialize` reads it.
pub fn node_set_patch(s: &NodeSet) -> anyhow::Result<Vec<Value>> {
    let add =
        |path: String, value: Value| serde_json::json!({"op": "add", "path": path, "value": value});
    let mut ops = Vec::new();
    for (key, v) in [
        ("name", s.name),
        ("driver", s.driver),
        ("resource_class", s.resource_class),
        ("description", s.description),
        ("bmc_address", s.bmc_address),
    ] {
        if let Some(v) = v {
            ops.push(add(format!("/{key}"), Value::String(v.to_string())));
        }
    }
    for (attr, pairs) in [
        ("properties", s.properties),
        ("extra", s.extra),
        ("driver_info", s.driver_info),
        ("instance_info", s.instance_info),
    ] {
        for pair in pairs {
            let (key, value) = pair
                .split_once('=')
                .with_context(|| format!("{pair:?} is not KEY=VALUE"))?;
            let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.into()));
            ops.push(add(format!("/{attr}/{key}"), value));
        }
    }
    if ops.is_empty() {
        bail!("nothing to set: give --name, --driver, --property KEY=VALUE, …");
    }
    Ok(ops)
}

/// `paddock node set`: one PATCH with every change (Ironic's semantics, all or nothing).
pub fn node_set(api: &str, node: &str, s: &NodeSet) -> anyhow::Result<()> {
    let ops = node_set_patch(s)?;
    let query = if s.reset_interfaces {
        "?reset_interfaces=true"
    } else {
        ""
    };
    call_body(
        api,
        "PATCH",
        &format!("/api/v1/nodes/{node}{query}"),
        &Value::Array(ops),
    )?;
    println!("node {node} updated");
    Ok(())
}

pub fn node_inspect(api: &str, node: &str) -> anyhow::Result<()> {
    call(api, "POST", &format!("/v1/introspection/{node}"))?;
    println!(
        "introspection of {node} started: it boots the discovery ramdisk at its next PXE boot"
    );
    Ok(())
}

pub fn node_abort(api: &str, node: &str) -> anyhow::Result<()> {
    call(api, "POST", &format!("/v1/introspection/{node}/abort"))?;
    println!("introspection of {node} aborted");
    Ok(())
}

pub fn firewall_status(api: &str) -> anyhow::Result<()> {
    let st = call(api, "GET", "/api/v1/firewall")?;
    if st["enabled"] == Value::Bool(false) {
        println!("PXE filter: off ([firewall] enabled = false)");
        return Ok(());
    }
    println!("interface       {}", s(&st["interface"]));
    println!(
        "pass rule       {}",
        if st["pass"] == Value::Bool(true) {
            "present (this host answers PXE)"
        } else {
            "absent (closed)"
        }
    );
    println!(
        "unknown MACs    {}",
        if st["discovery"] == Value::Bool(true) {
            "allowed"
        } else {
            "blocked"
        }
    );
    let at = st["last_sync_ms"].as_i64().unwrap_or(0);
    println!(
        "last sync       {} UTC",
        paddock_inspector::node::iso(at / 1000)
    );
    println!("syncs           {}", s(&st["syncs"]));
    println!("drift repaired  {}", s(&st["drift_repaired"]));
    println!("last error      {}", s(&st["last_error"]));
    for k in ["allow", "deny"] {
        let macs: Vec<String> = st[k].as_array().into_iter().flatten().map(s).collect();
        println!("{k:<15} {} {}", macs.len(), macs.join(" "));
    }
    Ok(())
}

fn agent(timeout: Option<std::time::Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(timeout)
        .build()
        .into()
}

fn answer(
    method: &str,
    path: &str,
    resp: ureq::http::Response<ureq::Body>,
) -> anyhow::Result<Value> {
    let status = resp.status().as_u16();
    let text = resp.into_body().read_to_string().unwrap_or_default();
    let body: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    if status >= 400 {
        let msg = body["error"]["message"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| body.to_string());
        bail!("{method} {path}: {status}: {msg}");
    }
    Ok(body)
}

/// Sends a JSON body with `method` (`POST` or `PATCH`).
fn call_body(api: &str, method: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
    let url = format!("{}{path}", api.trim_end_matches('/'));
    let agent = agent(Some(std::time::Duration::from_secs(600)));
    let resp = match method {
        "PATCH" => agent.patch(&url).send_json(body),
        _ => agent.post(&url).send_json(body),
    }
    .with_context(|| format!("cannot reach the appliance at {api} (set --api or PADDOCK_API)"))?;
    answer(method, path, resp)
}

/// Sends the tarball while drawing a progress bar on stderr.
struct Progress<R> {
    inner: R,
    sent: u64,
    total: u64,
    started: std::time::Instant,
    last: std::time::Instant,
    tty: bool,
}

impl<R: std::io::Read> Progress<R> {
    fn draw(&self, done: bool) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let pct = if self.total == 0 {
            100.0
        } else {
            self.sent as f64 * 100.0 / self.total as f64
        };
        let width = 30usize;
        let filled = ((pct / 100.0) * width as f64) as usize;
        let line = format!(
            "  [{}{}] {pct:5.1}%  {:.1}/{:.1} MiB  {:.1} MiB/s",
            "#".repeat(filled.min(width)),
            " ".repeat(width - filled.min(width)),
            self.sent as f64 / 1048576.0,
            self.total as f64 / 1048576.0,
            self.sent as f64 / 1048576.0 / secs
        );
        if self.tty {
            eprint!("\r{line}{}", if done { "\n" } else { "" });
        } else if done {
            eprintln!("{line}");
        }
    }
}

impl<R: std::io::Read> std::io::Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sent += n as u64;
        if self.last.elapsed() >= std::time::Duration::from_millis(200) {
            self.last = std::time::Instant::now();
            self.draw(false);
        }
        Ok(n)
    }
}

pub struct ImageAdd<'a> {
    pub name: &'a str,
    pub tarball: &'a std::path::Path,
    pub filter: Option<&'a std::path::Path>,
    pub triggers: Option<&'a std::path::Path>,
    pub expires_in_secs: Option<i64>,
}

pub fn image_add(api: &str, a: &ImageAdd) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Read};
    let read_text = |p: Option<&std::path::Path>| -> anyhow::Result<Option<String>> {
        p.map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
            .transpose()
    };
    let filter = read_text(a.filter)?;
    let triggers = read_text(a.triggers)?;
    // Check the files here too, so a typo fails before the upload.
    if let Some(f) = &filter {
        paddock_image::Filter::parse(f).with_context(|| {
            a.filter
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        })?;
    }
    if let Some(t) = &triggers {
        paddock_image::Triggers::parse(t).with_context(|| {
            a.triggers
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        })?;
    }
    // The server refuses a taken or retired name before reading the upload; ask first so
    // that the answer is a message, not a broken pipe half-way through the tarball.
    match call(
        api,
        "GET",
        &format!("/rpc/ImageServer.ShowImage?name={}", q(a.name)),
    ) {
        Ok(v) if v["record"]["deleted"] == Value::Bool(true) => {
            bail!(
                "image name {:?} belonged to a deleted image and cannot be used again",
                a.name
            )
        }
        Ok(_) => bail!("image {:?} already exists", a.name),
        Err(e) if e.to_string().contains(": 404:") => {}
        Err(e) => return Err(e),
    }
    let file = std::fs::File::open(a.tarball)
        .with_context(|| format!("opening {}", a.tarball.display()))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut header = serde_json::to_vec(&serde_json::json!({
        "name": a.name,
        "filter": filter,
        "triggers": triggers,
        "expires_in_secs": a.expires_in_secs,
        "created_by": std::env::var("USER").unwrap_or_default(),
    }))?;
    header.push(b'\n');
    let now = std::time::Instant::now();
    let mut body = std::io::Cursor::new(header).chain(Progress {
        inner: file,
        sent: 0,
        total,
        started: now,
        last: now,
        tty: std::io::stderr().is_terminal(),
    });
    eprintln!("adding image {} from {}", a.name, a.tarball.display());
    let path = "/rpc/ImageServer.AddImage";
    let url = format!("{}{path}", api.trim_end_matches('/'));
    let resp = agent(None)
        .post(&url)
        .header("content-type", "application/octet-stream")
        .send(ureq::SendBody::from_reader(&mut body))
        .with_context(|| {
            format!("cannot reach the appliance at {api} (set --api or PADDOCK_API)")
        })?;
    body.get_ref().1.draw(true);
    let v = answer("POST", path, resp)?;
    let st = &v["stats"];
    let mib = |k: &str| st[k].as_u64().unwrap_or(0) as f64 / 1048576.0;
    println!(
        "image {} added in {:.1} s",
        a.name,
        v["seconds"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  files {}  directories {}  symlinks {}  devices/fifos {}  hard links {}  filtered {}",
        st["files"],
        st["directories"],
        st["symlinks"],
        st["specials"],
        st["hardlinks"],
        st["filtered"]
    );
    println!(
        "  bytes {:.1} MiB in {} objects",
        mib("bytes"),
        st["objects"]
    );
    println!(
        "  new objects {} ({:.1} MiB)  deduplicated {:.1} MiB",
        st["new_objects"],
        mib("new_bytes"),
        mib("dedup_bytes")
    );
    Ok(())
}

pub fn image_list(api: &str) -> anyhow::Result<()> {
    let v = call(api, "GET", "/rpc/ImageServer.ListImages")?;
    println!(
        "{:<32}  {:>8}  {:>10}  {:>8}  {:<7}  CREATED",
        "IMAGE", "FILES", "MIB", "OBJECTS", "FILTER"
    );
    for r in v["images"].as_array().into_iter().flatten() {
        if r["deleted"] == Value::Bool(true) {
            continue;
        }
        println!(
            "{:<32}  {:>8}  {:>10.1}  {:>8}  {:<7}  {}",
            s(&r["name"]),
            s(&r["files"]),
            r["bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0,
            s(&r["objects"]),
            if r["filter"].is_null() {
                "sparse"
            } else {
                "yes"
            },
            paddock_inspector::node::iso(r["created_on_ms"].as_i64().unwrap_or(0) / 1000)
        );
    }
    Ok(())
}

fn q(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn image_show(api: &str, name: &str) -> anyhow::Result<()> {
    let d = call(
        api,
        "GET",
        &format!("/rpc/ImageServer.ShowImage?name={}", q(name)),
    )?;
    let r = &d["record"];
    let mib = |v: &Value| v.as_u64().unwrap_or(0) as f64 / 1048576.0;
    println!("image       {}", s(&r["name"]));
    if r["deleted"] == Value::Bool(true) {
        println!("deleted     yes (the name cannot be used again)");
        return Ok(());
    }
    println!("files       {}", s(&r["files"]));
    println!("bytes       {:.1} MiB", mib(&r["bytes"]));
    println!(
        "objects     {} ({} only here, {:.1} MiB; {} shared, {:.1} MiB; {} missing)",
        s(&r["objects"]),
        s(&d["unique_objects"]),
        mib(&d["unique_bytes"]),
        s(&d["shared_objects"]),
        mib(&d["shared_bytes"]),
        s(&d["missing_objects"])
    );
    println!(
        "filter      {}",
        r["filter"]
            .as_array()
            .map_or("none (sparse image)".to_string(), |l| format!(
                "{} line(s)",
                l.len()
            ))
    );
    println!(
        "triggers    {}",
        r["triggers"].as_array().map_or(0, |l| l.len())
    );
    println!(
        "created     {}",
        paddock_inspector::node::iso(r["created_on_ms"].as_i64().unwrap_or(0) / 1000)
    );
    if let Some(e) = r["expires_at_ms"].as_i64() {
        println!("expires     {}", paddock_inspector::node::iso(e / 1000));
    }
    Ok(())
}

pub fn image_delete(api: &str, name: &str) -> anyhow::Result<()> {
    call(
        api,
        "POST",
        &format!("/rpc/ImageServer.DeleteImage?name={}", q(name)),
    )?;
    println!(
        "image {name} deleted (its name cannot be used again; run `paddock image gc` to free its objects)"
    );
    Ok(())
}

pub fn image_gc(api: &str) -> anyhow::Result<()> {
    let r = call_body(
        api,
        "POST",
        "/rpc/ImageServer.DeleteUnreferencedObjects",
        &Value::Null,
    )?;
    println!(
        "deleted {} unreferenced object(s), {:.1} MiB; {} kept",
        s(&r["deleted_objects"]),
        r["deleted_bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0,
        s(&r["kept_objects"])
    );
    Ok(())
}

pub fn image_check(api: &str, name: &str) -> anyhow::Result<()> {
    let r = call_body(
        api,
        "POST",
        &format!("/rpc/ImageServer.CheckImage?name={}", q(name)),
        &Value::Null,
    )?;
    if r["ok"] == Value::Bool(true) {
        println!("image {name}: every object present and intact");
        return Ok(());
    }
    for b in r["bad"].as_array().into_iter().flatten() {
        println!("{}  {}", s(&b["problem"]), s(&b["object"]));
    }
    bail!("image {name} has damaged or missing objects")
}

pub fn mdb_list(api: &str) -> anyhow::Result<()> {
    let v = call(api, "GET", "/rpc/Mdb.ListMachines")?;
    println!(
        "{:<28}  {:<15}  {:<24}  {:<24}  SOURCE",
        "HOSTNAME", "IP", "REQUIRED", "PLANNED"
    );
    for e in v["machines"].as_array().into_iter().flatten() {
        let m = &e["machine"];
        println!(
            "{:<28}  {:<15}  {:<24}  {:<24}  {}",
            s(&m["Hostname"]),
            s(&m["IpAddress"]),
            s(&m["RequiredImage"]),
            s(&m["PlannedImage"]),
            s(&e["source"])
        );
    }
    Ok(())
}

pub fn mdb_set(api: &str, machine: &Value) -> anyhow::Result<()> {
    call_body(api, "POST", "/rpc/Mdb.SetMachine", machine)?;
    println!("mdb: {} set", s(&machine["Hostname"]));
    Ok(())
}

pub fn mdb_delete(api: &str, hostname: &str) -> anyhow::Result<()> {
    call(
        api,
        "POST",
        &format!("/rpc/Mdb.DeleteMachine?hostname={}", q(hostname)),
    )?;
    println!("mdb: {hostname} deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_set_is_one_patch_with_values_read_as_ironicclient_reads_them() {
        let props = ["inspection_scope=gpu".to_string(), "cpus=4".to_string()];
        let info = ["ipmi_address=192.0.2.9".to_string()];
        let extra = [r#"root={"serial": "x"}"#.to_string()];
        let ops = node_set_patch(&NodeSet {
            driver: Some("ipmi"),
            properties: &props,
            driver_info: &info,
            extra: &extra,
            ..NodeSet::default()
        })
        .unwrap();
        assert_eq!(
            Value::Array(ops),
            json!([
                {"op": "add", "path": "/driver", "value": "ipmi"},
                {"op": "add", "path": "/properties/inspection_scope", "value": "gpu"},
                {"op": "add", "path": "/properties/cpus", "value": 4},
                {"op": "add", "path": "/extra/root", "value": {"serial": "x"}},
                {"op": "add", "path": "/driver_info/ipmi_address", "value": "192.0.2.9"}
            ])
        );
        assert!(node_set_patch(&NodeSet::default()).is_err());
        let bad = ["novalue".to_string()];
        let e = node_set_patch(&NodeSet {
            properties: &bad,
            ..NodeSet::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("not KEY=VALUE"), "{e}");
    }
}
