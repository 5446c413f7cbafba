//! Computed files, the shell around `paddock_computed`: each machine's files are made from
//! the applied spec (its `[[files]]`, its roles' `files`, its variables and templates), the
//! MDB (the machines, their `var.*` tags), the inspector's nodes (UUIDs, facts, traits),
//! the census's registrations and the image roles' placements (the peers). The content is
//! stored as objects in the image server's object store (one object however many
//! machines share it, kept from garbage collection while a machine has it) and handed to
//! the dominator as each machine's [`Overlay`], which the herd lays over its image.
//!
//! What each machine has — the source, the object, since when, or why it cannot be made —
//! is kept in memory for `paddock sub files` and the console. Routes:
//! `GET /api/v1/spec/render?host=H[&path=P]` (what a machine would get, and the data it
//! is made from; nothing stored) and `GET /rpc/Dominator.GetSubFiles?hostname=H`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use paddock_computed::{Generated, Machine, MakeError, Site, Source, Templates, VarSources};
use paddock_dominator::{ComputedFile, Overlay};
use paddock_image::ObjectId;
use paddock_imageserver::images::ImageServer;
use paddock_imageserver::mdb::{Entry, MdbService};
use paddock_inspector::service::Inspector;
use paddock_roles::Spec;
use paddock_store::Store;
use paddock_wire::{ApiError, unix_ms};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::roles::{ImageInstance, Program, StoredSpec, run_program};

/// The most a program may print for one file.
const MAX_PROGRAM_OUTPUT: usize = 4 << 20;
/// MDB tags named `var.<name>` are the machine's variable `<name>`.
const VAR_TAG: &str = "var.";

/// Where `program` sources run.
#[derive(Clone, Debug)]
pub struct Programs {
    pub dir: PathBuf,
    pub timeout: Duration,
}

/// One computed file of a machine, as operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStatus {
    pub path: String,
    /// The role that gives it (none: every machine has it).
    pub role: Option<String>,
    /// What it is made from (`template hostname.j2`, `the MDB entry`, `program token`).
    pub source: String,
    pub object: Option<ObjectId>,
    pub size: u64,
    /// When this content was first made for the machine.
    pub since_ms: i64,
    /// Why it cannot be made (the machine is held until it can).
    pub error: Option<String>,
}

/// What `spec render` shows of one file: its content (or why not) and what it is made of.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Rendered {
    pub path: String,
    pub role: Option<String>,
    pub source: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub content: Option<String>,
    pub error: Option<String>,
    /// The data its template or program is given.
    pub data: Value,
}

/// What one round of making files found.
struct Made {
    /// Host → its files: (path, role, source, content or why not, data).
    files: BTreeMap<String, Vec<MadeFile>>,
}

struct MadeFile {
    path: String,
    role: Option<String>,
    source: Source,
    content: Result<String, MakeError>,
    data: Value,
}

#[derive(Default)]
struct Kept {
    files: BTreeMap<String, Vec<FileStatus>>,
    /// Programs' outputs by (host, path).
    generated: HashMap<(String, String), Generated>,
    /// Objects known to be in the object store.
    stored: BTreeSet<ObjectId>,
    /// The overlays last made.
    last: BTreeMap<String, Arc<Overlay>>,
}

/// Makes the machines' computed files.
pub struct Renderer {
    store: Arc<dyn Store>,
    images: Arc<ImageServer>,
    inspector: Arc<Inspector>,
    programs: Option<Programs>,
    /// The DNS zone's origin, when the appliance serves DNS: peers get their names.
    dns_origin: Option<String>,
    kept: Mutex<Kept>,
}

impl Renderer {
    pub fn new(
        store: Arc<dyn Store>,
        images: Arc<ImageServer>,
        inspector: Arc<Inspector>,
        programs: Option<Programs>,
        dns_origin: Option<String>,
    ) -> Arc<Self> {
        Arc::new(Renderer {
            store,
            images,
            inspector,
            programs,
            dns_origin,
            kept: Mutex::new(Kept::default()),
        })
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A machine's computed files as last made (none: it has none, or is not in the MDB).
    pub fn files(&self, host: &str) -> Vec<FileStatus> {
        self.kept().files.get(host).cloned().unwrap_or_default()
    }

    async fn spec(&self) -> anyhow::Result<Option<(Spec, BTreeMap<String, String>)>> {
        let Some(kv) = self.store.get(crate::roles::SPEC_KEY).await? else {
            return Ok(None);
        };
        let stored: StoredSpec = serde_json::from_slice(&kv.value)?;
        let spec = Spec::parse(&stored.file, &stored.text).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Some((spec, stored.templates)))
    }

    /// Everything files are made from, for `machines`.
    async fn site(&self, spec: &Spec, machines: &BTreeMap<String, Entry>) -> anyhow::Result<Site> {
        let nodes = self.inspector.list().await?;
        let by_name: BTreeMap<String, &paddock_inspector::node::Node> = nodes
            .iter()
            .map(|n| (crate::census::node_hostname(n), n))
            .collect();
        let mut vars: VarSources = spec.var_sources();
        let mut site_machines = BTreeMap::new();
        for (host, e) in machines {
            let m = &e.machine;
            let node = by_name.get(host);
            let mdb_vars: paddock_computed::Vars = m
                .tags
                .iter()
                .filter_map(|(k, v)| {
                    Some((k.strip_prefix(VAR_TAG)?.to_string(), Value::from(v.clone())))
                })
                .collect();
            if !mdb_vars.is_empty() {
                // The spec's `[hosts.<name>]` wins over the MDB's tags.
                let h = vars.hosts.entry(host.clone()).or_default();
                let mut merged = mdb_vars;
                merged.extend(std::mem::take(&mut h.vars));
                h.vars = merged;
            }
            site_machines.insert(
                host.clone(),
                Machine {
                    name: host.clone(),
                    uuid: node.map(|n| n.uuid.to_string()),
                    addresses: [m.ip_address.clone()]
                        .into_iter()
                        .filter(|a| !a.is_empty())
                        .collect(),
                    facts: node
                        .map(|n| n.properties.clone().into_iter().collect())
                        .unwrap_or_default(),
                    traits: node
                        .map(|n| n.traits.iter().cloned().collect())
                        .unwrap_or_default(),
                    mdb: serde_json::to_value(m).ok(),
                },
            );
        }
        let mut instances: BTreeSet<(String, String, Option<String>)> = BTreeSet::new();
        for kv in self.store.range(crate::census::INSTANCES).await? {
            if let Ok(i) = serde_json::from_slice::<crate::census::InstanceEntry>(&kv.value) {
                instances.insert((i.role, i.instance, i.host));
            }
        }
        for kv in self.store.range(crate::roles::IMAGES).await? {
            let Some((role, id)) = kv.key[crate::roles::IMAGES.len()..].split_once('/') else {
                continue;
            };
            if let Ok(a) = serde_json::from_slice::<ImageInstance>(&kv.value) {
                instances.insert((role.to_string(), id.to_string(), Some(a.host)));
            }
        }
        let dns_names = match &self.dns_origin {
            Some(origin) => instances
                .iter()
                .filter_map(|(r, i, _)| {
                    let name = paddock_dns::zone::instance_name(origin, i)?;
                    Some((
                        (r.clone(), i.clone()),
                        name.trim_end_matches('.').to_string(),
                    ))
                })
                .collect(),
            None => BTreeMap::new(),
        };
        Ok(Site {
            machines: site_machines,
            instances: instances.into_iter().collect(),
            dns_names,
            vars,
            roles: spec.roles.keys().cloned().collect(),
        })
    }

    /// Makes the files of `hosts`: programs whose output is stale run first (their output
    /// kept), then every template renders, off the async threads; `with_data`: each file's
    /// data is kept too (for `spec render`).
    async fn make(
        &self,
        spec: &Spec,
        templates: &BTreeMap<String, String>,
        site: Arc<Site>,
        hosts: Vec<String>,
        with_data: bool,
    ) -> Made {
        let decls = Arc::new(spec.file_decls());
        let peers = Arc::new(site.peers());
        let programs = self.run_programs(&site, &decls, &peers, &hosts).await;
        let templates = Templates::new(templates).map_err(MakeError::from);
        tokio::task::spawn_blocking(move || {
            let mut files = BTreeMap::new();
            for host in hosts {
                let mut run = |name: &str, _: Option<u64>, _: &Value| {
                    programs
                        .get(&(host.clone(), name.to_string()))
                        .cloned()
                        .unwrap_or_else(|| Err(MakeError::program(name, "not run")))
                };
                let made = match &templates {
                    Ok(t) => paddock_computed::make_host(&site, &decls, t, &peers, &host, &mut run),
                    Err(e) => paddock_computed::files_of(&site, &decls, &host)
                        .into_iter()
                        .map(|d| (d.path.clone(), Err(e.clone())))
                        .collect(),
                };
                let of_host: Vec<_> = paddock_computed::files_of(&site, &decls, &host)
                    .into_iter()
                    .zip(made)
                    .map(|(d, (path, content))| MadeFile {
                        // The data again only for `spec render`: the render of every
                        // machine needs the content alone.
                        data: if with_data {
                            site.data_with(&host, d.role.as_deref(), &peers)
                        } else {
                            Value::Null
                        },
                        path,
                        role: d.role.clone(),
                        source: d.source.clone(),
                        content,
                    })
                    .collect();
                files.insert(host, of_host);
            }
            Made { files }
        })
        .await
        .unwrap_or(Made {
            files: BTreeMap::new(),
        })
    }

    /// Each program source's output for each host that has it, by (host, program): run
    /// again when stale (its data changed, or its validity ran out).
    async fn run_programs(
        &self,
        site: &Site,
        decls: &[paddock_computed::FileDecl],
        peers: &Value,
        hosts: &[String],
    ) -> HashMap<(String, String), Result<String, MakeError>> {
        let mut out = HashMap::new();
        for host in hosts {
            for d in paddock_computed::files_of(site, decls, host) {
                let Source::Program { name, valid_secs } = &d.source else {
                    continue;
                };
                let data = site.data_with(host, d.role.as_deref(), peers);
                let input = serde_json::to_vec(&data).unwrap_or_default();
                let inputs = ObjectId::of(&input).to_string();
                let key = (host.clone(), d.path.clone());
                let now = paddock_clock::UnixMs(unix_ms());
                let kept = self.kept().generated.get(&key).cloned();
                let result = if paddock_computed::stale(kept.as_ref(), &inputs, now) {
                    let run = self.run_program(name, host, &input).await;
                    if let Ok(content) = &run {
                        self.kept().generated.insert(
                            key,
                            Generated {
                                content: content.clone().into_bytes(),
                                inputs,
                                at: now,
                                valid_secs: *valid_secs,
                            },
                        );
                    }
                    run
                } else {
                    let g = kept.map(|g| g.content).unwrap_or_default();
                    Ok(String::from_utf8_lossy(&g).into_owned())
                };
                out.insert((host.clone(), name.clone()), result);
            }
        }
        out
    }

    async fn run_program(&self, name: &str, host: &str, input: &[u8]) -> Result<String, MakeError> {
        let fail = |why: String| MakeError::program(name, why);
        let Some(p) = &self.programs else {
            return Err(fail("no [roles] hooks_dir to run it from".into()));
        };
        let env = [("PADDOCK_HOST", host.to_string())];
        let run = run_program(&Program {
            path: &p.dir.join(name),
            args: &[],
            env: &env,
            dir: &p.dir,
            input: Some(input),
            timeout: p.timeout,
            stdout_kept: MAX_PROGRAM_OUTPUT + 1,
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
        if run.exit != Some(0) {
            let why = run
                .stderr
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let exit = run
                .exit
                .map_or("by a signal".into(), |c| format!("with {c}"));
            return Err(fail(format!("exited {exit}: {why}")));
        }
        if run.stdout.len() > MAX_PROGRAM_OUTPUT {
            return Err(fail(format!(
                "printed more than {MAX_PROGRAM_OUTPUT} bytes"
            )));
        }
        Ok(run.stdout)
    }

    /// Every machine's files made, stored and kept: the overlays for the dominator.
    pub async fn render_all(
        &self,
        machines: &BTreeMap<String, Entry>,
    ) -> anyhow::Result<BTreeMap<String, Arc<Overlay>>> {
        let Some((spec, templates)) = self.spec().await? else {
            self.forget_all();
            return Ok(BTreeMap::new());
        };
        if spec.file_decls().is_empty() {
            self.forget_all();
            return Ok(BTreeMap::new());
        }
        let site = Arc::new(self.site(&spec, machines).await?);
        let hosts: Vec<String> = machines.keys().cloned().collect();
        let made = self.make(&spec, &templates, site, hosts, false).await;
        self.store_and_keep(&spec, made).await
    }

    fn forget_all(&self) {
        let mut k = self.kept();
        k.files.clear();
        k.generated.clear();
        k.stored.clear();
        k.last.clear();
        drop(k);
        self.images.pin("computed", BTreeSet::new());
    }

    /// Puts new contents in the object store, pins every content in use, and keeps what
    /// each machine has.
    async fn store_and_keep(
        &self,
        spec: &Spec,
        made: Made,
    ) -> anyhow::Result<BTreeMap<String, Arc<Overlay>>> {
        let now = unix_ms();
        let mut overlays = BTreeMap::new();
        let mut statuses: BTreeMap<String, Vec<FileStatus>> = BTreeMap::new();
        let mut in_use = BTreeSet::new();
        let mut new_objects: BTreeMap<ObjectId, Vec<u8>> = BTreeMap::new();
        let (before, stored) = {
            let k = self.kept();
            (k.files.clone(), k.stored.clone())
        };
        for (host, files) in made.files {
            let mut overlay = Overlay::default();
            let mut status = Vec::new();
            let old = before.get(&host);
            for f in files {
                let decl = spec.file(&f.path);
                let (mode, uid, gid) = decl.map_or((0o644, 0, 0), |d| (d.mode, d.uid, d.gid));
                let mut st = FileStatus {
                    path: f.path.clone(),
                    role: f.role.clone(),
                    source: f.source.to_string(),
                    object: None,
                    size: 0,
                    since_ms: now,
                    error: None,
                };
                match f.content {
                    Ok(content) => {
                        let bytes = content.into_bytes();
                        let object = ObjectId::of(&bytes);
                        let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
                        if !stored.contains(&object) && size > 0 {
                            new_objects.entry(object).or_insert(bytes);
                        }
                        in_use.insert(object);
                        if let Some(o) = old.and_then(|o| o.iter().find(|s| s.path == f.path))
                            && o.object == Some(object)
                        {
                            st.since_ms = o.since_ms;
                        }
                        st.object = Some(object);
                        st.size = size;
                        overlay.files.insert(
                            f.path.clone(),
                            ComputedFile {
                                object,
                                size,
                                mode,
                                uid,
                                gid,
                                check: decl.and_then(|d| d.check.clone()),
                            },
                        );
                    }
                    Err(why) => {
                        if overlay.missing.is_none() {
                            overlay.missing = Some(format!("{}: {why}", f.path));
                        }
                        st.error = Some(why.to_string());
                    }
                }
                status.push(st);
            }
            if !status.is_empty() {
                statuses.insert(host.clone(), status);
                overlays.insert(host, Arc::new(overlay));
            }
        }
        // Pinned before they are written, so a collection in between keeps them.
        self.images.pin("computed", in_use.clone());
        let objects = self.images.objects().clone();
        let written: Vec<ObjectId> = new_objects.keys().copied().collect();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            for (id, bytes) in &new_objects {
                objects.put(*id, bytes)?;
            }
            Ok(())
        })
        .await??;
        let mut k = self.kept();
        k.files = statuses;
        k.stored.extend(written);
        k.stored.retain(|o| in_use.contains(o));
        let hosts: BTreeSet<String> = k.files.keys().cloned().collect();
        k.generated.retain(|(h, _), _| hosts.contains(h));
        k.last = overlays.clone();
        Ok(overlays)
    }

    /// What `host` would get now, with each file's data; nothing stored or kept.
    pub async fn preview(
        &self,
        mdb: &MdbService,
        host: &str,
        path: Option<&str>,
    ) -> Result<Vec<Rendered>, ApiError> {
        let internal = |e: anyhow::Error| ApiError::internal(e.to_string());
        let Some((spec, templates)) = self.spec().await.map_err(internal)? else {
            return Err(ApiError::not_found(
                "no spec applied yet: paddock spec apply FILE",
            ));
        };
        let machines = mdb
            .entries()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        if !machines.contains_key(host) {
            return Err(ApiError::not_found(format!("{host} is not in the MDB")));
        }
        let site = Arc::new(self.site(&spec, &machines).await.map_err(internal)?);
        let made = self
            .make(&spec, &templates, site, vec![host.to_string()], true)
            .await;
        let files: Vec<Rendered> = made
            .files
            .into_values()
            .flatten()
            .filter(|f| path.is_none_or(|p| p == f.path))
            .map(|f| {
                let decl = spec.file(&f.path);
                let (content, error) = match f.content {
                    Ok(c) => (Some(c), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                Rendered {
                    source: f.source.to_string(),
                    mode: decl.map_or(0o644, |d| d.mode),
                    uid: decl.map_or(0, |d| d.uid),
                    gid: decl.map_or(0, |d| d.gid),
                    path: f.path,
                    role: f.role,
                    content,
                    error,
                    data: f.data,
                }
            })
            .collect();
        if let (Some(p), true) = (path, files.is_empty()) {
            return Err(ApiError::not_found(format!(
                "{host} has no computed file {p}"
            )));
        }
        Ok(files)
    }
}

#[async_trait]
impl crate::dominator::Overlays for Renderer {
    async fn overlays(&self, machines: &BTreeMap<String, Entry>) -> BTreeMap<String, Arc<Overlay>> {
        match self.render_all(machines).await {
            Ok(o) => o,
            Err(e) => {
                // Nothing new is known: the machines keep what they were last given.
                tracing::warn!(error = %e, "computed files: cannot make them");
                self.kept().last.clone()
            }
        }
    }

    fn watched(&self) -> Vec<String> {
        vec![
            crate::roles::SPEC_KEY.to_string(),
            crate::roles::IMAGES.to_string(),
            crate::census::INSTANCES.to_string(),
        ]
    }
}

#[async_trait]
impl crate::provisioning::ComputedPaths for Renderer {
    async fn every_machines(&self) -> Vec<String> {
        match self.spec().await {
            Ok(Some((spec, _))) => spec.files.iter().map(|f| f.path.clone()).collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone)]
pub struct ComputedRoutes {
    pub renderer: Arc<Renderer>,
    pub mdb: Arc<MdbService>,
}

#[derive(Deserialize)]
struct RenderQuery {
    host: String,
    #[serde(default)]
    path: Option<String>,
}

#[derive(Deserialize)]
struct HostQuery {
    hostname: String,
}

async fn render(
    State(c): State<ComputedRoutes>,
    Query(q): Query<RenderQuery>,
) -> Result<Json<Vec<Rendered>>, ApiError> {
    Ok(Json(
        c.renderer
            .preview(&c.mdb, &q.host, q.path.as_deref())
            .await?,
    ))
}

async fn sub_files(
    State(c): State<ComputedRoutes>,
    Query(q): Query<HostQuery>,
) -> Json<Vec<FileStatus>> {
    Json(c.renderer.files(&q.hostname))
}

pub fn router(c: ComputedRoutes) -> Router {
    Router::new()
        .route("/api/v1/spec/render", get(render))
        .route("/rpc/Dominator.GetSubFiles", get(sub_files))
        .with_state(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_image::Machine as MdbMachine;
    use paddock_imageserver::mdb::Source as MdbSource;
    use std::os::unix::fs::PermissionsExt;

    fn entry(host: &str, ip: &str, tags: &[(&str, &str)]) -> (String, Entry) {
        let machine = MdbMachine {
            hostname: host.into(),
            ip_address: ip.into(),
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..MdbMachine::default()
        };
        let e = Entry {
            machine,
            source: MdbSource::Api,
        };
        (host.to_string(), e)
    }

    /// The renderer over a real store and object store: a program's output is kept until
    /// its validity ends (run once, then again), an MDB tag is a variable, every content is
    /// an object that garbage collection keeps, and a failing program holds its machine
    /// while the others' files are made.
    #[tokio::test]
    async fn programs_run_when_stale_and_contents_are_kept_objects() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let inspector = Arc::new(Inspector::new(store.clone(), Default::default()));
        let objects =
            paddock_imageserver::objects::ObjectStore::open(dir.path().join("objects")).unwrap();
        let images = ImageServer::new(store.clone(), Arc::new(objects));
        let hooks = dir.path().join("hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        let runs = dir.path().join("runs");
        let token = hooks.join("token");
        // The machine's name from its data on stdin; it fails for h2.
        std::fs::write(
            &token,
            format!(
                "#!/bin/sh\necho \"$PADDOCK_HOST\" >> {}\n\
                 name=$(sed -n 's/.*\"name\":\"\\([^\"]*\\)\".*/\\1/p')\n\
                 [ \"$PADDOCK_HOST\" = h2 ] && {{ echo 'no token for h2' >&2; exit 4; }}\n\
                 echo \"token-for-$PADDOCK_HOST\"\n",
                runs.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = "[[files]]\npath = \"/etc/token\"\nprogram = \"token\"\nvalid_secs = 1\n\n\
                    [[files]]\npath = \"/etc/rack\"\ntemplate = \"rack.j2\"\nmode = \"0600\"\n";
        let stored = StoredSpec {
            file: "spec/t.toml".into(),
            text: spec.into(),
            applied_ms: 0,
            templates: [("rack.j2".to_string(), "{{ vars.rack }}\n".to_string())].into(),
        };
        store
            .put(crate::roles::SPEC_KEY, serde_json::to_vec(&stored).unwrap())
            .await
            .unwrap();
        let r = Renderer::new(
            store.clone(),
            images.clone(),
            inspector,
            Some(Programs {
                dir: hooks.clone(),
                timeout: Duration::from_secs(10),
            }),
            None,
        );
        let machines: BTreeMap<String, Entry> = [
            entry("h1", "198.18.0.11", &[("var.rack", "r7")]),
            entry("h2", "198.18.0.12", &[("var.rack", "r8")]),
        ]
        .into();
        let ran = || {
            std::fs::read_to_string(&runs)
                .unwrap_or_default()
                .lines()
                .count()
        };
        let o = r.render_all(&machines).await.unwrap();
        assert_eq!(ran(), 2);
        let h1 = &o["h1"];
        assert_eq!(h1.missing, None);
        assert_eq!(
            h1.files["/etc/token"].object,
            ObjectId::of(b"token-for-h1\n")
        );
        assert_eq!(h1.files["/etc/rack"].object, ObjectId::of(b"r7\n"));
        assert_eq!(h1.files["/etc/rack"].mode, 0o600);
        let h2 = &o["h2"];
        assert_eq!(
            h2.missing.as_deref(),
            Some("/etc/token: program token: exited with 4: no token for h2")
        );
        assert!(h2.files.contains_key("/etc/rack"), "the rest is made");
        // Within its validity, h1's output is kept (h2's failure is tried again).
        r.render_all(&machines).await.unwrap();
        assert_eq!(ran(), 3);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        r.render_all(&machines).await.unwrap();
        assert_eq!(ran(), 5);
        // Stored, and kept by garbage collection though no image names them.
        let gc = images.collect_garbage().await.unwrap();
        assert_eq!(gc.deleted_objects, 0);
        for content in [&b"token-for-h1\n"[..], b"r7\n", b"r8\n"] {
            assert!(images.objects().contains(&ObjectId::of(content)));
        }
        let files = r.files("h2");
        let token = files.iter().find(|f| f.path == "/etc/token").unwrap();
        assert!(token.error.as_deref().unwrap().contains("no token for h2"));
        assert_eq!(token.source, "program token");
    }
}
