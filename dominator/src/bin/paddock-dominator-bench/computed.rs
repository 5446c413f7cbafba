//! The computed-files run: every sub has two computed files, one the same everywhere
//! (`/etc/motd`, from a variable) and one its own (`/etc/paddock/node.conf`: its name, its
//! address and the same variable). The herd renders them with `paddock-computed` (the
//! appliance's templates and data), stores each distinct content once in an object store
//! on disk, and lays them over the image per sub; the simulator's subs hold the same
//! files, so a synced sub plans empty. `render_s` is a change of the variable, which
//! touches every file of every host: all of them rendered again, hashed, and the 10,001 new
//! contents written as objects.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use paddock_computed::{FileDecl, Machine, Site, Source, Templates, VarSources, make_host};
use paddock_dominator::{ComputedFile, Overlay};
use paddock_image::{FileSystem, Image, ObjectId};
use paddock_imageserver::objects::ObjectStore;
use serde_json::Value;

pub const MOTD: &str = "welcome to the fleet";
pub const MOTD_CHANGED: &str = "welcome to the fleet, second edition";

/// The files' declarations and templates.
fn decls() -> (Vec<FileDecl>, BTreeMap<String, String>) {
    let decls = vec![
        FileDecl {
            path: "/etc/motd".into(),
            role: None,
            source: Source::Template("motd.j2".into()),
        },
        FileDecl {
            path: "/etc/paddock/node.conf".into(),
            role: None,
            source: Source::Template("node.j2".into()),
        },
    ];
    let templates = [
        ("motd.j2".to_string(), "{{ vars.motd }}\n".to_string()),
        (
            "node.j2".to_string(),
            "name={{ machine.name }}\naddress={{ machine.addresses[0] }}\nmotd={{ vars.motd }}\n"
                .to_string(),
        ),
    ]
    .into();
    (decls, templates)
}

/// What sub `i` holds (the simulator's side): the same bytes the templates give.
pub fn contents(i: usize, motd: &str) -> [(&'static str, String); 2] {
    [
        ("/etc/motd", format!("{motd}\n")),
        (
            "/etc/paddock/node.conf",
            format!(
                "name={}\naddress={}\nmotd={motd}\n",
                super::hostname(i),
                super::sub_ip(i)
            ),
        ),
    ]
}

fn file(content: &[u8]) -> ComputedFile {
    ComputedFile {
        object: ObjectId::of(content),
        size: u64::try_from(content.len()).unwrap_or(u64::MAX),
        mode: 0o644,
        uid: 0,
        gid: 0,
        check: None,
    }
}

/// Sub `i`'s tree: the image's with its files laid over it.
pub fn sub_tree(base: &Image, i: usize, motd: &str) -> FileSystem {
    let overlay = Overlay {
        files: contents(i, motd)
            .into_iter()
            .map(|(p, c)| (p.to_string(), file(c.as_bytes())))
            .collect(),
        missing: None,
    };
    match paddock_dominator::lay(base, &overlay) {
        Ok(i) => i.fs,
        Err(_) => base.fs.clone(),
    }
}

/// The renderer's side: the site, its templates, and the objects written so far.
pub struct Renderer {
    site: Site,
    decls: Vec<FileDecl>,
    templates: Templates,
    store: ObjectStore,
    stored: BTreeSet<ObjectId>,
}

/// One render of every host.
pub struct Rendered {
    pub overlays: Vec<Arc<Overlay>>,
    pub files: usize,
    pub new_objects: usize,
    pub seconds: f64,
}

impl Renderer {
    pub fn new(subs: usize, objects: &Path) -> super::Res<Renderer> {
        let (decls, templates) = decls();
        let machines = (0..subs)
            .map(|i| {
                let name = super::hostname(i);
                let m = Machine {
                    name: name.clone(),
                    addresses: vec![super::sub_ip(i).to_string()],
                    ..Machine::default()
                };
                (name, m)
            })
            .collect();
        let site = Site {
            machines,
            vars: VarSources::default(),
            ..Site::default()
        };
        Ok(Renderer {
            site,
            decls,
            templates: Templates::new(&templates)
                .map_err(|e| super::BenchError::Computed(e.to_string()))?,
            store: ObjectStore::open(objects)
                .map_err(|e| super::BenchError::Computed(e.to_string()))?,
            stored: BTreeSet::new(),
        })
    }

    /// Renders every host's files with `motd`, writes the contents not stored yet, and
    /// makes each host's overlay.
    pub fn render(&mut self, motd: &str) -> super::Res<Rendered> {
        let t = Instant::now();
        self.site.vars.spec.insert("motd".into(), Value::from(motd));
        let peers = self.site.peers();
        let mut run = |name: &str, _: Option<u64>, _: &Value| {
            Err(paddock_computed::MakeError::program(
                name,
                "the bench runs none",
            ))
        };
        let (mut files, mut new_objects) = (0, 0);
        let mut overlays = Vec::with_capacity(self.site.machines.len());
        for host in self.site.machines.keys() {
            let made = make_host(
                &self.site,
                &self.decls,
                &self.templates,
                &peers,
                host,
                &mut run,
            );
            let mut overlay = Overlay::default();
            for (path, content) in made {
                let content = content.map_err(|e| super::BenchError::Computed(e.to_string()))?;
                let f = file(content.as_bytes());
                if self.stored.insert(f.object) {
                    self.store
                        .put(f.object, content.as_bytes())
                        .map_err(|e| super::BenchError::Computed(e.to_string()))?;
                    new_objects += 1;
                }
                overlay.files.insert(path, f);
                files += 1;
            }
            overlays.push(Arc::new(overlay));
        }
        Ok(Rendered {
            overlays,
            files,
            new_objects,
            seconds: t.elapsed().as_secs_f64(),
        })
    }
}
