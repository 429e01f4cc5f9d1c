//! `kwk-eval cache list | prune | clear`: the pack cache folder (`kwk::pack_cache`): one
//! file per model, its formats, size and last use; and the GGUFs the ladder made
//! (`crate::ladder::cache`, `ROOT/gguf` beside the pack cache's `ROOT/pack`). Pruning sweeps
//! temporary and orphaned files and applies the size limit (`KWK_PACK_CACHE_GB`, default
//! 16) to both together: the made GGUFs first (least recently used out), then the packs get
//! what is left; clearing deletes every cache file kwk wrote in both.

use crate::ui::{print_stdout, Reporter};
use anyhow::{Context, Result};
use kwk::pack_cache;
use std::path::PathBuf;

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

/// The ladder's GGUF folder beside a pack cache folder (`ROOT/pack` → `ROOT/gguf`).
pub fn gguf_dir(pack_dir: &std::path::Path) -> PathBuf {
    pack_dir
        .parent()
        .map_or_else(|| PathBuf::from("gguf"), |p| p.join("gguf"))
}

/// Lists, prunes or clears the ladder's GGUF folder.
fn run_gguf(cfg: &CacheConfig, limit: u64, ui: &dyn Reporter) -> Result<u64> {
    let dir = gguf_dir(&cfg.dir);
    match &cfg.action {
        CacheAction::List => {
            let entries = crate::ladder::cache::list(&dir)
                .with_context(|| format!("listing '{}'", dir.display()))?;
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            print_stdout(
                ui,
                &format!(
                    "made GGUFs {}: {} files, {} (counted in the limit)\n",
                    dir.display(),
                    entries.len(),
                    gb(total)
                ),
            )?;
            for e in entries {
                let what = e.record.as_ref().map_or_else(
                    || "(no record; `cache prune` removes it)".to_string(),
                    |r| {
                        let from = r
                            .inputs
                            .iter()
                            .find(|(k, _)| k == "source" || k == "base")
                            .map_or(String::new(), |(_, v)| format!(" from {v}"));
                        format!("{} {}{from}", r.kind, r.what)
                    },
                );
                print_stdout(
                    ui,
                    &format!(
                        "{}  {}  last used {}\n  {what}\n",
                        e.path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                        gb(e.bytes),
                        age(e.last_use_unix)
                    ),
                )?;
            }
            Ok(total)
        }
        CacheAction::Prune { .. } => {
            let r = crate::ladder::cache::prune(&dir, limit, &[])
                .with_context(|| format!("pruning '{}'", dir.display()))?;
            print_stdout(
                ui,
                &format!(
                    "made GGUFs {}: removed {} temporary, {} incomplete or least recently used; {} left\n",
                    dir.display(),
                    r.temporary,
                    r.evicted.len(),
                    gb(r.bytes_left)
                ),
            )?;
            Ok(r.bytes_left)
        }
        CacheAction::Clear => {
            let n = crate::ladder::cache::clear(&dir)
                .with_context(|| format!("clearing '{}'", dir.display()))?;
            print_stdout(
                ui,
                &format!("made GGUFs {}: deleted {n} files\n", dir.display()),
            )?;
            Ok(0)
        }
    }
}

/// Runs the action and prints its result on stdout.
pub fn run(cfg: &CacheConfig, ui: &dyn Reporter) -> Result<()> {
    let dir = &cfg.dir;
    let limit_all = match &cfg.action {
        CacheAction::Prune { limit_gb: Some(g) } => {
            anyhow::ensure!(
                g.is_finite() && *g >= 0.0,
                "--limit-gb {g}: pass a size in GB of at least 0"
            );
            (g * 1e9) as u64
        }
        _ => pack_cache::limit_bytes(),
    };
    let gguf_bytes = run_gguf(cfg, limit_all, ui)?;
    match &cfg.action {
        CacheAction::List => {
            let entries = pack_cache::list(dir)
                .with_context(|| format!("listing the pack cache '{}'", dir.display()))?;
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            print_stdout(
                ui,
                &format!(
                    "pack cache {}: {} files, {} (limit {})\n",
                    dir.display(),
                    entries.len(),
                    gb(total),
                    gb(pack_cache::limit_bytes())
                ),
            )?;
            for e in entries {
                print_stdout(
                    ui,
                    &format!(
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
                    ),
                )?;
            }
        }
        CacheAction::Prune { .. } => {
            // The packs get what the made GGUFs leave of the limit.
            let limit = limit_all.saturating_sub(gguf_bytes);
            let r = pack_cache::prune(dir, limit, None)
                .with_context(|| format!("pruning the pack cache '{}'", dir.display()))?;
            print_stdout(ui, &format!(
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
            print_stdout(
                ui,
                &format!("pack cache {}: deleted {n} files\n", dir.display()),
            )?;
        }
    }
    Ok(())
}
