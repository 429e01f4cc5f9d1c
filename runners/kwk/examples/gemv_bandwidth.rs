//! How close the single-token matmul (GEMV) comes to the memory bandwidth: GB/s of the
//! float32 and bf16 panel kernels on one token over a matrix much larger than the caches,
//! next to a plain summing read of the same bytes, interleaved, one thread.
//!
//! `cargo run --release -p kwk --example gemv_bandwidth [-- MIB]`

use kwk::kernels::{self, OutputMatrix};
use std::time::Instant;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("MiB"))
        .unwrap_or(256);
    let cols = 576;
    let rows_f32 = mib * (1 << 20) / 4 / cols / 16 * 16;
    let rows_bf16 = rows_f32 * 2;
    let isa = kernels::active_isa();
    let w: Vec<f32> = (0..rows_f32 * cols)
        .map(|i| (i % 97) as f32 * 1e-3)
        .collect();
    let panels = kernels::pack_f32_panels(&w, rows_f32, cols);
    drop(w);
    let wb: Vec<f32> = (0..rows_bf16 * cols)
        .map(|i| (i % 89) as f32 * 1e-3)
        .collect();
    let (panels_bf16, cp) = kernels::pack_bf16_panels(&wb, rows_bf16, cols);
    drop(wb);
    let x: Vec<f32> = (0..cols).map(|i| i as f32 * 1e-2).collect();
    let mut xb = vec![0u16; cols];
    kernels::f32_to_bf16(isa, &x, &mut xb);
    let mut y = vec![0f32; rows_bf16];
    let bytes = (panels.len() * 4) as f64;
    println!(
        "isa {} matrix {:.0} MiB",
        kernels::isa_in_use(),
        bytes / (1u64 << 20) as f64
    );
    for round in 0..4 {
        let t = Instant::now();
        let s: u64 = panels.iter().map(|v| v.to_bits() as u64).sum();
        let read = bytes / t.elapsed().as_secs_f64() / 1e9;
        let out = OutputMatrix::new(&mut y, 1, rows_f32);
        let t = Instant::now();
        kernels::gemm_f32_panels(isa, &panels, rows_f32, cols, &x, 1, 0..rows_f32, &out);
        let f32_rate = bytes / t.elapsed().as_secs_f64() / 1e9;
        let out = OutputMatrix::new(&mut y, 1, rows_bf16);
        let t = Instant::now();
        kernels::gemm_bf16_panels(isa, &panels_bf16, rows_bf16, cp, &xb, 1, 0..rows_bf16, &out);
        let bf16_rate = (panels_bf16.len() * 2) as f64 / t.elapsed().as_secs_f64() / 1e9;
        if round > 0 {
            println!(
                "read {read:.1} GB/s   gemv f32 {f32_rate:.1} GB/s   gemv bf16 {bf16_rate:.1} GB/s   ({})",
                s % 7
            );
        }
    }
}
