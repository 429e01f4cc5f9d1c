//! The sweep file (TOML): what a sweep runs, read and checked into a [`Sweep`] before any
//! cell is planned. Every field and its default is documented in docs/sweeps.md. Paths
//! (models, texts, `gguf:PATH` formats, `calib_text`) are relative to the file's folder;
//! a model that is no path there (a hub id, a short name) is passed on as written. Each
//! bad field is one error naming the file, the field and the fix.

use crate::protocol::{parse_format, FormatSpec};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The file as written (every field of docs/sweeps.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    models: Vec<String>,
    texts: Vec<String>,
    formats: Vec<String>,
    #[serde(default = "default_threads")]
    threads: Vec<usize>,
    #[serde(default = "default_depths")]
    depths: Vec<usize>,
    #[serde(default = "default_ctx")]
    ctx: usize,
    #[serde(default = "default_chunks")]
    chunks: usize,
    #[serde(default = "default_reps")]
    reps: usize,
    pp: Option<usize>,
    tg: Option<usize>,
    #[serde(default = "yes")]
    speed: bool,
    #[serde(default = "yes")]
    reference: bool,
    calib_text: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    kwk_eval: Option<String>,
    #[serde(default)]
    slurm: SlurmOptions,
}

fn default_threads() -> Vec<usize> {
    vec![crate::machine::available_threads()]
}
fn default_depths() -> Vec<usize> {
    vec![0]
}
fn default_ctx() -> usize {
    512
}
fn default_chunks() -> usize {
    20
}
fn default_reps() -> usize {
    crate::plan::DEFAULT_REPS
}
fn yes() -> bool {
    true
}

/// The `[slurm]` table: sbatch options of every job the sweep submits.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--time` of one cell (and of each shared job), e.g. `00:30:00`.
    pub time: Option<String>,
    /// `--mem` of one job, e.g. `4G`.
    pub mem: Option<String>,
    /// `--cpus-per-task` (default: the largest thread count of the sweep).
    pub cpus_per_task: Option<usize>,
    /// `--qos`.
    pub qos: Option<String>,
    /// At most this many cells at once (`--array=...%N`).
    pub max_parallel: Option<usize>,
    /// More sbatch options, each as sbatch takes it (`--constraint=zen4`).
    #[serde(default)]
    pub extra: Vec<String>,
}

/// One format of the sweep: what its cells run.
#[derive(Debug, Clone, PartialEq)]
pub enum SweepFormat {
    /// An in-tree format (`int8`, `int4:gptq`, `bpw:4.5`).
    Kwk(String),
    /// A type of llama.cpp's ladder made from the model (`Q4_K_M`, `Q3_K_M+imatrix`).
    Ladder(String),
    /// A GGUF file run by llama.cpp.
    Gguf(PathBuf),
}

impl SweepFormat {
    /// The name in cell names and the plan (`int8`, `Q4_K_M`, `gguf:model.gguf`).
    pub fn label(&self) -> String {
        match self {
            SweepFormat::Kwk(n) | SweepFormat::Ladder(n) => n.clone(),
            SweepFormat::Gguf(p) => format!(
                "gguf:{}",
                p.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            ),
        }
    }
}

/// A checked sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// The file it was read from, and its bytes (a sweep folder keeps a copy).
    pub path: PathBuf,
    pub source: String,
    pub models: Vec<String>,
    pub texts: Vec<PathBuf>,
    pub formats: Vec<SweepFormat>,
    pub threads: Vec<usize>,
    pub depths: Vec<usize>,
    pub ctx: usize,
    pub chunks: usize,
    pub reps: usize,
    pub pp: Option<usize>,
    pub tg: Option<usize>,
    pub speed: bool,
    /// Each cell also runs kwk's float32 (KLD and ΔPPL against it; its perplexity must
    /// agree across the cells at merge).
    pub reference: bool,
    pub calib_text: Option<PathBuf>,
    /// More kwk-eval flags for every cell, as given.
    pub args: Vec<String>,
    /// The kwk-eval the cells run (default: this one).
    pub kwk_eval: Option<PathBuf>,
    pub slurm: SlurmOptions,
}

/// A llama.cpp type name as llama-quantize lists them (`Q4_K_M`, `IQ4_XS`, `F16`,
/// `TQ1_0`), optionally `+imatrix`.
fn is_llama_type(s: &str) -> bool {
    let base = s.strip_suffix(crate::ladder::IMATRIX_SUFFIX).unwrap_or(s);
    !base.is_empty()
        && base.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && base
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// `p` against the sweep file's folder, when relative.
fn beside(dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// Reads and checks the sweep file at `path`.
pub fn read(path: &Path) -> Result<Sweep> {
    let source = std::fs::read_to_string(path)
        .with_context(|| format!("reading sweep file '{}'", path.display()))?;
    parse(path, &source)
}

/// Checks the sweep file `source` (read from `path`, against whose folder paths resolve).
pub fn parse(path: &Path, source: &str) -> Result<Sweep> {
    let what = format!("sweep file '{}'", path.display());
    let raw: Raw = toml::from_str(source).map_err(|e| {
        let msg = e.message().to_string();
        let at = e
            .span()
            .map(|s| format!(" (line {})", source[..s.start].lines().count().max(1)))
            .unwrap_or_default();
        anyhow::anyhow!("{what}: {msg}{at}; see docs/sweeps.md for its fields")
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    for (field, empty) in [
        ("models", raw.models.is_empty()),
        ("texts", raw.texts.is_empty()),
        ("formats", raw.formats.is_empty()),
        ("threads", raw.threads.is_empty()),
        ("depths", raw.depths.is_empty()),
    ] {
        if empty {
            bail!("{what}: `{field}` is empty; list at least one");
        }
    }
    let models: Vec<String> = raw
        .models
        .iter()
        .map(|m| {
            let p = beside(&dir, m);
            if p.exists() {
                p.display().to_string()
            } else {
                m.clone()
            }
        })
        .collect();
    let mut texts = Vec::new();
    for t in &raw.texts {
        let p = beside(&dir, t);
        if !p.is_file() {
            bail!("{what}: text '{t}' is not a file (looked at '{}'); texts are paths relative to the sweep file", p.display());
        }
        texts.push(p);
    }
    let mut formats = Vec::new();
    for f in &raw.formats {
        let format = if let Some(p) = f.strip_prefix("gguf:") {
            SweepFormat::Gguf(beside(&dir, p))
        } else if f == "ladder" {
            for t in crate::ladder::DEFAULT_LADDER {
                formats.push(SweepFormat::Ladder((*t).to_string()));
            }
            continue;
        } else {
            match parse_format(f) {
                Ok(FormatSpec::Kwk { name, .. }) => SweepFormat::Kwk(name),
                _ if is_llama_type(f) => SweepFormat::Ladder(f.clone()),
                // A kwk format with a bad `+kv:` suffix: its own message names the fix.
                Err(e) if f.to_ascii_lowercase().contains(crate::protocol::KV_SUFFIX) => {
                    bail!("{what}: format {e}")
                }
                Ok(_) | Err(_) => bail!(
                    "{what}: format '{f}' is neither a kwk format (float32, bf16, int8, int4, int3..int6, bpw:X, with options) nor a llama.cpp type (Q8_0, Q4_K_M, ... or TYPE+imatrix), `ladder`, nor gguf:PATH"
                ),
            }
        };
        if formats.contains(&format) {
            bail!("{what}: format '{f}' is listed twice; list each once");
        }
        formats.push(format);
    }
    let max_threads = 4 * crate::machine::available_threads().max(1);
    for &t in &raw.threads {
        if t == 0 || t > 4096 {
            bail!("{what}: threads {t} is out of range; use 1 to 4096 (this machine has {} cores; the cell checks against its own)", max_threads / 4);
        }
    }
    if let Some(&d) = raw.depths.iter().find(|&&d| d > 1 << 20) {
        bail!("{what}: depth {d} is out of range; use 0 to 1048576 (each cell checks it against its model's context)");
    }
    if let Some(d) = crate::protocol::points::repeated(&raw.depths) {
        bail!("{what}: depth {d} is listed twice; list each depth once");
    }
    if !raw.depths.is_empty() && !raw.speed && raw.depths != [0] {
        bail!("{what}: depths other than 0 need the speed test; drop `speed = false` or use depths = [0]");
    }
    if raw.ctx < 8 || !raw.ctx.is_multiple_of(2) || raw.ctx > 1 << 20 {
        bail!("{what}: ctx {} must be even and 8 to 1048576", raw.ctx);
    }
    if raw.chunks == 0 || raw.chunks > 1 << 20 {
        bail!("{what}: chunks {} must be 1 to 1048576", raw.chunks);
    }
    if raw.reps == 0 || raw.reps > 1000 {
        bail!("{what}: reps {} must be 1 to 1000", raw.reps);
    }
    if let Some(o) = raw.args.iter().find(|a| {
        let flag = a.split('=').next().unwrap_or(a);
        [
            "--llm",
            "--text",
            "--formats",
            "--threads",
            "--out",
            "--ctx",
            "--chunks",
            "--reps",
            "--pp",
            "--tg",
            "--depth",
            "--ladder",
            "--gguf",
            "--no-speed",
        ]
        .contains(&flag)
    }) {
        bail!("{what}: args holds '{o}', which the sweep sets per cell; use the sweep's own field for it");
    }
    if raw.slurm.cpus_per_task == Some(0) || raw.slurm.max_parallel == Some(0) {
        bail!("{what}: [slurm] cpus_per_task and max_parallel must be at least 1");
    }
    Ok(Sweep {
        path: path.to_path_buf(),
        source: source.to_string(),
        models,
        texts,
        formats,
        threads: raw.threads,
        depths: raw.depths,
        ctx: raw.ctx,
        chunks: raw.chunks,
        reps: raw.reps,
        pp: raw.pp,
        tg: raw.tg,
        speed: raw.speed,
        reference: raw.reference,
        calib_text: raw.calib_text.map(|c| beside(&dir, &c)),
        args: raw.args,
        kwk_eval: raw.kwk_eval.map(|k| beside(&dir, &k)),
        slurm: raw.slurm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(body: &str) -> Result<Sweep> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wiki.test.raw"), "text").unwrap();
        let p = dir.path().join("s.toml");
        parse(&p, body)
    }

    #[test]
    fn the_small_file_of_the_issue_reads_with_defaults() {
        let s = sweep(
            "models = [\"m.gguf\"]\ntexts = [\"wiki.test.raw\"]\nformats = [\"int8\", \"int4\", \"Q4_K_M\", \"Q3_K_M+imatrix\"]\nthreads = [1, 2]\nchunks = 2\n",
        )
        .unwrap();
        assert_eq!(s.models, ["m.gguf"]);
        assert_eq!(
            s.formats,
            [
                SweepFormat::Kwk("int8".into()),
                SweepFormat::Kwk("int4".into()),
                SweepFormat::Ladder("Q4_K_M".into()),
                SweepFormat::Ladder("Q3_K_M+imatrix".into())
            ]
        );
        assert_eq!(
            (s.ctx, s.chunks, s.reps, s.depths.clone()),
            (512, 2, 3, vec![0])
        );
        assert!(s.reference && s.speed);
        assert_eq!(s.slurm, SlurmOptions::default());
    }

    #[test]
    fn bad_fields_are_one_line_naming_the_fix() {
        let base = "models = [\"m\"]\ntexts = [\"wiki.test.raw\"]\n";
        let e = |extra: &str| format!("{:#}", sweep(&format!("{base}{extra}")).unwrap_err());
        assert!(e("formats = [\"int7\"]").contains("format 'int7' is neither"));
        assert!(
            e("formats = [\"int8\"]\ndepths = [0, 4096, 0]").contains("depth 0 is listed twice")
        );
        assert!(e("formats = [\"int8\"]\ndepths = [2000000]").contains("depth 2000000"));
        assert!(e("formats = [\"int8\"]\nthreads = [0]").contains("threads 0"));
        assert!(e("formats = [\"int8\"]\nctx = 7").contains("ctx 7"));
        assert!(e("formats = [\"int8\", \"int8\"]").contains("listed twice"));
        assert!(e("formats = []").contains("`formats` is empty"));
        assert!(e("formats = [\"int8\"]\nchunk = 2").contains("unknown field `chunk`"));
        assert!(e("formats = [\"int8\"]\nargs = [\"--threads=3\"]").contains("sets per cell"));
        assert!(e("formats = [\"int8\"]\n[slurm]\npartitoin = \"x\"").contains("partitoin"));
        let missing = format!(
            "{:#}",
            sweep("models = [\"m\"]\ntexts = [\"nope.txt\"]\nformats = [\"int8\"]").unwrap_err()
        );
        assert!(
            missing.contains("text 'nope.txt' is not a file"),
            "{missing}"
        );
    }

    #[test]
    fn ladder_expands_and_slurm_options_read() {
        let s = sweep(
            "models = [\"m\"]\ntexts = [\"wiki.test.raw\"]\nformats = [\"float32\", \"ladder\"]\n[slurm]\npartition = \"cpu\"\naccount = \"lab\"\ntime = \"00:10:00\"\nextra = [\"--constraint=zen4\"]\n",
        )
        .unwrap();
        assert_eq!(s.formats.len(), 1 + crate::ladder::DEFAULT_LADDER.len());
        assert_eq!(s.slurm.partition.as_deref(), Some("cpu"));
        assert_eq!(s.slurm.extra, ["--constraint=zen4"]);
    }
}
