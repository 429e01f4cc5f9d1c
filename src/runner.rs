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
    /// KV cache element type the runner used ("f32", "f16").
    pub kv_type: String,
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
