//! Weights read on demand, one tensor or one layer at a time, for packing that streams
//! the model instead of holding all of it in float32 ([`LazyWeights`]). Tensors come out
//! exactly as [`super::load_model`] gives them (the same loaders convert them).

use super::assemble::{assemble_layer, require, require_vec, WeightSource};
use super::gguf_loader::GgufSource;
use super::names::{gguf_qk_permuted, WeightName};
use super::safetensors_loader::SafetensorsSource;
use super::{LayerWeights, ModelConfig, ModelHeader, ModelSource, Tensor};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::quantize::equalize::DensePart;

enum Src {
    Gguf { file: GgufFile, unpermute_qk: bool },
    Hf(SafetensorsSource),
}

/// A model's weights, mapped, converted to float32 when asked for.
pub struct LazyWeights {
    config: ModelConfig,
    src: Src,
}

impl LazyWeights {
    /// Maps the weight files of the model `header` describes (no tensor is read yet).
    pub fn open(header: &ModelHeader) -> Result<LazyWeights> {
        let path = &header.info.resolved_path;
        let src = match &header.source {
            ModelSource::Gguf(_) => {
                let file = GgufFile::open(path)?;
                let unpermute_qk = gguf_qk_permuted(file.get_str("general.architecture")?);
                Src::Gguf { file, unpermute_qk }
            }
            ModelSource::HfFolder(_) | ModelSource::Hub { .. } => {
                Src::Hf(SafetensorsSource::open(path, header.config.architecture)?)
            }
        };
        Ok(LazyWeights {
            config: header.config.clone(),
            src,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&dyn WeightSource) -> Result<R>) -> Result<R> {
        match &self.src {
            Src::Gguf { file, unpermute_qk } => f(&GgufSource {
                file,
                unpermute_qk: *unpermute_qk,
                n_heads: self.config.n_heads,
                n_kv_heads: self.config.n_kv_heads,
            }),
            Src::Hf(s) => f(s),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The embedding table `[vocab, d]`.
    pub fn embed(&self) -> Result<Tensor> {
        let c = &self.config;
        self.with(|s| require(s, WeightName::Embed, &[c.vocab_size, c.hidden_size]))
    }

    /// The untied output projection, `None` when tied to the embedding.
    pub fn lm_head(&self) -> Result<Option<Tensor>> {
        let c = &self.config;
        if c.tie_word_embeddings {
            return Ok(None);
        }
        self.with(|s| require(s, WeightName::LmHead, &[c.vocab_size, c.hidden_size]).map(Some))
    }

    pub fn final_norm(&self) -> Result<Vec<f32>> {
        self.with(|s| require_vec(s, WeightName::FinalNorm, self.config.hidden_size))
    }

    /// One matrix of dense layer `i` (`[out, in]`, the shape the config implies).
    pub fn dense_part(&self, i: usize, part: DensePart) -> Result<Tensor> {
        use super::names::LayerTensor as T;
        let c = &self.config;
        let (d, ffn) = (c.hidden_size, c.intermediate_size);
        let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let (t, shape) = match part {
            DensePart::Q => (T::Q, [q, d]),
            DensePart::K => (T::K, [kv, d]),
            DensePart::V => (T::V, [kv, d]),
            DensePart::O => (T::O, [d, q]),
            DensePart::Gate => (T::Gate, [ffn, d]),
            DensePart::Up => (T::Up, [ffn, d]),
            DensePart::Down => (T::Down, [d, ffn]),
        };
        self.with(|s| require(s, WeightName::Layer(i, t), &shape))
    }

    /// Layer `i`, every tensor of it.
    pub fn layer(&self, i: usize) -> Result<LayerWeights> {
        self.with(|s| assemble_layer(s, &self.config, i))
    }

    /// Gemma 3's per-layer norms after attention and the FFN (empty for other
    /// architectures).
    pub fn post_norms(&self) -> Result<Vec<super::PostNorms>> {
        self.with(|s| super::assemble::assemble_all_post_norms(s, &self.config))
    }

    /// Every weight (the whole model in float32).
    pub fn all(&self) -> Result<super::ModelWeights> {
        self.with(|s| super::assemble::assemble_weights(s, &self.config))
    }

    /// Drops the source pages read so far from the resident set (the page cache keeps
    /// them): call after each layer so the mapped source does not count as memory held.
    pub fn release_pages(&self) {
        match &self.src {
            Src::Gguf { file, .. } => file.release_pages(),
            Src::Hf(s) => s.release_pages(),
        }
    }
}
