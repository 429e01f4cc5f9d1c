//! The command line (clap derive). The only file that sees clap: it turns arguments into
//! [`EvalConfig`] / [`GenerateConfig`] and knows every default.

use crate::generate::GenerateConfig;
use crate::session::{EvalConfig, KldMode};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "kwk-eval",
    version,
    about = "What a weight format costs in quality and buys in speed: kwk's in-tree decoder and llama.cpp on the same tokens",
    long_about = None,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Example:\n  kwk-eval --llm HuggingFaceTB/SmolLM2-135M --text wiki.test.raw --gguf model-Q8_0.gguf --llama-bench\n\n\
Writes results.json, results.csv, report.md and plots (PNG + SVG) to the run folder and prints the table.\n\
Exit status: 0 ok, 1 the --baseline regression gate failed, 2 error."
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
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Model: a Hugging Face folder, a .gguf file, a hub id (ORG/NAME[@REV]) or a known short name.
    #[arg(long, value_name = "MODEL", required = true)]
    pub llm: Option<String>,

    /// Text to score, read as raw UTF-8 bytes with one trailing newline removed (e.g. wiki.test.raw).
    #[arg(long, value_name = "FILE", required = true)]
    pub text: Option<PathBuf>,

    /// In-tree formats to run, comma-separated (float32, bf16, int8, int4[:g64|:mix8|:calib|:gptq], gguf:PATH; "none" for none).
    #[arg(long, value_name = "LIST", default_value = "float32,bf16,int8,int4")]
    pub formats: String,

    /// A GGUF file to run with llama.cpp beside the in-tree formats (repeatable).
    #[arg(long, value_name = "PATH")]
    pub gguf: Vec<PathBuf>,

    /// Measure the GGUF rows' speed with llama-bench (without it, llama.cpp rows get perplexity only).
    #[arg(long)]
    pub llama_bench: bool,

    /// Folder with llama-perplexity and llama-bench (default: $KWK_LLAMA_CPP_DIR, then PATH).
    #[arg(long, value_name = "DIR")]
    pub llama_cpp_dir: Option<PathBuf>,

    /// KV cache type of llama-perplexity: f16 (llama.cpp's default) or f32 (exact parity with kwk's float32 cache).
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = ["f16", "f32"])]
    pub llama_kv: String,

    /// Tokens per perplexity chunk (even, at least 8), as llama-perplexity's -c.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,

    /// Score at most N chunks (default: every whole chunk of the text).
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,

    /// Threads for every runner, llama.cpp included (default: all available cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Prompt length of the prompt-speed test (llama-bench -p); 0 skips it.
    #[arg(long, default_value_t = 512)]
    pub pp: usize,

    /// Generated tokens of the generation-speed test (llama-bench -n); 0 skips it.
    #[arg(long, default_value_t = 128)]
    pub tg: usize,

    /// Timed repetitions of each speed test, after one warm-up (llama-bench -r).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,

    /// Run folder for the reports (default: runs/<UTC timestamp>); must not hold a results.json.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// A results.json to compare against: exit 1 when a runner regressed beyond the limits.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,

    /// Regression limit: largest allowed relative perplexity rise, in percent.
    #[arg(long, value_name = "PCT", default_value_t = 0.5)]
    pub max_ppl_regression: f64,

    /// Regression limit: largest allowed pp or tg speed drop, in percent (wide: shared machines drift).
    #[arg(long, value_name = "PCT", default_value_t = 25.0)]
    pub max_speed_regression: f64,

    /// Skip the speed tests (perplexity only).
    #[arg(long)]
    pub no_speed: bool,

    /// Compute KL divergence against float32 even when its reference file exceeds 4 GiB (default: on when float32 runs).
    #[arg(long, conflicts_with = "no_kld")]
    pub kld: bool,

    /// Do not compute KL divergence against the float32 reference.
    #[arg(long)]
    pub no_kld: bool,

    /// Keep the float32 reference log-probs (llama.cpp --kl-divergence-base file, ~1 GB per 40 chunks at 49k vocab) in the run folder.
    #[arg(long)]
    pub keep_logits: bool,

    /// Calibration text for int4:calib / int4:gptq (not the --text, so the test text is not fitted).
    #[arg(long, value_name = "FILE")]
    pub calib_text: Option<PathBuf>,

    /// Calibrate on tokens START..END of --calib-text only (e.g. a slice of the --text file
    /// disjoint from the scored chunks).
    #[arg(long, value_name = "START:END", value_parser = parse_token_range)]
    pub calib_range: Option<(usize, usize)>,

    /// Allow calibration text that overlaps the scored text (refused otherwise); the report
    /// marks such a run, since it flatters int4:calib / int4:gptq.
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

    /// Stop after this many new tokens (or at end of sequence).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_new_tokens: usize,

    /// Weight format to run in (float32, bf16, int8, int4[:options]).
    #[arg(long, default_value = "int8")]
    pub format: String,

    /// Sampling temperature; 0 is greedy.
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

    /// Threads (default: all available cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Folder where packed weights are cached between runs (default: ~/.cache/kwk/pack).
    #[arg(long, value_name = "DIR")]
    pub pack_cache: Option<PathBuf>,

    /// Do not read or write the pack cache.
    #[arg(long, conflicts_with = "pack_cache")]
    pub no_pack_cache: bool,
}

/// What to run.
pub enum Invocation {
    Evaluate(EvalConfig),
    Generate(GenerateConfig),
}

/// `~/.cache/kwk/pack` (or `$XDG_CACHE_HOME/kwk/pack`), `None` when no home is known.
fn default_pack_cache() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kwk").join("pack"))
}

fn pack_cache(dir: Option<PathBuf>, disabled: bool) -> Option<PathBuf> {
    if disabled {
        None
    } else {
        dir.or_else(default_pack_cache)
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
                threads: g.threads.unwrap_or_else(crate::machine::available_threads),
                sampling: kwk::Sampling {
                    temperature: g.temperature,
                    top_k: g.top_k,
                    top_p: g.top_p,
                    seed: g.seed,
                },
                pack_cache_dir: pack_cache(g.pack_cache, g.no_pack_cache),
            }),
            None => {
                let e = self.eval;
                Invocation::Evaluate(EvalConfig {
                    // clap enforces both when no subcommand is given.
                    llm: e.llm.unwrap_or_default(),
                    text: e.text.unwrap_or_default(),
                    formats: e.formats,
                    ggufs: e.gguf,
                    llama_bench: e.llama_bench,
                    llama_cpp_dir: e.llama_cpp_dir,
                    ctx: e.ctx,
                    chunks: e.chunks,
                    threads: e.threads.unwrap_or_else(crate::machine::available_threads),
                    pp: e.pp,
                    tg: e.tg,
                    reps: e.reps,
                    out: e.out,
                    baseline: e.baseline,
                    max_ppl_regression_pct: e.max_ppl_regression,
                    max_speed_regression_pct: e.max_speed_regression,
                    no_speed: e.no_speed,
                    kld: match (e.kld, e.no_kld) {
                        (true, _) => KldMode::On,
                        (_, true) => KldMode::Off,
                        _ => KldMode::Auto,
                    },
                    keep_logits: e.keep_logits,
                    calib_text: e.calib_text,
                    calib_range: e.calib_range,
                    calib_on_eval: e.calib_on_eval,
                    pack_cache_dir: pack_cache(e.pack_cache, e.no_pack_cache),
                    llama_kv_type: if e.llama_kv == "f32" {
                        llamacpp::KvType::F32
                    } else {
                        llamacpp::KvType::F16
                    },
                })
            }
        }
    }
}

/// Parses the process arguments. `Err` carries clap's error (help and version included).
pub fn parse() -> Result<Invocation, clap::Error> {
    Cli::try_parse().map(Cli::into_invocation)
}

/// clap's error message as one line (its text without the usage block).
pub fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let body: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
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

/// `START:END` token offsets, `START < END`.
fn parse_token_range(s: &str) -> std::result::Result<(usize, usize), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_and_subcommand() {
        let cli = Cli::try_parse_from(["kwk-eval", "--llm", "m", "--text", "t.txt"]).unwrap();
        let Invocation::Evaluate(c) = cli.into_invocation() else {
            panic!()
        };
        assert_eq!((c.ctx, c.pp, c.tg, c.reps), (512, 512, 128, 5));
        assert_eq!(c.formats, "float32,bf16,int8,int4");
        assert_eq!(c.kld, KldMode::Auto);
        assert!(c.threads >= 1);
        let cli =
            Cli::try_parse_from(["kwk-eval", "generate", "--llm", "m", "--prompt", "hi"]).unwrap();
        assert!(matches!(cli.into_invocation(), Invocation::Generate(_)));
        let e = Cli::try_parse_from(["kwk-eval", "--llm", "m"]).unwrap_err();
        assert!(one_line(&e).contains("--text"), "{}", one_line(&e));
        assert!(!one_line(&e).contains('\n'));
        let e = Cli::try_parse_from(["kwk-eval", "--llm", "m", "--text", "t", "--kld", "--no-kld"])
            .unwrap_err();
        assert!(one_line(&e).contains("cannot be used with"));
    }
}
