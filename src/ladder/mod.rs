//! The llama.cpp ladder: llama.cpp's side of the comparison made from the user's own model.
//! `--ladder` (or `--llama-bench` without `--gguf`) converts `--llm` to an F32 GGUF, with
//! llama.cpp's `convert_hf_to_gguf.py` for a Hugging Face folder or hub id, or
//! `llama-quantize --allow-requantize` for a GGUF source (whose weights are already
//! rounded, which the report says), and quantizes it to each type of the ladder
//! ([`DEFAULT_LADDER`] unless `--ladder LIST`). With `--calib-text`, llama-imatrix runs on
//! the same text kwk calibrates on (the first [`kwk::decoder::CALIBRATION_TOKENS`] tokens in
//! windows of [`kwk::decoder::CALIBRATION_WINDOW`]) and the default ladder is made with it
//! (rows `+imatrix`). Every made file is cached ([`cache`]) under a key of the source's
//! content, the tools' files, the type and the importance matrix, so a second run reuses it.
//!
//! Two steps: [`plan`] (before anything is loaded: the types checked against the
//! llama-quantize that will run them, the converter found) and [`make`] (after the plan: the
//! files made or found, each a GGUF row of the run named `gguf:TYPE` or `gguf:TYPE+imatrix`,
//! with how it was made in [`MadeGguf`]; a type that needs an importance matrix the run has
//! no text for is a note of the reports, and one llama-quantize fails on a failed row).

pub mod cache;

use crate::protocol::made::{FallbackGroup, MadeGguf};
use crate::protocol::results::RunnerRecord;
use crate::protocol::{Engine, FormatSpec};
use crate::text::EvalText;
use crate::ui::Reporter;
use anyhow::{anyhow, bail, ensure, Context, Result};
use cache::{GgufCache, Record};
use llamacpp::LlamaCppTools;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The ladder made when none is named: llama.cpp's common sizes from 8.5 down to about
/// 2.6 bits per weight (on rows that are multiples of 256).
pub const DEFAULT_LADDER: &[&str] = &[
    "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS", "Q3_K_M", "IQ3_XXS", "Q2_K",
];

/// The suffix of a rung made with the importance matrix.
pub const IMATRIX_SUFFIX: &str = "+imatrix";

/// `--ladder` as given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LadderChoice {
    /// Not given: the default ladder when `--llama-bench` is given without `--gguf`.
    #[default]
    Auto,
    /// `--ladder none`.
    Off,
    /// `--ladder default`.
    Default,
    /// `--ladder Q4_K_M,Q3_K_M+imatrix,...`.
    Types(Vec<String>),
}

impl LadderChoice {
    /// Parses `--ladder`: `none`, `default`, or comma-separated llama.cpp types, each
    /// optionally `+imatrix`.
    pub fn parse(s: &str) -> std::result::Result<LadderChoice, String> {
        match s.trim() {
            "none" => Ok(LadderChoice::Off),
            "default" => Ok(LadderChoice::Default),
            "" => Err("an empty --ladder; pass none, default or types like Q4_K_M,Q3_K_M".into()),
            list => {
                let types: Vec<String> = list.split(',').map(|t| t.trim().to_string()).collect();
                if types.iter().any(String::is_empty) {
                    return Err(format!(
                        "--ladder '{list}' has an empty type; pass types like Q4_K_M,Q3_K_M"
                    ));
                }
                Ok(LadderChoice::Types(types))
            }
        }
    }
}

/// One type of the ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rung {
    /// The type as llama-quantize lists it.
    pub qtype: String,
    pub imatrix: bool,
}

impl Rung {
    /// The row's label: `Q4_K_M` or `Q4_K_M+imatrix`.
    pub fn label(&self) -> String {
        if self.imatrix {
            format!("{}{IMATRIX_SUFFIX}", self.qtype)
        } else {
            self.qtype.clone()
        }
    }
}

/// How the F32 GGUF is made from the source.
#[derive(Debug, Clone)]
pub enum Base {
    /// A Hugging Face folder or hub id: llama.cpp's converter.
    Convert(llamacpp::Converter),
    /// A GGUF: `llama-quantize --allow-requantize ... F32`.
    Requantize,
}

/// The ladder of a run, checked.
#[derive(Debug, Clone)]
pub struct LadderPlan {
    pub rungs: Vec<Rung>,
    pub base: Base,
    /// The calibration text the importance matrix is computed on (when a rung needs one).
    pub calib: Option<EvalText>,
    pub cache_dir: PathBuf,
}

/// What [`plan`] needs from the run's options.
pub struct LadderAsk<'a> {
    pub choice: &'a LadderChoice,
    pub llm: &'a str,
    pub llama_bench: bool,
    pub has_gguf: bool,
    pub calib: Option<&'a EvalText>,
    pub cache_dir: Option<PathBuf>,
}

/// Whether the run has a ladder at all (before any tool is looked for).
pub fn wanted(ask: &LadderAsk) -> bool {
    match ask.choice {
        LadderChoice::Auto => ask.llama_bench && !ask.has_gguf,
        LadderChoice::Off => false,
        LadderChoice::Default | LadderChoice::Types(_) => true,
    }
}

/// The ladder's rungs, each type checked against `allowed` (case-insensitively; the
/// spelling of `allowed` is kept).
fn rungs(
    choice: &LadderChoice,
    allowed: &[String],
    has_calib: bool,
) -> std::result::Result<Vec<Rung>, String> {
    let typed: Vec<(String, bool)> = match choice {
        LadderChoice::Types(t) => t
            .iter()
            .map(|x| match x.strip_suffix(IMATRIX_SUFFIX) {
                Some(base) => (base.to_string(), true),
                None => (x.clone(), false),
            })
            .collect(),
        _ => DEFAULT_LADDER
            .iter()
            .map(|t| (t.to_string(), has_calib))
            .collect(),
    };
    let mut out: Vec<Rung> = Vec::new();
    for (t, imatrix) in typed {
        let Some(name) = allowed.iter().find(|a| a.eq_ignore_ascii_case(&t)) else {
            return Err(format!(
                "--ladder: '{t}' is not a type this llama-quantize makes; pass some of: {}",
                allowed.join(", ")
            ));
        };
        if imatrix && !has_calib {
            return Err(format!(
                "--ladder: '{t}{IMATRIX_SUFFIX}' needs an importance matrix, made from --calib-text; pass --calib-text FILE"
            ));
        }
        let rung = Rung {
            qtype: name.clone(),
            imatrix,
        };
        // The F32 base is always a row (`gguf:F32`): `--ladder F32` asks for it alone.
        if rung.qtype == "F32" && !imatrix {
            continue;
        }
        if out.contains(&rung) {
            return Err(format!(
                "--ladder: '{}' is given twice; give each type once",
                rung.label()
            ));
        }
        out.push(rung);
    }
    Ok(out)
}

/// Checks the ladder the options ask for: the types against this llama-quantize, the
/// converter (for a Hugging Face source) and llama-imatrix (when a rung needs it). `None`
/// when the run has no ladder.
pub fn plan(ask: &LadderAsk, tools: &LlamaCppTools) -> Result<Option<LadderPlan>> {
    if !wanted(ask) {
        return Ok(None);
    }
    let cache_dir = ask.cache_dir.clone().ok_or_else(|| {
        anyhow!("the ladder keeps its GGUFs in the kwk cache, but none of KWK_CACHE, XDG_CACHE_HOME, HOME is set; set KWK_CACHE=DIR")
    })?;
    ensure!(
        tools.quantize_path().is_some(),
        "the ladder needs llama-quantize, which is not beside {}. Fix: {}",
        tools.perplexity_path().display(),
        llamacpp::SETUP_HINT
    );
    let allowed = llamacpp::quantize::allowed_types(tools, Duration::from_secs(60))
        .map_err(|e| anyhow!("{e}"))?;
    let rungs = rungs(ask.choice, &allowed, ask.calib.is_some()).map_err(|e| anyhow!(e))?;
    let needs_imatrix = rungs.iter().any(|r| r.imatrix);
    if needs_imatrix && tools.imatrix_path().is_none() {
        bail!(
            "the ladder's +imatrix rows need llama-imatrix, which is not beside {}. Fix: {}",
            tools.perplexity_path().display(),
            llamacpp::SETUP_HINT
        );
    }
    let source = kwk::model::source::resolve_spec(ask.llm)
        .map_err(|e| anyhow!("--llm '{}': {e}", ask.llm))?;
    let base = match source {
        kwk::model::ModelSource::Gguf(_) => Base::Requantize,
        kwk::model::ModelSource::HfFolder(_) | kwk::model::ModelSource::Hub { .. } => {
            let search = llamacpp::ConverterSearch::from_env(tools.bin_dir());
            Base::Convert(llamacpp::Converter::locate(&search).map_err(|e| anyhow!("{e}"))?)
        }
    };
    Ok(Some(LadderPlan {
        rungs,
        base,
        calib: if needs_imatrix {
            ask.calib.cloned()
        } else {
            None
        },
        cache_dir,
    }))
}

/// What [`make`] gives the run: the rows to measure, how each was made, and the rows that
/// could not be made.
#[derive(Debug, Default)]
pub struct Made {
    pub formats: Vec<FormatSpec>,
    pub made: Vec<(String, MadeGguf)>,
    /// Rows whose GGUF could not be made (llama-quantize failed): failed rows.
    pub unmade: Vec<RunnerRecord>,
    /// Types not made because they need an importance matrix the run has no text for:
    /// one line each, for the reports' notes (not rows: nothing was asked that failed).
    pub not_made: Vec<String>,
}

/// Settings [`make`] runs the tools with.
pub struct MakeSettings<'a> {
    pub llm: &'a str,
    pub tools: &'a LlamaCppTools,
    pub threads: usize,
    /// `--tool-timeout`; `None` gives each step [`DEFAULT_STEP_TIMEOUT`].
    pub timeout: Option<Duration>,
}

/// The time one conversion, importance matrix or quantization may take without
/// `--tool-timeout`.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(4 * 3600);

/// SHA-256 over a tool's own files: the executable and the shared libraries beside it
/// (`libllama*`, `libggml*`; a rebuilt llama.cpp has new ones even when it reports the same
/// version).
fn tool_identity(tool: &Path) -> Result<String> {
    let mut files = vec![tool.to_path_buf()];
    if let Some(dir) = tool.parent() {
        if let Ok(read) = std::fs::read_dir(dir) {
            let mut libs: Vec<PathBuf> = read
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let n = p
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    (n.starts_with("libllama") || n.starts_with("libggml"))
                        && n.contains(".so")
                        && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
                })
                .collect();
            libs.sort();
            files.extend(libs);
        }
    }
    let mut parts = String::new();
    for f in &files {
        let h =
            crate::digest::file_sha256(f).with_context(|| format!("hashing '{}'", f.display()))?;
        parts.push_str(&format!(
            "{} {h}\n",
            f.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    Ok(crate::digest::sha256_hex(parts.as_bytes()))
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn tool_err(e: llamacpp::Error) -> anyhow::Error {
    anyhow!("{e}")
}

/// The last lines of a log worth keeping in a record (fallback lines and totals first).
fn keep_log(text: &str) -> String {
    let mut kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("falling back")
                || l.contains("quant size")
                || l.contains("model size")
                || l.contains("fallback quantization")
                || l.contains("imatrix")
        })
        .collect();
    kept.truncate(2000);
    kept.join("\n")
}

/// Tensors of a GGUF file (for the fallback line's "of N").
fn tensor_count(path: &Path) -> Option<usize> {
    kwk::gguf::GgufFile::open(path)
        .ok()
        .map(|f| f.summary().type_counts.values().sum())
}

/// Makes (or finds in the cache) the ladder of `plan` for the model `settings.llm`.
pub fn make(plan: &LadderPlan, settings: &MakeSettings, ui: &dyn Reporter) -> Result<Made> {
    let tools = settings.tools;
    let timeout = settings.timeout.unwrap_or(DEFAULT_STEP_TIMEOUT);
    let quantize = tools
        .quantize_path()
        .ok_or_else(|| anyhow!("llama-quantize not found"))?;
    let cache = GgufCache::open(&plan.cache_dir)?;
    let (_, source_path) =
        kwk::model::source::resolve_local(settings.llm, &kwk::model::hub::HubSettings::from_env())
            .map_err(|e| anyhow!("--llm '{}': {e}", settings.llm))?;
    ui.line(&format!(
        "ladder: {} type(s) from '{}' (GGUFs kept in {})",
        plan.rungs.len(),
        settings.llm,
        cache.dir().display()
    ));
    let t = Instant::now();
    let source_sha = crate::digest::model_sha256(&source_path)?;
    let quantize_id = tool_identity(quantize)?;
    ui.line(&format!(
        "ladder: source and tools hashed in {}",
        secs(t.elapsed())
    ));

    // The F32 GGUF every type is made from.
    let (base_key, from) = match &plan.base {
        Base::Convert(conv) => {
            let script = conv.script_bytes().map_err(tool_err)?;
            (
                cache::key(&[
                    ("kind", "base"),
                    ("source", &source_sha),
                    ("by", "convert_hf_to_gguf.py"),
                    ("script", &crate::digest::sha256_hex(&script)),
                    ("outtype", "f32"),
                ]),
                format!(
                    "F32 GGUF converted from the Hugging Face folder '{}' by llama.cpp's convert_hf_to_gguf.py",
                    source_path.display()
                ),
            )
        }
        Base::Requantize => {
            let types = kwk::gguf::GgufFile::open(&source_path)
                .map(|f| {
                    f.summary()
                        .type_counts
                        .iter()
                        .map(|(k, v)| format!("{k} ×{v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            (
                cache::key(&[
                    ("kind", "base"),
                    ("source", &source_sha),
                    ("by", "llama-quantize --allow-requantize"),
                    ("tool", &quantize_id),
                    ("outtype", "F32"),
                ]),
                format!(
                    "F32 GGUF requantized (llama-quantize --allow-requantize) from the GGUF '{}', whose tensors are already {types}: every type starts from those rounded weights",
                    source_path.display()
                ),
            )
        }
    };
    let found_base = cache.lookup(&base_key, "gguf");
    let base_cached = found_base.is_some();
    let base = match found_base {
        Some(e) => {
            ui.line(&format!(
                "ladder: F32 base reused from the cache ({})",
                e.path.display()
            ));
            e
        }
        None => {
            ui.line("ladder: making the F32 base GGUF ...");
            let e = cache.store(&base_key, "gguf", |out| {
                let start = Instant::now();
                let log = match &plan.base {
                    Base::Convert(conv) => {
                        let req = llamacpp::ConvertRequest {
                            model: source_path.clone(),
                            output: out.to_path_buf(),
                            outtype: "f32".into(),
                            timeout,
                        };
                        llamacpp::run_convert(conv, &req).map_err(tool_err)?.text
                    }
                    Base::Requantize => {
                        let req = llamacpp::QuantizeRequest {
                            input: source_path.clone(),
                            output: out.to_path_buf(),
                            qtype: "F32".into(),
                            imatrix: None,
                            allow_requantize: true,
                            threads: settings.threads,
                            timeout,
                        };
                        llamacpp::run_quantize(tools, &req).map_err(tool_err)?.text
                    }
                };
                Ok(Record {
                    kind: "gguf".into(),
                    what: "F32".into(),
                    inputs: vec![
                        ("source".into(), source_path.display().to_string()),
                        ("source_sha256".into(), source_sha.clone()),
                        ("from".into(), from.clone()),
                    ],
                    bytes: 0,
                    make_s: start.elapsed().as_secs_f64(),
                    made_utc: crate::machine::utc_now().0,
                    log: keep_log(&log),
                })
            })?;
            ui.line(&format!(
                "ladder: F32 base made in {:.1} s",
                e.record.make_s
            ));
            e
        }
    };
    let base_tensors = tensor_count(&base.path);
    let mut out = Made::default();
    let base_row = FormatSpec::Gguf {
        path: base.path.clone(),
        label: "F32".into(),
        explicit: true,
        engine: Engine::LlamaCpp,
        by_engine: false,
    };
    out.made.push((
        base_row.name(),
        MadeGguf {
            qtype: "F32".into(),
            from: from.clone(),
            tensors: base_tensors,
            cached: base_cached,
            make_s: base.record.make_s,
            path: base.path.display().to_string(),
            ..Default::default()
        },
    ));
    out.formats.push(base_row);

    // The importance matrix, when a rung uses one.
    let imatrix = match &plan.calib {
        Some(calib) if plan.rungs.iter().any(|r| r.imatrix) => Some(make_imatrix(
            &cache, &base, &base_key, calib, settings, timeout, ui,
        )?),
        _ => None,
    };

    let n = plan.rungs.len();
    for (i, rung) in plan.rungs.iter().enumerate() {
        let label = rung.label();
        let step = format!("ladder [{}/{n}] {label}", i + 1);
        let name = format!("gguf:{label}");
        let mat = if rung.imatrix { imatrix.as_ref() } else { None };
        let key = cache::key(&[
            ("kind", "type"),
            ("base", &base_key),
            ("tool", &quantize_id),
            ("type", &rung.qtype),
            ("imatrix", mat.map_or("none", |(_, sha)| sha.as_str())),
        ]);
        let found = cache.lookup(&key, "gguf");
        let cached = found.is_some();
        let entry = match found {
            Some(e) => Ok(e),
            None => cache.store(&key, "gguf", |tmp| {
                let start = Instant::now();
                let req = llamacpp::QuantizeRequest {
                    input: base.path.clone(),
                    output: tmp.to_path_buf(),
                    qtype: rung.qtype.clone(),
                    imatrix: mat.map(|(p, _)| p.clone()),
                    allow_requantize: false,
                    threads: settings.threads,
                    timeout,
                };
                let run = llamacpp::run_quantize(tools, &req);
                let run = match run {
                    Ok(r) => r,
                    Err(e) => return Err(anyhow::Error::new(QuantizeFailed(e))),
                };
                Ok(Record {
                    kind: "gguf".into(),
                    what: label.clone(),
                    inputs: vec![
                        ("base".into(), base.path.display().to_string()),
                        ("type".into(), rung.qtype.clone()),
                        (
                            "imatrix".into(),
                            mat.map_or("none".into(), |(p, _)| p.display().to_string()),
                        ),
                        ("command".into(), run.command.clone()),
                    ],
                    bytes: 0,
                    make_s: start.elapsed().as_secs_f64(),
                    made_utc: crate::machine::utc_now().0,
                    log: keep_log(&run.text),
                })
            }),
        };
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                let needs = e
                    .downcast_ref::<QuantizeFailed>()
                    .is_some_and(|q| matches!(&q.0, llamacpp::Error::Failed { hint, .. } if hint.contains("importance matrix")));
                if needs {
                    let why = format!(
                        "{} needs an importance matrix on this model; pass --calib-text FILE (the ladder then makes {}{IMATRIX_SUFFIX})",
                        rung.qtype, rung.qtype
                    );
                    ui.line(&format!("{step}: not made: {why}"));
                    out.not_made.push(format!("{name}: {why}"));
                } else {
                    let why = format!("making the GGUF failed: {e:#}");
                    ui.line(&format!("{step}: FAILED: {why}"));
                    out.unmade
                        .push(RunnerRecord::failed(&name, Engine::LlamaCpp, why));
                }
                continue;
            }
        };
        let log = llamacpp::quantize::parse_log(&entry.record.log);
        let made = MadeGguf {
            qtype: rung.qtype.clone(),
            from: from.clone(),
            imatrix_sha256: mat.map(|(_, sha)| sha.clone()),
            fallbacks: group_fallbacks(&log.fallbacks),
            fallback_tensors: log.fallback_count.map(|(n, _)| n),
            tensors: log.fallback_count.map(|(_, of)| of).or(base_tensors),
            quantize_bits_per_weight: log.bits_per_weight,
            cached,
            make_s: entry.record.make_s,
            path: entry.path.display().to_string(),
        };
        ui.line(&format!(
            "{step}: {} {}{}",
            if cached {
                "reused from the cache".to_string()
            } else {
                format!("made in {:.1} s", entry.record.make_s)
            },
            log.bits_per_weight
                .map_or(String::new(), |b| format!("({b:.2} bpw)")),
            made.fallback_line()
                .map_or(String::new(), |l| format!("; {l}"))
        ));
        let spec = FormatSpec::Gguf {
            path: entry.path.clone(),
            label,
            explicit: true,
            engine: Engine::LlamaCpp,
            by_engine: false,
        };
        out.made.push((spec.name(), made));
        out.formats.push(spec);
    }
    // The made files count towards the cache limit; what this run uses stays.
    let mut keep: Vec<PathBuf> = out
        .formats
        .iter()
        .filter_map(|f| match f {
            FormatSpec::Gguf { path, .. } => Some(path.clone()),
            FormatSpec::Kwk { .. } => None,
        })
        .collect();
    keep.extend(imatrix.map(|(p, _)| p));
    let pruned = cache::prune(cache.dir(), kwk::pack_cache::limit_bytes(), &keep)?;
    if !pruned.evicted.is_empty() {
        ui.line(&format!(
            "ladder: {} older made GGUF(s) removed to keep the cache under its limit (KWK_PACK_CACHE_GB)",
            pruned.evicted.len()
        ));
    }
    Ok(out)
}

/// A llama-quantize failure, kept typed so a missing importance matrix is told apart.
#[derive(Debug)]
struct QuantizeFailed(llamacpp::Error);

impl std::fmt::Display for QuantizeFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for QuantizeFailed {}

/// Fallbacks counted by (wanted, used) type, most frequent first.
fn group_fallbacks(list: &[llamacpp::Fallback]) -> Vec<FallbackGroup> {
    let mut groups: Vec<FallbackGroup> = Vec::new();
    for f in list {
        match groups
            .iter_mut()
            .find(|g| g.wanted == f.wanted && g.used == f.used)
        {
            Some(g) => g.tensors += 1,
            None => groups.push(FallbackGroup {
                wanted: f.wanted.clone(),
                used: f.used.clone(),
                tensors: 1,
            }),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.tensors));
    groups
}

/// The importance matrix of the calibration text on the F32 base: its path and SHA-256.
fn make_imatrix(
    cache: &GgufCache,
    base: &cache::Entry,
    base_key: &str,
    calib: &EvalText,
    settings: &MakeSettings,
    timeout: Duration,
    ui: &dyn Reporter,
) -> Result<(PathBuf, String)> {
    let window = kwk::decoder::CALIBRATION_WINDOW;
    let chunks = kwk::decoder::CALIBRATION_TOKENS / window;
    let imatrix_tool = settings
        .tools
        .imatrix_path()
        .ok_or_else(|| anyhow!("llama-imatrix not found"))?;
    let key = cache::key(&[
        ("kind", "imatrix"),
        ("base", base_key),
        ("tool", &tool_identity(imatrix_tool)?),
        ("text", &calib.sha256),
        ("ctx", &window.to_string()),
        ("chunks", &chunks.to_string()),
    ]);
    let entry = match cache.lookup(&key, "imatrix") {
        Some(e) => {
            ui.line(&format!(
                "ladder: importance matrix of '{}' reused from the cache",
                calib.name
            ));
            e
        }
        None => {
            ui.line(&format!(
                "ladder: llama-imatrix on '{}' ({chunks} chunks of {window} tokens, as kwk calibrates) ...",
                calib.name
            ));
            // The text as hashed, from this run's copy (the file may change meanwhile).
            let copy = tempfile::Builder::new()
                .prefix("kwk-imatrix-text-")
                .suffix(".txt")
                .tempfile()
                .context("creating a temporary copy of --calib-text")?;
            let mut bytes = calib.text.clone().into_bytes();
            if calib.trailing_newline {
                bytes.push(b'\n');
            }
            std::fs::write(copy.path(), &bytes).context("writing the --calib-text copy")?;
            let e = cache.store(&key, "imatrix", |tmp| {
                let start = Instant::now();
                // llama-imatrix picks its output format by the name's extension.
                let out_gguf = tmp.with_extension("gguf");
                let req = llamacpp::ImatrixRequest {
                    model: base.path.clone(),
                    text: copy.path().to_path_buf(),
                    output: out_gguf.clone(),
                    ctx: window,
                    chunks,
                    threads: settings.threads,
                    timeout,
                };
                let run = llamacpp::run_imatrix(settings.tools, &req);
                let run = match run {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = std::fs::remove_file(&out_gguf);
                        return Err(tool_err(e));
                    }
                };
                std::fs::rename(&out_gguf, tmp)
                    .with_context(|| format!("moving '{}'", out_gguf.display()))?;
                Ok(Record {
                    kind: "imatrix".into(),
                    what: calib.name.clone(),
                    inputs: vec![
                        ("base".into(), base.path.display().to_string()),
                        ("text_sha256".into(), calib.sha256.clone()),
                        ("command".into(), run.command.clone()),
                    ],
                    bytes: 0,
                    make_s: start.elapsed().as_secs_f64(),
                    made_utc: crate::machine::utc_now().0,
                    log: keep_log(&run.text),
                })
            })?;
            ui.line(&format!(
                "ladder: importance matrix made in {:.1} s",
                e.record.make_s
            ));
            e
        }
    };
    let sha = crate::digest::file_sha256(&entry.path)
        .with_context(|| format!("hashing '{}'", entry.path.display()))?;
    Ok((entry.path, sha))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Vec<String> {
        [
            "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS", "Q3_K_M", "IQ3_XXS", "Q2_K",
            "F32",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    #[test]
    fn the_choice_parses() {
        assert_eq!(LadderChoice::parse("none"), Ok(LadderChoice::Off));
        assert_eq!(LadderChoice::parse("default"), Ok(LadderChoice::Default));
        assert_eq!(
            LadderChoice::parse("q4_k_m, Q2_K+imatrix"),
            Ok(LadderChoice::Types(vec![
                "q4_k_m".into(),
                "Q2_K+imatrix".into()
            ]))
        );
        assert!(LadderChoice::parse("Q4_K_M,,Q2_K").is_err());
        assert!(LadderChoice::parse("").is_err());
    }

    #[test]
    fn the_default_ladder_takes_the_imatrix_when_there_is_a_calibration_text() {
        let plain = rungs(&LadderChoice::Default, &allowed(), false).unwrap();
        assert_eq!(plain.len(), DEFAULT_LADDER.len());
        assert!(plain.iter().all(|r| !r.imatrix));
        let calib = rungs(&LadderChoice::Auto, &allowed(), true).unwrap();
        assert!(calib.iter().all(|r| r.imatrix));
        assert_eq!(calib[3].label(), "Q4_K_M+imatrix");
    }

    #[test]
    fn types_are_checked_against_the_tool() {
        let r = rungs(
            &LadderChoice::Types(vec!["q4_k_m".into(), "Q2_K+imatrix".into()]),
            &allowed(),
            true,
        )
        .unwrap();
        assert_eq!(r[0].label(), "Q4_K_M");
        assert_eq!(r[1].label(), "Q2_K+imatrix");
        let e = rungs(&LadderChoice::Types(vec!["Q9_9".into()]), &allowed(), false).unwrap_err();
        assert!(e.contains("'Q9_9' is not a type"), "{e}");
        let e = rungs(
            &LadderChoice::Types(vec!["Q2_K+imatrix".into()]),
            &allowed(),
            false,
        )
        .unwrap_err();
        assert!(e.contains("pass --calib-text"), "{e}");
        let e = rungs(
            &LadderChoice::Types(vec!["Q2_K".into(), "q2_k".into()]),
            &allowed(),
            false,
        )
        .unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn the_ladder_runs_when_asked_or_when_llama_bench_has_no_gguf() {
        let mut ask = LadderAsk {
            choice: &LadderChoice::Auto,
            llm: "m",
            llama_bench: true,
            has_gguf: false,
            calib: None,
            cache_dir: None,
        };
        assert!(wanted(&ask));
        ask.has_gguf = true;
        assert!(!wanted(&ask));
        ask.choice = &LadderChoice::Default;
        assert!(wanted(&ask));
        ask.choice = &LadderChoice::Off;
        ask.has_gguf = false;
        assert!(!wanted(&ask));
    }

    #[test]
    fn fallbacks_are_grouped_by_pair() {
        let f = |t: &str, w: &str, u: &str| llamacpp::Fallback {
            tensor: t.into(),
            wanted: w.into(),
            used: u.into(),
        };
        let g = group_fallbacks(&[
            f("a", "q4_K", "q5_0"),
            f("b", "q6_K", "q8_0"),
            f("c", "q4_K", "q5_0"),
        ]);
        assert_eq!(g[0].tensors, 2);
        assert_eq!((g[1].wanted.as_str(), g[1].tensors), ("q6_K", 1));
    }
}
