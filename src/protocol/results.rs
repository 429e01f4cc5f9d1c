//! results.json's shape: [`Results`] and its rows ([`RunnerRecord`]), the one result type
//! every exporter, the gate and `compare` read. Every row has the same fields; a figure that
//! was not measured is `null`, never a made-up value. Units are in the field names.

pub use super::Engine;
use super::{PerplexityResult, RunnerInfo, SpeedSample};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Results {
    pub schema_version: u32,
    /// True only when every planned row was measured (every row's `status` is `ok`) and
    /// every report was written; false while the run is going, when it was interrupted,
    /// when a row failed or was skipped.
    pub complete: bool,
    /// UTC start time, RFC 3339.
    pub started_utc: String,
    /// The model as given to `--llm`.
    pub model: String,
    pub machine: Machine,
    pub versions: Versions,
    pub protocol: Protocol,
    /// The runner the `ppl_delta_pct` column is relative to (float32 when it ran).
    pub ppl_delta_reference: Option<String>,
    /// The row named by `--compare-to`, whose paired differences each row's `compare_to`
    /// holds (null when none was named).
    #[serde(default)]
    pub compare_to: Option<String>,
    pub runners: Vec<RunnerRecord>,
    /// The order the speed repetitions ran in: one list of runner names per round (every
    /// runner's repetition r is timed in round r, so drift lands on every row alike).
    #[serde(default)]
    pub speed_rounds: Vec<Vec<String>>,
    /// Each in-tree row's tokens/s over the reference's and every llama.cpp row's, paired
    /// round by round (`speed_ratios::paired_speed_ratios`; empty without speed).
    #[serde(default)]
    pub speed_ratios: Vec<SpeedRatio>,
    /// Ladder types the run could not make and why (`gguf:IQ3_XXS: needs an importance
    /// matrix ...`); not rows, since nothing that was made failed.
    #[serde(default)]
    pub not_made: Vec<String>,
    /// The runs `kwk-eval merge` put together, one per cell folder, each with its own
    /// machine, protocol and versions (absent from the file of a single run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cells: Vec<Cell>,
}

/// One run folder of a merged report: where it was, what it ran on and which merged rows
/// came from it (`kwk-eval merge`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Cell {
    /// The cell's name in the merged report (its folder's name).
    pub name: String,
    /// The cell folder as given to `merge`.
    pub dir: String,
    /// The model as the cell's `--llm` named it.
    pub model: String,
    pub started_utc: String,
    pub machine: Machine,
    pub versions: Versions,
    pub protocol: Protocol,
    /// The merged rows this cell measured (a row two cells measured alike is listed under
    /// the first).
    pub rows: Vec<String>,
}

/// One paired speed ratio ([`super::speed_ratios`] computes them): `row`'s tokens/s over
/// `vs`'s in the rounds where both ran, for one test (`pp`/`tg`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpeedRatio {
    pub test: String,
    pub row: String,
    pub vs: String,
    /// Rounds in which both rows produced a sample (the ratios summarized).
    pub rounds: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub cpu: String,
    /// CPU features the in-tree kernels care about that this CPU has.
    pub isa: Vec<String>,
    /// The kernel tier the in-tree decoder ran with (`KWK_ISA` respected) and what each
    /// kind of weight runs on it, e.g. "avx512bw: float32 avx512f, bf16 avx512f (convert),
    /// int8/int4 avx512bw (1-token: avx2 ymm)" (each kwk row's `kernels` says which its
    /// matmuls ran).
    #[serde(default)]
    pub kernels: Option<String>,
    /// Threads of every runner; 0 in a merged report whose cells ran different counts.
    pub threads: usize,
    /// This machine's measured peaks with `threads` threads for the kernel tier kwk ran
    /// (`kwk::roofline`; null with `--no-speed`): the roofline's ceilings.
    #[serde(default)]
    pub peaks: Option<kwk::roofline::Peaks>,
    /// The best tier's peaks when `KWK_ISA` forced a lower one (llama.cpp rows, which
    /// always use their best kernels, are put against these); null otherwise.
    #[serde(default)]
    pub peaks_best_tier: Option<kwk::roofline::Peaks>,
    /// How quiet the machine was during the speed rounds (`noisy`: the speed figures are
    /// unreliable); null without speed rounds or where /proc cannot be read.
    #[serde(default)]
    pub steadiness: Option<super::steadiness::Steadiness>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Versions {
    /// Git commit of the kwk tree the harness was built from (null when unknown).
    pub kwk: Option<String>,
    pub kwk_eval: String,
    /// llama.cpp build number of the tools used (null when no GGUF runner ran, or when
    /// the tools were built outside a git checkout and report build 0).
    pub llama_cpp: Option<u64>,
    /// The tools' `--version` line as printed (null when no GGUF runner ran).
    #[serde(default)]
    pub llama_cpp_version: Option<String>,
    /// The environment variables (names only, never values) removed before every llama.cpp
    /// tool ran because they change its results, speed or output
    /// (`llamacpp::process::is_removed_env_var`); empty when none was set, null when no
    /// GGUF runner ran.
    #[serde(default)]
    pub llama_cpp_env_cleared: Option<Vec<String>>,
    /// The llama.cpp build that ran and how it was judged new enough (null when no GGUF
    /// runner ran).
    #[serde(default)]
    pub llama_cpp_build: Option<LlamaCppBuild>,
    /// ik_llama.cpp's tools (`--peer ik`): where they were found and their `--version`
    /// line as printed (null when no row ran on ik_llama.cpp).
    #[serde(default)]
    pub ik_llama_cpp: Option<String>,
}

/// The llama.cpp build the GGUF rows ran with, as `--version` reported it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LlamaCppBuild {
    /// The build number as reported (null for `build 0`); it may be implausibly small
    /// (a shallow clone reports `build 1`), which `judged_by` says.
    pub number: Option<u64>,
    /// The commit (null for `commit unknown`).
    pub commit: Option<String>,
    /// How it was judged new enough: `build number and --help flags`, or `--help flags
    /// (build number 1 not plausible)`, or `--help flags (no build number)`.
    pub judged_by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Protocol {
    pub ctx: usize,
    pub chunks: usize,
    pub scored_tokens: usize,
    /// Tokens of the whole text (BOS included).
    pub text_tokens: usize,
    pub add_bos: bool,
    /// The text file's name and the SHA-256 of its bytes.
    pub text: String,
    pub text_sha256: String,
    pub pp: usize,
    pub tg: usize,
    pub reps: usize,
    /// The speed sweep's lists (`--pp`, `--tg`, `--depth`, `--threads`) when the run
    /// measured more than one point or a depth other than 0 (`pp`/`tg` above are their first
    /// values); absent for one point at depth 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_axes: Option<super::points::SpeedAxes>,
    /// Values one token adds to the KV cache (K and V of every layer's KV heads), from the
    /// model's shapes: times a row's bytes per value (its `kv_type`), its KV bytes per token.
    /// Null without speed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_values_per_token: Option<u64>,
    /// Whether KL divergence against the float32 reference was computed.
    pub kld: bool,
    /// Whether speed was measured (false with `--no-speed`).
    pub speed: bool,
    /// SHA-256 of the model's weight and tokenizer files (the `--llm` content, not its name).
    pub model_sha256: String,
    /// SHA-256 of the scored token ids (little-endian u32, BOS included): the tokenizer and
    /// its BOS handling as they apply to this text.
    pub tokens_sha256: String,
    pub bos_id: Option<u32>,
    /// KV cache type of llama-perplexity (`--llama-kv`); kwk rows always use f32.
    pub llama_kv_type: String,
    /// llama-bench's flash attention on the llama.cpp speed rows (`--llama-fa`): `best`
    /// (`-fa 0,1`, each test at the faster, `speed_points[].flash_attn`), `on` or `off`;
    /// absent when no llama-bench ran, and in files written before the flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_bench_fa: Option<String>,
    /// The float32 reference's log-prob file the KL divergences were measured against:
    /// its digest, and whether this run computed it or loaded it with `--reference` (null
    /// without KL divergence, or in files written before the field).
    #[serde(default)]
    pub reference: Option<ReferenceUse>,
    /// The calibration text of the calibrated rows (`int8:calib`, `int4:gptq`, ...; null when
    /// none ran).
    #[serde(default)]
    pub calibration: Option<Calibration>,
}

/// Which float32 reference a run compared against (`Protocol::reference`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReferenceUse {
    /// SHA-256 of the reference file's bytes before its trailer (header, tokens, records):
    /// two runs with the same digest compared against the same log-probs.
    pub sha256: String,
    /// `computed` (this run's float32 row wrote it) or `loaded` (`--reference`).
    pub source: String,
    /// The file: the one loaded, or this run's when `--keep-logits` kept it; null when
    /// this run removed its own at the end.
    pub file: Option<String>,
}

/// What the calibrated formats were fitted on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    /// The `--calib-text` file's name and the SHA-256 of its bytes.
    pub text: String,
    pub text_sha256: String,
    /// `--calib-range START:END` (tokens of the calibration text), when given.
    pub range: Option<String>,
    /// Tokens passed to the decoder (after the range and the cap).
    pub tokens: usize,
    /// Tokens the decoder's calibration passes read (at most its own cap).
    pub tokens_used: usize,
    /// Calibrated on the scored text (`--calib-on-eval`): those rows are flattered.
    pub on_eval: bool,
}

/// One row against another on the same tokens: each figure is `mean(this − other)` over the
/// scored tokens with its paired standard error `sd/sqrt(N-1)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct PairedChange {
    /// The other row's name.
    pub row: String,
    pub ln_ppl_ratio: f64,
    pub ln_ppl_ratio_err: f64,
    /// KL divergence from the reference, this row minus the other.
    pub kld_diff: f64,
    pub kld_diff_err: f64,
    /// Top-1 agreement with the reference, this row minus the other (a fraction).
    pub top1_diff: f64,
    pub top1_diff_err: f64,
}

impl PairedChange {
    /// Whether some figure differs by more than two standard errors.
    pub fn beyond_2se(&self) -> bool {
        [
            (self.ln_ppl_ratio, self.ln_ppl_ratio_err),
            (self.kld_diff, self.kld_diff_err),
            (self.top1_diff, self.top1_diff_err),
        ]
        .iter()
        .any(|&(v, e)| v.abs() > 2.0 * e && v != 0.0)
    }
}

/// Whether a planned row was measured.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum RowStatus {
    /// Measured: every figure the run asked for is in the row.
    #[default]
    Ok,
    /// The runner failed (`status_reason` and `error` say why); its figures are missing.
    Failed,
    /// Planned but not measured (the run was interrupted or stopped before it).
    Skipped,
}

impl RowStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RowStatus::Ok => "ok",
            RowStatus::Failed => "failed",
            RowStatus::Skipped => "skipped",
        }
    }
}

/// One row: what the runner is and what was measured. `null` where not measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct RunnerRecord {
    /// The row's unique label: an in-tree format as typed, or `gguf:<label>` (the file
    /// name; with its parent folder when two GGUFs share a file name; or the LABEL of
    /// `--gguf LABEL=PATH`).
    pub name: String,
    pub engine: Engine,
    /// `ok`, `failed` or `skipped` (a file written before the field existed reads as `ok`
    /// unless its row has an `error`).
    #[serde(default)]
    pub status: RowStatus,
    /// Why the row is `failed` or `skipped`; null for `ok`.
    #[serde(default)]
    pub status_reason: Option<String>,
    /// Bytes of weight data, the same measure for both engines: a kwk format's packed
    /// tensors, or the sum of a GGUF's tensor data sizes (metadata excluded).
    #[serde(alias = "bytes")]
    pub tensor_bytes: Option<u64>,
    /// The GGUF file's size (metadata included); null for kwk formats (packed in memory).
    #[serde(default)]
    pub file_bytes: Option<u64>,
    /// `8 · tensor_bytes / params`.
    pub bits_per_weight: Option<f64>,
    pub params: Option<u64>,
    pub type_mix: BTreeMap<String, usize>,
    pub kv_type: Option<String>,
    /// K+V bytes per cached token over all layers, scales included (kwk rows; null for
    /// other engines and files written before the field).
    #[serde(default)]
    pub kv_bytes_per_token: Option<u64>,
    /// The kernels this row's weight matmuls ran (kwk rows, e.g. `avx512bw`); for llama.cpp
    /// rows, which pick their own best kernels among those built in, the CPU features its
    /// build reports (`llama.cpp build: AVX AVX2 ...`; null when it printed none).
    #[serde(default)]
    pub kernels: Option<String>,
    /// An external engine's settings as passed to its tools (`-fa on -ctk f16 -ctv f16`,
    /// ik_llama.cpp's `-rtr` too); null for kwk rows and files written before the field.
    #[serde(default)]
    pub engine_flags: Option<String>,
    pub ppl: Option<f64>,
    pub ppl_err: Option<f64>,
    pub ppl_delta_pct: Option<f64>,
    pub running_ppl: Vec<f64>,
    pub scored_tokens: Option<usize>,
    /// Whether the engine tokenized the text to the harness's ids (null: not checked).
    pub tokens_match: Option<bool>,
    pub kld_mean: Option<f64>,
    pub kld_mean_err: Option<f64>,
    pub kld_p99: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub top1_agreement_err: Option<f64>,
    pub delta_p_rms: Option<f64>,
    /// The mean change of the predicted distribution's entropy against the reference's
    /// (nats) and its uncertainty: below 0 the format makes the model surer of itself
    /// (sharper), above 0 less sure. Null without a reference.
    #[serde(default)]
    pub entropy_delta: Option<f64>,
    #[serde(default)]
    pub entropy_delta_err: Option<f64>,
    /// ln(PPL/PPL_ref) from per-token NLL differences on the same tokens, and its paired
    /// standard error (null without a reference).
    pub ln_ppl_ratio: Option<f64>,
    pub ln_ppl_ratio_err: Option<f64>,
    /// Paired differences against the `--compare-to` row (null when none was named).
    pub compare_to: Option<PairedChange>,
    pub pp_tokens_per_s: Option<f64>,
    pub pp_tokens_per_s_std: Option<f64>,
    pub pp_samples_tokens_per_s: Vec<f64>,
    pub tg_tokens_per_s: Option<f64>,
    pub tg_tokens_per_s_std: Option<f64>,
    pub tg_samples_tokens_per_s: Vec<f64>,
    /// The figures at every point of the speed sweep, the first point included (its
    /// figures are also `pp_*`/`tg_*` above); absent without speed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub speed_points: Vec<super::points::PointSpeed>,
    /// Operations (2 per multiply-add) of one prompt token at the speed test's prompt
    /// length, from the model's shapes (`kwk::model::cost`), and pp as a percentage of the
    /// matching compute peak (fp32, bf16 or int8 dot; `machine.peaks`).
    #[serde(default)]
    pub pp_ops_per_token: Option<f64>,
    #[serde(default)]
    pub pp_roofline_pct: Option<f64>,
    /// Bytes one generated token reads (weights it uses plus its KV cache), and tg as a
    /// percentage of the measured read bandwidth.
    #[serde(default)]
    pub tg_bytes_per_token: Option<f64>,
    #[serde(default)]
    pub tg_roofline_pct: Option<f64>,
    /// The read ceiling `tg_roofline_pct` divides by: `llc` (the last-level cache's read
    /// bandwidth, where the bytes per token fit in it) or `dram` (memory's).
    #[serde(default)]
    pub tg_ceiling: Option<String>,
    /// The read bandwidth of the moment of each generation repetition, GB/s: the mean of a
    /// probe just before the repetition and one just after it, on the tier of the row's
    /// ceiling; one per `tg_samples_tokens_per_s`. Then tg as a percentage of it, the
    /// median over the repetitions. Where the host's bandwidth drifts (caches and memory
    /// shared with other machines), this pairs each rate with the bandwidth of its own
    /// moment, while `tg_roofline_pct` divides by the best probe of the whole run.
    #[serde(default)]
    pub tg_samples_read_gbps: Vec<f64>,
    #[serde(default)]
    pub tg_roofline_paired_pct: Option<f64>,
    pub load_s: Option<f64>,
    pub load_read_s: Option<f64>,
    pub load_pack_s: Option<f64>,
    /// Seconds of `load_pack_s` spent on calibration (statistics passes, GPTQ's Hessians and
    /// rounding); null for rows without calibration.
    #[serde(default)]
    pub calibration_s: Option<f64>,
    /// Peak resident memory in bytes of this row's engine running it (the perplexity run).
    /// kwk rows: the row's own share of the harness process, measured: the process's
    /// `VmHWM` during the perplexity (reset with /proc/self/clear_refs when the row's build
    /// ends) less its resident size before the build began (so the earlier rows kept for
    /// the speed rounds do not count; pages of the source file the row maps and touches
    /// do), plus the process's resident size at start (the program itself, which a
    /// standalone process pays too).
    /// What the build took on top (packing, calibration) is `pack_peak_rss_bytes`.
    /// llama.cpp rows: the llama-perplexity child's own `VmHWM` (mapped GGUF pages
    /// included), polled every 20 ms while it ran. Null when not measured (not Linux, or the
    /// reset failed).
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// kwk rows: the same measure as `peak_rss_bytes` over the row's build (reading,
    /// packing, calibration) instead of its perplexity; null for llama.cpp rows (their
    /// GGUFs are made by llama-quantize before the rows run) and when not measured.
    #[serde(default)]
    pub pack_peak_rss_bytes: Option<u64>,
    /// llama-bench's own JSON objects, as it printed them.
    pub llama_bench: Option<serde_json::Value>,
    /// How the run made this row's GGUF (the ladder); null for files the user passed.
    #[serde(default)]
    pub made: Option<super::made::MadeGguf>,
    /// A kwk `bpw:X` row a ladder run added at the ladder's sizes: the ladder rows it
    /// stands for, each `LABEL BPW` (`Q4_0 4.85`); absent for every other row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stands_for: Vec<String>,
    /// Why the runner has no figures (its error), when it failed.
    pub error: Option<String>,
    /// In a merged report, the cell (`cells[].name`) the row was measured in; absent from
    /// a single run's file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
}

impl RunnerRecord {
    /// A row for a runner that could not be built (no info).
    pub fn failed(name: &str, engine: Engine, error: String) -> Self {
        let mut r = RunnerRecord {
            name: name.into(),
            engine,
            ..Default::default()
        };
        r.fail(error);
        r
    }

    /// A planned row that was not measured, and why.
    pub fn skipped(name: &str, engine: Engine, reason: String) -> Self {
        RunnerRecord {
            name: name.into(),
            engine,
            status: RowStatus::Skipped,
            status_reason: Some(reason),
            ..Default::default()
        }
    }

    /// Marks the row failed with `error` (its `status`, `status_reason` and `error`).
    pub fn fail(&mut self, error: String) {
        self.status = RowStatus::Failed;
        self.status_reason = Some(error.clone());
        self.error = Some(error);
    }

    /// The status a row read from a file has: `failed` when it holds an error, whatever an
    /// older writer left in `status`.
    pub fn settle_status(&mut self) {
        if self.error.is_some() && self.status == RowStatus::Ok {
            self.status = RowStatus::Failed;
            self.status_reason = self.error.clone();
        }
    }

    pub fn from_info(info: &RunnerInfo) -> Self {
        RunnerRecord {
            name: info.name.clone(),
            engine: info.engine,
            tensor_bytes: Some(info.tensor_bytes),
            file_bytes: info.file_bytes,
            bits_per_weight: Some(info.bits_per_weight).filter(|b| b.is_finite() && *b > 0.0),
            params: Some(info.params),
            type_mix: info.type_mix.clone(),
            kv_type: Some(info.kv_type.clone()),
            kv_bytes_per_token: info.kv_bytes_per_token,
            kernels: info.kernels.clone(),
            engine_flags: info.engine_flags.clone(),
            load_s: info.load_s,
            load_read_s: info.load_read_s,
            load_pack_s: info.load_pack_s,
            calibration_s: info.calibration_s,
            ..Default::default()
        }
    }

    pub fn set_perplexity(&mut self, p: &PerplexityResult) {
        self.ppl = Some(p.ppl);
        self.ppl_err = Some(p.ppl_err);
        self.running_ppl = p.running.clone();
        self.scored_tokens = Some(p.scored_tokens);
        self.tokens_match = p.tokens_match;
        if p.peak_rss_bytes.is_some() {
            self.peak_rss_bytes = p.peak_rss_bytes;
        }
        if let Some(r) = &p.reference {
            self.kld_mean = Some(r.kld_mean);
            self.kld_mean_err = Some(r.kld_mean_err);
            self.kld_p99 = Some(r.kld_p99);
            self.top1_agreement = Some(r.top1_agreement);
            self.top1_agreement_err = Some(r.top1_agreement_err);
            self.delta_p_rms = Some(r.delta_p_rms);
            self.entropy_delta = Some(r.entropy_delta);
            self.entropy_delta_err = Some(r.entropy_delta_err);
            self.ln_ppl_ratio = Some(r.ln_ppl_ratio);
            self.ln_ppl_ratio_err = Some(r.ln_ppl_ratio_err);
        }
    }

    /// Sets the speed columns from the repetitions' summaries.
    pub fn set_speed(&mut self, pp: Option<&SpeedSample>, tg: Option<&SpeedSample>) {
        if let Some(pp) = pp {
            self.pp_tokens_per_s = Some(pp.tokens_per_s);
            self.pp_tokens_per_s_std = Some(pp.tokens_per_s_std);
            self.pp_samples_tokens_per_s = pp.samples_tokens_per_s.clone();
        }
        if let Some(tg) = tg {
            self.tg_tokens_per_s = Some(tg.tokens_per_s);
            self.tg_tokens_per_s_std = Some(tg.tokens_per_s_std);
            self.tg_samples_tokens_per_s = tg.samples_tokens_per_s.clone();
        }
    }

    /// Whether this row's perplexity differs from the reference's by more than two paired
    /// standard errors of ln(PPL/PPL_ref) (`None` without a reference comparison). KLD and
    /// top-1 are not tested: any change of the weights moves them off 0 and 100%.
    pub fn differs_from_reference(&self) -> Option<bool> {
        let (lr, lre) = (self.ln_ppl_ratio?, self.ln_ppl_ratio_err?);
        Some(lr != 0.0 && lr.abs() > 2.0 * lre)
    }
}

impl Protocol {
    /// The name of the primary point's `kind` (`pp`/`tg`) test as its paired ratios are
    /// named (`speed_ratios[].test`): `pp`/`tg` when it is plain, else `pp512@d4096`.
    pub fn primary_ratio_test(&self, kind: &str) -> String {
        let n = if kind == "pp" { self.pp } else { self.tg };
        match &self.speed_axes {
            None => kind.to_string(),
            Some(a) => {
                let (d, t) = (a.depth[0], a.threads[0]);
                super::points::ratio_test(kind, &a.test_name(kind, n, d, t), true)
            }
        }
    }

    /// The depths of the speed tests as a merged row name's `@d` suffix shows them (`4096`,
    /// `0,4096` for a run that swept them itself); `0` for a run at depth 0 only.
    pub fn depth_key(&self) -> String {
        self.speed_axes.as_ref().map_or("0".into(), |a| {
            a.depth
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The primary point's `kind` test as reports head its column: `pp512`, `tg128@d4096`.
    pub fn primary_test_label(&self, kind: &str) -> String {
        let n = if kind == "pp" { self.pp } else { self.tg };
        match &self.speed_axes {
            None => format!("{kind}{n}"),
            Some(a) => a.test_name(kind, n, a.depth[0], a.threads[0]),
        }
    }
}

impl Machine {
    /// The thread count as the reports print it: the number, or `per-cell` in a merged
    /// report whose cells ran different counts (`threads` 0; each cell's is in `cells`).
    pub fn threads_label(&self) -> String {
        if self.threads == 0 {
            "per-cell".into()
        } else {
            self.threads.to_string()
        }
    }
}

impl Results {
    /// Recomputes `ppl_delta_pct` of every row against the float32 in-tree row, or the first
    /// row with a perplexity when there is none.
    pub fn update_deltas(&mut self) {
        let reference = self
            .runners
            .iter()
            .find(|r| r.engine == Engine::Kwk && r.name == "float32" && r.ppl.is_some())
            .or_else(|| self.runners.iter().find(|r| r.ppl.is_some()))
            .map(|r| (r.name.clone(), r.ppl.unwrap_or(f64::NAN)));
        self.ppl_delta_reference = reference.as_ref().map(|r| r.0.clone());
        for row in &mut self.runners {
            row.ppl_delta_pct = match (&reference, row.ppl) {
                (Some((_, base)), Some(p)) => Some((p / base - 1.0) * 100.0),
                _ => None,
            };
        }
    }

    /// Rows that failed.
    pub fn failures(&self) -> impl Iterator<Item = &RunnerRecord> {
        self.runners.iter().filter(|r| r.error.is_some())
    }

    /// Rows planned but not measured.
    pub fn skipped(&self) -> impl Iterator<Item = &RunnerRecord> {
        self.runners
            .iter()
            .filter(|r| r.status == RowStatus::Skipped)
    }

    /// Whether every row was measured (`status` ok): with every report written, what
    /// `complete` means.
    pub fn all_rows_ok(&self) -> bool {
        self.runners.iter().all(|r| r.status == RowStatus::Ok)
    }
}

#[cfg(test)]
pub mod testdata {
    use super::*;

    /// A fabricated results file with two rows, for exporter tests.
    pub fn sample_results() -> Results {
        let mut r = Results {
            schema_version: SCHEMA_VERSION,
            complete: true,
            started_utc: "2026-11-29T14:00:00Z".into(),
            model: "tiny".into(),
            machine: Machine {
                cpu: "Test CPU".into(),
                isa: vec!["avx2".into()],
                kernels: Some("avx2".into()),
                threads: 2,
                peaks: None,
                peaks_best_tier: None,
                steadiness: None,
            },
            versions: Versions {
                kwk: Some("abc".into()),
                kwk_eval: "0.1.0".into(),
                llama_cpp: Some(1),
                llama_cpp_version: Some("version: 1 (abc)".into()),
                llama_cpp_env_cleared: Some(vec!["LLAMA_ARG_CTX_SIZE".into()]),
                llama_cpp_build: Some(LlamaCppBuild {
                    number: Some(1),
                    commit: Some("abc".into()),
                    judged_by: "--help flags (build number 1 not plausible)".into(),
                }),
                ik_llama_cpp: None,
            },
            protocol: Protocol {
                ctx: 64,
                chunks: 2,
                scored_tokens: 62,
                text_tokens: 200,
                add_bos: false,
                text: "eval.txt".into(),
                text_sha256: "00".into(),
                pp: 16,
                tg: 4,
                reps: 2,
                speed_axes: None,
                kv_values_per_token: None,
                kld: true,
                speed: true,
                model_sha256: "11".into(),
                tokens_sha256: "22".into(),
                bos_id: None,
                llama_kv_type: "f16".into(),
                llama_bench_fa: None,
                reference: None,
                calibration: None,
            },
            ppl_delta_reference: None,
            compare_to: None,
            speed_rounds: vec![
                vec!["float32".into(), "int4".into()],
                vec!["int4".into(), "float32".into()],
            ],
            speed_ratios: Vec::new(),
            not_made: Vec::new(),
            cells: Vec::new(),
            runners: vec![
                RunnerRecord {
                    name: "float32".into(),
                    engine: Engine::Kwk,
                    tensor_bytes: Some(4_000_000),
                    bits_per_weight: Some(32.0),
                    params: Some(1_000_000),
                    ppl: Some(20.0),
                    ppl_err: Some(0.5),
                    pp_tokens_per_s: Some(1000.0),
                    pp_tokens_per_s_std: Some(10.0),
                    pp_samples_tokens_per_s: vec![990.0, 1010.0],
                    tg_tokens_per_s: Some(100.0),
                    tg_tokens_per_s_std: Some(2.0),
                    tg_samples_tokens_per_s: vec![98.0, 102.0],
                    load_s: Some(0.1),
                    ..Default::default()
                },
                RunnerRecord {
                    name: "int4".into(),
                    engine: Engine::Kwk,
                    tensor_bytes: Some(600_000),
                    bits_per_weight: Some(4.8),
                    params: Some(1_000_000),
                    ppl: Some(20.5),
                    ppl_err: Some(0.51),
                    kld_mean: Some(0.01),
                    kld_mean_err: Some(0.001),
                    top1_agreement: Some(0.95),
                    top1_agreement_err: Some(0.01),
                    ln_ppl_ratio: Some(0.0247),
                    ln_ppl_ratio_err: Some(0.004),
                    pp_tokens_per_s: Some(1500.0),
                    pp_tokens_per_s_std: Some(20.0),
                    pp_samples_tokens_per_s: vec![1480.0, 1520.0],
                    tg_tokens_per_s: Some(300.0),
                    tg_tokens_per_s_std: Some(5.0),
                    tg_samples_tokens_per_s: vec![295.0, 305.0],
                    load_s: Some(0.3),
                    ..Default::default()
                },
            ],
        };
        r.update_deltas();
        r.speed_ratios = crate::protocol::speed_ratios::paired_speed_ratios(&r);
        r
    }

    #[test]
    fn deltas_are_relative_to_float32() {
        let r = sample_results();
        assert_eq!(r.ppl_delta_reference.as_deref(), Some("float32"));
        assert_eq!(r.runners[0].ppl_delta_pct, Some(0.0));
        assert!((r.runners[1].ppl_delta_pct.unwrap() - 2.5).abs() < 1e-9);
    }
}
