//! Tests of `format::source_grid`: every mapped block type round-trips bit for bit through
//! the layout it is copied into, on random blocks (odd numbers of super-blocks and rows,
//! negative and zero scales and minimums), and what is not exact is not copied.

use super::*;
use crate::decoder::sampling::Rng;
use crate::format::quantized::{quantize_on, source_copy_grid, Grid, QuantizedTensor};
use crate::format::{LowBitOptions, PackedLinear, Precision, TensorPlace, TensorRole};

/// A random byte.
fn byte(rng: &mut Rng) -> u8 {
    (rng.next_u64() >> 56) as u8
}

/// A finite f16 scale: zero, negative, tiny (subnormal) or ordinary.
fn scale(rng: &mut Rng) -> [u8; 2] {
    let v = match rng.next_u64() % 8 {
        0 => f16::ZERO,
        1 => f16::NEG_ZERO,
        2 => f16::from_bits(1 + (rng.next_u64() % 1000) as u16),
        _ => f16::from_f32((rng.next_u64() % 20_000) as f32 * 1e-5 - 0.1),
    };
    v.to_le_bytes()
}

/// `rows` rows of `blocks` random blocks of `ty`, each block's f16 fields made finite.
fn random_blocks(ty: GgmlType, rows: usize, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let size = ty.layout().unwrap().type_size;
    let mut out = Vec::with_capacity(rows * blocks * size);
    for _ in 0..rows * blocks {
        let mut b: Vec<u8> = (0..size).map(|_| byte(rng)).collect();
        // The f16 fields: d (and dmin) first; Q6_K is not mapped.
        b[0..2].copy_from_slice(&scale(rng));
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
            b[2..4].copy_from_slice(&scale(rng));
        }
        if ty == GgmlType::Q8_0 {
            // ggml never writes -128; keep the codes in the layout's range.
            for q in &mut b[2..34] {
                if *q == 0x80 {
                    *q = 0x81;
                }
            }
        }
        out.extend(b);
    }
    out
}

/// The float32 tensor ggml_blocks dequantizes `bytes` to, with its source kept.
fn loaded(ty: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> Tensor {
    let mut data = vec![0f32; rows * cols];
    dequantize(ty, &bytes, &mut data).unwrap();
    Tensor::new(vec![rows, cols], data).with_source(SourceBlocks { ty, bytes })
}

fn dequantized(p: &dyn PackedLinear) -> Vec<f32> {
    let mut out = vec![0f32; p.rows() * p.cols()];
    for (r, row) in out.chunks_exact_mut(p.cols()).enumerate() {
        p.dequantize_row(r, row);
    }
    out
}

fn packed(c: Copied) -> Box<dyn PackedLinear> {
    match c {
        Copied::LowBit(w) => Box::new(w),
        Copied::Int8(w) => Box::new(w),
    }
}

#[test]
fn every_mapped_type_round_trips_bit_for_bit() {
    let mut rng = Rng::from_state(0x9E37_79B9_7F4A_7C15);
    for (ty, block_cols) in [
        (GgmlType::Q4_K, QK_K),
        (GgmlType::Q5_K, QK_K),
        (GgmlType::Q8_0, 32),
        (GgmlType::Q4_0, 32),
        (GgmlType::Q5_0, 32),
    ] {
        // 19 rows: one full row group of 16 and a partial one; 1, 3 and 5 blocks per row.
        for blocks in [1, 3, 5] {
            let (rows, cols) = (19, blocks * block_cols);
            let t = loaded(ty, rows, cols, random_blocks(ty, rows, blocks, &mut rng));
            let (_, layout) = exact_layout_of(&t).expect("a fresh load holds its blocks");
            assert_eq!(Some(layout), exact_layout(ty));
            let p = packed(copy_exact(&t).unwrap());
            assert!(p.layout_name().ends_with(&format!("({ty} copy)")), "{ty}");
            let got = dequantized(p.as_ref());
            for (i, (g, w)) in got.iter().zip(&t.data).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} {blocks} blocks: value {i} is {g}, ggml_blocks gives {w}"
                );
            }
        }
    }
}

#[test]
fn changed_weights_and_unmapped_types_are_not_copied() {
    let mut rng = Rng::from_state(7);
    let bytes = random_blocks(GgmlType::Q4_K, 3, 1, &mut rng);
    let mut t = loaded(GgmlType::Q4_K, 3, 256, bytes);
    assert!(copy_exact(&t).is_some());
    // One value moved by one ulp (as equalization would move many): no longer the grid.
    t.data[5] = f32::from_bits(t.data[5].to_bits() ^ 1);
    assert!(exact_layout_of(&t).is_none() && copy_exact(&t).is_none());
    // Q6_K and Q4_1 have no exact layout; a Q8_0 code of -128 is outside int8's range.
    for ty in [
        GgmlType::Q6_K,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::F16,
    ] {
        assert_eq!(exact_layout(ty), None, "{ty}");
    }
    let mut b = random_blocks(GgmlType::Q8_0, 1, 1, &mut rng);
    b[2 + 17] = 0x80;
    assert!(copy_exact(&loaded(GgmlType::Q8_0, 1, 32, b)).is_none());
    // No source: nothing to copy.
    assert!(copy_exact(&Tensor::new(vec![1, 32], vec![0.0; 32])).is_none());
}

#[test]
fn the_slot_decides_whether_a_source_is_copied() {
    let mut rng = Rng::from_state(11);
    let q4k = loaded(
        GgmlType::Q4_K,
        16,
        256,
        random_blocks(GgmlType::Q4_K, 16, 1, &mut rng),
    );
    let q5_0 = loaded(
        GgmlType::Q5_0,
        16,
        256,
        random_blocks(GgmlType::Q5_0, 16, 8, &mut rng),
    );
    let four = Grid::Asym {
        bits: Bits::B4,
        group: 32,
    };
    let six = Grid::Asym {
        bits: Bits::B6,
        group: 64,
    };
    let three = Grid::Asym {
        bits: Bits::B3,
        group: 32,
    };
    // Q4_K: at its own width and in a wider slot (smaller than the slot, lossless); not
    // in a narrower one.
    assert_eq!(source_copy_grid(&q4k, four), Some(four));
    assert_eq!(source_copy_grid(&q4k, six), Some(four));
    assert_eq!(source_copy_grid(&q4k, three), None);
    // Q5_0 holds only in symmetric int8 blocks: copied into an 8-bit slot, rounded in a
    // 4-bit one.
    assert_eq!(source_copy_grid(&q5_0, Grid::Sym8), Some(Grid::Sym8));
    assert_eq!(source_copy_grid(&q5_0, four), None);
    // Through the packing entry point: the copy in a 6-bit slot is the 4-bit layout.
    let place = TensorPlace {
        role: TensorRole::AttnOutput,
        layer: Some(0),
        n_layers: 1,
        model_params: 1,
        model_width: 256,
    };
    let int4 = Precision::LowBit(LowBitOptions::default());
    match quantize_on(&q4k, &int4, place, Some(six), None).unwrap() {
        QuantizedTensor::LowBit(w) => {
            assert_eq!((w.bits(), w.group_size()), (Bits::B4, 32));
            assert_eq!(w.copied_from(), Some(GgmlType::Q4_K));
            assert_eq!(dequantized(&w), q4k.data);
        }
        QuantizedTensor::Int8(_) => panic!("Q4_K copied into int8 blocks"),
    }
    match quantize_on(&q5_0, &int4, place, Some(four), None).unwrap() {
        QuantizedTensor::LowBit(w) => assert_eq!(w.copied_from(), None),
        QuantizedTensor::Int8(_) => panic!("a 4-bit slot packed int8 blocks"),
    }
}

#[test]
fn the_mix_sees_a_copy_as_its_size_and_no_error() {
    use crate::quantize::mix::{unit_curve, MixUnit};
    let mut rng = Rng::from_state(13);
    let t = loaded(
        GgmlType::Q4_K,
        16,
        512,
        random_blocks(GgmlType::Q4_K, 16, 2, &mut rng),
    );
    let ones = vec![1f32; 512];
    let unit = MixUnit {
        role: TensorRole::AttnOutput,
        layer: Some(0),
        tensors: vec![(&t, &ones[..], None)],
    };
    let ladder = [
        Grid::Asym {
            bits: Bits::B3,
            group: 64,
        },
        Grid::Asym {
            bits: Bits::B4,
            group: 128,
        },
        Grid::Asym {
            bits: Bits::B6,
            group: 64,
        },
    ];
    let curve = unit_curve(&unit, &ladder);
    let copy = Grid::Asym {
        bits: Bits::B4,
        group: 32,
    }
    .tensor_bits(16, 512);
    // 3 bits: rounded, at the slot's size, with an error; 4 and 6 bits: the copy.
    assert_eq!(curve.bits[0], ladder[0].tensor_bits(16, 512));
    assert!(curve.err[0] > 0.0);
    assert_eq!(&curve.bits[1..], &[copy, copy]);
    assert_eq!(&curve.err[1..], &[0.0, 0.0]);
}
