//! The web console (`/ui`): every appliance host serves it. Server-rendered HTML, escaped,
//! no JavaScript needed; the node list refreshes itself.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use paddock_inspector::node::{Node, iso};
use paddock_inspector::service::TimelineEvent;
use serde_json::Value;

use crate::http::AppState;

/// HTML-escapes text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn page(title: &str, refresh: bool, body: &str) -> Html<String> {
    let refresh = if refresh {
        r#"<meta http-equiv="refresh" content="5">"#
    } else {
        ""
    };
    Html(format!(
        r#"<!doctype html><html><head><meta charset="utf-8">{refresh}<title>{t} · Paddock</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2rem;color:#222}} h1{{font-size:1.4rem}} h2{{font-size:1.1rem;margin-top:1.5rem}}
table{{border-collapse:collapse}} td,th{{border-bottom:1px solid #ddd;padding:.3rem .7rem;text-align:left;vertical-align:top}}
.state{{font-weight:600}} .error{{color:#b00}} .finished{{color:#070}} .waiting,.enrolling,.processing{{color:#a60}}
code{{font-size:.9em}} nav a{{margin-right:1rem}}
</style></head><body><nav><a href="/ui">Nodes</a><a href="/ui/leases">Leases</a><a href="/ui/firewall">PXE filter</a><a href="/metrics">Metrics</a></nav>
<h1>{t}</h1>{body}</body></html>"#,
        t = esc(title)
    ))
}

fn state_cell(n: &Node) -> String {
    let s = n.state().map_or("-", |s| s.as_str());
    format!(r#"<span class="state {s}">{s}</span>"#)
}

fn prop(n: &Node, k: &str) -> String {
    n.properties
        .get(k)
        .map(|v| match v {
            Value::String(s) => esc(s),
            other => esc(&other.to_string()),
        })
        .unwrap_or_default()
}

pub async fn nodes(State(s): State<AppState>) -> Response {
    let mut nodes = match s.inspector.list().await {
        Ok(n) => n,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, esc(&e.message)).into_response(),
    };
    nodes.sort_by_key(|n| std::cmp::Reverse(n.created_at));
    let mut rows = String::new();
    for n in &nodes {
        rows.push_str(&format!(
            r#"<tr><td><a href="/ui/nodes/{u}">{name}</a></td><td>{state}</td><td>{err}</td><td><code>{macs}</code></td><td>{cpus}</td><td>{mem}</td><td>{disk}</td><td>{arch}</td></tr>"#,
            u = n.uuid,
            name = esc(&n.label()),
            state = state_cell(n),
            err = n.introspection.as_ref().and_then(|i| i.error.as_deref()).map(|e| format!(r#"<span class="error">{}</span>"#, esc(e))).unwrap_or_default(),
            macs = esc(&n.macs.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" ")),
            cpus = prop(n, "cpus"),
            mem = prop(n, "memory_mb"),
            disk = prop(n, "local_gb"),
            arch = prop(n, "cpu_arch"),
        ));
    }
    let body = if nodes.is_empty() {
        "<p>No nodes yet. Power on a machine on the provisioning network: it enrols itself.</p>"
            .to_string()
    } else {
        format!(
            "<table><tr><th>Node</th><th>State</th><th>Error</th><th>MACs</th><th>CPUs</th><th>Memory MiB</th><th>Disk GiB</th><th>Arch</th></tr>{rows}</table>"
        )
    };
    page(&format!("Nodes ({})", nodes.len()), true, &body).into_response()
}

pub async fn node(State(s): State<AppState>, Path(ident): Path<String>) -> Response {
    let v = match s.inspector.find(&ident).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "Not found",
                    false,
                    &format!("<p>No node {}.</p>", esc(&ident)),
                ),
            )
                .into_response();
        }
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, esc(&e.message)).into_response(),
    };
    let n = &v.node;
    let timeline: Vec<TimelineEvent> = s.inspector.timeline(n).await.unwrap_or_default();
    let data: Option<Value> = s
        .inspector
        .data(&n.uuid.to_string(), true)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let i = n.introspection.as_ref();
    let mut body = format!(
        "<table><tr><th>UUID</th><td><code>{}</code></td></tr><tr><th>State</th><td>{}</td></tr><tr><th>Error</th><td class=error>{}</td></tr><tr><th>Started</th><td>{}</td></tr><tr><th>Finished</th><td>{}</td></tr><tr><th>MACs</th><td><code>{}</code> (PXE {})</td></tr><tr><th>BMC</th><td>{}</td></tr><tr><th>Auto-discovered</th><td>{}</td></tr><tr><th>Properties</th><td><code>{}</code></td></tr><tr><th>Traits</th><td>{}</td></tr></table>",
        n.uuid,
        state_cell(n),
        esc(i.and_then(|i| i.error.as_deref()).unwrap_or("")),
        i.and_then(|i| i.started_at).map(iso).unwrap_or_default(),
        i.and_then(|i| i.finished_at).map(iso).unwrap_or_default(),
        esc(&n
            .macs
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(" ")),
        n.pxe_mac
            .map(|m| m.to_string())
            .unwrap_or_else(|| "-".into()),
        esc(n.bmc_address.as_deref().unwrap_or("-")),
        n.auto_discovered,
        esc(&Value::Object(n.properties.clone()).to_string()),
        esc(&n.traits.join(", ")),
    );
    if let Some(d) = &data {
        let inv = &d["inventory"];
        body.push_str("<h2>Inventory</h2><table>");
        let row = |k: &str, v: String| format!("<tr><th>{}</th><td>{}</td></tr>", esc(k), v);
        body.push_str(&row(
            "System",
            esc(&format!(
                "{} {} (serial {})",
                inv["system_vendor"]["manufacturer"].as_str().unwrap_or(""),
                inv["system_vendor"]["product_name"].as_str().unwrap_or(""),
                inv["system_vendor"]["serial_number"].as_str().unwrap_or("")
            )),
        ));
        body.push_str(&row(
            "Firmware",
            esc(&format!(
                "{} {} · boot mode {}",
                inv["system_vendor"]["firmware"]["vendor"]
                    .as_str()
                    .unwrap_or(""),
                inv["system_vendor"]["firmware"]["version"]
                    .as_str()
                    .unwrap_or(""),
                inv["boot"]["current_boot_mode"].as_str().unwrap_or("")
            )),
        ));
        body.push_str(&row(
            "CPU",
            esc(&format!(
                "{} × {} ({})",
                inv["cpu"]["count"],
                inv["cpu"]["model_name"].as_str().unwrap_or(""),
                inv["cpu"]["architecture"].as_str().unwrap_or("")
            )),
        ));
        body.push_str(&row(
            "Memory",
            esc(&format!("{} MiB", inv["memory"]["physical_mb"])),
        ));
        for disk in inv["disks"].as_array().into_iter().flatten() {
            body.push_str(&row(
                "Disk",
                esc(&format!(
                    "{} {} bytes {} serial {}",
                    disk["name"].as_str().unwrap_or(""),
                    disk["size"],
                    disk["model"].as_str().unwrap_or(""),
                    disk["serial"].as_str().unwrap_or("")
                )),
            ));
        }
        for nic in inv["interfaces"].as_array().into_iter().flatten() {
            body.push_str(&row(
                "NIC",
                esc(&format!(
                    "{} {} {} {} {}",
                    nic["name"].as_str().unwrap_or(""),
                    nic["mac_address"].as_str().unwrap_or(""),
                    nic["ipv4_address"].as_str().unwrap_or(""),
                    nic["driver"].as_str().unwrap_or(""),
                    nic["pci_address"].as_str().unwrap_or("")
                )),
            ));
        }
        body.push_str("</table>");
    }
    body.push_str(
        "<h2>Timeline</h2><table><tr><th>When (UTC)</th><th>What</th><th>Details</th></tr>",
    );
    for e in &timeline {
        let class = if e.error { " class=error" } else { "" };
        body.push_str(&format!(
            "<tr{class}><td>{}.{:03}</td><td>{}</td><td>{}</td></tr>",
            iso(e.at_ms / 1000),
            e.at_ms % 1000,
            esc(&e.kind),
            esc(&e.message)
        ));
    }
    body.push_str("</table>");
    page(&n.label(), n.inspecting(), &body).into_response()
}

pub async fn firewall(State(s): State<AppState>) -> Response {
    let Some(f) = &s.filter else {
        return page(
            "PXE filter",
            false,
            "<p>The PXE filter is off (<code>[firewall] enabled = false</code>).</p>",
        )
        .into_response();
    };
    let st = f.status();
    let list = |k: &str| {
        st[k]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.as_str())
                    .map(esc)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    let body = format!(
        "<table><tr><th>Interface</th><td>{}</td></tr><tr><th>Pass rule</th><td>{}</td></tr><tr><th>Unknown MACs</th><td>{}</td></tr><tr><th>Last sync (UTC)</th><td>{}</td></tr><tr><th>Syncs</th><td>{}</td></tr><tr><th>Drift repaired</th><td>{}</td></tr><tr><th>Last error</th><td class=error>{}</td></tr><tr><th>Allow ({})</th><td><code>{}</code></td></tr><tr><th>Deny ({})</th><td><code>{}</code></td></tr></table>",
        esc(st["interface"].as_str().unwrap_or("")),
        if st["pass"] == true {
            "present: this host answers PXE"
        } else {
            "absent: closed"
        },
        if st["discovery"] == true {
            "allowed (discovery on)"
        } else {
            "blocked (discovery off)"
        },
        st["last_sync_ms"]
            .as_i64()
            .map(|ms| iso(ms / 1000))
            .unwrap_or_default(),
        st["syncs"],
        st["drift_repaired"],
        esc(st["last_error"].as_str().unwrap_or("")),
        st["allow"].as_array().map_or(0, Vec::len),
        list("allow"),
        st["deny"].as_array().map_or(0, Vec::len),
        list("deny"),
    );
    page("PXE filter", true, &body).into_response()
}

pub async fn leases(State(s): State<AppState>) -> Response {
    let leases = s.dhcp.as_ref().map(|d| d.leases()).unwrap_or_default();
    let mut rows = String::new();
    for l in &leases {
        rows.push_str(&format!(
            "<tr><td>{}</td><td><code>{}</code></td><td>{:?}</td><td>{}</td><td>{}</td></tr>",
            l.ip,
            l.mac,
            l.state,
            iso(l.expires as i64),
            esc(&l
                .relay
                .as_ref()
                .map(|r| r.giaddr.to_string())
                .unwrap_or_default())
        ));
    }
    page(
        &format!("DHCP leases ({})", leases.len()),
        false,
        &format!("<table><tr><th>IP</th><th>MAC</th><th>State</th><th>Expires (UTC)</th><th>Relay</th></tr>{rows}</table>"),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_that_matters() {
        assert_eq!(
            esc(r#"<script>alert("x&y")</script>'"#),
            "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;"
        );
    }
}
