//! llama-perplexity's chunking of a token stream (tools/perplexity/perplexity.cpp P:478-540,
//! docs/protocol.md §1): how many `ctx`-token windows a text holds, which positions of
//! each are scored, and the one "needs 2 × ctx tokens" rule. Pure data; no I/O.

use std::fmt;

/// Why a context size or a token count cannot run the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// `ctx` is odd or below 8.
    BadCtx { ctx: usize },
    /// Fewer than `2*ctx` tokens (llama-perplexity's minimum, BOS included).
    TooShort { n_tokens: usize, ctx: usize },
    /// `--chunks 0`.
    ZeroChunks,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::BadCtx { ctx } => write!(
                f,
                "--ctx {ctx} is not usable: the context must be even and at least 8 tokens \
                 (llama-perplexity scores positions ctx/2..ctx-2). Pass e.g. --ctx 512"
            ),
            PlanError::TooShort { n_tokens, ctx } => write!(
                f,
                "--ctx {ctx} needs at least {} tokens, but the text tokenizes to {n_tokens}. \
                 Pass a longer text or a smaller --ctx",
                min_tokens(*ctx)
            ),
            PlanError::ZeroChunks => {
                write!(f, "--chunks 0 scores nothing. Pass --chunks 1 or more")
            }
        }
    }
}

impl std::error::Error for PlanError {}

/// Fewest tokens a stream needs for a context of `ctx`: `2·ctx`, llama-perplexity's minimum
/// (BOS included). The one place this rule is written.
pub fn min_tokens(ctx: usize) -> usize {
    // Saturating: a minimum past usize::MAX is one no stream meets.
    ctx.saturating_mul(2)
}

/// Checks `--ctx` on its own (before any tokenizing).
pub fn check_ctx(ctx: usize) -> Result<(), PlanError> {
    if ctx < 8 || ctx % 2 == 1 {
        return Err(PlanError::BadCtx { ctx });
    }
    Ok(())
}

/// The chunking of one token stream (P:478-540).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    pub ctx: usize,
    pub chunks: usize,
    /// First position whose logits are scored: `ctx/2` (integer division, P:540).
    pub first: usize,
}

impl ChunkPlan {
    /// `n_tokens` counts the whole stream, BOS included; `max_chunks` is `--chunks`.
    pub fn new(
        n_tokens: usize,
        ctx: usize,
        max_chunks: Option<usize>,
    ) -> Result<ChunkPlan, PlanError> {
        check_ctx(ctx)?;
        if max_chunks == Some(0) {
            return Err(PlanError::ZeroChunks);
        }
        if n_tokens < min_tokens(ctx) {
            return Err(PlanError::TooShort { n_tokens, ctx });
        }
        let chunk_max = n_tokens / ctx;
        let chunks = max_chunks.map_or(chunk_max, |c| c.min(chunk_max));
        Ok(ChunkPlan {
            ctx,
            chunks,
            first: ctx / 2,
        })
    }

    /// Fails unless a stream of `n_tokens` holds this plan's chunks (and llama-perplexity's
    /// minimum): for a runner handed a plan and a stream separately.
    pub fn check_covers(&self, n_tokens: usize) -> Result<(), PlanError> {
        if n_tokens < min_tokens(self.ctx).max(self.chunks * self.ctx) {
            return Err(PlanError::TooShort {
                n_tokens,
                ctx: self.ctx,
            });
        }
        Ok(())
    }

    /// Scored tokens per chunk: `ctx - 1 - ctx/2` (255 for ctx 512).
    pub fn scored_per_chunk(&self) -> usize {
        self.ctx - 1 - self.first
    }

    pub fn scored_tokens(&self) -> usize {
        self.chunks * self.scored_per_chunk()
    }

    /// The model input of chunk `k`: tokens `[k*ctx, (k+1)*ctx)`, the first replaced by
    /// `bos` when the tokenizer adds one (P:564-579).
    pub fn window(&self, tokens: &[u32], k: usize, bos: Option<u32>) -> Vec<u32> {
        let mut w = tokens[k * self.ctx..(k + 1) * self.ctx].to_vec();
        if let Some(b) = bos {
            w[0] = b;
        }
        w
    }

    /// The scored targets of chunk `k`: the original tokens at window positions
    /// `first+1 .. ctx-1`.
    pub fn targets<'a>(&self, tokens: &'a [u32], k: usize) -> &'a [u32] {
        &tokens[k * self.ctx + self.first + 1..(k + 1) * self.ctx]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_follows_llama_perplexity_chunking() {
        let p = ChunkPlan::new(1030, 512, None).unwrap();
        assert_eq!(
            (p.chunks, p.first, p.scored_per_chunk(), p.scored_tokens()),
            (2, 256, 255, 510)
        );
        assert_eq!(ChunkPlan::new(1030, 512, Some(1)).unwrap().chunks, 1);
        assert_eq!(ChunkPlan::new(5000, 512, Some(40)).unwrap().chunks, 9);
        assert_eq!(ChunkPlan::new(1024, 512, None).unwrap().chunks, 2);
        assert_eq!(
            ChunkPlan::new(1023, 512, None),
            Err(PlanError::TooShort {
                n_tokens: 1023,
                ctx: 512
            })
        );
        assert_eq!(
            ChunkPlan::new(100, 6, None),
            Err(PlanError::BadCtx { ctx: 6 })
        );
        assert_eq!(
            ChunkPlan::new(100, 9, None),
            Err(PlanError::BadCtx { ctx: 9 })
        );
        assert_eq!(ChunkPlan::new(100, 8, Some(0)), Err(PlanError::ZeroChunks));
        // ctx 64: 31 scored per chunk (golden.json: 8 chunks -> 248 scored).
        assert_eq!(
            ChunkPlan::new(14397, 64, Some(8)).unwrap().scored_tokens(),
            248
        );
    }

    #[test]
    fn windows_replace_first_token_by_bos_and_targets_are_the_second_half() {
        let tokens: Vec<u32> = (100..124).collect();
        let p = ChunkPlan::new(tokens.len(), 8, None).unwrap();
        assert_eq!(p.chunks, 3);
        assert_eq!(p.window(&tokens, 1, None), (108..116).collect::<Vec<_>>());
        let w = p.window(&tokens, 1, Some(1));
        assert_eq!(w[0], 1);
        assert_eq!(&w[1..], &(109..116).collect::<Vec<_>>()[..]);
        // first = 4: targets are window positions 5, 6, 7.
        assert_eq!(p.targets(&tokens, 2), &[121, 122, 123]);
    }
}
