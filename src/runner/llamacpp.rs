//! llama.cpp, or its fork ik_llama.cpp, as a [`super::Runner`], one runner per GGUF file
//! and engine. The engine is the tools': the `llamacpp` crate speaks each one's dialect
//! (ik_llama.cpp's rows run with its recommended CPU settings, run-time repacking and flash
//! attention), and the row records the settings it ran with (`engine_flags`).
//!
//! The GGUF is opened with kwk's reader before any subprocess runs, so a truncated file or
//! one that is not GGUF fails at once with a clear error, and the report gets its size,
//! type mix, parameter count, tensor bytes (the sum of its tensors' data sizes, as for kwk
//! formats), file size and bits per weight from the file itself. Perplexity runs
//! llama-perplexity on the harness's text with the harness's context and chunk count, checks
//! with llama-tokenize that llama.cpp sees the same token ids. When the protocol names a
//! reference log-prob file, that one llama-perplexity pass also writes this row's own
//! log-probs (`--kl-divergence-base`, the mode that writes a base file and prints the
//! perplexity), which [`crate::eval::reference::compare_files`] reads against the
//! reference's record by record, exactly as for in-tree rows: one pass per GGUF row gives
//! PPL, KLD, top-1 and the per-token NLL for paired errors. Speed runs llama-bench with one
//! repetition per call (`-r 1`, after its own warm-up), so the harness can interleave its
//! repetitions with the other runners'. All the commands are built by the `llamacpp` crate.

use crate::eval::base_file::LogitsBaseReader;
use crate::eval::reference::compare_files;
use crate::protocol::{
    ComputeKind, Engine, FlashAttnRep, PerplexityProtocol, PerplexityResult, Progress,
    RooflineCost, RunnerInfo, SpeedRep, SpeedSpec, TokenStream,
};
use crate::runner::Runner;
use crate::scratch::Scratch;
use anyhow::{anyhow, bail, Context};
use llamacpp::{
    BenchRequest, ComputeSettings, KvType, LlamaCppTools, PerplexityRequest, TokenizeRequest,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a llama.cpp runner runs its tools.
#[derive(Debug, Clone)]
pub struct LlamaCppRunnerOptions {
    /// `-t` for every tool (llama-perplexity also gets `-tb` with the same value) when the
    /// perplexity protocol or the speed spec says 0; their own thread counts win otherwise.
    pub threads: usize,
    /// KV cache type for llama-perplexity (`-ctk/-ctv`): f16 is llama.cpp's default, f32
    /// gives exact parity with a float32 decoder. llama-bench cannot take f32 and always
    /// runs with f16 (its default), so speeds are llama.cpp's defaults either way.
    pub kv_type: KvType,
    /// `-fa` for llama-perplexity; `None` chooses [`KvType::default_flash_attn`] (on for
    /// f16, which is what llama.cpp's `auto` resolves to on CPU; off for f32).
    pub flash_attn: Option<bool>,
    /// Longest any single tool may run before it is killed (`--tool-timeout`); `None`
    /// scales it with the work: [`scaled_timeout`].
    pub timeout: Option<Duration>,
    /// Whether `speed()` runs llama-bench; when false it reports no speed (`None`s).
    pub run_bench: bool,
    /// llama-bench's flash-attention settings (`--llama-fa`): both, per test the faster
    /// kept by the harness, or one forced. llama-perplexity's `-fa` is `flash_attn`.
    pub bench_fa: llamacpp::BenchFlashAttn,
}

impl Default for LlamaCppRunnerOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kv_type: KvType::F16,
            flash_attn: None,
            timeout: None,
            run_bench: true,
            bench_fa: llamacpp::BenchFlashAttn::Best,
        }
    }
}

/// The floor of [`scaled_timeout`]: loading a model and starting the tool.
pub const TOOL_TIMEOUT_FLOOR: Duration = Duration::from_secs(600);

/// How long a tool that pushes `tokens` tokens through a model of `params` parameters may
/// run when no `--tool-timeout` was given: the time at 1 GFLOP/s (2 flops per parameter per
/// token — far below any machine this runs on, so only a hang reaches it), at least
/// [`TOOL_TIMEOUT_FLOOR`].
pub fn scaled_timeout(params: u64, tokens: usize) -> Duration {
    let secs = 2.0 * params as f64 * tokens as f64 / 1e9;
    TOOL_TIMEOUT_FLOOR.max(Duration::from_secs_f64(secs.min(1e9)))
}

/// The arithmetic llama.cpp's matmuls do on a GGUF: by the storage type holding the most
/// weights, float32 FMA for F32 and F16 (widened), the bf16 dot for BF16, and the int8 dot
/// for quantized types (their CPU kernels quantize activations to 8 bits).
fn compute_kind_of(type_params: &std::collections::BTreeMap<String, u64>) -> ComputeKind {
    let dominant = type_params
        .iter()
        .max_by_key(|(_, &n)| n)
        .map(|(t, _)| t.to_ascii_uppercase());
    match dominant.as_deref() {
        Some("F32") | Some("F16") => ComputeKind::Fp32,
        Some("BF16") => ComputeKind::Bf16,
        _ => ComputeKind::Int8,
    }
}

/// A llama.cpp row's `kernels`: the CPU features its build reports (it picks its own best
/// kernels among those), e.g. `llama.cpp build: AVX AVX2 F16C FMA BMI2` (`ik build: ...`
/// for ik_llama.cpp). SSE3 and SSSE3, which every x86-64 build of it reports, are left out.
fn kernels_label(engine: llamacpp::Engine, features: &[String]) -> String {
    let named: Vec<&str> = features
        .iter()
        .map(String::as_str)
        .filter(|f| !matches!(*f, "SSE3" | "SSSE3"))
        .collect();
    if named.is_empty() {
        format!("{engine} build: no SIMD features")
    } else {
        format!("{engine} build: {}", named.join(" "))
    }
}

/// kwk's tier (`KWK_ISA` name) whose instructions match the best kernels a llama.cpp build
/// with these CPU features can run: its AVX512-VNNI kernels on `vnni`, AVX-512 without VNNI
/// on `avx512bw`, AVX-VNNI on `avxvnni`, AVX2 on `avx2`, none of them on `scalar`.
fn build_tier(features: &[String]) -> &'static str {
    let has = |f: &str| features.iter().any(|x| x == f);
    if has("AVX512") && has("AVX512_VNNI") {
        "vnni"
    } else if has("AVX512") {
        "avx512bw"
    } else if has("AVX2") && has("AVX_VNNI") {
        "avxvnni"
    } else if has("AVX2") {
        "avx2"
    } else {
        "scalar"
    }
}

/// One GGUF file run by llama.cpp (or ik_llama.cpp).
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
        let bench_fa = opts.bench_fa.settings(opts.kv_type)?;
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
        let weight_bytes_per_token = file.weight_bytes_read_per_token();
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
        let engine = tools.engine();
        let info = RunnerInfo {
            name: match engine {
                llamacpp::Engine::LlamaCpp => format!("gguf:{file_name}"),
                llamacpp::Engine::Ik => format!("{engine}:{file_name}"),
            },
            engine: Engine::of_tools(engine),
            tensor_bytes: summary.tensor_bytes,
            file_bytes: Some(summary.file_bytes),
            bits_per_weight: summary.bits_per_weight,
            params: summary.n_params,
            // Lower-case type names, as RunnerInfo documents ("q4_1", "f32").
            type_mix: summary
                .type_counts
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect(),
            load_s: None,
            load_read_s: None,
            load_pack_s: None,
            calibration_s: None,
            kv_type: opts.kv_type.as_str().to_string(),
            kv_bytes_per_token: None,
            kernels: None,
            engine_flags: Some(llamacpp::settings::described(
                engine,
                opts.kv_type,
                opts.flash_attn
                    .unwrap_or_else(|| opts.kv_type.default_flash_attn()),
                opts.run_bench.then_some(&bench_fa[..]),
            )),
            roofline: Some(RooflineCost {
                compute: compute_kind_of(&summary.type_params),
                weight_bytes_per_token,
                // llama-bench runs with this KV type (f16 for f32, which it refuses).
                kv_bytes_per_value: opts.kv_type.for_bench().bytes_per_value(),
                best_kernels: true,
            }),
        };
        Ok(Self {
            gguf: gguf_path.to_path_buf(),
            tools: tools.clone(),
            opts,
            info,
            commands: Vec::new(),
        })
    }

    /// Names the row `name` (the plan's label, e.g. `gguf:a/model.gguf` when two GGUFs
    /// share a file name, or `gguf:LABEL` from `--gguf LABEL=PATH`) instead of
    /// `gguf:<file name>`.
    pub fn with_name(mut self, name: String) -> Self {
        self.info.name = name;
        self
    }

    /// The tool command lines this runner has run, in order.
    pub fn commands(&self) -> &[String] {
        &self.commands
    }

    /// The tool timeout for pushing `tokens` tokens through this model.
    fn timeout(&self, tokens: usize) -> Duration {
        self.opts
            .timeout
            .unwrap_or_else(|| scaled_timeout(self.info.params, tokens))
    }

    /// `asked`, or the runner's own thread count when the caller says 0.
    fn threads(&self, asked: usize) -> usize {
        if asked > 0 {
            asked
        } else {
            self.opts.threads
        }
    }

    fn compute(&self, threads: usize) -> ComputeSettings {
        let mut c = ComputeSettings::new(threads, self.opts.kv_type);
        if let Some(fa) = self.opts.flash_attn {
            c.flash_attn = fa;
        }
        c
    }

    /// Whether llama-tokenize gives the harness's ids; `None` when llama-tokenize is absent.
    fn check_tokens(
        &mut self,
        tokens: &TokenStream,
        progress: &dyn Progress,
    ) -> anyhow::Result<Option<bool>> {
        if self.tools.tokenize_path().is_none() {
            return Ok(None);
        }
        let run = llamacpp::run_tokenize(
            &self.tools,
            &TokenizeRequest {
                model: self.gguf.clone(),
                text: tokens.text_path.clone(),
                timeout: self.timeout(tokens.tokens.len()),
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
            progress.message(&format!(
                "warning: {}: llama.cpp tokenizes {} to {} tokens, kwk-eval to {}; first \
                 difference at position {first}. Its perplexity is not over the same tokens.",
                self.info.name,
                tokens.text_path.display(),
                run.ids.len(),
                tokens.tokens.len()
            ));
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
        let plan = protocol.plan;
        plan.check_covers(tokens.tokens.len())
            .map_err(|e| anyhow!("{}: {e}", tokens.text_path.display()))?;
        // The tools read the text by path: it must still be the bytes the tokens came from.
        if let Some(sha) = &tokens.text_sha256 {
            crate::text::check_copy(&tokens.text_path, sha)?;
        }
        let tokens_match = self.check_tokens(tokens, progress)?;
        let compute = self.compute(self.threads(protocol.threads));
        let mut req = PerplexityRequest::new(
            self.gguf.clone(),
            tokens.text_path.clone(),
            plan.ctx,
            compute,
        );
        req.chunks = Some(plan.chunks);
        req.timeout = self.timeout(plan.chunks.saturating_mul(plan.ctx));
        // This row's own log-probs, next to the reference's: a fresh file of this run
        // (exclusive create, a kwk name bounded in length whatever the row's name), which
        // llama-perplexity writes into. Whatever happens below (a failed, timed-out or
        // interrupted tool, a short run), it does not outlive this call.
        let own = match &protocol.reference_logits {
            Some(base) => {
                let dir = match &protocol.logits_dir {
                    Some(d) => d.as_path(),
                    None => base.parent().unwrap_or(Path::new(".")),
                };
                let mut s = Scratch::create(dir, &format!("{}.logprobs.bin", self.info.name))?;
                s.close();
                Some(s)
            }
            None => None,
        };
        req.save_logits = own.as_ref().map(|s| s.path().to_path_buf());
        progress.set_total(plan.chunks as u64, "chunks");
        let run =
            llamacpp::run_perplexity(&self.tools, &req, |done| progress.advance(done as u64))?;
        self.commands.push(run.command.clone());
        if run.attempts > 1 {
            progress.message(&format!(
                "note: {}: llama-perplexity's output was cut short {} time(s) (its logger loses \
                 the last lines at exit on a busy machine); the result is from a complete run",
                self.info.name,
                run.attempts - 1
            ));
        }
        if let Some(sha) = &tokens.text_sha256 {
            crate::text::check_copy(&tokens.text_path, sha)
                .with_context(|| format!("{}: after llama-perplexity ran", self.info.name))?;
        }
        let peak_rss_bytes = run.max_rss_bytes;
        let out = run.output;
        if out.running.len() != plan.chunks {
            bail!(
                "{}: llama-perplexity scored {} chunks, the protocol asked for {} (command: {})",
                self.info.name,
                out.running.len(),
                plan.chunks,
                run.command
            );
        }
        if self.info.load_s.is_none() {
            self.info.load_s = out.ready_s;
        }
        if let (None, Some(features)) = (&self.info.kernels, &out.cpu_features) {
            self.info.kernels = Some(kernels_label(self.tools.engine(), features));
            // A build limited to the tier kwk was forced onto (`setup-llama-cpp.sh --isa`)
            // is put against that tier's ceilings, not the best tier's.
            let active = kwk::kernels::active_isa();
            if active != kwk::kernels::best_isa() && build_tier(features) == active.name() {
                if let Some(r) = self.info.roofline.as_mut() {
                    r.best_kernels = false;
                }
            }
        }
        let (reference, scores) = match (own, &protocol.reference_logits) {
            (Some(own), Some(base)) => {
                let n_vocab = LogitsBaseReader::open(base)?.header.n_vocab;
                let compared = compare_files(own.path(), base, &plan, n_vocab, &tokens.tokens)
                    .with_context(|| format!("{}: comparing with the reference", self.info.name));
                drop(own);
                let (c, s) = compared?;
                (Some(c), Some(s))
            }
            _ => (None, None),
        };
        Ok(PerplexityResult {
            ppl: out.ppl,
            ppl_err: out.ppl_err,
            running: out.running,
            scored_tokens: plan.scored_tokens(),
            tokens_match,
            reference,
            tokens: scores,
            peak_rss_bytes,
        })
    }

    fn speed_rep(&mut self, spec: &SpeedSpec) -> anyhow::Result<Option<SpeedRep>> {
        // No llama-bench, or one without -d (ik's) at a depth: left empty, not timed at d0.
        if !self.opts.run_bench || (spec.depth > 0 && !self.tools.bench_knows_depth()) {
            return Ok(None);
        }
        // The row's KV type (`--llama-kv`; f16 for f32, which llama-bench rejects) and the
        // flash-attention settings of `--llama-fa` (both, `-fa 0,1`, under `best`).
        let compute =
            ComputeSettings::new(self.threads(spec.threads), self.opts.kv_type.for_bench());
        let flash_attn = self.opts.bench_fa.settings(self.opts.kv_type)?;
        let settings = flash_attn.len();
        let req = BenchRequest {
            model: self.gguf.clone(),
            pp: spec.pp,
            tg: spec.tg,
            depth: spec.depth,
            reps: 1,
            compute,
            flash_attn,
            // One warm-up run and one timed run of pp + tg tokens, each test after its
            // prefill of `depth` tokens, at each flash-attention setting.
            timeout: self.timeout(
                spec.pp
                    .saturating_add(spec.tg)
                    .saturating_mul(2)
                    .saturating_add(spec.depth.saturating_mul(2))
                    .saturating_mul(settings),
            ),
        };
        let run = llamacpp::run_bench(&self.tools, &req, |_, _| {})?;
        self.commands.push(run.command.clone());
        let one = |t: Option<&llamacpp::BenchTest>| -> anyhow::Result<Option<f64>> {
            match t {
                None => Ok(None),
                Some(t) => match t.samples_ts.as_slice() {
                    [v] => Ok(Some(*v)),
                    other => bail!(
                        "llama-bench -r 1 printed {} samples, not 1 ({})",
                        other.len(),
                        run.command
                    ),
                },
            }
        };
        let by_flash_attn = req
            .fa_settings()
            .into_iter()
            .map(|fa| {
                let at = Some(fa).filter(|_| settings > 1);
                Ok(FlashAttnRep {
                    flash_attn: fa,
                    pp: one(run.output.pp_at(at))?,
                    tg: one(run.output.tg_at(at))?,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Some(SpeedRep {
            pp: None,
            tg: None,
            raw: Some(serde_json::Value::Array(run.output.raw.clone())),
            by_flash_attn,
        }))
    }
}

#[cfg(test)]
#[path = "llamacpp_tests.rs"]
mod tests;
