//! int8-weight × int8-activation matmul kernels (the `int8` format and the int4 mix's 8-bit
//! tensors), plus what every quantized kernel shares: the ISA choice for the quantized
//! paths, the view of q8 activation blocks, and the row-group × token-tile driver.
//!
//! Packed layout (made by `format::int8`): rows are interleaved in groups of
//! [`ROW_GROUP`] = 16. For each row group and each 32-column block there is one 512-byte
//! tile: byte `quad * 64 + row * 4 + k` holds column `4 * quad + k` of row `row` as
//! `q + 128` (`q` in -127..=127), so one 64-byte load gives 16 rows × 4 columns, and one
//! broadcast 4-byte activation quad serves all 16 rows: `vpdpbusd` (u8 × i8, four products
//! summed per 32-bit lane) accumulates the 16 row dots in the 16 lanes of one register, and
//! no horizontal sum is ever needed. The +128 offset makes weights the unsigned operand;
//! the dot is corrected by `-128 · Σa`, the activation block sum that the q8 blocks carry
//! (the accumulator starts at that value). One f16 scale per row and block (8.5 bits per
//! weight, the size of llama.cpp's Q8_0).
//!
//! Paths, one per kernel tier ([`crate::kernels::Isa`], [`QuantIsa`]): AMX for prompts of
//! 16 or more tokens on CPUs with AMX-INT8 (the `amx` tier, `x86_64/amx.rs`: the
//! 512-byte tile below is AMX's B-tile layout as it is), AVX512-VNNI (`vpdpbusd` zmm, here), AVX-512BW without VNNI (`x86_64/quant512bw.rs`: `vpmaddubsw` +
//! `vpmaddwd` zmm), 256-bit VNNI and AVX2 (`x86_64/quant256.rs`), and the scalar
//! specification. `vpmaddubsw` would saturate its i16 pair sums on `255 · 127 · 2`, so the
//! paths without VNNI take full bytes through the sign trick (see those files). All paths
//! compute the same exact integer block dots and then the same float operations in the same
//! order (`acc = float(dot) · (d_w · d_a) + acc` per block, rounded once by a fused
//! multiply-add; twice on the scalar tier of x86-64, which has no FMA: [`Rounding`]), so
//! their results agree to the bit with the specification of their rounding; the tests run
//! every path the CPU supports against it. GEMM (prompts): a
//! tile of up to [`TOKEN_TILE`] tokens shares each weight load and each weight preparation
//! (the AVX-512 VNNI tier's low-bit codes take two row groups × [`PAIR_TOKENS`] tokens per
//! call, so each activation broadcast also serves two weight registers);
//! GEMV (one token): the same microkernel with one token, whose independent per-block
//! integer chains the out-of-order core overlaps; it is bound by memory bandwidth. The
//! 256-bit paths, whose registers hold 8 of a group's 16 rows, have a one-token variant that
//! runs both halves in one pass over each tile (`quant256`).
//!
//! ## Prompts without VNNI: integer tiles, not dequantized float tiles
//! The other way to run a prompt on a CPU without `vpdpbusd` is to dequantize a weight tile
//! to f32 once and reuse it over the whole token block. Such a kernel performs the float32
//! panel GEMM's FMAs (one per 16 multiply-adds on zmm, 8 on ymm) plus the dequantization,
//! so the float32 kernel's own rate is its upper bound. The integer tiles match or beat
//! that bound on every tier, so they are the rule. Measured on an AMD Zen 4 (EPYC, 2
//! cores, a tier forced as `KWK_ISA` would; `ISA=<tier> cargo run --release -p kwk
//! --example quant_kernel_bench <format>`: SmolLM2-135M's layer shapes, 512-token prompt
//! tile, one thread, on-CPU time, best of 3 under a load average of 5-8 from other jobs),
//! GMAC/s:
//!
//! | tier | float32 (the bound) | int8 (8-bit codes g64) | int4 (g32) | 6-bit (g64) | 8-bit g32 | symmetric 8-bit (`Int8Tiles`) |
//! |---|---|---|---|---|---|---|
//! | `vnni` | 50.4 | 127.4 | 124.7 | 124.7 | 118.1 | 131.7 |
//! | `avx512bw` | 52.3 | 59.4 | 97.9 | 86.9 | 54.5 | 62.2 |
//! | `avxvnni` (EVEX encoding) | 45.3 | 90.9 | 85.5 | 80.9 | 80.7 | 91.4 |
//! | `avx2` | 41.1 | 42.6 | 64.8 | 54.8 | 41.7 | 43.3 |
//!
//! Full bytes without VNNI cost 4 instructions per 32-bit lane and quad (sign fix,
//! `vpmaddubsw`, `vpmaddwd`, add), as many as the FMAs of the same multiply-adds, so 8-bit
//! weights only tie with float32 there (their gain is the 4x smaller weight reads); 4- and
//! 6-bit codes sum several quads in i16 and need about half. On `avx512bw` and `avx2`,
//! prompts of 8-bit codes instead widen codes and activations to i16 once per call
//! (`vpmaddwd` + `vpaddd` per column pair: the same count, without the sign fix's per-quad
//! weight preparation), measured 1.1-1.2x the byte tiles on a Xeon (`quant512bw.rs`) and
//! 1.05-1.4x on a Zen 5 forced to `avx2` (`quant256.rs`). Splitting full bytes into
//! nibbles (`u = 16 hi + lo`, i16 sums, no sign fix) measured no faster on AVX2 (41 vs 44
//! GMAC/s), nor did 3-token sub-tiles. Nor did cache blocking over tokens (every row group
//! over a chunk of 16-128 tokens before the next chunk, so the chunk's activations stay in
//! L2): on an AMD Zen 3 (AVX2, one thread, 512 tokens) it measured slower, int4 50 -> 37-38
//! and 8-bit codes 35 -> 26-31 GMAC/s, because the weights then stream from L3 once per
//! chunk; row group outer, all tokens inner stays the order. The `avx512bw` tier was measured here by forcing it
//! on Zen 4, not on a Skylake-SP/Cascade Lake, whose ports for 512-bit integer multiplies
//! differ; the same bench there (`ISA=avx512bw`) is the check.

use crate::kernels::int4_matmul::InputMemo;
use crate::kernels::quant_portable::{BaselineDots, WidenedDots};
#[cfg(target_arch = "x86_64")]
use crate::kernels::x86_64::{quant256, quant512bw};
use crate::kernels::OutputMatrix;
use half::f16;
use std::ops::Range;
use std::sync::OnceLock;

/// Whether this build's scalar code lacks a fused multiply-add instruction (x86-64's
/// baseline; `-C target-feature=+fma` adds one): then the scalar tier rounds twice.
const SCALAR_LACKS_FMA: bool = cfg!(all(target_arch = "x86_64", not(target_feature = "fma")));

/// Rows per interleave group (the packed formats' `row_align`).
pub const ROW_GROUP: usize = 16;
/// Columns per quantization block (the q8 activation block).
pub const BLOCK: usize = 32;
/// Bytes of one int8 tile (16 rows × 32 columns).
pub const INT8_TILE_BYTES: usize = ROW_GROUP * BLOCK;
/// Tokens per GEMM microkernel call (the weight tile is loaded once for all of them).
pub const TOKEN_TILE: usize = 8;
/// Fewest tokens for which the `amx` tier runs 8-bit weights on AMX tiles (16 tokens per
/// tile call; the rest of a batch, and smaller batches, take the VNNI tiles).
pub const AMX_MIN_TOKENS: usize = 16;

/// How a path rounds the specification's float steps `acc = a · b + acc` (per block the
/// scale step `a = float(dot)`, `b = d_w · d_a`; for low-bit codes per column group also the
/// minimum's, `a = m`, `b = S`): `Once` is a fused multiply-add, `Twice` a multiply, then an
/// add. Every SIMD tier has FMA and rounds once. The scalar tier on x86-64, whose baseline
/// has no FMA, rounds twice: emulating the fused step exactly (f64 sums with midpoint and
/// range checks) took more of its prompt time than the integer dots did and held int8/int4
/// prompts to 0.6x / 0.4x its own float32 (Zen 5, `quant_kernel_bench`, one thread, 512
/// tokens, fastest of 8, GMAC/s: int8 17.4-18.4 and int4 13.5-15.0 rounding once against
/// 24-30 and 19-28 rounding twice; float32 17-25 in the same minutes). The difference is at
/// most one rounding of the accumulator per step, far below the quantization error. Each
/// path agrees to the bit with the specification run with the path's rounding
/// ([`QuantIsa::rounding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rounding {
    Once,
    Twice,
}

impl Rounding {
    /// `a · b + acc`, rounded as named.
    #[inline(always)]
    pub fn step(self, a: f32, b: f32, acc: f32) -> f32 {
        match self {
            Rounding::Once => a.mul_add(b, acc),
            Rounding::Twice => a * b + acc,
        }
    }
}

/// The path the quantized kernels run on (one per [`crate::kernels::Isa`] tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantIsa {
    Scalar,
    /// AVX2 + FMA + F16C: `vpmaddubsw` + `vpmaddwd` on ymm.
    Avx2,
    /// 256-bit `vpdpbusd`: the AVX-VNNI (VEX) encoding where the CPU has it, else the
    /// AVX512-VNNI + VL (EVEX) encoding of the same instruction (same source code).
    AvxVnni,
    /// AVX-512 F/BW without VNNI: `vpmaddubsw` + `vpmaddwd` on zmm.
    Avx512Bw,
    /// AVX-512 F/BW + VNNI: `vpdpbusd` on zmm.
    Avx512Vnni,
    /// `Avx512Vnni` with AMX-INT8: every quantized matrix in prompts of 16 or more tokens
    /// runs 16 tokens at a time on `tdpbsud` (`x86_64/amx.rs`); everything else as
    /// `Avx512Vnni`.
    Amx,
}

impl QuantIsa {
    /// The tier's name (as `KWK_ISA` spells it, `vnni` aside).
    pub fn name(self) -> &'static str {
        match self {
            QuantIsa::Scalar => "scalar",
            QuantIsa::Avx2 => "avx2",
            QuantIsa::AvxVnni => "avxvnni",
            QuantIsa::Avx512Bw => "avx512bw",
            QuantIsa::Avx512Vnni => "avx512vnni",
            QuantIsa::Amx => "amx",
        }
    }

    /// What reports show: the name, and for `avxvnni` the encoding that runs.
    pub fn label(self) -> &'static str {
        match self {
            QuantIsa::AvxVnni if !avx_vnni_vex() => "avxvnni (evex: avx512vnni+vl)",
            QuantIsa::Amx => "amx (prompts) + avx512vnni (1-token: vpdpbusd ymm)",
            QuantIsa::Avx512Vnni => "avx512vnni (1-token: vpdpbusd ymm)",
            QuantIsa::Avx512Bw => "avx512bw (1-token: avx2 ymm)",
            QuantIsa::Scalar if cfg!(target_arch = "x86_64") => "scalar (sse2 pmaddwd)",
            QuantIsa::Scalar => "scalar (f32 dots)",
            _ => self.name(),
        }
    }

    /// How the path rounds the specification's float steps ([`Rounding`]): twice only on
    /// the scalar tier of an x86-64 build without FMA in its baseline.
    pub const fn rounding(self) -> Rounding {
        match self {
            QuantIsa::Scalar if SCALAR_LACKS_FMA => Rounding::Twice,
            _ => Rounding::Once,
        }
    }

    /// Whether the path takes its block dots as f32 multiply-adds (the scalar tier's
    /// `quant_portable` off x86-64), so its compute ceiling is the fp32 peak, not the int8
    /// one; on x86-64 the scalar tier's dots are SSE2 `pmaddwd`, measured as its int8 peak.
    pub fn dots_in_f32(self) -> bool {
        self == QuantIsa::Scalar && !cfg!(target_arch = "x86_64")
    }

    /// The quantized path of a kernel tier.
    pub fn from_isa(isa: crate::kernels::Isa) -> QuantIsa {
        use crate::kernels::Isa;
        match isa {
            Isa::Scalar => QuantIsa::Scalar,
            Isa::Avx2 => QuantIsa::Avx2,
            Isa::AvxVnni => QuantIsa::AvxVnni,
            Isa::Avx512Bw => QuantIsa::Avx512Bw,
            Isa::Avx512Vnni { amx: true, .. } => QuantIsa::Amx,
            Isa::Avx512Vnni { .. } => QuantIsa::Avx512Vnni,
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        use crate::kernels::{isa_supported, Isa};
        isa_supported(match self {
            QuantIsa::Scalar => Isa::Scalar,
            QuantIsa::Avx2 => Isa::Avx2,
            QuantIsa::AvxVnni => Isa::AvxVnni,
            QuantIsa::Avx512Bw => Isa::Avx512Bw,
            QuantIsa::Avx512Vnni => Isa::Avx512Vnni {
                bf16: false,
                amx: false,
            },
            QuantIsa::Amx => Isa::Avx512Vnni {
                bf16: false,
                amx: true,
            },
        })
    }

    /// Every path this CPU can run (tests compare each with the scalar one).
    pub fn available() -> Vec<QuantIsa> {
        [
            QuantIsa::Scalar,
            QuantIsa::Avx2,
            QuantIsa::AvxVnni,
            QuantIsa::Avx512Bw,
            QuantIsa::Avx512Vnni,
            QuantIsa::Amx,
        ]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
    }

    /// The path of this CPU's best tier.
    pub fn best() -> QuantIsa {
        QuantIsa::from_isa(crate::kernels::best_isa())
    }

    /// Parses a tier name (`KWK_ISA` spelling; `avx512vnni` also accepted for `vnni`).
    pub fn parse(name: &str) -> Option<QuantIsa> {
        Some(match name {
            "scalar" => QuantIsa::Scalar,
            "avx2" => QuantIsa::Avx2,
            "avxvnni" => QuantIsa::AvxVnni,
            "avx512bw" => QuantIsa::Avx512Bw,
            "vnni" | "avx512vnni" => QuantIsa::Avx512Vnni,
            "amx" => QuantIsa::Amx,
            _ => return None,
        })
    }
}

/// The 256-bit kernels that single-token matmuls (generation) run on, two row groups side
/// by side (`drive_row_groups`). The AVX-512 tiers take them too: on a 2-core Intel Xeon
/// (AVX512-VNNI, AVX-VNNI; 2026-12-02, `scripts/run-default.sh` per tier, tg128 t/s) the
/// `avxvnni` tier's paired ymm GEMV ran int8 226 and int4 354 where the `vnni` tier's
/// one-group zmm tile ran 196 and 255, and the `avx512bw` tier's 170 and 271.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairedGemv {
    /// `vpmaddubsw` + `vpmaddwd` on ymm (`quant256::avx2`).
    Avx2,
    /// `vpdpbusd` ymm, VEX encoding (AVX-VNNI).
    VnniVex,
    /// `vpdpbusd` ymm, EVEX encoding (AVX512-VNNI + VL).
    VnniEvex,
}

impl QuantIsa {
    /// The rows a thread's slice of a quantized matrix starts on a multiple of: two row
    /// groups on `amx` (its 2 × 2 kernel takes groups in pairs; with one-group slices the
    /// 192-row k/v projections of SmolLM2-135M ran entirely on the slower 16 × 16 one) and
    /// on `avx512vnni` (its prompt tiles take two groups per call, [`PAIR_TOKENS`]; with
    /// one-group pieces the k/v projections took the one-group tile, 5 % of an int8
    /// pp512 profile) and `avx512bw` (its 8-bit codes' prompts likewise), else one.
    pub fn row_align(self) -> usize {
        match self {
            QuantIsa::Amx | QuantIsa::Avx512Vnni | QuantIsa::Avx512Bw => 2 * ROW_GROUP,
            _ => ROW_GROUP,
        }
    }

    /// The paired GEMV this path's single-token matmuls run on (none on `scalar`).
    pub fn paired_gemv(self) -> Option<PairedGemv> {
        let vnni = || match avx_vnni_vex() {
            true => PairedGemv::VnniVex,
            false => PairedGemv::VnniEvex,
        };
        match self {
            QuantIsa::Scalar => None,
            QuantIsa::Avx2 | QuantIsa::Avx512Bw => Some(PairedGemv::Avx2),
            QuantIsa::AvxVnni | QuantIsa::Avx512Vnni | QuantIsa::Amx => Some(vnni()),
        }
    }
}

/// Whether the `avxvnni` path runs the VEX (AVX-VNNI) encoding (else EVEX).
pub fn avx_vnni_vex() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The quantized kernels' path, chosen once from the crate's tier
/// ([`crate::kernels::active_isa`], which honours `KWK_ISA`).
pub fn selected_isa() -> QuantIsa {
    static ISA: OnceLock<QuantIsa> = OnceLock::new();
    *ISA.get_or_init(|| QuantIsa::from_isa(crate::kernels::active_isa()))
}

/// q8 activation blocks of `n_tokens` rows of `dim` values (see `q8_activations`).
#[derive(Debug, Clone, Copy)]
pub struct Q8Rows<'a> {
    pub quants: &'a [i8],
    pub scales: &'a [f32],
    pub block_sums: &'a [i32],
    pub dim: usize,
    pub n_tokens: usize,
    /// Where the low-bit kernels keep these activations' minimum terms (none: each call
    /// computes them).
    pub memo: Option<&'a InputMemo>,
}

impl Q8Rows<'_> {
    pub fn n_blocks(&self) -> usize {
        self.dim / BLOCK
    }

    /// Panics unless the slices hold `n_tokens` rows (the kernels read them unchecked).
    pub fn check(&self) {
        assert_eq!(
            self.dim % BLOCK,
            0,
            "activation width must be a multiple of 32"
        );
        let nb = self.n_blocks();
        assert!(
            self.quants.len() >= self.n_tokens * self.dim
                && self.scales.len() >= self.n_tokens * nb
                && self.block_sums.len() >= self.n_tokens * nb,
            "q8 activations shorter than {} tokens of {}",
            self.n_tokens,
            self.dim
        );
    }
}

/// A single-token kernel for two row groups read in lock step:
/// `pair(group_a, group_b, out)` fills `out[0]` with group a's rows, `out[1]` with b's.
pub(crate) type GemvPair<'a> = &'a mut dyn FnMut(usize, usize, &mut [[f32; ROW_GROUP]; 2]);

/// Writes row group `g`'s 16 results for token `t` into `y`, cut at row `rows_end` (a
/// matrix's, or a thread's slice's, last row group may be partial).
pub(crate) fn write_group_row(
    y: &OutputMatrix,
    rows_end: usize,
    t: usize,
    g: usize,
    o: &[f32; ROW_GROUP],
) {
    let r0 = g * ROW_GROUP;
    match rows_end - r0 {
        ROW_GROUP.. => y.write_array(t, r0, o),
        width => y.write_cols(t, r0, &o[..width]),
    }
}

/// The row groups `rows` touches, after checking that `rows` starts on a group and that
/// `y` holds `n_tokens` tokens and the rows (what the drivers below require).
fn row_groups_of(rows: &Range<usize>, n_tokens: usize, y: &OutputMatrix) -> Range<usize> {
    assert_eq!(
        rows.start % ROW_GROUP,
        0,
        "row slices must start on a multiple of {ROW_GROUP}"
    );
    assert!(y.n_tokens() >= n_tokens && rows.end <= y.ld());
    rows.start / ROW_GROUP..rows.end.div_ceil(ROW_GROUP)
}

/// Runs `tile(group, first_token, n_tokens, out)` for every row group touched by `rows`
/// and every token tile, and writes the rows of `rows` from `out` (row-major
/// `[token][16]`) into `y`. With one token and a `pair` kernel, the groups are instead
/// cut into two halves walked side by side, `pair(g, g + half)`, so the weights stream
/// from two places at once (an odd last group goes to `tile`): on an AMD Zen 3 one
/// sequential stream per core left a third of the read bandwidth unused.
pub(crate) fn drive_row_groups(
    rows: Range<usize>,
    n_tokens: usize,
    y: &OutputMatrix,
    mut tile: impl FnMut(usize, usize, usize, &mut [[f32; ROW_GROUP]; TOKEN_TILE]),
    pair: Option<GemvPair>,
) {
    let groups = row_groups_of(&rows, n_tokens, y);
    let write = |t: usize, g: usize, o: &[f32; ROW_GROUP]| write_group_row(y, rows.end, t, g, o);
    let mut rest = groups.clone();
    if let (1, Some(pair)) = (n_tokens, pair) {
        let half = groups.len() / 2;
        let mut out = [[0f32; ROW_GROUP]; 2];
        for ga in groups.start..groups.start + half {
            pair(ga, ga + half, &mut out);
            write(0, ga, &out[0]);
            write(0, ga + half, &out[1]);
        }
        rest = groups.start + 2 * half..groups.end;
    }
    let mut out = [[0f32; ROW_GROUP]; TOKEN_TILE];
    for g in rest {
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = (n_tokens - t0).min(TOKEN_TILE);
            tile(g, t0, n, &mut out);
            for (t, o) in out.iter().take(n).enumerate() {
                write(t0 + t, g, o);
            }
            t0 += n;
        }
    }
}

/// Tokens per call of a two-row-group GEMM microkernel (`int4_matmul`'s VNNI byte tiles):
/// 2 groups × 6 tokens hold 12 integer and 12 float accumulators, and every weight load
/// serves 6 tokens, every broadcast activation quad 2 groups. Measured on a Xeon with
/// AVX512-VNNI (a C loop of the block step on L1-resident data, multiply-adds per TSC
/// tick; the float step's bound is about 125): 1 group × 8 tokens 86 (weights held, token
/// by token) to 100-103 (quad by quad), 2 × 4 110, 2 × 6 112, 3 × 4 110-116, 2 × 8 and
/// 3 × 5 89-94 (spills).
pub const PAIR_TOKENS: usize = 6;

/// Runs `tile(first_group, n_groups, first_token, n_tokens, out)` over the row groups of
/// `rows` two at a time (`n_groups` = 2, a last odd group alone with 1) and each pair's
/// tokens [`PAIR_TOKENS`] at a time, and writes the rows of `rows` from `out[j]` (group
/// `first_group + j`, row-major `[token][16]`) into `y`.
pub(crate) fn drive_row_group_pairs(
    rows: Range<usize>,
    n_tokens: usize,
    y: &OutputMatrix,
    mut tile: impl FnMut(usize, usize, usize, usize, &mut [[[f32; ROW_GROUP]; TOKEN_TILE]; 2]),
) {
    let groups = row_groups_of(&rows, n_tokens, y);
    let mut out = [[[0f32; ROW_GROUP]; TOKEN_TILE]; 2];
    let mut g = groups.start;
    while g < groups.end {
        let count = (groups.end - g).min(2);
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = (n_tokens - t0).min(PAIR_TOKENS);
            tile(g, count, t0, n, &mut out);
            for (j, out_j) in out.iter().take(count).enumerate() {
                for (t, o) in out_j.iter().take(n).enumerate() {
                    write_group_row(y, rows.end, t0 + t, g + j, o);
                }
            }
            t0 += n;
        }
        g += count;
    }
}

/// An int8 matrix in the packed layout described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct Int8Tiles<'a> {
    /// `n_groups * n_blocks` tiles of [`INT8_TILE_BYTES`].
    pub qs: &'a [u8],
    /// `scales[(group * n_blocks + block) * 16 + row]`.
    pub scales: &'a [f16],
    pub rows: usize,
    pub cols: usize,
}

impl Int8Tiles<'_> {
    pub fn n_groups(&self) -> usize {
        self.rows.div_ceil(ROW_GROUP)
    }
    pub fn n_blocks(&self) -> usize {
        self.cols / BLOCK
    }
    fn check(&self) {
        assert_eq!(self.cols % BLOCK, 0);
        let tiles = self.n_groups() * self.n_blocks();
        assert!(self.qs.len() >= tiles * INT8_TILE_BYTES && self.scales.len() >= tiles * 16);
    }
}

/// `y[t][r] = W[r] · x[t]` for `r` in `rows` (start a multiple of 16) on path `isa`.
pub fn int8_matmul(isa: QuantIsa, w: &Int8Tiles, x: &Q8Rows, rows: Range<usize>, y: &OutputMatrix) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    assert!(isa.is_available(), "{} path not available", isa.name());
    #[cfg(target_arch = "x86_64")]
    if isa == QuantIsa::Amx && x.n_tokens >= AMX_MIN_TOKENS {
        return x86::int8_matmul_amx(w, x, rows, y);
    }
    #[cfg(target_arch = "x86_64")]
    let vex = avx_vnni_vex();
    #[cfg(target_arch = "x86_64")]
    let paired = isa.paired_gemv();
    #[cfg(target_arch = "x86_64")]
    let mut gemv_pair = |ga: usize, gb: usize, out: &mut [[f32; ROW_GROUP]; 2]| match paired {
        // SAFETY (every arm): `paired_gemv` names a path whose features the tier has; as
        // for the tiles below, for both groups and token 0.
        Some(PairedGemv::Avx2) => unsafe { quant256::avx2::int8_gemv_pair(w, x, ga, gb, 0, out) },
        Some(PairedGemv::VnniVex) => unsafe {
            quant256::avxvnni::int8_gemv_pair(w, x, ga, gb, 0, out)
        },
        Some(PairedGemv::VnniEvex) => unsafe {
            quant256::vnni_evex::int8_gemv_pair(w, x, ga, gb, 0, out)
        },
        None => unreachable!("no paired GEMV on {}", isa.name()),
    };
    #[cfg(target_arch = "x86_64")]
    let pair = paired.map(|_| &mut gemv_pair as GemvPair);
    #[cfg(not(target_arch = "x86_64"))]
    let pair = None;
    let mut widened_dots = (isa == QuantIsa::Scalar).then(|| WidenedDots::<BaselineDots>::new(x));
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| match isa {
            QuantIsa::Scalar => match widened_dots.as_mut() {
                Some(f) => f.int8_tile(w, x, g, t0, n, out),
                None => unreachable!("the scalar tier's state is made above"),
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY (every arm): the path's CPU features were checked above (`avxvnni` runs
            // the VEX encoding only when AVX-VNNI is present, else the EVEX one, which
            // `is_available` then guaranteed); `check` guaranteed the slices cover group `g`,
            // tokens `t0..t0 + n` and every block.
            QuantIsa::Avx2 => unsafe { quant256::avx2::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::AvxVnni if vex => unsafe {
                quant256::avxvnni::int8_tile(w, x, g, t0, n, out)
            },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::AvxVnni => unsafe { quant256::vnni_evex::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512Bw => unsafe { quant512bw::int8_tile(w, x, g, t0, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512Vnni | QuantIsa::Amx => unsafe {
                x86::int8_tile_vnni_dispatch(w, x, g, t0, n, out)
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!(),
        },
        pair,
    );
}

/// Panics unless `x` holds its tokens, is `cols` wide, and `rows` lies within `n_rows`
/// (what every quantized matmul entry checks before its kernels read unchecked).
pub(crate) fn check_operands(x: &Q8Rows, cols: usize, n_rows: usize, rows: &Range<usize>) {
    x.check();
    assert_eq!(
        x.dim, cols,
        "activation width differs from the weight's columns"
    );
    assert!(rows.end <= n_rows);
}

/// [`int8_matmul`] on the specification ([`int8_tile_scalar`], one code at a time) with
/// `rounding`: the reference the tests hold every path to, the scalar tier's included.
pub fn int8_matmul_spec(
    rounding: Rounding,
    w: &Int8Tiles,
    x: &Q8Rows,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    w.check();
    check_operands(x, w.cols, w.rows, &rows);
    drive_row_groups(
        rows,
        x.n_tokens,
        y,
        |g, t0, n, out| int8_tile_scalar(rounding, w, x, g, t0, n, out),
        None,
    );
}

/// The specification: exact integer block dots, then `acc = float(dot) · (d_w · d_a) +
/// acc`, rounded as `rounding` says.
pub fn int8_tile_scalar(
    rounding: Rounding,
    w: &Int8Tiles,
    x: &Q8Rows,
    g: usize,
    t0: usize,
    n: usize,
    out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
) {
    let nb = w.n_blocks();
    for (t, out_t) in out.iter_mut().take(n).enumerate() {
        let tok = t0 + t;
        let mut acc = [0f32; ROW_GROUP];
        for b in 0..nb {
            let tile = &w.qs[(g * nb + b) * INT8_TILE_BYTES..][..INT8_TILE_BYTES];
            let ds = &w.scales[(g * nb + b) * ROW_GROUP..][..ROW_GROUP];
            let a = &x.quants[tok * x.dim + b * BLOCK..][..BLOCK];
            let da = x.scales[tok * nb + b];
            let bs = x.block_sums[tok * nb + b];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let mut dot = -128 * bs;
                for quad in 0..BLOCK / 4 {
                    for k in 0..4 {
                        dot += tile[quad * 64 + r * 4 + k] as i32 * a[quad * 4 + k] as i32;
                    }
                }
                *acc_r = rounding.step(dot as f32, ds[r].to_f32() * da, *acc_r);
            }
        }
        *out_t = acc;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::*;
    use crate::kernels::x86_64::amx::{self, TileOut, AMX_TOKENS, AMX_TOKENS_2X2};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX512F/BW/VNNI present; `w` and `x` checked (`Int8Tiles::check`, `Q8Rows::check`),
    /// `g < w.n_groups()`, `t0 + n <= x.n_tokens`, `1 <= n <= TOKEN_TILE`.
    pub unsafe fn int8_tile_vnni_dispatch(
        w: &Int8Tiles,
        x: &Q8Rows,
        g: usize,
        t0: usize,
        n: usize,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        // SAFETY: forwarded contract.
        unsafe {
            match n {
                1 => int8_tile_vnni::<1>(w, x, g, t0, out),
                2 => int8_tile_vnni::<2>(w, x, g, t0, out),
                3 => int8_tile_vnni::<3>(w, x, g, t0, out),
                4 => int8_tile_vnni::<4>(w, x, g, t0, out),
                5 => int8_tile_vnni::<5>(w, x, g, t0, out),
                6 => int8_tile_vnni::<6>(w, x, g, t0, out),
                7 => int8_tile_vnni::<7>(w, x, g, t0, out),
                8 => int8_tile_vnni::<8>(w, x, g, t0, out),
                _ => unreachable!("token tile of {n}"),
            }
        }
    }

    /// The outputs of the `amx` tier's three kernel sizes.
    pub type Out2x2 = [[[f32; ROW_GROUP]; AMX_TOKENS_2X2]; 2];
    pub type Out16 = [[f32; ROW_GROUP]; AMX_TOKENS];
    pub type Out8 = [[f32; ROW_GROUP]; TOKEN_TILE];

    /// One matrix's kernels for [`drive_amx`].
    pub trait AmxKernels {
        /// Readies row groups `g..g + groups` (1 or 2) before their tiles run.
        fn prepare(&mut self, g: usize, groups: usize);
        /// Groups `g`, `g + 1` × tokens `t0..t0 + 32` (2 × 2 AMX kernel).
        ///
        /// # Safety
        /// As [`amx::tile_2x2`](crate::kernels::x86_64::amx::tile_2x2) for `out`: its
        /// 2 × 32 rows of 16 floats are writable and this thread's alone during the call.
        unsafe fn tile_2x2(&mut self, g: usize, t0: usize, out: &TileOut);
        /// Group `g` (`j`-th of its step) × tokens `t0..t0 + 16` (16 × 16 AMX kernel).
        fn tile16(&mut self, g: usize, j: usize, t0: usize, out: &mut Out16);
        /// Group `g` × tokens `t0..t0 + n`, `n <= 8` (VNNI tile).
        fn tile_vnni(&mut self, g: usize, t0: usize, n: usize, out: &mut Out8);
    }

    /// The `amx` tier's walk over `rows` for `n_tokens` tokens: row groups two at a time
    /// (readied once, so each widening of codes serves the whole prompt), tokens 32 at a
    /// time on the 2 × 2 kernel; then each group's remaining tokens 16 at a time on the
    /// 16 × 16 one and the last `n % 16` on the VNNI tiles (an odd last group takes only
    /// those two). Writes `y`'s columns of `rows`. Loads the tile configuration for the
    /// call (this thread).
    pub fn drive_amx(
        rows: Range<usize>,
        n_tokens: usize,
        y: &OutputMatrix,
        k: &mut impl AmxKernels,
    ) {
        use crate::kernels::x86_64::amx::{self, TileScope};
        assert!(amx::available() && QuantIsa::Avx512Vnni.is_available());
        // SAFETY: AMX is available (asserted); the scope lives for this call, on this thread.
        let _tiles = unsafe { TileScope::int8() };
        let write =
            |t: usize, g: usize, o: &[f32; ROW_GROUP]| write_group_row(y, rows.end, t, g, o);
        let (mut out16, mut out8): (Out16, Out8) = Default::default();
        let groups = rows.start / ROW_GROUP..rows.end.div_ceil(ROW_GROUP);
        let mut g = groups.start;
        while g < groups.end {
            let step = if g + 1 < groups.end { 2 } else { 1 };
            k.prepare(g, step);
            let mut from = 0;
            if step == 2 {
                // Both groups whole in `rows`: the kernel writes into `y` itself. The copy
                // from a buffer here had 6 % of an int8 pp512 profile's samples; in place,
                // the kernel's stores take most of that (their cache misses stay), about
                // 1 % of the total is saved.
                let whole = (g + 2) * ROW_GROUP <= rows.end;
                while from + AMX_TOKENS_2X2 <= n_tokens {
                    if whole {
                        let at = |j: usize| {
                            y.block_ptr(from, AMX_TOKENS_2X2, (g + j) * ROW_GROUP, ROW_GROUP)
                        };
                        let out = TileOut {
                            groups: [at(0), at(1)],
                            ld: y.ld(),
                        };
                        // SAFETY: `block_ptr` checked each group's 32 tokens × 16 columns;
                        // they are in `rows`, which this thread owns in `y`.
                        unsafe { k.tile_2x2(g, from, &out) };
                    } else {
                        // A partial pair (only a matrix's or a slice's last rows): a
                        // buffer, made here so whole pairs never zero one.
                        let mut out2 = Out2x2::default();
                        let [b0, b1] = &mut out2;
                        let out = TileOut {
                            groups: [b0.as_mut_ptr().cast(), b1.as_mut_ptr().cast()],
                            ld: ROW_GROUP,
                        };
                        // SAFETY: `out2` holds each group's 32 rows of 16 floats.
                        unsafe { k.tile_2x2(g, from, &out) };
                        for (j, out_j) in out2.iter().enumerate() {
                            for (t, o) in out_j.iter().enumerate() {
                                write(from + t, g + j, o);
                            }
                        }
                    }
                    from += AMX_TOKENS_2X2;
                }
            }
            for j in 0..step {
                let mut t0 = from;
                while t0 + AMX_TOKENS <= n_tokens {
                    k.tile16(g + j, j, t0, &mut out16);
                    for (t, o) in out16.iter().enumerate() {
                        write(t0 + t, g + j, o);
                    }
                    t0 += AMX_TOKENS;
                }
                while t0 < n_tokens {
                    let n = (n_tokens - t0).min(TOKEN_TILE);
                    k.tile_vnni(g + j, t0, n, &mut out8);
                    for (t, o) in out8.iter().take(n).enumerate() {
                        write(t0 + t, g + j, o);
                    }
                    t0 += n;
                }
            }
            g += step;
        }
    }

    /// [`int8_matmul`] on the `amx` tier ([`drive_amx`]; the tiles are AMX's B layout as
    /// they are, so nothing is readied).
    pub fn int8_matmul_amx(w: &Int8Tiles, x: &Q8Rows, rows: Range<usize>, y: &OutputMatrix) {
        struct Int8Amx<'a> {
            w: &'a Int8Tiles<'a>,
            x: &'a Q8Rows<'a>,
        }
        // SAFETY (every call below): `drive_amx` asserted AMX and the VNNI tier (AVX-512
        // F/BW/VNNI) and holds the tile configuration; the caller checked `w` and `x`; the
        // driver passes groups of `rows` (within the matrix) and tokens below n_tokens.
        impl AmxKernels for Int8Amx<'_> {
            fn prepare(&mut self, _g: usize, _groups: usize) {}
            unsafe fn tile_2x2(&mut self, g: usize, t0: usize, out: &TileOut) {
                let nb = self.w.n_blocks();
                let codes = |j: usize| self.w.qs[(g + j) * nb * INT8_TILE_BYTES..].as_ptr();
                let scales =
                    |j: usize| self.w.scales[(g + j) * nb * ROW_GROUP..].as_ptr() as *const u16;
                let gp = amx::GroupPair {
                    codes: [codes(0), codes(1)],
                    scales: [scales(0), scales(1)],
                    mins: [scales(0), scales(1)],
                };
                // SAFETY: see the impl and the caller's contract for `out`; per-block scales,
                // so ncg = nb and one block a group.
                unsafe { amx::tile_2x2::<true>(&gp, nb, nb, 1, self.x, &[], t0, out) };
            }
            fn tile16(&mut self, g: usize, _j: usize, t0: usize, out: &mut Out16) {
                // SAFETY: see the impl.
                unsafe { amx::int8_tile16(self.w, self.x, g, t0, out) };
            }
            fn tile_vnni(&mut self, g: usize, t0: usize, n: usize, out: &mut Out8) {
                // SAFETY: see the impl.
                unsafe { int8_tile_vnni_dispatch(self.w, self.x, g, t0, n, out) };
            }
        }
        drive_amx(rows, x.n_tokens, y, &mut Int8Amx { w, x });
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn int8_tile_vnni<const N: usize>(
        w: &Int8Tiles,
        x: &Q8Rows,
        g: usize,
        t0: usize,
        out: &mut [[f32; ROW_GROUP]; TOKEN_TILE],
    ) {
        let nb = w.n_blocks();
        let dim = x.dim;
        // SAFETY: every pointer below stays inside the slices `check` validated: tiles and
        // scales of group g (blocks < nb), activations of tokens t0..t0+N (< n_tokens).
        unsafe {
            let qs = w.qs.as_ptr().add(g * nb * INT8_TILE_BYTES);
            let sc = w.scales.as_ptr().add(g * nb * ROW_GROUP) as *const u16;
            let xq = x.quants.as_ptr().add(t0 * dim);
            let xs = x.scales.as_ptr().add(t0 * nb);
            let xbs = x.block_sums.as_ptr().add(t0 * nb);
            let mut acc = [_mm512_setzero_ps(); N];
            for b in 0..nb {
                let tile = qs.add(b * INT8_TILE_BYTES);
                let mut wv = [_mm512_setzero_si512(); 8];
                for (quad, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(tile.add(quad * 64) as *const _);
                }
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(sc.add(b * ROW_GROUP) as *const _));
                for (t, acc_t) in acc.iter_mut().enumerate() {
                    let a = xq.add(t * dim + b * BLOCK) as *const i32;
                    let mut s = _mm512_set1_epi32(-128 * *xbs.add(t * nb + b));
                    for (quad, v) in wv.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(
                            s,
                            *v,
                            _mm512_set1_epi32(a.add(quad).read_unaligned()),
                        );
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xs.add(t * nb + b)));
                    *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *acc_t);
                }
            }
            for (t, acc_t) in acc.iter().enumerate() {
                _mm512_storeu_ps(out[t].as_mut_ptr(), *acc_t);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Shared by the quantized kernels' tests: pseudo-random data, q8 activations, and
    //! the comparisons every path must pass.
    use crate::format::{PackedLinear, PreparedInput};
    use crate::kernels::int4_matmul::InputMemo;
    use crate::kernels::int8_matmul::{QuantIsa, Rounding};
    use crate::kernels::q8_activations::quantize_rows_q8;
    use crate::kernels::OutputMatrix;
    use std::ops::Range;

    pub fn pseudo(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 2.0 * scale
            })
            .collect()
    }

    pub struct Q8 {
        pub quants: Vec<i8>,
        pub scales: Vec<f32>,
        pub sums: Vec<i32>,
        pub dim: usize,
        /// Shared by every call on these activations, as the decoder's is.
        pub memo: InputMemo,
    }

    impl Q8 {
        pub fn new(x: &[f32], dim: usize) -> Q8 {
            let nb = x.len() / 32;
            let mut q = Q8 {
                quants: vec![0; x.len()],
                scales: vec![0.0; nb],
                sums: vec![0; nb],
                dim,
                memo: InputMemo::default(),
            };
            quantize_rows_q8(x, dim, &mut q.quants, &mut q.scales, &mut q.sums);
            q
        }
        pub fn input(&self) -> PreparedInput<'_> {
            PreparedInput::Q8Blocks {
                quants: &self.quants,
                scales: &self.scales,
                block_sums: &self.sums,
                dim: self.dim,
                memo: Some(&self.memo),
            }
        }
        pub fn dequant(&self) -> Vec<f32> {
            self.quants
                .iter()
                .enumerate()
                .map(|(i, &q)| q as f32 * self.scales[i / 32])
                .collect()
        }
    }

    /// Where a test matmul runs: a tier, or the specification with a rounding.
    #[derive(Clone, Copy)]
    pub enum Path {
        Tier(QuantIsa),
        Spec(Rounding),
    }

    /// A matmul on a path.
    pub type MatmulFn<'a> = dyn Fn(Path, &PreparedInput, Range<usize>, &OutputMatrix) + 'a;

    /// Runs `w` on `path` over the row slices `splits` (as threads would) into a fresh output.
    pub fn run(
        w: &MatmulFn,
        path: Path,
        q8: &Q8,
        n_tokens: usize,
        rows: usize,
        splits: &[Range<usize>],
    ) -> Vec<f32> {
        let mut y = vec![f32::NAN; n_tokens * rows];
        let out = OutputMatrix::new(&mut y, n_tokens, rows);
        for r in splits {
            w(path, &q8.input(), r.clone(), &out);
        }
        y
    }

    /// Checks every path, the scalar tier's included, against the specification (bit-exact)
    /// and the specification against float32 math: the result
    /// must be within the sum of the per-product quantization errors
    /// `Σ_i |ŵ_i â_i - w_i x_i|` (plus 1e-5 relative float slack) of `W · x` in f64,
    /// and within 1e-5 relative of `Ŵ · x̂` (the dequantized operands) in f64.
    #[allow(clippy::too_many_arguments)]
    pub fn check_paths(
        packed: &dyn PackedLinear,
        matmul: &MatmulFn,
        w: &[f32],
        rows: usize,
        cols: usize,
        n_tokens: usize,
        seed: u64,
    ) {
        let x = pseudo(n_tokens * cols, seed, 1.0);
        let q8 = Q8::new(&x, cols);
        let xd = q8.dequant();
        let mut wd = vec![0f32; rows * cols];
        for r in 0..rows {
            packed.dequantize_row(r, &mut wd[r * cols..(r + 1) * cols]);
        }
        // Row slices on multiples of 16, as the decoder's thread split makes them.
        let mid = (rows / 2) / 16 * 16;
        let splits = [0..mid, mid..rows];
        let spec = |rounding| run(matmul, Path::Spec(rounding), &q8, n_tokens, rows, &splits);
        let reference = spec(Rounding::Once);
        let twice = spec(Rounding::Twice);
        for isa in QuantIsa::available() {
            let got = run(matmul, Path::Tier(isa), &q8, n_tokens, rows, &splits);
            let want = match isa.rounding() {
                Rounding::Once => &reference,
                Rounding::Twice => &twice,
            };
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} vs the specification rounding {:?} at {i}: {a} vs {b} (rows {rows} cols {cols} tokens {n_tokens})",
                    isa.name(),
                    isa.rounding()
                );
            }
        }
        // Rounding twice differs from once by at most a rounding of the accumulator per
        // step: far inside the float32 bound below, which both must meet.
        for (t, r) in (0..n_tokens).flat_map(|t| (0..rows).map(move |r| (t, r))) {
            let (a, b) = (twice[t * rows + r], reference[t * rows + r]);
            let mag: f64 = (0..cols)
                .map(|c| (wd[r * cols + c] as f64 * xd[t * cols + c] as f64).abs())
                .sum();
            assert!(
                ((a - b) as f64).abs() <= 1e-5 * mag + 1e-6,
                "rounding twice: {a} vs once {b} (t {t} r {r})"
            );
        }
        for t in 0..n_tokens {
            for r in 0..rows {
                let (mut exact, mut deq, mut bound, mut mag) = (0f64, 0f64, 0f64, 0f64);
                for c in 0..cols {
                    let (wv, xv) = (w[r * cols + c] as f64, x[t * cols + c] as f64);
                    let (wq, xq) = (wd[r * cols + c] as f64, xd[t * cols + c] as f64);
                    exact += wv * xv;
                    deq += wq * xq;
                    bound += (wq * xq - wv * xv).abs();
                    mag += (wq * xq).abs();
                }
                let y = reference[t * rows + r] as f64;
                assert!(
                    (y - deq).abs() <= 1e-5 * mag + 1e-6,
                    "dequantized math: {y} vs {deq} (t {t} r {r})"
                );
                assert!(
                    (y - exact).abs() <= bound + 1e-5 * mag + 1e-6,
                    "float32: {y} vs {exact}, bound {bound} (t {t} r {r})"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use crate::format::int8::Int8Weights;
    use crate::format::PackedLinear;
    use crate::model::Tensor;

    #[test]
    fn int8_paths_agree_with_the_specification_and_float32_at_odd_sizes() {
        for &(rows, cols, tokens) in &[
            (1, 32, 1),
            (16, 32, 8),
            (17, 96, 3),
            (37, 160, 9),
            (48, 224, 17),
            // The amx tier's 16-token tiles with tails, partial last row group.
            (37, 96, 33),
            (20, 64, 16),
            (64, 160, 40),
            (48, 96, 70),
            // A pair of row groups whose second is partial, with 32+ tokens: the 2 × 2
            // kernel through its buffer.
            (20, 96, 40),
            (5, 64, 1),
            (33, 96, 5),
            (50, 64, 6),
            (19, 128, 7),
            // One token over several row groups (paired GEMV, odd and partial groups).
            (100, 96, 1),
            (65, 64, 1),
        ] {
            let w = pseudo(rows * cols, rows as u64 * 7 + cols as u64, 0.05);
            let t = Tensor::new(vec![rows, cols], w.clone());
            let packed = Int8Weights::quantize(&t, None, "test").unwrap();
            let f = |path, x: &crate::format::PreparedInput, r, y: &OutputMatrix| match path {
                Path::Tier(isa) => packed.matmul_rows_isa(isa, x, r, y),
                Path::Spec(rounding) => {
                    let x = crate::format::int8::q8_rows(x, y.n_tokens(), "int8");
                    int8_matmul_spec(rounding, &packed.tiles(), &x, r, y)
                }
            };
            check_paths(&packed, &f, &w, rows, cols, tokens, 3);
        }
    }

    #[test]
    fn int8_round_trip_within_half_a_step() {
        let (rows, cols) = (19, 96);
        let w = pseudo(rows * cols, 11, 0.1);
        let packed =
            Int8Weights::quantize(&Tensor::new(vec![rows, cols], w.clone()), None, "test").unwrap();
        assert_eq!(packed.bytes(), 32 * 96 + 2 * 32 * 3); // two row groups (19 rows padded to 32)
        let mut out = vec![0f32; cols];
        for r in 0..rows {
            packed.dequantize_row(r, &mut out);
            for b in 0..cols / 32 {
                let xs = &w[r * cols + b * 32..r * cols + b * 32 + 32];
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                for c in 0..32 {
                    let err = (out[b * 32 + c] - xs[c]).abs();
                    assert!(
                        err <= amax / 127.0 * 0.51,
                        "row {r} col {}: {err}",
                        b * 32 + c
                    );
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let t = Tensor::new(vec![4, 40], vec![0.0; 160]);
        let err = Int8Weights::quantize(&t, None, "AttnQ weight of layer 2")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("AttnQ weight of layer 2") && err.contains("40"),
            "{err}"
        );
    }
}
