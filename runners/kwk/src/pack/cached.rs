//! The pack cache as a source: a warm start puts the model together from a cache entry's
//! mapped tensors and float vectors ([`from_cache`]), each checked against the model's
//! shapes, through the same outer build ([`assemble`]) and [`build_layer`] as a cold build.
//!
//! [`build_layer`]: super::source::build_layer

use super::cache::CachedModel;
use super::model::{names, Built};
use super::source::{assemble, lock, LayerFloats, LayerSource, LinearId, ModelParts, MoeFloats};
use crate::error::{KwkError, Result};
use crate::format::{PackedLinear, TensorRole};
use crate::model::{ModelConfig, PostNorms, Tensor};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The model from the tensors and float vectors of a cache entry of `source`.
pub(crate) fn from_cache(config: &ModelConfig, c: CachedModel, source: &Path) -> Result<Built> {
    let path = c.path.clone();
    let src = CacheSource {
        config,
        c: Mutex::new(c),
        path,
        source,
        floats_n: AtomicU64::new(0),
    };
    let model = assemble(&src, config, None)?;
    let c = src.c.into_inner().unwrap_or_else(|e| e.into_inner());
    let left_over = c.left_over();
    if left_over > 0 {
        return Err(src_bad(
            &src.path,
            src.source,
            format!("{left_over} entries the model does not have"),
        ));
    }
    // Parameters: every packed linear (the tied table once) and every float vector.
    let mut all: Vec<&dyn PackedLinear> = vec![model.embed.as_ref()];
    all.extend(model.lm_head.iter().map(|h| h.as_ref()));
    for l in &model.layers {
        all.extend(l.linears());
    }
    let n_params = src.floats_n.load(Ordering::Relaxed)
        + all
            .iter()
            .map(|t| (t.rows() * t.cols()) as u64)
            .sum::<u64>();
    Ok(Built {
        model,
        n_params,
        pack_cache: Some(c.outcome()),
        calibration_s: 0.0,
        pool: None,
    })
}

fn src_bad(path: &Path, source: &Path, what: String) -> KwkError {
    KwkError::bad_model(
        path,
        format!(
            "pack cache entry for {} does not fit the model: {what}; delete it \
             (kwk-eval cache clear)",
            source.display()
        ),
    )
}

/// A cache entry read as a source; every entry is checked against the model.
struct CacheSource<'a> {
    config: &'a ModelConfig,
    c: Mutex<CachedModel>,
    path: PathBuf,
    source: &'a Path,
    /// Float values taken so far (they count as parameters).
    floats_n: AtomicU64,
}

impl CacheSource<'_> {
    fn bad(&self, what: String) -> KwkError {
        src_bad(&self.path, self.source, what)
    }

    fn tensor(&self, name: &str, rows: usize, cols: usize) -> Result<Box<dyn PackedLinear>> {
        let t = lock(&self.c)
            .take_tensor(name)
            .ok_or_else(|| self.bad(format!("no tensor {name}")))?;
        if (t.rows(), t.cols()) != (rows, cols) {
            return Err(self.bad(format!(
                "{name} is {}x{}, the model needs {rows}x{cols}",
                t.rows(),
                t.cols()
            )));
        }
        Ok(t)
    }

    fn floats(&self, name: &str, len: Option<usize>) -> Result<Option<Vec<f32>>> {
        let v = lock(&self.c).take_floats(name);
        if let (Some(v), Some(n)) = (&v, len) {
            if v.len() != n {
                return Err(self.bad(format!("{name} has {} values, expected {n}", v.len())));
            }
        }
        let n = v.as_ref().map_or(0, |v| v.len() as u64);
        self.floats_n.fetch_add(n, Ordering::Relaxed);
        Ok(v)
    }

    fn need(&self, name: &str, len: Option<usize>, what: &str) -> Result<Vec<f32>> {
        self.floats(name, len)?
            .ok_or_else(|| self.bad(format!("no {what}")))
    }
}

impl ModelParts for CacheSource<'_> {
    fn embed(&self) -> Result<Box<dyn PackedLinear>> {
        self.tensor(
            names::EMBED,
            self.config.vocab_size,
            self.config.hidden_size,
        )
    }

    fn lm_head(&self) -> Result<Option<Box<dyn PackedLinear>>> {
        if !lock(&self.c).has_tensor(names::LM_HEAD) {
            return Ok(None);
        }
        let t = self.tensor(
            names::LM_HEAD,
            self.config.vocab_size,
            self.config.hidden_size,
        )?;
        Ok(Some(t))
    }

    fn final_norm(&self) -> Result<Vec<f32>> {
        let d = self.config.hidden_size;
        self.need(names::FINAL_NORM, Some(d), "final norm")
    }

    fn layer(&self, _i: usize) -> Box<dyn LayerSource + '_> {
        Box::new(CacheLayer { src: self, ffn: 0 })
    }
}

/// A layer of a cache entry.
struct CacheLayer<'a> {
    src: &'a CacheSource<'a>,
    /// The rows of the last MLP's gate (its up and down follow it).
    ffn: usize,
}

impl LayerSource for CacheLayer<'_> {
    fn layer_floats(&mut self, i: usize) -> Result<LayerFloats> {
        let src = self.src;
        let config = src.config;
        let d = config.hidden_size;
        let (qd, kvd, hd) = (
            config.n_heads * config.head_dim,
            config.n_kv_heads * config.head_dim,
            config.head_dim,
        );
        let n = |w: &str| names::layer(i, w);
        let moe = if lock(&src.c).has_floats(&n("router")) {
            let ne = config.n_experts;
            let router = src.need(&n("router"), Some(ne * d), "router")?;
            let shared_expert = lock(&src.c).has_tensor(&names::mlp(i, ne, "gate"));
            Some(MoeFloats {
                router: Tensor::new(vec![ne, d], router),
                n_experts: ne,
                shared_expert,
                shared_gate: src.floats(&n("shared_gate"), Some(d))?,
            })
        } else {
            None
        };
        // Gemma 3's post norms: required of a Gemma 3 entry, refused in any other.
        let post_norms = if config.gemma3.is_some() {
            Some(PostNorms {
                attn: src.need(&n(names::POST_ATTN_NORM), Some(d), "post-attention norm")?,
                ffn: src.need(&n(names::POST_FFN_NORM), Some(d), "post-FFN norm")?,
            })
        } else {
            None
        };
        Ok(LayerFloats {
            attn_norm: src.need(&n("attn_norm"), Some(d), "attn_norm")?,
            q_bias: src.floats(&n("q_bias"), Some(qd))?,
            k_bias: src.floats(&n("k_bias"), Some(kvd))?,
            v_bias: src.floats(&n("v_bias"), Some(kvd))?,
            q_norm: src.floats(&n("q_norm"), Some(hd))?,
            k_norm: src.floats(&n("k_norm"), Some(hd))?,
            ffn_norm: src.need(&n("ffn_norm"), Some(d), "ffn_norm")?,
            moe,
            post_norms,
        })
    }

    fn linear(&mut self, id: LinearId) -> Result<Box<dyn PackedLinear>> {
        let src = self.src;
        let config = src.config;
        let d = config.hidden_size;
        let (qd, kvd) = (
            config.n_heads * config.head_dim,
            config.n_kv_heads * config.head_dim,
        );
        let name = id.name();
        let (rows, cols) = match id.role {
            TensorRole::AttnQ => (qd, d),
            TensorRole::AttnK | TensorRole::AttnV => (kvd, d),
            TensorRole::AttnOutput => (d, qd),
            TensorRole::FfnGate => {
                // The MLP's width is the gate's rows.
                let gate = lock(&src.c)
                    .take_tensor(&name)
                    .ok_or_else(|| src.bad(format!("no tensor {name}")))?;
                if gate.cols() != d {
                    return Err(src.bad(format!("{name} has {} columns", gate.cols())));
                }
                self.ffn = gate.rows();
                return Ok(gate);
            }
            TensorRole::FfnUp => (self.ffn, d),
            _ => (d, self.ffn),
        };
        src.tensor(&name, rows, cols)
    }
}
