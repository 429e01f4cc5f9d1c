//! Prints this machine's roofline peaks as kwk measures them (`roofline`), for the
//! active tier (`KWK_ISA` respected): compare with `scripts/peaks-microbench.sh`, the
//! standalone C twin.
//!
//! `cargo run --release -p kwk --example peaks [-- THREADS]`

fn main() {
    let threads: usize = match std::env::args().nth(1) {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        Some(a) => match a.parse() {
            Ok(n) if (1..=1024).contains(&n) => n,
            _ => {
                eprintln!("error: THREADS must be a whole number from 1 to 1024, got {a:?}");
                std::process::exit(2);
            }
        },
    };
    let p = kwk::roofline::measure(kwk::kernels::active_isa(), threads);
    println!("tier {} threads {} ({:.2} s)", p.isa, p.threads, p.seconds);
    println!("fp32 {:.1} GFLOP/s ({})", p.fp32_gflops, p.fp32_instruction);
    println!("int8 {:.1} GOP/s ({})", p.int8_gops, p.int8_instruction);
    match p.bf16_gflops {
        Some(b) => println!("bf16 {b:.1} GFLOP/s (vdpbf16ps zmm)"),
        None => println!("bf16 - (converted to f32 on this tier)"),
    }
    println!(
        "read {:.1} GB/s ({} MiB buffer)",
        p.read_gbps,
        p.read_buffer_bytes >> 20
    );
}
