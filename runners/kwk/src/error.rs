//! The crate's one error type. Every variant names the input (file, tensor, key) it is
//! about, so the harness can print it as a single line that says what to fix.

use std::path::PathBuf;

pub type Result<T, E = KwkError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum KwkError {
    /// The message holds the I/O error's text; the error is not also given as the `source`
    /// (a printer of the whole chain, such as anyhow's `{:#}`, would print it twice).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A model file is malformed (bad header, truncated data, shape that does not match
    /// the config, missing tensor or key). `what` names the tensor or key.
    #[error("{path}: {what}")]
    BadModel { path: PathBuf, what: String },
    /// The model is well-formed but this decoder cannot run it (architecture, rope
    /// scaling, tensor type, ...).
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("model not found: {0}")]
    NotFound(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// A stop was requested ([`crate::interrupt`]) and the work was abandoned.
    #[error("interrupted")]
    Interrupted,
}

impl KwkError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        KwkError::Io {
            path: path.into(),
            error: source,
        }
    }
    pub fn bad_model(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        KwkError::BadModel {
            path: path.into(),
            what: what.into(),
        }
    }
}
