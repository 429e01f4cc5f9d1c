//! Models handed over in memory rather than in files: a Hugging Face config as JSON text
//! and tensors by their Hugging Face names (a `transformers` model's `state_dict()`, as
//! the Python binding passes it), borrowed from the caller. They are assembled by the same
//! code as a safetensors folder ([`assemble_weights`]): the same tensor names
//! ([`hf_tensor_name`]), the same shape checks against the config, and errors that name
//! the tensor.
//!
//! `transformers` 5 names Mixtral's MoE block `mlp` (checkpoints: `block_sparse_moe`) and
//! keeps a mixture-of-experts layer's experts fused in two tensors
//! (`mlp.experts.gate_up_proj` `[experts, 2*ffn, d]` and `mlp.experts.down_proj`
//! `[experts, d, ffn]`) where checkpoints have one tensor per expert; both spellings are
//! read here, the fused one by slicing out expert `e`'s rows.

use super::assemble::{assemble_weights, WeightSource};
use super::config::{Architecture, ModelConfig};
use super::names::{hf_norm_offset, hf_tensor_name, LayerTensor, WeightName};
use super::{ModelWeights, Tensor};
use crate::error::{KwkError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The elements of a borrowed tensor, little-endian as the CPU holds them.
#[derive(Debug, Clone, Copy)]
pub enum TensorData<'a> {
    F32(&'a [f32]),
    /// IEEE half precision, as raw bits.
    F16(&'a [u16]),
    /// bfloat16, as raw bits.
    Bf16(&'a [u16]),
}

impl TensorData<'_> {
    fn len(&self) -> usize {
        match self {
            TensorData::F32(d) => d.len(),
            TensorData::F16(d) | TensorData::Bf16(d) => d.len(),
        }
    }

    /// Elements `range` converted to float32, appended to `out`.
    fn extend_f32(&self, range: std::ops::Range<usize>, out: &mut Vec<f32>) {
        match self {
            TensorData::F32(d) => out.extend_from_slice(&d[range]),
            TensorData::F16(d) => {
                out.extend(d[range].iter().map(|&b| half::f16::from_bits(b).to_f32()))
            }
            TensorData::Bf16(d) => {
                out.extend(d[range].iter().map(|&b| half::bf16::from_bits(b).to_f32()))
            }
        }
    }

    fn dtype_name(&self) -> &'static str {
        match self {
            TensorData::F32(_) => "float32",
            TensorData::F16(_) => "float16",
            TensorData::Bf16(_) => "bfloat16",
        }
    }
}

/// One borrowed, row-major (C-contiguous) tensor.
#[derive(Debug, Clone)]
pub struct NamedTensor<'a> {
    pub shape: Vec<usize>,
    pub data: TensorData<'a>,
}

/// Tensors by their Hugging Face names.
pub type NamedTensors<'a> = HashMap<String, NamedTensor<'a>>;

struct MemorySource<'a, 't> {
    origin: PathBuf,
    architecture: Architecture,
    tensors: &'t NamedTensors<'a>,
}

/// Where a fused expert tensor holds expert `e`'s rows: (fused name, first row, rows).
fn fused_expert(prefix: &str, t: LayerTensor, shape: &[usize]) -> Option<(String, usize)> {
    let rows = *shape.first()?;
    // gate_up_proj stacks gate then up: [2*ffn, d] per expert.
    match t {
        LayerTensor::ExpertGate(_) => Some((format!("{prefix}.experts.gate_up_proj"), 0)),
        LayerTensor::ExpertUp(_) => Some((format!("{prefix}.experts.gate_up_proj"), rows)),
        LayerTensor::ExpertDown(_) => Some((format!("{prefix}.experts.down_proj"), 0)),
        _ => None,
    }
}

impl MemorySource<'_, '_> {
    fn check_len(&self, name: &str, t: &NamedTensor) -> Result<()> {
        let n: usize = t.shape.iter().product();
        if t.data.len() != n {
            return Err(KwkError::bad_model(
                &self.origin,
                format!(
                    "tensor '{name}' has {} {} elements for shape {:?}",
                    t.data.len(),
                    t.data.dtype_name(),
                    t.shape
                ),
            ));
        }
        Ok(())
    }

    /// Expert `e` of a fused `transformers` 5 tensor, when the per-expert name is absent.
    fn load_fused(&self, l: usize, t: LayerTensor, shape: &[usize]) -> Result<Option<Tensor>> {
        let e = match t {
            LayerTensor::ExpertGate(e) | LayerTensor::ExpertUp(e) | LayerTensor::ExpertDown(e) => e,
            _ => return Ok(None),
        };
        // transformers 5 names Mixtral's block `mlp` as well; try both prefixes.
        for block in ["mlp", "block_sparse_moe"] {
            let prefix = format!("model.layers.{l}.{block}");
            let Some((fused, first_row)) = fused_expert(&prefix, t, shape) else {
                return Ok(None);
            };
            let Some(ft) = self.tensors.get(&fused) else {
                continue;
            };
            self.check_len(&fused, ft)?;
            let (rows, cols) = (shape[0], shape[1]);
            let per_expert_rows = if matches!(t, LayerTensor::ExpertDown(_)) {
                rows
            } else {
                2 * rows
            };
            if ft.shape.len() != 3
                || ft.shape[1] != per_expert_rows
                || ft.shape[2] != cols
                || e >= ft.shape[0]
            {
                return Err(KwkError::bad_model(
                    &self.origin,
                    format!(
                        "tensor '{fused}' has shape {:?}, the config implies [experts, {per_expert_rows}, {cols}]",
                        ft.shape
                    ),
                ));
            }
            let start = (e * per_expert_rows + first_row) * cols;
            let mut data = Vec::with_capacity(rows * cols);
            ft.data.extend_f32(start..start + rows * cols, &mut data);
            return Ok(Some(Tensor::new(shape.to_vec(), data)));
        }
        Ok(None)
    }
}

impl WeightSource for MemorySource<'_, '_> {
    fn path(&self) -> &Path {
        &self.origin
    }

    fn name_of(&self, name: WeightName) -> String {
        hf_tensor_name(self.architecture, name)
    }

    fn norm_offset(&self, name: WeightName) -> f32 {
        hf_norm_offset(self.architecture, name)
    }

    fn load(&self, name: WeightName, shape: &[usize]) -> Result<Option<Tensor>> {
        let mut hf = hf_tensor_name(self.architecture, name);
        // transformers 5 calls Mixtral's `block_sparse_moe` `mlp`, like the other MoE models.
        if !self.tensors.contains_key(&hf) && hf.contains(".block_sparse_moe.") {
            hf = hf.replace(".block_sparse_moe.", ".mlp.");
        }
        let Some(t) = self.tensors.get(&hf) else {
            return match name {
                WeightName::Layer(l, lt) => self.load_fused(l, lt, shape),
                _ => Ok(None),
            };
        };
        self.check_len(&hf, t)?;
        if t.shape != shape {
            return Err(KwkError::bad_model(
                &self.origin,
                format!(
                    "tensor '{hf}' has shape {:?}, the config implies {shape:?}",
                    t.shape
                ),
            ));
        }
        let mut data = Vec::with_capacity(t.data.len());
        t.data.extend_f32(0..t.data.len(), &mut data);
        Ok(Some(Tensor::new(shape.to_vec(), data)))
    }
}

/// Float32 master weights from tensors held in memory under their Hugging Face names,
/// checked against `config` like a safetensors folder; `origin` names the model in errors.
/// Names the architecture does not use (rotary caches, a tied `lm_head.weight`) are ignored.
pub fn weights_from_hf_tensors(
    config: &ModelConfig,
    tensors: &NamedTensors<'_>,
    origin: &Path,
) -> Result<ModelWeights> {
    let source = MemorySource {
        origin: origin.to_path_buf(),
        architecture: config.architecture,
        tensors,
    };
    assemble_weights(&source, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::safetensors_loader::load_hf_weights;
    use crate::model::FeedForward;
    use kwk_fixtures::model_dir;

    /// The fixture's tensors (float32) by name, owned.
    fn fixture_tensors(name: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(model_dir(name).join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .map(|(n, v)| {
                let data = v
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                (n, v.shape().to_vec(), data)
            })
            .collect()
    }

    fn borrowed(owned: &[(String, Vec<usize>, Vec<f32>)]) -> NamedTensors<'_> {
        owned
            .iter()
            .map(|(n, s, d)| {
                (
                    n.clone(),
                    NamedTensor {
                        shape: s.clone(),
                        data: TensorData::F32(d),
                    },
                )
            })
            .collect()
    }

    fn config(name: &str) -> ModelConfig {
        ModelConfig::from_hf_config_json(&model_dir(name).join("config.json")).unwrap()
    }

    #[test]
    fn checkpoint_names_give_the_folder_loaders_weights() {
        for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
            let c = config(name);
            let owned = fixture_tensors(name);
            let w = weights_from_hf_tensors(&c, &borrowed(&owned), Path::new("mem")).unwrap();
            let (want, _) = load_hf_weights(&model_dir(name), &c).unwrap();
            assert_eq!(w.embed, want.embed, "{name}");
            assert_eq!(w.final_norm, want.final_norm, "{name}");
            assert_eq!(w.layers[1].q, want.layers[1].q, "{name}");
            assert_eq!(w.layers[0].k_bias, want.layers[0].k_bias, "{name}");
        }
    }

    /// transformers 5's Mixtral: `mlp.` instead of `block_sparse_moe.`, experts fused into
    /// `gate_up_proj` [experts, 2*ffn, d] and `down_proj` [experts, d, ffn].
    #[test]
    fn fused_transformers5_experts_are_sliced_per_expert() {
        let c = config("tiny-mixtral");
        let owned = fixture_tensors("tiny-mixtral");
        let get = |n: &str| owned.iter().find(|t| t.0 == n).unwrap().clone();
        let mut fused: Vec<(String, Vec<usize>, Vec<f32>)> = owned
            .iter()
            .filter(|t| !t.0.contains(".experts."))
            .map(|(n, s, d)| {
                (
                    n.replace(".block_sparse_moe.", ".mlp."),
                    s.clone(),
                    d.clone(),
                )
            })
            .collect();
        for l in 0..c.n_layers {
            let (mut gate_up, mut down) = (Vec::new(), Vec::new());
            for e in 0..c.n_experts {
                let p = format!("model.layers.{l}.block_sparse_moe.experts.{e}");
                gate_up.extend(get(&format!("{p}.w1.weight")).2);
                gate_up.extend(get(&format!("{p}.w3.weight")).2);
                down.extend(get(&format!("{p}.w2.weight")).2);
            }
            let (e, f, d) = (c.n_experts, c.moe_intermediate_size, c.hidden_size);
            let p = format!("model.layers.{l}.mlp.experts");
            fused.push((format!("{p}.gate_up_proj"), vec![e, 2 * f, d], gate_up));
            fused.push((format!("{p}.down_proj"), vec![e, d, f], down));
        }
        let w = weights_from_hf_tensors(&c, &borrowed(&fused), Path::new("mem")).unwrap();
        let (want, _) = load_hf_weights(&model_dir("tiny-mixtral"), &c).unwrap();
        for (got, want) in w.layers.iter().zip(&want.layers) {
            let (FeedForward::Moe(g), FeedForward::Moe(x)) = (&got.ffn, &want.ffn) else {
                panic!("moe expected")
            };
            assert_eq!(g.router, x.router);
            for (ge, xe) in g.experts.iter().zip(&x.experts) {
                assert_eq!((&ge.gate, &ge.up, &ge.down), (&xe.gate, &xe.up, &xe.down));
            }
        }
    }

    #[test]
    fn bf16_bits_wrong_lengths_and_missing_tensors_are_reported() {
        let c = config("tiny-llama");
        let owned = fixture_tensors("tiny-llama");
        let bits: Vec<(String, Vec<usize>, Vec<u16>)> = owned
            .iter()
            .map(|(n, s, d)| {
                let b = d
                    .iter()
                    .map(|x| half::bf16::from_f32(*x).to_bits())
                    .collect();
                (n.clone(), s.clone(), b)
            })
            .collect();
        let named: NamedTensors = bits
            .iter()
            .map(|(n, s, b)| {
                let t = NamedTensor {
                    shape: s.clone(),
                    data: TensorData::Bf16(b),
                };
                (n.clone(), t)
            })
            .collect();
        let w = weights_from_hf_tensors(&c, &named, Path::new("mem")).unwrap();
        let embed = &owned
            .iter()
            .find(|t| t.0 == "model.embed_tokens.weight")
            .unwrap()
            .2;
        for (got, x) in w.embed.data.iter().zip(embed) {
            assert_eq!(*got, half::bf16::from_f32(*x).to_f32());
        }

        let mut short = borrowed(&owned);
        let name = "model.layers.0.self_attn.o_proj.weight";
        let full = owned.iter().find(|t| t.0 == name).unwrap();
        short.get_mut(name).unwrap().data = TensorData::F32(&full.2[1..]);
        let msg = weights_from_hf_tensors(&c, &short, Path::new("mem"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains(name) && msg.contains("elements"), "{msg}");

        let mut missing = borrowed(&owned);
        missing.remove("model.layers.1.mlp.up_proj.weight");
        let msg = weights_from_hf_tensors(&c, &missing, Path::new("mem"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("'model.layers.1.mlp.up_proj.weight' is missing"),
            "{msg}"
        );
    }
}
