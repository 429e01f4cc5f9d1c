//! [`Precision`]: the weight format a decoder runs in, parsed from the names users type
//! (`float32`, `bf16`, `int8`/`balanced` with `:calib` or `:gptq`,
//! `int4[:gG][:mixB][:calib][:gptq[:act]]`).

use crate::error::{KwkError, Result};
use crate::kernels::quant::Bits;

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
    pub mix_bits: Option<Bits>,
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

/// The weight format a decoder runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Float32,
    Bf16,
    Int8(Int8Options),
    Int4(Int4Options),
}

const VALID: &str = "float32 (f32), bf16, int8 (balanced)[:calib|:gptq], \
     int4[:g32|:g64|:g128][:mix6|:mix8][:calib][:gptq[:act]]";

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
            Precision::Float32 | Precision::Bf16 => false,
        }
    }

    /// Whether the layers' linears are rounded by GPTQ (`int8:gptq`, `int4:gptq`).
    pub fn gptq(&self) -> bool {
        match self {
            Precision::Int8(o) => o.gptq,
            Precision::Int4(o) => o.gptq,
            Precision::Float32 | Precision::Bf16 => false,
        }
    }

    /// Whether the weights are quantized (`int8`, `int4` with any options).
    pub fn is_quantized(&self) -> bool {
        matches!(self, Precision::Int8(_) | Precision::Int4(_))
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
            Precision::Int8(_) | Precision::Int4(_) => WeightKernels::Quantized,
        }
    }

    /// Parses a format name as users type it: `float32`, `bf16`, `int8` (`balanced`),
    /// `int8:calib`, `int8:gptq`, `int4`, `int4:g64`, `int4:mix8`, `int4:calib`,
    /// `int4:gptq` (options combine, in any order, each at most once).
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
                            o.mix_bits = Some(if opt == "mix6" { Bits::B6 } else { Bits::B8 });
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
        }
    }
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
