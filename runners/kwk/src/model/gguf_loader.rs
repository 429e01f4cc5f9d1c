//! Loading a GGUF file into master weights (names mapped, q/k permutation undone).
//!
//! [`load_gguf`] reads the model's [`ModelConfig`] from the `<arch>.*` metadata keys
//! ([`config_from_gguf`], in `model/config/from_gguf.rs`; architectures `llama` — which
//! also covers Mistral, and Mixtral when `llama.expert_count` is set — `qwen2`, `qwen3`,
//! `qwen2moe`, `qwen3moe`; key names from llama.cpp's `src/llama-arch.cpp`), the tokenizer
//! fields (`tokenizer.ggml.*`), and every weight, dequantized from its ggml type to float32
//! ([`crate::format::ggml_blocks`]) and arranged as Hugging Face lays it out:
//!
//! - ggml dimensions are innermost-first, so a tensor with `ne = [in, out]` is the HF
//!   `[out, in]` matrix with the same bytes; stacked experts `ne = [in, out, n_expert]`
//!   are `n_expert` such matrices one after another.
//! - llama.cpp's converter (`conversion/llama.py`, `LlamaModel.permute`) reorders the rows
//!   of `q_proj`/`k_proj` of `llama`-arch models so that ggml's rope, which rotates
//!   adjacent pairs `(x[2i], x[2i+1])`, computes what HF's rotate-half rope computes on
//!   `(x[i], x[i + d/2])`: within each head of `head_dim` rows, HF row `j * d/2 + i` is
//!   written to row `2 i + j`. This loader puts the rows back (k with `n_kv_heads` heads),
//!   so the decoder sees one convention whatever the source. qwen2/qwen3 models use
//!   ggml's NeoX rope and are stored unpermuted.
//! - `output.weight` absent means the output projection is tied to `token_embd`.
//!
//! Llama 3.x rope scaling reaches GGUF only as a `rope_freqs.weight` tensor of per-frequency
//! factors; the config reader recognises the factors of the standard llama3 parameters and
//! otherwise keeps them as `RopeScaling::Other` so the decoder can refuse the model.

use super::assemble::{assemble_weights, WeightSource};
pub use super::config::config_from_gguf;
use super::config::ModelConfig;
use super::names::{gguf_qk_permuted, gguf_tensor_names, LayerTensor, WeightName};
use super::{LoadInfo, ModelWeights, Tensor};
use crate::error::{KwkError, Result};
use crate::format::ggml_blocks::{dequantize, dequantize_parallel, SourceBlocks};
use crate::gguf::{GgufFile, GgufTensorInfo};
use crate::tokenizer::GgufTokenizerMetadata;
use std::path::Path;
use std::time::Instant;

/// The `tokenizer.ggml.*` fields.
pub fn tokenizer_metadata_from_gguf(file: &GgufFile) -> Result<GgufTokenizerMetadata> {
    let k = |s: &str| format!("tokenizer.ggml.{s}");
    let model = file.get_str(&k("model"))?.ok_or_else(|| {
        KwkError::bad_model(
            file.path(),
            "metadata key 'tokenizer.ggml.model' is missing; the GGUF has no tokenizer",
        )
    })?;
    let tokens = file.get_string_array(&k("tokens"))?.ok_or_else(|| {
        KwkError::bad_model(
            file.path(),
            "metadata key 'tokenizer.ggml.tokens' is missing",
        )
    })?;
    Ok(GgufTokenizerMetadata {
        model: model.to_string(),
        pre: file.get_str(&k("pre"))?.map(str::to_string),
        tokens,
        scores: file.get_f32_array(&k("scores"))?,
        token_types: file.get_i32_array(&k("token_type"))?,
        merges: file.get_string_array(&k("merges"))?,
        bos_id: file.get_u32(&k("bos_token_id"))?,
        eos_id: file.get_u32(&k("eos_token_id"))?,
        unk_id: file.get_u32(&k("unknown_token_id"))?,
        pad_id: file.get_u32(&k("padding_token_id"))?,
        add_bos: file.get_bool(&k("add_bos_token"))?,
        add_eos: file.get_bool(&k("add_eos_token"))?,
        add_space_prefix: file.get_bool(&k("add_space_prefix"))?,
    })
}

/// Where a weight lives in a GGUF file.
enum GgufLocation<'a> {
    /// A whole tensor.
    Whole(&'a GgufTensorInfo),
    /// Expert `e` of a stacked `[n_expert, out, in]` tensor.
    Expert(&'a GgufTensorInfo, usize),
}

/// A GGUF file as a [`WeightSource`].
pub(crate) struct GgufSource<'a> {
    pub(crate) file: &'a GgufFile,
    /// Undo `LlamaModel.permute` on q/k (llama-arch files).
    pub(crate) unpermute_qk: bool,
    pub(crate) n_heads: usize,
    pub(crate) n_kv_heads: usize,
}

impl GgufSource<'_> {
    /// GGUF names: `(tensor name, expert index in a stacked tensor)`, first choice first
    /// ([`gguf_tensor_names`]).
    fn candidates(&self, name: WeightName) -> Vec<(String, Option<usize>)> {
        gguf_tensor_names(name)
    }

    fn locate(&self, name: WeightName) -> Option<(String, GgufLocation<'_>)> {
        self.candidates(name).into_iter().find_map(|(n, e)| {
            let info = self.file.tensor(&n)?;
            Some(match e {
                Some(e) => (n, GgufLocation::Expert(info, e)),
                None => (n, GgufLocation::Whole(info)),
            })
        })
    }

    fn bad(&self, what: String) -> KwkError {
        KwkError::bad_model(self.file.path(), what)
    }

    /// Heads whose rows `LlamaModel.permute` reordered in this tensor, if any.
    fn permuted_heads(&self, name: WeightName) -> Option<usize> {
        if !self.unpermute_qk {
            return None;
        }
        match name {
            WeightName::Layer(_, LayerTensor::Q | LayerTensor::QBias) => Some(self.n_heads),
            WeightName::Layer(_, LayerTensor::K | LayerTensor::KBias) => Some(self.n_kv_heads),
            _ => None,
        }
    }
}

/// Whether ggml dims (innermost first) describe the row-major `shape`. A `[1, d]` matrix
/// may also be stored as a vector `[d]` (qwen2moe's `ffn_gate_inp_shexp`).
fn dims_match(dims: &[u64], shape: &[usize]) -> bool {
    let rev: Vec<usize> = dims.iter().rev().map(|&d| d as usize).collect();
    rev == shape || (shape.len() == 2 && shape[0] == 1 && rev == shape[1..])
}

impl WeightSource for GgufSource<'_> {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn name_of(&self, name: WeightName) -> String {
        self.candidates(name)
            .into_iter()
            .map(|(n, e)| match e {
                Some(e) => format!("{n} (expert {e})"),
                None => n,
            })
            .collect::<Vec<_>>()
            .join("' or '")
    }

    fn found_name(&self, name: WeightName) -> String {
        match self.locate(name) {
            Some((n, GgufLocation::Expert(_, e))) => format!("{n} (expert {e})"),
            Some((n, GgufLocation::Whole(_))) => n,
            None => self.name_of(name),
        }
    }

    fn load(&self, name: WeightName, shape: &[usize]) -> Result<Option<Tensor>> {
        let Some((tensor_name, loc)) = self.locate(name) else {
            return Ok(None);
        };
        let n: usize = shape.iter().product();
        let (info, bytes) = match loc {
            GgufLocation::Whole(info) => {
                if !dims_match(&info.dims, shape) {
                    return Err(self.bad(format!(
                        "tensor '{tensor_name}' has ggml dims {:?} (row-major {:?}); the \
                         metadata implies {shape:?}",
                        info.dims,
                        info.shape_row_major()
                    )));
                }
                (info, self.file.tensor_bytes(info)?)
            }
            GgufLocation::Expert(info, e) => {
                let mut want: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
                let n_expert = info.dims.get(2).copied().unwrap_or(0);
                want.push(n_expert);
                if info.dims != want || e as u64 >= n_expert {
                    return Err(self.bad(format!(
                        "stacked expert tensor '{tensor_name}' has ggml dims {:?}; expert {e} \
                         of shape {shape:?} needs [{}, {}, n_expert > {e}]",
                        info.dims, shape[1], shape[0]
                    )));
                }
                // Each expert is a whole number of rows, so of blocks: an equal byte share.
                let per_expert = (info.n_bytes / n_expert) as usize;
                let all = self.file.tensor_bytes(info)?;
                (info, &all[e * per_expert..(e + 1) * per_expert])
            }
        };
        if !info.ggml_type.can_dequantize() {
            return Err(KwkError::Unsupported(format!(
                "{}: tensor '{tensor_name}' is stored as {}; kwk reads F32, F16, BF16, Q8_0, \
                 Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K",
                self.file.path().display(),
                info.ggml_type
            )));
        }
        let conversion_error = |e: crate::format::ggml_blocks::DequantizeError| {
            self.bad(format!("tensor '{tensor_name}': {e}"))
        };
        let mut data = vec![0f32; n];
        // The blocks themselves, rows in the order of `data` (kept for the block types a
        // packed layout may copy exactly; see `format::source_grid`).
        let keep = crate::format::source_grid::may_copy(info.ggml_type);
        let mut source = Vec::new();
        match self.permuted_heads(name) {
            None => {
                dequantize_parallel(info.ggml_type, bytes, &mut data).map_err(conversion_error)?;
                if keep {
                    source = bytes.to_vec();
                }
            }
            Some(heads) => {
                // GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i (LlamaModel.permute).
                let rows = shape[0];
                let cols = n / rows;
                if !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
                    return Err(self.bad(format!(
                        "tensor '{tensor_name}' has {rows} rows, not an even number per head for {heads} heads"
                    )));
                }
                let hd = rows / heads;
                let row_bytes = bytes.len() / rows;
                if keep {
                    source = vec![0u8; bytes.len()];
                }
                for (g, src) in bytes.chunks_exact(row_bytes).enumerate() {
                    let (h, r) = (g / hd, g % hd);
                    let (i, j) = (r / 2, r % 2);
                    let hf = h * hd + j * (hd / 2) + i;
                    dequantize(info.ggml_type, src, &mut data[hf * cols..(hf + 1) * cols])
                        .map_err(conversion_error)?;
                    if keep {
                        source[hf * row_bytes..(hf + 1) * row_bytes].copy_from_slice(src);
                    }
                }
            }
        }
        let t = Tensor::new(shape.to_vec(), data);
        Ok(Some(if keep {
            t.with_source(SourceBlocks {
                ty: info.ggml_type,
                bytes: source,
            })
        } else {
            t
        }))
    }
}

/// Loads a GGUF file: config, float32 master weights (q/k in HF order), tokenizer fields
/// and load figures.
pub fn load_gguf(
    path: &Path,
) -> Result<(ModelConfig, ModelWeights, GgufTokenizerMetadata, LoadInfo)> {
    let start = Instant::now();
    let file = GgufFile::open(path)?;
    let config = config_from_gguf(&file)?;
    let tokenizer = tokenizer_metadata_from_gguf(&file)?;
    let source = GgufSource {
        file: &file,
        unpermute_qk: gguf_qk_permuted(file.get_str("general.architecture")?),
        n_heads: config.n_heads,
        n_kv_heads: config.n_kv_heads,
    };
    let weights = assemble_weights(&source, &config)?;
    let summary = file.summary();
    let info = LoadInfo {
        requested: path.display().to_string(),
        resolved_path: path.to_path_buf(),
        source_bytes: summary.tensor_bytes,
        source_types: summary.type_counts,
        read_s: start.elapsed().as_secs_f64(),
    };
    Ok((config, weights, tokenizer, info))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::test_writer::{gguf_bytes, TestTensor};
    use crate::model::config::{llama3_rope_factors, Architecture, RopeScaling};
    use crate::model::safetensors_loader::load_hf_weights;
    use crate::model::{FeedForward, Mlp};
    use kwk_fixtures::model_dir as fixture_dir;

    fn close(what: &str, a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-6, "{what}[{i}]: {x} vs {y}");
        }
    }

    fn close_t(what: &str, a: &Tensor, b: &Tensor) {
        assert_eq!(a.shape, b.shape, "{what}: shapes");
        close(what, &a.data, &b.data);
    }

    fn close_opt(what: &str, a: &Option<Vec<f32>>, b: &Option<Vec<f32>>) {
        assert_eq!(a.is_some(), b.is_some(), "{what}: presence");
        if let (Some(a), Some(b)) = (a, b) {
            close(what, a, b);
        }
    }

    fn close_mlp(what: &str, a: &Mlp, b: &Mlp) {
        close_t(&format!("{what}.gate"), &a.gate, &b.gate);
        close_t(&format!("{what}.up"), &a.up, &b.up);
        close_t(&format!("{what}.down"), &a.down, &b.down);
    }

    /// Every weight of `a` equals `b`'s within 1e-6.
    pub(crate) fn assert_weights_close(a: &ModelWeights, b: &ModelWeights) {
        close_t("embed", &a.embed, &b.embed);
        close("final_norm", &a.final_norm, &b.final_norm);
        assert_eq!(a.lm_head.is_some(), b.lm_head.is_some(), "lm_head presence");
        if let (Some(x), Some(y)) = (&a.lm_head, &b.lm_head) {
            close_t("lm_head", x, y);
        }
        assert_eq!(a.layers.len(), b.layers.len());
        for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
            close(&format!("{l}.attn_norm"), &x.attn_norm, &y.attn_norm);
            close(&format!("{l}.ffn_norm"), &x.ffn_norm, &y.ffn_norm);
            close_t(&format!("{l}.q"), &x.q, &y.q);
            close_t(&format!("{l}.k"), &x.k, &y.k);
            close_t(&format!("{l}.v"), &x.v, &y.v);
            close_t(&format!("{l}.o"), &x.o, &y.o);
            close_opt(&format!("{l}.q_bias"), &x.q_bias, &y.q_bias);
            close_opt(&format!("{l}.k_bias"), &x.k_bias, &y.k_bias);
            close_opt(&format!("{l}.v_bias"), &x.v_bias, &y.v_bias);
            close_opt(&format!("{l}.q_norm"), &x.q_norm, &y.q_norm);
            close_opt(&format!("{l}.k_norm"), &x.k_norm, &y.k_norm);
            match (&x.ffn, &y.ffn) {
                (FeedForward::Dense(m), FeedForward::Dense(n)) => {
                    close_mlp(&format!("{l}.mlp"), m, n)
                }
                (FeedForward::Moe(m), FeedForward::Moe(n)) => {
                    close_t(&format!("{l}.router"), &m.router, &n.router);
                    assert_eq!(m.experts.len(), n.experts.len());
                    for (e, (p, q)) in m.experts.iter().zip(&n.experts).enumerate() {
                        close_mlp(&format!("{l}.expert{e}"), p, q);
                    }
                    assert_eq!(m.shared_expert.is_some(), n.shared_expert.is_some());
                    if let (Some(p), Some(q)) = (&m.shared_expert, &n.shared_expert) {
                        close_mlp(&format!("{l}.shared_expert"), p, q);
                    }
                    assert_eq!(
                        m.shared_expert_gate.is_some(),
                        n.shared_expert_gate.is_some()
                    );
                    if let (Some(p), Some(q)) = (&m.shared_expert_gate, &n.shared_expert_gate) {
                        close_t(&format!("{l}.shared_expert_gate"), p, q);
                    }
                }
                _ => panic!("layer {l}: dense vs moe"),
            }
        }
    }

    fn hf_fixture(name: &str) -> (ModelConfig, ModelWeights) {
        let dir = fixture_dir(name);
        let config = ModelConfig::from_hf_config_json(&dir.join("config.json")).unwrap();
        let (w, _) = load_hf_weights(&dir, &config).unwrap();
        (config, w)
    }

    fn same_config(g: &ModelConfig, h: &ModelConfig) {
        assert_eq!(g.architecture, h.architecture);
        assert_eq!(
            (
                g.hidden_size,
                g.intermediate_size,
                g.n_layers,
                g.n_heads,
                g.n_kv_heads,
                g.head_dim
            ),
            (
                h.hidden_size,
                h.intermediate_size,
                h.n_layers,
                h.n_heads,
                h.n_kv_heads,
                h.head_dim
            )
        );
        assert_eq!(
            (g.vocab_size, g.max_position_embeddings),
            (h.vocab_size, h.max_position_embeddings)
        );
        assert_eq!(
            (g.rms_norm_eps, g.rope_theta),
            (h.rms_norm_eps, h.rope_theta)
        );
        assert_eq!(g.tie_word_embeddings, h.tie_word_embeddings);
        assert_eq!(
            (g.n_experts, g.experts_per_token, g.moe_intermediate_size),
            (h.n_experts, h.experts_per_token, h.moe_intermediate_size)
        );
        assert_eq!(g.norm_topk_prob, h.norm_topk_prob);
        assert_eq!(g.rope_scaling, h.rope_scaling);
        assert_eq!(
            (g.bos_token_id, &g.eos_token_ids),
            (h.bos_token_id, &h.eos_token_ids)
        );
    }

    #[test]
    fn fixture_ggufs_equal_their_safetensors() {
        for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
            let (hc, hw) = hf_fixture(name);
            let (gc, gw, tok, info) = load_gguf(&fixture_dir(name).join("model.gguf")).unwrap();
            same_config(&gc, &hc);
            assert_weights_close(&gw, &hw);
            assert_eq!(tok.model, "gpt2");
            assert_eq!(tok.pre.as_deref(), Some("gpt-2"));
            assert_eq!(tok.tokens.len(), 512);
            assert_eq!(
                info.source_types.len(),
                1,
                "{name}: {:?}",
                info.source_types
            );
        }
    }

    /// Tiny qwen2_moe / qwen3_moe models written by `scripts/gen_moe_test_models.py` (HF
    /// folder and a GGUF made with gguf-py's writer and llama.cpp's tensor-name table).
    #[test]
    fn qwen_moe_ggufs_equal_their_safetensors() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-moe");
        for (name, arch) in [
            ("qwen2_moe", Architecture::Qwen2Moe),
            ("qwen3_moe", Architecture::Qwen3Moe),
        ] {
            let dir = data.join(name);
            let hc = ModelConfig::from_hf_config_json(&dir.join("config.json")).unwrap();
            let (hw, _) = load_hf_weights(&dir, &hc).unwrap();
            let (gc, gw, _, _) = load_gguf(&dir.join("model.gguf")).unwrap();
            assert_eq!(hc.architecture, arch);
            same_config(&gc, &hc);
            assert_eq!(
                gc.shared_expert_intermediate_size,
                hc.shared_expert_intermediate_size
            );
            assert_weights_close(&gw, &hw);
            let FeedForward::Moe(moe) = &hw.layers[1].ffn else {
                panic!("{name}: MoE layer expected")
            };
            assert_eq!(moe.experts.len(), 3);
            if arch == Architecture::Qwen2Moe {
                assert_eq!(hc.shared_expert_intermediate_size, 12);
                let FeedForward::Moe(gmoe) = &gw.layers[1].ffn else {
                    unreachable!()
                };
                close_mlp(
                    "shared",
                    gmoe.shared_expert.as_ref().unwrap(),
                    moe.shared_expert.as_ref().unwrap(),
                );
                close_t(
                    "shared gate",
                    gmoe.shared_expert_gate.as_ref().unwrap(),
                    moe.shared_expert_gate.as_ref().unwrap(),
                );
                assert!(hw.layers[0].q_bias.is_some());
            } else {
                assert_eq!((hc.head_dim, hc.n_heads), (8, 4));
                assert!(hw.layers[0].q_norm.is_some() && hw.layers[0].k_norm.is_some());
            }
        }
    }

    #[test]
    fn llama_gguf_q_k_rows_really_are_permuted() {
        // Without the un-permutation the llama fixture's q/k would differ from HF: proves
        // the comparison above exercises it (and that qwen2's are stored as is).
        let file = GgufFile::open(&fixture_dir("tiny-llama").join("model.gguf")).unwrap();
        let (_, hw) = hf_fixture("tiny-llama");
        let raw = file.tensor("blk.0.attn_k.weight").unwrap();
        let mut data = vec![0f32; raw.n_elements() as usize];
        dequantize(raw.ggml_type, file.tensor_bytes(raw).unwrap(), &mut data).unwrap();
        assert_ne!(data, hw.layers[0].k.data);
        // Row 1 of GGUF head 0 is HF row hd/2 = 8.
        assert_eq!(&data[64..128], hw.layers[0].k.row(8));
    }

    /// Rewrites a GGUF with `edit` applied to its tensors.
    fn rewritten(
        src: &Path,
        edit: impl Fn(&GgufFile, Vec<TestTensor>) -> Vec<TestTensor>,
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let file = GgufFile::open(src).unwrap();
        let tensors: Vec<TestTensor> = file
            .tensors()
            .iter()
            .map(|t| TestTensor {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ggml_type: t.ggml_type,
                data: file.tensor_bytes(t).unwrap().to_vec(),
            })
            .collect();
        let tensors = edit(&file, tensors);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edited.gguf");
        std::fs::write(&path, gguf_bytes(file.metadata(), &tensors)).unwrap();
        (dir, path)
    }

    #[test]
    fn per_expert_tensors_load_like_stacked_ones() {
        let src = fixture_dir("tiny-mixtral").join("model.gguf");
        let (_dir, path) = rewritten(&src, |_, tensors| {
            let mut out = Vec::new();
            for t in tensors {
                let Some(base) = t.name.strip_suffix("_exps.weight") else {
                    out.push(t);
                    continue;
                };
                let n_expert = t.dims[2] as usize;
                let per = t.data.len() / n_expert;
                for e in 0..n_expert {
                    out.push(TestTensor {
                        name: format!("{base}.{e}.weight"),
                        dims: t.dims[..2].to_vec(),
                        ggml_type: t.ggml_type,
                        data: t.data[e * per..(e + 1) * per].to_vec(),
                    });
                }
            }
            out
        });
        let (_, w, _, _) = load_gguf(&path).unwrap();
        let (_, hw) = hf_fixture("tiny-mixtral");
        assert_weights_close(&w, &hw);
    }

    #[test]
    fn unsupported_type_names_tensor_and_type() {
        let src = fixture_dir("tiny-llama").join("model.gguf");
        let (_dir, path) = rewritten(&src, |_, mut tensors| {
            let t = tensors
                .iter_mut()
                .find(|t| t.name == "blk.1.ffn_up.weight")
                .unwrap();
            // [64, 160] as IQ4_NL: 32-value blocks of 18 bytes.
            t.ggml_type = crate::format::ggml_blocks::GgmlType(20);
            t.data = vec![0u8; 160 * 2 * 18];
            tensors
        });
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(
            msg.contains("blk.1.ffn_up.weight") && msg.contains("IQ4_NL"),
            "{msg}"
        );
    }

    #[test]
    fn wrong_shape_and_missing_tensor_are_named() {
        let src = fixture_dir("tiny-qwen2").join("model.gguf");
        let (_dir, path) = rewritten(&src, |_, mut tensors| {
            let t = tensors
                .iter_mut()
                .find(|t| t.name == "blk.0.attn_v.weight")
                .unwrap();
            t.dims = vec![16, 64];
            tensors
        });
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(
            msg.contains("'blk.0.attn_v.weight'") && msg.contains("edited.gguf"),
            "{msg}"
        );

        let (_dir, path) = rewritten(&src, |_, mut tensors| {
            tensors.retain(|t| t.name != "blk.1.attn_k.bias");
            tensors
        });
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(msg.contains("'blk.1.attn_k.bias' is missing"), "{msg}");
    }

    #[test]
    fn llama3_rope_factors_are_recognised() {
        // Llama 3.2 1B: theta 500000, head_dim 64, factor 32, low 1, high 4, original 8192.
        // Reference: conversion/llama.py's generate_extra_tensors, run in numpy float32.
        let reference = [
            1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.651329,
            3.292263, 9.666731, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0,
            32.0, 32.0, 32.0,
        ];
        let f = llama3_rope_factors(500000.0, 64, 32.0, 1.0, 4.0, 8192);
        for (i, (a, b)) in f.iter().zip(reference).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b, "factor {i}: {a} vs {b}");
        }
        let src = fixture_dir("tiny-llama").join("model.gguf");
        let factors = llama3_rope_factors(10000.0, 16, 8.0, 1.0, 4.0, 8192);
        let (_dir, path) = rewritten(&src, |_, mut tensors| {
            tensors.push(crate::gguf::test_writer::f32_tensor(
                "rope_freqs.weight",
                &[8],
                &factors,
            ));
            tensors
        });
        let file = GgufFile::open(&path).unwrap();
        let c = config_from_gguf(&file).unwrap();
        assert!(
            matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0),
            "{:?}",
            c.rope_scaling
        );
        let mut odd = factors.clone();
        odd[3] = 2.5;
        let (_dir, path) = rewritten(&src, |_, mut tensors| {
            tensors.push(crate::gguf::test_writer::f32_tensor(
                "rope_freqs.weight",
                &[8],
                &odd,
            ));
            tensors
        });
        let c = config_from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Other(_)));
    }

    /// A copy of the fixture GGUF `model` with `values[i] = v` written into the named
    /// tensors (stored as F32 from then on), for tests of damaged weights.
    pub(crate) fn gguf_with_values(
        model: &str,
        edits: &[(&str, &[(usize, f32)])],
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let src = fixture_dir(model).join("model.gguf");
        rewritten(&src, |_, mut tensors| {
            for (name, values) in edits {
                let t = tensors.iter_mut().find(|t| t.name == *name).unwrap();
                let n: u64 = t.dims.iter().product();
                let mut data = vec![0f32; n as usize];
                dequantize(t.ggml_type, &t.data, &mut data).unwrap();
                for &(i, v) in *values {
                    data[i] = v;
                }
                t.ggml_type = crate::format::ggml_blocks::GgmlType::F32;
                t.data = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            }
            tensors
        })
    }

    /// NaN or Inf in a weight is an error at load naming the file, the tensor and how many
    /// values are not finite (item 1 of issue 42: they were hidden, giving a normal PPL).
    #[test]
    fn non_finite_weights_are_refused_naming_tensor_and_count() {
        let nan: Vec<(usize, f32)> = (0..10).map(|i| (7 * i + 3, f32::NAN)).collect();
        let inf = [
            (5, f32::INFINITY),
            (6, f32::NEG_INFINITY),
            (100, f32::INFINITY),
        ];
        let (_d, path) = gguf_with_values("tiny-llama", &[("blk.1.attn_q.weight", &nan)]);
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(
            msg.contains(
                "edited.gguf: tensor 'blk.1.attn_q.weight' has 10 non-finite values (NaN/Inf)"
            ) && msg.contains("re-convert"),
            "{msg}"
        );
        let (_d, path) = gguf_with_values("tiny-llama", &[("blk.0.ffn_down.weight", &inf)]);
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(
            msg.contains("tensor 'blk.0.ffn_down.weight' has 3 non-finite values"),
            "{msg}"
        );
        // Both at once: the first in layer order is named, and so is the NaN in a norm.
        let (_d, path) = gguf_with_values(
            "tiny-llama",
            &[
                ("blk.1.attn_q.weight", &nan),
                ("blk.0.ffn_down.weight", &inf),
            ],
        );
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(msg.contains("'blk.0.ffn_down.weight' has 3"), "{msg}");
        let (_d, path) =
            gguf_with_values("tiny-llama", &[("output_norm.weight", &[(0, f32::NAN)])]);
        let msg = load_gguf(&path).unwrap_err().to_string();
        assert!(
            msg.contains("'output_norm.weight' has 1 non-finite value (NaN/Inf)"),
            "{msg}"
        );
    }

    #[test]
    fn non_finite_count_counts_every_kind() {
        use crate::model::assemble::non_finite_count;
        let mut v = vec![1.0f32; 37];
        assert_eq!(non_finite_count(&v), 0);
        v[0] = f32::NAN;
        v[16] = f32::INFINITY;
        v[36] = f32::NEG_INFINITY;
        v[20] = f32::MAX;
        v[21] = f32::MIN_POSITIVE / 2.0;
        assert_eq!(non_finite_count(&v), 3);
        assert_eq!(non_finite_count(&[]), 0);
    }

    #[test]
    fn smollm2_q4_1_gguf_loads() {
        let dir = crate::format::ggml_blocks::tests::smollm2_dir();
        let (c, w, tok, info) = load_gguf(&dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
        eprintln!("SmolLM2-135M Q4_1 GGUF loaded in {:.3} s", info.read_s);
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!(
            (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads),
            (30, 576, 9, 3)
        );
        assert_eq!(
            (c.vocab_size, c.head_dim, c.intermediate_size),
            (49152, 64, 1536)
        );
        assert!(c.tie_word_embeddings && w.lm_head.is_none());
        assert_eq!(c.rope_theta, 100000.0);
        assert_eq!(tok.pre.as_deref(), Some("smollm"));
        assert_eq!(tok.tokens.len(), 49152);
        assert_eq!(info.source_types.get("Q4_1"), Some(&210));
        // The float32 GGUF llama-quantize made from it holds the same values.
        let (_, wf, _, _) = load_gguf(&dir.join("SmolLM2-135M-Instruct-F32.gguf")).unwrap();
        assert_eq!(w.layers[29].q, wf.layers[29].q);
        assert_eq!(w.embed, wf.embed);
        let n: usize = w
            .layers
            .iter()
            .map(|l| l.q.data.len() + l.k.data.len())
            .sum();
        assert_eq!(n, 30 * (576 * 576 + 192 * 576));
    }
}
