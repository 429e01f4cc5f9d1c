//! What every quantized tier shares above the kernels: the tier choice ([`QuantIsa`],
//! [`selected_isa`]) and how each rounds ([`Rounding`]), the view of q8 activation blocks
//! ([`Q8Rows`]) and what is derived from them once per prepared input ([`InputMemo`]: the
//! low-bit minimum terms, i16 activations), the blocking (row group × token tile,
//! `drive_row_groups`; two row groups × [`PAIR_TOKENS`], `drive_row_group_pairs`; the
//! single-token paired GEMV) and the operand checks. Tiers call into this; it calls no
//! tier (`quant/mod.rs` dispatches).

use super::layout::{BLOCK, ROW_GROUP};
use crate::kernels::{OutputMatrix, GEMV_PREFETCH_BYTES};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Whether this build's scalar code lacks a fused multiply-add instruction (x86-64's
/// baseline; `-C target-feature=+fma` adds one): then the scalar tier rounds twice.
const SCALAR_LACKS_FMA: bool = cfg!(all(target_arch = "x86_64", not(target_feature = "fma")));

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
    /// `Avx512Vnni` with AMX: every quantized matrix in prompts of 16 or more tokens runs
    /// on AMX tiles (`amx/`): bf16 tiles (`tdpbf16ps`, weights and activations rounded to
    /// bf16, `amx/bf16.rs`) where the CPU has AMX-BF16, else int8 tiles (`tdpbsud` on the
    /// q8 activations, to the bit as the specification); everything else as `Avx512Vnni`.
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
            QuantIsa::Amx if crate::kernels::amx_bf16_available() => {
                "amx bf16 tiles (prompts) + avx512vnni (1-token: vpdpbusd ymm)"
            }
            QuantIsa::Amx => "amx int8 tiles (prompts) + avx512vnni (1-token: vpdpbusd ymm)",
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
    /// `scalar/` off x86-64), so its compute ceiling is the fp32 peak, not the int8
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
    /// `vpmaddubsw` + `vpmaddwd` on ymm (`avx2.rs`).
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

/// Tokens per AMX tile (the rows of an A tile of [`Bf16Tiles`]).
pub const TILE_TOKENS: usize = 16;
/// Tokens per AMX-BF16 kernel call (two A tiles); [`Bf16Tiles`] are padded to a multiple.
pub const TOKEN_STEP: usize = 2 * TILE_TOKENS;

/// Tokens the bf16 token tiles of `n_tokens` tokens hold (zero rows past `n_tokens`).
pub fn padded_tokens(n_tokens: usize) -> usize {
    n_tokens.next_multiple_of(TOKEN_STEP)
}

/// Activations in bf16 AMX token tiles (`amx/bf16.rs`'s layout: token tile × 32-column
/// block, 1 KiB each, token-major): `data` holds at least `padded_tokens(n_tokens) · dim`
/// values, `dim` a multiple of 32.
#[derive(Debug, Clone, Copy)]
pub struct Bf16Tiles<'a> {
    pub data: &'a [u16],
    pub dim: usize,
    pub n_tokens: usize,
}

impl Bf16Tiles<'_> {
    /// Panics unless the tiles fit a matrix of `cols` columns.
    pub fn check(&self, cols: usize) {
        assert!(
            self.dim == cols
                && cols.is_multiple_of(BLOCK)
                && self.data.len() >= padded_tokens(self.n_tokens) * cols,
            "bf16 tiles: {} values for {} tokens of {} (matrix width {cols})",
            self.data.len(),
            self.n_tokens,
            self.dim
        );
    }
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

/// Where one tile call works: row group `g`, tokens `t0..t0 + n` (`1 <= n <=
/// TOKEN_TILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileAt {
    pub g: usize,
    pub t0: usize,
    pub n: usize,
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

/// Tokens per call of a two-row-group GEMM microkernel (`avx512vnni.rs`'s byte tiles):
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

/// `S[t][cg] = Σ_{b in cg} d_a[t][b] · blocksum[t][b]` for tokens `t0..t0 + n` (each sum
/// from 0 in block order). A prompt's matmuls read it through [`InputMemo`], so each
/// prepared input computes it once per group size: recomputed by each of a matrix's ~16
/// claimed row pieces it took about 4 % of an int8 pp512 profile on an Intel Xeon.
pub(crate) fn min_terms(
    x: &Q8Rows,
    t0: usize,
    n: usize,
    group_size: usize,
    n_col_groups: usize,
) -> Vec<f32> {
    let nb = x.n_blocks();
    let bpg = group_size / BLOCK;
    let mut s = vec![0f32; n * n_col_groups];
    for (t, s_t) in s.chunks_exact_mut(n_col_groups).enumerate() {
        let row = (t0 + t) * nb;
        let (da, bs) = (&x.scales[row..row + nb], &x.block_sums[row..row + nb]);
        if bpg == 1 {
            // One block a group (g32, the int4 mix's default): a plain vector map.
            for ((s_cg, &d), &sum) in s_t.iter_mut().zip(da).zip(bs) {
                *s_cg += d * sum as f32;
            }
            continue;
        }
        for ((s_cg, d_g), b_g) in s_t.iter_mut().zip(da.chunks(bpg)).zip(bs.chunks(bpg)) {
            for (&d, &sum) in d_g.iter().zip(b_g) {
                *s_cg += d * sum as f32;
            }
        }
    }
    s
}

/// What the quantized kernels derive from one prepared q8 input, kept so that every row
/// piece of every matrix reading the input shares one computation: its minimum terms per
/// (group size, token count), and (the `avx512bw` tier's 8-bit prompts) its quants widened
/// to i16. The owner of the activations clears it whenever it encodes new ones
/// ([`InputMemo::clear`]).
#[derive(Default, Debug)]
pub struct InputMemo {
    pub(super) min_terms: Mutex<Vec<MemoEntry>>,
    /// (token count, `quants` as i16).
    acts_i16: Mutex<Option<(usize, Arc<[i16]>)>>,
}

/// (group size, tokens, `S` of every token).
type MemoEntry = (usize, usize, Arc<[f32]>);

impl InputMemo {
    /// Forgets every entry (the activations they were computed from changed).
    pub fn clear(&mut self) {
        self.min_terms
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        *self
            .acts_i16
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Every token's minimum terms for groups of `group_size`: from `x`'s memo when it has
/// one (computed by the first caller, under the lock, so the others wait instead of
/// redoing it), else computed here.
pub(crate) fn min_terms_all(x: &Q8Rows, group_size: usize, n_col_groups: usize) -> Arc<[f32]> {
    let compute = || Arc::from(min_terms(x, 0, x.n_tokens, group_size, n_col_groups));
    let Some(memo) = x.memo else {
        return compute();
    };
    let mut held = memo
        .min_terms
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let key = (group_size, x.n_tokens);
    if let Some((_, _, s)) = held.iter().find(|e| (e.0, e.1) == key) {
        return Arc::clone(s);
    }
    let s = compute();
    held.push((key.0, key.1, Arc::clone(&s)));
    s
}

/// `x`'s quants (`[token][column]`) as i16, through its memo as [`min_terms_all`] (the
/// 8-bit-code prompt paths of `avx512bw` and `avx2` share them; once per call, so a plain
/// loop, which the compiler vectorizes, does).
pub(crate) fn acts_i16_all(x: &Q8Rows) -> Arc<[i16]> {
    let quants = &x.quants[..x.n_tokens * x.dim];
    let widen = |q: &[i8]| q.iter().map(|&v| v as i16).collect::<Vec<i16>>();
    let Some(memo) = x.memo else {
        return Arc::from(widen(quants));
    };
    let mut held = memo.acts_i16.lock().unwrap_or_else(PoisonError::into_inner);
    match &*held {
        Some((n, a)) if *n == x.n_tokens => Arc::clone(a),
        _ => {
            let a: Arc<[i16]> = Arc::from(widen(quants));
            *held = Some((x.n_tokens, Arc::clone(&a)));
            a
        }
    }
}

/// Prefetches (into L1) the tile [`GEMV_PREFETCH_BYTES`] after `tile` (`bytes`, a multiple
/// of 64): the quantized SIMD GEMVs ask for their weights as far ahead as the float ones,
/// whatever their tile size. Addresses past the matrix are harmless: a prefetch is a hint
/// and never faults.
///
/// Measured on Zen 4, `speed --precision int8 --pp 1 --tg 64`, 2 threads, tokens/s (int8
/// tiles of 512 bytes): `avx512bw` 2 KiB ahead 136, 4 KiB 122, 8 KiB 119, none 105; `avx2`
/// 2 KiB 97, none 87. The hardware prefetcher alone leaves kernels that spend several
/// instructions per weight byte short of the read bandwidth; the `vpdpbusd` zmm kernels
/// measured slower with it (int8 128 vs 155), so they do not prefetch. The distance was
/// 4 tiles until 4-bit codes (256-byte tiles, so 1 KiB ahead) were measured against 2 KiB
/// on an AMD Zen 5 (`speed --precision int4 --pp 0 --tg 128 --reps 3`, 2 threads,
/// interleaved rounds, tokens/s): `avxvnni` 359/390/423/322/338/298/349/342 ->
/// 395/460/440/370/340/319/371/436 (ahead by 4 KiB: 396/437/428), `avx2`
/// 345/323/296 -> 371/337/330. The 256-bit prompt sub-tiles prefetch only on a row
/// group's first pass (token 0): the later passes find the group's tiles in cache.
#[inline(always)]
pub(crate) fn prefetch_ahead(tile: *const u8, bytes: usize) {
    crate::kernels::prefetch_hint(tile.wrapping_add(GEMV_PREFETCH_BYTES), bytes);
}
