//! Tests of the GGUF reader.

use super::test_writer::*;
use super::*;
use crate::format::ggml_blocks::GgmlType;

fn kv(k: &str, v: GgufValue) -> (String, GgufValue) {
    (k.to_string(), v)
}

fn sample_metadata() -> Vec<(String, GgufValue)> {
    vec![
        kv("general.architecture", GgufValue::String("llama".into())),
        kv("general.name", GgufValue::String("tiny test".into())),
        kv("a.u8", GgufValue::U8(200)),
        kv("a.i8", GgufValue::I8(-3)),
        kv("a.u16", GgufValue::U16(65000)),
        kv("a.i16", GgufValue::I16(-30000)),
        kv("a.u32", GgufValue::U32(4_000_000_000)),
        kv("a.i32", GgufValue::I32(-7)),
        kv("a.f32", GgufValue::F32(1.5e-5)),
        kv("a.bool", GgufValue::Bool(true)),
        kv("a.u64", GgufValue::U64(1 << 40)),
        kv("a.i64", GgufValue::I64(-(1 << 40))),
        kv("a.f64", GgufValue::F64(0.125)),
        kv(
            "a.strings",
            GgufValue::Array(GgufArray::String(["<s>", "é"].into_iter().collect())),
        ),
        kv(
            "a.floats",
            GgufValue::Array(GgufArray::F32(vec![-1.0, 2.0])),
        ),
        kv(
            "a.nested",
            GgufValue::Array(GgufArray::Array(vec![GgufArray::I32(vec![1, 2])])),
        ),
    ]
}

fn sample_tensors() -> Vec<TestTensor> {
    vec![
        f32_tensor("w", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        TestTensor {
            name: "q".into(),
            dims: vec![64, 2],
            ggml_type: GgmlType::Q8_0,
            data: (0..4 * 34).map(|i| i as u8).collect(),
        },
        f32_tensor("n", &[5], &[0.5; 5]),
    ]
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn reads_every_value_type_and_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let meta = sample_metadata();
    let bytes = gguf_bytes(&meta, &sample_tensors());
    let path = write(&dir, "ok.gguf", &bytes);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata(), &meta[..]);
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_u32("a.u32").unwrap(), Some(4_000_000_000));
    assert_eq!(f.get_u32("a.u8").unwrap(), Some(200));
    assert!(f.get_u32("a.i32").is_err(), "negative is not a u32");
    assert!(f.get_u32("a.u64").is_err(), "too big for u32");
    assert_eq!(f.get_u64("a.u64").unwrap(), Some(1 << 40));
    assert_eq!(f.get_f32("a.f32").unwrap(), Some(1.5e-5));
    assert_eq!(f.get_f32("a.f64").unwrap(), Some(0.125));
    assert_eq!(f.get_bool("a.bool").unwrap(), Some(true));
    assert_eq!(f.get_u32("missing").unwrap(), None);
    let err = f.get_str("a.u8").unwrap_err().to_string();
    assert!(err.contains("'a.u8'") && err.contains("ok.gguf"), "{err}");
    assert_eq!(
        f.get_string_array("a.strings").unwrap().unwrap(),
        vec!["<s>".to_string(), "é".to_string()]
    );
    assert_eq!(
        f.get_f32_array("a.floats").unwrap().unwrap(),
        vec![-1.0, 2.0]
    );
    assert!(f.get_f32_array("a.strings").is_err());

    assert_eq!(f.tensors().len(), 3);
    let w = f.tensor("w").unwrap();
    assert_eq!(w.dims, vec![3, 2]);
    assert_eq!(w.shape_row_major(), vec![2, 3]);
    let wb = f.tensor_bytes(w).unwrap();
    assert_eq!(wb, &sample_tensors()[0].data[..]);
    let q = f.tensor("q").unwrap();
    assert_eq!(
        (q.ggml_type, q.n_bytes, q.offset),
        (GgmlType::Q8_0, 136, 32)
    );
    assert_eq!(f.tensor_bytes(q).unwrap(), &sample_tensors()[1].data[..]);
    assert_eq!(f.tensor("n").unwrap().offset, 32 + 160);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.file_size(), bytes.len() as u64);

    let s = f.summary();
    assert_eq!(s.architecture.as_deref(), Some("llama"));
    assert_eq!(s.n_params, 6 + 128 + 5);
    assert_eq!(s.tensor_bytes, 24 + 136 + 20);
    assert_eq!(s.type_counts.get("F32"), Some(&2));
    assert_eq!(s.type_counts.get("Q8_0"), Some(&1));
    assert_eq!(s.type_params.get("Q8_0"), Some(&128));
    assert!((s.bits_per_weight - 8.0 * 180.0 / 139.0).abs() < 1e-12);
}

#[test]
fn version_2_reads_like_3() {
    // v2 and v3 share the layout (v3 only allowed big-endian files); v1 used u32 counts.
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = gguf_bytes(&sample_metadata(), &sample_tensors());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::open(&write(&dir, "v2.gguf", &bytes)).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.metadata(), &sample_metadata()[..]);
    assert_eq!(f.tensors().len(), 3);
}

#[test]
fn custom_alignment_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let mut meta = sample_metadata();
    meta.push(kv("general.alignment", GgufValue::U32(64)));
    let path = write(&dir, "a64.gguf", &gguf_bytes(&meta, &sample_tensors()));
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("q").unwrap().offset, 64);
    assert_eq!(
        f.tensor_bytes(f.tensor("n").unwrap()).unwrap(),
        &sample_tensors()[2].data[..]
    );
}

fn open_err(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "bad.gguf", bytes);
    match GgufFile::open(&path) {
        Ok(_) => panic!("opened a bad file"),
        Err(e) => {
            let msg = e.to_string();
            assert!(matches!(e, KwkError::BadModel { .. }), "{msg}");
            assert!(msg.contains("bad.gguf"), "{msg}");
            msg
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = gguf_bytes(&sample_metadata(), &sample_tensors());
    // Every prefix shorter than the end of the last tensor's data fails cleanly.
    let last = bytes.len() - (32 - 20); // "n" has 20 bytes, padded to 32
    for len in 0..last {
        open_err(&bytes[..len]);
    }
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = gguf_bytes(&sample_metadata(), &sample_tensors());
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(open_err(&bytes).contains("version 1"));
    bytes[4..8].copy_from_slice(&(3u32 << 24).to_le_bytes());
    assert!(open_err(&bytes).contains("big-endian"));
    bytes[..4].copy_from_slice(b"GGML");
    assert!(open_err(&bytes).contains("not a GGUF file"));
}

#[test]
fn absurd_counts_and_lengths_are_refused_before_allocating() {
    let good = gguf_bytes(&sample_metadata(), &sample_tensors());
    // tensor count, kv count
    for at in [8usize, 16] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(open_err(&b).contains("count"));
    }
    // first key's length
    let mut b = good.clone();
    b[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(open_err(&b).contains("length"));
    // an array's element count: find "a.floats" and patch its count
    let key = b"a.floats";
    let pos = good.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let mut b = good.clone();
    b[pos + 8..pos + 16].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(open_err(&b).contains("element count"));
}

#[test]
fn arrays_are_stored_compactly_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let meta = vec![
        kv("u8s", GgufValue::Array(GgufArray::U8(vec![7; 1000]))),
        kv(
            "bools",
            GgufValue::Array(GgufArray::Bool(vec![true, false])),
        ),
        kv(
            "strs",
            GgufValue::Array(GgufArray::String(["", "ab", "", "c"].into_iter().collect())),
        ),
    ];
    let f = GgufFile::open(&write(&dir, "c.gguf", &gguf_bytes(&meta, &[]))).unwrap();
    match f.get_array("u8s").unwrap().unwrap() {
        GgufArray::U8(v) => assert_eq!((v.len(), v.capacity()), (1000, 1000)),
        other => panic!("{other:?}"),
    }
    let strs = f.get_array("strs").unwrap().unwrap();
    assert_eq!(strs.len(), 4);
    assert_eq!(strs.get(1), Some(GgufValue::String("ab".into())));
    assert_eq!(strs.get(4), None);
    assert_eq!(
        f.get_string_array("strs").unwrap().unwrap(),
        vec!["", "ab", "", "c"]
    );
    assert_eq!(f.metadata(), &meta[..]);
    // A u8 array is not an array of strings or of floats; an i32 array of u8 works.
    assert!(f
        .get_string_array("u8s")
        .unwrap_err()
        .to_string()
        .contains("'u8s'"));
    assert!(f.get_f32_array("bools").is_err());
    assert_eq!(f.get_i32_array("u8s").unwrap().unwrap().len(), 1000);
}

#[test]
fn arrays_nest_at_most_two_deep() {
    let two = GgufValue::Array(GgufArray::Array(vec![GgufArray::U8(vec![1])]));
    let ok = gguf_bytes(&[kv("two", two)], &[]);
    let dir = tempfile::tempdir().unwrap();
    GgufFile::open(&write(&dir, "two.gguf", &ok)).unwrap();
    let three = GgufValue::Array(GgufArray::Array(vec![GgufArray::Array(vec![
        GgufArray::U8(vec![1]),
    ])]));
    let msg = open_err(&gguf_bytes(&[kv("three", three)], &[]));
    assert!(
        msg.contains("'three' nests arrays more than 2 deep"),
        "{msg}"
    );
}

#[test]
fn a_header_longer_than_the_limit_is_refused() {
    let meta = vec![kv("big", GgufValue::String("x".repeat(5000)))];
    let bytes = gguf_bytes(&meta, &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "big.gguf", &bytes);
    let map = || map_file(&path).unwrap();
    // Within the limit it opens; with a 4 KiB limit the 5000-byte string does not fit.
    GgufFile::parse_limited(&path, map(), 8192).unwrap();
    let msg = GgufFile::parse_limited(&path, map(), 4096)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(
            "length of metadata key 'big' is 5000, more than kwk's header limit of 4096 bytes"
        ),
        "{msg}"
    );
    // A file that merely ends inside the header is truncated, not over the limit.
    let msg = open_err(&bytes[..100]);
    assert!(msg.contains("left in the file"), "{msg}");
}

#[test]
fn bad_tensor_entries_are_named() {
    let meta = vec![kv(
        "general.architecture",
        GgufValue::String("llama".into()),
    )];
    let mut t = sample_tensors();
    t[1].ggml_type = GgmlType(31);
    assert!(open_err(&gguf_bytes(&meta, &t)).contains("'q' has unknown ggml type 31"));
    let mut t = sample_tensors();
    t[1].dims = vec![48, 2]; // not whole Q8_0 blocks
    t[1].data.truncate(3 * 34);
    assert!(open_err(&gguf_bytes(&meta, &t)).contains("'q'"));
    let mut t = sample_tensors();
    t[0].dims = vec![1 << 40, 1 << 40]; // claims far more data than the file has
    assert!(open_err(&gguf_bytes(&meta, &t)).contains("'w'"));
    let mut t = sample_tensors();
    t[2].name = "w".into();
    assert!(open_err(&gguf_bytes(&meta, &t)).contains("appears twice"));
    let mut t = sample_tensors();
    t[0].dims = vec![1, 1, 1, 1, 6];
    assert!(open_err(&gguf_bytes(&meta, &t)).contains("5 dimensions"));
}

#[test]
fn overlapping_or_gapped_tensors_are_refused() {
    let good = gguf_bytes(&sample_metadata(), &sample_tensors());
    // The directory entry of "n": name length 1, "n", 1 dimension, 5, F32, offset.
    let mut entry = 1u64.to_le_bytes().to_vec();
    entry.extend(b"n");
    entry.extend(1u32.to_le_bytes());
    entry.extend(5u64.to_le_bytes());
    entry.extend(0u32.to_le_bytes());
    let at = good.windows(entry.len()).position(|w| w == entry).unwrap() + entry.len();
    assert_eq!(good[at..at + 8], 192u64.to_le_bytes());
    for offset in [0u64, 32, 224] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&offset.to_le_bytes());
        let msg = open_err(&b);
        assert!(
            msg.contains(&format!(
                "tensor 'n' has data offset {offset}, expected 192"
            )),
            "{msg}"
        );
    }
}

#[test]
fn tensor_info_from_another_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "ok.gguf",
        &gguf_bytes(&sample_metadata(), &sample_tensors()),
    );
    let f = GgufFile::open(&path).unwrap();
    let mut foreign = f.tensor("w").unwrap().clone();
    foreign.offset = 1 << 50;
    assert!(f.tensor_bytes(&foreign).is_err());
}

/// Size and bits per weight as llama.cpp reports them for the same files
/// (`llama_model_quantize_impl: quant size = X MiB (Y BPW)` in the set-up logs).
#[test]
fn smollm2_summaries_match_llama_cpp() {
    let dir = crate::format::ggml_blocks::tests::smollm2_dir();
    for (file, mib, bpw) in [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", 92.10, 5.74),
        ("SmolLM2-135M-Instruct-F32.gguf", 513.13, 32.00),
        ("SmolLM2-135M-Instruct-Q4_0.gguf", 85.77, 5.35),
        ("SmolLM2-135M-Instruct-Q4_K_M.gguf", 98.87, 6.17),
    ] {
        let path = dir.join(file);
        if !path.exists() {
            panic!("{} missing: run scripts/setup-model.sh", path.display());
        }
        let s = GgufFile::open(&path).unwrap().summary();
        assert_eq!(s.architecture.as_deref(), Some("llama"));
        assert_eq!(s.n_params, 134_515_008, "{file}");
        let got_mib = s.tensor_bytes as f64 / (1024.0 * 1024.0);
        assert!(
            (got_mib - mib).abs() < 0.006,
            "{file}: {got_mib} MiB vs {mib}"
        );
        assert!(
            (s.bits_per_weight - bpw).abs() < 0.006,
            "{file}: {} BPW",
            s.bits_per_weight
        );
    }
}

#[test]
fn opens_the_fixture_ggufs() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
        let path = kwk_fixtures::model_dir(name).join("model.gguf");
        let f = GgufFile::open(&path).unwrap();
        let s = f.summary();
        assert_eq!(
            s.type_counts.keys().collect::<Vec<_>>(),
            vec!["F32"],
            "{name}"
        );
        assert_eq!(s.tensor_bytes, 4 * s.n_params);
        assert!(
            f.get_string_array("tokenizer.ggml.tokens")
                .unwrap()
                .unwrap()
                .len()
                == 512
        );
    }
}

fn info(name: &str, dims: &[u64], n_bytes: u64) -> GgufTensorInfo {
    GgufTensorInfo {
        name: name.into(),
        dims: dims.to_vec(),
        ggml_type: crate::format::ggml_blocks::GgmlType::F32,
        offset: 0,
        n_bytes,
    }
}

#[test]
fn gguf_bytes_read_per_token() {
    let tensors = [
        info("token_embd.weight", &[8, 10], 320),
        info("output.weight", &[8, 10], 320),
        info("blk.0.attn_q.weight", &[8, 8], 256),
        info("blk.0.ffn_up_exps.weight", &[8, 16, 4], 2048),
    ];
    // One embedding row (32), the output, q, and half of the experts.
    assert_eq!(
        gguf_weight_bytes_per_token(&tensors, 0.5),
        32.0 + 320.0 + 256.0 + 1024.0
    );
    // Without an output tensor the embedding is read whole (it is the output).
    assert_eq!(gguf_weight_bytes_per_token(&tensors[..1], 0.5), 320.0);
}
