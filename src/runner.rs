//! The Runner trait: one engine running one weight format, measured the same way as every
//! other. Implemented by the in-tree decoder (`runner/kwk.rs`, one runner per format) and
//! by llama.cpp (`runner/llamacpp.rs`, one runner per GGUF file). The harness prepares one
//! token stream and one protocol and hands them to every runner, so every figure in a
//! report is measured on the same tokens. Imports [`crate::protocol`] and [`crate::eval`].

pub mod kwk;
pub mod llamacpp;

use crate::protocol::{
    PerplexityProtocol, PerplexityResult, Progress, RunnerInfo, SpeedRep, SpeedSpec, TokenStream,
};

/// One engine running one format. Object-safe.
pub trait Runner {
    fn info(&self) -> &RunnerInfo;
    fn perplexity(
        &mut self,
        protocol: &PerplexityProtocol,
        tokens: &TokenStream,
        progress: &dyn Progress,
    ) -> anyhow::Result<PerplexityResult>;
    /// One timed repetition of the speed test (the harness calls this once per round, so
    /// runners' repetitions interleave); `None` when this runner has no speed test.
    fn speed_rep(&mut self, spec: &SpeedSpec) -> anyhow::Result<Option<SpeedRep>>;
}
