//! Resolving `--llm` (HF folder, hub id, GGUF file, short name) and loading a [`Model`].
//!
//! SKELETON: lands with the decoder issue.

use super::Model;
use crate::error::{KwkError, Result};

/// Where a model comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    HfFolder(std::path::PathBuf),
    Gguf(std::path::PathBuf),
    Hub {
        repo: String,
        revision: Option<String>,
    },
}

pub fn load_model(spec: &str) -> Result<Model> {
    Err(KwkError::NotFound(spec.to_string()))
}
