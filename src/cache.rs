//! `kwk-eval cache list | prune | clear`: the pack cache folder (`kwk::pack_cache`): one
//! file per model, its formats, size and last use; pruning sweeps temporary and orphaned
//! files and applies the size limit (`KWK_PACK_CACHE_GB`, default 16); clearing deletes
//! every cache file kwk wrote. Also the warnings a run prints about the pack cache
//! ([`outcome_warning`], [`warn_once`]): the library returns them, the binary prints them.

use crate::session::print_stdout;
use anyhow::{Context, Result};
use kwk::pack_cache::{self, PackOutcome};
use std::path::{Path, PathBuf};

/// Prints `line` on stderr unless this process printed the same line already (a cache
/// folder that cannot be used is one warning, not one per row).
pub fn warn_once(line: String) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&line) {
        eprintln!("{line}");
        seen.push(line);
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// The warning line for what the pack cache in `dir` did when `format` was built: a pack
/// over the whole limit (used, not kept) or a folder that could not be used; `None` when
/// the cache worked.
pub fn outcome_warning(dir: &Path, format: &str, outcome: &PackOutcome) -> Option<String> {
    match outcome {
        PackOutcome::NotKept { bytes, limit, .. } => Some(format!(
            "warning: pack cache {}: the {format} pack ({}) is larger than the whole cache \
             limit ({}, KWK_PACK_CACHE_GB): used for this run, not kept",
            dir.display(),
            mb(*bytes),
            mb(*limit)
        )),
        PackOutcome::NotWritten(why) => {
            let shown = dir.display().to_string();
            let why = why.strip_prefix(&format!("{shown}: ")).unwrap_or(why);
            Some(format!(
                "warning: pack cache {shown} cannot be used ({why}); packing without it \
                 (pass --pack-cache DIR naming a writable folder, or --no-pack-cache)"
            ))
        }
        PackOutcome::NoCache
        | PackOutcome::Loaded(_)
        | PackOutcome::Written(_)
        | PackOutcome::Updated { .. } => None,
    }
}

/// What `kwk-eval cache` does.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheAction {
    List,
    /// Sweep, then evict least recently used files down to `limit_gb` (default: the
    /// `KWK_PACK_CACHE_GB` limit).
    Prune {
        limit_gb: Option<f64>,
    },
    Clear,
}

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub action: CacheAction,
    pub dir: PathBuf,
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

fn age(unix: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let s = now.saturating_sub(unix);
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        7200..=172_799 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

/// Runs the action and prints its result on stdout.
pub fn run(cfg: &CacheConfig) -> Result<()> {
    let dir = &cfg.dir;
    match &cfg.action {
        CacheAction::List => {
            let entries = pack_cache::list(dir)
                .with_context(|| format!("listing the pack cache '{}'", dir.display()))?;
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            print_stdout(&format!(
                "pack cache {}: {} files, {} (limit {})\n",
                dir.display(),
                entries.len(),
                gb(total),
                gb(pack_cache::limit_bytes())
            ))?;
            for e in entries {
                print_stdout(&format!(
                    "{}  {}  last used {}\n  model: {}\n  formats: {}\n",
                    e.path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    gb(e.bytes),
                    age(e.last_use_unix),
                    e.model
                        .as_deref()
                        .unwrap_or("(unreadable or older layout; `cache prune` removes it)"),
                    if e.formats.is_empty() {
                        "-".to_string()
                    } else {
                        e.formats.join(" | ")
                    }
                ))?;
            }
        }
        CacheAction::Prune { limit_gb } => {
            let limit = match limit_gb {
                Some(g) => {
                    anyhow::ensure!(
                        g.is_finite() && *g >= 0.0,
                        "--limit-gb {g}: pass a size in GB of at least 0"
                    );
                    (g * 1e9) as u64
                }
                None => pack_cache::limit_bytes(),
            };
            let r = pack_cache::prune(dir, limit, None)
                .with_context(|| format!("pruning the pack cache '{}'", dir.display()))?;
            print_stdout(&format!(
                "pack cache {}: removed {} temporary, {} orphaned, {} least recently used; {} left (limit {})\n",
                dir.display(),
                r.temporary.len(),
                r.orphaned.len(),
                r.evicted.len(),
                gb(r.bytes_left),
                gb(limit)
            ))?;
        }
        CacheAction::Clear => {
            let n = pack_cache::clear(dir)
                .with_context(|| format!("clearing the pack cache '{}'", dir.display()))?;
            print_stdout(&format!(
                "pack cache {}: deleted {n} files\n",
                dir.display()
            ))?;
        }
    }
    Ok(())
}
