//! Loading a Hugging Face folder (config.json + safetensors) into float32 master weights:
//! the safetensors files as a [`WeightSource`] for the shared assembly
//! (`model/assemble.rs`), with tensor names from [`hf_tensor_name`] (`model/names.rs`).
//! Each source converts its storage type (F32/F16/BF16 here, GGML blocks in GGUF)
//! straight from the memory-mapped file into the final `Vec<f32>`, with no intermediate
//! copy.
//!
//! Safetensors files are mapped with memmap2 and their headers parsed and validated by the
//! `safetensors` crate (offsets contiguous, sizes matching dtype × shape, file length equal
//! to header + data); a sharded checkpoint is found through `model.safetensors.index.json`.

use super::assemble::{assemble_weights, WeightSource};
use super::config::{Architecture, ModelConfig};
use super::names::{hf_norm_offset, hf_tensor_name, WeightName};
use super::{LoadInfo, ModelWeights, Tensor};
use crate::error::{KwkError, Result};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorInfo};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Converts little-endian storage of `dtype` to float32, in parallel chunks for big tensors.
fn convert_to_f32(bytes: &[u8], dtype: Dtype, out: &mut [f32]) {
    const CHUNK: usize = 1 << 16;
    let width = dtype.size();
    debug_assert_eq!(bytes.len(), out.len() * width);
    let convert = |src: &[u8], dst: &mut [f32]| match dtype {
        Dtype::F32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Dtype::F16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        Dtype::BF16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => unreachable!("convert_to_f32 is only called for F32/F16/BF16"),
    };
    if out.len() <= CHUNK {
        convert(bytes, out);
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(CHUNK * width))
            .for_each(|(dst, src)| convert(src, dst));
    }
}

struct SafetensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Where tensor data starts (8-byte length + JSON header).
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

impl SafetensorsFile {
    fn open(path: &Path) -> Result<SafetensorsFile> {
        let map = crate::gguf::map_file(path)?;
        let (header_len, metadata) =
            safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
                KwkError::bad_model(
                    path,
                    format!("not a valid safetensors file ({e:?}); re-download or re-export it"),
                )
            })?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            data_start: 8 + header_len,
            map,
            tensors,
        })
    }

    /// The data bytes of a tensor, bounds-checked (read_metadata has validated them, but a
    /// wrong index here must be an error, not a panic).
    fn data(&self, name: &str, info: &TensorInfo) -> Result<&[u8]> {
        let (s, e) = info.data_offsets;
        self.data_start
            .checked_add(s)
            .zip(self.data_start.checked_add(e))
            .and_then(|(s, e)| self.map.get(s..e))
            .ok_or_else(|| {
                KwkError::bad_model(&self.path, format!("tensor '{name}' lies outside the file"))
            })
    }
}

/// The tensors of a Hugging Face checkpoint (one or several safetensors files).
pub(crate) struct SafetensorsSource {
    dir: PathBuf,
    architecture: Architecture,
    files: Vec<SafetensorsFile>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl SafetensorsSource {
    pub(crate) fn open(dir: &Path, architecture: Architecture) -> Result<SafetensorsSource> {
        let files = safetensors_files(dir)?;
        let files = files
            .par_iter()
            .map(|p| SafetensorsFile::open(p))
            .collect::<Vec<Result<_>>>()
            .into_iter()
            .collect::<Result<Vec<_>>>()?; // the first bad file in order, as above
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.tensors.keys() {
                if let Some(prev) = index.insert(name.clone(), i) {
                    return Err(KwkError::bad_model(
                        &f.path,
                        format!(
                            "tensor '{name}' is also in '{}'; a checkpoint holds each tensor once",
                            files[prev].path.display()
                        ),
                    ));
                }
            }
        }
        Ok(SafetensorsSource {
            dir: dir.to_path_buf(),
            architecture,
            files,
            index,
        })
    }

    fn hf_name(&self, name: WeightName) -> String {
        hf_tensor_name(self.architecture, name)
    }

    fn load_info(&self) -> LoadInfo {
        let mut info = LoadInfo {
            resolved_path: self.dir.clone(),
            ..LoadInfo::default()
        };
        for f in &self.files {
            for t in f.tensors.values() {
                info.source_bytes += (t.data_offsets.1 - t.data_offsets.0) as u64;
                *info
                    .source_types
                    .entry(format!("{:?}", t.dtype))
                    .or_insert(0) += 1;
            }
        }
        info
    }
}

impl SafetensorsSource {
    /// Drops the mapped pages read so far from this process's resident set.
    pub(crate) fn release_pages(&self) {
        for f in &self.files {
            crate::gguf::release_pages(&f.map);
        }
    }
}

impl WeightSource for SafetensorsSource {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn name_of(&self, name: WeightName) -> String {
        self.hf_name(name)
    }

    fn norm_offset(&self, name: WeightName) -> f32 {
        hf_norm_offset(self.architecture, name)
    }

    fn load(&self, name: WeightName, shape: &[usize]) -> Result<Option<Tensor>> {
        let hf = self.hf_name(name);
        let Some(&fi) = self.index.get(&hf) else {
            return Ok(None);
        };
        let file = &self.files[fi];
        let info = &file.tensors[&hf];
        if info.shape != shape {
            return Err(KwkError::bad_model(
                &file.path,
                format!(
                    "tensor '{hf}' has shape {:?}, config.json implies {shape:?}",
                    info.shape
                ),
            ));
        }
        if !matches!(info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(KwkError::Unsupported(format!(
                "{}: tensor '{hf}' is stored as {:?}; kwk reads F32, F16 and BF16 safetensors",
                file.path.display(),
                info.dtype
            )));
        }
        let bytes = file.data(&hf, info)?;
        let n: usize = shape.iter().product();
        if bytes.len() != n * info.dtype.size() {
            return Err(KwkError::bad_model(
                &file.path,
                format!(
                    "tensor '{hf}' has {} data bytes for shape {shape:?}",
                    bytes.len()
                ),
            ));
        }
        let mut data = vec![0f32; n];
        convert_to_f32(bytes, info.dtype, &mut data);
        Ok(Some(Tensor::new(shape.to_vec(), data)))
    }
}

/// The shard file names `model.safetensors.index.json` lists (its `weight_map` values),
/// sorted and deduplicated; each must be a plain file name inside the folder.
pub(crate) fn index_shards(index_path: &Path) -> Result<Vec<String>> {
    let text = crate::files::read_regular_to_string(index_path)
        .map_err(|e| KwkError::io(index_path, e))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| KwkError::bad_model(index_path, format!("not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| KwkError::bad_model(index_path, "key 'weight_map' is missing"))?;
    let mut names = std::collections::BTreeSet::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            KwkError::bad_model(
                index_path,
                format!("weight_map['{tensor}'] is not a file name"),
            )
        })?;
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            return Err(KwkError::bad_model(
                index_path,
                format!("weight_map['{tensor}'] = '{file}' is not a file in the folder"),
            ));
        }
        names.insert(file.to_string());
    }
    if names.is_empty() {
        return Err(KwkError::bad_model(index_path, "weight_map is empty"));
    }
    Ok(names.into_iter().collect())
}

/// Which of a folder's `*.safetensors` files (by name, no index) hold the transformers
/// checkpoint: `model.safetensors` when present, else all but Mistral's
/// `consolidated*.safetensors` (the same weights under mistral-inference names).
pub(crate) fn unindexed_weight_files(names: &[String]) -> Vec<String> {
    if names.iter().any(|n| n == "model.safetensors") {
        return vec!["model.safetensors".to_string()];
    }
    let mut files: Vec<String> = names
        .iter()
        .filter(|n| n.ends_with(".safetensors") && !n.starts_with("consolidated"))
        .cloned()
        .collect();
    files.sort();
    files
}

/// The safetensors files of a folder: those named by `model.safetensors.index.json` when
/// it exists, else [`unindexed_weight_files`].
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.is_file() {
        let shards = index_shards(&index_path)?;
        let missing: Vec<&String> = shards
            .iter()
            .filter(|n| {
                // Followed: a hub cache's shard is a link to a blob that may be missing.
                matches!(std::fs::metadata(dir.join(n)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound)
            })
            .collect();
        if let Some(first) = missing.first() {
            return Err(KwkError::bad_model(
                &index_path,
                format!(
                    "lists shard '{first}', which is not in the folder ({} of {} shards \
                     missing); download the missing shards into '{}' again",
                    missing.len(),
                    shards.len(),
                    dir.display()
                ),
            ));
        }
        return Ok(shards.into_iter().map(|n| dir.join(n)).collect());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| KwkError::io(dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| KwkError::io(dir, e))?;
        if entry.path().is_file() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    let files = unindexed_weight_files(&names);
    if files.is_empty() {
        let has_bin = dir.join("pytorch_model.bin").exists()
            || dir.join("pytorch_model.bin.index.json").exists();
        return Err(KwkError::bad_model(
            dir,
            if has_bin {
                "the folder has PyTorch .bin weights but no *.safetensors; kwk reads safetensors \
                 (convert the checkpoint, or use the hub's safetensors revision)"
            } else {
                "no *.safetensors files in the model folder"
            },
        ));
    }
    Ok(files.into_iter().map(|n| dir.join(n)).collect())
}

/// Reads the weights of a Hugging Face folder (`*.safetensors`, sharded or not) as float32
/// master weights, checking every tensor against `config`.
pub fn load_hf_weights(dir: &Path, config: &ModelConfig) -> Result<(ModelWeights, LoadInfo)> {
    let start = Instant::now();
    let source = SafetensorsSource::open(dir, config.architecture)?;
    let weights = assemble_weights(&source, config)?;
    let mut info = source.load_info();
    info.read_s = start.elapsed().as_secs_f64();
    Ok((weights, info))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::FeedForward;
    use safetensors::tensor::TensorView;

    use kwk_fixtures::model_dir as fixture_dir;

    fn load_fixture(name: &str) -> (ModelConfig, ModelWeights, LoadInfo) {
        let dir = fixture_dir(name);
        let config = ModelConfig::from_hf_config_json(&dir.join("config.json")).unwrap();
        let (w, info) = load_hf_weights(&dir, &config)
            .unwrap_or_else(|e| panic!("loading fixture {name}: {e}"));
        (config, w, info)
    }

    /// A tensor as the safetensors crate's own reader sees it (the independent check).
    fn reference_tensor(dir: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let view = st.tensor(name).unwrap();
        assert_eq!(view.dtype(), Dtype::F32);
        let data = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let shape = view.shape().to_vec();
        (shape, data)
    }

    #[test]
    fn tiny_llama_loads_with_tied_embeddings() {
        let (c, w, info) = load_fixture("tiny-llama");
        assert_eq!(w.layers.len(), c.n_layers);
        assert!(w.lm_head.is_none());
        assert_eq!(w.embed.shape, vec![512, 64]);
        let l1 = &w.layers[1];
        assert_eq!(l1.q.shape, vec![64, 64]);
        assert_eq!(l1.k.shape, vec![32, 64]);
        assert!(l1.q_bias.is_none() && l1.q_norm.is_none());
        let FeedForward::Dense(mlp) = &l1.ffn else {
            panic!("dense expected")
        };
        assert_eq!(mlp.down.shape, vec![64, 160]);
        let dir = fixture_dir("tiny-llama");
        for (name, got) in [
            ("model.embed_tokens.weight", &w.embed.data),
            ("model.layers.1.self_attn.k_proj.weight", &l1.k.data),
            ("model.layers.1.mlp.down_proj.weight", &mlp.down.data),
        ] {
            assert_eq!(&reference_tensor(&dir, name).1, got, "{name}");
        }
        assert_eq!(reference_tensor(&dir, "model.norm.weight").1, w.final_norm);
        assert_eq!(
            info.source_types.get("F32").copied(),
            Some(info.source_types.values().sum())
        );
        assert_eq!(
            info.source_bytes,
            std::fs::metadata(dir.join("model.safetensors"))
                .unwrap()
                .len()
                - 8
                - u64::from_le_bytes(
                    std::fs::read(dir.join("model.safetensors")).unwrap()[..8]
                        .try_into()
                        .unwrap()
                )
        );
    }

    #[test]
    fn tiny_qwen2_loads_biases_and_lm_head() {
        let (_, w, _) = load_fixture("tiny-qwen2");
        let dir = fixture_dir("tiny-qwen2");
        let lm = w.lm_head.as_ref().expect("untied lm_head");
        assert_eq!(reference_tensor(&dir, "lm_head.weight").1, lm.data);
        let l0 = &w.layers[0];
        assert_eq!(
            reference_tensor(&dir, "model.layers.0.self_attn.k_proj.bias").1,
            *l0.k_bias.as_ref().unwrap()
        );
        assert_eq!(l0.v_bias.as_ref().unwrap().len(), 16);
        assert_eq!(l0.q_bias.as_ref().unwrap().len(), 64);
    }

    #[test]
    fn tiny_mixtral_loads_experts() {
        let (c, w, _) = load_fixture("tiny-mixtral");
        let dir = fixture_dir("tiny-mixtral");
        let FeedForward::Moe(moe) = &w.layers[1].ffn else {
            panic!("moe expected")
        };
        assert_eq!(moe.experts.len(), c.n_experts);
        assert_eq!(moe.router.shape, vec![4, 64]);
        assert!(moe.shared_expert.is_none());
        let e2 = &moe.experts[2];
        let base = "model.layers.1.block_sparse_moe.experts.2";
        assert_eq!(
            reference_tensor(&dir, &format!("{base}.w1.weight")).1,
            e2.gate.data
        );
        assert_eq!(
            reference_tensor(&dir, &format!("{base}.w3.weight")).1,
            e2.up.data
        );
        let (shape, down) = reference_tensor(&dir, &format!("{base}.w2.weight"));
        assert_eq!((shape, down), (e2.down.shape.clone(), e2.down.data.clone()));
        assert_eq!(
            reference_tensor(&dir, "model.layers.1.block_sparse_moe.gate.weight").1,
            moe.router.data
        );
    }

    /// Every tensor of a fixture: name → (shape, f32 data).
    fn fixture_tensors(name: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(fixture_dir(name).join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut out: Vec<_> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let data = v
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                (n, v.shape().to_vec(), data)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Writes `tensors` as one safetensors file in `dtype`.
    fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
        let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(n, s, d)| {
                let bytes = match dtype {
                    Dtype::F32 => d.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    Dtype::F16 => d
                        .iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                        .collect(),
                    Dtype::BF16 => d
                        .iter()
                        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                        .collect(),
                    _ => unreachable!(),
                };
                (n.clone(), s.clone(), bytes)
            })
            .collect();
        let views: Vec<(String, TensorView)> = encoded
            .iter()
            .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
            .collect();
        safetensors::tensor::serialize_to_file(views, &None, path).unwrap();
    }

    fn folder_with(tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            fixture_dir("tiny-llama").join("config.json"),
            dir.path().join("config.json"),
        )
        .unwrap();
        write_safetensors(&dir.path().join("model.safetensors"), tensors, dtype);
        dir
    }

    fn tiny_llama_config() -> ModelConfig {
        ModelConfig::from_hf_config_json(&fixture_dir("tiny-llama").join("config.json")).unwrap()
    }

    #[test]
    fn sharded_checkpoint_loads_like_one_file() {
        let tensors = fixture_tensors("tiny-llama");
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = tensors.split_at(tensors.len() / 2);
        write_safetensors(
            &dir.path().join("model-00001-of-00002.safetensors"),
            a,
            Dtype::F32,
        );
        write_safetensors(
            &dir.path().join("model-00002-of-00002.safetensors"),
            b,
            Dtype::F32,
        );
        let mut map = serde_json::Map::new();
        for (n, _, _) in a {
            map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
        }
        for (n, _, _) in b {
            map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let (w, info) = load_hf_weights(dir.path(), &tiny_llama_config()).unwrap();
        let (_, reference, _) = load_fixture("tiny-llama");
        assert_eq!(w.embed, reference.embed);
        assert_eq!(w.layers[1].o, reference.layers[1].o);
        assert_eq!(w.final_norm, reference.final_norm);
        assert_eq!(info.source_types["F32"], tensors.len());
    }

    #[test]
    fn f16_and_bf16_are_converted() {
        let tensors = fixture_tensors("tiny-llama");
        for dtype in [Dtype::F16, Dtype::BF16] {
            let dir = folder_with(&tensors, dtype);
            let (w, info) = load_hf_weights(dir.path(), &tiny_llama_config()).unwrap();
            let embed = &tensors
                .iter()
                .find(|t| t.0 == "model.embed_tokens.weight")
                .unwrap()
                .2;
            for (got, x) in w.embed.data.iter().zip(embed) {
                let want = match dtype {
                    Dtype::F16 => half::f16::from_f32(*x).to_f32(),
                    _ => half::bf16::from_f32(*x).to_f32(),
                };
                assert_eq!(*got, want);
            }
            assert_eq!(info.source_types[&format!("{dtype:?}")], tensors.len());
        }
    }

    #[test]
    fn wrong_shape_names_file_and_tensor() {
        let mut tensors = fixture_tensors("tiny-llama");
        let t = tensors
            .iter_mut()
            .find(|t| t.0 == "model.layers.1.self_attn.k_proj.weight")
            .unwrap();
        t.1 = vec![64, 32]; // transposed: same element count, wrong layout
        let dir = folder_with(&tensors, Dtype::F32);
        let err = load_hf_weights(dir.path(), &tiny_llama_config()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KwkError::BadModel { .. }), "{msg}");
        assert!(
            msg.contains("model.layers.1.self_attn.k_proj.weight"),
            "{msg}"
        );
        assert!(
            msg.contains("model.safetensors") && msg.contains("[32, 64]"),
            "{msg}"
        );
    }

    #[test]
    fn missing_tensor_is_named() {
        let mut tensors = fixture_tensors("tiny-llama");
        tensors.retain(|t| t.0 != "model.layers.0.mlp.up_proj.weight");
        let dir = folder_with(&tensors, Dtype::F32);
        let msg = load_hf_weights(dir.path(), &tiny_llama_config())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("'model.layers.0.mlp.up_proj.weight' is missing"),
            "{msg}"
        );
    }

    #[test]
    fn untied_config_needs_lm_head() {
        let tensors = fixture_tensors("tiny-llama");
        let dir = folder_with(&tensors, Dtype::F32);
        let mut config = tiny_llama_config();
        config.tie_word_embeddings = false;
        let msg = load_hf_weights(dir.path(), &config)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'lm_head.weight' is missing"), "{msg}");
    }

    #[test]
    fn corrupt_and_truncated_files_are_bad_model() {
        let good = std::fs::read(fixture_dir("tiny-llama").join("model.safetensors")).unwrap();
        let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("header length beyond file", {
                let mut b = good.clone();
                b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
                b
            }),
            ("header not json", {
                let mut b = good.clone();
                b[8] = b'#';
                b
            }),
            (
                "truncated inside header",
                good[..8 + header_len / 2].to_vec(),
            ),
            ("truncated data", good[..good.len() - 100].to_vec()),
        ];
        for (what, bytes) in cases {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("model.safetensors");
            std::fs::write(&path, &bytes).unwrap();
            let err = load_hf_weights(dir.path(), &tiny_llama_config()).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, KwkError::BadModel { .. }), "{what}: {msg}");
            assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
        }
    }

    #[test]
    fn model_safetensors_is_preferred_over_other_files() {
        let tensors = fixture_tensors("tiny-llama");
        let dir = folder_with(&tensors, Dtype::F32);
        // Mistral repositories ship consolidated.safetensors beside the HF checkpoint.
        std::fs::write(dir.path().join("consolidated.safetensors"), b"not read").unwrap();
        std::fs::write(dir.path().join("adapter.safetensors"), b"not read").unwrap();
        load_hf_weights(dir.path(), &tiny_llama_config()).unwrap();
    }

    #[test]
    fn folder_without_safetensors_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pytorch_model.bin"), b"x").unwrap();
        let msg = load_hf_weights(dir.path(), &tiny_llama_config())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("no *.safetensors") || msg.contains("PyTorch"),
            "{msg}"
        );
    }
}
