//! What a validated spec is (its roles, their hooks and host selectors) and the hosts it is
//! allocated on: the types both the spec's parser ([`crate::spec`]) and the engine
//! ([`crate::engine`]) work with, so that the parser may run the engine's checks without the
//! engine depending on the parser.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A host the spec may allocate: an enrolled machine (or an appliance host).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    pub name: String,
    #[serde(default)]
    pub traits: BTreeSet<String>,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// A hook: a program under the hooks directory and the arguments it is given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    /// Relative to the hooks directory; no `..`, no leading `/`.
    pub path: String,
    /// BlacKnight's keys: `h`/`host`, `i`/`instance`, or a global argument's name.
    pub args: Vec<String>,
}

/// Which hosts a role that runs on a host may take. Empty: every idle host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selector {
    /// The host must have every one of these traits.
    pub traits: BTreeSet<String>,
    /// The host's property must equal the value.
    pub properties: BTreeMap<String, String>,
    /// If not empty, the host's name must be one of these.
    pub names: BTreeSet<String>,
}

impl Selector {
    pub fn matches(&self, host: &Host) -> bool {
        (self.names.is_empty() || self.names.contains(&host.name))
            && self.traits.is_subset(&host.traits)
            && self
                .properties
                .iter()
                .all(|(k, v)| host.properties.get(k) == Some(v))
    }
}

/// One role, validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    pub name: String,
    /// As declared; the engine also infers one from the dependers' minimums.
    pub min: u32,
    pub max: Option<u32>,
    pub priority: i32,
    pub start: Option<Hook>,
    pub stop: Option<Hook>,
    /// Asked before a machine running one of its instances is disrupted (an update that
    /// reboots it or runs a high-impact trigger): exit 0 permits.
    #[serde(default)]
    pub disrupt: Option<Hook>,
    /// Dependee → how many instances of this role one dependee instance serves.
    pub depends: BTreeMap<String, u32>,
    pub image: Option<String>,
    pub hosts: Selector,
    /// Each instance takes a host of its own: a role without dependencies (BlacKnight's
    /// leaf), or one with an `image` or a `hosts` selector.
    pub on_host: bool,
    /// The line of the role's table (for messages about the role as a whole).
    pub line: usize,
    /// The ports its service declares in DNS: an SRV record per member in service.
    #[serde(default)]
    pub dns_ports: Vec<DnsPort>,
    /// A hook role's version (its hooks' `v`/`version` argument); a change rolls it out.
    #[serde(default)]
    pub version: Option<String>,
    /// How a change of its image or version rolls out.
    #[serde(default)]
    pub update: paddock_rollout::Policy,
    /// Its instance count follows a metric its instances report.
    #[serde(default)]
    pub scale: Option<crate::scale::Scale>,
    /// Its variables, for its files' templates.
    #[serde(default)]
    pub vars: paddock_computed::Vars,
    /// The computed files it gives the machines that run it.
    #[serde(default)]
    pub files: Vec<FileSpec>,
}

/// A computed file: rendered from a template for each machine that has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSpec {
    pub path: String,
    /// What it is made from (a template is named relative to the spec's templates).
    pub source: paddock_computed::Source,
    /// Run on the machine against the new content before it replaces the old (the program
    /// and its arguments; the new content's path is appended).
    #[serde(default)]
    pub check: Option<Vec<String>>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A port of a role's service, as SRV records carry it (RFC 2782).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsPort {
    pub port: u16,
    pub priority: u16,
    pub weight: u16,
}

impl Role {
    /// Each instance takes a host of its own.
    pub fn on_host(&self) -> bool {
        self.on_host
    }
}

/// A validated spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub file: String,
    pub args: BTreeMap<String, String>,
    pub roles: BTreeMap<String, Role>,
    /// `[vars]`: every template's variables.
    #[serde(default)]
    pub vars: paddock_computed::Vars,
    /// `[hosts.<name>]`: a host's variables, and its variables per role.
    #[serde(default)]
    pub hosts: BTreeMap<String, paddock_computed::HostVars>,
    /// `[[files]]`: the computed files every machine has.
    #[serde(default)]
    pub files: Vec<FileSpec>,
}

impl Spec {
    /// The variables, as templates see them merged.
    pub fn var_sources(&self) -> paddock_computed::VarSources {
        paddock_computed::VarSources {
            spec: self.vars.clone(),
            roles: self
                .roles
                .iter()
                .filter(|(_, r)| !r.vars.is_empty())
                .map(|(n, r)| (n.clone(), r.vars.clone()))
                .collect(),
            hosts: self.hosts.clone(),
        }
    }

    /// Every template a computed file is made from.
    pub fn templates(&self) -> std::collections::BTreeSet<String> {
        let own = self.files.iter();
        own.chain(self.roles.values().flat_map(|r| r.files.iter()))
            .filter_map(|f| match &f.source {
                paddock_computed::Source::Template(t) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    /// The declaration of the computed file at `path`.
    pub fn file(&self, path: &str) -> Option<&FileSpec> {
        let own = self.files.iter();
        own.chain(self.roles.values().flat_map(|r| r.files.iter()))
            .find(|f| f.path == path)
    }

    /// Every computed file: the machines' own, then each role's.
    pub fn file_decls(&self) -> Vec<paddock_computed::FileDecl> {
        let decl = |f: &FileSpec, role: Option<&str>| paddock_computed::FileDecl {
            path: f.path.clone(),
            role: role.map(str::to_string),
            source: f.source.clone(),
        };
        let mut out: Vec<_> = self.files.iter().map(|f| decl(f, None)).collect();
        for (name, r) in &self.roles {
            out.extend(r.files.iter().map(|f| decl(f, Some(name))));
        }
        out
    }
}
