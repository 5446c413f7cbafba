//! Strict rendering of a template against a machine's data.

use serde_json::Value;

/// A template that could not be rendered: which, where, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{template}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct RenderError {
    pub template: String,
    pub line: Option<usize>,
    pub message: String,
}

/// Renders `source` (named `name`, for messages) with `data`. Nothing is escaped (these are
/// configuration files, not HTML); an undefined variable is an error naming it.
pub fn render(name: &str, source: &str, data: &Value) -> Result<String, RenderError> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_keep_trailing_newline(true);
    let fail = |e: &minijinja::Error, message: String| RenderError {
        template: name.to_string(),
        line: e.line(),
        message,
    };
    let template = env
        .template_from_named_str(name, source)
        .map_err(|e| fail(&e, e.detail().unwrap_or("syntax error").to_string()))?;
    template.render(data).map_err(|e| {
        let message = if e.kind() == minijinja::ErrorKind::UndefinedError {
            match first_missing(&template.undeclared_variables(true), data) {
                Some(var) => format!("undefined variable {var}"),
                None => "undefined value".to_string(),
            }
        } else {
            e.detail().map_or_else(|| e.to_string(), str::to_string)
        };
        fail(&e, message)
    })
}

/// The first of `names` (dotted paths, sorted) that `data` does not hold.
fn first_missing(names: &std::collections::HashSet<String>, data: &Value) -> Option<String> {
    let mut names: Vec<&String> = names.iter().collect();
    names.sort();
    names
        .into_iter()
        .find(|n| {
            let mut v = data;
            n.split('.').any(|part| match v.get(part) {
                Some(next) => {
                    v = next;
                    false
                }
                None => true,
            })
        })
        .cloned()
}
