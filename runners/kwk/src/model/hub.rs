//! Hub ids through the standard Hugging Face cache layout
//! (`<cache>/models--ORG--NAME/{refs/REV, snapshots/SHA/...}`, shared with Python's
//! `huggingface_hub`): [`HubSettings`] from the environment, [`cached_snapshot`] (a cached
//! model loads with no network), and [`resolve_hub`], which downloads what is missing with
//! the `hf-hub` crate unless offline.

use super::safetensors_loader::{index_shards, unindexed_weight_files};
use crate::error::{KwkError, Result};
use std::path::{Path, PathBuf};

/// How hub ids are resolved: cache folder, endpoint, token, offline switch.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// The hub cache (the folder holding `models--ORG--NAME`).
    pub cache_dir: PathBuf,
    pub endpoint: String,
    pub token: Option<String>,
    pub offline: bool,
}

/// `huggingface_hub`'s truthy environment values.
pub(super) fn env_is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

impl HubSettings {
    /// From `HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE`, with
    /// `huggingface_hub`'s defaults.
    pub fn from_env() -> HubSettings {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let hf_home = var("HF_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/huggingface")));
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let token = var("HF_TOKEN").or_else(|| {
            let file = hf_home.as_ref()?.join("token");
            let t = std::fs::read_to_string(file).ok()?;
            Some(t.trim().to_string()).filter(|t| !t.is_empty())
        });
        HubSettings {
            cache_dir,
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            token,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| env_is_true(&v)),
        }
    }
}

/// A cache folder name: `models--ORG--NAME` (huggingface_hub's `repo_folder_name`).
fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// Whether a snapshot holds a loadable model: config.json, tokenizer.json and all the
/// safetensors its index names (or `model.safetensors`).
fn snapshot_complete(dir: &Path) -> bool {
    if !dir.join("config.json").is_file() || !dir.join("tokenizer.json").is_file() {
        return false;
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        return index_shards(&index).is_ok_and(|files| files.iter().all(|f| dir.join(f).is_file()));
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    !unindexed_weight_files(&names).is_empty()
}

/// The cached snapshot folder of `repo` at `revision` (a branch or tag through
/// `refs/<revision>`, or a commit hash), if it holds a complete model.
pub fn cached_snapshot(cache_dir: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    // A revision names a ref file inside the cache (it may contain '/', as in refs/pr/1),
    // never a path outside it.
    if revision.is_empty() || revision.starts_with('/') || revision.split('/').any(|p| p == "..") {
        return None;
    }
    let root = cache_dir.join(repo_folder(repo));
    let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
    let commit = if is_commit {
        revision.to_string()
    } else {
        std::fs::read_to_string(root.join("refs").join(revision))
            .ok()?
            .trim()
            .to_string()
    };
    if commit.is_empty() || commit.contains(['/', '\\']) || commit.starts_with('.') {
        return None;
    }
    let snapshot = root.join("snapshots").join(commit);
    snapshot_complete(&snapshot).then_some(snapshot)
}

/// The files of a hub repository kwk needs besides the weights.
const METADATA_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "model.safetensors.index.json",
];

/// The metadata files present in `siblings`, then (without an index) the weight files.
pub(super) fn wanted_files(siblings: &[String]) -> Vec<String> {
    let mut want: Vec<String> = siblings
        .iter()
        .filter(|f| METADATA_FILES.contains(&f.as_str()))
        .cloned()
        .collect();
    want.sort();
    if !want.iter().any(|f| f == "model.safetensors.index.json") {
        let top: Vec<String> = siblings
            .iter()
            .filter(|f| !f.contains('/'))
            .cloned()
            .collect();
        want.extend(unindexed_weight_files(&top));
    }
    want
}

/// The local snapshot folder of a hub model: from the cache when complete, else downloaded
/// (unless offline).
pub fn resolve_hub(repo: &str, revision: Option<&str>, settings: &HubSettings) -> Result<PathBuf> {
    let rev = revision.unwrap_or("main");
    if let Some(dir) = cached_snapshot(&settings.cache_dir, repo, rev) {
        return Ok(dir);
    }
    let what = format!("{repo}@{rev}");
    if settings.offline {
        return Err(KwkError::NotFound(format!(
            "{what} is not in the Hugging Face cache '{}' and HF_HUB_OFFLINE is set; \
             download it once with network access (or point HF_HUB_CACHE/HF_HOME at a cache \
             that has it)",
            settings.cache_dir.display()
        )));
    }
    download_hub(repo, rev, settings).map_err(|e| match e {
        KwkError::NotFound(_) | KwkError::BadModel { .. } => e,
        other => KwkError::NotFound(format!(
            "{what} is not in the Hugging Face cache '{}' and could not be downloaded from {}: \
             {other}. Check the network (or HF_ENDPOINT), HF_TOKEN for gated models, or set \
             HF_HUB_OFFLINE=1 with a cached copy",
            settings.cache_dir.display(),
            settings.endpoint
        )),
    })
}

fn download_hub(repo: &str, rev: &str, settings: &HubSettings) -> Result<PathBuf> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};
    use std::io::IsTerminal;
    let api = ApiBuilder::from_cache(Cache::new(settings.cache_dir.clone()))
        .with_endpoint(settings.endpoint.clone())
        .with_token(settings.token.clone())
        .with_progress(std::io::stderr().is_terminal())
        .build()
        .map_err(|e| KwkError::InvalidArgument(format!("hub client: {e}")))?;
    let api_repo = api.repo(Repo::with_revision(
        repo.to_string(),
        RepoType::Model,
        rev.to_string(),
    ));
    let info = api_repo
        .info()
        .map_err(|e| KwkError::InvalidArgument(e.to_string()))?;
    let siblings: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let mut files = wanted_files(&siblings);
    let has_index = files.iter().any(|f| f == "model.safetensors.index.json");
    if !(has_index || files.iter().any(|f| f.ends_with(".safetensors")))
        || !files.iter().any(|f| f == "config.json")
    {
        return Err(KwkError::NotFound(format!(
            "hub repository {repo}@{rev} has no config.json and *.safetensors weights (it has \
             {} files); for a GGUF-only repository download the .gguf file and pass its path",
            siblings.len()
        )));
    }
    let fetch = |f: &str| {
        api_repo
            .get(f)
            .map_err(|e| KwkError::InvalidArgument(format!("downloading {f}: {e}")))
    };
    if has_index {
        // The shards to fetch are those the index names (not e.g. consolidated.safetensors).
        let index = fetch("model.safetensors.index.json")?;
        files.extend(index_shards(&index)?);
    }
    let mut config_path = None;
    for f in &files {
        let p = fetch(f)?;
        if f == "config.json" {
            config_path = Some(p);
        }
    }
    let dir = config_path
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| KwkError::NotFound(format!("{repo}@{rev}: config.json not downloaded")))?;
    Ok(dir)
}
