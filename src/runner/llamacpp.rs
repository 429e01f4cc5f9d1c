//! llama.cpp as a [`super::Runner`], one runner per GGUF file.
//!
//! The GGUF is opened with kwk's reader before any subprocess runs, so a truncated file or
//! one that is not GGUF fails at once with a clear error, and the report gets its size,
//! type mix, parameter count and bits per weight from the file itself. Perplexity runs
//! llama-perplexity on the harness's text with the harness's context and chunk count, checks
//! with llama-tokenize that llama.cpp sees the same token ids, and, when the protocol names
//! a KL-divergence base file, runs llama-perplexity's KL-divergence mode against it. Speed
//! runs llama-bench. All the commands are built by the `llamacpp` crate.

use crate::runner::{
    PerplexityProtocol, PerplexityResult, Progress, ReferenceComparison, Runner, RunnerInfo,
    SpeedResult, SpeedSample, SpeedSpec, TokenStream,
};
use anyhow::{bail, Context};
use llamacpp::{
    BenchRequest, ComputeSettings, KlDivergenceRequest, KvType, LlamaCppTools, PerplexityRequest,
    TokenizeRequest,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a llama.cpp runner runs its tools.
#[derive(Debug, Clone)]
pub struct LlamaCppRunnerOptions {
    /// `-t` for every tool (llama-perplexity also gets `-tb` with the same value). The
    /// perplexity protocol's and the speed spec's thread counts take precedence when given.
    pub threads: usize,
    /// KV cache type for llama-perplexity (`-ctk/-ctv`): f16 is llama.cpp's default, f32
    /// gives exact parity with a float32 decoder. llama-bench cannot take f32 and always
    /// runs with f16 (its default), so speeds are llama.cpp's defaults either way.
    pub kv_type: KvType,
    /// `-fa` for llama-perplexity; `None` chooses [`KvType::default_flash_attn`] (on for
    /// f16, which is what llama.cpp's `auto` resolves to on CPU; off for f32).
    pub flash_attn: Option<bool>,
    /// Longest any single tool may run before it is killed.
    pub timeout: Duration,
    /// Whether `speed()` runs llama-bench; when false it reports no speed (`None`s).
    pub run_bench: bool,
}

impl Default for LlamaCppRunnerOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kv_type: KvType::F16,
            flash_attn: None,
            timeout: Duration::from_secs(3600),
            run_bench: true,
        }
    }
}

/// One GGUF file run by llama.cpp.
pub struct LlamaCppRunner {
    gguf: PathBuf,
    tools: LlamaCppTools,
    opts: LlamaCppRunnerOptions,
    info: RunnerInfo,
    /// The commands run so far, for the record.
    commands: Vec<String>,
}

impl LlamaCppRunner {
    /// Opens `gguf_path` with kwk's GGUF reader (so a bad file fails here, before any
    /// subprocess) and prepares a runner for it.
    pub fn new(
        gguf_path: &Path,
        tools: &LlamaCppTools,
        opts: LlamaCppRunnerOptions,
    ) -> anyhow::Result<Self> {
        if opts.threads == 0 {
            bail!("llama.cpp runner: threads must be at least 1");
        }
        let meta = std::fs::metadata(gguf_path)
            .with_context(|| format!("GGUF file {}", gguf_path.display()))?;
        if !meta.is_file() {
            bail!(
                "{} is not a file; --gguf takes the path of a .gguf model file",
                gguf_path.display()
            );
        }
        let file = kwk::gguf::GgufFile::open(gguf_path).with_context(|| {
            format!(
                "{} cannot be run by llama.cpp; pass a complete GGUF model file",
                gguf_path.display()
            )
        })?;
        let summary = file.summary();
        drop(file);
        if summary.n_params == 0 {
            bail!(
                "{}: the GGUF holds no tensors, so it is not a model llama.cpp can run",
                gguf_path.display()
            );
        }
        let file_name = gguf_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| gguf_path.display().to_string());
        let info = RunnerInfo {
            name: format!("gguf:{file_name}"),
            engine: "llama.cpp".to_string(),
            bytes: summary.file_bytes,
            bits_per_weight: summary.bits_per_weight,
            params: summary.n_params,
            type_mix: summary.type_counts.into_iter().collect(),
            load_s: None,
            load_read_s: None,
            load_pack_s: None,
            kv_type: opts.kv_type.as_str().to_string(),
        };
        Ok(Self {
            gguf: gguf_path.to_path_buf(),
            tools: tools.clone(),
            opts,
            info,
            commands: Vec::new(),
        })
    }

    /// The tool command lines this runner has run, in order.
    pub fn commands(&self) -> &[String] {
        &self.commands
    }

    fn compute(&self, threads: usize) -> ComputeSettings {
        let mut c = ComputeSettings::new(threads, self.opts.kv_type);
        if let Some(fa) = self.opts.flash_attn {
            c.flash_attn = fa;
        }
        c
    }

    /// Whether llama-tokenize gives the harness's ids; `None` when llama-tokenize is absent.
    fn check_tokens(&mut self, tokens: &TokenStream) -> anyhow::Result<Option<bool>> {
        if self.tools.tokenize_path().is_none() {
            return Ok(None);
        }
        let run = llamacpp::run_tokenize(
            &self.tools,
            &TokenizeRequest {
                model: self.gguf.clone(),
                text: tokens.text_path.clone(),
                timeout: self.opts.timeout,
            },
        )?;
        self.commands.push(run.command.clone());
        let same = run.ids == tokens.tokens;
        if !same {
            let first = run
                .ids
                .iter()
                .zip(&tokens.tokens)
                .position(|(a, b)| a != b)
                .unwrap_or(run.ids.len().min(tokens.tokens.len()));
            eprintln!(
                "warning: {}: llama.cpp tokenizes {} to {} tokens, kwk-eval to {}; first \
                 difference at position {first}. Its perplexity is not over the same tokens.",
                self.info.name,
                tokens.text_path.display(),
                run.ids.len(),
                tokens.tokens.len()
            );
        }
        Ok(Some(same))
    }
}

impl Runner for LlamaCppRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn perplexity(
        &mut self,
        protocol: &PerplexityProtocol,
        tokens: &TokenStream,
        progress: &dyn Progress,
    ) -> anyhow::Result<PerplexityResult> {
        let ctx = protocol.ctx;
        // llama-perplexity itself only says so in log lines that its asynchronous logger can
        // lose; check here, with the harness's token count.
        if tokens.tokens.len() < 2 * ctx {
            bail!(
                "{}: the text has {} tokens but a context of {ctx} needs at least {} \
                 (llama-perplexity's minimum); use a longer text or a smaller --ctx",
                tokens.text_path.display(),
                tokens.tokens.len(),
                2 * ctx
            );
        }
        let tokens_match = self.check_tokens(tokens)?;
        let compute = self.compute(protocol.threads.max(1));

        let mut req = PerplexityRequest::new(
            self.gguf.clone(),
            tokens.text_path.clone(),
            ctx,
            compute.clone(),
        );
        req.chunks = Some(protocol.chunks);
        req.timeout = self.opts.timeout;
        progress.set_total(protocol.chunks as u64, "chunks");
        let run =
            llamacpp::run_perplexity(&self.tools, &req, |done| progress.advance(done as u64))?;
        self.commands.push(run.command.clone());
        if run.attempts > 1 {
            eprintln!(
                "note: {}: llama-perplexity's output was cut short {} time(s) (its logger loses \
                 the last lines at exit on a busy machine); the result is from a complete run",
                self.info.name,
                run.attempts - 1
            );
        }
        let out = run.output;
        if out.running.len() != protocol.chunks {
            bail!(
                "{}: llama-perplexity scored {} chunks, the protocol asked for {} (command: {})",
                self.info.name,
                out.running.len(),
                protocol.chunks,
                run.command
            );
        }
        if self.info.load_s.is_none() {
            self.info.load_s = out.ready_s;
        }

        let reference = match &protocol.reference_logits {
            None => None,
            Some(base) => {
                let req = KlDivergenceRequest {
                    model: self.gguf.clone(),
                    base: base.clone(),
                    ctx,
                    compute,
                    timeout: self.opts.timeout,
                    attempts: 4,
                };
                progress.set_total(protocol.chunks as u64, "chunks (KL divergence)");
                let kld = llamacpp::run_kl_divergence(&self.tools, &req, |done| {
                    progress.advance(done as u64)
                })?;
                self.commands.push(kld.command.clone());
                let s = kld.stats;
                if s.n_ctx.is_some_and(|n| n != ctx) {
                    bail!(
                        "{}: the KL-divergence base file {} was written with a context of {:?}, \
                         this run uses {ctx}",
                        self.info.name,
                        base.display(),
                        s.n_ctx
                    );
                }
                Some(ReferenceComparison {
                    kld_mean: s.kld_mean.value,
                    kld_mean_err: s.kld_mean.err,
                    kld_p99: s.kld_p99,
                    top1_agreement: s.same_top_pct.value / 100.0,
                    delta_p_rms: s.rms_delta_p_pct.value / 100.0,
                })
            }
        };

        Ok(PerplexityResult {
            ppl: out.ppl,
            ppl_err: out.ppl_err,
            running: out.running,
            scored_tokens: protocol.chunks * (ctx - ctx / 2 - 1),
            tokens_match,
            reference,
        })
    }

    fn speed(&mut self, spec: &SpeedSpec, progress: &dyn Progress) -> anyhow::Result<SpeedResult> {
        if !self.opts.run_bench {
            return Ok(SpeedResult {
                pp: None,
                tg: None,
                raw: None,
            });
        }
        // llama-bench's own defaults for what it cannot or should not change: f16 KV (it
        // rejects f32) and flash attention as `auto` resolves on CPU (on).
        let compute = ComputeSettings::new(spec.threads.max(1), KvType::F16);
        let req = BenchRequest {
            model: self.gguf.clone(),
            pp: spec.pp,
            tg: spec.tg,
            reps: spec.reps,
            compute,
            timeout: self.opts.timeout,
        };
        let total = spec.reps * (usize::from(spec.pp > 0) + usize::from(spec.tg > 0));
        progress.set_total(total as u64, "repetitions");
        let run = llamacpp::run_bench(&self.tools, &req, |started, _| {
            progress.advance(started as u64)
        })?;
        self.commands.push(run.command.clone());
        let sample = |t: &llamacpp::BenchTest| SpeedSample {
            tokens_per_s: t.avg_ts,
            tokens_per_s_std: t.stddev_ts,
            samples_tokens_per_s: t.samples_ts.clone(),
        };
        Ok(SpeedResult {
            pp: run.output.pp.as_ref().map(sample),
            tg: run.output.tg.as_ref().map(sample),
            raw: Some(serde_json::Value::Array(run.output.raw)),
        })
    }
}
