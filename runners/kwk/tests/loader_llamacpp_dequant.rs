//! kwk's GGML block dequantization equals llama.cpp's, bit for bit, on real GGUFs: each
//! SmolLM2-135M GGUF is turned into float32 by `llama-quantize --allow-requantize ... F32`
//! (ggml's own `dequantize_row_*`) and compared with `kwk::format::ggml_blocks` on every
//! tensor. Q4_K_M covers Q4_K, Q5_0, Q6_K and Q8_0 (rows of 576 push most tensors to Q5_0).

use kwk::format::ggml_blocks::{dequantize_parallel, GgmlType};
use kwk::gguf::GgufFile;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn models_dir() -> PathBuf {
    let models = kwk::paths::default_models_dir()
        .expect("none of KWK_MODELS_DIR, KWK_CACHE, XDG_CACHE_HOME, HOME is set");
    models.join("SmolLM2-135M-Instruct")
}

fn llama_quantize() -> PathBuf {
    let dir = match std::env::var_os("KWK_LLAMA_CPP_DIR") {
        Some(d) => PathBuf::from(d),
        None => kwk::paths::cache_root(&kwk::paths::CacheEnv::from_env())
            .expect("none of KWK_CACHE, XDG_CACHE_HOME, HOME is set")
            .join("llama.cpp-0.3.36/build/bin"),
    };
    let bin = dir.join("llama-quantize");
    assert!(
        bin.is_file(),
        "{} is missing: run scripts/setup-llama-cpp.sh (or set KWK_LLAMA_CPP_DIR to its build/bin)",
        bin.display()
    );
    bin
}

/// llama.cpp's float32 version of `gguf`, written into `out_dir`.
fn llama_cpp_f32(gguf: &Path, out_dir: &Path) -> PathBuf {
    let bin = llama_quantize();
    let out = out_dir.join("f32.gguf");
    let lib_dir = bin.parent().unwrap();
    let output = Command::new(&bin)
        .arg("--allow-requantize")
        .arg(gguf)
        .arg(&out)
        .arg("F32")
        .env("LD_LIBRARY_PATH", lib_dir)
        .output()
        .expect("running llama-quantize");
    assert!(
        output.status.success(),
        "llama-quantize failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Every tensor of `quantized` dequantizes to exactly the bits of `reference` (float32).
fn assert_same_values(quantized: &GgufFile, reference: &GgufFile) -> BTreeSet<String> {
    let mut types = BTreeSet::new();
    for t in quantized.tensors() {
        let r = reference
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from llama.cpp's F32 file", t.name));
        assert_eq!(r.ggml_type, GgmlType::F32);
        assert_eq!(r.dims, t.dims, "{}", t.name);
        let mut got = vec![0f32; t.n_elements() as usize];
        dequantize_parallel(t.ggml_type, quantized.tensor_bytes(t).unwrap(), &mut got)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        let want = reference.tensor_bytes(r).unwrap();
        let differing = got
            .iter()
            .zip(want.chunks_exact(4))
            .filter(|(g, w)| g.to_bits() != u32::from_le_bytes((*w).try_into().unwrap()))
            .count();
        assert_eq!(differing, 0, "{} ({}): values differ", t.name, t.ggml_type);
        types.insert(t.ggml_type.name());
    }
    types
}

#[test]
fn smollm2_gguf_blocks_dequantize_like_llama_cpp() {
    let dir = models_dir();
    let mut seen = BTreeSet::new();
    for name in [
        "SmolLM2-135M-Instruct-Q4_K_M.gguf",
        "SmolLM2-135M-Instruct-Q4_0.gguf",
    ] {
        let path = dir.join(name);
        assert!(
            path.is_file(),
            "{} is missing: run scripts/setup-model.sh (or set KWK_MODELS_DIR)",
            path.display()
        );
        let tmp = tempfile::tempdir().unwrap();
        let f32_path = llama_cpp_f32(&path, tmp.path());
        let quantized = GgufFile::open(&path).unwrap();
        let reference = GgufFile::open(&f32_path).unwrap();
        seen.extend(assert_same_values(&quantized, &reference));
    }
    for ty in ["Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0"] {
        assert!(seen.contains(ty), "{ty} not exercised: {seen:?}");
    }
}
