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
    println!("properties  {}", n["properties"]);
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
