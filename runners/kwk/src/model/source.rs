//! Resolving `--llm` (HF folder, hub id, GGUF file, short name) and loading a [`Model`].
//!
//! [`resolve_spec`] decides what a `--llm` value names, in this order: an existing folder
//! (Hugging Face layout), a `.gguf` file (or any file starting with the GGUF magic), a hub id
//! `org/name[@revision]`, or a short name from [`SHORT_NAMES`] (case-insensitive, also with
//! `@revision`); an unknown short name is an error listing the close matches.
//!
//! Hub ids resolve through the standard Hugging Face cache layout
//! (`<cache>/models--ORG--NAME/{refs/REV, snapshots/SHA/...}`, shared with Python's
//! `huggingface_hub`), so a cached model loads with no network. The cache is `HF_HUB_CACHE`,
//! else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`; `HF_HUB_OFFLINE=1` forbids the
//! network; otherwise missing files are downloaded with the `hf-hub` crate from
//! `HF_ENDPOINT` (default `https://huggingface.co`) with `HF_TOKEN` (or the saved token
//! file) for gated models. All of that is read once into [`HubSettings`], which tests build
//! by hand instead of mutating the process environment. The hub cache and download live in
//! `model/hub.rs` (re-exported here).

use super::config::ModelConfig;
use super::gguf_loader::load_gguf;
pub use super::hub::{cached_snapshot, resolve_hub, HubSettings};
use super::safetensors_loader::load_hf_weights;
use super::{LoadInfo, Model, ModelWeights};
use crate::error::{KwkError, Result};
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    HfFolder(std::path::PathBuf),
    Gguf(std::path::PathBuf),
    Hub {
        repo: String,
        revision: Option<String>,
    },
}

/// Short names people type, and the hub repositories they stand for.
pub const SHORT_NAMES: &[(&str, &str)] = &[
    ("SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M"),
    (
        "SmolLM2-135M-Instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    ("SmolLM2-360M", "HuggingFaceTB/SmolLM2-360M"),
    (
        "SmolLM2-360M-Instruct",
        "HuggingFaceTB/SmolLM2-360M-Instruct",
    ),
    ("SmolLM2-1.7B", "HuggingFaceTB/SmolLM2-1.7B"),
    (
        "SmolLM2-1.7B-Instruct",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    ),
    ("Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),
    ("Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B"),
    ("Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
    ("Qwen2.5-3B", "Qwen/Qwen2.5-3B"),
    ("Qwen2.5-7B", "Qwen/Qwen2.5-7B"),
    ("Qwen3-0.6B", "Qwen/Qwen3-0.6B"),
    ("Qwen3-1.7B", "Qwen/Qwen3-1.7B"),
    ("Qwen3-4B", "Qwen/Qwen3-4B"),
    ("Qwen3-8B", "Qwen/Qwen3-8B"),
    ("Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"),
    ("Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B"),
    ("Llama-3.2-1B", "meta-llama/Llama-3.2-1B"),
    ("Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
    ("Llama-3.2-3B", "meta-llama/Llama-3.2-3B"),
    ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    (
        "TinyLlama-1.1B-Chat-v1.0",
        "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    ),
    ("Mistral-7B-v0.1", "mistralai/Mistral-7B-v0.1"),
    (
        "Mistral-7B-Instruct-v0.2",
        "mistralai/Mistral-7B-Instruct-v0.2",
    ),
    ("Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
];

/// Levenshtein distance (for "did you mean").
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Known short names close to `name`, closest first.
pub fn close_short_names(name: &str) -> Vec<&'static str> {
    let lower = name.to_ascii_lowercase();
    let mut scored: Vec<(usize, &str)> = SHORT_NAMES
        .iter()
        .filter_map(|(short, _)| {
            let s = short.to_ascii_lowercase();
            let d = edit_distance(&lower, &s);
            let related = s.contains(&lower) || lower.contains(&s) || d <= (s.len() / 3).max(3);
            related.then_some((d, *short))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(5).map(|(_, s)| s).collect()
}

/// Splits `name@revision`.
fn split_revision(spec: &str) -> (&str, Option<String>) {
    match spec.rsplit_once('@') {
        Some((name, rev)) if !name.is_empty() && !rev.is_empty() => (name, Some(rev.to_string())),
        _ => (spec, None),
    }
}

/// `org/name`: two non-empty parts of letters, digits, `-`, `_`, `.`, not starting with `.`.
fn is_hub_id(s: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.len() <= 96
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    matches!(s.split_once('/'), Some((org, name)) if part_ok(org) && part_ok(name))
}

/// What a `--llm` value names. Local paths win over hub ids and short names.
pub fn resolve_spec(spec: &str) -> Result<ModelSource> {
    let path = Path::new(spec);
    if path.is_dir() {
        // `exists`, not `is_file`: a config.json that is a pipe or a device is refused by
        // the loader as what it is, not as missing.
        if !path.join("config.json").exists() {
            return Err(KwkError::NotFound(format!(
                "'{spec}' is a folder without config.json; a model folder needs config.json, \
                 tokenizer.json and the *.safetensors weights (Hugging Face layout)"
            )));
        }
        return Ok(ModelSource::HfFolder(path.to_path_buf()));
    }
    if path.is_file() {
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && &magic == b"GGUF";
        if is_gguf || spec.ends_with(".gguf") {
            return Ok(ModelSource::Gguf(path.to_path_buf()));
        }
        return Err(KwkError::NotFound(format!(
            "'{spec}' is a file but not a GGUF model; pass a .gguf file, a Hugging Face \
             model folder, a hub id (org/name) or a short name such as SmolLM2-135M-Instruct"
        )));
    }
    if let Ok(meta) = std::fs::metadata(path) {
        // It exists, but is neither: a named pipe, a device, a socket.
        return Err(KwkError::InvalidArgument(format!(
            "'{spec}' is not a regular file or folder (a {}); pass a .gguf file or a Hugging \
             Face model folder",
            crate::files::kind(&meta.file_type())
        )));
    }
    if spec.ends_with(".gguf") {
        return Err(KwkError::NotFound(format!(
            "GGUF file '{spec}' does not exist"
        )));
    }
    let (name, revision) = split_revision(spec);
    if is_hub_id(name) {
        return Ok(ModelSource::Hub {
            repo: name.to_string(),
            revision,
        });
    }
    if !name.contains('/') && !name.contains('\\') {
        if let Some((_, repo)) = SHORT_NAMES
            .iter()
            .find(|(short, _)| short.eq_ignore_ascii_case(name))
        {
            return Ok(ModelSource::Hub {
                repo: repo.to_string(),
                revision,
            });
        }
        let close = close_short_names(name);
        let hint = if close.is_empty() {
            format!(
                "known short names: {}",
                SHORT_NAMES
                    .iter()
                    .map(|s| s.0)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!("did you mean {}?", close.join(", "))
        };
        return Err(KwkError::NotFound(format!(
            "'{spec}' is not a folder, a .gguf file, a hub id (org/name) or a known short \
             name; {hint}"
        )));
    }
    Err(KwkError::NotFound(format!(
        "'{spec}' does not exist as a folder or file, and is not a hub id of the form org/name"
    )))
}

/// Config and weights of a Hugging Face folder.
pub fn load_hf_folder(dir: &Path) -> Result<(ModelConfig, ModelWeights, LoadInfo)> {
    let start = Instant::now();
    let config = ModelConfig::from_hf_config_json(&dir.join("config.json"))?;
    let (weights, mut info) = load_hf_weights(dir, &config)?;
    info.read_s = start.elapsed().as_secs_f64();
    Ok((config, weights, info))
}

/// The local path a `--llm` value loads from (downloading a hub model when needed).
pub fn resolve_local(spec: &str, settings: &HubSettings) -> Result<(ModelSource, PathBuf)> {
    let source = resolve_spec(spec)?;
    let path = match &source {
        ModelSource::HfFolder(p) | ModelSource::Gguf(p) => p.clone(),
        ModelSource::Hub { repo, revision } => resolve_hub(repo, revision.as_deref(), settings)?,
    };
    Ok((source, path))
}

/// Loads the model `spec` names (see [`resolve_spec`]), with hub settings from the
/// environment.
pub fn load_model(spec: &str) -> Result<Model> {
    load_model_with(spec, &HubSettings::from_env())
}

/// [`load_model`] with explicit hub settings.
pub fn load_model_with(spec: &str, settings: &HubSettings) -> Result<Model> {
    let (source, path) = resolve_local(spec, settings)?;
    let start = Instant::now();
    let (config, weights, tokenizer, mut info) = match source {
        ModelSource::Gguf(_) => {
            let (config, weights, meta, info) = load_gguf(&path)?;
            (config, weights, Tokenizer::from_gguf(&meta)?, info)
        }
        ModelSource::HfFolder(_) | ModelSource::Hub { .. } => {
            let (config, weights, info) = load_hf_folder(&path)?;
            (config, weights, Tokenizer::from_hf_folder(&path)?, info)
        }
    };
    check_tokenizer_fits(&tokenizer, &config, &source, &path)?;
    info.requested = spec.to_string();
    info.resolved_path = path;
    info.read_s = start.elapsed().as_secs_f64();
    Ok(Model {
        config,
        weights,
        tokenizer,
        info,
    })
}

/// A tokenizer with ids past the embedding's rows belongs to another model: refused at load,
/// naming both sizes, rather than when the first such id is looked up.
fn check_tokenizer_fits(
    tokenizer: &Tokenizer,
    config: &ModelConfig,
    source: &ModelSource,
    path: &Path,
) -> Result<()> {
    let ids = tokenizer.vocab_size();
    if ids <= config.vocab_size {
        return Ok(());
    }
    let (file, what) = match source {
        ModelSource::Gguf(_) => (path.to_path_buf(), "re-convert the model"),
        _ => (
            path.join("tokenizer.json"),
            "use the model's own tokenizer.json",
        ),
    };
    Err(KwkError::Tokenizer(format!(
        "{}: has ids up to {} but the embedding has {} rows (ids 0 to {}): the tokenizer does \
         not belong to this model ({what})",
        file.display(),
        ids - 1,
        config.vocab_size,
        config.vocab_size.saturating_sub(1)
    )))
}

/// A model's config, tokenizer and load figures without its weights: what a warm start
/// from the pack cache needs ([`crate::KwkDecoder::from_pack_cache`]). The GGUF header or
/// `config.json` and the tokenizer are read; no tensor is.
pub struct ModelHeader {
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub info: LoadInfo,
    pub(crate) source: ModelSource,
}

/// [`load_model_header`] with hub settings from the environment.
pub fn load_model_header(spec: &str) -> Result<ModelHeader> {
    load_model_header_with(spec, &HubSettings::from_env())
}

/// The header of the model `spec` names (see [`resolve_spec`]).
pub fn load_model_header_with(spec: &str, settings: &HubSettings) -> Result<ModelHeader> {
    let (source, path) = resolve_local(spec, settings)?;
    let start = Instant::now();
    let (config, tokenizer, source_bytes, source_types) = match &source {
        ModelSource::Gguf(_) => {
            let file = crate::gguf::GgufFile::open(&path)?;
            let config = super::config::config_from_gguf(&file)?;
            let meta = super::gguf_loader::tokenizer_metadata_from_gguf(&file)?;
            let summary = file.summary();
            (
                config,
                Tokenizer::from_gguf(&meta)?,
                summary.tensor_bytes,
                summary.type_counts,
            )
        }
        ModelSource::HfFolder(_) | ModelSource::Hub { .. } => {
            let config = ModelConfig::from_hf_config_json(&path.join("config.json"))?;
            // A shard missing from the index is refused now, not when a row reads weights.
            super::safetensors_loader::safetensors_files(&path)?;
            let mut bytes = 0;
            for entry in std::fs::read_dir(&path).map_err(|e| KwkError::io(&path, e))? {
                let entry = entry.map_err(|e| KwkError::io(&path, e))?;
                if entry
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".safetensors")
                {
                    bytes += std::fs::metadata(entry.path()).map_or(0, |m| m.len());
                }
            }
            (
                config,
                Tokenizer::from_hf_folder(&path)?,
                bytes,
                Default::default(),
            )
        }
    };
    check_tokenizer_fits(&tokenizer, &config, &source, &path)?;
    Ok(ModelHeader {
        config,
        tokenizer,
        info: LoadInfo {
            requested: spec.to_string(),
            resolved_path: path,
            source_bytes,
            source_types,
            read_s: start.elapsed().as_secs_f64(),
        },
        source,
    })
}

impl ModelHeader {
    /// Reads the weights: the whole [`Model`].
    pub fn load_weights(self) -> Result<Model> {
        let start = Instant::now();
        let path = &self.info.resolved_path;
        let (weights, info) = match self.source {
            ModelSource::Gguf(_) => {
                let (_, weights, _, info) = load_gguf(path)?;
                (weights, info)
            }
            ModelSource::HfFolder(_) | ModelSource::Hub { .. } => {
                load_hf_weights(path, &self.config)?
            }
        };
        Ok(Model {
            config: self.config,
            weights,
            tokenizer: self.tokenizer,
            info: LoadInfo {
                read_s: self.info.read_s + start.elapsed().as_secs_f64(),
                source_types: info.source_types,
                source_bytes: info.source_bytes,
                ..self.info
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::hub::{env_is_true, wanted_files};
    use super::*;
    use kwk_fixtures::model_dir as fixture_dir;

    fn offline(cache: &Path) -> HubSettings {
        HubSettings {
            cache_dir: cache.to_path_buf(),
            endpoint: "http://127.0.0.1:9".into(),
            token: None,
            offline: true,
        }
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A hub cache holding tiny-llama as `kwk-test/tiny-llama` at `main`.
    fn fake_cache() -> tempfile::TempDir {
        let cache = tempfile::tempdir().unwrap();
        let root = cache.path().join("models--kwk-test--tiny-llama");
        let snap = root.join("snapshots").join(SHA);
        std::fs::create_dir_all(&snap).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(fixture_dir("tiny-llama").join(f), snap.join(f)).unwrap();
        }
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs/main"), SHA).unwrap();
        cache
    }

    #[test]
    fn cached_hub_model_loads_offline() {
        let cache = fake_cache();
        let settings = offline(cache.path());
        let (source, path) = resolve_local("kwk-test/tiny-llama", &settings).unwrap();
        assert_eq!(
            source,
            ModelSource::Hub {
                repo: "kwk-test/tiny-llama".into(),
                revision: None
            }
        );
        let snap = cache
            .path()
            .join("models--kwk-test--tiny-llama/snapshots")
            .join(SHA);
        assert_eq!(path, snap);
        let (_, at_sha) = resolve_local(&format!("kwk-test/tiny-llama@{SHA}"), &settings).unwrap();
        assert_eq!(at_sha, snap);
        let (config, weights, _) = load_hf_folder(&path).unwrap();
        let (_, reference, _) = load_hf_folder(&fixture_dir("tiny-llama")).unwrap();
        assert_eq!(config.n_layers, 2);
        assert_eq!(weights.embed, reference.embed);
    }

    #[test]
    fn uncached_offline_is_one_plain_message() {
        let cache = fake_cache();
        let settings = offline(cache.path());
        let err = resolve_local("kwk-test/tiny-llama@v2", &settings).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KwkError::NotFound(_)));
        assert!(
            msg.contains("kwk-test/tiny-llama@v2") && msg.contains("HF_HUB_OFFLINE"),
            "{msg}"
        );
        let msg = resolve_local("kwk-test/absent", &settings)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("not in the Hugging Face cache"), "{msg}");
    }

    #[test]
    fn revision_cannot_leave_the_cache() {
        let cache = fake_cache();
        let root = cache.path().join("models--kwk-test--tiny-llama");
        std::fs::write(root.join("main-copy"), SHA).unwrap();
        assert!(cached_snapshot(cache.path(), "kwk-test/tiny-llama", "../main-copy").is_none());
        assert!(cached_snapshot(cache.path(), "kwk-test/tiny-llama", "main").is_some());
    }

    #[test]
    fn incomplete_snapshot_is_not_used() {
        let cache = fake_cache();
        let snap = cache
            .path()
            .join("models--kwk-test--tiny-llama/snapshots")
            .join(SHA);
        std::fs::remove_file(snap.join("model.safetensors")).unwrap();
        assert!(cached_snapshot(cache.path(), "kwk-test/tiny-llama", "main").is_none());
        assert!(resolve_local("kwk-test/tiny-llama", &offline(cache.path())).is_err());
    }

    #[test]
    fn unreachable_endpoint_is_one_plain_message() {
        let cache = tempfile::tempdir().unwrap();
        let settings = HubSettings {
            offline: false,
            ..offline(cache.path())
        };
        let err = resolve_local("kwk-test/not-cached", &settings).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KwkError::NotFound(_)), "{msg}");
        assert!(
            msg.contains("could not be downloaded from http://127.0.0.1:9"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn local_folder_and_gguf_paths() {
        let dir = fixture_dir("tiny-qwen2");
        let s = dir.to_str().unwrap();
        assert_eq!(resolve_spec(s).unwrap(), ModelSource::HfFolder(dir.clone()));
        let gguf = dir.join("model.gguf");
        assert_eq!(
            resolve_spec(gguf.to_str().unwrap()).unwrap(),
            ModelSource::Gguf(gguf)
        );
        let empty = tempfile::tempdir().unwrap();
        let msg = resolve_spec(empty.path().to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("needs config.json"), "{msg}");
        let msg = resolve_spec("/nonexistent/model.gguf")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("does not exist"), "{msg}");
        let msg = resolve_spec(dir.join("config.json").to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("not a GGUF"), "{msg}");
        let msg = resolve_spec("./no/such/folder").unwrap_err().to_string();
        assert!(msg.contains("does not exist"), "{msg}");
    }

    #[test]
    fn short_names_and_hub_ids() {
        assert_eq!(
            resolve_spec("SmolLM2-1.7B").unwrap(),
            ModelSource::Hub {
                repo: "HuggingFaceTB/SmolLM2-1.7B".into(),
                revision: None
            }
        );
        assert_eq!(
            resolve_spec("qwen2.5-0.5b@refs/pr/1").unwrap(),
            ModelSource::Hub {
                repo: "Qwen/Qwen2.5-0.5B".into(),
                revision: Some("refs/pr/1".into())
            }
        );
        assert_eq!(
            resolve_spec("HuggingFaceTB/SmolLM2-135M@main").unwrap(),
            ModelSource::Hub {
                repo: "HuggingFaceTB/SmolLM2-135M".into(),
                revision: Some("main".into())
            }
        );
        for short in [
            "Mixtral-8x7B-v0.1",
            "Qwen3-30B-A3B",
            "Qwen1.5-MoE-A2.7B",
            "Llama-3.2-1B",
        ] {
            assert!(
                matches!(resolve_spec(short), Ok(ModelSource::Hub { .. })),
                "{short}"
            );
        }
    }

    #[test]
    fn unknown_short_name_lists_close_matches() {
        let msg = resolve_spec("SmolLM2-1.7").unwrap_err().to_string();
        assert!(msg.contains("did you mean SmolLM2-1.7B"), "{msg}");
        let msg = resolve_spec("Qwen3-0.5B").unwrap_err().to_string();
        assert!(msg.contains("Qwen3-0.6B"), "{msg}");
        let msg = resolve_spec("zzzzzzzzzzzzzzzzzzzz")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("known short names") && msg.contains("SmolLM2-135M"),
            "{msg}"
        );
    }

    #[test]
    fn load_model_builds_the_same_model_from_folder_gguf_and_cache() {
        let cache = fake_cache();
        let settings = offline(cache.path());
        let folder = fixture_dir("tiny-llama");
        let from_folder = load_model_with(folder.to_str().unwrap(), &settings).unwrap();
        let gguf = folder.join("model.gguf");
        let from_gguf = load_model_with(gguf.to_str().unwrap(), &settings).unwrap();
        let from_hub = load_model_with("kwk-test/tiny-llama", &settings).unwrap();
        for m in [&from_folder, &from_gguf, &from_hub] {
            assert_eq!(m.tokenizer.vocab_size(), 512);
            assert_eq!(m.n_params(), from_folder.n_params());
            let ids = m.tokenizer.encode("Hello world", false).unwrap();
            assert_eq!(
                ids,
                from_folder.tokenizer.encode("Hello world", false).unwrap()
            );
        }
        crate::model::gguf_loader::tests::assert_weights_close(
            &from_gguf.weights,
            &from_folder.weights,
        );
        assert_eq!(from_hub.weights.embed, from_folder.weights.embed);
        assert_eq!(from_hub.info.requested, "kwk-test/tiny-llama");
        assert!(from_hub.info.resolved_path.ends_with(SHA));
        assert_eq!(from_gguf.info.resolved_path, gguf);
        assert_eq!(from_folder.info.source_types.get("F32"), Some(&20));
        assert!(from_folder.info.source_bytes > 0);
    }

    #[test]
    fn smollm2_gguf_loads_as_a_model() {
        let dir = crate::format::ggml_blocks::tests::smollm2_dir();
        let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
        let m = load_model(path.to_str().unwrap()).unwrap();
        // llama.cpp's "model params" for this file.
        assert_eq!(m.n_params(), 134_515_008);
        assert_eq!(m.tokenizer.vocab_size(), 49152);
        assert_eq!(m.info.source_types.get("Q8_0"), Some(&1));
        assert_eq!(
            m.info.source_bytes,
            crate::gguf::GgufFile::open(&path)
                .unwrap()
                .summary()
                .tensor_bytes
        );
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn hub_files_wanted() {
        let sib: Vec<String> = [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "onnx/model.safetensors",
            "tokenizer.json",
            "README.md",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            wanted_files(&sib),
            vec![
                "config.json",
                "model.safetensors.index.json",
                "tokenizer.json"
            ]
        );
        let mistral: Vec<String> = [
            "config.json",
            "consolidated.safetensors",
            "model.safetensors",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            wanted_files(&mistral),
            vec!["config.json", "model.safetensors"]
        );
        let shards: Vec<String> = [
            "config.json",
            "b.safetensors",
            "a.safetensors",
            "consolidated.safetensors",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            wanted_files(&shards),
            vec!["config.json", "a.safetensors", "b.safetensors"]
        );
    }

    #[test]
    fn settings_parse_truthy_offline_values() {
        for v in ["1", "true", "YES", "on"] {
            assert!(env_is_true(v));
        }
        for v in ["0", "false", "", "no"] {
            assert!(!env_is_true(v));
        }
    }
}
