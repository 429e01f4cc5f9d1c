//! The measurements every runner shares: perplexity by llama-perplexity's protocol,
//! comparison against the float32 reference (KL divergence), and speed by llama-bench's
//! definitions.

pub mod perplexity;
pub mod reference;
pub mod speed;
