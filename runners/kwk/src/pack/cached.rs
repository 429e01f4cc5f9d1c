//! The pack cache as a layer source: a warm start puts the model together from a cache
//! entry's mapped tensors and float vectors ([`from_cache`]), each checked against the
//! model's shapes, through the same [`build_layer`] as a cold build.

use super::cache::CachedModel;
use super::model::{names, Built, PackedModel};
use super::source::{build_layer, LayerFloats, LayerSource, LinearId, MoeFloats};
use crate::error::{KwkError, Result};
use crate::format::{PackedLinear, TensorRole};
use crate::model::{ModelConfig, Tensor};
use std::path::{Path, PathBuf};

/// The model from the tensors and float vectors of a cache entry of `source`.
pub(crate) fn from_cache(config: &ModelConfig, c: CachedModel, source: &Path) -> Result<Built> {
    let path = c.path.clone();
    let mut src = CacheSource {
        config,
        c,
        path,
        source,
        floats_n: 0,
        ffn: 0,
    };
    let d = config.hidden_size;
    let tied = !src.c.has_tensor(names::LM_HEAD);
    let embed = src.tensor(names::EMBED, config.vocab_size, d)?;
    let lm_head = if tied {
        None
    } else {
        Some(src.tensor(names::LM_HEAD, config.vocab_size, d)?)
    };
    let final_norm = src.need(names::FINAL_NORM, Some(d), "final norm")?;
    let mut layers = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        layers.push(build_layer(&mut src, config, i)?);
    }
    let left_over = src.c.left_over();
    if left_over > 0 {
        return Err(src.bad(format!("{left_over} entries the model does not have")));
    }
    // Parameters: every packed linear (the tied table once) and every float vector.
    let mut n_params = src.floats_n;
    let mut all: Vec<&dyn PackedLinear> = vec![embed.as_ref()];
    all.extend(lm_head.iter().map(|h| h.as_ref()));
    for l in &layers {
        all.extend(l.linears());
    }
    n_params += all
        .iter()
        .map(|t| (t.rows() * t.cols()) as u64)
        .sum::<u64>();
    Ok(Built {
        model: PackedModel {
            embed,
            lm_head,
            final_norm,
            layers,
        },
        n_params,
        pack_cache: Some(src.c.outcome()),
        calibration_s: 0.0,
        pool: None,
    })
}

/// A cache entry read as a layer source; every entry is checked against the model.
struct CacheSource<'a> {
    config: &'a ModelConfig,
    c: CachedModel,
    path: PathBuf,
    source: &'a Path,
    /// Float values taken so far (they count as parameters).
    floats_n: u64,
    /// The rows of the last MLP's gate (its up and down follow it).
    ffn: usize,
}

impl CacheSource<'_> {
    fn bad(&self, what: String) -> KwkError {
        KwkError::bad_model(
            &self.path,
            format!(
                "pack cache entry for {} does not fit the model: {what}; delete it \
                 (kwk-eval cache clear)",
                self.source.display()
            ),
        )
    }

    fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<Box<dyn PackedLinear>> {
        let t = self
            .c
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

    fn floats(&mut self, name: &str, len: Option<usize>) -> Result<Option<Vec<f32>>> {
        let v = self.c.take_floats(name);
        if let (Some(v), Some(n)) = (&v, len) {
            if v.len() != n {
                return Err(self.bad(format!("{name} has {} values, expected {n}", v.len())));
            }
        }
        self.floats_n += v.as_ref().map_or(0, |v| v.len() as u64);
        Ok(v)
    }

    fn need(&mut self, name: &str, len: Option<usize>, what: &str) -> Result<Vec<f32>> {
        self.floats(name, len)?
            .ok_or_else(|| self.bad(format!("no {what}")))
    }
}

impl LayerSource for CacheSource<'_> {
    fn layer_floats(&mut self, i: usize) -> Result<LayerFloats> {
        let config = self.config;
        let d = config.hidden_size;
        let (qd, kvd, hd) = (
            config.n_heads * config.head_dim,
            config.n_kv_heads * config.head_dim,
            config.head_dim,
        );
        let n = |w: &str| names::layer(i, w);
        let moe = if self.c.has_floats(&n("router")) {
            let ne = config.n_experts;
            let router = self.need(&n("router"), Some(ne * d), "router")?;
            Some(MoeFloats {
                router: Tensor::new(vec![ne, d], router),
                n_experts: ne,
                shared_expert: self.c.has_tensor(&names::mlp(i, ne, "gate")),
                shared_gate: self.floats(&n("shared_gate"), Some(d))?,
            })
        } else {
            None
        };
        Ok(LayerFloats {
            attn_norm: self.need(&n("attn_norm"), Some(d), "attn_norm")?,
            q_bias: self.floats(&n("q_bias"), Some(qd))?,
            k_bias: self.floats(&n("k_bias"), Some(kvd))?,
            v_bias: self.floats(&n("v_bias"), Some(kvd))?,
            q_norm: self.floats(&n("q_norm"), Some(hd))?,
            k_norm: self.floats(&n("k_norm"), Some(hd))?,
            ffn_norm: self.need(&n("ffn_norm"), Some(d), "ffn_norm")?,
            moe,
        })
    }

    fn linear(&mut self, id: LinearId) -> Result<Box<dyn PackedLinear>> {
        let config = self.config;
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
                let gate = self
                    .c
                    .take_tensor(&name)
                    .ok_or_else(|| self.bad(format!("no tensor {name}")))?;
                if gate.cols() != d {
                    return Err(self.bad(format!("{name} has {} columns", gate.cols())));
                }
                self.ffn = gate.rows();
                return Ok(gate);
            }
            TensorRole::FfnUp => (self.ffn, d),
            _ => (d, self.ffn),
        };
        self.tensor(&name, rows, cols)
    }
}
