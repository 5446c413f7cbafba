//! Which computed files a machine has, and their contents.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::data::Site;
use crate::render::{RenderError, Templates};

/// Why one of a machine's files could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MakeError {
    #[error(transparent)]
    Render(#[from] RenderError),
    /// Its program failed, or could not be run.
    #[error("program {program}: {why}")]
    Program { program: String, why: String },
}

impl MakeError {
    pub fn program(program: &str, why: impl std::fmt::Display) -> Self {
        MakeError::Program {
            program: program.to_string(),
            why: why.to_string(),
        }
    }
}

/// What a computed file is made from (`filegen-server`'s generators).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A template of the spec's, by name.
    Template(String),
    /// The machine's MDB entry, as JSON.
    Mdb,
    /// A program (by name, in the hooks directory) that reads the machine's data as JSON on
    /// its standard input and prints the content; made again when its data changes or after
    /// `valid_secs`.
    Program {
        name: String,
        valid_secs: Option<u64>,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Template(t) => write!(f, "template {t}"),
            Source::Mdb => write!(f, "the MDB entry"),
            Source::Program { name, .. } => write!(f, "program {name}"),
        }
    }
}

/// A computed file: a machine's own (every machine has it) or a role's (the machines that
/// run one of its instances have it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDecl {
    pub path: String,
    pub role: Option<String>,
    pub source: Source,
}

/// The files `host` has: the machine's own, and those of the roles it runs.
pub fn files_of<'a>(site: &Site, decls: &'a [FileDecl], host: &str) -> Vec<&'a FileDecl> {
    decls
        .iter()
        .filter(|d| match &d.role {
            None => true,
            Some(r) => site
                .instances
                .iter()
                .any(|(role, _, h)| role == r && h.as_deref() == Some(host)),
        })
        .collect()
}

/// How a program's output is had: `(program, the machine's data)` → its output or why not
/// (the shell runs it, or answers from what it kept).
pub type RunProgram<'a> = dyn FnMut(&str, Option<u64>, &Value) -> Result<String, MakeError> + 'a;

/// Each of `host`'s files with its content, or why it cannot be made (the template and the
/// line for a template), in declaration order. `peers` is [`Site::peers`], made once for
/// every host.
pub fn make_host(
    site: &Site,
    decls: &[FileDecl],
    templates: &Templates,
    peers: &Value,
    host: &str,
    run: &mut RunProgram<'_>,
) -> Vec<(String, Result<String, MakeError>)> {
    files_of(site, decls, host)
        .into_iter()
        .map(|d| {
            let data = || site.data_with(host, d.role.as_deref(), peers);
            let out = match &d.source {
                Source::Template(name) => templates.render(name, &data()).map_err(MakeError::from),
                Source::Mdb => Ok(site
                    .machines
                    .get(host)
                    .and_then(|m| m.mdb.as_ref())
                    .map_or_else(
                        || "null\n".to_string(),
                        |v| format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()),
                    )),
                Source::Program { name, valid_secs } => run(name, *valid_secs, &data()),
            };
            (d.path.clone(), out)
        })
        .collect()
}
