//! This machine's peaks, the ceilings of a roofline: float32 FMA, int8 dot and bf16 dot
//! throughput with the instructions the active kernel tier uses, and the read bandwidth
//! of a buffer larger than the last-level cache and of one that fits in it (the ceiling of
//! a model whose bytes per token the cache holds), all with a given number of threads, in
//! about a second. The SIMD loops live in `roofline/x86_64.rs` (on x86-64 the scalar
//! tier's are SSE2 loops: its kernels are SSE2 code there); the `scalar_*` twins below are
//! plain Rust, the scalar tier's loops elsewhere. How the read loops walk a buffer is a
//! leaf both files read (`read_streams`), so the edges go one way: `mod.rs` -> `x86_64`,
//! both -> `read_streams`. The AMX `tdpbssd` loop stays with the AMX tiles
//! (`kernels::x86_64::amx::tdpbssd_peak`): this module reads the kernels, the kernels know
//! nothing of it.
//!
//! Counting: one fused multiply-add is 2 operations; one byte product added into an
//! accumulator is 2 (so `vpdpbusd` zmm is 128 and `vpmaddubsw`+`vpmaddwd`+`vpaddd` zmm
//! is 128 for three instructions); one `vdpbf16ps` zmm lane does two products and two
//! adds (64 per instruction). Each figure is the best of several timed trials: a peak.

mod read_streams;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

pub use read_streams::{read_part_len, READ_STREAMS};

use crate::kernels::Isa;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Accumulator chains of the scalar twins (as the SIMD loops).
const CHAINS: usize = 12;

/// The measured ceilings (per second, all threads together).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Peaks {
    /// Threads the loops ran on.
    pub threads: usize,
    /// Kernel tier whose instructions were measured (`KWK_ISA` respected).
    pub isa: String,
    /// Float32 multiply-add, GFLOP/s.
    pub fp32_gflops: f64,
    /// Instruction behind `fp32_gflops`.
    pub fp32_instruction: String,
    /// int8 dot (u8 x i8 into i32), GOP/s.
    pub int8_gops: f64,
    /// Instruction(s) behind `int8_gops`.
    pub int8_instruction: String,
    /// bf16 dot (`vdpbf16ps`), GFLOP/s; `None` where the tier converts bf16 to f32 (its
    /// ceiling is then `fp32_gflops`).
    pub bf16_gflops: Option<f64>,
    /// Read bandwidth, GB/s (10^9 bytes): the best of `read_gbps_probes`.
    pub read_gbps: f64,
    /// Every read-bandwidth probe of the run, GB/s: the one taken with the other peaks,
    /// then those the harness adds ([`Peaks::add_read_probe`]: kwk-eval probes before
    /// every speed round and just before and after every repetition).
    /// Their spread is the machine's bandwidth drift during the run.
    #[serde(default)]
    pub read_gbps_probes: Vec<f64>,
    /// Bytes of the buffer the bandwidth was read from.
    pub read_buffer_bytes: usize,
    /// Size of the last-level cache (sysfs: the highest `level` of cpu0's caches), bytes;
    /// `None` when the system does not say.
    #[serde(default)]
    pub llc_bytes: Option<u64>,
    /// Read bandwidth of a buffer half the last-level cache's size (read again and again,
    /// so from the cache), GB/s: the ceiling of a row whose bytes per token fit in it.
    #[serde(default)]
    pub llc_read_gbps: Option<f64>,
    /// How many times the compute loops were measured: once with the read probe, then
    /// once per speed round when the harness measures again ([`Peaks::add_compute_probe`]);
    /// each compute ceiling is the best of them.
    #[serde(default)]
    pub compute_probes: u32,
    /// Wall time the measurement took, seconds.
    pub seconds: f64,
}

impl Peaks {
    /// Records another read-bandwidth probe; the ceiling is the best seen so far.
    pub fn add_read_probe(&mut self, gbps: f64) {
        self.read_gbps_probes.push(gbps);
        self.read_gbps = self.read_gbps.max(gbps);
    }

    /// Measures the compute loops of `isa` (the tier these peaks are for) again and keeps
    /// each ceiling's best: one measurement taken while the host was busy would leave a
    /// ceiling below what the kernels reach later (a run on a shared host measured fp32 at
    /// half its usual rate once, and the rows showed 131 % of it).
    pub fn add_compute_probe(&mut self, isa: Isa) {
        let (fp32, int8, bf16) = compute_rates(isa, self.threads, 3);
        self.fp32_gflops = self.fp32_gflops.max(fp32 / 1e9);
        self.int8_gops = self.int8_gops.max(int8 / 1e9);
        if let (Some(b), Some(new)) = (self.bf16_gflops.as_mut(), bf16) {
            *b = b.max(new / 1e9);
        }
        self.compute_probes += 1;
    }
}

/// Operations per second of the fp32, int8 and (where the tier has it) bf16 loops, each
/// the best of `trials` short trials on `threads` threads.
fn compute_rates(isa: Isa, threads: usize, trials: usize) -> (f64, f64, Option<f64>) {
    let (fp32, int8, bf16, _) = kernels_for(isa);
    let trial = Duration::from_millis(40);
    (
        peak_rate(&fp32, threads, trial, trials),
        peak_rate(&int8, threads, trial, trials),
        bf16.as_ref().map(|k| peak_rate(k, threads, trial, trials)),
    )
}

/// One arithmetic loop: runs `iters` iterations and returns the accumulators' lane sum.
type StreamLoop = fn(u64) -> f64;

/// A measurable loop with its operations per iteration (all chains) and its name.
struct Kernel {
    run: StreamLoop,
    ops_per_iter: f64,
    instruction: &'static str,
}

/// Float32 multiply-add chains in plain Rust (the scalar tier's ceiling); lanes as the
/// SIMD loops: `a += x * y` with x = y = 1.
pub fn scalar_fma(iters: u64) -> f64 {
    let mut a = [0f32; CHAINS];
    let (x, y) = (std::hint::black_box(1f32), std::hint::black_box(1f32));
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v += x * y;
        }
    }
    a.iter().map(|&v| v as f64).sum()
}

/// int8 dot chains in plain Rust: each accumulator adds four u8 x i8 products (3 x 5) of
/// its own operands. The operands are re-read every iteration through an opaque
/// reference: integer sums of loop-invariant products are otherwise folded into one
/// multiplication by `iters` (the loop vanished and the scalar tier reported 10^16 GOP/s).
pub fn scalar_dot(iters: u64) -> f64 {
    let mut a = [0i32; CHAINS];
    let (x, y) = ([[3u8; 4]; CHAINS], [[5i8; 4]; CHAINS]);
    for _ in 0..iters {
        let (x, y) = (std::hint::black_box(&x), std::hint::black_box(&y));
        for (c, v) in a.iter_mut().enumerate() {
            for k in 0..4 {
                *v = v.wrapping_add(x[c][k] as i32 * y[c][k] as i32);
            }
        }
    }
    a.iter().map(|&v| v as f64).sum()
}

/// Reads `data` with scalar loads as [`READ_STREAMS`] streams (`4 *
/// read_part_len(len)` values); returns the xor of everything read.
pub fn scalar_read(data: &[u64]) -> u64 {
    let part = read_part_len(data.len());
    let mut acc = [0u64; 4];
    for i in (0..part).step_by(4) {
        for s in 0..READ_STREAMS {
            let block = &data[s * part + i..s * part + i + 4];
            for k in 0..4 {
                acc[k] ^= block[k];
            }
        }
    }
    acc[0] ^ acc[1] ^ acc[2] ^ acc[3]
}

/// The lane sum every arithmetic loop returns after `iters` iterations, by construction
/// of its operands: per chain and iteration, `lanes` lanes each add `per_lane`.
pub fn expected_sum(iters: u64, lanes: usize, per_lane: f64) -> f64 {
    iters as f64 * (CHAINS * lanes) as f64 * per_lane
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! Safe wrappers: each is only handed out by [`super::kernels_for`] for a tier whose
    //! features [`crate::kernels::isa_supported`] confirmed.
    use super::x86_64 as p;
    macro_rules! wrap {
        ($($name:ident),*) => {$(
            pub fn $name(iters: u64) -> f64 {
                // SAFETY: handed out only for tiers whose features the CPU has.
                unsafe { p::$name(iters) }
            }
        )*};
    }
    wrap!(
        fma_zmm,
        fma_ymm,
        dpbusd_zmm,
        dpbusd_ymm_evex,
        dpbusd_ymm_vex,
        dpbf16_zmm,
        maddubs_zmm,
        maddubs_ymm,
        mul_add_xmm,
        madd_xmm
    );
    pub fn tdpbssd_amx(iters: u64) -> f64 {
        // SAFETY: handed out only for the amx tier, which requires `amx::available()`.
        unsafe { crate::kernels::x86_64::amx::tdpbssd_peak(iters) }
    }
    pub fn read_zmm(d: &[u64]) -> u64 {
        // SAFETY: handed out only for AVX-512 tiers.
        unsafe { p::read_zmm(d) }
    }
    pub fn read_ymm(d: &[u64]) -> u64 {
        // SAFETY: handed out only for AVX2-class tiers.
        unsafe { p::read_ymm(d) }
    }
}

/// A read loop: reads a slice, returns the xor of everything read.
type ReadLoop = fn(&[u64]) -> u64;

/// The (fp32, int8, bf16) loops and the read loop of a tier.
fn kernels_for(isa: Isa) -> (Kernel, Kernel, Option<Kernel>, ReadLoop) {
    let c = CHAINS as f64;
    let scalar = (
        Kernel {
            run: scalar_fma,
            ops_per_iter: c * 2.0,
            instruction: "scalar mul+add",
        },
        Kernel {
            run: scalar_dot,
            ops_per_iter: c * 8.0,
            instruction: "scalar i32 mul+add",
        },
        None::<Kernel>,
        scalar_read as ReadLoop,
    );
    #[cfg(target_arch = "x86_64")]
    {
        let fma512 = Kernel {
            run: simd::fma_zmm,
            ops_per_iter: c * 32.0,
            instruction: "vfmadd231ps zmm",
        };
        let fma256 = Kernel {
            run: simd::fma_ymm,
            ops_per_iter: c * 16.0,
            instruction: "vfmadd231ps ymm",
        };
        match isa {
            Isa::Avx512Vnni { bf16, amx } => (
                fma512,
                if amx {
                    Kernel {
                        run: simd::tdpbssd_amx,
                        ops_per_iter: c * crate::kernels::x86_64::amx::TDP_OPS,
                        instruction: "tdpbssd (amx)",
                    }
                } else {
                    Kernel {
                        run: simd::dpbusd_zmm,
                        ops_per_iter: c * 128.0,
                        instruction: "vpdpbusd zmm",
                    }
                },
                bf16.then_some(Kernel {
                    run: simd::dpbf16_zmm,
                    ops_per_iter: c * 64.0,
                    instruction: "vdpbf16ps zmm",
                }),
                simd::read_zmm,
            ),
            Isa::Avx512Bw => (
                fma512,
                Kernel {
                    run: simd::maddubs_zmm,
                    ops_per_iter: c * 128.0,
                    instruction: "vpmaddubsw+vpmaddwd+vpaddd zmm",
                },
                None,
                simd::read_zmm,
            ),
            Isa::AvxVnni => {
                let vex = std::arch::is_x86_feature_detected!("avxvnni");
                (
                    fma256,
                    Kernel {
                        run: if vex {
                            simd::dpbusd_ymm_vex
                        } else {
                            simd::dpbusd_ymm_evex
                        },
                        ops_per_iter: c * 64.0,
                        instruction: if vex {
                            "vpdpbusd ymm (vex)"
                        } else {
                            "vpdpbusd ymm (evex)"
                        },
                    },
                    None,
                    simd::read_ymm,
                )
            }
            Isa::Avx2 => (
                fma256,
                Kernel {
                    run: simd::maddubs_ymm,
                    ops_per_iter: c * 64.0,
                    instruction: "vpmaddubsw+vpmaddwd+vpaddd ymm",
                },
                None,
                simd::read_ymm,
            ),
            // The scalar tier on x86-64 is SSE2 code: its float kernels compile to
            // `mulps`/`addps` (the plain-Rust loop read 27 GFLOP/s where the C twin's
            // SSE2 loop read 68 on a Zen 3), its quantized block dots are `pmaddwd`.
            Isa::Scalar => (
                Kernel {
                    run: simd::mul_add_xmm,
                    ops_per_iter: c * 8.0,
                    instruction: "mulps+addps xmm (sse2)",
                },
                Kernel {
                    run: simd::madd_xmm,
                    ops_per_iter: c * 16.0,
                    instruction: "pmaddwd+paddd xmm (sse2)",
                },
                None,
                scalar.3,
            ),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        scalar
    }
}

/// Wall time of `threads` threads each running `work(thread index)` from one barrier:
/// from the earliest start to the latest end.
fn timed_parallel<F: Fn(usize) + Sync>(threads: usize, work: F) -> Duration {
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(t);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("peak measurement thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    end - start
}

/// Best rate (operations per second) of `kernel` on `threads` threads: iterations sized
/// for about `trial` per run, `trials` runs.
fn peak_rate(kernel: &Kernel, threads: usize, trial: Duration, trials: usize) -> f64 {
    // Size the trial on one thread's short run.
    let mut iters = 1u64 << 12;
    loop {
        let t = Instant::now();
        std::hint::black_box((kernel.run)(iters));
        let dt = t.elapsed();
        if dt >= trial / 8 || iters >= 1 << 40 {
            iters = ((iters as f64) * trial.as_secs_f64() / dt.as_secs_f64().max(1e-9)) as u64;
            break;
        }
        iters *= 4;
    }
    let iters = iters.max(1);
    (0..trials)
        .map(|_| {
            let dt = timed_parallel(threads, |_| {
                std::hint::black_box((kernel.run)(iters));
            });
            iters as f64 * kernel.ops_per_iter * threads as f64 / dt.as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// A sysfs cache size (`32768K`, `32M`, `512`) in bytes.
fn parse_cache_size(size: &str) -> Option<u64> {
    let size = size.trim();
    let (num, mult) = match size.strip_suffix('K') {
        Some(n) => (n, 1u64 << 10),
        None => match size.strip_suffix('M') {
            Some(n) => (n, 1 << 20),
            None => (size, 1),
        },
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult))
}

/// The last-level cache among `(level, type, size)` entries of one CPU's caches: the
/// largest data or unified cache of the highest level.
fn last_level(caches: &[(u32, String, u64)]) -> Option<u64> {
    caches
        .iter()
        .filter(|(_, ty, _)| ty != "Instruction")
        .max_by_key(|(level, _, size)| (*level, *size))
        .map(|c| c.2)
}

/// The last-level cache's size of cpu0 from `/sys/devices/system/cpu/cpu0/cache/index*/`
/// (`level`, `type`, `size`); `None` when sysfs does not say.
pub fn llc_bytes() -> Option<u64> {
    let caches: Vec<(u32, String, u64)> = (0..16)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
            let level = read("level")?.trim().parse().ok()?;
            let ty = read("type").unwrap_or_default().trim().to_string();
            Some((level, ty, parse_cache_size(&read("size")?)?))
        })
        .collect();
    last_level(&caches).filter(|&b| b > 0)
}

/// Bytes of the bandwidth buffer: at least 256 MiB and eight times the last-level cache
/// this CPU reports (sysfs), so the reads come from memory.
fn read_buffer_bytes() -> usize {
    let llc = llc_bytes().unwrap_or(0) as usize;
    (256usize << 20).max(llc.saturating_mul(8)).min(4 << 30)
}

/// A buffer larger than the caches and the tier's read loop, kept so the read bandwidth can
/// be measured again later in a run (between speed rounds) under the conditions the
/// generation speed met: on a shared machine the bandwidth drifts by tens of percent
/// within minutes, so a ceiling measured once at the start can sit below a rate measured
/// later.
pub struct ReadProbe {
    data: Vec<u64>,
    per_thread: usize,
    threads: usize,
    read: ReadLoop,
}

impl ReadProbe {
    /// A probe of `bytes` (rounded down to the read loops' block) for tier `isa`.
    pub fn new(isa: Isa, threads: usize, bytes: usize) -> Self {
        let threads = threads.max(1);
        // Each thread's slice is a multiple of 32 u64 (the widest loop's block).
        let per_thread = (bytes / 8 / threads / 32 * 32).max(32);
        let data = (0..per_thread * threads)
            .map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        ReadProbe {
            data,
            per_thread,
            threads,
            read: kernels_for(isa).3,
        }
    }

    /// A probe over [`read_buffer_bytes`] for tier `isa`.
    pub fn for_this_machine(isa: Isa, threads: usize) -> Self {
        Self::new(isa, threads, read_buffer_bytes())
    }

    /// Bytes read per trial.
    pub fn bytes(&self) -> usize {
        self.data.len() * 8
    }

    /// Best read bandwidth over `trials` passes, GB/s (10^9 bytes), the buffer split
    /// evenly between the threads.
    pub fn best_gbps(&self, trials: usize) -> f64 {
        let per = self.per_thread;
        (0..trials.max(1))
            .map(|_| {
                let dt = timed_parallel(self.threads, |t| {
                    std::hint::black_box((self.read)(&self.data[t * per..(t + 1) * per]));
                });
                self.bytes() as f64 / dt.as_secs_f64() / 1e9
            })
            .fold(0.0, f64::max)
    }
}

/// Measures the peaks of tier `isa` on `threads` threads (about a second in all).
pub fn measure(isa: Isa, threads: usize) -> Peaks {
    let threads = threads.max(1);
    let started = Instant::now();
    let (fp32, int8, _, _) = kernels_for(isa);
    let (fp32_rate, int8_rate, bf16_rate) = compute_rates(isa, threads, 5);
    let probe = ReadProbe::for_this_machine(isa, threads);
    let read_gbps = probe.best_gbps(5);
    let llc = llc_bytes();
    // Half the cache, so the buffer stays in it beside the other threads' data; the first
    // pass loads it, the best of the others reads from the cache.
    let llc_read_gbps = llc.map(|b| ReadProbe::new(isa, threads, (b / 2) as usize).best_gbps(8));
    Peaks {
        threads,
        isa: isa.name().to_string(),
        fp32_gflops: fp32_rate / 1e9,
        fp32_instruction: fp32.instruction.to_string(),
        int8_gops: int8_rate / 1e9,
        int8_instruction: int8.instruction.to_string(),
        bf16_gflops: bf16_rate.map(|r| r / 1e9),
        read_gbps,
        read_gbps_probes: vec![read_gbps],
        read_buffer_bytes: probe.bytes(),
        llc_bytes: llc,
        llc_read_gbps,
        compute_probes: 1,
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::supported_isas;

    #[test]
    fn the_last_level_cache_is_the_highest_data_or_unified_level() {
        let c = |l: u32, t: &str, s: &str| (l, t.to_string(), parse_cache_size(s).unwrap());
        // A Zen 4: 32K L1d, 32K L1i, 1M L2, 32M L3.
        let zen4 = [
            c(1, "Data", "32K"),
            c(1, "Instruction", "32K"),
            c(2, "Unified", "1024K"),
            c(3, "Unified", "32768K"),
        ];
        assert_eq!(last_level(&zen4), Some(32 << 20));
        // No L3: the L2 is the last level.
        assert_eq!(last_level(&zen4[..3]), Some(1 << 20));
        assert_eq!(last_level(&[c(1, "Instruction", "64K")]), None);
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("x"), None);
    }

    /// The read ceiling is the best probe seen; every probe is kept.
    #[test]
    fn read_probes_keep_the_best() {
        let mut p = measure(Isa::Scalar, 1);
        let first = p.read_gbps;
        assert_eq!(p.read_gbps_probes, vec![first]);
        p.add_read_probe(first / 2.0);
        assert_eq!(p.read_gbps, first);
        p.add_read_probe(first * 3.0);
        assert_eq!(p.read_gbps, first * 3.0);
        assert_eq!(p.read_gbps_probes.len(), 3);
        // A small probe reads every byte it says it reads, at a positive rate.
        let probe = ReadProbe::new(Isa::Scalar, 2, 1 << 20);
        assert_eq!(probe.bytes(), 1 << 20);
        assert!(probe.best_gbps(2) > 0.0);
    }

    #[test]
    fn compute_probes_keep_the_best() {
        let mut p = measure(Isa::Scalar, 1);
        assert_eq!(p.compute_probes, 1);
        let (fp32, int8) = (p.fp32_gflops, p.int8_gops);
        // A ceiling measured while the host was busy is raised by the next probe...
        p.fp32_gflops = 0.0;
        p.int8_gops = 0.0;
        p.add_compute_probe(Isa::Scalar);
        assert!(p.fp32_gflops > 0.0 && p.int8_gops > 0.0);
        assert_eq!(p.compute_probes, 2);
        // ...and a higher one is kept.
        p.fp32_gflops = fp32 * 1e6;
        p.int8_gops = int8 * 1e6;
        p.add_compute_probe(Isa::Scalar);
        assert_eq!((p.fp32_gflops, p.int8_gops), (fp32 * 1e6, int8 * 1e6));
        assert_eq!(p.bf16_gflops, None);
    }

    /// Every loop of every supported tier computes what its operands say (so the
    /// instructions counted are the instructions run), and the read loops read every
    /// element (same xor as the scalar twin).
    #[test]
    fn loops_compute_their_operands() {
        let iters = 1000;
        for isa in supported_isas() {
            let (fp32, int8, bf16, read) = kernels_for(isa);
            let lanes =
                |k: &Kernel, ops_per_lane: f64| k.ops_per_iter / CHAINS as f64 / ops_per_lane;
            // fp32: each lane adds 1*1 per iteration (2 ops per lane).
            assert_eq!(
                (fp32.run)(iters),
                expected_sum(iters, lanes(&fp32, 2.0) as usize, 1.0),
                "{isa:?} fp32"
            );
            // int8: each i32 lane adds four products 3*5 (8 ops per lane).
            assert_eq!(
                (int8.run)(iters),
                expected_sum(iters, lanes(&int8, 8.0) as usize, 60.0),
                "{isa:?} int8"
            );
            if let Some(b) = bf16 {
                // bf16: each f32 lane adds two products 1*1 (4 ops per lane).
                assert_eq!(
                    (b.run)(iters),
                    expected_sum(iters, lanes(&b, 4.0) as usize, 2.0),
                    "{isa:?} bf16"
                );
            }
            let data: Vec<u64> = (0..4096u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 7))
                .collect();
            assert_eq!(read(&data), scalar_read(&data), "{isa:?} read");
            // Every value of the four parts is read once, the leftover tail never.
            let odd = &data[..4096 - 96];
            let part = read_part_len(odd.len());
            assert_eq!(part, 992);
            let want = odd[..4 * part].iter().fold(0, |h, &v| h ^ v);
            assert_eq!(read(odd), want, "{isa:?} read parts");
        }
    }

    #[test]
    fn measure_gives_positive_finite_peaks() {
        for isa in [crate::kernels::active_isa(), Isa::Scalar] {
            let p = measure(isa, 1);
            for v in [p.fp32_gflops, p.int8_gops, p.read_gbps] {
                // One core does well under 10^5 G operations (or GB) per second: a
                // figure above says the compiler removed the loop being timed.
                assert!(v.is_finite() && v > 0.0 && v < 1e5, "{isa:?} {p:?}");
            }
        }
        let p = measure(crate::kernels::active_isa(), 1);
        assert!(
            p.bf16_gflops.is_none_or(|v| v.is_finite() && v > 0.0),
            "{p:?}"
        );
    }
}
