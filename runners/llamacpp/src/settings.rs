//! The settings that change llama.cpp's results or speed, pinned explicitly on every run
//! instead of left to llama.cpp's defaults (which differ between tools, builds, machines and
//! `LLAMA_ARG_*` variables).

use crate::engine::Engine;
use crate::error::{Error, Result};
use std::fmt;

/// KV cache element type (`-ctk`/`-ctv`). llama.cpp's default is f16; f32 gives exact parity
/// with a float32 decoder (with flash attention off); q8_0 and q4_0 are its block-quantized
/// caches (34 and 18 bytes per 32 values; a quantized V cache needs flash attention, which
/// every type but f32 runs with here, [`KvType::default_flash_attn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// The name llama.cpp's `-ctk`/`-ctv` take and llama-bench's `type_k` reports.
    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Bytes one cached value takes (a block's scale shared out over its 32 values).
    pub fn bytes_per_value(self) -> f64 {
        match self {
            KvType::F32 => 4.0,
            KvType::F16 | KvType::Bf16 => 2.0,
            KvType::Q8_0 => 34.0 / 32.0,
            KvType::Q4_0 => 18.0 / 32.0,
        }
    }

    /// The type llama-bench runs with for this one: itself, or f16 for f32 (llama-bench
    /// rejects `-ctk f32`).
    pub fn for_bench(self) -> KvType {
        match self {
            KvType::F32 => KvType::F16,
            t => t,
        }
    }

    pub fn parse(s: &str) -> Result<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "bf16" => Ok(KvType::Bf16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            other => Err(Error::InvalidSettings(format!(
                "unknown KV cache type `{other}`; use one of f32, f16, bf16, q8_0, q4_0"
            ))),
        }
    }

    /// Flash attention as llama.cpp resolves `-fa auto` on a CPU-only build (on: every CPU
    /// op is supported, src/llama-context.cpp `resolve`), except with an f32 cache, where we
    /// turn it off: the non-flash path with an f32 cache is the one that matches a float32
    /// reference within 5e-7 (tests/live.rs, `tiny_fixtures_perplexity_equals_golden`).
    pub fn default_flash_attn(self) -> bool {
        self != KvType::F32
    }

    /// Whether llama.cpp runs this cache with flash attention off: the float caches do; the
    /// block-quantized ones (q8_0, q4_0) need it on (a quantized V cache is read only by the
    /// flash-attention kernel; both llama-benches refuse `-fa 0` with them, "failed to
    /// create context").
    pub fn allows_flash_attn_off(self) -> bool {
        matches!(self, KvType::F32 | KvType::F16 | KvType::Bf16)
    }
}

/// Which flash-attention settings llama-bench measures (`--llama-fa`). Neither is the
/// faster everywhere: on CPU `-fa 1` wins prompt processing and `-fa 0` generation deep in
/// the cache, so `Best` measures both in one invocation (`-fa 0,1`) and each test keeps
/// the faster. llama-perplexity is not concerned (its `-fa` is [`ComputeSettings`]').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchFlashAttn {
    /// Both settings where the cache allows flash attention off, else on alone.
    Best,
    On,
    Off,
}

impl BenchFlashAttn {
    pub fn as_str(self) -> &'static str {
        match self {
            BenchFlashAttn::Best => "best",
            BenchFlashAttn::On => "on",
            BenchFlashAttn::Off => "off",
        }
    }

    /// The `-fa` values llama-bench runs with a `kv` cache, in llama-bench's order (0
    /// before 1); an error for `Off` with a cache that needs flash attention.
    pub fn settings(self, kv: KvType) -> Result<Vec<bool>> {
        let kv = kv.for_bench();
        match self {
            BenchFlashAttn::Best if kv.allows_flash_attn_off() => Ok(vec![false, true]),
            BenchFlashAttn::Best | BenchFlashAttn::On => Ok(vec![true]),
            BenchFlashAttn::Off if kv.allows_flash_attn_off() => Ok(vec![false]),
            BenchFlashAttn::Off => Err(Error::InvalidSettings(format!(
                "a {kv} KV cache needs flash attention on; llama-bench cannot run it with -fa 0"
            ))),
        }
    }
}

impl fmt::Display for BenchFlashAttn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `-fa` values as llama-bench takes a list of them: `0,1`.
pub fn fa_list(settings: &[bool]) -> String {
    settings
        .iter()
        .map(|&on| if on { "1" } else { "0" })
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Threads, KV cache type and flash attention: what every llama.cpp invocation pins.
/// GPU offload is always off (`-ngl 0`): this crate measures CPU inference.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ComputeSettings {
    /// `-t` (and `-tb` for llama-perplexity, whose batch threads default to `-t`).
    pub threads: usize,
    pub kv_type: KvType,
    /// `-fa on|off` (llama-perplexity) / `-fa 1|0` (llama-bench).
    pub flash_attn: bool,
}

impl ComputeSettings {
    pub fn new(threads: usize, kv_type: KvType) -> Self {
        Self {
            threads,
            kv_type,
            flash_attn: kv_type.default_flash_attn(),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.threads == 0 {
            return Err(Error::InvalidSettings(
                "threads must be at least 1 (llama.cpp reads 0 as \"all cores\")".into(),
            ));
        }
        Ok(())
    }

    /// `-t T -tb T -ngl 0 -fa on|off -ctk K -ctv K` in llama-perplexity's syntax (and
    /// ik_llama.cpp's, which adds its speed settings, [`crate::ik::PERPLEXITY_SPEED_ARGS`]).
    pub(crate) fn common_args(&self) -> Vec<String> {
        let t = self.threads.to_string();
        vec![
            "-t".into(),
            t.clone(),
            "-tb".into(),
            t,
            "-ngl".into(),
            "0".into(),
            "-fa".into(),
            if self.flash_attn { "on" } else { "off" }.into(),
            "-ctk".into(),
            self.kv_type.as_str().into(),
            "-ctv".into(),
            self.kv_type.as_str().into(),
        ]
    }
}

/// The settings a GGUF row of `engine` passes its tools beyond the model, text, sizes and
/// threads, for the report: llama-perplexity's flash attention and KV cache (`kv`, `fa`),
/// and when `bench` holds llama-bench's `-fa` values, llama-bench's (the same KV type, f16
/// for f32, those `-fa` values), each with ik_llama.cpp's speed settings. E.g.
/// `llama-perplexity -fa on -ctk f16 -ctv f16 -rtr; llama-bench -fa 0,1 -ctk f16 -ctv f16 -rtr 1`.
pub fn described(engine: Engine, kv: KvType, fa: bool, bench: Option<&[bool]>) -> String {
    let extra = |args: &[&str]| match engine {
        Engine::LlamaCpp => String::new(),
        Engine::Ik => format!(" {}", args.join(" ")),
    };
    let ppl = format!(
        "llama-perplexity -fa {} -ctk {kv} -ctv {kv}{}",
        if fa { "on" } else { "off" },
        extra(crate::ik::PERPLEXITY_SPEED_ARGS)
    );
    if let Some(bench_fa) = bench {
        let bkv = kv.for_bench();
        format!(
            "{ppl}; llama-bench -fa {} -ctk {bkv} -ctv {bkv}{}",
            fa_list(bench_fa),
            extra(crate::ik::BENCH_SPEED_ARGS)
        )
    } else {
        ppl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn described_settings_name_each_engines_flags() {
        assert_eq!(
            described(Engine::Ik, KvType::F16, true, Some(&[false, true])),
            "llama-perplexity -fa on -ctk f16 -ctv f16 -rtr; llama-bench -fa 0,1 -ctk f16 -ctv f16 -rtr 1"
        );
        assert_eq!(
            described(Engine::LlamaCpp, KvType::Q8_0, true, Some(&[true])),
            "llama-perplexity -fa on -ctk q8_0 -ctv q8_0; llama-bench -fa 1 -ctk q8_0 -ctv q8_0"
        );
        assert_eq!(
            described(Engine::LlamaCpp, KvType::F32, false, None),
            "llama-perplexity -fa off -ctk f32 -ctv f32"
        );
    }

    /// `best` is both settings for the float caches (f32 as llama-bench's f16) and on alone
    /// for the quantized ones, where `off` is refused.
    #[test]
    fn bench_flash_attn_settings_per_cache() {
        use BenchFlashAttn::*;
        for kv in [KvType::F32, KvType::F16, KvType::Bf16] {
            assert_eq!(Best.settings(kv).unwrap(), [false, true], "{kv}");
            assert_eq!(Off.settings(kv).unwrap(), [false], "{kv}");
            assert_eq!(On.settings(kv).unwrap(), [true], "{kv}");
        }
        for kv in [KvType::Q8_0, KvType::Q4_0] {
            assert_eq!(Best.settings(kv).unwrap(), [true], "{kv}");
            assert_eq!(On.settings(kv).unwrap(), [true], "{kv}");
            let e = Off.settings(kv).unwrap_err().to_string();
            assert!(e.contains(kv.as_str()) && e.contains("-fa 0"), "{e}");
        }
        assert_eq!(fa_list(&[false, true]), "0,1");
    }
}
