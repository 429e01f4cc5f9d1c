//! [`Precision`]: the weight format a decoder runs in, parsed from the names users type
//! (`float32`, `bf16`, `int8`/`balanced` with `:calib` or `:gptq`,
//! `int4[:gG][:mixB][:calib][:gptq[:act]]`, and the size-targeted `bpw:X[:calib]`).

use crate::error::{KwkError, Result};

/// Weights per int4 scale group when `int4` is given without `:gG`: 32. On SmolLM2-135M
/// (distributed as Q4_1: 32-weight groups with scale and minimum) g32 reproduces the
/// weights and g64/g128 do not; the int4 kernels do one float step per 32-column block at
/// any group size, so g32 costs 0.5-0.75 bits per weight and no speed (measured in the
/// quantization work's report).
pub const DEFAULT_INT4_GROUP: usize = 32;

/// Options of the `int4` format: `int4[:gG][:mixB][:calib][:gptq[:act]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4Options {
    /// Weights per scale group: 32, 64 or 128.
    pub group_size: usize,
    /// Bits of the sensitive tensors (6 or 8); `None` picks by model size
    /// (6 from 1e9 parameters, 8 below).
    pub mix_bits: Option<u8>,
    /// Fit scales to activations of the calibration text.
    pub calibrate: bool,
    /// GPTQ rounding on top of calibration.
    pub gptq: bool,
    /// GPTQ takes the columns in descending order of their calibration activity, whole
    /// scale groups at a time (`:act`; only with `:gptq`; see `quantize::gptq`).
    pub act_order: bool,
}

impl Default for Int4Options {
    fn default() -> Self {
        Int4Options {
            group_size: DEFAULT_INT4_GROUP,
            mix_bits: None,
            calibrate: false,
            gptq: false,
            act_order: false,
        }
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
    Int4(Int4Options),
    /// A budget of bits per weight spent by sensitivity (`bpw:X[:calib]`).
    Bpw(BpwOptions),
}

const VALID: &str = "float32 (f32), bf16, int8 (balanced)[:calib|:gptq], \
     int4[:g32|:g64|:g128][:mix6|:mix8][:calib][:gptq[:act]], bpw:X[:calib]";

impl Precision {
    /// Plain `int8` (no calibration).
    pub const INT8: Precision = Precision::Int8(Int8Options {
        calibrate: false,
        gptq: false,
    });

    /// Whether building this format needs calibration tokens (`int8:calib`, `int8:gptq`,
    /// `int4:calib`, `int4:gptq`).
    pub fn needs_calibration(&self) -> bool {
        match self {
            Precision::Int8(o) => o.calibrate || o.gptq,
            Precision::Int4(o) => o.calibrate || o.gptq,
            Precision::Bpw(o) => o.calibrate,
            Precision::Float32 | Precision::Bf16 => false,
        }
    }

    /// Whether the layers' linears are rounded by GPTQ (`int8:gptq`, `int4:gptq`).
    pub fn gptq(&self) -> bool {
        match self {
            Precision::Int8(o) => o.gptq,
            Precision::Int4(o) => o.gptq,
            Precision::Float32 | Precision::Bf16 | Precision::Bpw(_) => false,
        }
    }

    /// Whether the weights are quantized (`int8`, `int4`, `bpw` with any options).
    pub fn is_quantized(&self) -> bool {
        matches!(
            self,
            Precision::Int8(_) | Precision::Int4(_) | Precision::Bpw(_)
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
            Precision::Int8(_) | Precision::Int4(_) | Precision::Bpw(_) => WeightKernels::Quantized,
        }
    }

    /// Parses a format name as users type it: `float32`, `bf16`, `int8` (`balanced`),
    /// `int8:calib`, `int8:gptq`, `int4`, `int4:g64`, `int4:mix8`, `int4:calib`,
    /// `int4:gptq` (options combine, in any order, each at most once), `bpw:4.5`,
    /// `bpw:4.5:calib`.
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
            "int4" => {
                let mut o = Int4Options::default();
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
                            o.mix_bits = Some(opt[3..].parse().expect("matched digit"));
                        }
                        "calib" => o.calibrate = true,
                        "gptq" => o.gptq = true,
                        "act" => o.act_order = true,
                        _ => {
                            return Err(KwkError::InvalidArgument(format!(
                                "unknown int4 option ':{opt}' in '{spec}'; valid formats: {VALID}"
                            )))
                        }
                    }
                }
                if o.act_order && !o.gptq {
                    return Err(KwkError::InvalidArgument(format!(
                        "':act' orders GPTQ's columns, so it needs ':gptq' too (e.g. int4:gptq:act), got '{spec}'"
                    )));
                }
                Ok(Precision::Int4(o))
            }
            "bpw" => parse_bpw(spec, &options),
            _ => Err(unknown()),
        }
    }

    /// The canonical spelling (`parse(p.name()) == p`): `float32`, `bf16`, `int8`,
    /// `int8:calib`, `int8:gptq`, and `int4` followed by the options that differ from the
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
            Precision::Int4(o) => {
                let mut s = String::from("int4");
                if o.group_size != DEFAULT_INT4_GROUP {
                    s += &format!(":g{}", o.group_size);
                }
                if let Some(b) = o.mix_bits {
                    s += &format!(":mix{b}");
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
    if whole.is_empty() || !digits(whole) || !digits(frac) || frac.len() > 2 || whole.len() > 3 {
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
            Precision::Int4(Int4Options {
                group_size: 64,
                mix_bits: Some(6),
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
            Precision::Int4(Int4Options::default())
        );
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
            ("bpw:4.", "outside"),
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
        assert!(e.contains("float32") && e.contains("int4[:g32"), "{e}");
    }
}
