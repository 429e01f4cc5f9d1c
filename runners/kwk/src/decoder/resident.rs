//! How much memory a decoder needs resident, estimated from the config alone before any
//! weight is read, and how much the machine has, so a build that cannot fit is refused
//! with both numbers instead of running into the OOM killer.
//!
//! The estimate ([`resident_need`]) follows how [`super::KwkDecoder`] builds:
//!
//! - **weights**: int8 and int4 without calibration, built from a file
//!   ([`Build::FromHeader`]), stream the source one layer at a time: the packed weights
//!   plus two float32 copies of the largest layer (read and equalised). Every other build
//!   holds the whole model as float32 masters while it packs: masters plus packed weights
//!   (float32 packs a second float32 copy, bf16 a bfloat16 one).
//! - **calibration** (`int8:calib`, `int4:gptq`, ...): a float32 decoder of the model
//!   (another float32 copy), the calibration tokens' residual streams, and the Hessians
//!   (all layers' when GPTQ keeps them, else one layer's), in f64.
//! - **KV cache**: K and V of every layer for `max_cache_len` positions (rounded up to the
//!   key panels) in the row's cache precision, as the cache allocates it
//!   ([`KvPrecision::cache_bytes`]: 4 bytes a value for f32, 2 for f16 and bf16, and for
//!   q8 a code plus a float32 scale per 32 values, 36/32; head dimensions padded as the
//!   layouts pad them, a Gemma 3 local layer's ring).
//!
//! Packed sizes per parameter are upper bounds of what the formats store (codes, scales,
//! the sensitivity mix's wider tensors): int8 8.5 bits, int4 6.5 bits at group 32 (less
//! for larger groups). Activations and scratch buffers are small beside these and not
//! counted; hence "about".
//!
//! The machine's side ([`available_memory`]) is Linux's `MemAvailable` (/proc/meminfo);
//! elsewhere there is no check. `KWK_MEMORY_CHECK=0` turns the check off;
//! `KWK_TEST_MEM_AVAILABLE_BYTES` (a testing override) replaces `MemAvailable`.

use super::KvPrecision;
use crate::format::Precision;
use crate::model::cost::{layer_params, stored_params};
use crate::model::ModelConfig;
use crate::quantize::gptq::KEPT_HESSIAN_BYTES;

/// Environment variable that turns the memory check off when set to `0`.
pub const MEMORY_CHECK_ENV: &str = "KWK_MEMORY_CHECK";

/// Testing override of the available memory, in bytes (replaces `MemAvailable`).
pub const TEST_AVAILABLE_ENV: &str = "KWK_TEST_MEM_AVAILABLE_BYTES";

/// Calibration tokens a calibrated build runs at most.
const CALIBRATION_TOKENS: u64 = super::CALIBRATION_TOKENS as u64;

/// How the decoder is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// [`super::KwkDecoder::from_header`]: int8/int4 without calibration stream the source.
    FromHeader,
    /// From float32 masters held whole ([`super::KwkDecoder::from_weights`], the Python
    /// binding, and every calibrated or floating-point format).
    FromWeights,
}

/// Whether a build reads the whole model as float32 masters (else it streams layers).
pub fn holds_float32_masters(precision: &Precision, build: Build) -> bool {
    build == Build::FromWeights || !precision.is_quantized() || precision.needs_calibration()
}

/// The estimated resident bytes of one decoder's build and use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidentNeed {
    /// Weights held at the build's peak (masters and packed, or packed and one layer).
    pub weights: u64,
    /// Whether `weights` includes the whole model as float32 masters.
    pub float32_masters: bool,
    /// Weights the decoder keeps once built (what stays resident after the build).
    pub packed: u64,
    pub kv_cache: u64,
    /// Calibration's float32 decoder, residual streams and Hessians (0 without).
    pub calibration: u64,
}

impl ResidentNeed {
    /// Peak bytes: the build's weights, calibration and the KV cache.
    pub fn total(&self) -> u64 {
        self.weights + self.calibration + self.kv_cache
    }

    /// Bytes that stay resident once built (packed weights and KV cache).
    pub fn kept(&self) -> u64 {
        self.packed + self.kv_cache
    }

    /// `weights 28.7 GB as float32 while packing, KV cache 0.4 GB` (and calibration).
    pub fn parts(&self) -> String {
        let mut s = format!(
            "weights {} {}, KV cache {}",
            gb(self.weights),
            if self.float32_masters {
                "as float32 while packing"
            } else {
                "packed"
            },
            gb(self.kv_cache)
        );
        if self.calibration > 0 {
            s.push_str(&format!(", calibration {}", gb(self.calibration)));
        }
        s
    }
}

/// `12.3 GB` (decimal gigabytes, one decimal).
pub fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// Packed bytes per parameter of `precision`, an upper bound (see the module doc).
fn packed_bytes_per_param(precision: &Precision) -> f64 {
    match precision {
        Precision::Float32 => 4.0,
        Precision::Bf16 => 2.0,
        Precision::Int8(_) => 8.5 / 8.0,
        // Codes, a scale and minimum per group, the mix's wider tensors.
        Precision::LowBit(o) => (o.bits.get() as f64 + 80.0 / o.group_size.max(1) as f64) / 8.0,
        // The budget is met within 0.05 bits per weight, float vectors included.
        Precision::Bpw(o) => (o.bits() + 0.05) / 8.0,
    }
}

/// The estimated resident need of a decoder of `c` in `precision` with a KV cache of
/// `max_cache_len` positions in `kv`, built as `build` says.
pub fn resident_need(
    c: &ModelConfig,
    precision: &Precision,
    kv: KvPrecision,
    max_cache_len: usize,
    build: Build,
) -> ResidentNeed {
    let n = stored_params(c) as f64;
    let packed = (n * packed_bytes_per_param(precision)) as u64;
    let masters = holds_float32_masters(precision, build);
    let weights = if masters {
        4 * stored_params(c) + packed
    } else {
        packed + 2 * 4 * layer_params(c)
    };
    let calibration = if precision.needs_calibration() {
        let d = c.hidden_size as u64;
        let q = (c.n_heads * c.head_dim) as u64;
        let ffn = c.intermediate_size.max(c.moe_intermediate_size) as u64;
        let layer_hessians = 8 * (2 * d * d + q * q + ffn * ffn);
        let hessians = if precision.gptq() {
            (layer_hessians * c.n_layers as u64)
                .min(KEPT_HESSIAN_BYTES as u64)
                .max(layer_hessians)
        } else {
            layer_hessians
        };
        4 * stored_params(c) + CALIBRATION_TOKENS * d * 4 + hessians
    } else {
        0
    };
    ResidentNeed {
        weights,
        float32_masters: masters,
        packed,
        kv_cache: kv.cache_bytes(c, max_cache_len),
        calibration,
    }
}

/// Memory the machine has for new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    /// Where the figure comes from (`MemAvailable`, or the testing override's name).
    pub source: &'static str,
}

/// `MemAvailable` from /proc/meminfo (or [`TEST_AVAILABLE_ENV`]); `None` when the check
/// is off ([`MEMORY_CHECK_ENV`]`=0`), or the figure is unknown (not Linux).
pub fn available_memory() -> Option<Available> {
    if std::env::var(MEMORY_CHECK_ENV).is_ok_and(|v| v.trim() == "0") {
        return None;
    }
    if let Ok(v) = std::env::var(TEST_AVAILABLE_ENV) {
        return v.trim().parse().ok().map(|bytes| Available {
            bytes,
            source: TEST_AVAILABLE_ENV,
        });
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_available(&text).map(|bytes| Available {
        bytes,
        source: "MemAvailable",
    })
}

/// The `MemAvailable:` line of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(value * 1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// `Err(message)` when `what` (e.g. `int4 of model.gguf`) needs more than the machine has
/// available beyond `held` bytes that earlier decoders of the same run keep: `what needs
/// about 31.2 GB resident (weights ...); this machine has 22.9 GB available
/// (MemAvailable) — {hint}`. `Ok` when it fits or there is no figure to check against.
pub fn check_fits(
    what: &str,
    need: &ResidentNeed,
    held: u64,
    available: Option<Available>,
    hint: &str,
) -> Result<(), String> {
    let Some(avail) = available else {
        return Ok(());
    };
    let total = need.total() + held;
    if total <= avail.bytes {
        return Ok(());
    }
    let held_part = if held > 0 {
        format!(", {} kept by the rows before it", gb(held))
    } else {
        String::new()
    };
    Err(format!(
        "{what} needs about {} resident ({}{held_part}); this machine has {} available ({}) — {hint}",
        gb(total),
        need.parts(),
        gb(avail.bytes),
        avail.source
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Architecture, RopeScaling};

    /// Llama-shaped config: `d`, `ffn`, layers, heads, kv heads, vocab (head_dim d/heads).
    fn llama(
        d: usize,
        ffn: usize,
        layers: usize,
        heads: usize,
        kv: usize,
        vocab: usize,
        tied: bool,
    ) -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            hidden_size: d,
            intermediate_size: ffn,
            n_layers: layers,
            n_heads: heads,
            n_kv_heads: kv,
            head_dim: d / heads,
            vocab_size: vocab,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 8192,
            tie_word_embeddings: tied,
            n_experts: 0,
            experts_per_token: 0,
            moe_intermediate_size: 0,
            shared_expert_intermediate_size: 0,
            norm_topk_prob: true,
            sliding_window: None,
            bos_token_id: None,
            eos_token_ids: vec![],
            gemma3: None,
        }
    }

    fn smollm2_135m() -> ModelConfig {
        llama(576, 1536, 30, 9, 3, 49152, true)
    }

    fn smollm2_1_7b() -> ModelConfig {
        llama(2048, 8192, 24, 32, 32, 49152, true)
    }

    fn llama_7b() -> ModelConfig {
        llama(4096, 11008, 32, 32, 32, 32000, false)
    }

    #[test]
    fn parameter_counts_of_known_shapes() {
        // SmolLM2-135M: 134.5 M parameters (norms and all), 1.7B: 1.71 G, Llama-2-7B: 6.74 G.
        let n = stored_params(&smollm2_135m());
        assert!((134_000_000..135_000_000).contains(&n), "{n}");
        let n = stored_params(&smollm2_1_7b());
        assert!((1_700_000_000..1_720_000_000).contains(&n), "{n}");
        let n = stored_params(&llama_7b());
        assert!((6_730_000_000..6_750_000_000).contains(&n), "{n}");
    }

    #[test]
    fn estimates_of_known_shapes() {
        let f32 = Precision::Float32;
        let int4 = Precision::parse("int4").unwrap();
        let int8 = Precision::INT8;
        let c = llama_7b();
        let n = stored_params(&c);
        // float32: masters and panels, 8 bytes per parameter; KV 2 x 32 x 4096 x 4 bytes
        // per position = 1 MiB, 512 positions.
        let need = resident_need(&c, &f32, KvPrecision::F32, 512, Build::FromHeader);
        assert_eq!(need.weights, 8 * n);
        assert_eq!(need.kv_cache, 512 << 20);
        assert!(need.float32_masters && need.calibration == 0);
        // int4 streams: 6.5 bits a parameter and two float32 copies of one layer.
        let need = resident_need(&c, &int4, KvPrecision::F32, 512, Build::FromHeader);
        assert!(!need.float32_masters);
        let per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008;
        assert_eq!(need.weights, (n as f64 * 6.5 / 8.0) as u64 + 8 * per_layer);
        // From weights (the Python binding), int8 holds the masters too.
        let need = resident_need(&c, &int8, KvPrecision::F32, 512, Build::FromWeights);
        assert_eq!(need.weights, 4 * n + (n as f64 * 8.5 / 8.0) as u64);
        // Calibration adds a float32 decoder, residual streams and Hessians.
        let gptq = Precision::parse("int4:gptq").unwrap();
        let need = resident_need(&c, &gptq, KvPrecision::F32, 512, Build::FromHeader);
        assert!(need.float32_masters);
        let layer_h = 8 * (3 * 4096 * 4096 + 11008 * 11008);
        assert_eq!(
            need.calibration,
            4 * n + 8192 * 4096 * 4 + (32 * layer_h).min(1 << 30).max(layer_h)
        );
    }

    /// Neither SmolLM2-135M nor the 1.7B shape is refused on a 23 GiB machine with 20 GB
    /// available, in any format, with the harness's default contexts; a 7B float32 row
    /// and a 2^27-token KV cache are.
    #[test]
    fn small_models_fit_and_big_ones_do_not() {
        let avail = Some(Available {
            bytes: 20_000_000_000,
            source: "test",
        });
        for c in [smollm2_135m(), smollm2_1_7b()] {
            for p in ["float32", "bf16", "int8", "int4", "int4:gptq", "int8:calib"] {
                let p = Precision::parse(p).unwrap();
                for build in [Build::FromHeader, Build::FromWeights] {
                    let need = resident_need(&c, &p, KvPrecision::F32, 4096, build);
                    check_fits("row", &need, 0, avail, "hint").unwrap();
                }
            }
        }
        let need = resident_need(
            &llama_7b(),
            &Precision::Float32,
            KvPrecision::F32,
            512,
            Build::FromHeader,
        );
        let e = check_fits(
            "float32 of model.gguf",
            &need,
            0,
            avail,
            "use a smaller model",
        )
        .unwrap_err();
        assert!(
            e.starts_with("float32 of model.gguf needs about 54.4 GB resident (weights 53.9 GB as float32 while packing, KV cache 0.5 GB); this machine has 20.0 GB available (test) — use a smaller model"),
            "{e}"
        );
        let need = resident_need(
            &smollm2_135m(),
            &Precision::INT8,
            KvPrecision::F32,
            1 << 27,
            Build::FromWeights,
        );
        assert!(need.kv_cache > 30_000_000_000, "{}", need.kv_cache);
        assert!(check_fits("KV", &need, 0, avail, "h").is_err());
        // No figure (not Linux, or the check turned off): no refusal.
        assert!(check_fits("KV", &need, 0, None, "h").is_ok());
        // What earlier rows keep counts and is named.
        let small = resident_need(
            &smollm2_135m(),
            &Precision::INT8,
            KvPrecision::F32,
            512,
            Build::FromHeader,
        );
        let e = check_fits("int8", &small, 19_900_000_000, avail, "h").unwrap_err();
        assert!(e.contains("19.9 GB kept by the rows before it"), "{e}");
    }

    /// The cache is sized at the row's precision, as the decoder allocates it: SmolLM2-135M
    /// (30 layers, 3 KV heads of 64) at 4096 positions holds 30 × 3 × 4096 × 128 values,
    /// 4 bytes each in f32, 2 in f16 and bf16, 36/32 in q8 (a code each and an f32 scale
    /// per 32); the weights do not change with it.
    #[test]
    fn the_kv_cache_is_sized_at_its_precision() {
        let c = smollm2_135m();
        let values = 30 * 3 * 4096 * 128u64;
        let need = |kv| resident_need(&c, &Precision::INT8, kv, 4096, Build::FromHeader);
        assert_eq!(need(KvPrecision::F32).kv_cache, values * 4);
        assert_eq!(need(KvPrecision::F16).kv_cache, values * 2);
        assert_eq!(need(KvPrecision::Bf16).kv_cache, values * 2);
        assert_eq!(need(KvPrecision::Q8).kv_cache, values * 36 / 32);
        assert_eq!(
            need(KvPrecision::Q8).weights,
            need(KvPrecision::F32).weights
        );
        assert_eq!(
            need(KvPrecision::F32).total() - need(KvPrecision::Q8).total(),
            values * 4 - values * 36 / 32
        );
        // 4095 positions allocate as many (the cache rounds up to panels of 16).
        let odd = resident_need(
            &c,
            &Precision::INT8,
            KvPrecision::Q8,
            4095,
            Build::FromHeader,
        );
        assert_eq!(odd.kv_cache, values * 36 / 32);
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   22900000 kB\n";
        assert_eq!(mem_available(text), Some(22_900_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: x kB\n"), None);
    }
}
