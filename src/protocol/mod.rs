//! The types every stage of a run hands to the next, and nothing else: the token stream and
//! its chunk plan, the perplexity protocol and speed spec, the formats a user asks for, what
//! a runner is and what it measured, and the results file ([`results`]). A leaf: it imports
//! nothing from the rest of the crate, so data flows one way (cli → plan → prepare →
//! runner/eval → measure → report) and every stage can name these types.

pub mod chunks;
pub mod made;
pub mod points;
pub mod results;
pub mod speed_ratios;
pub mod steadiness;

pub use chunks::{check_ctx, ChunkPlan, PlanError};

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The engine that runs a row: kwk's in-tree decoder, or an external program on a GGUF file.
/// results.json writes it as its name (`"kwk"`, `"llama.cpp"`), the strings it held before
/// it was a type, so older files and baselines read as they did. ik_llama.cpp, the fork with
/// its own tools and dialect (issue 40), is one more variant, run by the same
/// `runner/llamacpp.rs` through the `llamacpp` crate's dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Engine {
    /// kwk's in-tree decoder (the default of a row read without one).
    #[default]
    #[serde(rename = "kwk")]
    Kwk,
    /// llama.cpp's tools: llama-perplexity, llama-bench, llama-tokenize.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// ik_llama.cpp's tools of the same names (`--peer ik`).
    #[serde(rename = "ik")]
    Ik,
}

impl Engine {
    /// The name reports show and results.json holds.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Kwk => "kwk",
            Engine::LlamaCpp => "llama.cpp",
            Engine::Ik => "ik",
        }
    }

    /// The external engine's tools, as the `llamacpp` crate names them; `None` for kwk.
    pub fn tools_engine(self) -> Option<llamacpp::Engine> {
        match self {
            Engine::Kwk => None,
            Engine::LlamaCpp => Some(llamacpp::Engine::LlamaCpp),
            Engine::Ik => Some(llamacpp::Engine::Ik),
        }
    }

    /// The row engine of an external engine's tools.
    pub fn of_tools(e: llamacpp::Engine) -> Engine {
        match e {
            llamacpp::Engine::LlamaCpp => Engine::LlamaCpp,
            llamacpp::Engine::Ik => Engine::Ik,
        }
    }

    /// Whether the engine is an external program on a GGUF file (it picks its own kernels;
    /// plots draw it in its own colour) rather than the in-tree decoder.
    pub fn is_external(self) -> bool {
        !matches!(self, Engine::Kwk)
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a runner is, for the report. Units are in the field names.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerInfo {
    /// The format name as typed (`int4`, `int4:g128`) or `gguf:<file name>`.
    pub name: String,
    pub engine: Engine,
    /// Bytes of weight data: the packed tensors a kwk format holds, or the sum of the
    /// GGUF's tensor data sizes (llama.cpp's "model size"), so both engines count the same.
    pub tensor_bytes: u64,
    /// Size of the file the runner reads its weights from (the GGUF, metadata included);
    /// `None` for kwk formats, which are packed in memory.
    pub file_bytes: Option<u64>,
    /// `8 · tensor_bytes / params`.
    pub bits_per_weight: f64,
    pub params: u64,
    /// Storage types and their tensor counts (e.g. {"q4_1": 182, "f32": 61}).
    pub type_mix: std::collections::BTreeMap<String, usize>,
    /// Seconds to get ready: reading the model, and packing it into the format.
    pub load_s: Option<f64>,
    pub load_read_s: Option<f64>,
    pub load_pack_s: Option<f64>,
    /// Seconds of the packing spent on calibration (`int8:calib`, `int8:gptq`, `int4:calib`,
    /// `int4:gptq`).
    pub calibration_s: Option<f64>,
    /// KV cache element type the runner used ("f32", "f16").
    pub kv_type: String,
    /// K+V bytes one token adds to the cache over all layers, scales included (kwk rows;
    /// `None` for engines whose layout is not known here).
    pub kv_bytes_per_token: Option<u64>,
    /// The kernels the runner's weight matmuls run (kwk formats, e.g. `avx512bw`,
    /// `avx512f (convert)`); `None` for engines that do not say.
    pub kernels: Option<String>,
    /// An external engine's settings that change its speed or results, as passed to its
    /// tools (`-fa on -ctk f16 -ctv f16 -rtr`); `None` for kwk formats.
    pub engine_flags: Option<String>,
    /// What a token costs this runner, for the roofline (`None` when unknown).
    pub roofline: Option<RooflineCost>,
}

/// Which measured peak bounds a runner's prompt processing: the arithmetic its weight
/// matmuls do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeKind {
    /// Float32 multiply-add (float32 weights, and f16 weights widened to f32).
    Fp32,
    /// bf16 dot where the CPU has it (else its ceiling is the fp32 one).
    Bf16,
    /// int8 dot: quantized weights against int8-quantized activations (kwk int8/int4,
    /// llama.cpp's quantized types).
    Int8,
}

/// A runner's side of the roofline: which compute peak applies, the weight bytes one
/// generated token reads, and the bytes of one KV cache value during the speed test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RooflineCost {
    pub compute: ComputeKind,
    pub weight_bytes_per_token: f64,
    pub kv_bytes_per_value: f64,
    /// Whether this engine picks its own best kernels (llama.cpp), so its ceiling is the
    /// best tier's peaks even when `KWK_ISA` forces kwk onto a lower one; cleared once a
    /// llama.cpp build turns out to be limited to the forced tier's instructions.
    pub best_kernels: bool,
}

/// The token stream every runner is scored on.
#[derive(Debug, Clone)]
pub struct TokenStream {
    /// Token ids of the text (raw bytes, one trailing `\n` stripped, no special tokens
    /// parsed), with the BOS first when `add_bos`.
    pub tokens: Vec<u32>,
    pub add_bos: bool,
    pub bos_id: Option<u32>,
    /// The text file the tokens came from, as llama-perplexity must read it too: in a run,
    /// the run folder's private copy of `--text` (`crate::text::private_copy`).
    pub text_path: PathBuf,
    /// The SHA-256 `text_path` must still have whenever a tool reads it (the bytes the
    /// tokens came from); `None`: not checked.
    pub text_sha256: Option<String>,
}

impl TokenStream {
    /// The BOS each chunk starts with, when the tokenizer adds one (P:564-579).
    pub fn chunk_bos(&self) -> Option<u32> {
        if self.add_bos {
            self.bos_id
        } else {
            None
        }
    }
}

/// llama-perplexity's chunked protocol, resolved.
#[derive(Debug, Clone)]
pub struct PerplexityProtocol {
    pub plan: ChunkPlan,
    pub threads: usize,
    /// The reference's log-probs in llama.cpp's KL-divergence base file format, when the
    /// run compares against a reference: the reference runner writes it (unless
    /// `--reference` loaded one), the others read it.
    pub reference_logits: Option<PathBuf>,
    /// Where rows put their own log-prob files (llama-perplexity's), the run folder;
    /// `None`: beside `reference_logits`.
    pub logits_dir: Option<PathBuf>,
}

/// What the run that writes a reference file stamps into its trailer besides what the
/// writer knows itself (plan, vocabulary, perplexity): whose model, text and tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReferenceStamp {
    /// The model as `--llm` named it, and the SHA-256 of its files.
    pub model: String,
    pub model_sha256: String,
    /// The text's file name and the SHA-256 of its bytes.
    pub text: String,
    pub text_sha256: String,
    /// SHA-256 of the scored token ids (as `Protocol::tokens_sha256`).
    pub tokens_sha256: String,
    /// kwk-eval's version and the run's start (UTC), for the person reading the file.
    pub made_by: String,
}

/// One row's per-token figures on the scored tokens, in scoring order, read from 16-bit
/// log-prob records (llama.cpp's KL-divergence base format) for every engine alike: the
/// data paired comparisons between rows are computed from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenScores {
    /// NLL of the target token.
    pub nll: Vec<f32>,
    /// KL divergence from the reference's distribution (0 for the reference itself).
    pub kld: Vec<f32>,
    /// Whether the most likely token is the reference's.
    pub same_top: Vec<bool>,
}

/// KL divergence and agreement against the reference runner's distributions, each with its
/// standard error, and the paired perplexity ratio.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ReferenceComparison {
    pub kld_mean: f64,
    pub kld_mean_err: f64,
    pub kld_p99: f64,
    pub top1_agreement: f64,
    /// `sqrt(p(1-p)/(N-1))`, as llama-perplexity prints it.
    pub top1_agreement_err: f64,
    pub delta_p_rms: f64,
    /// `mean(nll - nll_ref)` over the same tokens, i.e. ln(PPL/PPL_ref), and its paired
    /// standard error `sd(nll - nll_ref)/sqrt(N-1)` (llama.cpp's `Mean ln(PPL(Q)/PPL(base))`).
    pub ln_ppl_ratio: f64,
    pub ln_ppl_ratio_err: f64,
    /// Mean over positions of the row's entropy less the reference's (nats; each over its
    /// tokens of log-prob above -16, KLD's floor), and its uncertainty: below 0 the row is
    /// surer of itself than the reference, above 0 less sure.
    pub entropy_delta: f64,
    pub entropy_delta_err: f64,
}

#[derive(Debug, Clone)]
pub struct PerplexityResult {
    pub ppl: f64,
    pub ppl_err: f64,
    /// Cumulative PPL after each chunk (llama-perplexity's `[k]x,` values).
    pub running: Vec<f64>,
    pub scored_tokens: usize,
    /// Whether this runner's engine tokenized the text to exactly the harness's ids
    /// (`None` when not checked, e.g. kwk runners, which are given the ids).
    pub tokens_match: Option<bool>,
    pub reference: Option<ReferenceComparison>,
    /// Per-token figures, when the run compares against a reference.
    pub tokens: Option<TokenScores>,
    /// Peak resident bytes of the engine's own process, for runners that score in a child
    /// process (llama.cpp: `ToolOutput::max_rss_bytes`); `None` for in-process runners,
    /// whose row the harness measures on its own process.
    pub peak_rss_bytes: Option<u64>,
}

/// llama-bench's definitions: pp = `pp` prompt tokens after `depth` untimed tokens in the
/// cache, tg = `tg` single-token steps after them (depth 0: from an empty cache). The
/// harness times `reps` rounds, one repetition of every runner per round. One point of a
/// sweep ([`points::SpeedAxes::specs`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpeedSpec {
    pub pp: usize,
    pub tg: usize,
    /// Tokens prefilled, untimed, before each timed test (llama-bench `-d`).
    #[serde(default)]
    pub depth: usize,
    pub reps: usize,
    pub threads: usize,
}

/// One timed repetition: tokens per second of pp and tg (`None` for a test of size 0).
#[derive(Debug, Clone)]
pub struct SpeedRep {
    pub pp: Option<f64>,
    pub tg: Option<f64>,
    /// The engine's raw output when it has one (llama-bench's JSON objects).
    pub raw: Option<serde_json::Value>,
    /// llama-bench's rows: the figures at each flash-attention setting it measured (`-fa
    /// 0,1` under `--llama-fa best`, one setting otherwise), and `pp`/`tg` are `None`; the
    /// harness keeps, per test, the setting with the higher mean over the rounds. Empty for
    /// engines without the setting (kwk).
    pub by_flash_attn: Vec<FlashAttnRep>,
}

/// One flash-attention setting's figures in a [`SpeedRep`].
#[derive(Debug, Clone, PartialEq)]
pub struct FlashAttnRep {
    /// `-fa 1` (true) or `-fa 0`.
    pub flash_attn: bool,
    pub pp: Option<f64>,
    pub tg: Option<f64>,
}

/// Tokens per second of each repetition, and their mean and sample (n-1) stddev.
#[derive(Debug, Clone, Serialize)]
pub struct SpeedSample {
    pub tokens_per_s: f64,
    pub tokens_per_s_std: f64,
    pub samples_tokens_per_s: Vec<f64>,
}

/// Progress of a long step: `done` of `total` units (chunks, repetitions), and the lines
/// a step has for whoever watches it (a warning about its tokens, a note about a retry),
/// shown above the bar.
pub trait Progress {
    fn set_total(&self, total: u64, what: &str);
    fn advance(&self, done: u64);
    /// One whole line (its `warning: `/`note: ` prefix included).
    fn message(&self, line: &str);
}

/// A [`Progress`] that shows nothing, its messages included (tests, and steps too short
/// to show).
pub struct NoProgress;

impl Progress for NoProgress {
    fn set_total(&self, _total: u64, _what: &str) {}
    fn advance(&self, _done: u64) {}
    fn message(&self, _line: &str) {}
}

/// One row a user asked for: an in-tree format or a GGUF file for an external engine.
#[derive(Debug, Clone, PartialEq)]
pub enum FormatSpec {
    /// An in-tree format, with the name as typed (`int4:mix8`); with a `+kv:TYPE` suffix
    /// (`float32+kv:q8`, [`KV_SUFFIX`]) its KV cache is `kv` whatever the run's `--kv`, and
    /// the name ends in the cache's canonical name.
    Kwk {
        name: String,
        precision: ::kwk::Precision,
        kv: Option<::kwk::KvPrecision>,
    },
    /// `gguf:PATH` in `--formats`, or a `--gguf PATH` (either may be `LABEL=PATH`). The row
    /// is named `gguf:<label>`: LABEL when given (`explicit`), else the file name, which
    /// the plan widens with parent folders when two GGUFs share it; `<engine>:<label>`
    /// (`llama.cpp:Q4_K_M`, `ik:Q4_K_M`) when `by_engine`, as in a run with `--peer ik`.
    Gguf {
        path: PathBuf,
        label: String,
        explicit: bool,
        /// The program that runs it: llama.cpp, or ik_llama.cpp with `--peer`.
        engine: Engine,
        /// Whether the row is named by its engine rather than `gguf:`.
        by_engine: bool,
    },
}

impl FormatSpec {
    /// Whether this is the in-tree float32 format, the reference other rows are compared
    /// with (float32 weights with their own f32 cache; `float32+kv:q8` is an ordinary row).
    pub fn is_reference(&self) -> bool {
        matches!(
            self,
            FormatSpec::Kwk {
                precision: ::kwk::Precision::Float32,
                kv: None,
                ..
            }
        )
    }

    /// The KV cache this kwk row keeps in a run whose `--kv` is `run_kv`: f32 for the
    /// reference (so KLD shows what the other rows' caches cost), the `+kv:` suffix's type
    /// when given, else `run_kv`. `None` for a GGUF row (its engine's `--llama-kv`).
    pub fn kwk_kv(&self, run_kv: ::kwk::KvPrecision) -> Option<::kwk::KvPrecision> {
        match self {
            _ if self.is_reference() => Some(::kwk::KvPrecision::F32),
            FormatSpec::Kwk { kv, .. } => Some(kv.unwrap_or(run_kv)),
            FormatSpec::Gguf { .. } => None,
        }
    }

    /// The runner's name in reports: the format as typed, or `gguf:<label>`.
    pub fn name(&self) -> String {
        match self {
            FormatSpec::Kwk { name, .. } => name.clone(),
            FormatSpec::Gguf {
                label,
                engine,
                by_engine: true,
                ..
            } => format!("{engine}:{label}"),
            FormatSpec::Gguf { label, .. } => format!("gguf:{label}"),
        }
    }

    /// The engine that runs this row.
    pub fn engine(&self) -> Engine {
        match self {
            FormatSpec::Kwk { .. } => Engine::Kwk,
            FormatSpec::Gguf { engine, .. } => *engine,
        }
    }

    /// A GGUF row for llama.cpp, named after its file.
    pub fn gguf(path: PathBuf) -> FormatSpec {
        FormatSpec::Gguf {
            label: file_label(&path),
            path,
            explicit: false,
            engine: Engine::LlamaCpp,
            by_engine: false,
        }
    }

    /// This GGUF row once for each engine of `peers`: unchanged when `peers` is llama.cpp
    /// alone (the default), else one row per engine, named by it (`llama.cpp:Q4_K_M`,
    /// `ik:Q4_K_M`). Other rows are returned as they are.
    pub fn for_peers(&self, peers: &[Engine]) -> Vec<FormatSpec> {
        match self {
            FormatSpec::Gguf {
                path,
                label,
                explicit,
                ..
            } if peers != [Engine::LlamaCpp] => peers
                .iter()
                .map(|&engine| FormatSpec::Gguf {
                    path: path.clone(),
                    label: label.clone(),
                    explicit: *explicit,
                    engine,
                    by_engine: true,
                })
                .collect(),
            other => vec![other.clone()],
        }
    }
}

/// The file name of `path` (its whole text when it has none), the default GGUF label.
pub fn file_label(path: &std::path::Path) -> String {
    path.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// `gguf:<file name>`, the default report name of a llama.cpp runner.
pub fn gguf_runner_name(path: &std::path::Path) -> String {
    format!("gguf:{}", file_label(path))
}

/// A `--gguf` value (or what follows `gguf:` in `--formats`): `PATH`, or `LABEL=PATH` to
/// name the row `gguf:LABEL`. An existing file is always a path (a path may hold `=`), and
/// so is anything whose part before the first `=` holds a `/`.
pub fn parse_gguf_arg(arg: &str) -> Result<FormatSpec, String> {
    if arg.is_empty() {
        return Err("an empty GGUF path; pass PATH or LABEL=PATH".into());
    }
    let as_path = std::path::Path::new(arg);
    let labelled = match arg.split_once('=') {
        Some((label, path)) if !label.contains('/') && !as_path.exists() => Some((label, path)),
        _ => None,
    };
    let Some((label, path)) = labelled else {
        return Ok(FormatSpec::gguf(PathBuf::from(arg)));
    };
    if label.trim().is_empty() {
        return Err(format!(
            "'{arg}' has an empty LABEL before '='; pass LABEL=PATH with a label, or the path alone"
        ));
    }
    if label.chars().any(char::is_control) {
        return Err(format!(
            "the label of '{}' holds a control character; pass a label of printable characters",
            arg.escape_debug()
        ));
    }
    if path.is_empty() {
        return Err(format!("'{arg}' has no PATH after '='; pass LABEL=PATH"));
    }
    Ok(FormatSpec::Gguf {
        path: PathBuf::from(path),
        label: label.to_string(),
        explicit: true,
        engine: Engine::LlamaCpp,
        by_engine: false,
    })
}

/// Parses one entry of `--formats` (clap's value parser for it).
pub fn parse_format(spec: &str) -> Result<FormatSpec, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("an empty entry; separate formats with single commas".into());
    }
    if let Some(path) = spec.strip_prefix("gguf:") {
        if path.is_empty() {
            return Err("'gguf:' has no path; write gguf:PATH".into());
        }
        return parse_gguf_arg(path);
    }
    let (weights, kv) = split_kv_suffix(spec)?;
    match ::kwk::Precision::parse(weights) {
        Ok(::kwk::Precision::Float32) if kv == Some(::kwk::KvPrecision::F32) => Err(format!(
            "'{spec}' is the float32 reference itself (it keeps an f32 cache); write float32"
        )),
        Ok(precision) => Ok(FormatSpec::Kwk {
            name: match kv {
                Some(kv) => format!("{weights}{KV_SUFFIX}{}", kv.name()),
                None => weights.to_string(),
            },
            precision,
            kv,
        }),
        // kwk's message names the valid formats once; a GGUF is the harness's own.
        Err(e) => Err(format!("{e}, or gguf:PATH for a GGUF run by llama.cpp")),
    }
}

/// The suffix that gives one in-tree row its own KV cache: `FORMAT+kv:TYPE`.
pub const KV_SUFFIX: &str = "+kv:";

/// `FORMAT+kv:TYPE` split into the weight format and the cache; a spec without `+` is the
/// format alone. Any other suffix, a second one, or an unknown TYPE is an error naming the
/// grammar.
fn split_kv_suffix(spec: &str) -> Result<(&str, Option<::kwk::KvPrecision>), String> {
    let Some((weights, suffix)) = spec.split_once('+') else {
        return Ok((spec, None));
    };
    let types = ::kwk::KvPrecision::ALL
        .map(::kwk::KvPrecision::name)
        .join(", ");
    let grammar = format!("FORMAT+kv:TYPE with TYPE one of {types} (e.g. float32+kv:q8)");
    let kv = match suffix.split_once(':') {
        Some((key, kv)) if key.eq_ignore_ascii_case("kv") && !kv.contains('+') => kv,
        _ => {
            return Err(format!(
                "'{spec}' has the suffix '+{suffix}'; the one suffix an in-tree format takes is {grammar}"
            ))
        }
    };
    if weights.trim().is_empty() {
        return Err(format!("'{spec}' names no weight format; write {grammar}"));
    }
    match kv.parse::<::kwk::KvPrecision>() {
        Ok(parsed) => Ok((weights.trim(), Some(parsed))),
        Err(_) => Err(format!(
            "'{spec}' asks for the KV cache '{kv}', which is not one of {types}; write {grammar}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_args_are_paths_or_labelled_paths() {
        let named = |s: &str| parse_gguf_arg(s).map(|f| f.name());
        assert_eq!(named("dir/model.gguf").unwrap(), "gguf:model.gguf");
        assert_eq!(named("q8=dir/model.gguf").unwrap(), "gguf:q8");
        // A '/' before the first '=' makes it a path: a folder named "a=b".
        let FormatSpec::Gguf { path, explicit, .. } = parse_gguf_arg("x/a=b/m.gguf").unwrap()
        else {
            panic!()
        };
        assert_eq!((path, explicit), (PathBuf::from("x/a=b/m.gguf"), false));
        assert!(named("=m.gguf").unwrap_err().contains("empty LABEL"));
        assert!(named("x=").unwrap_err().contains("no PATH"));
        assert!(named("a\tb=m.gguf")
            .unwrap_err()
            .contains("control character"));
        assert_eq!(
            parse_format("gguf:mine=m.gguf").unwrap().name(),
            "gguf:mine"
        );
    }

    /// `FORMAT+kv:TYPE` is a row with its own cache, named with the cache's canonical
    /// name; float32 with a narrower cache is no reference; a bad suffix names the grammar.
    #[test]
    fn a_kv_suffix_gives_a_row_its_own_cache() {
        use ::kwk::KvPrecision as Kv;
        let row = parse_format("float32+kv:q8_0").unwrap();
        assert_eq!(row.name(), "float32+kv:q8");
        assert!(!row.is_reference());
        assert_eq!(row.kwk_kv(Kv::F16), Some(Kv::Q8));
        let FormatSpec::Kwk { precision, .. } = &row else {
            panic!()
        };
        assert_eq!(*precision, ::kwk::Precision::Float32);
        let int8 = parse_format("int8:calib+kv:bf16").unwrap();
        assert_eq!(int8.name(), "int8:calib+kv:bf16");
        assert_eq!(int8.kwk_kv(Kv::Q8), Some(Kv::Bf16));
        // Without a suffix: the run's --kv, and f32 for the reference whatever it is.
        assert_eq!(parse_format("int4").unwrap().kwk_kv(Kv::Q8), Some(Kv::Q8));
        let reference = parse_format("float32").unwrap();
        assert!(reference.is_reference());
        assert_eq!(reference.kwk_kv(Kv::Q8), Some(Kv::F32));
        assert_eq!(
            parse_format("int8+kv:f32").unwrap().kwk_kv(Kv::Q8),
            Some(Kv::F32)
        );
        assert_eq!(parse_format("gguf:m.gguf").unwrap().kwk_kv(Kv::Q8), None);
        let err = |s: &str| parse_format(s).unwrap_err();
        assert_eq!(
            err("float32+kv:q4"),
            "'float32+kv:q4' asks for the KV cache 'q4', which is not one of f32, f16, bf16, q8; write FORMAT+kv:TYPE with TYPE one of f32, f16, bf16, q8 (e.g. float32+kv:q8)"
        );
        assert_eq!(
            err("float32+kv:f32"),
            "'float32+kv:f32' is the float32 reference itself (it keeps an f32 cache); write float32"
        );
        for bad in ["int8+q8", "int8+kv=q8", "int8+kv:q8+kv:f16", "int8+"] {
            assert!(
                err(bad).contains("the one suffix an in-tree format takes is FORMAT+kv:TYPE"),
                "{bad}: {}",
                err(bad)
            );
        }
        assert!(err("+kv:q8").contains("names no weight format"));
        assert!(err("int9+kv:q8").contains("unknown weight format 'int9'"));
        assert!(err("int8+kv:").contains("the KV cache ''"));
    }

    /// With llama.cpp alone a GGUF row keeps its `gguf:` name; with other peers it becomes
    /// one row per engine, named by it; kwk rows are untouched.
    #[test]
    fn gguf_rows_run_once_per_peer_named_by_engine() {
        let q = parse_format("gguf:Q4_K_M=m/q.gguf").unwrap();
        let names = |peers: &[Engine]| -> Vec<String> {
            q.for_peers(peers).iter().map(FormatSpec::name).collect()
        };
        assert_eq!(names(&[Engine::LlamaCpp]), ["gguf:Q4_K_M"]);
        assert_eq!(
            names(&[Engine::LlamaCpp, Engine::Ik]),
            ["llama.cpp:Q4_K_M", "ik:Q4_K_M"]
        );
        assert_eq!(names(&[Engine::Ik]), ["ik:Q4_K_M"]);
        let engines: Vec<Engine> = q
            .for_peers(&[Engine::LlamaCpp, Engine::Ik])
            .iter()
            .map(FormatSpec::engine)
            .collect();
        assert_eq!(engines, [Engine::LlamaCpp, Engine::Ik]);
        let int4 = parse_format("int4").unwrap();
        assert_eq!(int4.for_peers(&[Engine::Ik]), std::slice::from_ref(&int4));
        // results.json names the engine as it did, and the new one as `ik`.
        assert_eq!(serde_json::to_string(&Engine::Ik).unwrap(), "\"ik\"");
        assert_eq!(
            serde_json::from_str::<Engine>("\"llama.cpp\"").unwrap(),
            Engine::LlamaCpp
        );
    }
}
