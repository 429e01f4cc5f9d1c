//! The Runner trait: one engine running one weight format, measured the same way as every
//! other. Implemented by the in-tree decoder (`runner/kwk.rs`, one runner per format) and
//! by llama.cpp (`runner/llamacpp.rs`, one runner per GGUF file). The harness prepares one
//! token stream and one protocol and hands them to every runner, so every figure in a
//! report is measured on the same tokens.

pub mod kwk;
pub mod llamacpp;

use serde::Serialize;
use std::path::PathBuf;

/// What a runner is, for the report. Units are in the field names.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerInfo {
    /// The format name as typed (`int4`, `int4:g128`) or `gguf:<file name>`.
    pub name: String,
    /// `kwk` or `llama.cpp`.
    pub engine: String,
    /// Bytes of weights the runner holds (packed formats) or of the GGUF file.
    pub bytes: u64,
    pub bits_per_weight: f64,
    pub params: u64,
    /// Storage types and their tensor counts (e.g. {"q4_1": 182, "f32": 61}).
    pub type_mix: std::collections::BTreeMap<String, usize>,
    /// Seconds to get ready: reading the model, and packing it into the format.
    pub load_s: Option<f64>,
    pub load_read_s: Option<f64>,
    pub load_pack_s: Option<f64>,
    /// Seconds of the packing spent on calibration (`int4:calib` / `int4:gptq`).
    pub calibration_s: Option<f64>,
    /// KV cache element type the runner used ("f32", "f16").
    pub kv_type: String,
    /// The kernels the runner's weight matmuls run (kwk formats, e.g. `avx512bw`,
    /// `avx512f (convert)`); `None` for engines that do not say.
    pub kernels: Option<String>,
}

/// The token stream every runner is scored on.
#[derive(Debug, Clone)]
pub struct TokenStream {
    /// Token ids of the text (raw bytes, one trailing `\n` stripped, no special tokens
    /// parsed), with the BOS first when `add_bos`.
    pub tokens: Vec<u32>,
    pub add_bos: bool,
    pub bos_id: Option<u32>,
    /// The text file the tokens came from, as llama-perplexity must read it too.
    pub text_path: PathBuf,
}

/// llama-perplexity's chunked protocol, resolved.
#[derive(Debug, Clone, Serialize)]
pub struct PerplexityProtocol {
    pub ctx: usize,
    /// Chunks actually scored (already capped by `floor(tokens/ctx)`).
    pub chunks: usize,
    pub threads: usize,
    /// llama.cpp KL-divergence base file written from the reference runner's logits, when
    /// the report asks for KL divergence against it.
    #[serde(skip)]
    pub reference_logits: Option<PathBuf>,
}

/// KL divergence and agreement against the reference runner's distributions.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReferenceComparison {
    pub kld_mean: f64,
    pub kld_mean_err: f64,
    pub kld_p99: f64,
    pub top1_agreement: f64,
    pub delta_p_rms: f64,
}

#[derive(Debug, Clone, Serialize)]
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
}

/// llama-bench's definitions: pp = `pp` prompt tokens from an empty cache, tg = `tg`
/// single-token steps from an empty cache; one warm-up, then `reps` repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct SpeedSpec {
    pub pp: usize,
    pub tg: usize,
    pub reps: usize,
    pub threads: usize,
}

/// Tokens per second of each repetition, and their mean and sample (n-1) stddev.
#[derive(Debug, Clone, Serialize)]
pub struct SpeedSample {
    pub tokens_per_s: f64,
    pub tokens_per_s_std: f64,
    pub samples_tokens_per_s: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpeedResult {
    pub pp: Option<SpeedSample>,
    pub tg: Option<SpeedSample>,
    /// The engine's raw output when it has one (llama-bench's JSON objects).
    pub raw: Option<serde_json::Value>,
}

/// Progress of a long step: `done` of `total` units (chunks, repetitions).
pub trait Progress {
    fn set_total(&self, total: u64, what: &str);
    fn advance(&self, done: u64);
}

/// A [`Progress`] that shows nothing (tests, and steps too short to show).
pub struct NoProgress;

impl Progress for NoProgress {
    fn set_total(&self, _total: u64, _what: &str) {}
    fn advance(&self, _done: u64) {}
}

/// One engine running one format. Object-safe.
pub trait Runner {
    fn info(&self) -> &RunnerInfo;
    fn perplexity(
        &mut self,
        protocol: &PerplexityProtocol,
        tokens: &TokenStream,
        progress: &dyn Progress,
    ) -> anyhow::Result<PerplexityResult>;
    fn speed(&mut self, spec: &SpeedSpec, progress: &dyn Progress) -> anyhow::Result<SpeedResult>;
}

/// One row a user asked for: an in-tree format or a GGUF file for llama.cpp.
#[derive(Debug, Clone, PartialEq)]
pub enum FormatSpec {
    /// An in-tree format, with the name as typed (`int4:mix8`).
    Kwk {
        name: String,
        precision: ::kwk::Precision,
    },
    /// `gguf:PATH` in `--formats`, or a `--gguf PATH`.
    Gguf { path: PathBuf },
}

impl FormatSpec {
    /// The runner's name in reports: the format as typed, or `gguf:<file name>`.
    pub fn name(&self) -> String {
        match self {
            FormatSpec::Kwk { name, .. } => name.clone(),
            FormatSpec::Gguf { path } => gguf_runner_name(path),
        }
    }
}

/// `gguf:<file name>`, the report name of a llama.cpp runner.
pub fn gguf_runner_name(path: &std::path::Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    format!("gguf:{file}")
}

/// The format names `--formats` accepts, for error messages.
pub const KNOWN_FORMATS: &str =
    "float32, bf16, int8 (or balanced), int4 with options int4:g32|g64|g128, int4:mix6|mix8, int4:calib, int4:gptq, and gguf:PATH";

/// Parses one entry of `--formats`.
pub fn parse_format(spec: &str) -> anyhow::Result<FormatSpec> {
    let spec = spec.trim();
    if let Some(path) = spec.strip_prefix("gguf:") {
        anyhow::ensure!(
            !path.is_empty(),
            "--formats entry 'gguf:' has no path; write gguf:PATH"
        );
        return Ok(FormatSpec::Gguf {
            path: PathBuf::from(path),
        });
    }
    match ::kwk::Precision::parse(spec) {
        Ok(precision) => Ok(FormatSpec::Kwk {
            name: spec.to_string(),
            precision,
        }),
        Err(e) => anyhow::bail!(
            "unknown format '{spec}' in --formats ({e}); known formats: {KNOWN_FORMATS}"
        ),
    }
}

/// Parses `--formats` (comma-separated; `none` or empty for no in-tree runners) and the
/// `--gguf` paths into the runner list, in run order: the in-tree `float32` first (it is the
/// reference the others are compared against), then the other in-tree formats as given,
/// then the GGUF files. A name given twice is an error.
pub fn plan_runners(formats: &str, ggufs: &[PathBuf]) -> anyhow::Result<Vec<FormatSpec>> {
    let mut specs = Vec::new();
    let trimmed = formats.trim();
    if !(trimmed.is_empty() || trimmed == "none") {
        for entry in trimmed.split(',') {
            anyhow::ensure!(
                !entry.trim().is_empty(),
                "--formats '{formats}' has an empty entry; separate formats with single commas"
            );
            specs.push(parse_format(entry)?);
        }
    }
    specs.extend(ggufs.iter().map(|p| FormatSpec::Gguf { path: p.clone() }));
    let mut seen = std::collections::BTreeSet::new();
    for s in &specs {
        anyhow::ensure!(
            seen.insert(s.name()),
            "'{}' is asked for twice (--formats / --gguf); give each format once",
            s.name()
        );
    }
    // Stable: float32 first, in-tree before GGUF, otherwise as given.
    specs.sort_by_key(|s| match s {
        FormatSpec::Kwk {
            precision: ::kwk::Precision::Float32,
            ..
        } => 0,
        FormatSpec::Kwk { .. } => 1,
        FormatSpec::Gguf { .. } => 2,
    });
    Ok(specs)
}

// ---- llama.cpp runners -------------------------------------------------------------------

/// llama.cpp's tools: `--llama-cpp-dir`, then `KWK_LLAMA_CPP_DIR`, then PATH (and the
/// set-up script's cache), each checked for the flags the runner passes.
pub fn llamacpp_tools(dir: Option<&std::path::Path>) -> anyhow::Result<::llamacpp::LlamaCppTools> {
    ::llamacpp::LlamaCppTools::locate(dir).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The tools' build number, for results.json.
pub fn llamacpp_build(tools: &::llamacpp::LlamaCppTools) -> Option<u64> {
    tools.build_number()
}

/// A llama.cpp runner for one GGUF file, with the run's threads and KV cache type;
/// llama-bench runs only with `--llama-bench`.
pub fn llamacpp_runner(
    path: &std::path::Path,
    tools: &::llamacpp::LlamaCppTools,
    cfg: &crate::session::EvalConfig,
) -> anyhow::Result<Box<dyn Runner>> {
    let options = llamacpp::LlamaCppRunnerOptions {
        threads: cfg.threads,
        kv_type: cfg.llama_kv_type,
        run_bench: cfg.llama_bench,
        ..Default::default()
    };
    Ok(Box::new(llamacpp::LlamaCppRunner::new(
        path, tools, options,
    )?))
}
