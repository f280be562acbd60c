//! Edge prompts: Mustache-style variables (`{{x}}`, `{{{x}}}`, dotted paths
//! `{{a.b}}`) rendered by `handlebars` with HTML escaping off, from the
//! previous step's frontmatter.

use std::collections::BTreeSet;
use std::sync::RwLock;

use handlebars::template::{Parameter, Template, TemplateElement};
use handlebars::{Handlebars, Path};

/// Why a prompt could not be parsed or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template does not parse.
    #[error("prompt template does not parse: {0}")]
    Parse(String),
    /// Rendering failed.
    #[error("prompt template failed to render: {0}")]
    Render(String),
    /// The prompt rendered to nothing.
    #[error("prompt rendered to an empty text (template {template:?})")]
    Empty {
        /// The template.
        template: String,
    },
}

/// The top-level variable names a template reads (`a` for `{{a.b}}`).
pub fn variables(template: &str) -> Result<BTreeSet<String>, TemplateError> {
    let t = Template::compile(template).map_err(|e| TemplateError::Parse(e.to_string()))?;
    let mut out = BTreeSet::new();
    collect(&t, &mut out);
    Ok(out)
}

fn param_name(p: &Parameter) -> Option<String> {
    let raw = match p {
        Parameter::Name(n) => n.as_str(),
        Parameter::Path(Path::Relative((_, raw))) => raw.as_str(),
        _ => return None,
    };
    let first = raw.split(['.', '/']).next().unwrap_or(raw);
    (!first.is_empty() && first != "this").then(|| first.to_owned())
}

fn collect(t: &Template, out: &mut BTreeSet<String>) {
    for e in &t.elements {
        match e {
            TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
                if h.params.is_empty() {
                    out.extend(param_name(&h.name));
                }
                out.extend(h.params.iter().filter_map(param_name));
            }
            TemplateElement::HelperBlock(h) => {
                out.extend(h.params.iter().filter_map(param_name));
                if let Some(inner) = &h.template {
                    collect(inner, out);
                }
                if let Some(inner) = &h.inverse {
                    collect(inner, out);
                }
            }
            _ => {}
        }
    }
}

/// Renders `template` with `data`; an empty or all-whitespace result is an
/// error. The template is compiled for this one call; [`Templates`] keeps
/// compiled templates.
pub fn render(template: &str, data: &impl serde::Serialize) -> Result<String, TemplateError> {
    let mut hb = Handlebars::new();
    hb.register_escape_fn(handlebars::no_escape);
    hb.register_template_string("t", template)
        .map_err(|e| TemplateError::Parse(e.to_string()))?;
    let text = hb
        .render("t", data)
        .map_err(|e| TemplateError::Render(e.to_string()))?;
    non_empty(template, text)
}

fn non_empty(template: &str, text: String) -> Result<String, TemplateError> {
    if text.trim().is_empty() {
        return Err(TemplateError::Empty {
            template: template.to_owned(),
        });
    }
    Ok(text)
}

/// Compiled templates, named by their own text, so an entry never goes
/// stale: a workflow's prompts are few and rendered at every step. The
/// engine keeps one per open store; at 4096 templates it starts over.
#[derive(Debug)]
pub struct Templates {
    registry: RwLock<Handlebars<'static>>,
}

impl Default for Templates {
    fn default() -> Self {
        let mut hb = Handlebars::new();
        hb.register_escape_fn(handlebars::no_escape);
        Templates {
            registry: RwLock::new(hb),
        }
    }
}

impl Templates {
    /// Renders `template` with `data`, compiling it on first use; an empty
    /// or all-whitespace result is an error.
    pub fn render(
        &self,
        template: &str,
        data: &impl serde::Serialize,
    ) -> Result<String, TemplateError> {
        let known = self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .has_template(template);
        if !known {
            let mut hb = self.registry.write().unwrap_or_else(|p| p.into_inner());
            if hb.get_templates().len() >= 4096 {
                hb.clear_templates();
            }
            hb.register_template_string(template, template)
                .map_err(|e| TemplateError::Parse(e.to_string()))?;
        }
        let text = self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .render(template, data)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        non_empty(template, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_without_escaping_and_with_dotted_paths() {
        let data = json!({"reason": "a < b & \"c\"", "$status": "rejected", "pr": {"n": 7}});
        assert_eq!(
            render(
                "Fix: {{reason}} / {{{reason}}} #{{pr.n}} ({{$status}})",
                &data
            )
            .unwrap(),
            "Fix: a < b & \"c\" / a < b & \"c\" #7 (rejected)"
        );
        assert!(matches!(
            render("{{missing}}  ", &data),
            Err(TemplateError::Empty { .. })
        ));
    }

    #[test]
    fn lists_variables() {
        let v = variables("Fix {{{reason}}} in {{pr.title}} {{#if urgent}}now{{/if}} {{$status}}")
            .unwrap();
        assert_eq!(
            v.into_iter().collect::<Vec<_>>(),
            vec!["$status", "pr", "reason", "urgent"]
        );
        assert!(variables("{{#if}").is_err());
    }
}
