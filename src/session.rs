//! One evaluation run: check every input before measuring anything, load the model and
//! tokenize the text once, then build, measure and drop one runner at a time, rewriting
//! the reports after each, and finally print the table and apply the regression gate.
//!
//! Bad input (missing files, unknown formats, a text too short for `--ctx`, no llama.cpp)
//! fails before the run folder is created, so it never leaves a report behind. Once the
//! run has started, a runner that fails (including a NaN perplexity) gets an `error` in its
//! row, the other runners still run, and the process exits 2 at the end. Until the last
//! runner has finished every report says `complete: false`.

use crate::eval::perplexity::{check_ctx, ChunkPlan, PlanError};
use crate::eval::reference::base_file_bytes;
use crate::machine;
use crate::progress::Bar;
use crate::report::regress::{self, GateThresholds};
use crate::report::{self, Machine, Protocol, Results, RunnerRecord, Versions, SCHEMA_VERSION};
use crate::runner::kwk::{KwkRunner, KwkRunnerOptions, ReferenceRole};
use crate::runner::{plan_runners, FormatSpec, PerplexityProtocol, Runner, SpeedSpec, TokenStream};
use crate::text::read_text;
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// KL divergence against the float32 reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KldMode {
    /// On when float32 is among the formats and the base file stays under
    /// [`KLD_AUTO_LIMIT_BYTES`].
    Auto,
    On,
    Off,
}

/// Largest KL-divergence base file `--kld` auto mode writes (larger needs an explicit `--kld`).
pub const KLD_AUTO_LIMIT_BYTES: u64 = 4 << 30;

/// Everything a run needs, as the CLI resolved it.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    pub llm: String,
    pub text: PathBuf,
    pub formats: String,
    pub ggufs: Vec<PathBuf>,
    pub llama_bench: bool,
    pub llama_cpp_dir: Option<PathBuf>,
    pub ctx: usize,
    pub chunks: Option<usize>,
    pub threads: usize,
    pub pp: usize,
    pub tg: usize,
    pub reps: usize,
    pub out: Option<PathBuf>,
    pub baseline: Option<PathBuf>,
    pub max_ppl_regression_pct: f64,
    pub max_speed_regression_pct: f64,
    pub no_speed: bool,
    pub kld: KldMode,
    pub keep_logits: bool,
    pub calib_text: Option<PathBuf>,
    /// Token range of the calibration text to use (`--calib-range`).
    pub calib_range: Option<(usize, usize)>,
    /// Calibration may overlap the scored text (`--calib-on-eval`; the report marks it).
    pub calib_on_eval: bool,
    pub pack_cache_dir: Option<PathBuf>,
    /// KV cache type of llama-perplexity (f16 is llama.cpp's default; f32 matches kwk).
    pub llama_kv_type: llamacpp::KvType,
}

/// How a run ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    GateFailed,
}

/// Calibration tokens passed to `int4:calib` / `int4:gptq` (at most).
const MAX_CALIBRATION_TOKENS: usize = 32_768;

/// A run of this many tokens found both in the calibration tokens and in the scored
/// windows counts as calibrating on the scored text.
const CALIB_OVERLAP_TOKENS: usize = 64;

/// The first run of `n` tokens of `a` that also occurs in `b`: `(offset in a, offset in
/// b)`; `None` when they share none (or either is shorter than `n`).
fn shared_run(a: &[u32], b: &[u32], n: usize) -> Option<(usize, usize)> {
    use std::collections::HashMap;
    use std::hash::{DefaultHasher, Hash, Hasher};
    if n == 0 || a.len() < n || b.len() < n {
        return None;
    }
    let key = |w: &[u32]| {
        let mut h = DefaultHasher::new();
        w.hash(&mut h);
        h.finish()
    };
    let mut seen: HashMap<u64, Vec<usize>> = HashMap::new();
    for j in 0..=b.len() - n {
        seen.entry(key(&b[j..j + n])).or_default().push(j);
    }
    (0..=a.len() - n).find_map(|i| {
        let w = &a[i..i + n];
        seen.get(&key(w))?
            .iter()
            .find(|&&j| &b[j..j + n] == w)
            .map(|&j| (i, j))
    })
}

/// Fewest calibration tokens accepted (one window of statistics).
const MIN_CALIBRATION_TOKENS: usize = 512;

/// A runner to build: kwk runners are packed right before they are measured.
enum Pending {
    Kwk {
        name: String,
        precision: kwk::Precision,
    },
    Built(Box<dyn Runner>),
}

fn plan_error(e: PlanError, text: &Path) -> anyhow::Error {
    match e {
        PlanError::TooShort { n_tokens, ctx } => anyhow!(
            "--ctx {ctx} needs at least {} tokens; '{}' tokenizes to {n_tokens}. Pass a longer text or a smaller --ctx",
            2 * ctx,
            text.display()
        ),
        other => anyhow!("{other}"),
    }
}

/// Checks the flags that need no file.
fn check_flags(cfg: &EvalConfig) -> Result<()> {
    check_ctx(cfg.ctx).map_err(|e| anyhow!("{e}"))?;
    ensure!(cfg.threads >= 1, "--threads 0: pass at least 1 thread");
    ensure!(cfg.reps >= 1, "--reps 0: pass at least 1 repetition");
    for (flag, v) in [
        ("--max-ppl-regression", cfg.max_ppl_regression_pct),
        ("--max-speed-regression", cfg.max_speed_regression_pct),
    ] {
        ensure!(
            v.is_finite() && v >= 0.0,
            "{flag} {v}: pass a non-negative percentage"
        );
    }
    if let Some(c) = cfg.chunks {
        ensure!(c >= 1, "--chunks 0 scores nothing. Pass --chunks 1 or more");
    }
    Ok(())
}

fn check_gguf_path(path: &Path) -> Result<()> {
    if !path.exists() {
        bail!(
            "GGUF file '{}' does not exist; pass the path of a .gguf model file",
            path.display()
        );
    }
    if path.is_dir() {
        bail!(
            "'{}' is a directory, not a GGUF file; pass the path of a .gguf model file",
            path.display()
        );
    }
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("opening GGUF file '{}'", path.display()))?;
    // The magic only; the llama.cpp runner reads (and checks) the rest of the header.
    let mut magic = Vec::with_capacity(4);
    std::io::Read::by_ref(&mut file)
        .take(4)
        .read_to_end(&mut magic)
        .with_context(|| format!("reading GGUF file '{}'", path.display()))?;
    if magic != b"GGUF" {
        let hex: Vec<String> = magic.iter().map(|b| format!("{b:02x}")).collect();
        bail!(
            "'{}' is not a GGUF file (it starts with bytes [{}], not 'GGUF'); pass a .gguf model file",
            path.display(),
            hex.join(" ")
        );
    }
    Ok(())
}

/// The run folder: `--out`, or `runs/<UTC timestamp>`. It must not hold a results.json yet.
fn run_folder(cfg: &EvalConfig, stamp: &str) -> Result<PathBuf> {
    let dir = cfg
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(stamp));
    if dir.join("results.json").exists() {
        bail!(
            "--out '{}' already holds a results.json; pass a new folder (or remove the old run)",
            dir.display()
        );
    }
    if dir.exists() && !dir.is_dir() {
        bail!("--out '{}' is a file; pass a folder", dir.display());
    }
    Ok(dir)
}

pub fn evaluate(cfg: &EvalConfig) -> Result<Outcome> {
    // 1. Everything that can be checked without the model.
    check_flags(cfg)?;
    let specs = plan_runners(&cfg.formats, &cfg.ggufs)?;
    ensure!(
        !specs.is_empty(),
        "no runners: --formats is empty and no --gguf was given. Pass e.g. --formats float32,int8"
    );
    for s in &specs {
        if let FormatSpec::Gguf { path } = s {
            check_gguf_path(path)?;
        }
    }
    let has_float32 = specs.iter().any(|s| {
        matches!(
            s,
            FormatSpec::Kwk {
                precision: kwk::Precision::Float32,
                ..
            }
        )
    });
    if cfg.kld == KldMode::On && !has_float32 {
        bail!("--kld compares against the float32 reference, which is not in --formats; add float32 to --formats");
    }
    if specs.iter().any(|s| matches!(s, FormatSpec::Kwk { .. })) {
        // A forced kernel tier this CPU cannot run would measure another tier.
        kwk::kernels::check_isa_env().map_err(|e| anyhow!(e))?;
    }
    let needs_calibration = specs.iter().any(|s| {
        matches!(s, FormatSpec::Kwk { precision: kwk::Precision::Int4(o), .. } if o.calibrate || o.gptq)
    });
    let baseline = match &cfg.baseline {
        Some(p) => Some(report::json::read(p).with_context(|| "reading --baseline".to_string())?),
        None => None,
    };
    let text = read_text(&cfg.text, "--text")?;
    let calib_text = match (&cfg.calib_text, needs_calibration) {
        (Some(p), true) => Some(read_text(p, "--calib-text")?),
        (None, true) => bail!(
            "int4:calib and int4:gptq fit scales to activations of a calibration text; pass --calib-text FILE \
             (a text other than --text, so the evaluation text is not fitted)"
        ),
        _ => None,
    };
    if let Some(c) = &calib_text {
        // Fitting scales to the scored text would flatter the calibrated rows. The same
        // file is allowed with a range (checked against the scored tokens below).
        if c.text == text.text && !cfg.calib_on_eval && cfg.calib_range.is_none() {
            bail!(
                "--calib-text '{}' is the same text as --text '{}': calibrating on the scored text flatters int4:calib / int4:gptq; \
                 pass another text, a slice of it disjoint from the scored chunks with --calib-range START:END, \
                 or --calib-on-eval to allow it (the report marks the run)",
                c.path.display(),
                cfg.text.display()
            );
        }
    }
    let has_gguf = specs.iter().any(|s| matches!(s, FormatSpec::Gguf { .. }));
    let tools = if has_gguf {
        Some(crate::runner::llamacpp_tools(cfg.llama_cpp_dir.as_deref())?)
    } else {
        None
    };
    // llama.cpp runners are built now: that reads and checks each GGUF (cheap, no
    // subprocess), so a truncated file fails before the model is loaded.
    let mut llamacpp_runners = std::collections::BTreeMap::new();
    for s in &specs {
        if let FormatSpec::Gguf { path } = s {
            let tools = tools.as_ref().context("llama.cpp tools were not located")?;
            llamacpp_runners.insert(s.name(), crate::runner::llamacpp_runner(path, tools, cfg)?);
        }
    }
    let (started_utc, stamp) = machine::utc_now();
    let out_dir = run_folder(cfg, &stamp)?;

    // 2. The model (its tokenizer defines the tokens every runner is scored on).
    eprintln!("loading model '{}'", cfg.llm);
    let model =
        Rc::new(kwk::load_model(&cfg.llm).with_context(|| format!("loading --llm '{}'", cfg.llm))?);
    let tokens = model
        .tokenizer
        .encode(&text.text, true)
        .with_context(|| format!("tokenizing '{}'", text.path.display()))?;
    let add_bos = model.tokenizer.add_bos();
    let bos_id = model.tokenizer.bos_id();
    ensure!(
        !add_bos || bos_id.is_some(),
        "the tokenizer of '{}' adds a BOS but has no BOS id",
        cfg.llm
    );
    let plan =
        ChunkPlan::new(tokens.len(), cfg.ctx, cfg.chunks).map_err(|e| plan_error(e, &text.path))?;
    let stream = TokenStream {
        tokens,
        add_bos,
        bos_id,
        text_path: text.path.clone(),
    };
    eprintln!(
        "'{}': {} tokens; scoring {} chunks of {} ({} tokens)",
        text.name,
        stream.tokens.len(),
        plan.chunks,
        plan.ctx,
        plan.scored_tokens()
    );

    // The decoder's limits are the model's, the same for every format: check them once,
    // before the run starts. Speed tests need room for pp + tg tokens.
    let max_cache_len = if cfg.no_speed {
        cfg.ctx
    } else {
        cfg.ctx.max(cfg.pp + cfg.tg)
    };
    let has_kwk = specs.iter().any(|s| matches!(s, FormatSpec::Kwk { .. }));
    if has_kwk {
        if let Some(why) = kwk::decoder::runner_unsupported(&model, max_cache_len) {
            bail!(
                "the in-tree decoder cannot run --llm '{}' with --ctx {} and --pp {} + --tg {}: {why}",
                cfg.llm,
                cfg.ctx,
                cfg.pp,
                cfg.tg
            );
        }
    }

    // 3. KL divergence: the float32 runner writes llama.cpp's base file, the others read it.
    let n_vocab = model.config.vocab_size;
    let kld_bytes = base_file_bytes(plan.ctx, n_vocab, plan.chunks);
    let kld = match cfg.kld {
        KldMode::Off => false,
        KldMode::On => true,
        KldMode::Auto if !has_float32 => false,
        KldMode::Auto if kld_bytes > KLD_AUTO_LIMIT_BYTES => {
            eprintln!(
                "note: KL divergence skipped: its reference file would take {:.1} GiB for {} chunks; pass --kld to write it anyway, or fewer --chunks",
                kld_bytes as f64 / (1u64 << 30) as f64,
                plan.chunks
            );
            false
        }
        KldMode::Auto => true,
    };
    let reference_path = out_dir.join("float32-kl-divergence-base.bin");

    // 4. Runners, in run order: in-tree ones are packed when their turn comes.
    let calibration_tokens = match &calib_text {
        Some(t) => {
            let mut ids = model
                .tokenizer
                .encode(&t.text, true)
                .with_context(|| format!("tokenizing --calib-text '{}'", t.path.display()))?;
            if let Some((a, b)) = cfg.calib_range {
                if b > ids.len() {
                    bail!(
                        "--calib-range {a}:{b} ends past the {} tokens of --calib-text '{}'; give END at most {}",
                        ids.len(),
                        t.path.display(),
                        ids.len()
                    );
                }
                ids = ids[a..b].to_vec();
            }
            ids.truncate(MAX_CALIBRATION_TOKENS);
            if ids.len() < MIN_CALIBRATION_TOKENS {
                bail!(
                    "--calib-text '{}' has {} tokens{}; calibration needs at least {MIN_CALIBRATION_TOKENS}: pass a longer text",
                    t.path.display(),
                    ids.len(),
                    if cfg.calib_range.is_some() { " in --calib-range" } else { "" }
                );
            }
            // Every window the perplexity reads (context included) is scored text.
            let scored = &stream.tokens[..(plan.chunks * plan.ctx).min(stream.tokens.len())];
            if !cfg.calib_on_eval {
                if let Some((i, j)) = shared_run(&ids, scored, CALIB_OVERLAP_TOKENS) {
                    bail!(
                        "--calib-text '{}' shares {CALIB_OVERLAP_TOKENS} tokens in a row with the scored text \
                         (calibration token {i}, scored token {j}): calibrating on the scored text flatters \
                         int4:calib / int4:gptq; pass a disjoint text or --calib-range, or --calib-on-eval \
                         to allow it (the report marks the run)",
                        t.path.display()
                    );
                }
            }
            Some(ids)
        }
        None => None,
    };
    let calibration = match (&calib_text, &calibration_tokens) {
        (Some(t), Some(ids)) => Some(report::Calibration {
            text: t.name.clone(),
            text_sha256: t.sha256.clone(),
            range: cfg.calib_range.map(|(a, b)| format!("{a}:{b}")),
            tokens: ids.len(),
            tokens_used: ids.len().min(kwk::decoder::CALIBRATION_TOKENS),
            on_eval: cfg.calib_on_eval,
        }),
        _ => None,
    };
    let kwk_options = KwkRunnerOptions {
        threads: cfg.threads,
        max_cache_len,
        calibration_tokens,
        pack_cache_dir: cfg.pack_cache_dir.clone(),
    };
    let mut pending = Vec::new();
    for s in &specs {
        pending.push(match s {
            FormatSpec::Kwk { name, precision } => Pending::Kwk {
                name: name.clone(),
                precision: *precision,
            },
            FormatSpec::Gguf { .. } => Pending::Built(
                llamacpp_runners
                    .remove(&s.name())
                    .context("a llama.cpp runner was not built")?,
            ),
        });
    }

    // 5. The run folder and its first (incomplete) report.
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("creating --out '{}'", out_dir.display()))?;
    eprintln!("run folder: {}", out_dir.display());
    let mut results = Results {
        schema_version: SCHEMA_VERSION,
        complete: false,
        started_utc,
        model: cfg.llm.clone(),
        machine: Machine {
            cpu: machine::cpu_model(),
            isa: machine::isa_flags(),
            kernels: Some(machine::kernels_in_use()),
            threads: cfg.threads,
        },
        versions: Versions {
            kwk: machine::kwk_git_sha(),
            kwk_eval: env!("CARGO_PKG_VERSION").to_string(),
            llama_cpp: tools.as_ref().and_then(crate::runner::llamacpp_build),
            llama_cpp_version: tools.as_ref().map(|t| t.build().raw.clone()),
        },
        protocol: Protocol {
            ctx: plan.ctx,
            chunks: plan.chunks,
            scored_tokens: plan.scored_tokens(),
            text_tokens: stream.tokens.len(),
            add_bos,
            text: text.name.clone(),
            text_sha256: text.sha256.clone(),
            pp: cfg.pp,
            tg: cfg.tg,
            reps: cfg.reps,
            kld,
            speed: !cfg.no_speed,
            calibration,
        },
        ppl_delta_reference: None,
        runners: Vec::new(),
    };
    report::write_all(&out_dir, &results)?;

    // 6. Measure, one runner at a time.
    let speed_spec = SpeedSpec {
        pp: cfg.pp,
        tg: cfg.tg,
        reps: cfg.reps,
        threads: cfg.threads,
    };
    let mut reference_ready = false;
    let total = pending.len();
    for (i, p) in pending.into_iter().enumerate() {
        let step = format!("[{}/{total}]", i + 1);
        let record = match p {
            Pending::Kwk { name, precision } => {
                let is_reference = kld && precision == kwk::Precision::Float32;
                let role = if is_reference {
                    ReferenceRole::Writes(reference_path.clone())
                } else {
                    ReferenceRole::Compared
                };
                eprintln!("{step} {name}: packing");
                match KwkRunner::new(Rc::clone(&model), &name, precision, &kwk_options, role) {
                    Ok(mut r) => {
                        let rec = measure(
                            &mut r,
                            &step,
                            &plan,
                            &stream,
                            kld && reference_ready && !is_reference,
                            &reference_path,
                            &speed_spec,
                            !cfg.no_speed,
                            cfg.threads,
                        );
                        if is_reference && rec.error.is_none() {
                            reference_ready = true;
                        }
                        rec
                    }
                    Err(e) => RunnerRecord::failed(&name, "kwk", format!("{e:#}")),
                }
            }
            Pending::Built(mut r) => {
                let speed = !cfg.no_speed && cfg.llama_bench;
                measure(
                    r.as_mut(),
                    &step,
                    &plan,
                    &stream,
                    kld && reference_ready,
                    &reference_path,
                    &speed_spec,
                    speed,
                    cfg.threads,
                )
            }
        };
        if let Some(e) = &record.error {
            eprintln!("{step} {}: FAILED: {e}", record.name);
        }
        results.runners.push(record);
        results.update_deltas();
        report::write_all(&out_dir, &results)?;
    }

    // 7. Done: the complete report, the table, the gate.
    results.complete = true;
    report::write_all(&out_dir, &results)?;
    if reference_path.exists() && !cfg.keep_logits {
        std::fs::remove_file(&reference_path)
            .with_context(|| format!("removing '{}'", reference_path.display()))?;
    }
    print!("{}", report::terminal::render(&results));
    println!("reports: {}", out_dir.display());
    let failures: Vec<String> = results
        .failures()
        .map(|r| format!("{}: {}", r.name, r.error.as_deref().unwrap_or_default()))
        .collect();
    let mut outcome = Outcome::Passed;
    if let (Some(base), Some(path)) = (&baseline, &cfg.baseline) {
        let gate = regress::compare(
            base,
            &results,
            &GateThresholds {
                max_ppl_regression_pct: cfg.max_ppl_regression_pct,
                max_speed_regression_pct: cfg.max_speed_regression_pct,
            },
        )?;
        print!("{}", gate.summary(&path.display().to_string()));
        if !gate.passed() {
            outcome = Outcome::GateFailed;
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} runner(s) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    Ok(outcome)
}

/// Perplexity then speed of one runner, into its report row (errors go into the row).
#[allow(clippy::too_many_arguments)]
fn measure(
    runner: &mut dyn Runner,
    step: &str,
    plan: &ChunkPlan,
    stream: &TokenStream,
    compare_with_reference: bool,
    reference_path: &Path,
    speed_spec: &SpeedSpec,
    speed: bool,
    threads: usize,
) -> RunnerRecord {
    let mut rec = RunnerRecord::from_info(runner.info());
    let name = rec.name.clone();
    let protocol = PerplexityProtocol {
        ctx: plan.ctx,
        chunks: plan.chunks,
        threads,
        reference_logits: compare_with_reference.then(|| reference_path.to_path_buf()),
    };
    eprintln!("{step} {name}: perplexity");
    let bar = Bar::new(&format!("{name} perplexity"));
    let ppl = runner.perplexity(&protocol, stream, &bar);
    bar.finish();
    match ppl {
        Ok(p) => {
            if let Err(e) = crate::stats::finite("perplexity", p.ppl)
                .and(crate::stats::finite("perplexity error", p.ppl_err))
            {
                rec.error = Some(format!("{e:#}"));
                return rec;
            }
            eprintln!("{step} {name}: PPL {:.4} ± {:.5}", p.ppl, p.ppl_err);
            rec.set_perplexity(&p);
        }
        Err(e) => {
            rec.error = Some(format!("perplexity: {e:#}"));
            return rec;
        }
    }
    if speed {
        eprintln!(
            "{step} {name}: speed pp{} tg{} × {}",
            speed_spec.pp, speed_spec.tg, speed_spec.reps
        );
        let bar = Bar::new(&format!("{name} speed"));
        let s = runner.speed(speed_spec, &bar);
        bar.finish();
        match s {
            Ok(s) => rec.set_speed(&s),
            Err(e) => rec.error = Some(format!("speed: {e:#}")),
        }
    }
    rec
}

#[cfg(test)]
mod tests {
    use super::shared_run;

    #[test]
    fn shared_run_finds_the_first_common_window_only_when_one_exists() {
        let b: Vec<u32> = (0..300).collect();
        let mut a: Vec<u32> = (1000..1100).collect();
        assert_eq!(shared_run(&a, &b, 64), None);
        a.extend(100..170);
        assert_eq!(shared_run(&a, &b, 64), Some((100, 100)));
        // 63 common tokens in a row are not a run of 64.
        let a: Vec<u32> = (1000..1010).chain(5..68).chain(2000..2010).collect();
        assert_eq!(shared_run(&a, &b, 64), None);
        assert_eq!(shared_run(&a, &b, 63), Some((10, 5)));
        assert_eq!(shared_run(&a[..10], &b, 64), None);
    }
}
