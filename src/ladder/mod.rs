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
//!
//! With ik_llama.cpp among the peers (`--peer llama.cpp,ik`), the ladder adds the fork's own
//! types ([`IK_LADDER`], or `ik:TYPE` in `--ladder`), made by its llama-quantize from the
//! same F32 base and the same importance matrix (rewritten in the legacy format it reads)
//! and run on ik alone (rows `ik:TYPE`): mainline cannot load them.

pub mod cache;
mod imatrix;
pub mod matched;

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

/// ik_llama.cpp's own types the ladder adds when ik is a peer, at the sizes of the default
/// ladder: its non-linear k-types from 6.6 down to 2.4 bits per weight (the descriptions
/// of its llama-quantize, 0.1.5). The trellis types (IQ*_KT) are left to `--ladder
/// ik:IQ3_KT`: their quantization is slow on a CPU.
pub const IK_LADDER: &[&str] = &["IQ6_K", "IQ5_K", "IQ4_K", "IQ4_KS", "IQ3_K", "IQ2_K"];

/// The prefix of a `--ladder` type made by ik_llama.cpp (`ik:IQ4_KS`).
pub const IK_PREFIX: &str = "ik:";

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

    /// Whether a type is named `ik:TYPE` (made by ik_llama.cpp, whatever `--peer` says).
    pub fn names_ik(&self) -> bool {
        match self {
            LadderChoice::Types(t) => t.iter().any(|x| strip_ik(x).is_some()),
            _ => false,
        }
    }
}

/// `TYPE` of `ik:TYPE` (any case of the prefix).
fn strip_ik(t: &str) -> Option<&str> {
    t.get(..IK_PREFIX.len())
        .filter(|p| p.eq_ignore_ascii_case(IK_PREFIX))
        .map(|_| &t[IK_PREFIX.len()..])
}

/// One type of the ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rung {
    /// The type as llama-quantize lists it.
    pub qtype: String,
    pub imatrix: bool,
    /// The engine whose llama-quantize makes it: llama.cpp (its rows run on every peer), or
    /// ik_llama.cpp for its own types (run on ik alone).
    pub maker: Engine,
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

    /// The row this rung makes: `gguf:LABEL` (one per peer once the run names rows by
    /// engine), or `ik:LABEL` for ik_llama.cpp's own types.
    pub fn row(&self, path: PathBuf) -> FormatSpec {
        FormatSpec::Gguf {
            path,
            label: self.label(),
            explicit: true,
            engine: self.maker,
            by_engine: self.maker == Engine::Ik,
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

/// The ladder's rungs, each type checked against the llama-quantize that makes it
/// (`allowed`: mainline's; `ik_allowed`: ik_llama.cpp's when it is a peer or named),
/// case-insensitively (the tool's spelling is kept). The default ladder is mainline's, and
/// ik's own types ([`IK_LADDER`]) when `ik_allowed` is given.
fn rungs(
    choice: &LadderChoice,
    allowed: &[String],
    ik_allowed: Option<&[String]>,
    has_calib: bool,
) -> std::result::Result<Vec<Rung>, String> {
    let typed: Vec<(String, bool, Engine)> = match choice {
        LadderChoice::Types(t) => t
            .iter()
            .map(|x| {
                let (x, maker) = match strip_ik(x) {
                    Some(rest) => (rest, Engine::Ik),
                    None => (x.as_str(), Engine::LlamaCpp),
                };
                match x.strip_suffix(IMATRIX_SUFFIX) {
                    Some(base) => (base.to_string(), true, maker),
                    None => (x.to_string(), false, maker),
                }
            })
            .collect(),
        _ => {
            let ik = ik_allowed.map_or(&[][..], |_| IK_LADDER);
            DEFAULT_LADDER
                .iter()
                .map(|t| (t.to_string(), has_calib, Engine::LlamaCpp))
                .chain(ik.iter().map(|t| (t.to_string(), has_calib, Engine::Ik)))
                .collect()
        }
    };
    let mut out: Vec<Rung> = Vec::new();
    for (t, imatrix, maker) in typed {
        let (list, whose, prefix) = match maker {
            Engine::Ik => {
                let Some(list) = ik_allowed else {
                    return Err(format!(
                        "--ladder: '{IK_PREFIX}{t}' is made by ik_llama.cpp, whose tools were not looked for; pass --peer llama.cpp,ik"
                    ));
                };
                (list, "ik_llama.cpp's llama-quantize", IK_PREFIX)
            }
            _ => (allowed, "this llama-quantize", ""),
        };
        let Some(name) = list.iter().find(|a| a.eq_ignore_ascii_case(&t)) else {
            let ik_makes = maker == Engine::LlamaCpp
                && ik_allowed.is_some_and(|l| l.iter().any(|a| a.eq_ignore_ascii_case(&t)));
            if ik_makes {
                return Err(format!(
                    "--ladder: '{t}' is not a type this llama-quantize makes; ik_llama.cpp's does: name it {IK_PREFIX}{t}"
                ));
            }
            return Err(format!(
                "--ladder: '{prefix}{t}' is not a type {whose} makes; pass some of: {}",
                list.join(", ")
            ));
        };
        if imatrix && !has_calib {
            return Err(format!(
                "--ladder: '{prefix}{t}{IMATRIX_SUFFIX}' needs an importance matrix, made from --calib-text; pass --calib-text FILE"
            ));
        }
        let rung = Rung {
            qtype: name.clone(),
            imatrix,
            maker,
        };
        // The F32 base is always a row (`gguf:F32`): `--ladder F32` asks for it alone.
        if rung.qtype == "F32" && !imatrix && maker == Engine::LlamaCpp {
            continue;
        }
        if out.contains(&rung) {
            return Err(format!(
                "--ladder: '{prefix}{}' is given twice; give each type once",
                rung.label()
            ));
        }
        out.push(rung);
    }
    Ok(out)
}

/// Checks the ladder the options ask for: the types against this llama-quantize, the
/// converter (for a Hugging Face source) and llama-imatrix (when a rung needs it); ik's
/// types against ik_llama.cpp's llama-quantize when `ik_tools` are given (ik is a peer or
/// a type is named `ik:TYPE`). `None` when the run has no ladder.
pub fn plan(
    ask: &LadderAsk,
    tools: &LlamaCppTools,
    ik_tools: Option<&LlamaCppTools>,
) -> Result<Option<LadderPlan>> {
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
    let ik_allowed = match ik_tools {
        Some(ik) => {
            ensure!(
                ik.quantize_path().is_some(),
                "the ladder's ik rows need ik_llama.cpp's llama-quantize, which is not beside {}. Fix: {}",
                ik.perplexity_path().display(),
                ik.engine().setup_hint()
            );
            Some(
                llamacpp::quantize::allowed_types(ik, Duration::from_secs(60))
                    .map_err(|e| anyhow!("{e}"))?,
            )
        }
        None => None,
    };
    let rungs = rungs(
        ask.choice,
        &allowed,
        ik_allowed.as_deref(),
        ask.calib.is_some(),
    )
    .map_err(|e| anyhow!(e))?;
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
    /// ik_llama.cpp's tools, which make the ik rungs.
    pub ik_tools: Option<&'a LlamaCppTools>,
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
    let ik_quantize = if plan.rungs.iter().any(|r| r.maker == Engine::Ik) {
        let ik = settings
            .ik_tools
            .ok_or_else(|| anyhow!("the ladder's ik rows need ik_llama.cpp's tools"))?;
        let q = ik
            .quantize_path()
            .ok_or_else(|| anyhow!("ik_llama.cpp's llama-quantize not found"))?;
        Some((ik, tool_identity(q)?))
    } else {
        None
    };
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
        Some(calib) if plan.rungs.iter().any(|r| r.imatrix) => Some(imatrix::make_imatrix(
            &cache, &base, &base_key, calib, settings, timeout, ui,
        )?),
        _ => None,
    };
    // The same matrix for ik_llama.cpp's llama-quantize, which reads the legacy format.
    let ik_imatrix = match &imatrix {
        Some(m)
            if plan
                .rungs
                .iter()
                .any(|r| r.imatrix && r.maker == Engine::Ik) =>
        {
            Some(imatrix::legacy_copy(
                &cache, &base, m, settings, timeout, ui,
            )?)
        }
        _ => None,
    };

    let n = plan.rungs.len();
    for (i, rung) in plan.rungs.iter().enumerate() {
        let name = rung.row(PathBuf::new()).name();
        let step = format!(
            "ladder [{}/{n}] {}",
            i + 1,
            name.trim_start_matches("gguf:")
        );
        let (rung_tools, tool_id, mat) = match (rung.maker, &ik_quantize) {
            (Engine::Ik, Some((ik, id))) => (*ik, id, ik_imatrix.as_ref()),
            _ => (tools, &quantize_id, imatrix.as_ref()),
        };
        let mat = if rung.imatrix { mat } else { None };
        let key = cache::key(&[
            ("kind", "type"),
            ("base", &base_key),
            ("tool", tool_id),
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
                let run = llamacpp::run_quantize(rung_tools, &req);
                let run = match run {
                    Ok(r) => r,
                    Err(e) => return Err(anyhow::Error::new(QuantizeFailed(e))),
                };
                Ok(Record {
                    kind: "gguf".into(),
                    what: name.trim_start_matches("gguf:").to_string(),
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
                        .push(RunnerRecord::failed(&name, rung.maker, why));
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
        let spec = rung.row(entry.path.clone());
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

/// The rows a made GGUF runs as: one per peer for mainline's types
/// ([`FormatSpec::for_peers`]), and ik_llama.cpp's own types on ik alone (mainline cannot
/// load them).
pub fn rows_on_peers(made: &FormatSpec, peers: &[Engine]) -> Vec<FormatSpec> {
    match made.engine() {
        Engine::Ik => vec![made.clone()],
        _ => made.for_peers(peers),
    }
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

#[cfg(test)]
mod tests;
