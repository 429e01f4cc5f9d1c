//! ik_llama.cpp's dialect: what its tools (the ik-llama-cpp-python 0.1.5 tree,
//! `examples/...`) take and print where they differ from mainline llama.cpp's, one item per
//! difference. The requests and the rest of the parsing are shared
//! ([`crate::perplexity`], [`crate::bench`], [`crate::tokenize`]); its perplexity summary's
//! parser is [`crate::perplexity::parse_perplexity_ik`], beside mainline's. A leaf of the
//! crate: the others read it.
//!
//! - **Speed settings.** Its recommended CPU settings (docs/parameters.md): run-time
//!   repacking of the weights into its row-interleaved layouts (`-rtr`, off by default;
//!   llama-bench `-rtr 1`) and flash attention (`-fa`, on by default in the common tools,
//!   `-fa 0|1` in llama-bench, whose list `-fa 0,1` it takes like mainline's). Its fused
//!   up-gate and fused mul-multi-add paths are on by default and left so. Both tools get
//!   the repacking ([`PERPLEXITY_SPEED_ARGS`], [`BENCH_SPEED_ARGS`]); llama-bench's `-fa`
//!   is the caller's ([`crate::bench::BenchRequest::flash_attn`]).
//! - **llama-perplexity** prints its result with `printf` on stdout, `Final estimate: PPL
//!   over N chunks for n_ctx=C = X +/- Y` (perplexity.cpp:685), not mainline's logger line on
//!   stderr; its log lines carry no timestamps; its errors are plain `perplexity: failed to
//!   eval` lines (perplexity.cpp:622), and `Unexpected negative standard deviation of
//!   log(prob)` goes to stdout (perplexity.cpp:687). The `[k]x,` running values, the
//!   `calculating perplexity over ...` line, the too-short message and the
//!   KL-divergence base file are mainline's.
//! - **`system_info:`** lists `NAME = 0|1` pairs directly (llama.cpp's
//!   `llama_print_system_info`), without mainline's per-backend `CPU :` part.
//! - **llama-bench** has no `--progress`, prints no `n_depth`, and reports `repack` (whether
//!   the weights were repacked) and `flash_attn`, which [`check_bench_settings`] checks.
//! - **llama-tokenize** processes no escapes and has no `--no-escape`
//!   ([`TOKENIZE_ARGS`]).

use regex::Regex;
use std::sync::OnceLock;

/// The ik-llama-cpp-python source distribution `scripts/setup-ik-llama-cpp.sh` builds.
pub const PINNED_PYPI_VERSION: &str = "0.1.5";

/// What ik_llama.cpp's llama-perplexity `--help` must list (its syntax), with what it
/// stands for.
pub const PERPLEXITY_NEEDS: &[(&str, &str)] = &[
    ("--flash-attn (auto|on|off", "`-fa on|off`"),
    ("--run-time-repack", "`-rtr`"),
    ("--chunks", "`--chunks`"),
    ("--kl-divergence-base", "`--kl-divergence-base`"),
    ("--kl-divergence ", "`--kl-divergence`"),
    ("--cache-type-k", "`-ctk`"),
    ("--cache-type-v", "`-ctv`"),
    ("--ubatch-size", "`-ub`"),
    ("--threads-batch", "`-tb`"),
    // `-ngl` is accepted by every build (common.cpp:1411) but listed only by GPU builds.
];
/// What its llama-bench `--help` must list.
pub const BENCH_NEEDS: &[(&str, &str)] = &[
    ("json", "`-o json`"),
    ("--flash-attn <0|1>", "`-fa 0|1`"),
    ("--run-time-repack <0|1>", "`-rtr 0|1`"),
    ("--cache-type-k", "`-ctk`"),
    ("--cache-type-v", "`-ctv`"),
    ("--repetitions", "`-r`"),
    ("--n-gpu-layers", "`-ngl`"),
    ("--ubatch-size", "`-ub`"),
];
/// What its llama-tokenize must accept (its `--help` is not a list: the usage line).
pub const TOKENIZE_NEEDS: &[(&str, &str)] = &[
    ("--ids", "`--ids`"),
    ("--no-parse-special", "`--no-parse-special`"),
];

/// The speed settings added to every llama-perplexity run: run-time repacking.
pub const PERPLEXITY_SPEED_ARGS: &[&str] = &["-rtr"];
/// The same for llama-bench, in its `0|1` syntax.
pub const BENCH_SPEED_ARGS: &[&str] = &["-rtr", "1"];
/// llama-tokenize's flags: ids, special tokens not parsed (no escapes are processed).
pub const TOKENIZE_ARGS: &[&str] = &["--ids", "--no-parse-special"];

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("static regex"))
}

/// Error lines of an ik_llama.cpp llama-perplexity run: `...: failed to eval`,
/// `...: error: ...` on stderr, and the negative-deviation line on stdout.
pub(crate) fn error_lines(stdout: &str, stderr: &str) -> Vec<String> {
    static E: OnceLock<Regex> = OnceLock::new();
    let mut lines: Vec<String> = re(&E, r"(?m)^.*(?:failed to eval|: error: |error: ).*$")
        .find_iter(stderr)
        .map(|m| m.as_str().trim_end().to_string())
        .collect();
    lines.extend(
        stdout
            .lines()
            .filter(|l| l.contains("Unexpected negative standard deviation"))
            .map(|l| l.trim_end().to_string()),
    );
    lines
}

/// The features set to 1 on the `system_info:` line (`NAME = 1 | NAME = 0 | ...` after
/// the thread counts), in order; `None` without that line.
pub fn cpu_features(stderr: &str) -> Option<Vec<String>> {
    let line = stderr.lines().find(|l| l.contains("system_info:"))?;
    let features = line
        .split('|')
        .skip(1)
        .filter_map(|part| {
            let (name, value) = part.split_once('=')?;
            let name = name.trim();
            (value.trim() == "1" && !name.is_empty() && !name.contains(' '))
                .then(|| name.to_string())
        })
        .collect();
    Some(features)
}

/// Checks an ik_llama.cpp llama-bench JSON object ran with the speed settings asked for:
/// `repack` and `flash_attn` as requested (both are JSON booleans there).
pub fn check_bench_settings(
    raw: &serde_json::Value,
    flash_attn: bool,
) -> std::result::Result<(), String> {
    for (field, want) in [("repack", true), ("flash_attn", flash_attn)] {
        match raw.get(field).and_then(serde_json::Value::as_bool) {
            Some(got) if got == want => {}
            Some(got) => return Err(format!("`{field}` is {got}, asked for {want}")),
            None => return Err(format!("no boolean `{field}` field")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_info_features_without_a_cpu_part() {
        let stderr = "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | AVX = 1 | \
                      AVX_VNNI = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | NEON = 0 | \n";
        assert_eq!(
            cpu_features(stderr).unwrap(),
            ["AVX", "AVX_VNNI", "AVX2", "FMA"]
        );
        assert_eq!(cpu_features("nothing\n"), None);
    }

    #[test]
    fn bench_settings_are_checked() {
        let ok = serde_json::json!({"repack": true, "flash_attn": true});
        assert_eq!(check_bench_settings(&ok, true), Ok(()));
        let e = check_bench_settings(&ok, false).unwrap_err();
        assert!(e.contains("flash_attn"), "{e}");
        let e = check_bench_settings(&serde_json::json!({"flash_attn": true}), true).unwrap_err();
        assert!(e.contains("no boolean `repack`"), "{e}");
    }
}
