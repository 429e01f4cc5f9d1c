//! Compute kernels, chosen once per process by CPU feature tier ([`Isa`];
//! `KWK_ISA=amx|vnni|avx512bw|avxvnni|avx2|scalar` forces one the CPU supports). Where
//! each tier lives:
//!
//! - float32 and bf16 panels (below) and the vector helpers (softmax, SwiGLU, dots): the
//!   specification and `scalar` tier in `scalar.rs`; `avx2` and `avxvnni` in
//!   `x86_64/avx2.rs`; `avx512bw`, `vnni` and `amx` in `x86_64/avx512.rs`. This file
//!   dispatches.
//! - int8 and 4-/6-/8-bit codes: [`quant`], one file per tier (`quant/spec.rs` the
//!   specification; `scalar/`, `avx2.rs`, `avxvnni.rs`, `avx512bw.rs`, `avx512vnni.rs`,
//!   `amx/`) under one driver (`quant/driver.rs`) over one packed layout
//!   (`quant/layout.rs`); their q8 activations from `q8_activations.rs` (scalar, AVX2 and
//!   AVX-512 versions in that file).
//! - attention over a KV cache of any precision (scores against key panels, P·V over
//!   values, narrow types widened in registers): [`attention`], its `scalar.rs`
//!   specification beside `avx2.rs` and `avx512.rs`.
//! - `broadcast.rs`: the worker pool's hand-off of a borrowed job.
//!
//! The kernels' `unsafe`: the SIMD tier files (`x86_64/`, `quant/`'s tier files,
//! `attention/`'s tier files, the
//! SIMD halves of `q8_activations.rs`), each with its scalar twin and tests; the output
//! pointers here ([`OutputMatrix`]); the job hand-off in `broadcast.rs`.
//!
//! Weight layout shared by the float32 and bf16 kernels ("panels"): the rows of a weight
//! matrix are grouped by [`PANEL_ROWS`] (16, one zmm of f32). Panel `p` holds rows
//! `16p..16p+16`; in float32 its element `(k, lane)` sits at `p*cols*16 + k*16 + lane`, so a
//! kernel loads 16 rows' weights for one input column with one vector load and broadcasts
//! the activation: no horizontal sums, one activation load serving 16 rows, and a tile of
//! several tokens x several panels in registers for prompts (a GEMV for one token is the
//! same loop with one token). In bf16 two consecutive columns are paired per lane
//! (`p*kp*32 + j*32 + 2*lane + {0,1}` for column pair `j`), the operand layout of
//! `vdpbf16ps`. Rows past the end of the matrix are zero padding.

pub mod attention;
pub mod broadcast;
pub mod q8_activations;
pub mod quant;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

use std::ops::Range;
use std::sync::OnceLock;

/// Rows per weight panel (one 512-bit vector of f32).
pub const PANEL_ROWS: usize = 16;

/// The instruction-set tier the kernels run on, chosen once per process from the CPU's
/// features (or forced with `KWK_ISA`). Each tier names what the quantized (int8/int4)
/// kernels use; the float kernels follow the vector width of the tier:
///
/// | tier (`KWK_ISA`) | int8/int4 matmuls | float32 | bf16 | CPUs |
/// |---|---|---|---|---|
/// | `amx` | `tdpbf16ps` tiles in prompts of 16 tokens or more (`tdpbsud` without AMX-BF16), else as `vnni` | AVX-512F | as `vnni` | Sapphire Rapids, Granite Rapids |
/// | `vnni` | `vpdpbusd` zmm | AVX-512F | `vdpbf16ps` with AVX512_BF16, else convert + FMA | Ice Lake, Sapphire Rapids, Zen 4 |
/// | `avx512bw` | `vpmaddubsw` + `vpmaddwd` zmm | AVX-512F | convert + FMA | Skylake-SP, Cascade Lake |
/// | `avxvnni` | `vpdpbusd` ymm (VEX; EVEX with AVX512-VNNI/VL where AVX-VNNI is absent) | AVX2 | AVX2 convert | Alder Lake and later client cores |
/// | `avx2` | `vpmaddubsw` + `vpmaddwd` ymm | AVX2 | AVX2 convert | Haswell to Comet Lake, Zen 1-3 |
/// | `scalar` | the specification | scalar | scalar | anything |
///
/// Every tier computes the quantized matmuls' exact integer block dots and then the same
/// float operations in the same order, so all tiers agree to the bit on int8/int4; except
/// the `amx` tier's prompts on AMX-BF16, which round weights and activations to bf16 and
/// sum in float32 (`quant/amx/bf16.rs`: faster, and closer to float32 than q8 blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + FMA + F16C with 256-bit `vpdpbusd` (AVX-VNNI, or AVX512-VNNI + VL).
    AvxVnni,
    /// AVX-512 F/BW/VL + FMA, no VNNI or BF16 instructions.
    Avx512Bw,
    /// AVX-512 F/BW/VL + FMA + VNNI (+ `vdpbf16ps` when `bf16` is set; + AMX-INT8 tiles
    /// for the 8-bit weights' prompt matmuls when `amx` is set: the `amx` tier).
    Avx512Vnni {
        bf16: bool,
        amx: bool,
    },
}

impl Isa {
    /// The tier's name, as `KWK_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Bw => "avx512bw",
            Isa::Avx512Vnni { amx: true, .. } => "amx",
            Isa::Avx512Vnni { .. } => "vnni",
        }
    }

    /// Whether the float kernels run on 512-bit vectors.
    pub fn has_avx512(self) -> bool {
        matches!(self, Isa::Avx512Bw | Isa::Avx512Vnni { .. })
    }

    /// Whether the float kernels run on 256-bit AVX2 vectors.
    pub fn is_avx2_class(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::AvxVnni)
    }

    /// The kernels a weight format's matmuls run on this tier, as reports show them:
    /// float32 `avx512f`/`avx2`/`scalar`; bf16 `avx512bf16` (`vdpbf16ps`) or
    /// `avx512f (convert)`/`avx2 (convert)` (bf16 widened to f32, then FMA); int8/int4
    /// the quantized path's label (`avx512vnni`, `avx512bw`, `avxvnni`, `avx2`, `scalar`).
    pub fn weight_kernels(self, kind: WeightKernels) -> &'static str {
        match kind {
            WeightKernels::Float32 => match self {
                _ if self.has_avx512() => "avx512f",
                _ if self.is_avx2_class() => "avx2",
                _ => "scalar",
            },
            WeightKernels::Bf16 => match self {
                Isa::Avx512Vnni { bf16: true, .. } => "avx512bf16",
                _ if self.has_avx512() => "avx512f (convert)",
                _ if self.is_avx2_class() => "avx2 (convert)",
                _ => "scalar",
            },
            WeightKernels::Quantized => quant::QuantIsa::from_isa(self).label(),
        }
    }

    /// One line for reports: the tier and what each kind of weight runs on it, e.g.
    /// `avx512bw: float32 avx512f, bf16 avx512f (convert), int8/int4 avx512bw (1-token: avx2
    /// ymm)`.
    pub fn summary(self) -> String {
        format!(
            "{}: float32 {}, bf16 {}, int8/int4 {}",
            self.name(),
            self.weight_kernels(WeightKernels::Float32),
            self.weight_kernels(WeightKernels::Bf16),
            self.weight_kernels(WeightKernels::Quantized)
        )
    }
}

/// The arithmetic a kind of weight matmul runs on a tier (the roofline's compute ceiling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    Fp32,
    Bf16,
    /// Integer dots of int8 activations (u8 x i8 or i8 x i8 into i32; on the scalar
    /// tier of x86-64, the same values widened to i16 for `pmaddwd`).
    Int8,
}

impl Isa {
    /// What `kind`'s matmuls compute with on this tier: the scalar tier off x86-64 takes
    /// the quantized block dots in f32 (`quant/scalar/`).
    pub fn arithmetic(self, kind: WeightKernels) -> Arithmetic {
        match kind {
            WeightKernels::Float32 => Arithmetic::Fp32,
            WeightKernels::Bf16 => Arithmetic::Bf16,
            WeightKernels::Quantized if quant::QuantIsa::from_isa(self).dots_in_f32() => {
                Arithmetic::Fp32
            }
            WeightKernels::Quantized => Arithmetic::Int8,
        }
    }
}

/// The kinds of weight matmul kernel (one per packed format family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightKernels {
    Float32,
    Bf16,
    /// int8 and int4 (and the int4 mix's 6-/8-bit tensors): q8 activations.
    Quantized,
}

/// CPU features the kernels care about that this CPU has (for reports).
pub fn detected_flags() -> Vec<&'static str> {
    let mut flags = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($f) { flags.push($f); }
            )*};
        }
        probe!(
            "avx2",
            "fma",
            "f16c",
            "avxvnni",
            "avx512f",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512vnni",
            "avx512bf16"
        );
    }
    flags
}

/// Whether `isa` can run on this CPU.
pub fn isa_supported(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => avx2,
            Isa::AvxVnni => avx2 && (has!("avxvnni") || (avx512 && has!("avx512vnni"))),
            Isa::Avx512Bw => avx512,
            Isa::Avx512Vnni { bf16, amx } => {
                avx512
                    && has!("avx512vnni")
                    && (!bf16 || has!("avx512bf16"))
                    && (!amx || quant::amx::available())
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        isa == Isa::Scalar
    }
}

/// Whether the `amx` tier's prompts run on AMX-BF16 tiles here (`quant/amx/bf16.rs`):
/// the CPU and the OS grant AMX with AMX-BF16 and AVX512-BF16.
pub fn amx_bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        quant::amx::bf16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Every tier this CPU can run, from scalar up (tests compare each against scalar).
pub fn supported_isas() -> Vec<Isa> {
    [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Bw,
        Isa::Avx512Vnni {
            bf16: false,
            amx: false,
        },
        Isa::Avx512Vnni {
            bf16: true,
            amx: false,
        },
        Isa::Avx512Vnni {
            bf16: false,
            amx: true,
        },
        Isa::Avx512Vnni {
            bf16: true,
            amx: true,
        },
    ]
    .into_iter()
    .filter(|&i| isa_supported(i))
    .collect()
}

/// The VNNI tier with `vdpbf16ps` when the CPU has AVX512_BF16, and AMX tiles when `amx`.
fn vnni_tier(amx: bool) -> Isa {
    Isa::Avx512Vnni {
        bf16: isa_supported(Isa::Avx512Vnni {
            bf16: true,
            amx: false,
        }),
        amx,
    }
}

/// The best tier this CPU has: `amx` (the `vnni` tier with AMX-INT8 prompt tiles, when the
/// CPU and the OS grant AMX) over `vnni` (with `vdpbf16ps` when present) over `avx512bw`
/// over `avxvnni` over `avx2` over `scalar`. `amx` computes the same bits as `vnni`; its
/// prompts measured 8-9 % faster on an Intel Xeon with AMX (see `quant/amx/tiles.rs`).
pub fn best_isa() -> Isa {
    [
        vnni_tier(true),
        vnni_tier(false),
        Isa::Avx512Bw,
        Isa::AvxVnni,
        Isa::Avx2,
    ]
    .into_iter()
    .find(|&i| isa_supported(i))
    .unwrap_or(Isa::Scalar)
}

/// The tier a `KWK_ISA` value asks for: `Ok(None)` when unset or empty (the best tier),
/// an error naming the values this CPU supports when the value is unknown or the CPU
/// cannot run it.
pub fn parse_isa_request(value: Option<&str>) -> Result<Option<Isa>, String> {
    let v = match value.map(str::trim) {
        None | Some("") => return Ok(None),
        Some(v) => v.to_ascii_lowercase(),
    };
    let best = best_isa();
    let wanted = match v.as_str() {
        "scalar" => Some(Isa::Scalar),
        "avx2" => Some(Isa::Avx2),
        "avxvnni" => Some(Isa::AvxVnni),
        "avx512bw" => Some(Isa::Avx512Bw),
        // `vnni` and `amx` use `vdpbf16ps` too when the CPU has it (every VNNI tier CPU
        // with AVX512_BF16 runs both).
        "vnni" => Some(vnni_tier(false)),
        "amx" => Some(vnni_tier(true)),
        "avx512" => best.has_avx512().then_some(best),
        _ => None,
    };
    match wanted {
        Some(isa) if isa_supported(isa) => Ok(Some(isa)),
        _ => Err(format!(
            "KWK_ISA={v} is not a kernel tier this CPU supports; set it to one of {} or unset it",
            supported_tier_names().join("|")
        )),
    }
}

/// The `KWK_ISA` values this CPU can run, best first.
pub fn supported_tier_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = supported_isas().iter().rev().map(|i| i.name()).collect();
    names.dedup();
    if best_isa().has_avx512() {
        names.push("avx512");
    }
    names
}

/// Checks `KWK_ISA` without choosing anything: the error [`parse_isa_request`] gives for
/// its value, so that a harness can refuse to measure under a tier it did not ask for.
pub fn check_isa_env() -> Result<(), String> {
    parse_isa_request(std::env::var("KWK_ISA").ok().as_deref()).map(|_| ())
}

/// The tier chosen once per process: `KWK_ISA` when set and supported, else the best.
/// An unknown or unsupported `KWK_ISA` value falls back to the best tier with a warning
/// ([`crate::notices::warn`]) naming the supported values (kwk-eval refuses such a value instead, see
/// [`check_isa_env`]; every report records the tier that actually ran).
pub fn active_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(
        || match parse_isa_request(std::env::var("KWK_ISA").ok().as_deref()) {
            Ok(Some(isa)) => isa,
            Ok(None) => best_isa(),
            Err(e) => {
                let best = best_isa();
                crate::notices::warn(format!("{e}; using {}", best.name()));
                best
            }
        },
    )
}

/// Name of the tier the kernels run with (`amx`, `vnni`, `avx512bw`, `avxvnni`, `avx2`,
/// `scalar`).
pub fn isa_in_use() -> &'static str {
    active_isa().name()
}

/// The kernels each weight format runs with in this process (see [`Isa::summary`]).
pub fn kernels_summary() -> String {
    active_isa().summary()
}

/// A row-major `[n_tokens][ld]` float32 output that worker threads fill in disjoint column
/// ranges (each thread owns a slice of the weight rows, i.e. of the output columns).
pub struct OutputMatrix {
    ptr: *mut f32,
    n_tokens: usize,
    ld: usize,
}

// SAFETY: threads only write through `OutputMatrix::write_cols`, whose contract is that
// concurrent callers use disjoint column ranges, so no element is written by two threads.
unsafe impl Sync for OutputMatrix {}
unsafe impl Send for OutputMatrix {}

impl OutputMatrix {
    /// Wraps `out` (length at least `n_tokens * ld`). The borrow ends when the caller stops
    /// using the matrix; callers keep `out` alive and untouched while threads write.
    pub fn new(out: &mut [f32], n_tokens: usize, ld: usize) -> Self {
        assert!(out.len() >= n_tokens * ld, "output buffer too small");
        OutputMatrix {
            ptr: out.as_mut_ptr(),
            n_tokens,
            ld,
        }
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn ld(&self) -> usize {
        self.ld
    }

    /// The same matrix from token `t0` on: its token `t` is this matrix's token `t0 + t`
    /// (the write contract is shared: writers of both must use disjoint elements).
    pub fn from_token(&self, t0: usize) -> OutputMatrix {
        assert!(t0 <= self.n_tokens);
        OutputMatrix {
            // SAFETY: t0 ≤ n_tokens, so the offset stays inside (or one past) the buffer.
            ptr: unsafe { self.ptr.add(t0 * self.ld) },
            n_tokens: self.n_tokens - t0,
            ld: self.ld,
        }
    }

    /// A pointer to token `t0`, column `col`, for a kernel that writes tokens `t0..t0 + n`,
    /// columns `col..col + width` itself (token rows [`Self::ld`] floats apart). Writes
    /// through it are bound by [`Self::write_cols`]'s contract: concurrent writers use
    /// disjoint columns.
    pub fn block_ptr(&self, t0: usize, n: usize, col: usize, width: usize) -> *mut f32 {
        assert!(t0 + n <= self.n_tokens && col + width <= self.ld);
        // SAFETY: in bounds by the assert (an offset inside the buffer `new` was given).
        unsafe { self.ptr.add(t0 * self.ld + col) }
    }

    /// [`Self::write_cols`] for a length known at compile time: the copy is a few vector
    /// moves in place, where a slice's goes through `memcpy` (4 % of an int8 prompt's time
    /// went to that call for the 16-value row groups).
    pub fn write_array<const N: usize>(&self, t: usize, col: usize, values: &[f32; N]) {
        assert!(t < self.n_tokens && col + N <= self.ld);
        // SAFETY: as in `write_cols`.
        unsafe {
            (self.ptr.add(t * self.ld + col) as *mut [f32; N]).write_unaligned(*values);
        }
    }

    /// Writes `values` to token `t`, columns `col..col + values.len()`.
    ///
    /// Callers running concurrently must write disjoint column ranges.
    pub fn write_cols(&self, t: usize, col: usize, values: &[f32]) {
        assert!(t < self.n_tokens && col + values.len() <= self.ld);
        // SAFETY: in bounds by the assert; disjointness between threads is the caller's
        // contract documented above, so this is the only writer of these elements.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                self.ptr.add(t * self.ld + col),
                values.len(),
            );
        }
    }
}

/// A weight matrix packed in panels (see the module docs): `n_rows` rows of `cols` values.
/// By default the panels lie back to back (panel `p` at `data[p * cols * 16]`);
/// [`gemm_f32_panels_strided`] takes their spacing explicitly.
#[derive(Debug, Clone, Copy)]
pub struct PanelWeights<'a, T> {
    pub data: &'a [T],
    pub n_rows: usize,
    pub cols: usize,
}

/// `n_tokens` activation rows of `data`, one per token, as a panel matmul reads them
/// (back to back, `cols` values each, unless strides say otherwise).
#[derive(Debug, Clone, Copy)]
pub struct TokenRows<'a, T> {
    pub data: &'a [T],
    pub n_tokens: usize,
}

/// The spacing of operands not packed back to back: panel `p` starts at
/// `data[p * panel]` and token `t`'s activations at `data[t * token]`.
#[derive(Debug, Clone, Copy)]
pub struct PanelStrides {
    pub panel: usize,
    pub token: usize,
}

/// Float32 panel matmul: for every token `t < x.n_tokens` (activation rows of `x`, `w.cols`
/// values each) and every weight row `r` in `rows`, `y[t][r] = W[r] · x[t]`, where `w` holds
/// the panels of a matrix with `w.n_rows` rows (see the module docs). `rows.start` must be a
/// multiple of [`PANEL_ROWS`]; rows at or past `w.n_rows` are not written.
pub fn gemm_f32_panels(
    isa: Isa,
    w: PanelWeights<f32>,
    x: TokenRows<f32>,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let PanelWeights {
        data: w,
        n_rows,
        cols,
    } = w;
    let TokenRows { data: x, n_tokens } = x;
    check_panel_args(w.len(), n_rows, cols, x.len(), n_tokens, &rows, y);
    let op = PanelOperands {
        w,
        panel_stride: cols * PANEL_ROWS,
        cols,
        x,
        ldx: cols,
        n_tokens,
    };
    gemm_f32_unchecked(isa, &op, rows, y);
}

/// [`gemm_f32_panels`] with explicit strides, for panels that are not packed back to back
/// (the KV cache): panel `p` starts at `w.data[p * strides.panel]`
/// (`strides.panel >= cols * 16`) and token `t`'s activations at `x.data[t * strides.token]`
/// (`strides.token >= cols`).
pub fn gemm_f32_panels_strided(
    isa: Isa,
    w: PanelWeights<f32>,
    x: TokenRows<f32>,
    strides: PanelStrides,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let PanelWeights {
        data: w,
        n_rows,
        cols,
    } = w;
    let TokenRows { data: x, n_tokens } = x;
    let PanelStrides {
        panel: panel_stride,
        token: ldx,
    } = strides;
    assert!(panel_stride >= cols * PANEL_ROWS && ldx >= cols);
    assert!(rows.start.is_multiple_of(PANEL_ROWS) && rows.start <= rows.end && rows.end <= n_rows);
    assert!(y.n_tokens() >= n_tokens && y.ld() >= n_rows);
    if rows.is_empty() || n_tokens == 0 {
        return;
    }
    let last_panel = (rows.end - 1) / PANEL_ROWS;
    assert!(
        w.len() >= last_panel * panel_stride + cols * PANEL_ROWS,
        "panel buffer too small"
    );
    assert!(
        x.len() >= (n_tokens - 1) * ldx + cols,
        "activation buffer too small"
    );
    let op = PanelOperands {
        w,
        panel_stride,
        cols,
        x,
        ldx,
        n_tokens,
    };
    gemm_f32_unchecked(isa, &op, rows, y);
}

/// A panel matmul's operands, as the float kernels read them: the weight panels `w`
/// (panel `p` at `w[p * panel_stride]`, `cols` columns of 16 rows) and `n_tokens`
/// activation rows of `x` (token `t` at `x[t * ldx]`, `cols` values). The dispatchers
/// check the bounds before a kernel reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PanelOperands<'a, T> {
    pub w: &'a [T],
    pub panel_stride: usize,
    pub cols: usize,
    pub x: &'a [T],
    pub ldx: usize,
    pub n_tokens: usize,
}

fn gemm_f32_unchecked(isa: Isa, op: &PanelOperands<f32>, rows: Range<usize>, y: &OutputMatrix) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::gemm_f32_panels(op, rows, y),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::gemm_f32_panels(op, rows, y),
        _ => scalar::gemm_f32_panels(op, rows, y),
    }
}

/// `x[i] *= scale` for every value; returns the largest result (`-inf` for none), NaN when
/// any result is NaN (a softmax over it must not drop it). Exact per element, so every
/// tier returns the same values.
pub fn scale_max_f32(isa: Isa, x: &mut [f32], scale: f32) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::scale_max_f32(x, scale),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::scale_max_f32(x, scale),
        _ => scalar::scale_max_f32(x, scale),
    }
}

/// `x[i] = exp(x[i] - shift)` for every value; returns their float32 sum. The SIMD
/// versions use a degree-6 polynomial (Cephes `expf`), within 2 ulp of `f32::exp`.
pub fn exp_shifted_sum(isa: Isa, x: &mut [f32], shift: f32) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::exp_shifted_sum(x, shift),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::exp_shifted_sum(x, shift),
        _ => scalar::exp_shifted_sum(x, shift),
    }
}

/// SwiGLU's `g[i] = silu(g[i]) * u[i]` over `min(g.len(), u.len())` values.
pub fn silu_mul(isa: Isa, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::silu_mul(&mut g[..n], &u[..n]),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::silu_mul(&mut g[..n], &u[..n]),
        _ => scalar::silu_mul(&mut g[..n], &u[..n]),
    }
}

/// GeGLU's `g[i] = gelu_tanh(g[i]) * u[i]` over `min(g.len(), u.len())` values: PyTorch's
/// `gelu(approximate="tanh")`, `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`
/// (transformers' `gelu_pytorch_tanh`, llama.cpp's `ggml_gelu`), computed as
/// `x / (1 + e^(−2z))` on every tier ([`scalar::GELU_2C`]).
pub fn gelu_tanh_mul(isa: Isa, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::gelu_tanh_mul(&mut g[..n], &u[..n]),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::gelu_tanh_mul(&mut g[..n], &u[..n]),
        _ => scalar::gelu_tanh_mul(&mut g[..n], &u[..n]),
    }
}

/// bf16 panel matmul: as [`gemm_f32_panels`] with weights and activations in bf16 (raw
/// `u16` bits). `w.cols` is even (formats pad odd widths with a zero column); `x` holds
/// `x.n_tokens` rows of `w.cols` bf16 values. Products are exact in f32 and summed in f32.
pub fn gemm_bf16_panels(
    isa: Isa,
    w: PanelWeights<u16>,
    x: TokenRows<u16>,
    rows: Range<usize>,
    y: &OutputMatrix,
) {
    let PanelWeights {
        data: w,
        n_rows,
        cols,
    } = w;
    let TokenRows { data: x, n_tokens } = x;
    assert!(
        cols.is_multiple_of(2),
        "bf16 panels need an even column count"
    );
    check_panel_args(w.len(), n_rows, cols, x.len(), n_tokens, &rows, y);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni { bf16: true, .. } => {
            x86_64::avx512::gemm_bf16_panels_dpbf16(w, cols, x, n_tokens, rows, y)
        }
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => {
            x86_64::avx512::gemm_bf16_panels_fma(w, cols, x, n_tokens, rows, y)
        }
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::gemm_bf16_panels(w, cols, x, n_tokens, rows, y),
        _ => scalar::gemm_bf16_panels(w, cols, x, n_tokens, rows, y),
    }
}

fn check_panel_args(
    w_len: usize,
    n_rows: usize,
    cols: usize,
    x_len: usize,
    n_tokens: usize,
    rows: &Range<usize>,
    y: &OutputMatrix,
) {
    let panels = n_rows.div_ceil(PANEL_ROWS);
    assert!(
        w_len >= panels * PANEL_ROWS * cols,
        "panel buffer too small"
    );
    assert!(x_len >= n_tokens * cols, "activation buffer too small");
    assert!(rows.start.is_multiple_of(PANEL_ROWS) && rows.start <= rows.end && rows.end <= n_rows);
    assert!(y.n_tokens() >= n_tokens && y.ld() >= n_rows);
}

/// Packs a row-major `[n_rows][cols]` float32 matrix into panels (see the module docs).
pub fn pack_f32_panels(data: &[f32], n_rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(data.len(), n_rows * cols);
    let panels = n_rows.div_ceil(PANEL_ROWS);
    let mut out = vec![0f32; panels * PANEL_ROWS * cols];
    for r in 0..n_rows {
        let (p, lane) = (r / PANEL_ROWS, r % PANEL_ROWS);
        let base = p * PANEL_ROWS * cols + lane;
        for (k, &v) in data[r * cols..(r + 1) * cols].iter().enumerate() {
            out[base + k * PANEL_ROWS] = v;
        }
    }
    out
}

/// Row `r` of float32 panels, back in row-major order.
pub fn unpack_f32_panel_row(panels: &[f32], cols: usize, r: usize, out: &mut [f32]) {
    let base = (r / PANEL_ROWS) * PANEL_ROWS * cols + r % PANEL_ROWS;
    for (k, o) in out[..cols].iter_mut().enumerate() {
        *o = panels[base + k * PANEL_ROWS];
    }
}

/// Packs a row-major `[n_rows][cols]` float32 matrix into bf16 panels (round to nearest
/// even), padding the columns to an even count; returns the panels and that count.
pub fn pack_bf16_panels(data: &[f32], n_rows: usize, cols: usize) -> (Vec<u16>, usize) {
    assert_eq!(data.len(), n_rows * cols);
    let cols_padded = cols + cols % 2;
    let panels = n_rows.div_ceil(PANEL_ROWS);
    let mut out = vec![0u16; panels * PANEL_ROWS * cols_padded];
    for r in 0..n_rows {
        let (p, lane) = (r / PANEL_ROWS, r % PANEL_ROWS);
        let base = p * PANEL_ROWS * cols_padded;
        for (k, &v) in data[r * cols..(r + 1) * cols].iter().enumerate() {
            out[base + (k / 2) * 2 * PANEL_ROWS + 2 * lane + k % 2] = scalar::f32_to_bf16_one(v);
        }
    }
    (out, cols_padded)
}

/// Row `r` (first `out.len()` columns) of bf16 panels with `cols_padded` columns, as f32.
pub fn unpack_bf16_panel_row(panels: &[u16], cols_padded: usize, r: usize, out: &mut [f32]) {
    let base = (r / PANEL_ROWS) * PANEL_ROWS * cols_padded;
    let lane = r % PANEL_ROWS;
    for (k, o) in out.iter_mut().enumerate() {
        *o = scalar::bf16_to_f32(panels[base + (k / 2) * 2 * PANEL_ROWS + 2 * lane + k % 2]);
    }
}

/// `a · b` over `min(a.len(), b.len())` values.
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::dot_f32(&a[..n], &b[..n]),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::dot_f32(&a[..n], &b[..n]),
        _ => scalar::dot_f32(&a[..n], &b[..n]),
    }
}

/// `a · b` in f64 over `min(a.len(), b.len())` values (GPTQ's Cholesky factor and
/// triangular inverse). Every AVX2-capable tier (AVX-512 ones included) runs the AVX2 loop.
pub fn dot_f64(isa: Isa, a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() || isa.is_avx2_class() => x86_64::avx2::dot_f64(&a[..n], &b[..n]),
        _ => scalar::dot_f64(&a[..n], &b[..n]),
    }
}

/// `y += alpha * x` over `min(y.len(), x.len())` values.
pub fn axpy_f32(isa: Isa, y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::axpy_f32(&mut y[..n], alpha, &x[..n]),
        #[cfg(target_arch = "x86_64")]
        _ if isa.is_avx2_class() => x86_64::avx2::axpy_f32(&mut y[..n], alpha, &x[..n]),
        _ => scalar::axpy_f32(&mut y[..n], alpha, &x[..n]),
    }
}

/// float32 to bf16 bits, round to nearest even (NaN kept quiet), for every value.
pub fn f32_to_bf16(isa: Isa, x: &[f32], out: &mut [u16]) {
    assert!(out.len() >= x.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        _ if isa.has_avx512() => x86_64::avx512::f32_to_bf16(x, &mut out[..x.len()]),
        _ => scalar::f32_to_bf16(x, &mut out[..x.len()]),
    }
}

#[cfg(test)]
mod tests;

/// How far ahead of the weights it is reading, in bytes, generation (one token, every
/// weight read once) asks for them: the hardware prefetcher alone left those reads
/// stalled. Measured on a Xeon (`speed`, tg128, 2 threads, tokens/s): bf16 one-token
/// tiles `avx2` 90-94 -> 109-114, `amx`/`vnni` 104-110 -> 115-117 (float32 already at the
/// read roofline, unchanged); `scalar` float32 47-48 -> 55, bf16 70-72 -> 90-100, int8
/// packed codes 42-56 -> 80-83 (1 KiB ahead), 86 (2 KiB), 85 (4 KiB), int4 54-56 -> 64.
/// Prompts, which read each panel once per token from the caches, lost 13 % with it on
/// the scalar tier and do without. The quantized SIMD GEMVs ask for their tiles the same
/// distance ahead (`quant::driver::prefetch_ahead`).
pub(crate) const GEMV_PREFETCH_BYTES: usize = 2048;

/// Asks the caches for the `bytes` bytes at `at` (which need not be valid to read); a
/// hint only, and nothing where the target has no such instruction in its baseline.
#[inline(always)]
pub(crate) fn prefetch_hint(at: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        x86_64::prefetch_line(at.wrapping_add(line));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, bytes);
}

/// [`prefetch_hint`] into L2 rather than L1: the far one of two distances, so more lines
/// are in flight than L1's fill buffers hold (the near hint then finds them in L2). Out of
/// line, so its hints issue as a short loop rather than unrolled in a burst among the
/// kernel's loads: unrolled, the attention kernels' score loops measured 5-15 % slower
/// (`examples/attention_bandwidth`, f16 scores 3.7-4.2 ms against 3.2-3.6).
#[inline(never)]
pub(crate) fn prefetch_hint_l2(at: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        x86_64::prefetch_line_l2(at.wrapping_add(line));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, bytes);
}
