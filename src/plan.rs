//! The plan step: turns the evaluation's options ([`EvalOptions`], which `cli` parses the
//! flags into) into an immutable, fully
//! checked [`RunPlan`] before anything is loaded. Every check that needs no model happens
//! here (flags, formats, GGUF magic, texts, llama.cpp's tools, the run folder, the baseline
//! and its identity as far as it is known before loading), so bad input fails with one
//! clear line and never leaves a run folder behind.

use crate::cache_dir::pack_cache;
use crate::limits::{check_range, check_threads, MAX_CHUNKS, MAX_REPS, MAX_TOKENS};
use crate::machine;
use crate::protocol::points::{repeated, SpeedAxes};
use crate::protocol::results::Results;
use crate::protocol::{check_ctx, parse_gguf_arg, Engine, FormatSpec, SpeedSpec};
use crate::report::gate::{self, GateLimits};
use crate::report::json;
use crate::report::output::StdoutFormat;
use crate::text::{read_text, EvalText};
use crate::ui::Reporter;
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

/// KL divergence (and every per-token comparison) against the float32 reference.
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

/// `--chunks`: a count, or every whole chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunks {
    All,
    AtMost(usize),
}

/// What an evaluation was asked for: the flags as plain values (`cli` parses them), not
/// checked yet; [`make`] checks them and resolves the run.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// `--llm`: a Hugging Face folder, a .gguf file, a hub id or a known short name.
    pub llm: String,
    /// `--text`: the text to score.
    pub text: PathBuf,
    /// `--formats`, as given (`none` dropped); empty when not given.
    pub formats: Vec<FormatSpec>,
    /// Whether `--formats` was given: without it a run has [`DEFAULT_FORMATS`], or
    /// [`LADDER_FORMATS`] when llama.cpp's ladder runs.
    pub formats_given: bool,
    /// `--gguf`: `PATH` or `LABEL=PATH`, as given.
    pub gguf: Vec<PathBuf>,
    pub llama_bench: bool,
    /// `--ladder`.
    pub ladder: crate::ladder::LadderChoice,
    pub llama_cpp_dir: Option<PathBuf>,
    /// `--peer`: the engines that run every GGUF row (llama.cpp alone by default); an
    /// error (a name given twice) is reported when the plan is made.
    pub peers: std::result::Result<Vec<Engine>, String>,
    /// `--ik-llama-cpp-dir`.
    pub ik_llama_cpp_dir: Option<PathBuf>,
    /// `--tool-timeout` in seconds.
    pub tool_timeout: Option<u64>,
    pub llama_kv: llamacpp::KvType,
    /// `--llama-fa` when given (`None`: best).
    pub llama_fa: Option<llamacpp::BenchFlashAttn>,
    /// `--kv`: the KV cache of kwk's rows but the float32 reference.
    pub kv: kwk::KvPrecision,
    pub ctx: usize,
    pub chunks: Chunks,
    /// `--threads`, a list (the first also runs perplexity); empty: every available core.
    pub threads: Vec<usize>,
    /// `--pp`, `--tg` and `--depth`: the speed sweep's lists ([`SpeedAxes`]).
    pub pp: Vec<usize>,
    pub tg: Vec<usize>,
    pub depth: Vec<usize>,
    pub reps: usize,
    /// `--out`; `None` is `runs/<UTC timestamp>` under a fresh name.
    pub out: Option<PathBuf>,
    pub baseline: Option<PathBuf>,
    /// The regression limits of `--baseline`.
    pub limits: GateLimits,
    pub compare_to: Option<String>,
    pub no_speed: bool,
    /// `--output`: what the run prints on stdout.
    pub output: StdoutFormat,
    /// `--kld` / `--no-kld` / neither.
    pub kld: KldMode,
    pub keep_logits: bool,
    /// `--reference`: a reference file (or the run folder holding one) to load.
    pub reference: Option<PathBuf>,
    pub calib_text: Option<PathBuf>,
    pub calib_range: Option<(usize, usize)>,
    pub calib_on_eval: bool,
    pub pack_cache: Option<PathBuf>,
    pub no_pack_cache: bool,
}

/// A baseline results.json and where it came from.
#[derive(Debug, Clone)]
pub struct Baseline {
    pub path: PathBuf,
    pub results: Results,
}

/// Everything a run needs, checked. Nothing in it changes once the run starts.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub llm: String,
    pub text: EvalText,
    pub calib_text: Option<EvalText>,
    /// `--calib-range`: calibrate on tokens START..END of the calibration text only.
    pub calib_range: Option<(usize, usize)>,
    /// `--calib-on-eval`: calibration may share text with the scored windows (the report
    /// marks the run); otherwise [`crate::prepare`] refuses any shared run of tokens.
    pub calib_on_eval: bool,
    /// In run order: float32 first (the reference), other in-tree formats, then GGUFs.
    pub formats: Vec<FormatSpec>,
    pub tools: Option<llamacpp::LlamaCppTools>,
    /// ik_llama.cpp's tools, with `--peer ik` and a GGUF row.
    pub ik_tools: Option<llamacpp::LlamaCppTools>,
    /// `--peer`: the engines that run every GGUF row.
    pub peers: Vec<Engine>,
    /// llama.cpp's ladder, made from `--llm` after the plan ([`crate::ladder::make`]); its
    /// rows join `formats` then.
    pub ladder: Option<crate::ladder::LadderPlan>,
    /// How each made GGUF row was made, by row name (filled by the ladder step).
    pub made: Vec<(String, crate::protocol::made::MadeGguf)>,
    /// kwk rows added at the ladder's sizes (`ladder::matched`), by row name: the ladder
    /// rows each stands for.
    pub stands_for: Vec<(String, Vec<String>)>,
    /// Ladder rows whose GGUF llama-quantize failed to make (failed rows).
    pub unmade: Vec<crate::protocol::results::RunnerRecord>,
    /// Ladder types not made for want of an importance matrix, one line each.
    pub not_made: Vec<String>,
    pub llama_kv: llamacpp::KvType,
    /// llama-bench's flash attention (`--llama-fa`, best by default).
    pub llama_fa: llamacpp::BenchFlashAttn,
    /// `--kv`: the KV cache of kwk's rows but the float32 reference (which keeps f32).
    pub kv: kwk::KvPrecision,
    pub llama_bench: bool,
    /// `--tool-timeout`; `None` scales each tool's timeout with its work.
    pub tool_timeout: Option<std::time::Duration>,
    pub ctx: usize,
    /// `--chunks`; `None` is every whole chunk.
    pub max_chunks: Option<usize>,
    /// The first `--threads` (perplexity, the roofline's peaks, every runner's build).
    pub threads: usize,
    /// `None` with `--no-speed`; the sweep's first point otherwise.
    pub speed: Option<SpeedSpec>,
    /// Every point of the speed sweep (one point when no list was given).
    pub speed_axes: SpeedAxes,
    pub kld: KldMode,
    pub keep_logits: bool,
    /// `--reference`, resolved to the file: float32's log-probs loaded, not computed.
    pub reference: Option<PathBuf>,
    pub pack_cache_dir: Option<PathBuf>,
    pub out_dir: PathBuf,
    pub started_utc: String,
    pub baseline: Option<Baseline>,
    pub limits: GateLimits,
    pub compare_to: Option<String>,
}

impl RunPlan {
    pub fn has_reference(&self) -> bool {
        self.formats.iter().any(FormatSpec::is_reference)
    }

    pub fn has_kwk(&self) -> bool {
        self.formats
            .iter()
            .any(|f| matches!(f, FormatSpec::Kwk { .. }))
    }

    /// Whether any format fits scales to a calibration text.
    fn needs_calibration(&self) -> bool {
        self.formats.iter().any(
            |s| matches!(s, FormatSpec::Kwk { precision, .. } if precision.needs_calibration()),
        )
    }
}

/// The in-tree formats of a run without `--formats`.
pub const DEFAULT_FORMATS: &str = "float32,bf16,int8,int4";
/// The in-tree formats of a run without `--formats` when llama.cpp's ladder runs: kwk's
/// sizes across the ladder's range (float32 is the reference both are judged against).
pub const LADDER_FORMATS: &str = "float32,int8,int6,int5,int4,int3,bpw:3.5";

fn default_formats(ladder: bool) -> Result<Vec<FormatSpec>> {
    let list = if ladder {
        LADDER_FORMATS
    } else {
        DEFAULT_FORMATS
    };
    list.split(',')
        .map(|f| crate::protocol::parse_format(f).map_err(|e| anyhow!("default format '{f}': {e}")))
        .collect()
}

/// Checks the flags that need no file.
fn check_flags(a: &EvalOptions) -> Result<()> {
    check_ctx(a.ctx).map_err(|e| anyhow!("{e}"))?;
    check_range("--ctx", a.ctx, 8, MAX_TOKENS, "tokens per chunk, even")?;
    if let Chunks::AtMost(n) = a.chunks {
        check_range("--chunks", n, 1, MAX_CHUNKS, "or all")?;
        ensure!(
            n.checked_mul(a.ctx).is_some(),
            "--chunks {n} × --ctx {} overflows; pass fewer chunks",
            a.ctx
        );
    }
    for &t in &a.threads {
        check_threads(t)?;
    }
    if let Some(v) = repeated(&a.threads) {
        bail!("--threads gives {v} twice; pass each value once");
    }
    check_range("--reps", a.reps, 1, MAX_REPS, "timed repetitions")?;
    if a.llama_fa == Some(llamacpp::BenchFlashAttn::Off) && !a.llama_kv.allows_flash_attn_off() {
        bail!(
            "--llama-fa off with --llama-kv {0}: a {0} KV cache needs flash attention on; pass --llama-fa best (or on), or --llama-kv f16",
            a.llama_kv
        );
    }
    for (flag, list, what) in [
        ("--pp", &a.pp, "prompt tokens; 0 skips the test"),
        ("--tg", &a.tg, "generated tokens; 0 skips the test"),
        ("--depth", &a.depth, "tokens in the cache before each test"),
    ] {
        ensure!(!list.is_empty(), "{flag} needs at least one value");
        if let Some(v) = repeated(list) {
            bail!("{flag} gives {v} twice; pass each value once");
        }
        for &v in list.iter() {
            check_range(flag, v, 0, MAX_TOKENS, what)?;
        }
    }
    let (pp, tg, depth) = (max_of(&a.pp), max_of(&a.tg), max_of(&a.depth));
    let sequence = pp
        .checked_add(tg)
        .and_then(|s| s.checked_add(depth))
        .filter(|&s| s <= MAX_TOKENS);
    let depth_part = match depth {
        0 => String::new(),
        d => format!("--depth {d} + "),
    };
    ensure!(
        sequence.is_some(),
        "{depth_part}--pp {pp} + --tg {tg} is more than {MAX_TOKENS} tokens, the longest sequence a speed test runs; pass smaller values"
    );
    a.limits.check()
}

/// The runner list in run order, every GGUF checked ([`check_gguf_path`]) and labelled
/// ([`label_ggufs`]); a format, a GGUF file (by canonical path) or a row name given twice is
/// an error.
fn order_formats(
    formats: &[FormatSpec],
    ggufs: &[PathBuf],
    ladder: bool,
) -> Result<Vec<FormatSpec>> {
    let mut specs: Vec<FormatSpec> = formats.to_vec();
    for p in ggufs {
        specs.push(match p.to_str() {
            Some(arg) => parse_gguf_arg(arg).map_err(|e| anyhow!("--gguf: {e}"))?,
            None => FormatSpec::gguf(p.clone()),
        });
    }
    for s in &specs {
        if let FormatSpec::Gguf { path, .. } = s {
            check_gguf_path(path)?;
        }
    }
    label_ggufs(&mut specs)?;
    let mut seen = std::collections::BTreeMap::new();
    for s in &specs {
        if let Some(first) = seen.insert(s.name(), s) {
            match (first, s) {
                (FormatSpec::Gguf { path: a, .. }, FormatSpec::Gguf { path: b, .. }) => bail!(
                    "'{}' names two GGUF files ('{}' and '{}'); give each its own label with --gguf LABEL=PATH",
                    s.name(),
                    a.display(),
                    b.display()
                ),
                _ => bail!(
                    "'{}' is asked for twice (--formats / --gguf); give each format once",
                    s.name()
                ),
            }
        }
    }
    ensure!(
        !specs.is_empty() || ladder,
        "no runners: --formats is empty and no --gguf was given. Pass e.g. --formats float32,int8"
    );
    // Stable: float32 first, in-tree before GGUF, otherwise as given.
    specs.sort_by_key(|s| match s {
        _ if s.is_reference() => 0,
        FormatSpec::Kwk { .. } => 1,
        FormatSpec::Gguf { .. } => 2,
    });
    Ok(specs)
}

/// GGUF rows get unique labels: the same file (canonical path) twice is refused; GGUFs
/// without an explicit LABEL that share a file name are told apart by as many of their
/// trailing path components as it takes (`a/model.gguf`, `b/model.gguf`).
fn label_ggufs(specs: &mut [FormatSpec]) -> Result<()> {
    let mut canonical: Vec<(PathBuf, &Path)> = Vec::new();
    for s in specs.iter() {
        if let FormatSpec::Gguf { path, .. } = s {
            let c = std::fs::canonicalize(path)
                .with_context(|| format!("resolving GGUF file '{}'", path.display()))?;
            if let Some((_, first)) = canonical.iter().find(|(x, _)| *x == c) {
                bail!(
                    "GGUF file '{}' is asked for twice (as '{}' and '{}'); give each GGUF once",
                    c.display(),
                    first.display(),
                    path.display()
                );
            }
            canonical.push((c, path));
        }
    }
    // The absolute paths (symlinks kept as given) of the unlabelled GGUFs, by file name.
    let mut groups: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for (i, s) in specs.iter().enumerate() {
        if let FormatSpec::Gguf {
            label,
            explicit: false,
            ..
        } = s
        {
            groups.entry(label.clone()).or_default().push(i);
        }
    }
    for members in groups.values().filter(|m| m.len() > 1) {
        let parts: Vec<Vec<String>> = members
            .iter()
            .map(|&i| {
                let FormatSpec::Gguf { path, .. } = &specs[i] else {
                    unreachable!("grouped GGUF rows only")
                };
                let abs = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                abs.components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect()
            })
            .collect();
        let longest = parts.iter().map(Vec::len).max().unwrap_or(1);
        let tail = |p: &Vec<String>, k: usize| {
            let from = p.len().saturating_sub(k);
            p[from..].join("/").replacen("//", "/", 1)
        };
        let k = (2..=longest)
            .find(|&k| {
                let labels: std::collections::BTreeSet<String> =
                    parts.iter().map(|p| tail(p, k)).collect();
                labels.len() == parts.len()
            })
            .unwrap_or(longest);
        for (&i, p) in members.iter().zip(&parts) {
            if let FormatSpec::Gguf { label, .. } = &mut specs[i] {
                *label = tail(p, k);
            }
        }
    }
    Ok(())
}

/// A GGUF path must exist, be a file and start with the GGUF magic.
fn check_gguf_path(path: &Path) -> Result<()> {
    ensure!(
        path.exists(),
        "GGUF file '{}' does not exist; pass the path of a .gguf model file",
        path.display()
    );
    ensure!(
        !path.is_dir(),
        "'{}' is a directory, not a GGUF file; pass the path of a .gguf model file",
        path.display()
    );
    crate::text::regular_file(
        path,
        &format!("GGUF file '{}'", path.display()),
        "pass a .gguf model file",
    )?;
    let mut magic = Vec::with_capacity(4);
    crate::text::open_input(path)
        .and_then(|f| f.take(4).read_to_end(&mut magic))
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
fn run_folder(out: Option<&Path>, stamp: &str) -> Result<PathBuf> {
    let dir = out.map_or_else(|| PathBuf::from("runs").join(stamp), Path::to_path_buf);
    ensure!(
        !dir.join(json::FILE_NAME).exists(),
        "--out '{}' already holds a results.json; pass a new folder (or remove the old run)",
        dir.display()
    );
    ensure!(
        !dir.exists() || dir.is_dir(),
        "--out '{}' is a file; pass a folder",
        dir.display()
    );
    Ok(dir)
}

/// The reference file `--reference` names: the file, or `REFERENCE_LOGITS` in the run
/// folder given. Its contents are checked once the run's tokens are known
/// ([`crate::prepare`]).
fn reference_file(p: &Path) -> Result<PathBuf> {
    let file = if p.is_dir() {
        p.join(crate::run_folder::REFERENCE_LOGITS)
    } else {
        p.to_path_buf()
    };
    ensure!(
        file.is_file(),
        "--reference '{}': {} is no file; pass a reference file or the folder of a run made with --keep-logits (kwk-eval --formats float32 --keep-logits --out DIR)",
        p.display(),
        if p.is_dir() {
            format!("'{}'", file.display())
        } else {
            "it".to_string()
        }
    );
    Ok(file)
}

/// The calibration text, when a format needs one; never the scored text itself unless a
/// `--calib-range` slices it (checked against the scored tokens after tokenizing) or
/// `--calib-on-eval` allows it.
fn calibration_text(a: &EvalOptions, needed: bool, text: &EvalText) -> Result<Option<EvalText>> {
    let calib = match (&a.calib_text, needed) {
        (Some(p), true) => read_text(p, "--calib-text")?,
        (None, true) => bail!(
            "int8:calib, int8:gptq, int4:calib, int4:gptq (and int3/int5/int6's), bpw:X:calib fit scales to activations of a calibration text; pass --calib-text FILE \
             (a text other than --text, so the evaluation text is not fitted)"
        ),
        _ => return Ok(None),
    };
    ensure!(
        calib.text != text.text || a.calib_on_eval || a.calib_range.is_some(),
        "--calib-text '{}' is the same text as --text '{}': calibrating on the scored text flatters the calibrated formats (int8:calib, int4:calib, ...); \
         pass another text, a slice of it disjoint from the scored chunks with --calib-range START:END, \
         or --calib-on-eval to allow it (the report marks the run)",
        calib.path.display(),
        text.path.display()
    );
    Ok(Some(calib))
}

/// Checks `args` and resolves them into a plan. Reads the texts, the baseline and the
/// GGUF headers' magic; loads no model and creates no folder.
pub fn make(a: &EvalOptions, ui: &dyn Reporter) -> Result<RunPlan> {
    check_flags(a)?;
    let ladder_asked = crate::ladder::wanted(&crate::ladder::LadderAsk {
        choice: &a.ladder,
        llm: &a.llm,
        llama_bench: a.llama_bench,
        has_gguf: !a.gguf.is_empty()
            || a.formats
                .iter()
                .any(|s| matches!(s, FormatSpec::Gguf { .. })),
        calib: None,
        cache_dir: None,
    });
    let defaults;
    let asked: &[FormatSpec] = if a.formats_given {
        &a.formats
    } else {
        defaults = default_formats(ladder_asked)?;
        &defaults
    };
    let peers = a.peers.clone().map_err(|e| anyhow!(e))?;
    // llama.cpp's ladder adds its rows after the plan, so it may be the only runner.
    let formats: Vec<FormatSpec> = order_formats(asked, &a.gguf, ladder_asked)?
        .iter()
        .flat_map(|f| f.for_peers(&peers))
        .collect();
    let kld = a.kld;
    check_runners(&formats, kld, a.compare_to.as_deref())?;
    let (started_utc, stamp) = machine::utc_now();
    let mut plan = RunPlan {
        llm: a.llm.clone(),
        text: read_text(&a.text, "--text")?,
        calib_text: None,
        calib_range: a.calib_range,
        calib_on_eval: a.calib_on_eval,
        formats,
        tools: None,
        ik_tools: None,
        peers,
        ladder: None,
        made: Vec::new(),
        stands_for: Vec::new(),
        unmade: Vec::new(),
        not_made: Vec::new(),
        llama_kv: a.llama_kv,
        llama_fa: a.llama_fa.unwrap_or(llamacpp::BenchFlashAttn::Best),
        kv: a.kv,
        llama_bench: a.llama_bench,
        tool_timeout: a.tool_timeout.map(std::time::Duration::from_secs),
        ctx: a.ctx,
        max_chunks: match a.chunks {
            Chunks::All => None,
            Chunks::AtMost(n) => Some(n),
        },
        threads: a
            .threads
            .first()
            .copied()
            .unwrap_or_else(machine::available_threads),
        speed: None,
        speed_axes: SpeedAxes::single(0, 0, 0),
        kld,
        keep_logits: a.keep_logits,
        reference: a.reference.as_deref().map(reference_file).transpose()?,
        pack_cache_dir: pack_cache(a.pack_cache.clone(), a.no_pack_cache, ui),
        out_dir: run_folder(a.out.as_deref(), &stamp)?,
        started_utc,
        baseline: None,
        limits: a.limits,
        compare_to: a.compare_to.clone(),
    };
    plan.speed_axes = SpeedAxes {
        pp: a.pp.clone(),
        tg: a.tg.clone(),
        depth: a.depth.clone(),
        threads: if a.threads.is_empty() {
            vec![plan.threads]
        } else {
            a.threads.clone()
        },
    };
    plan.speed = (!a.no_speed).then(|| plan.speed_axes.specs(a.reps).remove(0));
    let ask = |calib| crate::ladder::LadderAsk {
        choice: &a.ladder,
        llm: &a.llm,
        llama_bench: a.llama_bench,
        has_gguf: plan
            .formats
            .iter()
            .any(|s| matches!(s, FormatSpec::Gguf { .. })),
        calib,
        cache_dir: kwk::paths::cache_root(&kwk::paths::CacheEnv::from_env())
            .map(|r| r.join("gguf")),
    };
    let ladder_wanted = crate::ladder::wanted(&ask(None));
    // The ladder's +imatrix rows read --calib-text too.
    let calib_needed = plan.needs_calibration() || (ladder_wanted && a.calib_text.is_some());
    plan.calib_text = calibration_text(a, calib_needed, &plan.text)?;
    // The ladder is made with llama.cpp's tools whatever the peers; each GGUF row runs on
    // its engine's.
    // A ladder type named `ik:TYPE` runs on ik_llama.cpp whatever the peers.
    let runs_on = |e: Engine| {
        (ladder_wanted && (plan.peers.contains(&e) || (e == Engine::Ik && a.ladder.names_ik())))
            || plan
                .formats
                .iter()
                .any(|s| matches!(s, FormatSpec::Gguf { engine, .. } if *engine == e))
    };
    if ladder_wanted || runs_on(Engine::LlamaCpp) {
        plan.tools = Some(
            llamacpp::LlamaCppTools::locate(a.llama_cpp_dir.as_deref())
                .map_err(|e| anyhow!("{e}"))?,
        );
    }
    if runs_on(Engine::Ik) {
        plan.ik_tools = Some(
            llamacpp::LlamaCppTools::locate_engine(
                llamacpp::Engine::Ik,
                a.ik_llama_cpp_dir.as_deref(),
            )
            .map_err(|e| anyhow!("--peer ik: {e}"))?,
        );
    }
    if let (true, Some(tools)) = (ladder_wanted, &plan.tools) {
        plan.ladder = crate::ladder::plan(
            &ask(plan.calib_text.as_ref()),
            tools,
            plan.ik_tools.as_ref(),
        )?;
    }
    // A --gguf label the ladder also makes would be two rows of one name.
    let ladder_rows = plan.ladder_row_names();
    if let Some(clash) = plan
        .formats
        .iter()
        .find(|f| ladder_rows.contains(&f.name()))
    {
        bail!(
            "'{}' is both a --gguf row and a row of llama.cpp's ladder; give the file another label (--gguf LABEL=PATH) or drop it from --ladder",
            clash.name()
        );
    }
    for w in noop_warnings(a, &plan)
        .into_iter()
        .chain(depth_unmeasured(&plan))
    {
        ui.warn(&w);
    }
    if let Some(path) = &a.baseline {
        let results = json::read(path).context("reading --baseline")?;
        gate::check_before_load(&results, &plan.identity_known_before_load())
            .with_context(|| format!("--baseline '{}'", path.display()))?;
        plan.baseline = Some(Baseline {
            path: path.clone(),
            results,
        });
    }
    Ok(plan)
}

/// What the runners need that is known without the model or any file.
fn check_runners(formats: &[FormatSpec], kld: KldMode, compare_to: Option<&str>) -> Result<()> {
    let has_reference = formats.iter().any(FormatSpec::is_reference);
    if kld == KldMode::On && !has_reference {
        bail!("--kld compares against the float32 reference, which is not in --formats; add float32 to --formats");
    }
    if let Some(row) = compare_to {
        ensure!(
            formats.iter().any(|f| f.name() == row),
            "--compare-to '{row}' is not a row of this run; pass one of: {}",
            formats
                .iter()
                .map(FormatSpec::name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        ensure!(
            has_reference && kld != KldMode::Off,
            "--compare-to pairs rows token by token through the float32 reference's log-probs; add float32 to --formats (and drop --no-kld)"
        );
    }
    if formats.iter().any(|f| matches!(f, FormatSpec::Kwk { .. })) {
        // A forced kernel tier this CPU cannot run would measure another tier.
        kwk::kernels::check_isa_env().map_err(|e| anyhow!(e))?;
    }
    Ok(())
}

impl RunPlan {
    /// The identity fields a baseline can be checked against before the model is loaded.
    pub fn identity_known_before_load(&self) -> gate::PlannedIdentity {
        let mut rows: Vec<String> = self.formats.iter().map(FormatSpec::name).collect();
        rows.extend(self.ladder_row_names());
        gate::PlannedIdentity {
            text_sha256: self.text.sha256.clone(),
            ctx: self.ctx,
            max_chunks: self.max_chunks,
            llama_kv_type: self.llama_kv.as_str().to_string(),
            rows,
        }
    }

    /// The names of the rows the ladder will add (its F32 base and every rung, on each
    /// peer), known before any GGUF is made.
    pub fn ladder_row_names(&self) -> Vec<String> {
        let Some(l) = &self.ladder else {
            return Vec::new();
        };
        let base = crate::ladder::Rung {
            qtype: "F32".into(),
            imatrix: false,
            maker: Engine::LlamaCpp,
        };
        std::iter::once(&base)
            .chain(&l.rungs)
            .flat_map(|rung| crate::ladder::rows_on_peers(&rung.row(PathBuf::new()), &self.peers))
            .map(|row| row.name())
            .collect()
    }

    /// Whether any row runs on llama.cpp (a GGUF given or made).
    pub fn has_llamacpp(&self) -> bool {
        self.ladder.is_some()
            || self
                .formats
                .iter()
                .any(|s| matches!(s, FormatSpec::Gguf { .. }))
    }
}

/// One line for each engine whose llama-bench has no `-d` (ik_llama.cpp's) when its rows
/// are timed at depths other than 0: those points are left unmeasured (never timed at depth
/// 0 and recorded as deeper); its depth-0 points are measured as usual.
fn depth_unmeasured(plan: &RunPlan) -> Vec<String> {
    let deep: Vec<String> = plan
        .speed_axes
        .depth
        .iter()
        .filter(|&&d| d > 0)
        .map(usize::to_string)
        .collect();
    if plan.speed.is_none() || !plan.llama_bench || deep.is_empty() {
        return Vec::new();
    }
    [&plan.tools, &plan.ik_tools]
        .into_iter()
        .flatten()
        .filter(|t| !t.bench_knows_depth())
        .map(|t| {
            format!(
                "{}'s llama-bench has no -d (--n-depth): its rows are not timed at depth {} (those points stay empty; nothing is timed at depth 0 in their place)",
                t.engine().project(),
                deep.join(",")
            )
        })
        .collect()
}

/// One line for each flag that changes nothing in this run, naming the flag and why
/// (the run goes on).
pub fn noop_warnings(a: &EvalOptions, plan: &RunPlan) -> Vec<String> {
    let mut w = Vec::new();
    let llama = plan.has_llamacpp();
    let kwk = plan.has_kwk();
    if a.llama_bench && !llama {
        w.push(match a.ladder {
            crate::ladder::LadderChoice::Off => "--llama-bench does nothing: there is no llama.cpp row (--ladder none and no --gguf); drop --ladder none or pass --gguf FILE".to_string(),
            _ => "--llama-bench does nothing: there is no llama.cpp row; pass --gguf FILE or --ladder".to_string(),
        });
    }
    if a.llama_bench && a.no_speed && llama {
        w.push("--llama-bench does nothing with --no-speed: no speed test runs".to_string());
    }
    if a.llama_fa.is_some() {
        if !llama {
            w.push(
                "--llama-fa does nothing: there is no llama.cpp row (pass --gguf FILE or --ladder)"
                    .to_string(),
            );
        } else if a.no_speed {
            w.push("--llama-fa does nothing with --no-speed: llama-bench does not run (llama-perplexity keeps its own -fa)".to_string());
        } else if !a.llama_bench {
            w.push("--llama-fa does nothing without --llama-bench: llama.cpp rows get no speed test (llama-perplexity keeps its own -fa)".to_string());
        }
    }
    if !llama {
        if a.llama_cpp_dir.is_some() {
            w.push("--llama-cpp-dir does nothing: there is no llama.cpp row (pass --gguf FILE or --ladder)".to_string());
        }
        if a.tool_timeout.is_some() {
            w.push("--tool-timeout does nothing: no llama.cpp tool runs (pass --gguf FILE or --ladder)".to_string());
        }
        if a.llama_kv != llamacpp::KvType::F16 {
            w.push(
                "--llama-kv does nothing: there is no llama.cpp row (pass --gguf FILE or --ladder)"
                    .to_string(),
            );
        }
    }
    let ladder_imatrix = plan
        .ladder
        .as_ref()
        .is_some_and(|l| l.rungs.iter().any(|r| r.imatrix));
    if a.calib_text.is_some() && !plan.needs_calibration() && !ladder_imatrix {
        w.push("--calib-text does nothing: no format calibrates (int8:calib, int4:calib, int4:gptq, ...) and no ladder row is +imatrix".to_string());
    }
    if a.ik_llama_cpp_dir.is_some() && plan.ik_tools.is_none() {
        w.push("--ik-llama-cpp-dir does nothing: no row runs on ik_llama.cpp (pass --peer llama.cpp,ik with --gguf FILE or --ladder)".to_string());
    }
    if plan.peers != [Engine::LlamaCpp] && !llama {
        w.push(
            "--peer does nothing: there is no GGUF row (pass --gguf FILE or --ladder)".to_string(),
        );
    }
    if a.calib_range.is_some() && ladder_imatrix {
        w.push("--calib-range applies to kwk's calibration only: llama-imatrix reads the whole --calib-text (its first chunks)".to_string());
    }
    if !kwk && (a.pack_cache.is_some() || a.no_pack_cache) {
        w.push(format!(
            "{} does nothing: no in-tree format runs",
            if a.no_pack_cache {
                "--no-pack-cache"
            } else {
                "--pack-cache"
            }
        ));
    }
    if a.keep_logits && a.reference.is_some() {
        w.push("--keep-logits does nothing with --reference: the reference log-probs are loaded, not written".to_string());
    } else if a.keep_logits && !plan.has_reference() {
        w.push("--keep-logits does nothing: float32 is not in --formats, so there are no reference log-probs".to_string());
    }
    if a.no_speed
        && (a.reps != DEFAULT_REPS
            || a.pp != [DEFAULT_PP]
            || a.tg != [DEFAULT_TG]
            || a.depth != [0])
    {
        w.push("--pp/--tg/--depth/--reps do nothing with --no-speed".to_string());
    }
    w
}

/// The largest value of a list (0 for an empty one).
fn max_of(v: &[usize]) -> usize {
    v.iter().copied().max().unwrap_or(0)
}

/// The speed flags' defaults (`cli`), to tell a flag given with --no-speed.
pub const DEFAULT_PP: usize = 512;
pub const DEFAULT_TG: usize = 128;
pub const DEFAULT_REPS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    /// Both default lists name formats that parse, float32 (the reference) first.
    #[test]
    fn the_default_format_lists_parse() {
        for ladder in [false, true] {
            let f = default_formats(ladder).unwrap();
            assert!(f[0].is_reference());
            assert!(f.len() >= 4);
        }
        assert_eq!(default_formats(true).unwrap().len(), 7);
    }

    /// Same file names in different folders widen to as many trailing components as it
    /// takes; unique file names stay as they are; explicit labels are kept; only the same
    /// canonical file twice is refused.
    #[test]
    fn gguf_labels_are_unique_and_minimal() {
        let tmp = tempfile::tempdir().unwrap();
        let mk = |rel: &str| {
            let p = tmp.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"GGUF....").unwrap();
            p
        };
        let paths = [
            mk("x/a/model.gguf"),
            mk("y/a/model.gguf"),
            mk("b/model.gguf"),
            mk("other.gguf"),
            mk("z/model.gguf"),
        ];
        let mut args: Vec<PathBuf> = paths[..4].to_vec();
        args.push(PathBuf::from(format!("mine={}", paths[4].display())));
        let names: Vec<String> = order_formats(&[], &args, false)
            .unwrap()
            .iter()
            .map(FormatSpec::name)
            .collect();
        let tmp_name = tmp
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            names,
            [
                "gguf:x/a/model.gguf".to_string(),
                "gguf:y/a/model.gguf".into(),
                format!("gguf:{tmp_name}/b/model.gguf"),
                "gguf:other.gguf".into(),
                "gguf:mine".into(),
            ]
        );
        let twice = [paths[0].clone(), tmp.path().join("x/a/../a/model.gguf")];
        let e = format!("{:#}", order_formats(&[], &twice, false).unwrap_err());
        assert!(e.contains("is asked for twice"), "{e}");
        let clash = [
            PathBuf::from(format!("q={}", paths[0].display())),
            PathBuf::from(format!("q={}", paths[1].display())),
        ];
        let e = format!("{:#}", order_formats(&[], &clash, false).unwrap_err());
        assert!(e.contains("'gguf:q' names two GGUF files"), "{e}");
    }
}
