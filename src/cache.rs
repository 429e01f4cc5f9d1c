//! `kwk-eval cache list | prune | clear`: the pack cache folder (`kwk::pack_cache`): one
//! file per model, its formats, size and last use; pruning sweeps temporary and orphaned
//! files and applies the size limit (`KWK_PACK_CACHE_GB`, default 16); clearing deletes
//! every cache file kwk wrote.

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

/// Runs the action and prints its result on stdout.
pub fn run(cfg: &CacheConfig, ui: &dyn Reporter) -> Result<()> {
    let dir = &cfg.dir;
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
