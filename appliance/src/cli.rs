//! Command-line clients of a running appliance's API (`paddock node …`, `paddock image …`,
//! `paddock mdb …`, `paddock sub …`, `paddock dominator …`, `paddock firewall status`). Answers are read into the types the
//! services answer with; error answers through [`paddock_wire::error_message`].

use anyhow::{Context, bail};
use paddock_imageserver::images::{AddSummary, GcReport, ImageDetail, ImageRecord};
use paddock_imageserver::mdb::Entry;
use paddock_inspector::node::{Node, iso};
use paddock_inspector::service::TimelineEvent;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::dominator::{DominatorStatus, Pause, SubControl};
use crate::pxe_filter::FirewallAnswer;

pub use paddock_client::{CallError, Client};

/// How the CLI proves who it is: the CA it checks the appliance against, a client
/// certificate and key (PEM), an operator token.
#[derive(Clone, Default)]
pub struct Credentials {
    pub ca_pem: Option<String>,
    pub identity: Option<(String, String)>,
    pub token: Option<String>,
}

/// The client of the API at `base` with `c`. Per read or write the CLI waits up to ten
/// minutes (an image check or a garbage collection answers when done).
pub fn client(base: &str, c: &Credentials) -> anyhow::Result<Client> {
    let tls = match &c.ca_pem {
        Some(ca) => Some(paddock_security::tls::ureq_tls(
            ca,
            c.identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        )?),
        None => None,
    };
    Ok(paddock_client::Builder::new()
        .tls(tls)
        .token(c.token.clone())
        .io_timeout(std::time::Duration::from_secs(600))
        .client(base))
}

/// `paddock audit`: the newest entries of the audit log.
pub fn audit(api: &Client, limit: usize, json: bool) -> Result<(), CallError> {
    let limit = limit.to_string();
    let entries: Vec<crate::audit::AuditEntry> = api
        .call("GET", "/api/v1/audit")
        .query("limit", &limit)
        .send()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "{:<24} {:<20} {:<28} {:>6}  TARGET",
        "WHEN (UTC)", "WHO", "METHOD", "STATUS"
    );
    for e in entries {
        let when = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH
                + std::time::Duration::from_millis(u64::try_from(e.at_ms).unwrap_or(0)),
        );
        // Refusals are counted per minute: `403×1000`.
        let status = if e.count > 1 {
            format!("{}×{}", e.status, e.count)
        } else {
            e.status.to_string()
        };
        println!(
            "{:<24} {:<20} {:<28} {:>6}  {}",
            when, e.who, e.method, status, e.target
        );
    }
    Ok(())
}

/// An optional text as the CLI prints it: `-` when absent.
fn or_dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

/// A JSON value (a node property) as the CLI prints it: text as is, `-` for none.
fn json_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn state(n: &Node) -> &'static str {
    n.state().map_or("-", |s| s.as_str())
}

fn macs(n: &Node, sep: &str) -> String {
    n.macs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

pub fn node_list(api: &Client) -> anyhow::Result<()> {
    let nodes: Vec<Node> = api.call("GET", "/api/v1/nodes").send()?;
    println!(
        "{:<36}  {:<16}  {:<10}  {:>4}  {:>7}  {:>6}  MACS",
        "UUID", "NAME", "STATE", "CPUS", "MEM_MB", "DISK_G"
    );
    for n in &nodes {
        println!(
            "{:<36}  {:<16}  {:<10}  {:>4}  {:>7}  {:>6}  {}",
            n.uuid,
            or_dash(n.name.as_deref()),
            state(n),
            json_text(n.properties.get("cpus")),
            json_text(n.properties.get("memory_mb")),
            json_text(n.properties.get("local_gb")),
            macs(n, ",")
        );
    }
    Ok(())
}

/// `GET /api/v1/nodes/{node}`: the node as Ironic shows it, with its timeline.
#[derive(Debug, Deserialize)]
struct NodeShown {
    #[serde(flatten)]
    node: Node,
    #[serde(default)]
    timeline: Vec<TimelineEvent>,
}

pub fn node_show(api: &Client, node: &str) -> anyhow::Result<()> {
    let shown: NodeShown = api.call("GET", format!("/api/v1/nodes/{node}")).send()?;
    let n = &shown.node;
    let error = n.introspection.as_ref().and_then(|i| i.error.as_deref());
    println!("uuid        {}", n.uuid);
    println!("name        {}", or_dash(n.name.as_deref()));
    println!("state       {}", state(n));
    println!("error       {}", or_dash(error));
    println!("macs        {}", macs(n, ", "));
    println!("bmc         {}", or_dash(n.bmc_address.as_deref()));
    println!("driver      {}", or_dash(n.driver.as_deref()));
    println!("driver_info {}", Value::Object(n.driver_info.clone()));
    println!("properties  {}", Value::Object(n.properties.clone()));
    println!("extra       {}", Value::Object(n.extra.clone()));
    // The provisioning record (an appliance without provisioning answers 404: "-").
    match api
        .call("GET", format!("/api/v1/nodes/{node}/provisioning"))
        .send::<paddock_birther::Provisioning>()
    {
        Ok(p) => print!("{}", provisioning_text(&p)),
        Err(e) if e.status() == Some(404) => println!("provision   -"),
        Err(e) => return Err(e.into()),
    }
    println!("timeline:");
    for e in &shown.timeline {
        let mark = if e.error { "!" } else { " " };
        println!(
            "  {}.{:03} {mark} {:<24} {}",
            iso(e.at_ms / 1000),
            e.at_ms % 1000,
            e.kind,
            e.message
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
pub fn node_set(api: &Client, node: &str, s: &NodeSet) -> anyhow::Result<()> {
    let ops = node_set_patch(s)?;
    let mut call = api.call("PATCH", format!("/api/v1/nodes/{node}"));
    if s.reset_interfaces {
        call = call.query("reset_interfaces", "true");
    }
    call.send_json::<serde::de::IgnoredAny>(&ops)?;
    println!("node {node} updated");
    Ok(())
}

pub fn node_inspect(api: &Client, node: &str) -> anyhow::Result<()> {
    api.call("POST", format!("/v1/introspection/{node}"))
        .send::<serde::de::IgnoredAny>()?;
    println!(
        "introspection of {node} started: it boots the discovery ramdisk at its next PXE boot"
    );
    Ok(())
}

pub fn node_abort(api: &Client, node: &str) -> anyhow::Result<()> {
    api.call("POST", format!("/v1/introspection/{node}/abort"))
        .send::<serde::de::IgnoredAny>()?;
    println!("introspection of {node} aborted");
    Ok(())
}

pub fn firewall_status(api: &Client) -> anyhow::Result<()> {
    let st = match api.call("GET", "/api/v1/firewall").send()? {
        FirewallAnswer::On(st) => st,
        FirewallAnswer::Off { .. } => {
            println!("PXE filter: off ([firewall] enabled = false)");
            return Ok(());
        }
    };
    println!("interface       {}", st.interface);
    println!(
        "pass rule       {}",
        if st.pass {
            "present (this host answers PXE)"
        } else {
            "absent (closed)"
        }
    );
    println!(
        "unknown MACs    {}",
        if st.discovery { "allowed" } else { "blocked" }
    );
    println!(
        "last sync       {} UTC",
        iso(st.last_sync_ms.unwrap_or(0) / 1000)
    );
    println!("syncs           {}", st.syncs);
    println!("drift repaired  {}", st.drift_repaired);
    println!("last error      {}", or_dash(st.last_error.as_deref()));
    for (k, list) in [("allow", &st.allow), ("deny", &st.deny)] {
        let macs: Vec<String> = list.iter().map(ToString::to_string).collect();
        println!("{k:<15} {} {}", macs.len(), macs.join(" "));
    }
    Ok(())
}

/// Counts the tarball's bytes into a progress bar on stderr (drawn only on a terminal).
struct Progress<R> {
    inner: R,
    bar: indicatif::ProgressBar,
}

impl<R: std::io::Read> std::io::Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(u64::try_from(n).unwrap_or(u64::MAX));
        Ok(n)
    }
}

/// The upload's progress bar: drawn on stderr when it is a terminal, hidden otherwise.
fn upload_bar(total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "  [{bar:30}] {percent:>3}%  {binary_bytes}/{binary_total_bytes}  {binary_bytes_per_sec}",
    ) {
        bar.set_style(style.progress_chars("# "));
    }
    bar
}

pub struct ImageAdd<'a> {
    pub name: &'a str,
    pub tarball: &'a std::path::Path,
    pub filter: Option<&'a std::path::Path>,
    pub triggers: Option<&'a std::path::Path>,
    pub expires_in_secs: Option<i64>,
}

/// The first line of `POST /rpc/ImageServer.AddImage`, before the tarball.
#[derive(Serialize)]
struct AddHeader<'a> {
    name: &'a str,
    filter: Option<String>,
    triggers: Option<String>,
    expires_in_secs: Option<i64>,
    created_by: String,
}

pub fn image_add(api: &Client, a: &ImageAdd) -> anyhow::Result<()> {
    use std::io::Read;
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
    match api
        .call("GET", "/rpc/ImageServer.ShowImage")
        .query("name", a.name)
        .send::<ImageDetail>()
    {
        Ok(d) if d.record.deleted => {
            bail!(
                "image name {:?} belonged to a deleted image and cannot be used again",
                a.name
            )
        }
        Ok(_) => bail!("image {:?} already exists", a.name),
        Err(e) if e.status() == Some(404) => {}
        Err(e) => return Err(e.into()),
    }
    let file = std::fs::File::open(a.tarball)
        .with_context(|| format!("opening {}", a.tarball.display()))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut header = serde_json::to_vec(&AddHeader {
        name: a.name,
        filter,
        triggers,
        expires_in_secs: a.expires_in_secs,
        created_by: std::env::var("USER").unwrap_or_default(),
    })?;
    header.push(b'\n');
    let bar = upload_bar(total);
    let mut body = std::io::Cursor::new(header).chain(Progress {
        inner: file,
        bar: bar.clone(),
    });
    eprintln!("adding image {} from {}", a.name, a.tarball.display());
    let summary: AddSummary = api
        .call("POST", "/rpc/ImageServer.AddImage")
        .send_reader("application/octet-stream", &mut body)?;
    bar.finish();
    let st = &summary.stats;
    println!("image {} added in {:.1} s", a.name, summary.seconds);
    println!(
        "  files {}  directories {}  symlinks {}  devices/fifos {}  hard links {}  filtered {}",
        st.files, st.directories, st.symlinks, st.specials, st.hardlinks, st.filtered
    );
    println!("  bytes {:.1} MiB in {} objects", mib(st.bytes), st.objects);
    println!(
        "  new objects {} ({:.1} MiB)  deduplicated {:.1} MiB",
        st.new_objects,
        mib(st.new_bytes),
        mib(st.dedup_bytes)
    );
    Ok(())
}

#[derive(Deserialize)]
struct ImageList {
    images: Vec<ImageRecord>,
}

pub fn image_list(api: &Client) -> anyhow::Result<()> {
    let list: ImageList = api.call("GET", "/rpc/ImageServer.ListImages").send()?;
    println!(
        "{:<32}  {:>8}  {:>10}  {:>8}  {:<7}  CREATED",
        "IMAGE", "FILES", "MIB", "OBJECTS", "FILTER"
    );
    for r in list.images.iter().filter(|r| !r.deleted) {
        println!(
            "{:<32}  {:>8}  {:>10.1}  {:>8}  {:<7}  {}",
            r.name,
            r.files,
            mib(r.bytes),
            r.objects,
            if r.filter.is_none() { "sparse" } else { "yes" },
            iso(r.created_on_ms / 1000)
        );
    }
    Ok(())
}

pub fn image_show(api: &Client, name: &str) -> anyhow::Result<()> {
    let d: ImageDetail = api
        .call("GET", "/rpc/ImageServer.ShowImage")
        .query("name", name)
        .send()?;
    let r = &d.record;
    println!("image       {}", r.name);
    if r.deleted {
        println!("deleted     yes (the name cannot be used again)");
        return Ok(());
    }
    println!("files       {}", r.files);
    println!("bytes       {:.1} MiB", mib(r.bytes));
    println!(
        "objects     {} ({} only here, {:.1} MiB; {} shared, {:.1} MiB; {} missing)",
        r.objects,
        d.unique_objects,
        mib(d.unique_bytes),
        d.shared_objects,
        mib(d.shared_bytes),
        d.missing_objects
    );
    println!(
        "filter      {}",
        r.filter
            .as_ref()
            .map_or("none (sparse image)".to_string(), |f| format!(
                "{} line(s)",
                f.lines().len()
            ))
    );
    println!("triggers    {}", r.triggers.list().len());
    println!("created     {}", iso(r.created_on_ms / 1000));
    if let Some(e) = r.expires_at_ms {
        println!("expires     {}", iso(e / 1000));
    }
    Ok(())
}

pub fn image_delete(api: &Client, name: &str) -> anyhow::Result<()> {
    api.call("POST", "/rpc/ImageServer.DeleteImage")
        .query("name", name)
        .send::<serde::de::IgnoredAny>()?;
    println!(
        "image {name} deleted (its name cannot be used again; run `paddock image gc` to free its objects)"
    );
    Ok(())
}

pub fn image_gc(api: &Client) -> anyhow::Result<()> {
    let r: GcReport = api
        .call("POST", "/rpc/ImageServer.DeleteUnreferencedObjects")
        .send_json(&())?;
    println!(
        "deleted {} unreferenced object(s), {:.1} MiB; {} kept",
        r.deleted_objects,
        mib(r.deleted_bytes),
        r.kept_objects
    );
    Ok(())
}

/// `POST /rpc/ImageServer.CheckImage`'s answer.
#[derive(Deserialize)]
struct ImageCheck {
    ok: bool,
    #[serde(default)]
    bad: Vec<BadObject>,
}

#[derive(Deserialize)]
struct BadObject {
    object: String,
    problem: String,
}

pub fn image_check(api: &Client, name: &str) -> anyhow::Result<()> {
    let r: ImageCheck = api
        .call("POST", "/rpc/ImageServer.CheckImage")
        .query("name", name)
        .send_json(&())?;
    if r.ok {
        println!("image {name}: every object present and intact");
        return Ok(());
    }
    for b in &r.bad {
        println!("{}  {}", b.problem, b.object);
    }
    bail!("image {name} has damaged or missing objects")
}

#[derive(Deserialize)]
struct MachineList {
    machines: Vec<Entry>,
}

pub fn mdb_list(api: &Client) -> anyhow::Result<()> {
    let list: MachineList = api.call("GET", "/rpc/Mdb.ListMachines").send()?;
    println!(
        "{:<28}  {:<15}  {:<24}  {:<24}  SOURCE",
        "HOSTNAME", "IP", "REQUIRED", "PLANNED"
    );
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    for e in &list.machines {
        let m = &e.machine;
        println!(
            "{:<28}  {:<15}  {:<24}  {:<24}  {}",
            m.hostname,
            dash(&m.ip_address),
            dash(&m.required_image),
            dash(&m.planned_image),
            serde_json::to_value(e.source)
                .ok()
                .as_ref()
                .and_then(Value::as_str)
                .unwrap_or("-")
        );
    }
    Ok(())
}

pub fn mdb_set(api: &Client, machine: &paddock_image::Machine) -> anyhow::Result<()> {
    api.call("POST", "/rpc/Mdb.SetMachine")
        .send_json::<serde::de::IgnoredAny>(machine)?;
    println!("mdb: {} set", machine.hostname);
    Ok(())
}

pub fn mdb_delete(api: &Client, hostname: &str) -> anyhow::Result<()> {
    api.call("POST", "/rpc/Mdb.DeleteMachine")
        .query("hostname", hostname)
        .send::<serde::de::IgnoredAny>()?;
    println!("mdb: {hostname} deleted");
    Ok(())
}

/// Text from elsewhere (hostnames, reasons, errors a sub reported) as the terminal may
/// show it: control characters and the bidirectional overrides are escaped (`\u{1b}`), so
/// no answer can move the cursor, recolour or reorder what the operator reads.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `Dominator.ListSubs` / `GetSub`'s answer, as the CLI reads it: the fields of
/// `paddock_dominator::SubStatus` (same JSON names), the state's own fields kept as JSON.
#[derive(Debug, Deserialize)]
pub struct SubView {
    pub hostname: String,
    pub address: String,
    #[serde(default)]
    pub required_image: Option<String>,
    /// The state's name (`synced`, `unreachable`, …: `SubState::name()`).
    pub state: String,
    pub summary: String,
    pub failures: u32,
    /// When the sub entered its state (Unix ms; 0 from an appliance that does not say).
    #[serde(default)]
    pub since_ms: i64,
    /// The state's own fields (`error`, `objects`, `image` …).
    #[serde(flatten)]
    pub details: serde_json::Map<String, Value>,
}

/// `paddock sub list`'s table; every text escaped with [`printable`].
pub fn sub_table(subs: &[SubView]) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{:<28}  {:<21}  {:<16}  {:>8}  SUMMARY\n",
        "HOSTNAME", "ADDRESS", "STATE", "FAILURES"
    );
    for s in subs {
        let _ = writeln!(
            out,
            "{:<28}  {:<21}  {:<16}  {:>8}  {}",
            printable(&s.hostname),
            printable(&s.address),
            printable(&s.state),
            s.failures,
            printable(&s.summary)
        );
    }
    out
}

pub fn sub_list(api: &Client) -> anyhow::Result<()> {
    let subs: Vec<SubView> = api.call("GET", "/rpc/Dominator.ListSubs").send()?;
    print!("{}", sub_table(&subs));
    if subs.is_empty() {
        println!("(no subs: none in the MDB with an address, or this host does not lead)");
    }
    Ok(())
}

pub fn sub_show(api: &Client, hostname: &str) -> anyhow::Result<()> {
    let s: SubView = api
        .call("GET", "/rpc/Dominator.GetSub")
        .query("hostname", hostname)
        .send()?;
    println!("hostname    {}", printable(&s.hostname));
    println!("address     {}", printable(&s.address));
    println!(
        "required    {}",
        printable(or_dash(s.required_image.as_deref()))
    );
    println!("state       {}", printable(&s.state));
    if s.since_ms > 0 {
        println!(
            "since       {} UTC ({})",
            paddock_inspector::node::iso(s.since_ms.div_euclid(1000)),
            crate::console_style::ago(paddock_wire::unix_ms(), s.since_ms)
        );
    }
    println!("summary     {}", printable(&s.summary));
    println!("failures    {}", s.failures);
    for (k, v) in &s.details {
        println!("{:<11} {}", printable(k), printable(&json_text(Some(v))));
    }
    Ok(())
}

/// A `Dominator.*` control with a JSON body; the answer read as `T`.
fn dominator_post<T: DeserializeOwned>(
    api: &Client,
    method: &str,
    body: Value,
) -> Result<T, CallError> {
    api.call("POST", format!("/rpc/Dominator.{method}"))
        .send_json(&body)
}

pub fn sub_pause(api: &Client, hostname: &str, reason: &str) -> anyhow::Result<()> {
    let c: SubControl = dominator_post(
        api,
        "PauseSub",
        serde_json::json!({"hostname": hostname, "reason": reason}),
    )?;
    println!(
        "sub {} paused: {}",
        printable(hostname),
        printable(or_dash(c.paused.as_deref()))
    );
    Ok(())
}

pub fn sub_resume(api: &Client, hostname: &str) -> anyhow::Result<()> {
    dominator_post::<SubControl>(api, "ResumeSub", serde_json::json!({"hostname": hostname}))?;
    println!("sub {} resumed", printable(hostname));
    Ok(())
}

pub fn sub_clear_safety(api: &Client, hostname: &str) -> anyhow::Result<()> {
    let c: SubControl = dominator_post(
        api,
        "ClearSafety",
        serde_json::json!({"hostname": hostname}),
    )?;
    println!(
        "sub {}: safety hold cleared once (clearance {}); the held update goes ahead",
        printable(hostname),
        c.safety_clearance
    );
    Ok(())
}

pub fn sub_files(api: &Client, hostname: &str) -> anyhow::Result<()> {
    let files: Vec<crate::computed::FileStatus> = api
        .call("GET", "/rpc/Dominator.GetSubFiles")
        .query("hostname", hostname)
        .send()?;
    if files.is_empty() {
        println!("{} has no computed files", printable(hostname));
        return Ok(());
    }
    let now = paddock_wire::unix_ms();
    println!(
        "{:<32} {:<28} {:<14} {:>8}  since",
        "path", "source", "object", "bytes"
    );
    for f in &files {
        let source = match &f.role {
            Some(r) => format!("{} (role {r})", f.source),
            None => f.source.clone(),
        };
        match &f.error {
            Some(e) => println!(
                "{:<32} {:<28} cannot be made: {}",
                printable(&f.path),
                printable(&source),
                printable(e)
            ),
            None => println!(
                "{:<32} {:<28} {:<14} {:>8}  {} s ago",
                printable(&f.path),
                printable(&source),
                f.object.map(|o| o.short()).unwrap_or_default(),
                f.size,
                (now - f.since_ms).max(0) / 1000
            ),
        }
    }
    Ok(())
}

pub fn sub_update(api: &Client, hostname: &str, image: &str) -> anyhow::Result<()> {
    let m: Value = dominator_post(
        api,
        "UpdateSub",
        serde_json::json!({"hostname": hostname, "image": image}),
    )?;
    println!(
        "sub {} must now run {} (the dominator picks it up at once; see paddock sub show {})",
        printable(hostname),
        printable(m["RequiredImage"].as_str().unwrap_or(image)),
        printable(hostname)
    );
    Ok(())
}

/// `paddock dominator status`'s text.
pub fn dominator_status_text(st: &DominatorStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let _ = writeln!(out, "enabled     {}", yes_no(st.enabled));
    let _ = writeln!(
        out,
        "leading     {}",
        if st.leading {
            "yes (this host keeps the subs)"
        } else {
            "no (ask the leader for the census)"
        }
    );
    match &st.paused {
        Some(p) => {
            let _ = writeln!(
                out,
                "paused      since {} UTC: {}",
                iso(p.at_ms / 1000),
                printable(&p.reason)
            );
        }
        None => out.push_str("paused      no\n"),
    }
    let total: usize = st.states.values().sum();
    let _ = writeln!(out, "subs        {total}");
    for (state, n) in &st.states {
        let _ = writeln!(out, "  {:<18} {n}", printable(state));
    }
    out
}

pub fn dominator_status(api: &Client) -> anyhow::Result<()> {
    let st: DominatorStatus = api.call("GET", "/rpc/Dominator.Status").send()?;
    print!("{}", dominator_status_text(&st));
    Ok(())
}

pub fn dominator_pause(api: &Client, reason: &str) -> anyhow::Result<()> {
    let p: Pause = dominator_post(api, "Pause", serde_json::json!({"reason": reason}))?;
    println!(
        "dominator paused: every update held ({})",
        printable(&p.reason)
    );
    Ok(())
}

pub fn dominator_resume(api: &Client) -> anyhow::Result<()> {
    dominator_post::<serde::de::IgnoredAny>(api, "Resume", serde_json::json!({}))?;
    println!("dominator resumed");
    Ok(())
}

/// `paddock node show`'s provisioning lines: the state, its image, the run's progress or
/// the failure, and since when.
pub fn provisioning_text(p: &paddock_birther::Provisioning) -> String {
    use paddock_birther::State as P;
    let mut out = format!("provision   {}", p.state.name());
    if let Some(image) = p.state.image() {
        out.push_str(&format!(" (image {})", printable(image)));
    }
    out.push_str(&format!(
        " since {} UTC\n",
        iso(i64::try_from(p.since_ms / 1000).unwrap_or(i64::MAX))
    ));
    match &p.state {
        P::Birth(r) | P::Rebirth(r) => {
            out.push_str(&format!(
                "  last step {}{}\n",
                r.last_step.map_or("-", |s| s.as_str()),
                if r.synced { ", synced" } else { "" }
            ));
        }
        P::Error {
            operation,
            step,
            message,
            ..
        } => {
            out.push_str(&format!(
                "  {} failed at {}: {}\n",
                operation.as_str(),
                step.as_str(),
                printable(message)
            ));
        }
        _ => {}
    }
    out
}

/// `paddock node provision|reimage|clean`: the request, then the record it made.
fn provisioning_request(api: &Client, node: &str, what: &str, body: Value) -> anyhow::Result<()> {
    let p: paddock_birther::Provisioning = api
        .call("POST", format!("/api/v1/nodes/{node}/{what}"))
        .send_json(&body)?;
    print!("node {}: {}", printable(node), provisioning_text(&p));
    Ok(())
}

pub fn node_provision(api: &Client, node: &str, image: &str) -> anyhow::Result<()> {
    provisioning_request(api, node, "provision", serde_json::json!({"image": image}))
}

pub fn node_reimage(api: &Client, node: &str, image: Option<&str>) -> anyhow::Result<()> {
    provisioning_request(api, node, "reimage", serde_json::json!({"image": image}))
}

pub fn node_clean(api: &Client, node: &str) -> anyhow::Result<()> {
    provisioning_request(api, node, "clean", serde_json::json!({}))
}

/// `paddock node power NODE on|off|cycle|status`: through the node's BMC (power-ons wait
/// for the appliance's throttle).
pub fn node_power(api: &Client, node: &str, action: &str) -> anyhow::Result<()> {
    let a: Value = api
        .call("POST", format!("/api/v1/nodes/{node}/power"))
        .send_json(&serde_json::json!({"action": action}))?;
    print!("{}", power_text(node, &a));
    Ok(())
}

/// A power answer (`/api/v1/nodes/{node}/power`) as the CLI prints it.
pub fn power_text(node: &str, a: &Value) -> String {
    let text = |v: &Value| v.as_str().map(printable).unwrap_or_else(|| "?".into());
    let mut out = format!(
        "node {}: power {}",
        printable(node),
        a["state"]
            .as_str()
            .map_or_else(|| "unknown".into(), printable)
    );
    if let Some(b) = a["bmc"].as_object() {
        out.push_str(&format!(
            " ({} {})",
            text(&b["driver"]),
            text(&b["address"])
        ));
    }
    out.push('\n');
    if a["queued"].as_bool() == Some(true) {
        let t = &a["throttle"];
        out.push_str(&format!(
            "  waiting for the power-on throttle ({} queued, at most {} per {} s); see `paddock node show`\n",
            t["queued"], t["max_power_ons"], t["interval_secs"]
        ));
    }
    if let Some(e) = a["error"].as_str() {
        out.push_str(&format!("  last status error: {}\n", printable(e)));
    }
    out
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

    #[test]
    fn the_sub_table_reads_substatus_and_escapes_what_subs_said() {
        use paddock_dominator::SubState;
        let hostile = "disk gone\x1b[2J\x1b]0;pwned\x07\r\nfake line\u{202e}";
        let status = crate::dominator::test_sub(
            "web-1",
            SubState::Unreachable {
                error: hostile.into(),
            },
        );
        let view: SubView = serde_json::from_value(serde_json::to_value(&status).unwrap()).unwrap();
        assert_eq!(view.state, "unreachable");
        assert_eq!(view.required_image.as_deref(), Some("debian/minbase.1"));
        assert_eq!(view.details.get("error"), Some(&json!(hostile)));
        let table = sub_table(&[view]);
        assert!(
            !table.chars().any(|c| c.is_control() && c != '\n'),
            "{table:?}"
        );
        assert!(!table.contains('\u{202e}'), "{table:?}");
        assert_eq!(table.lines().count(), 2, "{table}");
        let row = table.lines().nth(1).unwrap();
        assert!(row.starts_with("web-1 "), "{row}");
        assert!(row.contains("198.18.0.9:6969"), "{row}");
        assert!(row.contains("unreachable"), "{row}");
        assert!(row.contains("       2  "), "{row}");
        assert!(
            row.ends_with(
                r"unreachable: disk gone\u{1b}[2J\u{1b}]0;pwned\u{7}\r\nfake line\u{202e}"
            ),
            "{row}"
        );
    }

    #[test]
    fn dominator_status_escapes_the_reason() {
        let st = DominatorStatus {
            enabled: true,
            leading: true,
            paused: Some(Pause {
                reason: "freeze\x1b[31m".into(),
                at_ms: 0,
            }),
            states: [("synced".to_string(), 2), ("unreachable".to_string(), 1)].into(),
        };
        let text = dominator_status_text(&st);
        assert!(text.contains(r"freeze\u{1b}[31m"), "{text}");
        assert!(text.contains("subs        3\n"), "{text}");
        assert!(text.contains("  synced             2\n"), "{text}");
    }
}
