//! The measure loop. Quality first, one runner after another in run order (float32 first:
//! it writes the reference log-probs the others are compared with): build, perplexity,
//! per-token comparison, and the reports rewritten after each row. Then speed in
//! interleaved rounds: round r times repetition r of every runner still standing, the
//! order rotated by one each round, so machine drift lands on every row alike rather than
//! on whichever engine ran last; the order is recorded in `speed_rounds`. Runners are kept
//! until the speed rounds end (all formats in memory at once); with `--no-speed` each is
//! dropped after its perplexity. A runner that fails, or panics, gets an `error` in its row
//! and the others still run.
//!
//! A stop request ([`crate::interrupt`]: SIGINT/SIGTERM) ends the loop after the current
//! step: a row the interrupt cut short is dropped (only finished rows are kept), the speed
//! rounds stop and no row gets speed figures from a partial set of rounds. The reports are
//! handed to `save` after each row (it decides what a failed write means).

use crate::eval::paired::paired_change;
use crate::interrupt;
use crate::plan::RunPlan;
use crate::prepare::Prepared;
use crate::protocol::points::{PointSpeed, SpeedAxes};
use crate::protocol::results::{Machine, Results, RunnerRecord};
use crate::protocol::steadiness::Steadiness;
use crate::protocol::{
    ComputeKind, Engine, FormatSpec, PerplexityResult, ReferenceStamp, RooflineCost, SpeedRep,
    SpeedSpec, TokenScores,
};
use crate::runner::kwk::{KwkRunner, KwkRunnerOptions, ReferenceRole, ReferenceTarget};
use crate::runner::llamacpp::{LlamaCppRunner, LlamaCppRunnerOptions};
use crate::runner::Runner;
use crate::stats::{finite, speed_sample};
use crate::ui::Reporter;
use anyhow::{Context, Result};
use std::rc::Rc;

mod fa_pick;

/// A runner that measured its quality, kept for the speed rounds.
struct Live {
    index: usize,
    runner: Box<dyn Runner>,
    /// Per run of a round (`SpeedAxes::specs`, the first is the primary point): the pp and
    /// tg samples, each with its round.
    pp: Vec<Vec<(usize, f64)>>,
    tg: Vec<Vec<(usize, f64)>>,
    /// llama-bench's rows: per run, the pp and tg samples of each flash-attention setting,
    /// until [`fa_pick`] puts the faster setting's into `pp`/`tg` after the rounds.
    fa_pp: Vec<fa_pick::BySetting>,
    fa_tg: Vec<fa_pick::BySetting>,
    /// The read bandwidth around each primary `tg` sample's repetition, GB/s (with peaks only).
    tg_read: Vec<f64>,
    raw: Vec<serde_json::Value>,
}

/// The read probes of the speed rounds: the active tier's, and the best tier's when
/// `KWK_ISA` forced a lower one (llama.cpp picks its own kernels, so its rows are put
/// against the best tier's ceilings).
struct ReadProbes {
    active: kwk::roofline::ReadProbe,
    best: Option<kwk::roofline::ReadProbe>,
}

impl ReadProbes {
    /// Passes per probe around a repetition (the best is taken): two passes over the
    /// probe's buffer take tens of milliseconds.
    const AROUND_PASSES: usize = 2;

    /// The probe of the tier `runner`'s ceiling is on, and whether that is the best tier's
    /// (`machine.peaks_best_tier`) rather than the active one's (`machine.peaks`).
    fn for_runner(&self, runner: &dyn Runner) -> (&kwk::roofline::ReadProbe, bool) {
        let best_kernels = runner
            .info()
            .roofline
            .as_ref()
            .is_some_and(|c| c.best_kernels);
        match (&self.best, best_kernels) {
            (Some(best), true) => (best, true),
            _ => (&self.active, false),
        }
    }

    /// Probes the bandwidth with `probe` and records it among the read probes of the
    /// ceiling it belongs to (each read ceiling is the best probe of the run).
    fn probe_into(
        machine: &mut Machine,
        (probe, best_tier): (&kwk::roofline::ReadProbe, bool),
    ) -> f64 {
        let gbps = probe.best_gbps(Self::AROUND_PASSES);
        let peaks = match best_tier {
            true => machine.peaks_best_tier.as_mut(),
            false => machine.peaks.as_mut(),
        };
        if let Some(p) = peaks {
            p.add_read_probe(gbps);
        }
        gbps
    }
}

/// Builds llama.cpp runners for every GGUF of the plan: reads and checks each header (no
/// subprocess), so a bad file fails before the model is loaded.
pub fn build_llamacpp(plan: &RunPlan) -> Result<Vec<Option<Box<dyn Runner>>>> {
    plan.formats
        .iter()
        .map(|f| match f {
            FormatSpec::Gguf { path, engine, .. } => {
                let tools = match engine {
                    Engine::Ik => plan.ik_tools.as_ref(),
                    _ => plan.tools.as_ref(),
                }
                .ok_or_else(|| anyhow::anyhow!("{engine}'s tools were not located"))?;
                let options = LlamaCppRunnerOptions {
                    threads: plan.threads,
                    kv_type: plan.llama_kv,
                    run_bench: plan.llama_bench,
                    bench_fa: plan.llama_fa,
                    timeout: plan.tool_timeout,
                    ..Default::default()
                };
                let r = LlamaCppRunner::new(path, tools, options)?.with_name(f.name());
                Ok(Some(Box::new(r) as Box<dyn Runner>))
            }
            _ => Ok(None),
        })
        .collect()
}

/// The in-tree runner of `spec` (packed now).
fn build_kwk(
    plan: &RunPlan,
    prep: &Prepared,
    spec: &FormatSpec,
    ui: &dyn Reporter,
) -> Result<Box<dyn Runner>> {
    let (
        FormatSpec::Kwk {
            name, precision, ..
        },
        Some(kv),
    ) = (spec, spec.kwk_kv(plan.kv))
    else {
        anyhow::bail!("'{}' is not an in-tree format", spec.name());
    };
    let role = match (&prep.protocol.reference_logits, &prep.reference_partial) {
        (Some(path), Some(partial)) if spec.is_reference() => {
            let r = &prep.results;
            ReferenceRole::Writes(ReferenceTarget {
                partial: partial.clone(),
                path: path.clone(),
                stamp: ReferenceStamp {
                    model: r.model.clone(),
                    model_sha256: r.protocol.model_sha256.clone(),
                    text: r.protocol.text.clone(),
                    text_sha256: r.protocol.text_sha256.clone(),
                    tokens_sha256: r.protocol.tokens_sha256.clone(),
                    made_by: format!(
                        "kwk-eval {} ({}), run started {}",
                        r.versions.kwk_eval,
                        r.versions.kwk.as_deref().unwrap_or("commit unknown"),
                        r.started_utc
                    ),
                },
            })
        }
        _ => ReferenceRole::Compared,
    };
    let options = KwkRunnerOptions {
        threads: plan.threads,
        // The reference keeps a float32 cache: the other rows' KLD then includes their
        // cache's cost (each row's own: `--kv`, or its `+kv:` suffix's).
        kv,
        max_cache_len: prep.max_cache_len,
        calibration_tokens: prep.calibration_tokens.clone(),
        pack_cache_dir: plan.pack_cache_dir.clone(),
    };
    // Checked again as the row is built: what earlier rows keep is resident by now, and
    // the machine may have less than at the start.
    let need = kwk::decoder::resident::resident_need(
        &prep.model.config,
        precision,
        kv,
        prep.max_cache_len,
        kwk::decoder::resident::Build::FromHeader,
    );
    kwk::decoder::resident::check_fits(
        &crate::limits::row_label(name, &plan.llm),
        &need,
        0,
        kwk::decoder::resident::available_memory(),
        crate::limits::MEMORY_HINT,
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let r = KwkRunner::new(Rc::clone(&prep.model), name, *precision, &options, role)?;
    if let (Some(dir), Some(o)) = (&plan.pack_cache_dir, r.pack_cache_outcome()) {
        if let Some(w) = crate::cache_dir::outcome_warning(dir, name, o) {
            ui.warn_once(&w);
        }
    }
    Ok(Box::new(r))
}

/// Perplexity of one runner into its row; the per-token scores when compared.
fn quality(
    runner: &mut dyn Runner,
    step: &str,
    prep: &Prepared,
    reference_ready: bool,
    is_reference: bool,
    ui: &dyn Reporter,
) -> (RunnerRecord, Option<TokenScores>) {
    let mut rec = RunnerRecord::from_info(runner.info());
    let name = rec.name.clone();
    let mut protocol = prep.protocol.clone();
    // The reference runner writes the file whatever the protocol says (its role); the
    // others compare only once it is complete.
    if !reference_ready {
        protocol.reference_logits = None;
    }
    let ppl = match (&prep.loaded_reference, &protocol.reference_logits) {
        (Some(id), Some(path)) if is_reference => {
            ui.line(&format!(
                "{step} {name}: perplexity from --reference '{}' (not computed again)",
                path.display()
            ));
            loaded_perplexity(id, path, prep)
        }
        _ => {
            ui.line(&format!("{step} {name}: perplexity"));
            let bar = ui.progress(&format!("{name} perplexity"));
            let ppl = runner.perplexity(&protocol, &prep.stream, bar.as_ref());
            drop(bar);
            ppl
        }
    };
    let p = match ppl.and_then(|p| {
        finite("perplexity", p.ppl)?;
        finite("perplexity error", p.ppl_err)?;
        Ok(p)
    }) {
        Ok(p) => p,
        Err(e) => {
            rec.fail(format!("perplexity: {e:#}"));
            return (rec, None);
        }
    };
    ui.line(&format!(
        "{step} {name}: PPL {:.4} ± {:.5}",
        p.ppl, p.ppl_err
    ));
    rec.set_perplexity(&p);
    // llama.cpp names the features its build was compiled with as it starts.
    if rec.kernels.is_none() {
        rec.kernels = runner.info().kernels.clone();
    }
    (rec, p.tokens)
}

/// The float32 row's perplexity and per-token figures as the run that wrote the loaded
/// reference measured them (its trailer; the NLL decoded from its records).
fn loaded_perplexity(
    id: &crate::eval::base_file::ReferenceIdentity,
    path: &std::path::Path,
    prep: &Prepared,
) -> Result<PerplexityResult> {
    let tokens =
        crate::eval::base_file::reference_scores(path, &prep.protocol.plan, &prep.stream.tokens)?;
    Ok(PerplexityResult {
        ppl: id.ppl,
        ppl_err: id.ppl_err,
        running: id.running_ppl.clone(),
        scored_tokens: id.scored_tokens,
        tokens_match: None,
        reference: None,
        tokens: Some(tokens),
        peak_rss_bytes: None,
    })
}

/// The quality pass over every format; returns the runners kept for speed.
fn quality_pass(
    plan: &RunPlan,
    prep: &Prepared,
    results: &mut Results,
    save: &mut dyn FnMut(&Results),
    ui: &dyn Reporter,
) -> Result<(Vec<Live>, Vec<Option<TokenScores>>)> {
    let mut gguf = build_llamacpp(plan)?;
    let (mut live, mut scores) = (Vec::new(), Vec::new());
    let mut reference_ready = prep.loaded_reference.is_some();
    let total = plan.formats.len();
    for (i, spec) in plan.formats.iter().enumerate() {
        if interrupt::requested() {
            break;
        }
        let step = format!("[{}/{total}]", i + 1);
        // kwk rows: the row's own resident memory, over its build and over its perplexity
        // (RunnerRecord::peak_rss_bytes says how).
        let kwk_row = spec.engine() == Engine::Kwk;
        let before_build = kwk_row.then(crate::machine::rss_bytes).flatten();
        let build_reset = before_build.is_some() && crate::machine::reset_peak_rss();
        let (mut build_hwm, mut run_reset) = (None, false);
        let prebuilt = gguf[i].take();
        // A panic while building or scoring this row fails the row only.
        let row = contain(|| {
            let built = match prebuilt {
                Some(r) => Ok(r),
                None => {
                    ui.line(&format!("{step} {}: packing", spec.name()));
                    build_kwk(plan, prep, spec, ui)
                }
            };
            if build_reset {
                build_hwm = crate::machine::peak_rss_bytes();
                run_reset = crate::machine::reset_peak_rss();
            }
            match built {
                Ok(mut runner) => {
                    test_hook_panic(&spec.name(), Phase::Quality, ui);
                    let (rec, tokens) = quality(
                        runner.as_mut(),
                        &step,
                        prep,
                        reference_ready,
                        spec.is_reference(),
                        ui,
                    );
                    (rec, tokens, Some(runner))
                }
                Err(e) => (
                    RunnerRecord::failed(&spec.name(), spec.engine(), format!("{e:#}")),
                    None,
                    None,
                ),
            }
        });
        let (mut record, tokens) = match row {
            Ok((rec, tokens, runner)) => {
                let wrote = spec.is_reference()
                    && rec.error.is_none()
                    && tokens.is_some()
                    && !reference_ready;
                if wrote {
                    record_written_reference(prep, results, ui);
                }
                reference_ready |= wrote;
                if let (Some(runner), None, Some(_)) = (runner, &rec.error, &plan.speed) {
                    let runs = plan.speed_axes.specs(1).len();
                    live.push(Live {
                        index: i,
                        runner,
                        pp: vec![Vec::new(); runs],
                        tg: vec![Vec::new(); runs],
                        fa_pp: vec![Default::default(); runs],
                        fa_tg: vec![Default::default(); runs],
                        tg_read: Vec::new(),
                        raw: Vec::new(),
                    });
                }
                (rec, tokens)
            }
            Err(panic) => (
                RunnerRecord::failed(&spec.name(), spec.engine(), panic),
                None,
            ),
        };
        if run_reset {
            let own = |hwm: Option<u64>| {
                Some(crate::machine::startup_rss_bytes()? + hwm?.saturating_sub(before_build?))
            };
            record.peak_rss_bytes = own(crate::machine::peak_rss_bytes());
            record.pack_peak_rss_bytes = own(build_hwm);
        }
        if let Some((_, made)) = plan.made.iter().find(|(n, _)| *n == record.name) {
            record.made = Some(made.clone());
        }
        if let Some((_, labels)) = plan.stands_for.iter().find(|(n, _)| *n == record.name) {
            record.stands_for = labels.clone();
        }
        if record.error.is_some() && interrupt::requested() {
            // Cut short by the interrupt, not finished: not a row.
            ui.line(&format!("{step} {}: stopped (interrupted)", record.name));
            break;
        }
        if let Some(e) = &record.error {
            ui.line(&format!("{step} {}: FAILED: {e}", record.name));
        }
        results.runners.push(record);
        scores.push(tokens);
        results.update_deltas();
        save(results);
    }
    Ok((live, scores))
}

/// The digest of the reference file the float32 row just wrote, into the results.
fn record_written_reference(prep: &Prepared, results: &mut Results, ui: &dyn Reporter) {
    let Some(path) = &prep.protocol.reference_logits else {
        return;
    };
    match crate::eval::base_file::read_identity(path) {
        Ok(id) => {
            results.protocol.reference = Some(crate::protocol::results::ReferenceUse {
                sha256: id.body_sha256,
                source: "computed".into(),
                file: Some(path.display().to_string()),
            })
        }
        Err(e) => ui.warn(&format!("{e:#}")),
    }
}

/// Runs one row's work, turning a panic inside it into `Err("panicked: <message>")` so the
/// row fails and the run goes on with the next. The runner that panicked is dropped, never
/// used again; the shared model is only read by runners.
fn contain<T>(work: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        format!("panicked: {msg}")
    })
}

/// Where [`TEST_PANIC_ROW_ENV`] makes a row panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Quality,
    Speed,
}

/// Test hook (tests/cli_run.rs): `KWK_TEST_PANIC_ROW=NAME` makes row NAME panic before its
/// perplexity, `NAME@speed` in its first speed repetition, to prove a panicking runner
/// fails only its row. Never set in normal use; when set, the run says so on stderr and the
/// row's error names the variable.
pub const TEST_PANIC_ROW_ENV: &str = "KWK_TEST_PANIC_ROW";

fn test_hook_panic(row: &str, phase: Phase, ui: &dyn Reporter) {
    let Some(v) = std::env::var_os(TEST_PANIC_ROW_ENV) else {
        return;
    };
    let v = v.to_string_lossy();
    let (name, at) = match v.strip_suffix("@speed") {
        Some(n) => (n, Phase::Speed),
        None => (&*v, Phase::Quality),
    };
    if name == row && at == phase {
        ui.note(&format!(
            "{TEST_PANIC_ROW_ENV}={v} is set: row {row} panics now (a test hook)"
        ));
        panic!("{TEST_PANIC_ROW_ENV} asked row '{row}' to panic");
    }
}

/// Every row's paired differences against the `--compare-to` row.
fn compare_rows(
    plan: &RunPlan,
    results: &mut Results,
    scores: &[Option<TokenScores>],
    ui: &dyn Reporter,
) -> Result<()> {
    let Some(name) = &plan.compare_to else {
        return Ok(());
    };
    let Some(i) = results.runners.iter().position(|r| &r.name == name) else {
        return Ok(());
    };
    let Some(other) = &scores[i] else {
        ui.note(&format!(
            "--compare-to '{name}' has no per-token figures (it failed); no paired comparison"
        ));
        return Ok(());
    };
    for (row, s) in results.runners.iter_mut().zip(scores) {
        if let (Some(s), false) = (s, &row.name == name) {
            row.compare_to = Some(
                paired_change(s, other, name).with_context(|| format!("{} vs {name}", row.name))?,
            );
        }
    }
    Ok(())
}

/// One round: repetition `round` of every live runner at every point (`specs`, point by
/// point, all runners at a point before the next), the runners' order rotated by `round`.
/// With `probes`, each repetition of the primary point is bracketed by read probes
/// (`Live::tg_read`). The order is the runners' at the primary point.
fn speed_round(
    live: &mut [Live],
    specs: &[SpeedSpec],
    round: usize,
    probes: Option<&ReadProbes>,
    results: &mut Results,
    ui: &dyn Reporter,
) -> Vec<String> {
    let n = live.len();
    let mut order = Vec::with_capacity(n);
    for (si, spec) in specs.iter().enumerate() {
        for k in 0..n {
            let l = &mut live[(k + round) % n];
            let row = &mut results.runners[l.index];
            if row.error.is_some() || interrupt::requested() {
                continue;
            }
            let name = row.name.clone();
            let point = match specs.len() {
                1 => String::new(),
                _ => format!(", point {}/{}", si + 1, specs.len()),
            };
            ui.line(&format!(
                "  speed round {}/{}{point}, row {}/{n}: {name}",
                round + 1,
                spec.reps,
                k + 1
            ));
            let probe = (si == 0)
                .then(|| probes.map(|p| p.for_runner(l.runner.as_ref())))
                .flatten();
            let before = probe.map(|p| ReadProbes::probe_into(&mut results.machine, p));
            let rep = contain(|| {
                test_hook_panic(&name, Phase::Speed, ui);
                l.runner.speed_rep(spec)
            })
            .unwrap_or_else(|panic| Err(anyhow::anyhow!(panic)));
            let after = probe.map(|p| ReadProbes::probe_into(&mut results.machine, p));
            match rep {
                Ok(Some(SpeedRep {
                    pp,
                    tg,
                    raw,
                    by_flash_attn,
                })) => {
                    l.pp[si].extend(pp.map(|v| (round, v)));
                    let timed_tg = tg.is_some() || by_flash_attn.iter().any(|f| f.tg.is_some());
                    if let (Some(b), Some(a), true) = (before, after, timed_tg) {
                        l.tg_read.push((b + a) / 2.0);
                    }
                    l.tg[si].extend(tg.map(|v| (round, v)));
                    for f in by_flash_attn {
                        let at = |m: &mut fa_pick::BySetting, v: Option<f64>| {
                            m.entry(f.flash_attn)
                                .or_default()
                                .extend(v.map(|v| (round, v)))
                        };
                        at(&mut l.fa_pp[si], f.pp);
                        at(&mut l.fa_tg[si], f.tg);
                    }
                    if let Some(serde_json::Value::Array(v)) = raw {
                        l.raw.extend(v);
                    }
                    if si == 0 {
                        order.push(row.name.clone());
                    }
                }
                Ok(None) => {}
                Err(_) if interrupt::requested() => {}
                Err(e) => row.fail(format!("speed: {e:#}")),
            }
        }
    }
    order
}

/// A llama-bench row's faster flash-attention setting per test (`[pp, tg]` of each run),
/// whose samples become the row's (`pp`/`tg`); nothing for rows without the setting.
fn pick_flash_attn(axes: &SpeedAxes, specs: &[SpeedSpec], l: &mut Live) -> Result<Vec<Picks>> {
    let mut out = Vec::new();
    for (si, spec) in specs.iter().enumerate() {
        let mut picks: Picks = [None, None];
        for (k, (kind, n)) in [("pp", spec.pp), ("tg", spec.tg)].into_iter().enumerate() {
            let settings = if k == 0 { &l.fa_pp[si] } else { &l.fa_tg[si] };
            let test = axes.test_name(kind, n, spec.depth, spec.threads);
            if let Some(p) = fa_pick::faster(&test, settings)? {
                let samples = if k == 0 { &mut l.pp[si] } else { &mut l.tg[si] };
                *samples = p.samples.clone();
                picks[k] = Some(p);
            }
        }
        out.push(picks);
    }
    Ok(out)
}

/// The flash-attention picks of a run's pp and tg tests.
type Picks = [Option<fa_pick::Pick>; 2];

/// The row's figures at every point: one [`PointSpeed`] per test of each run of `specs`.
fn point_records(
    axes: &SpeedAxes,
    specs: &[SpeedSpec],
    l: &Live,
    picks: &[Picks],
) -> Result<Vec<PointSpeed>> {
    let mut out = Vec::new();
    for (si, spec) in specs.iter().enumerate() {
        for (k, (kind, n, samples)) in [("pp", spec.pp, &l.pp[si]), ("tg", spec.tg, &l.tg[si])]
            .into_iter()
            .enumerate()
        {
            if n == 0 {
                continue;
            }
            let pick = picks.get(si).and_then(|p| p[k].as_ref());
            let test = axes.test_name(kind, n, spec.depth, spec.threads);
            let values: Vec<f64> = samples.iter().map(|s| s.1).collect();
            let summary = (!values.is_empty())
                .then(|| speed_sample(&test, values.clone()))
                .transpose()?;
            out.push(PointSpeed {
                test,
                kind: kind.into(),
                tokens: n,
                depth: spec.depth,
                threads: spec.threads,
                primary: si == 0,
                tokens_per_s: summary.as_ref().map(|s| s.tokens_per_s),
                tokens_per_s_std: summary.as_ref().map(|s| s.tokens_per_s_std),
                samples_tokens_per_s: values,
                rounds: samples.iter().map(|s| s.0).collect(),
                flash_attn: pick.map(|p| p.flash_attn),
                by_flash_attn: pick.map(|p| p.by_setting.clone()).unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// The speed rounds; each row's samples summarized once all rounds are done.
fn speed_pass(
    plan: &RunPlan,
    config: &kwk::ModelConfig,
    live: &mut [Live],
    results: &mut Results,
    save: &mut dyn FnMut(&Results),
    ui: &dyn Reporter,
) -> Result<()> {
    let Some(spec) = &plan.speed else {
        return Ok(());
    };
    if live.is_empty() {
        return Ok(());
    }
    let specs = plan.speed_axes.specs(spec.reps);
    // The read ceiling is probed again before every round, so it sees the same drift as
    // the generation rates it divides (see `kwk::roofline::ReadProbe`), and around
    // every repetition, so each generation rate also has the bandwidth of its own moment
    // (`tg_roofline_paired_pct`).
    let probes = results.machine.peaks.is_some().then(|| {
        let probe = |isa| kwk::roofline::ReadProbe::for_this_machine(isa, plan.threads);
        ReadProbes {
            active: probe(kwk::kernels::active_isa()),
            best: (results.machine.peaks_best_tier.is_some())
                .then(|| probe(kwk::kernels::best_isa())),
        }
    });
    // How quiet the machine stays during the rounds: its CPU counters before and after,
    // and the read probes taken in between.
    let quiet_from = (
        crate::machine::cpu_snapshot(),
        results
            .machine
            .peaks
            .as_ref()
            .map_or(0, |p| p.read_gbps_probes.len()),
    );
    for round in 0..spec.reps {
        if interrupt::requested() {
            // Speed from some of the rounds only would not be the protocol's figure.
            return Ok(());
        }
        let what = match specs.len() {
            1 => format!("pp{} tg{}", spec.pp, spec.tg),
            n => format!("{n} points"),
        };
        ui.line(&format!("speed round {}/{}: {what}", round + 1, spec.reps));
        if let Some(probes) = &probes {
            let gbps = probes.active.best_gbps(3);
            let m = &mut results.machine;
            m.peaks
                .iter_mut()
                .chain(m.peaks_best_tier.iter_mut())
                .for_each(|p| p.add_read_probe(gbps));
            // The compute ceilings too: a busy host during one measurement must not leave
            // a ceiling the rows then exceed.
            if let Some(p) = m.peaks.as_mut() {
                p.add_compute_probe(kwk::kernels::active_isa());
            }
            if let Some(p) = m.peaks_best_tier.as_mut() {
                p.add_compute_probe(kwk::kernels::best_isa());
            }
        }
        let order = speed_round(live, &specs, round, probes.as_ref(), results, ui);
        results.speed_rounds.push(order);
    }
    if interrupt::requested() {
        return Ok(());
    }
    if let (Some(start), Some(end)) = (quiet_from.0, crate::machine::cpu_snapshot()) {
        let probes = results.machine.peaks.as_ref().map_or(&[][..], |p| {
            &p.read_gbps_probes[quiet_from.1.min(p.read_gbps_probes.len())..]
        });
        let cores = crate::machine::available_threads();
        let steadiness = Steadiness::judge(&start, &end, probes, cores);
        if let Some(w) = steadiness.warning() {
            ui.warn(&w);
        }
        results.machine.steadiness = Some(steadiness);
    }
    for l in live.iter_mut() {
        let row = &mut results.runners[l.index];
        let picks = match pick_flash_attn(&plan.speed_axes, &specs, l) {
            Ok(p) => p,
            Err(e) => {
                row.fail(format!("speed: {e:#}"));
                continue;
            }
        };
        let summary = |what: &str, v: &[f64]| {
            (!v.is_empty())
                .then(|| speed_sample(what, v.to_vec()))
                .transpose()
        };
        let values = |v: &[(usize, f64)]| v.iter().map(|s| s.1).collect::<Vec<f64>>();
        match (
            summary("pp", &values(&l.pp[0])),
            summary("tg", &values(&l.tg[0])),
        ) {
            (Ok(pp), Ok(tg)) => row.set_speed(pp.as_ref(), tg.as_ref()),
            (Err(e), _) | (_, Err(e)) => row.fail(format!("speed: {e:#}")),
        }
        match point_records(&plan.speed_axes, &specs, l, &picks) {
            Ok(points) => row.speed_points = points,
            Err(e) => row.fail(format!("speed: {e:#}")),
        }
        if !l.raw.is_empty() {
            row.llama_bench = Some(serde_json::Value::Array(l.raw.clone()));
        }
        if l.tg_read.len() == l.tg[0].len() {
            row.tg_samples_read_gbps = l.tg_read.clone();
        }
    }
    for l in live.iter() {
        let (machine, row) = (&results.machine, &mut results.runners[l.index]);
        set_roofline(
            row,
            l.runner.info().roofline.as_ref(),
            config,
            spec,
            machine,
        );
    }
    results.speed_ratios = crate::protocol::speed_ratios::paired_speed_ratios(results);
    save(results);
    Ok(())
}

/// The read ceiling of a row that reads `bytes` per generated token: the last-level
/// cache's read bandwidth (`llc`) where they fit in that cache and it was measured, else
/// memory's (`dram`, the best probe of the run); its name and GB/s.
pub fn tg_ceiling(bytes: f64, peaks: &kwk::roofline::Peaks) -> (&'static str, f64) {
    match (peaks.llc_bytes, peaks.llc_read_gbps) {
        (Some(llc), Some(gbps)) if bytes <= llc as f64 && gbps > 0.0 => ("llc", gbps),
        _ => ("dram", peaks.read_gbps),
    }
}

/// The row's roofline columns: pp against the compute peak its kernels use, tg against the
/// read bandwidth ([`tg_ceiling`]; `kwk::model::cost` for the numerators; `machine.peaks`
/// for the ceilings, the best tier's for engines that pick their own kernels).
fn set_roofline(
    row: &mut RunnerRecord,
    cost: Option<&RooflineCost>,
    config: &kwk::ModelConfig,
    spec: &SpeedSpec,
    machine: &Machine,
) {
    let Some(cost) = cost else { return };
    let peaks = match (cost.best_kernels, &machine.peaks_best_tier) {
        (true, Some(best)) => Some(best),
        _ => machine.peaks.as_ref(),
    };
    let Some(peaks) = peaks else { return };
    // At a depth every prompt token also attends to the `depth` cached positions: QKᵀ and
    // PV, one multiply-add (2 operations) per head dimension each, as the cost model counts.
    let depth_ops =
        4.0 * (config.n_heads * config.head_dim * config.n_layers) as f64 * spec.depth as f64;
    let ops = kwk::model::cost::prompt_ops_per_token(config, spec.pp) + depth_ops;
    let bytes = cost.weight_bytes_per_token
        + kwk::model::cost::kv_bytes_per_token(
            config,
            cost.kv_bytes_per_value,
            spec.depth,
            spec.tg,
        );
    let compute_peak = match cost.compute {
        ComputeKind::Fp32 => peaks.fp32_gflops,
        ComputeKind::Bf16 => peaks.bf16_gflops.unwrap_or(peaks.fp32_gflops),
        ComputeKind::Int8 => peaks.int8_gops,
    } * 1e9;
    if spec.pp > 0 {
        row.pp_ops_per_token = Some(ops);
        row.pp_roofline_pct = row.pp_tokens_per_s.map(|t| 100.0 * t * ops / compute_peak);
    }
    if spec.tg > 0 {
        row.tg_bytes_per_token = Some(bytes);
        let (ceiling, gbps) = tg_ceiling(bytes, peaks);
        row.tg_ceiling = Some(ceiling.to_string());
        row.tg_roofline_pct = row
            .tg_tokens_per_s
            .map(|t| 100.0 * t * bytes / (gbps * 1e9));
        // Probes that do not line up with the samples (a repetition gave no tg) pair nothing;
        // the probes around repetitions read memory, not the cache: no pairing for `llc`.
        let lined_up = row.tg_samples_read_gbps.len() == row.tg_samples_tokens_per_s.len()
            && ceiling == "dram";
        let paired: Vec<f64> = if lined_up {
            row.tg_samples_tokens_per_s
                .iter()
                .zip(&row.tg_samples_read_gbps)
                .map(|(t, gbps)| 100.0 * t * bytes / (gbps * 1e9))
                .collect()
        } else {
            Vec::new()
        };
        row.tg_roofline_paired_pct = crate::stats::median(&paired);
    }
}

/// Quality of every format, paired comparisons, then interleaved speed; rows into
/// `results`, handed to `save` after each row and at the end.
pub fn run(
    plan: &RunPlan,
    prep: &Prepared,
    results: &mut Results,
    save: &mut dyn FnMut(&Results),
    ui: &dyn Reporter,
) -> Result<()> {
    let (mut live, scores) = quality_pass(plan, prep, results, save, ui)?;
    compare_rows(plan, results, &scores, ui)?;
    drop(scores);
    speed_pass(plan, &prep.model.config, &mut live, results, save, ui)
}

#[cfg(test)]
mod tests;
