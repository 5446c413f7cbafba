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

fn environment<'s>() -> minijinja::Environment<'s> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_keep_trailing_newline(true);
    env
}

fn failure(name: &str, e: &minijinja::Error, message: String) -> RenderError {
    RenderError {
        template: name.to_string(),
        line: e.line(),
        message,
    }
}

fn syntax(name: &str, e: &minijinja::Error) -> RenderError {
    failure(name, e, e.detail().unwrap_or("syntax error").to_string())
}

/// Renders `source` (named `name`, for messages) with `data`. Nothing is escaped (these are
/// configuration files, not HTML); an undefined variable is an error naming it.
pub fn render(name: &str, source: &str, data: &Value) -> Result<String, RenderError> {
    let env = environment();
    let template = env
        .template_from_named_str(name, source)
        .map_err(|e| syntax(name, &e))?;
    finish(name, &template, data)
}

/// A spec's templates, each compiled once for every machine it is rendered for.
pub struct Templates {
    env: minijinja::Environment<'static>,
}

impl Templates {
    /// Compiles every template; the first that does not compile is the error.
    pub fn new(sources: &std::collections::BTreeMap<String, String>) -> Result<Self, RenderError> {
        let mut env = environment();
        for (name, source) in sources {
            env.add_template_owned(name.clone(), source.clone())
                .map_err(|e| syntax(name, &e))?;
        }
        Ok(Templates { env })
    }

    /// Renders the template `name` with `data`, as [`render`].
    pub fn render(&self, name: &str, data: &Value) -> Result<String, RenderError> {
        let template = self.env.get_template(name).map_err(|_| RenderError {
            template: name.to_string(),
            line: None,
            message: "no such template".into(),
        })?;
        finish(name, &template, data)
    }
}

fn finish(
    name: &str,
    template: &minijinja::Template<'_, '_>,
    data: &Value,
) -> Result<String, RenderError> {
    let fail = |e: &minijinja::Error, message: String| failure(name, e, message);
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
