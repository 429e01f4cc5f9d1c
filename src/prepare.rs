//! After the plan, before any runner: read the model's header (config and tokenizer; no
//! weights: each kwk row reads or streams them itself), hash its files, tokenize the
//! text once, fix the chunk plan, decide on the KL-divergence reference, check the
//! decoder's limits, the memory the kwk rows need, and the baseline's identity, tokenize the calibration text (refused
//! when it shares a run of tokens with the scored windows, unless `--calib-on-eval`), and
//! start the results file. Everything
//! here is shared by every runner of the run; nothing here measures.

use crate::eval::base_file::{base_file_bytes, read_verified, ReferenceIdentity};
use crate::limits::{row_label, MEMORY_HINT};
use crate::machine;
use crate::plan::{KldMode, RunPlan, KLD_AUTO_LIMIT_BYTES};
use crate::protocol::results::{
    Calibration, Machine, Protocol, ReferenceUse, Results, Versions, SCHEMA_VERSION,
};
use crate::protocol::{ChunkPlan, PerplexityProtocol, PlanError, TokenStream};
use crate::report::gate;
use crate::text::sha256_hex;
use crate::ui::Reporter;
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Calibration tokens passed to the calibrated formats (`int8:calib`, `int4:gptq`, ...; at most).
const MAX_CALIBRATION_TOKENS: usize = 32_768;

/// Fewest calibration tokens accepted (one window of statistics).
const MIN_CALIBRATION_TOKENS: usize = 512;

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

/// What every runner of the run shares.
pub struct Prepared {
    /// Config, tokenizer and source of the model; no weights (a kwk row streams int8/int4
    /// from the source or the pack cache, and reads float32 masters only for its own build).
    pub model: Rc<kwk::model::ModelHeader>,
    pub stream: TokenStream,
    pub protocol: PerplexityProtocol,
    /// Longest sequence a kwk runner's KV cache must hold: `max(ctx, pp + tg)`.
    pub max_cache_len: usize,
    pub calibration_tokens: Option<Vec<u32>>,
    /// The results file, no rows yet, `complete: false`.
    pub results: Results,
    /// The reference `--reference` loaded, checked against this run: float32's row takes
    /// its perplexity from it instead of computing it.
    pub loaded_reference: Option<ReferenceIdentity>,
    /// The file the float32 row writes its log-probs into before renaming them to
    /// `protocol.reference_logits` (reserved by the session once the run folder is claimed).
    pub reference_partial: Option<PathBuf>,
}

pub use crate::digest::model_sha256;

/// Tokenizes the text and fixes the chunk plan.
fn tokenize(plan: &RunPlan, model: &kwk::model::ModelHeader) -> Result<(TokenStream, ChunkPlan)> {
    let text = &plan.text;
    let tokens = model
        .tokenizer
        .encode(&text.text, true)
        .with_context(|| format!("tokenizing '{}'", text.path.display()))?;
    let add_bos = model.tokenizer.add_bos();
    let bos_id = model.tokenizer.bos_id();
    ensure!(
        !add_bos || bos_id.is_some(),
        "the tokenizer of '{}' adds a BOS but has no BOS id",
        plan.llm
    );
    let chunks = ChunkPlan::new(tokens.len(), plan.ctx, plan.max_chunks).map_err(|e| match e {
        PlanError::TooShort { n_tokens, ctx } => anyhow!(
            "--ctx {ctx} needs at least {} tokens; '{}' tokenizes to {n_tokens}. Pass a longer text or a smaller --ctx",
            crate::protocol::chunks::min_tokens(ctx),
            text.path.display()
        ),
        other => anyhow!("{other}"),
    })?;
    let stream = TokenStream {
        tokens,
        add_bos,
        bos_id,
        text_path: text.path.clone(),
        text_sha256: Some(text.sha256.clone()),
    };
    Ok((stream, chunks))
}

/// Whether the run compares against the float32 reference (and so pairs rows per token).
fn use_reference(
    plan: &RunPlan,
    chunks: &ChunkPlan,
    n_vocab: usize,
    ui: &dyn Reporter,
) -> Result<bool> {
    let bytes = base_file_bytes(chunks.ctx, n_vocab, chunks.chunks);
    let on = match plan.kld {
        KldMode::Off => false,
        _ if plan.reference.is_some() => true,
        KldMode::On => true,
        KldMode::Auto if !plan.has_reference() => false,
        KldMode::Auto if bytes > KLD_AUTO_LIMIT_BYTES => {
            ui.note(&format!(
                "KL divergence skipped: its reference file would take {:.1} GiB for {} chunks; pass --kld to write it anyway, or fewer --chunks",
                bytes as f64 / (1u64 << 30) as f64,
                chunks.chunks
            ));
            false
        }
        KldMode::Auto => true,
    };
    ensure!(
        on || plan.compare_to.is_none(),
        "--compare-to needs the float32 reference's log-probs, which this run does not write; pass --kld or fewer --chunks"
    );
    Ok(on)
}

/// Calibration token ids (`--calib-range` applied, capped), when a format needs them, and
/// what the results record of them. Refused when they share a run of
/// [`CALIB_OVERLAP_TOKENS`] tokens with the scored windows (context included), unless
/// `--calib-on-eval`.
fn calibration_tokens(
    plan: &RunPlan,
    model: &kwk::model::ModelHeader,
    stream: &TokenStream,
    chunks: &ChunkPlan,
) -> Result<Option<(Vec<u32>, Calibration)>> {
    let Some(t) = &plan.calib_text else {
        return Ok(None);
    };
    let mut ids = model
        .tokenizer
        .encode(&t.text, true)
        .with_context(|| format!("tokenizing --calib-text '{}'", t.path.display()))?;
    if let Some((a, b)) = plan.calib_range {
        ensure!(
            b <= ids.len(),
            "--calib-range {a}:{b} ends past the {} tokens of --calib-text '{}'; give END at most {}",
            ids.len(),
            t.path.display(),
            ids.len()
        );
        ids = ids[a..b].to_vec();
    }
    ids.truncate(MAX_CALIBRATION_TOKENS);
    ensure!(
        ids.len() >= MIN_CALIBRATION_TOKENS,
        "--calib-text '{}' has {} tokens{}; calibration needs at least {MIN_CALIBRATION_TOKENS}: pass a longer text",
        t.path.display(),
        ids.len(),
        if plan.calib_range.is_some() {
            " in --calib-range"
        } else {
            ""
        }
    );
    // Every window the perplexity reads (context included) is scored text.
    let scored = &stream.tokens[..(chunks.chunks * chunks.ctx).min(stream.tokens.len())];
    if !plan.calib_on_eval {
        if let Some((i, j)) = shared_run(&ids, scored, CALIB_OVERLAP_TOKENS) {
            bail!(
                "--calib-text '{}' shares {CALIB_OVERLAP_TOKENS} tokens in a row with the scored text \
                 (calibration token {i}, scored token {j}): calibrating on the scored text flatters \
                 the calibrated formats (int8:calib, int4:calib, ...); pass a disjoint text or --calib-range, or --calib-on-eval \
                 to allow it (the report marks the run)",
                t.path.display()
            );
        }
    }
    let record = Calibration {
        text: t.name.clone(),
        text_sha256: t.sha256.clone(),
        range: plan.calib_range.map(|(a, b)| format!("{a}:{b}")),
        tokens: ids.len(),
        tokens_used: ids.len().min(kwk::decoder::CALIBRATION_TOKENS),
        on_eval: plan.calib_on_eval,
    };
    Ok(Some((ids, record)))
}

/// The results file before any row: who ran what, on which tokens, on which machine.
fn start_results(
    plan: &RunPlan,
    stream: &TokenStream,
    chunks: &ChunkPlan,
    kld: bool,
    model_sha: String,
    calibration: Option<Calibration>,
    ui: &dyn Reporter,
) -> Results {
    let tokens_bytes: Vec<u8> = stream.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let speed = plan.speed.as_ref();
    let (peaks, peaks_best_tier) = match speed {
        Some(_) => {
            ui.line("measuring this machine's peaks (roofline, about a second)");
            let (p, b) = machine::measure_peaks(plan.threads);
            (Some(p), b)
        }
        None => (None, None),
    };
    Results {
        schema_version: SCHEMA_VERSION,
        complete: false,
        started_utc: plan.started_utc.clone(),
        model: plan.llm.clone(),
        machine: Machine {
            cpu: machine::cpu_model(),
            isa: machine::isa_flags(),
            kernels: Some(machine::kernels_in_use()),
            threads: plan.threads,
            peaks,
            peaks_best_tier,
            steadiness: None,
        },
        versions: Versions {
            kwk: machine::kwk_git_sha(),
            kwk_eval: env!("CARGO_PKG_VERSION").to_string(),
            llama_cpp: plan.tools.as_ref().and_then(|t| t.build_number()),
            llama_cpp_version: plan.tools.as_ref().map(|t| t.build().raw.clone()),
            ik_llama_cpp: plan.ik_tools.as_ref().map(|t| {
                format!(
                    "{} ({}, {})",
                    t.build().raw,
                    t.source(),
                    t.bin_dir()
                        .map_or(String::new(), |d| d.display().to_string())
                )
            }),
            llama_cpp_env_cleared: plan
                .tools
                .as_ref()
                .map(|_| llamacpp::process::cleared_env_vars()),
            llama_cpp_build: plan
                .tools
                .as_ref()
                .map(|t| crate::protocol::results::LlamaCppBuild {
                    number: t.build_number(),
                    commit: t.build_commit().map(str::to_string),
                    judged_by: t.judged_by(),
                }),
        },
        protocol: Protocol {
            ctx: chunks.ctx,
            chunks: chunks.chunks,
            scored_tokens: chunks.scored_tokens(),
            text_tokens: stream.tokens.len(),
            add_bos: stream.add_bos,
            text: plan.text.name.clone(),
            text_sha256: plan.text.sha256.clone(),
            pp: speed.map_or(0, |s| s.pp),
            tg: speed.map_or(0, |s| s.tg),
            reps: speed.map_or(0, |s| s.reps),
            speed_axes: speed
                .is_some()
                .then(|| plan.speed_axes.clone())
                .filter(|a| !a.is_single()),
            kv_values_per_token: None,
            kld,
            speed: speed.is_some(),
            model_sha256: model_sha,
            tokens_sha256: sha256_hex(&tokens_bytes),
            bos_id: stream.chunk_bos(),
            llama_kv_type: plan.llama_kv.as_str().to_string(),
            llama_bench_fa: (speed.is_some() && plan.llama_bench && plan.has_llamacpp())
                .then(|| plan.llama_fa.as_str().to_string()),
            reference: None,
            calibration,
        },
        ppl_delta_reference: None,
        compare_to: plan.compare_to.clone(),
        runners: Vec::new(),
        speed_rounds: Vec::new(),
        speed_ratios: Vec::new(),
        not_made: Vec::new(),
        cells: Vec::new(),
    }
}

/// Refuses the run, before any row is loaded, when a kwk row's estimated resident need
/// (`kwk::decoder::resident`) exceeds the memory available. With speed every built row is
/// kept until the speed rounds end, so each row's need adds what the rows before it keep.
fn check_memory(
    plan: &RunPlan,
    model: &kwk::model::ModelHeader,
    max_cache_len: usize,
) -> Result<()> {
    use kwk::decoder::resident::{available_memory, check_fits, resident_need, Build};
    let available = available_memory();
    if available.is_none() {
        return Ok(());
    }
    let mut held = 0;
    for spec in &plan.formats {
        let (
            crate::protocol::FormatSpec::Kwk {
                name, precision, ..
            },
            Some(kv),
        ) = (spec, spec.kwk_kv(plan.kv))
        else {
            continue;
        };
        // Each row's cache at its own precision (the reference's f32, a `+kv:` row's own).
        let need = resident_need(
            &model.config,
            precision,
            kv,
            max_cache_len,
            Build::FromHeader,
        );
        check_fits(
            &row_label(name, &plan.llm),
            &need,
            held,
            available,
            MEMORY_HINT,
        )
        .map_err(|e| anyhow!(e))?;
        if plan.speed.is_some() {
            held += need.kept();
        }
    }
    Ok(())
}

/// Reads the header, hashes and tokenizes; checks the decoder's limits (from the config;
/// the weights' shapes are checked when a row reads them) and the baseline's identity.
pub fn prepare(plan: &RunPlan, ui: &dyn Reporter) -> Result<Prepared> {
    ui.line(&format!("loading model '{}'", plan.llm));
    let model = kwk::model::load_model_header(&plan.llm)
        .with_context(|| format!("loading --llm '{}'", plan.llm))?;
    // Each test starts from an emptied cache: the longest holds a depth and a pp or a tg
    // (at depth 0 `pp + tg`, as it always was).
    let max_cache_len = plan.speed.as_ref().map_or(plan.ctx, |s| {
        plan.ctx
            .max(s.pp + s.tg)
            .max(plan.speed_axes.longest_test())
    });
    // Before the model's files are hashed or any row reads a weight.
    if plan.has_kwk() {
        check_memory(plan, &model, max_cache_len)?;
    }
    let model_sha = model_sha256(&model.info.resolved_path)?;
    let (stream, chunks) = tokenize(plan, &model)?;
    ui.line(&format!(
        "'{}': {} tokens; scoring {} chunks of {} ({} tokens)",
        plan.text.name,
        stream.tokens.len(),
        chunks.chunks,
        chunks.ctx,
        chunks.scored_tokens()
    ));
    if plan.has_kwk() {
        if let Some(why) = kwk::decoder::config_unsupported(&model.config, max_cache_len) {
            bail!(
                "the in-tree decoder cannot run --llm '{}' with --ctx {} and --pp {} + --tg {}: {why}",
                plan.llm,
                plan.ctx,
                plan.speed.as_ref().map_or(0, |s| s.pp),
                plan.speed.as_ref().map_or(0, |s| s.tg)
            );
        }
    }
    let kld = use_reference(plan, &chunks, model.config.vocab_size, ui)?;
    let (calibration_tokens, calibration) =
        match calibration_tokens(plan, &model, &stream, &chunks)? {
            Some((ids, record)) => (Some(ids), Some(record)),
            None => (None, None),
        };
    let mut results = start_results(plan, &stream, &chunks, kld, model_sha, calibration, ui);
    if plan.speed.is_some() {
        results.protocol.kv_values_per_token =
            Some(crate::depth::kv_values_per_token(&model.config));
    }
    if let Some(b) = &plan.baseline {
        gate::check_after_load(&b.results, &results.protocol)
            .with_context(|| format!("--baseline '{}'", b.path.display()))?;
    }

    let loaded_reference = match &plan.reference {
        Some(path) => {
            ui.line(&format!("checking --reference '{}'", path.display()));
            let id = read_verified(path).context("--reference")?;
            check_reference(&id, path, &results.protocol, model.config.vocab_size)?;
            results.protocol.reference = Some(ReferenceUse {
                sha256: id.body_sha256.clone(),
                source: "loaded".into(),
                file: Some(path.display().to_string()),
            });
            Some(id)
        }
        None => None,
    };
    let reference_logits: Option<PathBuf> = match &plan.reference {
        Some(path) => Some(path.clone()),
        None => kld.then(|| plan.out_dir.join(crate::run_folder::REFERENCE_LOGITS)),
    };
    Ok(Prepared {
        calibration_tokens,
        model: Rc::new(model),
        stream,
        protocol: PerplexityProtocol {
            plan: chunks,
            threads: plan.threads,
            reference_logits,
            logits_dir: Some(plan.out_dir.clone()),
        },
        max_cache_len,
        results,
        loaded_reference,
        reference_partial: None,
    })
}

/// Refuses a loaded reference made for another model, text, tokens or protocol than this
/// run's: one line naming the field, both values and the fix.
pub fn check_reference(
    id: &ReferenceIdentity,
    path: &Path,
    p: &Protocol,
    n_vocab: usize,
) -> Result<()> {
    let s = &id.stamp;
    let fields: [(&str, String, String); 7] = [
        (
            "model sha256",
            s.model_sha256.clone(),
            p.model_sha256.clone(),
        ),
        ("text sha256", s.text_sha256.clone(), p.text_sha256.clone()),
        (
            "token ids sha256",
            s.tokens_sha256.clone(),
            p.tokens_sha256.clone(),
        ),
        ("ctx", id.ctx.to_string(), p.ctx.to_string()),
        ("chunks", id.chunks.to_string(), p.chunks.to_string()),
        (
            "vocabulary size",
            id.n_vocab.to_string(),
            n_vocab.to_string(),
        ),
        (
            "scored tokens",
            id.scored_tokens.to_string(),
            p.scored_tokens.to_string(),
        ),
    ];
    for (field, theirs, ours) in fields {
        if theirs != ours {
            bail!(
                "--reference '{}' was made with {field} {theirs}, this run has {ours} (its model '{}', text '{}'); pass the reference of this model, text, ctx and chunks, or drop --reference to compute it here",
                path.display(),
                s.model,
                s.text
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shared_run;

    /// A reference of another model, tokens or ctx is refused, the line naming the field,
    /// both values and the fix.
    #[test]
    fn a_reference_of_another_run_is_refused_naming_both_values() {
        use crate::eval::base_file::ReferenceIdentity;
        use crate::protocol::ReferenceStamp;
        let p = crate::protocol::results::testdata::sample_results().protocol;
        let id = ReferenceIdentity {
            stamp: ReferenceStamp {
                model: "m.gguf".into(),
                model_sha256: p.model_sha256.clone(),
                text: "t".into(),
                text_sha256: p.text_sha256.clone(),
                tokens_sha256: p.tokens_sha256.clone(),
                made_by: String::new(),
            },
            ctx: p.ctx,
            chunks: p.chunks,
            n_vocab: 100,
            body_bytes: 0,
            body_sha256: String::new(),
            ppl: 1.0,
            ppl_err: 0.0,
            running_ppl: Vec::new(),
            scored_tokens: p.scored_tokens,
        };
        let path = std::path::Path::new("/r/ref.bin");
        super::check_reference(&id, path, &p, 100).unwrap();
        let refused = |id: &ReferenceIdentity, n_vocab| {
            format!(
                "{:#}",
                super::check_reference(id, path, &p, n_vocab).unwrap_err()
            )
        };
        let e = refused(&id, 101);
        assert!(e.contains("vocabulary size 100, this run has 101"), "{e}");
        let mut other = id.clone();
        other.ctx = p.ctx * 2;
        let e = refused(&other, 100);
        assert!(
            e.contains(&format!("ctx {}, this run has {}", p.ctx * 2, p.ctx))
                && e.contains("/r/ref.bin")
                && e.contains("drop --reference"),
            "{e}"
        );
        let mut other = id.clone();
        other.stamp.tokens_sha256 = "ff".into();
        let e = refused(&other, 100);
        assert!(
            e.contains(&format!(
                "token ids sha256 ff, this run has {}",
                p.tokens_sha256
            )),
            "{e}"
        );
        let mut other = id;
        other.stamp.model_sha256 = "ee".into();
        assert!(refused(&other, 100).contains("model sha256 ee"));
    }

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
