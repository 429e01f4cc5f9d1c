//! [`Precision`]: the weight format a decoder runs in, parsed from the names users type
//! (`float32`, `bf16`, `int8`/`balanced` with `:calib` or `:gptq`, the low-bit family
//! `int3`, `int4`, `int5`, `int6`, each `[:gG][:mixB][:calib][:gptq[:act]]`, and the
//! size-targeted `bpw:X[:calib]`).

use crate::error::{KwkError, Result};
use crate::kernels::quant::Bits;

/// Weights per scale group when `int4` is given without `:gG`: 32, the finest group the
/// sensitivity mix may use (it also takes g64 and g128 where they lose less per bit saved;
/// `quantize::mix`). On SmolLM2-135M (distributed as Q4_1: 32-weight groups with scale
/// and minimum) g32 reproduces the weights and g64/g128 do not; the low-bit kernels do one
/// float step per 32-column block at any group size, so g32 costs 0.5-0.75 bits per weight
/// and no speed (measured in the quantization work's report). The other widths' defaults:
/// [`default_group`].
pub const DEFAULT_INT4_GROUP: usize = 32;

/// The finest scale group the mix of `intB` may use when no `:gG` is given: 32 for int4
/// ([`DEFAULT_INT4_GROUP`]) and int6, 64 for int3 and int5. A width's size is set by its
/// budget (see [`LowBitOptions`]), not by this bound; within the budget a finer bound lets
/// the weight-error estimate buy scale groups where bits of width would have served better.
/// Measured on held-out text (the off-grid `rot` copy of SmolLM2-135M, 10 chunks of 512
/// from `wiki-test-tail-120k.txt`, not the scored wiki.test.raw chunks; KLD against
/// float32 at equal bits per weight): int3 g32 0.999, g64 0.957, g128 0.952 (4.25 bpw
/// each); int5 g32 0.0695, g64 0.0669 (5.78 each); int6 g32 0.0252 at 6.57 bpw, g64
/// 0.0305 at 6.51 (g64 leaves Q6_K's budget unspent). One model and small differences:
/// g64 where it measured no worse, g128 not taken for a difference within noise.
pub const fn default_group(bits: Bits) -> usize {
    match bits {
        Bits::B3 | Bits::B5 => 64,
        Bits::B4 | Bits::B6 | Bits::B8 => DEFAULT_INT4_GROUP,
    }
}

/// Options of the low-bit formats `int3`, `int4`, `int5` and `int6`:
/// `intB[:gG][:mixB][:calib][:gptq[:act]]`. One type and one code path for every width:
/// the width names the plain tensors' codes and which llama.cpp k-quant mix the size is
/// matched to (`quantize::mix::k_quant_bits_per_weight`: Q3_K_M, Q4_K_M, Q5_K_M, Q6_K;
/// bits per weight counted over every tensor, embeddings and output included, as
/// llama.cpp counts them).
///
/// Defaults (chosen from bits per weight and held-out text, never from the scored chunks):
/// - the finest group: [`default_group`];
/// - `mix_bits` (the top of the layers' ladder; `lm_head` takes its grid on a ladder of its
///   own, 6-bit g64 to symmetric int8, since PACK_VERSION 8: `quantize::mix::head_ladder`):
///   int4 follows llama.cpp's rule for Q4_K_M's `output`, the budget int4 is
///   matched to: 6 bits where Q6_K holds the model's rows (a width that is a multiple of
///   256), 8 where Q6_K falls back to Q8_0 (SmolLM2-135M's 576; Gemma 3 270M's 640). On
///   the widened off-grid copy (768) this rule's `:mix6` measured +10.6 % ΔPPL against
///   `:mix8`'s +19.3 % at the same 5.02 bits per weight (4 chunks; before it, the rule was
///   8 below 1e9 parameters, which gave the same choice on every model measured then); int3, int5
///   and int6 start `lm_head` at 6 bits (6-bit g64, 6.5 bits per weight) at every size (the
///   mix may then buy it a finer grid, `quantize::mix::head_ladder`),
///   because the k-quant they are matched to puts `output` in Q6_K (6.5625): with 8.5
///   bits on a small model's `lm_head` (a fifth of SmolLM2-135M's weights) the rest of
///   the budget falls below the width's cheapest grid and the format overshoots its size
///   (held-out as above, KLD / bits per weight: int3 0.999 / 4.25 against `:mix8` 1.840 /
///   4.25; int5 0.0695 / 5.78 against 0.1339 / 5.84; int6 0.0252 / 6.57 against 0.0352 /
///   6.67).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowBitOptions {
    /// The width of the plain tensors' codes: 3, 4, 5 or 6 (`int3` .. `int6`).
    pub bits: Bits,
    /// Weights per scale group: 32, 64 or 128 (the finest the mix may use).
    pub group_size: usize,
    /// The top of the mix's ladder for the layers and the grid `lm_head` is equalized for
    /// (6 or 8; the mix then chooses `lm_head`'s grid on its own ladder); `None` picks the
    /// width's default (see the type's doc).
    pub mix_bits: Option<Bits>,
    /// Fit scales to activations of the calibration text.
    pub calibrate: bool,
    /// GPTQ rounding on top of calibration.
    pub gptq: bool,
    /// GPTQ takes the columns in descending order of their calibration activity, whole
    /// scale groups at a time (`:act`; only with `:gptq`; see `quantize::gptq`).
    pub act_order: bool,
}

impl LowBitOptions {
    /// The plain `intB` format of width `bits` (defaults, no calibration).
    pub const fn new(bits: Bits) -> LowBitOptions {
        LowBitOptions {
            bits,
            group_size: default_group(bits),
            mix_bits: None,
            calibrate: false,
            gptq: false,
            act_order: false,
        }
    }

    /// `mix_bits`, or the width's default for a model of residual width `model_width`.
    pub fn mix_bits_for(&self, model_width: usize) -> Bits {
        self.mix_bits.unwrap_or(match self.bits {
            Bits::B4 if !model_width.is_multiple_of(256) => Bits::B8,
            Bits::B3 | Bits::B4 | Bits::B5 | Bits::B6 | Bits::B8 => Bits::B6,
        })
    }
}

impl Default for LowBitOptions {
    /// Plain `int4`.
    fn default() -> Self {
        LowBitOptions::new(Bits::B4)
    }
}

/// Options of the `int8` format: `int8`, `int8:calib`, `int8:gptq`. The packed layout and
/// the kernels are the same in all three; only how the codes are chosen differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Int8Options {
    /// Channel equalization driven by activation statistics measured on the calibration
    /// text (scored with the error of the kernels' int8 activation blocks) instead of
    /// estimated from the weights.
    pub calibrate: bool,
    /// GPTQ rounding on top of calibration (`:gptq` implies `:calib`: `calibrate` is set
    /// too, so `int8:gptq` and `int8:calib:gptq` are one format).
    pub gptq: bool,
}

/// Options of the size-targeted format `bpw:X[:calib]`: every tensor gets the grid of
/// [`crate::format::quantized::BUDGET_GRIDS`] that spends a budget of `X` bits per weight
/// (counted as llama.cpp counts them: every tensor's bits, embeddings, output and float
/// vectors included, over all weights) where the measured sensitivity says it helps most
/// (`quantize::budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpwOptions {
    /// The budget in hundredths of a bit per weight (`bpw:4.75` is 475).
    pub centibits: u32,
    /// Weigh each tensor's error with its inputs' second moments measured on the
    /// calibration text (`:calib`), instead of estimated from the weights.
    pub calibrate: bool,
}

impl BpwOptions {
    /// The budget in bits per weight.
    pub fn bits(&self) -> f64 {
        self.centibits as f64 / 100.0
    }

    /// The budget as users write it: `4.75`, `4.5`, `5`.
    fn budget_name(&self) -> String {
        let (whole, frac) = (self.centibits / 100, self.centibits % 100);
        match frac {
            0 => format!("{whole}"),
            f if f % 10 == 0 => format!("{whole}.{}", f / 10),
            f => format!("{whole}.{f:02}"),
        }
    }
}

/// The weight format a decoder runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Float32,
    Bf16,
    Int8(Int8Options),
    /// `int3`, `int4`, `int5`, `int6` (the width is `bits`).
    LowBit(LowBitOptions),
    /// A budget of bits per weight spent by sensitivity (`bpw:X[:calib]`).
    Bpw(BpwOptions),
}

const VALID: &str = "float32 (f32), bf16, int8 (balanced)[:calib|:gptq], \
     int3|int4|int5|int6[:g32|:g64|:g128][:mix6|:mix8][:calib][:gptq[:act]], bpw:X[:calib]";

/// The low-bit family's names and widths.
const LOW_BIT: [(&str, Bits); 4] = [
    ("int3", Bits::B3),
    ("int4", Bits::B4),
    ("int5", Bits::B5),
    ("int6", Bits::B6),
];

impl Precision {
    /// Plain `int8` (no calibration).
    pub const INT8: Precision = Precision::Int8(Int8Options {
        calibrate: false,
        gptq: false,
    });

    /// Plain `int4`.
    pub const INT4: Precision = Precision::LowBit(LowBitOptions::new(Bits::B4));

    /// Whether building this format needs calibration tokens (`int8:calib`, `int8:gptq`,
    /// `intB:calib`, `intB:gptq`).
    pub fn needs_calibration(&self) -> bool {
        match self {
            Precision::Int8(o) => o.calibrate || o.gptq,
            Precision::LowBit(o) => o.calibrate || o.gptq,
            Precision::Bpw(o) => o.calibrate,
            Precision::Float32 | Precision::Bf16 => false,
        }
    }

    /// Whether the layers' linears are rounded by GPTQ (`int8:gptq`, `intB:gptq`).
    pub fn gptq(&self) -> bool {
        match self {
            Precision::Int8(o) => o.gptq,
            Precision::LowBit(o) => o.gptq,
            Precision::Float32 | Precision::Bf16 | Precision::Bpw(_) => false,
        }
    }

    /// Whether the weights are quantized (`int8`, `int3`..`int6`, `bpw` with any options).
    pub fn is_quantized(&self) -> bool {
        matches!(
            self,
            Precision::Int8(_) | Precision::LowBit(_) | Precision::Bpw(_)
        )
    }

    /// The kernels this format's weight matmuls run in this process (the active tier,
    /// `KWK_ISA` respected): e.g. `avx512vnni` or `avx512bw` for int8/int4, `avx512bf16` or
    /// `avx512f (convert)` for bf16, `avx512f` for float32 (see
    /// [`crate::kernels::Isa::weight_kernels`]). Attention and the elementwise steps run the
    /// float kernels of the same tier in every format.
    pub fn kernels(&self) -> &'static str {
        crate::kernels::active_isa().weight_kernels(self.weight_kernels())
    }

    /// What this format's matmuls compute with on the active tier (the roofline's
    /// compute ceiling for its prompts).
    pub fn arithmetic(&self) -> crate::kernels::Arithmetic {
        crate::kernels::active_isa().arithmetic(self.weight_kernels())
    }

    fn weight_kernels(&self) -> crate::kernels::WeightKernels {
        use crate::kernels::WeightKernels;
        match self {
            Precision::Float32 => WeightKernels::Float32,
            Precision::Bf16 => WeightKernels::Bf16,
            Precision::Int8(_) | Precision::LowBit(_) | Precision::Bpw(_) => {
                WeightKernels::Quantized
            }
        }
    }

    /// Parses a format name as users type it: `float32`, `bf16`, `int8` (`balanced`),
    /// `int8:calib`, `int8:gptq`, `int4`, `int4:g64`, `int4:mix8`, `int4:calib`,
    /// `int4:gptq`, and `int3`, `int5`, `int6` with the same options as `int4` (options
    /// combine, in any order, each at most once), `bpw:4.5`, `bpw:4.5:calib`.
    pub fn parse(spec: &str) -> Result<Precision> {
        let mut parts = spec.trim().split(':');
        let base = parts.next().unwrap_or("").to_ascii_lowercase();
        let options: Vec<String> = parts.map(|p| p.to_ascii_lowercase()).collect();
        let unknown = || {
            KwkError::InvalidArgument(format!(
                "unknown weight format '{spec}'; valid formats: {VALID}"
            ))
        };
        let twice = |opt: &str| {
            KwkError::InvalidArgument(format!("option ':{opt}' given twice in '{spec}'"))
        };
        let plain = |p: Precision| {
            if options.is_empty() {
                Ok(p)
            } else {
                Err(KwkError::InvalidArgument(format!(
                    "format '{base}' takes no options (got '{spec}'); valid formats: {VALID}"
                )))
            }
        };
        match base.as_str() {
            "float32" | "f32" => plain(Precision::Float32),
            "bf16" => plain(Precision::Bf16),
            "int8" | "balanced" => {
                let mut o = Int8Options::default();
                for opt in &options {
                    if options.iter().filter(|x| *x == opt).count() > 1 {
                        return Err(twice(opt));
                    }
                    match opt.as_str() {
                        "calib" => o.calibrate = true,
                        "gptq" => {
                            o.calibrate = true;
                            o.gptq = true;
                        }
                        _ => {
                            return Err(KwkError::InvalidArgument(format!(
                                "unknown int8 option ':{opt}' in '{spec}' (int8 takes :calib or :gptq); \
                                 valid formats: {VALID}"
                            )))
                        }
                    }
                }
                Ok(Precision::Int8(o))
            }
            "bpw" => parse_bpw(spec, &options),
            name => {
                let Some(&(_, bits)) = LOW_BIT.iter().find(|(n, _)| *n == name) else {
                    return Err(unknown());
                };
                let mut o = LowBitOptions::new(bits);
                let (mut group_set, mut seen) = (false, std::collections::HashSet::new());
                for opt in &options {
                    if !seen.insert(opt.clone()) {
                        return Err(twice(opt));
                    }
                    match opt.as_str() {
                        "g32" | "g64" | "g128" => {
                            if group_set {
                                return Err(KwkError::InvalidArgument(format!(
                                    "two group sizes in '{spec}'; give one of :g32, :g64, :g128"
                                )));
                            }
                            group_set = true;
                            o.group_size = opt[1..].parse().expect("matched digits");
                        }
                        "mix6" | "mix8" => {
                            if o.mix_bits.is_some() {
                                return Err(KwkError::InvalidArgument(format!(
                                    "two mix options in '{spec}'; give one of :mix6, :mix8"
                                )));
                            }
                            o.mix_bits = Some(if opt == "mix6" { Bits::B6 } else { Bits::B8 });
                        }
                        "calib" => o.calibrate = true,
                        "gptq" => o.gptq = true,
                        "act" => o.act_order = true,
                        _ => {
                            return Err(KwkError::InvalidArgument(format!(
                                "unknown {base} option ':{opt}' in '{spec}'; valid formats: {VALID}"
                            )))
                        }
                    }
                }
                if o.act_order && !o.gptq {
                    return Err(KwkError::InvalidArgument(format!(
                        "':act' orders GPTQ's columns, so it needs ':gptq' too (e.g. {base}:gptq:act), got '{spec}'"
                    )));
                }
                Ok(Precision::LowBit(o))
            }
        }
    }

    /// The canonical spelling (`parse(p.name()) == p`): `float32`, `bf16`, `int8`,
    /// `int8:calib`, `int8:gptq`, and `intB` followed by the options that differ from the
    /// defaults in a fixed order (`:gG`, `:mixB`, `:calib`, `:gptq`, `:act`).
    pub fn name(&self) -> String {
        match self {
            Precision::Float32 => "float32".into(),
            Precision::Bf16 => "bf16".into(),
            Precision::Int8(o) => match (o.calibrate, o.gptq) {
                (_, true) => "int8:gptq".into(),
                (true, false) => "int8:calib".into(),
                (false, false) => "int8".into(),
            },
            Precision::LowBit(o) => {
                let mut s = format!("int{}", o.bits.get());
                if o.group_size != default_group(o.bits) {
                    s += &format!(":g{}", o.group_size);
                }
                if let Some(b) = o.mix_bits {
                    s += &format!(":mix{}", b.get());
                }
                if o.calibrate {
                    s += ":calib";
                }
                if o.gptq {
                    s += ":gptq";
                }
                if o.act_order {
                    s += ":act";
                }
                s
            }
            Precision::Bpw(o) => {
                let calib = if o.calibrate { ":calib" } else { "" };
                format!("bpw:{}{calib}", o.budget_name())
            }
        }
    }
}

/// `bpw:X[:calib]`: `X` a number of bits per weight with at most two decimals, within the
/// grids' range.
fn parse_bpw(spec: &str, options: &[String]) -> Result<Precision> {
    let bad = |why: String| {
        KwkError::InvalidArgument(format!(
            "'{spec}': {why} (e.g. bpw:4.5 or bpw:4.5:calib; valid formats: {VALID})"
        ))
    };
    let (lo, hi) = crate::format::quantized::budget_range();
    let range = format!("a number of bits per weight from {lo} to {hi}, the grids kwk has");
    let Some(x) = options.first() else {
        return Err(bad(format!("bpw needs a budget, {range}")));
    };
    let (whole, frac) = x.split_once('.').unwrap_or((x, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let dangling_point = frac.is_empty() && x.contains('.');
    if whole.is_empty()
        || !digits(whole)
        || !digits(frac)
        || dangling_point
        || frac.len() > 2
        || whole.len() > 3
    {
        return Err(bad(format!(
            "budget '{x}' is not {range} with at most two decimals"
        )));
    }
    let frac_c: u32 = format!("{frac:0<2}").parse().expect("two digits");
    let centibits = whole.parse::<u32>().expect("digits") * 100 + frac_c;
    if (centibits as f64) < lo * 100.0 - 1e-9 || (centibits as f64) > hi * 100.0 + 1e-9 {
        return Err(bad(format!("budget {x} is outside {range}")));
    }
    let mut o = BpwOptions {
        centibits,
        calibrate: false,
    };
    for opt in &options[1..] {
        match opt.as_str() {
            "calib" if !o.calibrate => o.calibrate = true,
            "calib" => return Err(bad("option ':calib' given twice".into())),
            _ => {
                return Err(bad(format!(
                    "unknown bpw option ':{opt}' (bpw takes :calib)"
                )))
            }
        }
    }
    Ok(Precision::Bpw(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_round_trips() {
        assert_eq!(Precision::parse("float32").unwrap(), Precision::Float32);
        assert_eq!(Precision::parse("F32").unwrap(), Precision::Float32);
        assert_eq!(Precision::parse("bf16").unwrap(), Precision::Bf16);
        assert_eq!(Precision::parse("balanced").unwrap(), Precision::INT8);
        assert_eq!(Precision::parse("int8").unwrap().name(), "int8");
        let p = Precision::parse("int4:gptq:g64:mix6:calib").unwrap();
        assert_eq!(
            p,
            Precision::LowBit(LowBitOptions {
                bits: Bits::B4,
                group_size: 64,
                mix_bits: Some(Bits::B6),
                calibrate: true,
                gptq: true,
                act_order: false,
            })
        );
        assert_eq!(p.name(), "int4:g64:mix6:calib:gptq");
        let act = Precision::parse("int4:act:gptq").unwrap();
        assert_eq!(act.name(), "int4:gptq:act");
        let err = Precision::parse("int4:act").unwrap_err().to_string();
        assert!(err.contains("needs ':gptq'"), "{err}");
        for s in [
            "int4",
            "int4:g128",
            "int4:mix8",
            "int4:calib",
            "float32",
            "bf16",
            "int8",
            "int8:calib",
            "int8:gptq",
        ] {
            let p = Precision::parse(s).unwrap();
            assert_eq!(Precision::parse(&p.name()).unwrap(), p, "{s}");
        }
        assert_eq!(
            Precision::parse("int4").unwrap(),
            Precision::LowBit(LowBitOptions::default())
        );
        assert_eq!(Precision::parse("int4").unwrap(), Precision::INT4);
    }

    #[test]
    fn every_low_bit_width_takes_int4s_options() {
        for (name, bits) in LOW_BIT {
            let p = Precision::parse(name).unwrap();
            assert_eq!(p, Precision::LowBit(LowBitOptions::new(bits)));
            assert_eq!(p.name(), name);
            assert!(p.is_quantized() && !p.needs_calibration());
            let full = Precision::parse(&format!("{name}:act:g128:mix8:gptq:calib")).unwrap();
            assert_eq!(
                full,
                Precision::LowBit(LowBitOptions {
                    bits,
                    group_size: 128,
                    mix_bits: Some(Bits::B8),
                    calibrate: true,
                    gptq: true,
                    act_order: true,
                })
            );
            assert_eq!(full.name(), format!("{name}:g128:mix8:calib:gptq:act"));
            assert_eq!(Precision::parse(&full.name()).unwrap(), full);
            let e = Precision::parse(&format!("{name}:g48"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("unknown {name} option ':g48'")), "{e}");
            let e = Precision::parse(&format!("{name}:act"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("e.g. {name}:gptq:act")), "{e}");
        }
        // Each width's default group is left out of its name, any other is spelled.
        assert_eq!(Precision::parse("int3:g64").unwrap().name(), "int3");
        assert_eq!(Precision::parse("int3:g32").unwrap().name(), "int3:g32");
        assert_eq!(
            Precision::parse("int5:g64").unwrap(),
            Precision::parse("int5").unwrap()
        );
        assert_eq!(Precision::parse("int6:g32").unwrap().name(), "int6");
        assert_eq!(Precision::parse("int4:g64").unwrap().name(), "int4:g64");
        // Distinct widths are distinct formats (and pack cache keys).
        let names: Vec<String> = LOW_BIT
            .iter()
            .map(|(n, _)| Precision::parse(n).unwrap().name())
            .collect();
        assert_eq!(names, ["int3", "int4", "int5", "int6"]);
        for bad in ["int2", "int7", "int3x", "int16"] {
            let e = Precision::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("unknown weight format") && e.contains("int3|int4"),
                "{e}"
            );
        }
    }

    #[test]
    fn default_mix_bits_by_width_and_row_length() {
        // int4: 8 where Q6_K cannot hold the rows (576, 640), 6 where it can (768, 2048).
        let mix = |b, width| LowBitOptions::new(b).mix_bits_for(width);
        for (width, want) in [
            (576, Bits::B8),
            (640, Bits::B8),
            (768, Bits::B6),
            (2048, Bits::B6),
        ] {
            assert_eq!(mix(Bits::B4, width), want, "{width}");
            for b in [Bits::B3, Bits::B5, Bits::B6] {
                assert_eq!(mix(b, width), Bits::B6, "{b:?} {width}");
            }
        }
        let big = 2048;
        let given = LowBitOptions {
            mix_bits: Some(Bits::B8),
            ..LowBitOptions::new(Bits::B3)
        };
        assert_eq!(given.mix_bits_for(big), Bits::B8);
    }

    #[test]
    fn int8_options_parse_name_and_round_trip() {
        let calib = Precision::parse("int8:calib").unwrap();
        assert_eq!(
            calib,
            Precision::Int8(Int8Options {
                calibrate: true,
                gptq: false
            })
        );
        assert_eq!(calib.name(), "int8:calib");
        assert_eq!(Precision::parse("BALANCED:Calib").unwrap(), calib);
        // `:gptq` includes `:calib`: one format, one canonical name, one cache key.
        let gptq = Precision::parse("int8:gptq").unwrap();
        assert_eq!(
            gptq,
            Precision::Int8(Int8Options {
                calibrate: true,
                gptq: true
            })
        );
        assert_eq!(Precision::parse("int8:calib:gptq").unwrap(), gptq);
        assert_eq!(Precision::parse("int8:gptq:calib").unwrap(), gptq);
        assert_eq!(gptq.name(), "int8:gptq");
        assert!(!Precision::INT8.needs_calibration() && !Precision::INT8.gptq());
        assert!(calib.needs_calibration() && !calib.gptq());
        assert!(gptq.needs_calibration() && gptq.gptq());
        assert!(Precision::parse("int4:gptq").unwrap().needs_calibration());
        assert!(!Precision::parse("int4").unwrap().needs_calibration());
        assert!(!Precision::Float32.needs_calibration() && !Precision::Float32.is_quantized());
        assert!(calib.is_quantized());
        assert_eq!(calib.kernels(), Precision::INT8.kernels());
    }

    #[test]
    fn int8_rejects_int4_options_and_repeats() {
        for (bad, want) in [
            ("int8:g32", "unknown int8 option ':g32'"),
            ("int8:mix8", "unknown int8 option ':mix8'"),
            ("int8:act", "unknown int8 option ':act'"),
            ("int8:gptq:act", "unknown int8 option ':act'"),
            ("int8:calib:calib", "given twice"),
            ("int8:gptq:gptq", "given twice"),
            ("int8:", "unknown int8 option ':'"),
        ] {
            let e = Precision::parse(bad).unwrap_err();
            assert!(matches!(e, KwkError::InvalidArgument(_)), "{bad}");
            let e = e.to_string();
            assert!(e.contains(want), "{bad}: {e}");
            if want.starts_with("unknown") {
                assert!(e.contains("int8 (balanced)[:calib|:gptq]"), "{bad}: {e}");
            }
        }
    }

    #[test]
    fn bpw_parses_names_and_refuses_bad_budgets() {
        let p = Precision::parse("bpw:4.75").unwrap();
        assert_eq!(
            p,
            Precision::Bpw(BpwOptions {
                centibits: 475,
                calibrate: false
            })
        );
        assert!(p.is_quantized() && !p.needs_calibration() && !p.gptq());
        let c = Precision::parse("BPW:5:calib").unwrap();
        assert!(c.needs_calibration());
        assert_eq!(c.name(), "bpw:5:calib");
        for s in ["bpw:4.5", "bpw:4.75", "bpw:6", "bpw:8.05:calib", "bpw:4.25"] {
            let p = Precision::parse(s).unwrap();
            assert_eq!(p.name(), s);
            assert_eq!(Precision::parse(&p.name()).unwrap(), p, "{s}");
        }
        assert_eq!(Precision::parse("bpw:4.50").unwrap().name(), "bpw:4.5");
        let (lo, hi) = crate::format::quantized::budget_range();
        for (bad, want) in [
            ("bpw", "needs a budget"),
            ("bpw:0", "outside"),
            ("bpw:abc", "not a number"),
            ("bpw:4.125", "at most two decimals"),
            ("bpw:-5", "not a number"),
            ("bpw:4.", "not a number"),
            ("bpw:3", "outside"),
            ("bpw:99", "outside"),
            ("bpw:5:calib:calib", "given twice"),
            ("bpw:5:gptq", "unknown bpw option ':gptq'"),
        ] {
            let e = Precision::parse(bad).unwrap_err();
            assert!(matches!(e, KwkError::InvalidArgument(_)), "{bad}");
            let e = e.to_string();
            assert!(e.contains(want) && e.contains(bad), "{bad}: {e}");
            assert!(
                e.contains(&format!("from {lo} to {hi}"))
                    || want.contains("twice")
                    || want.contains("option"),
                "{bad}: {e}"
            );
        }
        // Just below the smallest grid and just above the largest.
        let below = format!("bpw:{:.2}", lo - 0.01);
        let above = format!("bpw:{:.2}", hi + 0.01);
        for s in [below, above] {
            let e = Precision::parse(&s).unwrap_err().to_string();
            assert!(e.contains("outside"), "{s}: {e}");
        }
    }

    #[test]
    fn rejects_unknown_names_and_options_listing_the_valid_ones() {
        for bad in [
            "fp16",
            "int4:g48",
            "int4:mix4",
            "bf16:g32",
            "int4:g32:g64",
            "int4:calib:calib",
            "",
        ] {
            let e = Precision::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(bad.split(':').next().unwrap())
                    || e.contains("given twice")
                    || e.contains("two group"),
                "{bad}: {e}"
            );
            assert!(matches!(
                Precision::parse(bad),
                Err(KwkError::InvalidArgument(_))
            ));
        }
        let e = Precision::parse("fp16").unwrap_err().to_string();
        assert!(e.contains("float32") && e.contains("int6[:g32"), "{e}");
    }
}
