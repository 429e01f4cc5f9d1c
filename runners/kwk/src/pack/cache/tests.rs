//! Tests of the pack cache file, identity, folder management and failure handling.

use super::{dir::*, file::*, key::*, session::*, *};
use crate::format::quantized::{quantize_on, Grid, QuantizedTensor};
use crate::format::LowBitOptions;
use crate::format::TensorRole;
use crate::format::{PackedLinear, Precision, TensorPlace};
use crate::kernels::quant::Bits;
use crate::model::Tensor;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

fn int4() -> Precision {
    Precision::LowBit(LowBitOptions {
        bits: Bits::B4,
        group_size: 32,
        mix_bits: None,
        calibrate: false,
        gptq: false,
        act_order: false,
    })
}

fn place(role: TensorRole, layer: Option<usize>) -> TensorPlace {
    TensorPlace {
        role,
        layer,
        n_layers: 2,
        model_params: 1000,
        model_width: 64,
    }
}

fn tensor(rows: usize, cols: usize, seed: usize) -> Tensor {
    Tensor::new(
        vec![rows, cols],
        (0..rows * cols)
            .map(|i| (((i * 31 + seed * 7) % 97) as f32 - 48.0) * 0.001)
            .collect(),
    )
}

fn tensors() -> Vec<(&'static str, Tensor, TensorPlace)> {
    vec![
        (
            "lm_head",
            tensor(40, 64, 1),
            place(TensorRole::LmHead, None),
        ),
        (
            "blk.0.q",
            tensor(17, 64, 2),
            place(TensorRole::AttnQ, Some(0)),
        ),
        (
            "blk.0.down",
            tensor(32, 96, 3),
            place(TensorRole::FfnDown, Some(0)),
        ),
        (
            "blk.1.up",
            tensor(16, 128, 4),
            place(TensorRole::FfnUp, Some(1)),
        ),
    ]
}

/// Packs `ts` for `source` through a session (or loads them); returns the outcome and the
/// dequantized rows of every tensor.
fn pack_all(
    dir: &Path,
    source: &Path,
    p: &Precision,
    ts: &[(&str, Tensor, TensorPlace)],
) -> (PackOutcome, Vec<Vec<f32>>) {
    let rows = |t: &dyn PackedLinear| {
        let mut out = vec![0f32; t.rows() * t.cols()];
        for r in 0..t.rows() {
            t.dequantize_row(r, &mut out[r * t.cols()..(r + 1) * t.cols()]);
        }
        out
    };
    if let Some(mut c) = try_load(dir, source, p, None).unwrap() {
        let out = ts
            .iter()
            .map(|(n, _, _)| rows(c.take_tensor(n).expect("cached tensor").as_ref()))
            .collect();
        assert_eq!(c.take_floats("norm"), Some(vec![1.0, 2.0]));
        return (PackOutcome::Loaded(c.path.clone()), out);
    }
    let mut s = PackSession::open(dir, source, p, None).unwrap();
    let out = ts
        .iter()
        .map(|(n, t, pl)| rows(s.pack(n, t, *pl, None, None, p).unwrap().as_ref()))
        .collect();
    s.put_floats("norm", &[1.0, 2.0]);
    (s.finish(), out)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock") && n != MARKER)
        .collect();
    v.sort();
    v
}

#[test]
fn round_trip_then_corruption_is_detected_and_rewritten_once() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.gguf");
    std::fs::write(&source, b"weights").unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let (o1, first) = pack_all(&cache, &source, &int4(), &ts);
    let PackOutcome::Written(path) = o1 else {
        panic!("{o1:?}")
    };
    let (o2, second) = pack_all(&cache, &source, &int4(), &ts);
    assert_eq!(o2, PackOutcome::Loaded(path.clone()));
    assert_eq!(first, second);
    let good = std::fs::read(&path).unwrap();
    // A bit flipped in a packed array, in the index, and a truncated file: each is
    // detected, deleted and written again by the same run; the next run loads it.
    let index_at = good.len() - TRAILER_LEN - 10;
    for damage in ["array", "index", "truncated"] {
        let mut bytes = good.clone();
        match damage {
            "array" => bytes[HEADER_LEN as usize + 3] ^= 0x10,
            "index" => bytes[index_at] ^= 0x01,
            _ => bytes.truncate(good.len() / 2),
        }
        std::fs::write(&path, &bytes).unwrap();
        let (o, again) = pack_all(&cache, &source, &int4(), &ts);
        assert_eq!(o, PackOutcome::Written(path.clone()), "{damage}");
        assert_eq!(again, first, "{damage}");
        let (o, _) = pack_all(&cache, &source, &int4(), &ts);
        assert_eq!(o, PackOutcome::Loaded(path.clone()), "{damage}");
    }
    assert_eq!(names_in(&cache).len(), 1, "{:?}", names_in(&cache));
}

#[test]
fn one_file_holds_every_format_and_a_touched_source_is_rehashed() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.gguf");
    std::fs::write(&source, b"weights").unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let (a, _) = pack_all(&cache, &source, &int4(), &ts);
    let (b, _) = pack_all(&cache, &source, &Precision::INT8, &ts);
    assert!(matches!(a, PackOutcome::Written(_)) && matches!(b, PackOutcome::Written(_)));
    assert_eq!(names_in(&cache).len(), 1);
    let infos = list(&cache).unwrap();
    assert_eq!(infos[0].formats.len(), 2, "{:?}", infos[0].formats);
    // New mtime, same contents: the hashes match, both formats still load.
    let f = File::options().append(true).open(&source).unwrap();
    f.set_modified(SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    for p in [int4(), Precision::INT8] {
        assert!(matches!(
            pack_all(&cache, &source, &p, &ts).0,
            PackOutcome::Loaded(_)
        ));
    }
    // Another recipe (key) is another section, not a reuse.
    let g64 = Precision::LowBit(LowBitOptions {
        bits: Bits::B4,
        group_size: 64,
        mix_bits: None,
        calibrate: false,
        gptq: false,
        act_order: false,
    });
    assert!(matches!(
        pack_all(&cache, &source, &g64, &ts).0,
        PackOutcome::Written(_)
    ));
    assert_eq!(list(&cache).unwrap()[0].formats.len(), 3);
}

#[test]
fn every_low_bit_width_round_trips_through_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.gguf");
    std::fs::write(&source, b"weights").unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    for (spec, bits) in [("int3", Bits::B3), ("int5", Bits::B5), ("int6", Bits::B6)] {
        let p = Precision::parse(spec).unwrap();
        let (o, packed) = pack_all(&cache, &source, &p, &ts);
        assert!(matches!(o, PackOutcome::Written(_)), "{spec}: {o:?}");
        let (o, loaded) = pack_all(&cache, &source, &p, &ts);
        assert!(matches!(o, PackOutcome::Loaded(_)), "{spec}: {o:?}");
        assert_eq!(packed, loaded, "{spec}");
        // The plain tensors are the width's codes, read back from the file as such.
        let mut c = try_load(&cache, &source, &p, None)
            .unwrap()
            .expect("cached");
        let t = c.take_tensor("blk.0.q").expect("blk.0.q");
        assert!(
            t.layout_name().starts_with(&format!("{}-bit", bits.get())),
            "{spec}: {}",
            t.layout_name()
        );
    }
    assert_eq!(list(&cache).unwrap()[0].formats.len(), 3);
}

#[test]
fn changed_tensor_at_same_size_and_mtime_is_repacked_and_the_rest_reused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.gguf");
    std::fs::write(&source, b"weights v1").unwrap();
    let mtime = std::fs::metadata(&source).unwrap().modified().unwrap();
    let cache = dir.path().join("cache");
    let mut ts = tensors();
    let (o, _) = pack_all(&cache, &source, &int4(), &ts);
    assert!(matches!(o, PackOutcome::Written(_)));
    // Same size, same mtime, other contents (only ctime tells).
    std::fs::write(&source, b"weights v2").unwrap();
    File::options()
        .append(true)
        .open(&source)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    ts[2].1.data[5] += 0.25;
    let (o, got) = pack_all(&cache, &source, &int4(), &ts);
    let PackOutcome::Updated {
        reused, repacked, ..
    } = o
    else {
        panic!("{o:?}")
    };
    assert_eq!((reused, repacked), (3, 1));
    // The same values as packing from scratch.
    let fresh = dir.path().join("fresh");
    assert_eq!(pack_all(&fresh, &source, &int4(), &ts).1, got);
    assert!(matches!(
        pack_all(&cache, &source, &int4(), &ts).0,
        PackOutcome::Loaded(_)
    ));
}

#[test]
fn a_retargeted_symlink_is_another_model() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    std::fs::write(&a, b"model a").unwrap();
    std::fs::write(&b, b"model b").unwrap();
    let link = dir.path().join("model.gguf");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let PackOutcome::Written(pa) = pack_all(&cache, &link, &int4(), &ts).0 else {
        panic!()
    };
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&b, &link).unwrap();
    let o = pack_all(&cache, &link, &int4(), &ts).0;
    let PackOutcome::Written(pb) = o else {
        panic!("{o:?}")
    };
    assert_ne!(pa, pb);
    // A folder whose file is a symlink retargeted in place: the inode changes.
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::os::unix::fs::symlink(&a, folder.join("model.safetensors")).unwrap();
    let before = source_identity(&folder).unwrap();
    std::fs::remove_file(folder.join("model.safetensors")).unwrap();
    std::os::unix::fs::symlink(&b, folder.join("model.safetensors")).unwrap();
    let after = source_identity(&folder).unwrap();
    assert_eq!(before.canonical, after.canonical);
    assert_ne!(before, after);
}

#[test]
fn eviction_under_a_tiny_limit_keeps_the_most_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let mut paths = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let src = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&src, name.as_bytes()).unwrap();
        let PackOutcome::Written(p) = pack_all(&cache, &src, &int4(), &ts).0 else {
            panic!()
        };
        let t = SystemTime::now() - std::time::Duration::from_secs(1000 - 100 * i as u64);
        File::options()
            .append(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
        paths.push(p);
    }
    // Use "a" again: it becomes the most recent.
    let src_a = dir.path().join("a.gguf");
    assert!(matches!(
        pack_all(&cache, &src_a, &int4(), &ts).0,
        PackOutcome::Loaded(_)
    ));
    let one = std::fs::metadata(&paths[0]).unwrap().len();
    let report = prune(&cache, one + one / 2, None).unwrap();
    assert_eq!(report.evicted.len(), 2, "{report:?}");
    assert!(paths[0].exists() && !paths[1].exists() && !paths[2].exists());
    // An orphan (model deleted) and a dead process's temporary file are swept.
    std::fs::remove_file(&src_a).unwrap();
    let tmp = cache.join(format!(
        ".{PREFIX}{}.kwkpack.tmp.4000000000.0",
        "0".repeat(24)
    ));
    std::fs::write(&tmp, b"partial").unwrap();
    let report = prune(&cache, u64::MAX, None).unwrap();
    assert_eq!(report.orphaned, vec![paths[0].clone()]);
    assert_eq!(report.temporary, vec![tmp]);
    assert!(names_in(&cache).is_empty(), "{:?}", names_in(&cache));
    assert_eq!(clear(&cache).unwrap(), 0);
}

#[test]
fn two_concurrent_packers_both_succeed_and_leave_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.gguf");
    std::fs::write(&source, b"weights").unwrap();
    let cache = dir.path().join("cache");
    let results: Vec<(PackOutcome, Vec<Vec<f32>>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| s.spawn(|| pack_all(&cache, &source, &int4(), &tensors())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0].1, results[1].1);
    let written = results
        .iter()
        .filter(|r| matches!(r.0, PackOutcome::Written(_)))
        .count();
    assert!(
        written >= 1,
        "{:?}",
        results.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    assert_eq!(names_in(&cache).len(), 1, "{:?}", names_in(&cache));
    assert!(matches!(
        pack_all(&cache, &source, &int4(), &tensors()).0,
        PackOutcome::Loaded(_)
    ));
}

#[test]
fn a_write_error_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.gguf");
    std::fs::write(&source, b"weights").unwrap();
    let cache = dir.path().join("cache");
    for budget in [10u64, 300, 2000] {
        FAIL_WRITE_AFTER.with(|c| c.set(Some(budget)));
        let (o, got) = pack_all(&cache, &source, &int4(), &tensors());
        FAIL_WRITE_AFTER.with(|c| c.set(None));
        assert!(
            matches!(&o, PackOutcome::NotWritten(why) if why.contains("injected")),
            "{budget}: {o:?}"
        );
        assert_eq!(got.len(), 4);
        assert!(
            names_in(&cache).is_empty(),
            "{budget}: {:?}",
            names_in(&cache)
        );
    }
}

/// Packing a fixed tensor gives fixed bytes. If this fails, a packed layout or the
/// rounding changed: bump `PACK_VERSION` (so old cache files are not reused) and then
/// update the hashes here.
#[test]
fn layout_golden_hash_pins_pack_version() {
    let t = Tensor::new(
        vec![20, 128],
        (0..20 * 128)
            .map(|i| ((i as f32 * 0.37).sin() * 0.05) + if i % 61 == 0 { 0.3 } else { 0.0 })
            .collect(),
    );
    let mut h = Sha256::new();
    let p = place(TensorRole::AttnQ, Some(0));
    for (prec, grid) in [
        (Precision::INT8, None),
        (
            int4(),
            Some(Grid::Asym {
                bits: Bits::B4,
                group: 32,
            }),
        ),
        (
            int4(),
            Some(Grid::Asym {
                bits: Bits::B6,
                group: 64,
            }),
        ),
        (int4(), Some(Grid::Sym8)),
    ] {
        let imp: Vec<f32> = (0..128).map(|i| 1.0 + (i % 7) as f32).collect();
        for importance in [None, Some(&imp[..])] {
            match quantize_on(&t, &prec, p, grid, importance).unwrap() {
                QuantizedTensor::Int8(w) => {
                    h.update(w.codes());
                    h.update(bytemuck::cast_slice(w.scales()));
                }
                QuantizedTensor::LowBit(w) => {
                    let p = w.parts();
                    h.update(p.nibbles);
                    h.update(p.high_bits);
                    h.update(p.scales);
                    h.update(bytemuck::cast_slice(p.mins));
                    h.update(bytemuck::cast_slice(p.super_scales));
                    h.update(bytemuck::cast_slice(p.super_mins));
                }
            }
        }
    }
    let got = hex(&h.finalize()[..16]);
    assert_eq!(
        (PACK_VERSION, got.as_str()),
        (8, "3104cd5f905986170f0d4d387eae164f"),
        "packed bytes changed: bump PACK_VERSION and update this hash"
    );
}

#[test]
fn int4_recipes_read_as_before_and_every_width_has_its_own() {
    // int4's recipe is what it was when its options were `Int4Options`: packs made then
    // are found again.
    assert_eq!(
        recipe_key(&Precision::parse("int4:mix6").unwrap(), None),
        format!(
            "kwk-pack layout v{PACK_VERSION}; format Int4(Int4Options {{ group_size: 32, \
             mix_bits: Some(6), calibrate: false, gptq: false, act_order: false }}); \
             calibration none"
        )
    );
    let keys: Vec<String> = ["int3", "int4", "int5", "int6", "int3:g32", "int5:mix8"]
        .iter()
        .map(|s| recipe_key(&Precision::parse(s).unwrap(), None))
        .collect();
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert!(
        keys[0].contains("bits: 3") && keys[2].contains("bits: 5"),
        "{keys:?}"
    );
}

#[test]
fn a_bpw_recipe_names_its_budget() {
    let key = |s: &str| recipe_key(&Precision::parse(s).unwrap(), None);
    assert_ne!(key("bpw:5"), key("bpw:5.5"));
    assert_ne!(key("bpw:5"), key("bpw:5.01"));
    let tokens = [1u32, 2, 3];
    let calib = Precision::parse("bpw:5:calib").unwrap();
    assert_ne!(recipe_key(&calib, Some(&tokens)), key("bpw:5"));
    assert_ne!(
        recipe_key(&calib, Some(&tokens)),
        recipe_key(&calib, Some(&tokens[..2]))
    );
}

#[test]
fn gptq_recipes_name_the_gptq_settings() {
    let gptq = Precision::parse("int4:gptq").unwrap();
    let calib = Precision::parse("int4:calib").unwrap();
    let tokens = [1u32, 2, 3];
    let k = recipe_key(&gptq, Some(&tokens));
    assert!(k.contains(&crate::quantize::gptq::settings(false)), "{k}");
    assert_ne!(k, recipe_key(&calib, Some(&tokens)));
    assert!(!recipe_key(&calib, Some(&tokens)).contains(&crate::quantize::gptq::settings(false)));
}

#[test]
fn a_tensor_made_by_the_caller_is_written_and_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("model.gguf");
    std::fs::write(&src, b"weights v1").unwrap();
    let cache = dir.path().join("cache");
    let p = int4();
    let t = tensor(32, 64, 1);
    let pl = place(TensorRole::AttnQ, Some(0));
    let made = || quantize_on(&tensor(32, 64, 2), &p, pl, None, None).unwrap();
    let k = tensor(32, 64, 3);
    let kp = place(TensorRole::AttnK, Some(0));
    let mut s = PackSession::open(&cache, &src, &p, None).unwrap();
    s.pack_with(
        TensorToPack {
            name: "q",
            tensor: &t,
            place: pl,
            grid: None,
            importance: None,
            precision: &p,
        },
        Some(made()),
    )
    .unwrap();
    s.pack("k", &k, kp, None, None, &p).unwrap();
    assert!(matches!(s.finish(), PackOutcome::Written(_)));
    // The source changes: the plain tensor with an unchanged key is reused, the made one
    // is written again.
    std::fs::write(&src, b"weights v2").unwrap();
    let mut s = PackSession::open(&cache, &src, &p, None).unwrap();
    s.pack_with(
        TensorToPack {
            name: "q",
            tensor: &t,
            place: pl,
            grid: None,
            importance: None,
            precision: &p,
        },
        Some(made()),
    )
    .unwrap();
    s.pack("k", &k, kp, None, None, &p).unwrap();
    let o = s.finish();
    let PackOutcome::Updated {
        reused, repacked, ..
    } = o
    else {
        panic!("{o:?}")
    };
    assert_eq!((reused, repacked), (1, 1));
}

/// A model held in memory is named by its contents: the name ignores the map's order,
/// changes with any tensor value, and keys a file that round-trips and that the sweep
/// keeps (no file on disk can say such a model is gone).
#[test]
fn a_model_in_memory_is_keyed_by_its_contents() {
    use crate::model::memory::{NamedTensor, NamedTensors, TensorData};
    let a: Vec<f32> = (0..64).map(|i| i as f32 * 0.5).collect();
    let mut b = a.clone();
    let bits: Vec<u16> = (0..8).collect();
    fn named<'a>(x: &'a [f32], bits: &'a [u16]) -> Vec<(String, NamedTensor<'a>)> {
        vec![
            (
                "w".into(),
                NamedTensor {
                    shape: vec![8, 8],
                    data: TensorData::F32(x),
                },
            ),
            (
                "n".into(),
                NamedTensor {
                    shape: vec![8],
                    data: TensorData::Bf16(bits),
                },
            ),
        ]
    }
    let forward: NamedTensors<'_> = named(&a, &bits).into_iter().collect();
    let backward: NamedTensors<'_> = named(&a, &bits).into_iter().rev().collect();
    let name = memory_source("{}", &forward);
    assert!(name.to_str().unwrap().starts_with(MEMORY_SOURCE_PREFIX));
    assert_eq!(name, memory_source("{}", &backward));
    assert_ne!(name, memory_source("{\"x\":1}", &forward));
    b[63] += 1.0;
    let changed: NamedTensors<'_> = named(&b, &bits).into_iter().collect();
    assert_ne!(name, memory_source("{}", &changed));

    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let (o1, first) = pack_all(&cache, &name, &int4(), &ts);
    let PackOutcome::Written(path) = o1 else {
        panic!("{o1:?}")
    };
    let (o2, second) = pack_all(&cache, &name, &int4(), &ts);
    assert_eq!(o2, PackOutcome::Loaded(path.clone()));
    assert_eq!(first, second);
    let report = prune(&cache, u64::MAX, None).unwrap();
    assert!(report.orphaned.is_empty(), "{report:?}");
    assert!(path.exists());
}

/// Packs `ts` for `source` in a fresh session whose folder limit is `limit` bytes.
fn pack_limited(
    dir: &Path,
    source: &Path,
    ts: &[(&str, Tensor, TensorPlace)],
    limit: u64,
) -> PackOutcome {
    pack_limited_as(dir, source, ts, limit, int4())
}

fn pack_limited_as(
    dir: &Path,
    source: &Path,
    ts: &[(&str, Tensor, TensorPlace)],
    limit: u64,
    p: Precision,
) -> PackOutcome {
    let mut s = PackSession::open(dir, source, &p, None).unwrap();
    s.set_limit(limit);
    for (n, t, pl) in ts {
        let packed = s.pack(n, t, *pl, None, None, &p).unwrap();
        assert_eq!(packed.rows(), t.rows());
    }
    s.put_floats("norm", &[1.0, 2.0]);
    s.finish()
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn model(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(format!("{name}.gguf"));
    std::fs::write(&src, name.as_bytes()).unwrap();
    src
}

#[test]
fn the_limit_holds_after_every_pack_and_a_pack_over_it_is_used_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let PackOutcome::Written(a) = pack_limited(&cache, &model(dir.path(), "a"), &ts, u64::MAX)
    else {
        panic!()
    };
    let one = std::fs::metadata(&a).unwrap().len();
    // Room for one pack: writing "b" evicts "a" (least recently used).
    let limit = one + one / 2;
    let PackOutcome::Written(b) = pack_limited(&cache, &model(dir.path(), "b"), &ts, limit) else {
        panic!()
    };
    assert!(!a.exists() && b.exists());
    assert!(folder_bytes(&cache) <= limit, "{}", folder_bytes(&cache));
    // A second format of "b" would make its one file pass the limit: not kept, and the
    // file of the first format stays (loadable).
    let int8 = Precision::Int8(crate::format::Int8Options {
        calibrate: false,
        gptq: false,
    });
    let src_b = dir.path().join("b.gguf");
    let o = pack_limited_as(&cache, &src_b, &ts, limit, int8);
    assert!(
        matches!(&o, PackOutcome::NotKept { path, .. } if *path == b),
        "{o:?}"
    );
    assert!(folder_bytes(&cache) <= limit, "{}", folder_bytes(&cache));
    assert!(try_load(&cache, &src_b, &int4(), None).unwrap().is_some());
    // A pack larger than the whole limit: its tensors are returned, nothing of it is left
    // (no file, no temporary), and the outcome names its size and the limit.
    let small = one / 2;
    let src_c = model(dir.path(), "c");
    match pack_limited(&cache, &src_c, &ts, small) {
        PackOutcome::NotKept { path, bytes, limit } => {
            assert!(!path.exists());
            assert_eq!(limit, small);
            assert!(
                bytes > small && bytes.abs_diff(one) < 64,
                "{bytes} vs {one}"
            );
        }
        o => panic!("{o:?}"),
    }
    // The folder is held to that limit too: "b" went.
    assert!(names_in(&cache).is_empty(), "{:?}", names_in(&cache));
    assert!(folder_bytes(&cache) <= small);
    // The limit lowered below a cached pack: after the hit, the pack goes too (its mapping
    // stays valid for the run).
    assert!(matches!(
        pack_limited(&cache, &src_b, &ts, u64::MAX),
        PackOutcome::Written(p) if p == b
    ));
    assert_eq!(enforce_limit_after_hit(&b, small), Some((one, small)));
    assert!(names_in(&cache).is_empty(), "{:?}", names_in(&cache));
    assert!(folder_bytes(&cache) <= small);
}

#[test]
fn clear_and_prune_touch_only_files_kwk_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let ts = tensors();
    let PackOutcome::Written(a) = pack_all(&cache, &model(dir.path(), "a"), &int4(), &ts).0 else {
        panic!()
    };
    let PackOutcome::Written(b) = pack_all(&cache, &model(dir.path(), "b"), &int4(), &ts).0 else {
        panic!()
    };
    assert!(
        cache.join(MARKER).is_file(),
        "kwk created the folder: it has the marker"
    );
    // "b" under the older naming scheme (HEX.kwkpack), and a user's file of that pattern
    // that is not a pack.
    let old_b = cache.join(
        b.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .strip_prefix(PREFIX)
            .unwrap(),
    );
    std::fs::rename(&b, &old_b).unwrap();
    let hex = "0123456789abcdef01234567";
    let foreign = [
        "Cargo.lock".to_string(),
        "poetry.lock".to_string(),
        ".notes.tmp.999999".to_string(),
        ".x.kwkpack.tmp.4000000000.0".to_string(),
        format!("{hex}.kwkpack"),
        format!(".{hex}.kwkpack.tmp.4000000000.0"),
    ];
    for f in &foreign {
        std::fs::write(cache.join(f), b"the user's").unwrap();
    }
    let dead_new = cache.join(format!(".{PREFIX}{hex}.kwkpack.tmp.4000000000.7"));
    let dead_old = cache.join(format!(".{hex}.kwkpack.tmp.4000000000.8"));
    std::fs::write(&dead_new, b"partial").unwrap();
    std::fs::write(&dead_old, MAGIC).unwrap();
    let r = prune(&cache, u64::MAX, None).unwrap();
    let mut swept = r.temporary.clone();
    swept.sort();
    assert_eq!(swept, vec![dead_old, dead_new], "{r:?}");
    assert!(r.orphaned.is_empty() && r.evicted.is_empty(), "{r:?}");
    // The old-named pack is listed (proven by its magic), the user's look-alike is not.
    let listed: Vec<PathBuf> = list(&cache).unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.contains(&a) && listed.contains(&old_b));
    // Using "b" renames its old file to the new name.
    assert!(matches!(
        pack_all(&cache, &dir.path().join("b.gguf"), &int4(), &ts).0,
        PackOutcome::Loaded(p) if p == b
    ));
    assert!(b.exists() && !old_b.exists());
    std::fs::rename(&b, &old_b).unwrap();
    // Clearing deletes both packs and their locks, and nothing else.
    assert_eq!(clear(&cache).unwrap(), 2);
    let mut left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != MARKER)
        .collect();
    let mut want = foreign.to_vec();
    want.sort();
    left.sort();
    assert_eq!(
        left, want,
        "the packs and their locks are gone, the rest is left"
    );
    for f in &foreign {
        assert_eq!(std::fs::read(cache.join(f)).unwrap(), b"the user's", "{f}");
    }
}

#[test]
fn clear_refuses_a_folder_kwk_did_not_create() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("project");
    std::fs::create_dir(&cache).unwrap();
    std::fs::write(cache.join("Cargo.lock"), b"[[package]]").unwrap();
    let PackOutcome::Written(a) = pack_all(&cache, &model(dir.path(), "a"), &int4(), &tensors()).0
    else {
        panic!()
    };
    assert!(!cache.join(MARKER).exists(), "not kwk's folder: no marker");
    let e = clear(&cache).unwrap_err().to_string();
    assert!(
        e.contains("is not a folder kwk created (no KWK-PACK-CACHE file)")
            && e.contains("Cargo.lock")
            && e.contains("nothing deleted"),
        "{e}"
    );
    assert!(a.exists() && cache.join("Cargo.lock").exists());
    // A folder of kwk's files only (e.g. written by an older kwk) is cleared.
    std::fs::remove_file(cache.join("Cargo.lock")).unwrap();
    assert_eq!(clear(&cache).unwrap(), 1);
    assert!(!a.exists());
}
