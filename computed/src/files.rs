//! Which computed files a machine has, and their contents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::data::Site;
use crate::render::{RenderError, render};

/// A computed file: a machine's own (every machine has it) or a role's (the machines that
/// run one of its instances have it), made from a template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDecl {
    pub path: String,
    pub role: Option<String>,
    /// The template's name (under the spec's templates).
    pub template: String,
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

/// Each of `host`'s files, rendered (or why not), by path.
pub fn render_host(
    site: &Site,
    decls: &[FileDecl],
    templates: &BTreeMap<String, String>,
    host: &str,
) -> BTreeMap<String, Result<String, RenderError>> {
    files_of(site, decls, host)
        .into_iter()
        .map(|d| {
            let out = match templates.get(&d.template) {
                Some(source) => render(&d.template, source, &site.data(host, d.role.as_deref())),
                None => Err(RenderError {
                    template: d.template.clone(),
                    line: None,
                    message: "no such template".into(),
                }),
            };
            (d.path.clone(), out)
        })
        .collect()
}
