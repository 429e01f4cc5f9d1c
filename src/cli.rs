//! The command line (clap derive): every flag, every default, and the parsing of values into
//! types (formats into [`FormatSpec`]s, KV types and output formats into enums), so nothing
//! later parses a string. It only parses: each command gets plain options defined below it
//! ([`EvalOptions`] in `plan`, [`CompareOptions`], [`GenerateConfig`],
//! [`CacheConfig`]), and the plan step (`plan.rs`) turns [`EvalOptions`] into a checked run
//! plan. It prints nothing and runs nothing.

use crate::cache::{CacheAction, CacheConfig};
use crate::cache_dir::default_pack_cache;
use crate::compare::CompareOptions;
use crate::generate::GenerateConfig;
use crate::merge::MergeOptions;
pub use crate::plan::Chunks;
use crate::plan::{EvalOptions, KldMode};
use crate::protocol::{parse_format, Engine, FormatSpec};
pub use crate::report::compare::TableFormat;
use crate::report::gate::GateLimits;
pub use crate::report::output::StdoutFormat;
use crate::sweep::{SweepAction, TaskJob};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// The help's last lines: an example, the files a run writes (from the exporter list,
/// `report::export::REPORTS`), the exit status.
fn after_help() -> String {
    format!(
        "Example:\n  kwk-eval --llm HuggingFaceTB/SmolLM2-135M --text wiki.test.raw --gguf model-Q8_0.gguf --llama-bench\n\n\
Writes {} and plots (PNG + SVG) to the run folder and prints the table (--output for other forms).\n\
Exit status: 0 ok, 1 the --baseline regression gate failed, 2 error (a baseline measured on other tokens, model or protocol included).",
        crate::report::export::data_file_names().join(", ")
    )
}

#[derive(Debug, Parser)]
#[command(
    name = "kwk-eval",
    version,
    about = "What a weight format costs in quality and buys in speed: kwk's in-tree decoder and llama.cpp on the same tokens",
    long_about = None,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = after_help()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub eval: EvalArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream a completion of a prompt with the in-tree decoder and print its tokens/s.
    Generate(GenerateArgs),
    /// Compare results.json files: per-row changes in PPL, KLD, top-1 and speed with their
    /// uncertainty and a verdict (each later file against the first).
    Compare(CompareArgs),
    /// The pack cache: list its files, prune it to its size limit, or clear it.
    Cache(CacheArgs),
    /// Merge run folders (a sweep's cells) of one protocol into one report.
    Merge(MergeArgs),
    /// Run a sweep file: its cells one after another here, or as a Slurm job array.
    Sweep(SweepArgs),
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Run folders (or their results.json), each complete and of the same protocol.
    #[arg(value_name = "DIR", num_args = 1.., required = true)]
    pub dirs: Vec<PathBuf>,

    /// Folder of the merged report (created; must not hold a report).
    #[arg(long, value_name = "DIR", required = true)]
    pub out: PathBuf,

    /// Also put speeds measured on different CPUs into one ratio (never by default).
    #[arg(long)]
    pub speed_across_machines: bool,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub action: SweepCommand,
}

#[derive(Debug, Subcommand)]
pub enum SweepCommand {
    /// Print the cells (one kwk-eval run each) and the work they share.
    Plan {
        /// The sweep file (TOML; docs/sweeps.md).
        file: PathBuf,
    },
    /// Run every cell on this machine, one after another, then merge into DIR/merged.
    Run {
        file: PathBuf,
        /// Run here, without Slurm (required: `sweep slurm` submits to Slurm).
        #[arg(long, required = true)]
        local: bool,
        /// The sweep folder (cells/, merged/); a second run re-runs only unfinished cells.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Write sbatch scripts (a job array, one task per cell, after the shared jobs) and submit them.
    Slurm {
        file: PathBuf,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Write the scripts and print the sbatch lines; submit nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Submit again only the cells of a sweep folder with no complete results.json (neither running nor queued).
    Resume {
        file: PathBuf,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[arg(long)]
        dry_run: bool,
    },
    /// One job of a sweep folder, as each Slurm task runs it.
    #[command(hide = true, group = clap::ArgGroup::new("job").required(true).multiple(false))]
    Task {
        out: PathBuf,
        #[arg(long, value_name = "N", group = "job")]
        cell: Option<usize>,
        #[arg(long, value_name = "N", group = "job")]
        shared: Option<usize>,
        #[arg(long, group = "job")]
        merge: bool,
    },
}

/// One entry of `--formats`: a format, or `none`.
#[derive(Debug, Clone, PartialEq)]
pub enum FormatArg {
    None,
    Format(FormatSpec),
}

/// `--kv`: a KV cache precision (the error names the choices).
fn parse_kv(s: &str) -> Result<kwk::KvPrecision, String> {
    s.parse().map_err(|e: kwk::KwkError| e.to_string())
}

fn parse_format_arg(s: &str) -> Result<FormatArg, String> {
    if s.trim() == "none" {
        Ok(FormatArg::None)
    } else {
        parse_format(s).map(FormatArg::Format)
    }
}

/// KV cache type of llama.cpp's rows (`-ctk/-ctv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvArg {
    F16,
    F32,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
}

impl KvArg {
    pub fn kv_type(self) -> llamacpp::KvType {
        match self {
            KvArg::F16 => llamacpp::KvType::F16,
            KvArg::F32 => llamacpp::KvType::F32,
            KvArg::Bf16 => llamacpp::KvType::Bf16,
            KvArg::Q8_0 => llamacpp::KvType::Q8_0,
            KvArg::Q4_0 => llamacpp::KvType::Q4_0,
        }
    }
}

/// llama-bench's flash attention (`--llama-fa`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FaArg {
    Best,
    On,
    Off,
}

impl FaArg {
    pub fn choice(self) -> llamacpp::BenchFlashAttn {
        match self {
            FaArg::Best => llamacpp::BenchFlashAttn::Best,
            FaArg::On => llamacpp::BenchFlashAttn::On,
            FaArg::Off => llamacpp::BenchFlashAttn::Off,
        }
    }
}

/// The regression limits, shared by `--baseline` and `compare`.
#[derive(Debug, Clone, Args)]
pub struct GateArgs {
    /// Regression limit: largest allowed relative perplexity rise, in percent.
    #[arg(long, value_name = "PCT", default_value_t = 0.5)]
    pub max_ppl_regression: f64,

    /// Regression limit: largest allowed relative rise of the mean KL divergence, in percent.
    #[arg(long, value_name = "PCT", default_value_t = 10.0)]
    pub max_kld_regression: f64,

    /// Regression limit: largest allowed drop of top-1 agreement, in percentage points.
    #[arg(long, value_name = "POINTS", default_value_t = 0.5)]
    pub max_top1_regression: f64,

    /// Regression limit: largest allowed pp or tg speed drop, in percent (wide: shared machines drift).
    #[arg(long, value_name = "PCT", default_value_t = 25.0)]
    pub max_speed_regression: f64,

    /// Compare speeds even when the CPU, its features or the thread count differ (skipped otherwise, with a note).
    #[arg(long)]
    pub speed_across_machines: bool,
}

impl GateArgs {
    /// The limits these flags set.
    pub fn limits(&self) -> GateLimits {
        GateLimits {
            max_ppl_pct: self.max_ppl_regression,
            max_kld_pct: self.max_kld_regression,
            max_top1_points: self.max_top1_regression,
            max_speed_pct: self.max_speed_regression,
            speed_across_machines: self.speed_across_machines,
        }
    }
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// results.json files: OLD NEW [NEWER ...]; each later one is compared with the first.
    #[arg(value_name = "RESULTS_JSON", num_args = 2.., required = true)]
    pub files: Vec<PathBuf>,

    /// Table format.
    #[arg(long, value_enum, default_value_t = TableFormat::Terminal)]
    pub format: TableFormat,

    #[command(flatten)]
    pub gate: GateArgs,
}

#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: CacheCommand,
    /// The pack cache folder (default: $KWK_CACHE/pack or ~/.cache/kwk/pack).
    #[arg(long, value_name = "DIR", global = true)]
    pub pack_cache: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Each cached model: formats, size, last use.
    List,
    /// Remove temporary and orphaned files, then least recently used files over the limit
    /// (KWK_PACK_CACHE_GB, default 16).
    Prune {
        /// Size limit in GB for this prune (default: KWK_PACK_CACHE_GB or 16).
        #[arg(long, value_name = "GB")]
        limit_gb: Option<f64>,
    },
    /// Delete every pack cache file (kwk-pack-*; other files are left, and a folder kwk did
    /// not create that holds other files is refused).
    Clear,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Model: a Hugging Face folder, a .gguf file, a hub id (ORG/NAME[@REV]) or a known short name.
    #[arg(long, value_name = "MODEL", required = true)]
    pub llm: Option<String>,

    /// Text to score, read as raw UTF-8 bytes with one trailing newline removed (e.g. wiki.test.raw).
    #[arg(long, value_name = "FILE", required = true)]
    pub text: Option<PathBuf>,

    /// In-tree formats to run, comma-separated (float32, bf16, int8[:calib|:gptq], int4[:g64|:mix8|:calib|:gptq], int3/int5/int6 with int4's options, bpw:X[:calib] (a size target: X bits per weight, e.g. bpw:4.5, spent per tensor by sensitivity), any of them +kv:f32|f16|bf16|q8 for a row with its own KV cache (float32+kv:q8), gguf:PATH; "none" for none). Default: float32,bf16,int8,int4, or with llama.cpp's ladder kwk's own sizes (float32,int8,int6,int5,int4,int3,bpw:3.5).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_format_arg)]
    pub formats: Option<Vec<FormatArg>>,

    /// A GGUF file to run with llama.cpp beside the in-tree formats (repeatable); LABEL=PATH names its row gguf:LABEL (two files of the same name in different folders are told apart by their folders).
    #[arg(long, value_name = "[LABEL=]PATH")]
    pub gguf: Vec<PathBuf>,

    /// Measure the GGUF rows' speed with llama-bench (without it, llama.cpp rows get perplexity only). Without --gguf it also makes llama.cpp's ladder from --llm (see --ladder).
    #[arg(long)]
    pub llama_bench: bool,

    /// llama.cpp's side made from --llm: an F32 GGUF (convert_hf_to_gguf.py, or llama-quantize --allow-requantize for a GGUF) and these types of it, cached under $KWK_CACHE/gguf: "default" (Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0,IQ4_XS,Q3_K_M,IQ3_XXS,Q2_K; each +imatrix with --calib-text), "none", or types as llama-quantize names them, TYPE+imatrix for one made with llama-imatrix on --calib-text, ik:TYPE for one of ik_llama.cpp's own types made by its llama-quantize (with --peer ...,ik the default ladder adds IQ6_K,IQ5_K,IQ4_K,IQ4_KS,IQ3_K,IQ2_K on ik) (default: the default ladder with --llama-bench and no --gguf, else none).
    #[arg(long, value_name = "LIST", value_parser = crate::ladder::LadderChoice::parse)]
    pub ladder: Option<crate::ladder::LadderChoice>,

    /// Folder with llama.cpp's tools (default: $KWK_LLAMA_CPP_DIR, then PATH, then the build scripts/setup-llama-cpp.sh leaves under $KWK_CACHE).
    #[arg(long, value_name = "DIR")]
    pub llama_cpp_dir: Option<PathBuf>,

    /// The external engines that run every GGUF row, comma-separated: llama.cpp, ik (ik_llama.cpp, with its recommended CPU settings -rtr and flash attention). With ik the rows are named by engine (llama.cpp:Q4_K_M, ik:Q4_K_M). Default: llama.cpp (rows gguf:...).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_peer)]
    pub peer: Vec<Engine>,

    /// Folder with ik_llama.cpp's tools for --peer ik (default: $KWK_IK_LLAMA_CPP_DIR, then PATH if its tools there are ik_llama.cpp's, then the build scripts/setup-ik-llama-cpp.sh leaves under $KWK_CACHE).
    #[arg(long, value_name = "DIR")]
    pub ik_llama_cpp_dir: Option<PathBuf>,

    /// Longest any one llama.cpp tool run may take before it is killed, in seconds, 1 to 604800 (default: scaled with the work, the time at 1 GFLOP/s for the tokens it runs through the model, at least 600).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub tool_timeout: Option<u64>,

    /// KV cache precision of kwk's rows other than the float32 reference (which keeps an f32 cache, so KLD and ΔPPL show what the cache costs): f32, f16, bf16 or q8 (int8 in blocks of 32 head dims, one f32 scale each).
    #[arg(long, value_name = "TYPE", default_value = "f32", value_parser = parse_kv)]
    pub kv: kwk::KvPrecision,

    /// KV cache type of llama.cpp's rows (-ctk/-ctv of llama-perplexity and llama-bench): f16 (llama.cpp's default), f32 (exact parity with kwk's float32 cache; llama-bench then runs f16), bf16, q8_0 or q4_0 (flash attention on).
    #[arg(long, value_name = "TYPE", value_enum, default_value_t = KvArg::F16)]
    pub llama_kv: KvArg,

    /// Flash attention of llama-bench on the llama.cpp and ik_llama.cpp speed rows: best (each round measures -fa 0 and -fa 1, and each test keeps the setting with the higher mean; on alone with --llama-kv q8_0|q4_0, which need it), on or off (not with q8_0/q4_0). llama-perplexity keeps its own setting. Default: best.
    #[arg(long, value_name = "best|on|off", value_enum)]
    pub llama_fa: Option<FaArg>,

    /// Tokens per perplexity chunk (even, 8 to 2^20), as llama-perplexity's -c.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,

    /// Score at most N chunks (1 to 2^20); "all" for every whole chunk of the text.
    #[arg(long, value_name = "N|all", default_value = "20", value_parser = parse_chunks)]
    pub chunks: Chunks,

    /// Threads for every runner, llama.cpp included (default: all available cores; at most 4 × them); a comma-separated list runs every speed test at each count (perplexity uses the first).
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,

    /// Prompt length of the prompt-speed test (llama-bench -p); 0 skips it; a comma-separated list runs each; depth + pp + tg at most 2^20.
    #[arg(
        long,
        value_name = "N[,N...]",
        default_value = "512",
        value_delimiter = ','
    )]
    pub pp: Vec<usize>,

    /// Generated tokens of the generation-speed test (llama-bench -n); 0 skips it; a comma-separated list runs each.
    #[arg(
        long,
        value_name = "N[,N...]",
        default_value = "128",
        value_delimiter = ','
    )]
    pub tg: Vec<usize>,

    /// Tokens in the KV cache before each timed speed test, prefilled untimed (llama-bench -d); a comma-separated list, e.g. 0,512,4096, runs every test at each depth (tests named pp512@d4096); depth + pp (or tg) must fit the model's context.
    #[arg(
        long,
        value_name = "D[,D...]",
        default_value = "0",
        value_delimiter = ','
    )]
    pub depth: Vec<usize>,

    /// Timed repetitions of each speed test (1 to 1000), after one warm-up; run in rounds, one repetition of every runner per round (llama-bench runs with -r 1 once per round).
    #[arg(long, default_value_t = crate::plan::DEFAULT_REPS)]
    pub reps: usize,

    /// Run folder for the reports (default: runs/<UTC timestamp>); must not hold a results.json.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// A results.json to compare against: its model, tokens, text, ctx/chunks and KV type must match (checked before anything runs, exit 2 otherwise); exit 1 when a runner regressed beyond the limits.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,

    #[command(flatten)]
    pub gate: GateArgs,

    /// A row (as named in the report, e.g. int8 or gguf:model-Q8_0.gguf) every other row is also compared with, token by token (needs the float32 reference).
    #[arg(long, value_name = "ROW")]
    pub compare_to: Option<String>,

    /// Skip the speed tests (perplexity only).
    #[arg(long)]
    pub no_speed: bool,

    /// What to print on stdout: table (compact, fits 100 columns, with a verdict line per size), wide (every column), or the results as md, csv, json or jsonl for another program (the run folder gets every file either way).
    #[arg(long, short = 'o', value_name = "FORMAT", value_enum, default_value_t = StdoutFormat::Table)]
    pub output: StdoutFormat,

    /// Compute KL divergence against float32 even when its reference file exceeds 4 GiB (default: on when float32 runs).
    #[arg(long, conflicts_with = "no_kld")]
    pub kld: bool,

    /// Do not compute KL divergence against the float32 reference.
    #[arg(long)]
    pub no_kld: bool,

    /// Keep the float32 reference log-probs (llama.cpp --kl-divergence-base file, ~1 GB per 40 chunks at 49k vocab) in the run folder.
    #[arg(long)]
    pub keep_logits: bool,

    /// Compare against the float32 reference log-probs another run kept (--keep-logits): its file, or its run folder. Checked against this run (model, text, tokens, ctx, chunks, vocabulary, completeness) before use; float32's perplexity is then read from it, not computed.
    #[arg(long, value_name = "FILE_OR_DIR", conflicts_with = "no_kld")]
    pub reference: Option<PathBuf>,

    /// Calibration text for int8:calib / int8:gptq / int4:calib / int4:gptq (and int3/int5/int6's) / bpw:X:calib (not the --text, so the test text is not fitted).
    #[arg(long, value_name = "FILE")]
    pub calib_text: Option<PathBuf>,

    /// Calibrate on tokens START..END of --calib-text only (e.g. a slice of the --text file
    /// disjoint from the scored chunks).
    #[arg(long, value_name = "START:END", value_parser = parse_token_range)]
    pub calib_range: Option<(usize, usize)>,

    /// Allow calibration text that overlaps the scored text (refused otherwise); the report
    /// marks such a run, since it flatters the calibrated formats.
    #[arg(long)]
    pub calib_on_eval: bool,

    /// Folder where packed weights are cached between runs (default: ~/.cache/kwk/pack).
    #[arg(long, value_name = "DIR")]
    pub pack_cache: Option<PathBuf>,

    /// Do not read or write the pack cache (every format is packed from scratch).
    #[arg(long, conflicts_with = "pack_cache")]
    pub no_pack_cache: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model: a Hugging Face folder, a .gguf file, a hub id or a known short name.
    #[arg(long, value_name = "MODEL")]
    pub llm: String,

    /// The prompt to continue.
    #[arg(long)]
    pub prompt: String,

    /// Stop after this many new tokens (or at end of sequence); prompt tokens + N at most 2^20.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_new_tokens: usize,

    /// Weight format to run in (float32, bf16, int8, int3/int4/int5/int6[:options], bpw:X).
    #[arg(long, default_value = "int8")]
    pub format: String,

    /// KV cache precision: f32, f16, bf16 or q8.
    #[arg(long, value_name = "TYPE", default_value = "f32", value_parser = parse_kv)]
    pub kv: kwk::KvPrecision,

    /// Sampling temperature (0 to 100); 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Sample among the K most likely tokens (0: all).
    #[arg(long, value_name = "K", default_value_t = 40)]
    pub top_k: usize,

    /// Sample within the smallest set of tokens whose probability reaches P.
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    pub top_p: f32,

    /// Random seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Threads (default: all available cores; at most 4 × them).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Folder where packed weights are cached between runs (default: ~/.cache/kwk/pack).
    #[arg(long, value_name = "DIR")]
    pub pack_cache: Option<PathBuf>,

    /// Do not read or write the pack cache.
    #[arg(long, conflicts_with = "pack_cache")]
    pub no_pack_cache: bool,
}

/// One `--peer` entry: an external engine's name.
fn parse_peer(s: &str) -> Result<Engine, String> {
    llamacpp::Engine::parse(s).map(Engine::of_tools)
}

/// The `--peer` list as given: llama.cpp alone when empty; each engine once.
fn peers(given: Vec<Engine>) -> Result<Vec<Engine>, String> {
    if given.is_empty() {
        return Ok(vec![Engine::LlamaCpp]);
    }
    for (i, e) in given.iter().enumerate() {
        if given[..i].contains(e) {
            return Err(format!("--peer names {e} twice; name each engine once"));
        }
    }
    Ok(given)
}

fn parse_chunks(s: &str) -> Result<Chunks, String> {
    if s == "all" {
        return Ok(Chunks::All);
    }
    match s.parse::<usize>() {
        Ok(0) => Err("0 scores nothing; pass 1 or more, or all".into()),
        Ok(n) => Ok(Chunks::AtMost(n)),
        Err(_) => Err(format!("'{s}' is not a chunk count; pass a number or all")),
    }
}

/// What to run: a command and its options.
pub enum Invocation {
    Evaluate(Box<EvalOptions>),
    Generate(GenerateConfig),
    Compare(CompareOptions),
    Cache(CacheConfig),
    Merge(MergeOptions),
    Sweep(SweepAction),
}

/// `START:END` token offsets, `START < END`.
fn parse_token_range(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not START:END (token offsets, e.g. 0:8192)"))?;
    let parse = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| format!("'{v}' in '{s}' is not a token offset"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a >= b {
        return Err(format!("'{s}': START must be below END"));
    }
    Ok((a, b))
}

impl EvalArgs {
    /// The options these flags set.
    pub fn into_options(self) -> EvalOptions {
        EvalOptions {
            llm: self.llm.unwrap_or_default(),
            text: self.text.unwrap_or_default(),
            formats: self
                .formats
                .as_ref()
                .map(|list| {
                    list.iter()
                        .filter_map(|f| match f {
                            FormatArg::Format(s) => Some(s.clone()),
                            FormatArg::None => None,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            formats_given: self.formats.is_some(),
            gguf: self.gguf,
            llama_bench: self.llama_bench,
            ladder: self.ladder.unwrap_or_default(),
            llama_cpp_dir: self.llama_cpp_dir,
            peers: peers(self.peer),
            ik_llama_cpp_dir: self.ik_llama_cpp_dir,
            tool_timeout: self.tool_timeout,
            llama_kv: self.llama_kv.kv_type(),
            llama_fa: self.llama_fa.map(FaArg::choice),
            kv: self.kv,
            ctx: self.ctx,
            chunks: self.chunks,
            threads: self.threads.unwrap_or_default(),
            pp: self.pp,
            tg: self.tg,
            depth: self.depth,
            reps: self.reps,
            out: self.out,
            baseline: self.baseline,
            limits: self.gate.limits(),
            compare_to: self.compare_to,
            no_speed: self.no_speed,
            output: self.output,
            kld: match (self.kld, self.no_kld) {
                (true, _) => KldMode::On,
                (_, true) => KldMode::Off,
                _ => KldMode::Auto,
            },
            keep_logits: self.keep_logits,
            reference: self.reference,
            calib_text: self.calib_text,
            calib_range: self.calib_range,
            calib_on_eval: self.calib_on_eval,
            pack_cache: self.pack_cache,
            no_pack_cache: self.no_pack_cache,
        }
    }
}

impl Cli {
    pub fn into_invocation(self) -> Invocation {
        match self.command {
            Some(Command::Generate(g)) => Invocation::Generate(GenerateConfig {
                llm: g.llm,
                prompt: g.prompt,
                max_new_tokens: g.max_new_tokens,
                format: g.format,
                kv: g.kv,
                threads: g.threads.unwrap_or_else(crate::machine::available_threads),
                sampling: kwk::Sampling {
                    temperature: g.temperature,
                    top_k: g.top_k,
                    top_p: g.top_p,
                    seed: g.seed,
                },
                pack_cache: g.pack_cache,
                no_pack_cache: g.no_pack_cache,
            }),
            Some(Command::Compare(c)) => Invocation::Compare(CompareOptions {
                files: c.files,
                format: c.format,
                limits: c.gate.limits(),
            }),
            Some(Command::Cache(c)) => Invocation::Cache(CacheConfig {
                action: match c.action {
                    CacheCommand::List => CacheAction::List,
                    CacheCommand::Prune { limit_gb } => CacheAction::Prune { limit_gb },
                    CacheCommand::Clear => CacheAction::Clear,
                },
                // Without a home folder there is no default; "." would be a surprise.
                dir: c
                    .pack_cache
                    .or_else(default_pack_cache)
                    .unwrap_or_else(|| PathBuf::from(".cache/kwk/pack")),
            }),
            Some(Command::Merge(m)) => Invocation::Merge(MergeOptions {
                dirs: m.dirs,
                out: m.out,
                speed_across_machines: m.speed_across_machines,
            }),
            Some(Command::Sweep(s)) => Invocation::Sweep(match s.action {
                SweepCommand::Plan { file } => SweepAction::Plan { file },
                SweepCommand::Run { file, out, .. } => SweepAction::Local { file, out },
                SweepCommand::Slurm { file, out, dry_run } => {
                    SweepAction::Slurm { file, out, dry_run }
                }
                SweepCommand::Resume { file, out, dry_run } => {
                    SweepAction::Resume { file, out, dry_run }
                }
                SweepCommand::Task {
                    out,
                    cell,
                    shared,
                    merge: _,
                } => SweepAction::Task {
                    out,
                    job: match (cell, shared) {
                        (Some(i), _) => TaskJob::Cell(i),
                        (None, Some(i)) => TaskJob::Shared(i),
                        (None, None) => TaskJob::Merge,
                    },
                },
            }),
            None => Invocation::Evaluate(Box::new(self.eval.into_options())),
        }
    }
}

/// Parses the process arguments. `Err` carries clap's error (help and version included).
pub fn parse() -> Result<Invocation, clap::Error> {
    Cli::try_parse().map(Cli::into_invocation)
}

/// [`parse`] of explicit arguments (the program name first).
pub fn parse_from<I, T>(args: I) -> Result<Invocation, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args).map(Cli::into_invocation)
}

/// clap's error message as one line (its text without the usage block).
pub fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let body: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let joined = body.join(" ");
    let joined = joined
        .strip_prefix("error: ")
        .unwrap_or(&joined)
        .to_string();
    format!("{joined} (see --help)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The help names the files the exporters write, as it always has.
    #[test]
    fn the_help_lists_the_report_files() {
        assert!(after_help().contains(
            "\n\nWrites results.json, results.csv, speed_ratios.csv, speed_points.csv, report.md and plots (PNG + SVG) \
             to the run folder and prints the table (--output for other forms).\nExit status: 0 ok"
        ));
    }

    #[test]
    fn defaults_and_subcommand() {
        let cli = Cli::try_parse_from(["kwk-eval", "--llm", "m", "--text", "t.txt"]).unwrap();
        let Invocation::Evaluate(c) = cli.into_invocation() else {
            panic!()
        };
        assert_eq!((c.ctx, c.reps), (512, 3));
        assert_eq!((c.pp, c.tg, c.depth), (vec![512], vec![128], vec![0]));
        assert!(c.threads.is_empty());
        assert_eq!(c.chunks, Chunks::AtMost(20));
        // No --formats: the plan picks the defaults (DEFAULT_FORMATS, or LADDER_FORMATS with
        // llama.cpp's ladder).
        assert!(c.formats.is_empty() && !c.formats_given);
        assert_eq!(crate::plan::DEFAULT_FORMATS, "float32,bf16,int8,int4");
        assert_eq!(c.llama_kv, llamacpp::KvType::F16);
        let cli = Cli::try_parse_from([
            "kwk-eval",
            "--llm",
            "m",
            "--text",
            "t",
            "--chunks",
            "all",
            "--llama-kv",
            "f32",
        ])
        .unwrap();
        assert_eq!(cli.eval.chunks, Chunks::All);
        assert_eq!(cli.eval.llama_kv, KvArg::F32);
        assert_eq!(c.kv, kwk::KvPrecision::F32);
        let kv = |args: &[&str]| {
            let mut all = vec!["kwk-eval", "--llm", "m", "--text", "t"];
            all.extend(args);
            Cli::try_parse_from(all)
        };
        let cli = kv(&["--kv", "q8", "--llama-kv", "q4_0"]).unwrap();
        assert_eq!(cli.eval.kv, kwk::KvPrecision::Q8);
        assert_eq!(cli.eval.llama_kv.kv_type(), llamacpp::KvType::Q4_0);
        let e = one_line(&kv(&["--kv", "q4"]).unwrap_err());
        assert!(e.contains("'q4' is not one of f32|f16|bf16|q8"), "{e}");
        let e = Cli::try_parse_from(["kwk-eval", "--llm", "m", "--text", "t", "--formats", "int7"])
            .unwrap_err();
        assert!(one_line(&e).contains("valid formats"), "{}", one_line(&e));
        let cli =
            Cli::try_parse_from(["kwk-eval", "compare", "a.json", "b.json", "--format", "csv"])
                .unwrap();
        assert!(
            matches!(cli.into_invocation(), Invocation::Compare(c) if c.format == TableFormat::Csv)
        );
        assert!(Cli::try_parse_from(["kwk-eval", "compare", "a.json"]).is_err());
        let cli =
            Cli::try_parse_from(["kwk-eval", "generate", "--llm", "m", "--prompt", "hi"]).unwrap();
        assert!(matches!(cli.into_invocation(), Invocation::Generate(_)));
        let cli = Cli::try_parse_from([
            "kwk-eval",
            "cache",
            "prune",
            "--limit-gb",
            "0.5",
            "--pack-cache",
            "/x",
        ])
        .unwrap();
        let Invocation::Cache(c) = cli.into_invocation() else {
            panic!()
        };
        assert_eq!(
            c.action,
            CacheAction::Prune {
                limit_gb: Some(0.5)
            }
        );
        assert_eq!(c.dir, PathBuf::from("/x"));
        let e = Cli::try_parse_from(["kwk-eval", "--llm", "m"]).unwrap_err();
        assert!(one_line(&e).contains("--text"), "{}", one_line(&e));
        assert!(!one_line(&e).contains('\n'));
        let e = Cli::try_parse_from(["kwk-eval", "--llm", "m", "--text", "t", "--kld", "--no-kld"])
            .unwrap_err();
        assert!(one_line(&e).contains("cannot be used with"));
    }

    /// `--peer`: llama.cpp alone by default; a list of engines by their names; an unknown
    /// engine refused by the parser, one named twice when the plan is made.
    #[test]
    fn peer_lists_parse() {
        let eval = |extra: &[&str]| {
            let mut args = vec!["kwk-eval", "--llm", "m", "--text", "t"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).map(Cli::into_invocation) {
                Ok(Invocation::Evaluate(c)) => Ok(c.peers),
                Ok(_) => panic!("not an evaluation"),
                Err(e) => Err(one_line(&e)),
            }
        };
        assert_eq!(eval(&[]).unwrap(), Ok(vec![Engine::LlamaCpp]));
        assert_eq!(
            eval(&["--peer", "llama.cpp,ik"]).unwrap(),
            Ok(vec![Engine::LlamaCpp, Engine::Ik])
        );
        assert_eq!(
            eval(&["--peer", "ik_llama.cpp"]).unwrap(),
            Ok(vec![Engine::Ik])
        );
        let e = eval(&["--peer", "llama.cpp,vllm"]).unwrap_err();
        assert!(e.contains("unknown engine 'vllm'"), "{e}");
        let twice = eval(&["--peer", "ik,ik"]).unwrap().unwrap_err();
        assert!(twice.contains("--peer names ik twice"), "{twice}");
        let c = Cli::try_parse_from([
            "kwk-eval",
            "--llm",
            "m",
            "--text",
            "t",
            "--ik-llama-cpp-dir",
            "/ik",
        ])
        .unwrap();
        assert_eq!(c.eval.ik_llama_cpp_dir, Some(PathBuf::from("/ik")));
    }
}
