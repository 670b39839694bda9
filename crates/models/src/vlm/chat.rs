//! A checkpoint's own chat template (Jinja), rendered as transformers' `apply_chat_template`
//! renders it: `trim_blocks` and `lstrip_blocks`, loop controls, Python string methods, and
//! `raise_exception`.

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{json, Value};

use crate::ModelError;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// The template of a model folder: `chat_template.jinja`, else `chat_template` of
    /// `chat_template.json`, else of `tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| ModelError::Io {
                path: jinja.display().to_string(),
                message: e.to_string(),
            })?;
            return Self::new(source, &jinja);
        }
        for name in ["chat_template.json", "tokenizer_config.json"] {
            let file = dir.join(name);
            if !file.exists() {
                continue;
            }
            let value: Value = crate::read_config(&file)?;
            if let Some(source) = value["chat_template"].as_str() {
                return Self::new(source.to_string(), &file);
            }
        }
        Err(ModelError::Io {
            path: dir.display().to_string(),
            message: "no chat template: expected chat_template.jinja, or `chat_template` in \
                      chat_template.json or tokenizer_config.json"
                .into(),
        })
    }

    /// Compiles `source`; `file` names it in errors.
    pub fn new(source: String, file: &Path) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.expect("the default delimiters"));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source).map_err(|e| ModelError::Format {
            path: file.display().to_string(),
            message: format!("chat template: {e}"),
        })?;
        Ok(Self { env })
    }

    /// `messages` (OpenAI-style roles and content) rendered, with the assistant's opening when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &Value,
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let template = self.env.get_template("chat").expect("added at construction");
        let context =
            json!({ "messages": messages, "add_generation_prompt": add_generation_prompt });
        template
            .render(minijinja::value::Serde(&context))
            .map_err(|e| ModelError::Input(format!("rendering the chat template: {e:#}")))
    }

    /// A judge's request: an optional system message, then one user turn of a picture followed
    /// by `user`, and the assistant's opening.
    pub fn picture_question(&self, system: Option<&str>, user: &str) -> Result<String, ModelError> {
        let mut messages = vec![];
        if let Some(system) = system {
            messages.push(json!({ "role": "system", "content": system }));
        }
        messages.push(json!({ "role": "user", "content": [
            { "type": "image" },
            { "type": "text", "text": user },
        ] }));
        self.render(&Value::Array(messages), true)
    }
}
