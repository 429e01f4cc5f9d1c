//! Which pack cache folder a command uses (`--pack-cache`, the default under `$KWK_CACHE`,
//! or none), and the warnings about what the pack cache (`kwk::pack_cache`) did when a row
//! was built, handed to the [`Reporter`]. Below every command that packs (`plan`,
//! `generate`, `measure`) and `cache`, which manages the folder.

use crate::ui::Reporter;
use kwk::pack_cache::PackOutcome;
use std::path::{Path, PathBuf};

/// `ROOT/pack`, ROOT being `$KWK_CACHE`, else `${XDG_CACHE_HOME:-$HOME/.cache}/kwk`
/// (`kwk::paths`, docs/paths.md); `None` when none of them is set.
pub fn default_pack_cache() -> Option<PathBuf> {
    kwk::paths::pack_cache_dir(&kwk::paths::CacheEnv::from_env())
}

/// Why there is no default pack cache folder.
pub const NO_PACK_CACHE_FOLDER: &str = "no folder (none of KWK_CACHE, XDG_CACHE_HOME, HOME is set)";

/// The pack cache folder a run uses: `--pack-cache`, the default, or none (with one
/// warning when no default can be named).
pub fn pack_cache(dir: Option<PathBuf>, disabled: bool, ui: &dyn Reporter) -> Option<PathBuf> {
    if disabled {
        return None;
    }
    let dir = dir.or_else(default_pack_cache);
    if dir.is_none() {
        ui.warn_once(&format!(
            "pack cache: {NO_PACK_CACHE_FOLDER}; packing without it (pass --pack-cache DIR)"
        ));
    }
    dir
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// The warning (without its `warning: `) for what the pack cache in `dir` did when
/// `format` was built: a pack over the whole limit (used, not kept) or a folder that could
/// not be used; `None` when the cache worked.
pub fn outcome_warning(dir: &Path, format: &str, outcome: &PackOutcome) -> Option<String> {
    match outcome {
        PackOutcome::NotKept { bytes, limit, .. } => Some(format!(
            "pack cache {}: the {format} pack ({}) is larger than the whole cache \
             limit ({}, KWK_PACK_CACHE_GB): used for this run, not kept",
            dir.display(),
            mb(*bytes),
            mb(*limit)
        )),
        PackOutcome::NotWritten(why) => {
            let shown = dir.display().to_string();
            let why = why.strip_prefix(&format!("{shown}: ")).unwrap_or(why);
            Some(format!(
                "pack cache {shown} cannot be used ({why}); packing without it \
                 (pass --pack-cache DIR naming a writable folder, or --no-pack-cache)"
            ))
        }
        PackOutcome::NoCache
        | PackOutcome::Loaded(_)
        | PackOutcome::Written(_)
        | PackOutcome::Updated { .. } => None,
    }
}
