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
    ComputeKind, Engine, PerplexityProtocol, PerplexityResult, Progress, RooflineCost, RunnerInfo,
    SpeedRep, SpeedSpec, TokenStream,
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
}

impl Default for LlamaCppRunnerOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kv_type: KvType::F16,
            flash_attn: None,
            timeout: None,
            run_bench: true,
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
                opts.run_bench,
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
        // The row's KV type (`--llama-kv`; f16 for f32, which llama-bench rejects) and flash
        // attention as `auto` resolves on CPU (on).
        let compute =
            ComputeSettings::new(self.threads(spec.threads), self.opts.kv_type.for_bench());
        let req = BenchRequest {
            model: self.gguf.clone(),
            pp: spec.pp,
            tg: spec.tg,
            depth: spec.depth,
            reps: 1,
            compute,
            // One warm-up run and one timed run of pp + tg tokens, each test after its
            // prefill of `depth` tokens.
            timeout: self.timeout(
                spec.pp
                    .saturating_add(spec.tg)
                    .saturating_mul(2)
                    .saturating_add(spec.depth.saturating_mul(2)),
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
        Ok(Some(SpeedRep {
            pp: one(run.output.pp.as_ref())?,
            tg: one(run.output.tg.as_ref())?,
            raw: Some(serde_json::Value::Array(run.output.raw.clone())),
        }))
    }
}

#[cfg(test)]
mod tests {
    //! Bad GGUFs fail before any subprocess (a fake tool directory whose tools would fail
    //! loudly if run), and live runs on the tiny fixture and on SmolLM2.
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_build_names_its_features_and_the_tier_they_match() {
        let f = |names: &str| names.split(' ').map(String::from).collect::<Vec<_>>();
        // This Zen 5's native build, then the `setup-llama-cpp.sh --isa` builds.
        let native = f(
            "SSE3 SSSE3 AVX AVX_VNNI AVX2 F16C FMA BMI2 AVX512 AVX512_VBMI \
                        AVX512_VNNI AVX512_BF16 LLAMAFILE OPENMP REPACK",
        );
        assert_eq!(build_tier(&native), "vnni");
        assert_eq!(
            kernels_label(llamacpp::Engine::LlamaCpp, &native),
            "llama.cpp build: AVX AVX_VNNI AVX2 F16C FMA BMI2 AVX512 AVX512_VBMI AVX512_VNNI \
             AVX512_BF16 LLAMAFILE OPENMP REPACK"
        );
        let bw = f("SSE3 SSSE3 AVX AVX2 F16C FMA BMI2 AVX512 LLAMAFILE OPENMP REPACK");
        assert_eq!(build_tier(&bw), "avx512bw");
        let vnni256 = f("SSE3 SSSE3 AVX AVX_VNNI AVX2 F16C FMA BMI2 LLAMAFILE");
        assert_eq!(build_tier(&vnni256), "avxvnni");
        assert_eq!(build_tier(&f("SSE3 SSSE3 AVX AVX2 F16C FMA BMI2")), "avx2");
        // AVX-VNNI without AVX2 is no tier of kwk's: the build's best is plain AVX.
        assert_eq!(build_tier(&f("AVX AVX_VNNI")), "scalar");
        assert_eq!(build_tier(&f("LLAMAFILE OPENMP REPACK")), "scalar");
        assert_eq!(
            kernels_label(llamacpp::Engine::LlamaCpp, &[]),
            "llama.cpp build: no SIMD features"
        );
        assert_eq!(
            kernels_label(llamacpp::Engine::LlamaCpp, &f("SSE3 SSSE3")),
            "llama.cpp build: no SIMD features"
        );
    }

    #[test]
    fn scaled_timeout_is_one_gflops_time_with_a_floor_and_no_overflow() {
        // 135M parameters × 10,240 tokens × 2 flops = 2765 GFLOP: 2765 s at 1 GFLOP/s.
        let t = scaled_timeout(135_000_000, 10_240);
        assert_eq!(t.as_secs(), 2764);
        // A small job gets the floor, not seconds.
        assert_eq!(scaled_timeout(135_000_000, 512), TOOL_TIMEOUT_FLOOR);
        assert_eq!(scaled_timeout(0, 0), TOOL_TIMEOUT_FLOOR);
        // Twice the tokens, twice the time (above the floor).
        let (a, b) = (
            scaled_timeout(1_700_000_000, 4096),
            scaled_timeout(1_700_000_000, 8192),
        );
        assert!((b.as_secs_f64() / a.as_secs_f64() - 2.0).abs() < 1e-9);
        // Absurd sizes saturate at a finite bound instead of panicking in Duration.
        let huge = scaled_timeout(u64::MAX, usize::MAX);
        assert_eq!(huge.as_secs(), 1_000_000_000);
    }

    struct Counter {
        total: Cell<u64>,
        done: Cell<u64>,
    }
    impl Progress for Counter {
        fn set_total(&self, total: u64, _what: &str) {
            self.total.set(total);
        }
        fn advance(&self, done: u64) {
            self.done.set(done);
        }
        fn message(&self, _line: &str) {}
    }
    fn counter() -> Counter {
        Counter {
            total: Cell::new(0),
            done: Cell::new(0),
        }
    }

    /// The tiny fixture models and `eval.txt`, generated by kwk-fixtures.
    fn fixtures() -> &'static Path {
        kwk_fixtures::dir()
    }

    /// A tool directory whose tools pass the version/help probes but abort any real run,
    /// so a test proves no model run was attempted.
    fn fake_tools(dir: &Path) -> LlamaCppTools {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("runners/llamacpp/tests/data");
        for (tool, help) in [
            ("llama-perplexity", "llama-perplexity-help.txt"),
            ("llama-bench", "llama-bench-help.txt"),
            ("llama-tokenize", "llama-tokenize-help.txt"),
        ] {
            let script = format!(
                "#!/bin/sh\ncase \"$1\" in\n--version) echo 'version: 0.5.0-dev (build 0, commit unknown)' >&2; exit 0;;\n\
                 --help) cat '{}'; exit 0;;\nesac\necho 'fake tool must not run a model' >&2\nexit 99\n",
                data.join(help).display()
            );
            let p = dir.join(tool);
            llamacpp::process::write_executable(&p, &script).unwrap();
        }
        LlamaCppTools::locate(Some(dir)).unwrap()
    }

    #[test]
    fn bad_gguf_fails_before_any_subprocess() {
        let tmp = tempfile::tempdir().unwrap();
        let tools = fake_tools(tmp.path());
        let opts = LlamaCppRunnerOptions::default();

        let not_gguf = tmp.path().join("not.gguf");
        std::fs::write(&not_gguf, b"this is a text file, not a model\n").unwrap();
        let e = format!(
            "{:#}",
            LlamaCppRunner::new(&not_gguf, &tools, opts.clone())
                .err()
                .unwrap()
        );
        assert!(
            e.contains("not.gguf") && e.contains("not a GGUF file"),
            "{e}"
        );

        let full = std::fs::read(fixtures().join("tiny-llama/model.gguf")).unwrap();
        let truncated = tmp.path().join("truncated.gguf");
        std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
        let e = format!(
            "{:#}",
            LlamaCppRunner::new(&truncated, &tools, opts.clone())
                .err()
                .unwrap()
        );
        assert!(
            e.contains("truncated.gguf") && e.contains("truncated"),
            "{e}"
        );

        let missing = tmp.path().join("missing.gguf");
        let e = format!(
            "{:#}",
            LlamaCppRunner::new(&missing, &tools, opts.clone())
                .err()
                .unwrap()
        );
        assert!(e.contains("missing.gguf"), "{e}");

        let e = format!(
            "{:#}",
            LlamaCppRunner::new(tmp.path(), &tools, opts).err().unwrap()
        );
        assert!(e.contains("is not a file"), "{e}");
    }

    #[test]
    fn info_comes_from_the_gguf() {
        let tmp = tempfile::tempdir().unwrap();
        let tools = fake_tools(tmp.path());
        let path = fixtures().join("tiny-llama/model.gguf");
        let r = LlamaCppRunner::new(&path, &tools, LlamaCppRunnerOptions::default()).unwrap();
        let info = r.info();
        assert_eq!(info.name, "gguf:model.gguf");
        assert_eq!(info.engine, Engine::LlamaCpp);
        assert_eq!(
            info.file_bytes,
            Some(std::fs::metadata(&path).unwrap().len())
        );
        // llama-bench's model_size for this fixture: the tensor data alone.
        assert_eq!(info.tensor_bytes, 476_416);
        // llama-bench reports this fixture as model_n_params 119104, model_size 476416
        // (tests/data/tiny-llama-bench.json): all F32, so 32 bits per weight.
        assert_eq!(info.params, 119_104);
        assert!((info.bits_per_weight - 32.0).abs() < 1e-9);
        assert_eq!(
            info.type_mix.get("f32").copied(),
            Some(info.type_mix.values().sum())
        );
        assert_eq!(info.kv_type, "f16");
        assert_eq!(info.load_s, None);
    }

    #[test]
    fn too_short_text_is_an_error_before_llama_perplexity_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let tools = fake_tools(tmp.path());
        let path = fixtures().join("tiny-llama/model.gguf");
        let mut r = LlamaCppRunner::new(&path, &tools, LlamaCppRunnerOptions::default()).unwrap();
        let protocol = PerplexityProtocol {
            plan: crate::protocol::ChunkPlan {
                ctx: 64,
                chunks: 1,
                first: 32,
            },
            threads: 1,
            reference_logits: None,
            logits_dir: None,
        };
        let tokens = TokenStream {
            tokens: vec![1; 127],
            add_bos: false,
            bos_id: None,
            text_path: tmp.path().join("short.txt"),
            text_sha256: None,
        };
        let e = format!(
            "{:#}",
            r.perplexity(&protocol, &tokens, &counter()).unwrap_err()
        );
        assert!(
            e.contains("tokenizes to 127") && e.contains("at least 128"),
            "{e}"
        );
        assert!(r.commands().is_empty());
    }

    /// The llama.cpp tools for live tests: `KWK_LLAMA_CPP_DIR`, PATH, or the setup script's
    /// cache; a clear failure naming the setup script when none is there.
    fn live_tools() -> LlamaCppTools {
        LlamaCppTools::locate(None).unwrap_or_else(|e| {
            panic!("live test needs llama.cpp's tools: {e}\n(run scripts/setup-llama-cpp.sh)")
        })
    }

    fn ids_of(tools: &LlamaCppTools, model: &Path, text: &Path) -> Vec<u32> {
        llamacpp::run_tokenize(
            tools,
            &TokenizeRequest {
                model: model.to_path_buf(),
                text: text.to_path_buf(),
                timeout: Duration::from_secs(600),
            },
        )
        .unwrap()
        .ids
    }

    #[test]
    fn live_tiny_llama_perplexity_matches_golden() {
        let tools = live_tools();
        let model = fixtures().join("tiny-llama/model.gguf");
        let text = fixtures().join("eval.txt");
        let golden: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixtures().join("tiny-llama/golden.json")).unwrap(),
        )
        .unwrap();
        let opts = LlamaCppRunnerOptions {
            threads: 2,
            kv_type: KvType::F32,
            flash_attn: None,
            timeout: Some(Duration::from_secs(600)),
            run_bench: true,
        };
        let mut r = LlamaCppRunner::new(&model, &tools, opts).unwrap();
        let ids = ids_of(&tools, &model, &text);
        assert_eq!(ids.len() as u64, golden["n_tokens"].as_u64().unwrap());
        let probe: Vec<u32> = golden["probe_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(&ids[..probe.len()], &probe[..]);
        let mut tokens = TokenStream {
            tokens: ids,
            add_bos: false,
            bos_id: None,
            text_path: text.clone(),
            text_sha256: None,
        };
        let protocol = PerplexityProtocol {
            plan: crate::protocol::ChunkPlan::new(tokens.tokens.len(), 64, Some(8)).unwrap(),
            threads: 2,
            reference_logits: None,
            logits_dir: None,
        };
        let progress = counter();
        let res = r.perplexity(&protocol, &tokens, &progress).unwrap();
        let want = golden["perplexity"]["ppl"].as_f64().unwrap();
        // llama-perplexity prints 4 decimals; measured within 1e-7 of the generated golden.
        assert!(
            ((res.ppl - want) / want).abs() < 5e-7,
            "{} vs {want}",
            res.ppl
        );
        assert_eq!(res.running.len(), 8);
        assert_eq!(
            res.scored_tokens,
            golden["perplexity"]["scored"].as_u64().unwrap() as usize
        );
        assert_eq!(res.tokens_match, Some(true));
        assert_eq!((progress.total.get(), progress.done.get()), (8, 8));
        let cmd = &r.commands()[1];
        for flag in [
            "-c 64",
            "-b 64",
            "-ub 64",
            "--chunks 8",
            "-ngl 0",
            "-fa off",
            "-ctk f32",
            "-ctv f32",
            "-t 2",
            "-tb 2",
        ] {
            assert!(cmd.contains(flag), "{flag} missing from {cmd}");
        }
        assert!(r.info().load_s.is_some_and(|s| s > 0.0));

        // Different ids than llama.cpp's: reported, not hidden.
        tokens.tokens[100] ^= 1;
        let res = r.perplexity(&protocol, &tokens, &counter()).unwrap();
        assert_eq!(res.tokens_match, Some(false));

        // Speed: one llama-bench repetition per call (-r 1), its JSON kept.
        let spec = SpeedSpec {
            pp: 32,
            tg: 4,
            depth: 0,
            reps: 2,
            threads: 2,
        };
        let s = r.speed_rep(&spec).unwrap().unwrap();
        assert!(s.pp.unwrap() > 0.0 && s.tg.unwrap() > 0.0);
        let raw = s.raw.unwrap();
        assert_eq!(raw.as_array().unwrap().len(), 2);
        assert_eq!(raw[0]["n_threads"], 2);
        assert_eq!(raw[0]["n_gpu_layers"], 0);
        assert_eq!(raw[0]["samples_ts"].as_array().unwrap().len(), 1);
        assert!(r.commands().last().unwrap().contains("-r 1"));
    }

    /// The SmolLM2 figures for the report: every GGUF made by scripts/setup-model.sh, on
    /// wikitext-2 (ctx 512, 40 chunks, 2 threads), KL divergence against the F32 GGUF, and
    /// llama-bench pp512/tg128. Slow (tens of minutes): run by hand with
    /// `cargo test -p kwk-eval --lib smollm2_table -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn smollm2_table() {
        let tools = live_tools();
        let models = kwk::paths::default_models_dir()
            .expect("none of KWK_MODELS_DIR, KWK_CACHE, XDG_CACHE_HOME, HOME is set")
            .join("SmolLM2-135M-Instruct");
        assert!(
            models.join("SmolLM2-135M-Instruct-F32.gguf").is_file(),
            "{} lacks the GGUFs; run scripts/setup-model.sh",
            models.display()
        );
        let text =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/wikitext-2-raw/wiki.test.raw");
        let f32_model = models.join("SmolLM2-135M-Instruct-F32.gguf");
        let tokens = TokenStream {
            tokens: ids_of(&tools, &f32_model, &text),
            add_bos: false,
            bos_id: None,
            text_path: text.clone(),
            text_sha256: None,
        };
        let base = std::env::temp_dir().join("kwk-smollm2-f32-c512-40.kld");
        let chunks = 40;
        let threads = 2;
        if !base.is_file() {
            let mut req = PerplexityRequest::new(
                f32_model.clone(),
                text.clone(),
                512,
                ComputeSettings::new(threads, KvType::F16),
            );
            req.chunks = Some(chunks);
            req.save_logits = Some(base.clone());
            let run = llamacpp::run_perplexity(&tools, &req, |_| {}).unwrap();
            eprintln!("base: {} -> PPL {}", run.command, run.output.ppl);
        }
        let reps: usize = std::env::var("KWK_BENCH_REPS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(3);
        // KWK_TABLE_TYPES picks GGUFs (default: all six); KWK_TABLE_KLD=0 skips the KL
        // divergence runs (they take as long as the perplexity runs).
        let types = std::env::var("KWK_TABLE_TYPES")
            .unwrap_or_else(|_| "F32,BF16,Q8_0,Q4_K_M,Q4_1,Q4_0".to_string());
        let with_kld = std::env::var("KWK_TABLE_KLD").map_or(true, |v| v != "0");
        let with_bench = std::env::var("KWK_TABLE_BENCH").map_or(true, |v| v != "0");
        for ty in types.split(',') {
            let model = models.join(format!("SmolLM2-135M-Instruct-{ty}.gguf"));
            let mut r = LlamaCppRunner::new(
                &model,
                &tools,
                LlamaCppRunnerOptions {
                    threads,
                    kv_type: KvType::F16,
                    flash_attn: None,
                    timeout: Some(Duration::from_secs(3600)),
                    run_bench: with_bench,
                },
            )
            .unwrap();
            let protocol = PerplexityProtocol {
                plan: crate::protocol::ChunkPlan::new(tokens.tokens.len(), 512, Some(chunks))
                    .unwrap(),
                threads,
                reference_logits: (with_kld && ty != "F32").then(|| base.clone()),
                logits_dir: None,
            };
            let p = r.perplexity(&protocol, &tokens, &counter()).unwrap();
            let spec = SpeedSpec {
                pp: 512,
                tg: 128,
                depth: 0,
                reps,
                threads,
            };
            let (mut pps, mut tgs) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                if let Some(s) = r.speed_rep(&spec).unwrap() {
                    pps.extend(s.pp);
                    tgs.extend(s.tg);
                }
            }
            let summary = |v: Vec<f64>| {
                crate::stats::speed_sample("speed", v)
                    .map(|s| (s.tokens_per_s, s.tokens_per_s_std))
                    .unwrap_or((f64::NAN, f64::NAN))
            };
            let (pp, tg) = (summary(pps), summary(tgs));
            let info = r.info();
            eprintln!(
                "ROW {ty}: MiB {:.1} bpw {:.2} | PPL {:.4} ± {:.4} tokens_match {:?} | KLD {} same-top {} | pp512 {:.1} ± {:.1} | tg128 {:.1} ± {:.1} | load_s {:?}",
                info.tensor_bytes as f64 / 1048576.0,
                info.bits_per_weight,
                p.ppl,
                p.ppl_err,
                p.tokens_match,
                p.reference.as_ref().map_or("-".into(), |r| format!("{:.5} ± {:.5}", r.kld_mean, r.kld_mean_err)),
                p.reference.as_ref().map_or("-".into(), |r| format!("{:.2}%", 100.0 * r.top1_agreement)),
                pp.0,
                pp.1,
                tg.0,
                tg.1,
                info.load_s,
            );
            for c in r.commands() {
                eprintln!("  $ {c}");
            }
        }
    }
}
