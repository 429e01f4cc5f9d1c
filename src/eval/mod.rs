//! The measurements every runner shares: perplexity by llama-perplexity's protocol
//! ([`perplexity`]), comparison against the float32 reference's log-probs ([`reference`]),
//! paired errors between rows on the same tokens ([`paired`]), and speed by llama-bench's
//! definitions ([`speed`]). Outside itself it imports only [`crate::protocol`].

pub mod base_file;
pub mod paired;
pub mod perplexity;
pub mod records;
pub mod reference;
pub mod speed;
