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
</style></head><body><nav><a href="/ui">Nodes</a><a href="/ui/leases">Leases</a><a href="/ui/firewall">PXE filter</a><a href="/ui/images">Images</a><a href="/ui/mdb">MDB</a><a href="/metrics">Metrics</a></nav>
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
    let leads = s.leader.borrow().is_some();
    let who = match &s.config.cluster {
        None => "one host: this host serves PXE".to_string(),
        Some(c) => format!(
            "host {} of several ({}): {}",
            esc(&c.host),
            esc(&c.etcd_endpoints.join(", ")),
            if leads {
                "this host leads and serves PXE"
            } else {
                "a follower (another host serves PXE)"
            }
        ),
    };
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
        "<table><tr><th>Appliance</th><td>{who}</td></tr><tr><th>Interface</th><td>{}</td></tr><tr><th>Pass rule</th><td>{}</td></tr><tr><th>Unknown MACs</th><td>{}</td></tr><tr><th>Last sync (UTC)</th><td>{}</td></tr><tr><th>Syncs</th><td>{}</td></tr><tr><th>Drift repaired</th><td>{}</td></tr><tr><th>Last error</th><td class=error>{}</td></tr><tr><th>Allow ({})</th><td><code>{}</code></td></tr><tr><th>Deny ({})</th><td><code>{}</code></td></tr></table>",
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

fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn ms_iso(ms: Option<i64>) -> String {
    ms.map(|m| iso(m / 1000)).unwrap_or_else(|| "-".into())
}

pub async fn images(State(s): State<AppState>) -> Response {
    let list = match s.imageserver.images.list().await {
        Ok(l) => l,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, esc(&e.to_string())).into_response(),
    };
    let mut rows = String::new();
    for r in list.iter().filter(|r| !r.deleted) {
        rows.push_str(&format!(
            r#"<tr><td><a href="/ui/images/{n}">{n}</a></td><td>{files}</td><td>{bytes}</td><td>{objects}</td><td>{filter}</td><td>{triggers}</td><td>{created}</td><td>{expires}</td></tr>"#,
            n = esc(&r.name),
            files = r.files,
            bytes = bytes(r.bytes),
            objects = r.objects,
            filter = r.filter.as_ref().map_or("sparse (no filter)".to_string(), |f| format!("{} line(s)", f.lines().len())),
            triggers = r.triggers.list().len(),
            created = ms_iso(Some(r.created_on_ms)),
            expires = ms_iso(r.expires_at_ms),
        ));
    }
    let deleted: Vec<String> = list
        .iter()
        .filter(|r| r.deleted)
        .map(|r| esc(&r.name))
        .collect();
    let body = format!(
        r#"<p>Add with <code>paddock image add NAME TARBALL [--filter F] [--triggers T]</code>.</p>
<table><tr><th>Image</th><th>Files</th><th>Bytes</th><th>Objects</th><th>Filter</th><th>Triggers</th><th>Created</th><th>Expires</th></tr>{rows}</table>
<h2>Retired names</h2><p>{}</p>"#,
        if deleted.is_empty() {
            "none".to_string()
        } else {
            deleted.join(", ")
        }
    );
    page("Images", false, &body).into_response()
}

pub async fn image(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    let d = match s.imageserver.images.show(&name).await {
        Ok(d) => d,
        Err(e) => {
            return (
                StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                esc(&e.to_string()),
            )
                .into_response();
        }
    };
    let r = &d.record;
    let filter = r
        .filter
        .as_ref()
        .map_or("(none: a sparse image)".to_string(), |f| {
            esc(&f.lines().join("\n"))
        });
    let triggers = r
        .triggers
        .list()
        .iter()
        .map(|t| {
            format!(
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                esc(&t.service),
                esc(&t.match_lines.join(" ")),
                [
                    (t.do_reload, "reload"),
                    (t.do_reboot, "reboot"),
                    (t.high_impact, "high impact")
                ]
                .iter()
                .filter(|x| x.0)
                .map(|x| x.1)
                .collect::<Vec<_>>()
                .join(", ")
            )
        })
        .collect::<String>();
    let body = format!(
        r#"<table>
<tr><th>Files</th><td>{files}</td></tr><tr><th>Bytes</th><td>{bytes}</td></tr>
<tr><th>Objects</th><td>{objects}: {uo} only in this image ({ub}), {so} shared with other images ({sb}), {mo} missing</td></tr>
<tr><th>Created</th><td>{created} by {by}</td></tr><tr><th>Expires</th><td>{exp}</td></tr>
<tr><th>Deleted</th><td>{del}</td></tr></table>
<h2>Filter</h2><pre>{filter}</pre><h2>Triggers</h2><table><tr><th>Service</th><th>Match</th><th>Flags</th></tr>{triggers}</table>"#,
        files = r.files,
        bytes = bytes(r.bytes),
        objects = r.objects,
        uo = d.unique_objects,
        ub = bytes(d.unique_bytes),
        so = d.shared_objects,
        sb = bytes(d.shared_bytes),
        mo = d.missing_objects,
        created = ms_iso(Some(r.created_on_ms)),
        by = esc(if r.created_by.is_empty() {
            "-"
        } else {
            &r.created_by
        }),
        exp = ms_iso(r.expires_at_ms),
        del = if r.deleted {
            ms_iso(r.deleted_on_ms)
        } else {
            "no".into()
        },
    );
    page(&format!("Image {name}"), false, &body).into_response()
}

pub async fn mdb(State(s): State<AppState>) -> Response {
    let entries = match s.imageserver.mdb.entries().await {
        Ok(e) => e,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, esc(&e.to_string())).into_response(),
    };
    let mut rows = String::new();
    for e in entries.values() {
        let m = &e.machine;
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:?}</td></tr>",
            esc(&m.hostname),
            esc(&m.ip_address),
            esc(&m.required_image),
            esc(&m.planned_image),
            if m.disable_updates { "disabled" } else { "" },
            esc(&m.tags.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")),
            e.source,
        ));
    }
    let st = s.imageserver.mdb.status();
    let file = match &st.path {
        None => "No MDB file is configured (<code>[images] mdb_file</code>); machines come from the API and enrolment.".to_string(),
        Some(p) => format!(
            "File <code>{}</code>: {} machine(s), last loaded {}{}",
            esc(p),
            st.machines,
            ms_iso(st.last_load_ms),
            st.last_error.as_ref().map(|e| format!(r#" — <span class="error">{}</span>"#, esc(e))).unwrap_or_default()
        ),
    };
    let body = format!(
        r#"<p>{file}</p><table><tr><th>Hostname</th><th>IpAddress</th><th>RequiredImage</th><th>PlannedImage</th><th>Updates</th><th>Tags</th><th>Source</th></tr>{rows}</table>"#
    );
    page("MDB", true, &body).into_response()
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
