//! llamacpp: finds llama.cpp's command-line tools (llama-perplexity, llama-bench,
//! llama-quantize, llama-imatrix, llama-tokenize, and the converter script), runs them defensively (pinned flags, cleared
//! `LLAMA_ARG_*`, timeouts, stderr tail kept) and parses what they print. Knows nothing of
//! the harness.
//!
//! - [`engine`]: mainline llama.cpp or its fork ik_llama.cpp, told apart by their own
//!   output; [`ik`]: the fork's dialect, one item per difference.
//! - [`tools`]: discovery (`--llama-cpp-dir`, `KWK_LLAMA_CPP_DIR`, `PATH`, the setup script's
//!   cache), build number/commit, "too old" checks against each tool's `--help`.
//! - [`process`]: one subprocess with a clean environment, drained pipes and a timeout.
//! - [`settings`]: threads, KV cache type and flash attention, pinned on every run.
//! - [`perplexity`], [`kld`], [`bench`], [`tokenize`]: the commands and their parsers.
//! - [`convert`], [`imatrix`], [`quantize`]: making GGUFs from a checkpoint (the ladder).
// One `unsafe` block: the parent-death hook between fork and exec (`process`).
#![deny(unsafe_code)]

pub mod bench;
pub mod convert;
pub mod engine;
pub mod error;
pub mod ik;
pub mod imatrix;
pub mod kld;
pub mod perplexity;
pub mod process;
pub mod quantize;
pub mod settings;
pub mod tokenize;
pub mod tools;

pub use bench::{run_bench, BenchOutput, BenchRequest, BenchRun, BenchTest};
pub use convert::{run_convert, ConvertRequest, ConvertRun, Converter, ConverterSearch};
pub use engine::Engine;
pub use error::{Error, Result, SETUP_HINT};
pub use imatrix::{run_imatrix, run_imatrix_to_legacy, ImatrixRequest, ImatrixRun};
pub use kld::{
    run_kl_divergence, KlDivergenceRequest, KlDivergenceRun, KlDivergenceStats, ValueErr,
};
pub use perplexity::{run_perplexity, PerplexityOutput, PerplexityRequest, PerplexityRun};
pub use quantize::{run_quantize, Fallback, QuantizeLog, QuantizeRequest, QuantizeRun};
pub use settings::{BenchFlashAttn, ComputeSettings, KvType};
pub use tokenize::{run_tokenize, TokenizeRequest, TokenizeRun};
pub use tools::{BuildInfo, LlamaCppTools, Search};
