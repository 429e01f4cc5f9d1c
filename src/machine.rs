//! What the report says about where it was measured: the CPU model (from /proc/cpuinfo),
//! the instruction-set extensions the kernels care about and the kernel set in use (kwk's
//! probes), the kwk commit the harness was built
//! from (build.rs runs `git rev-parse HEAD`), UTC timestamps, and this process's resident
//! high-water mark (reset per row, Linux).

use std::time::{SystemTime, UNIX_EPOCH};

/// The CPU model name (`model name` in /proc/cpuinfo), or the architecture when unknown.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The CPU features the in-tree kernels care about that this CPU has (kwk's own probe).
pub fn isa_flags() -> Vec<String> {
    kwk::kernels::detected_flags()
        .into_iter()
        .map(String::from)
        .collect()
}

/// The kernel tier the in-tree decoder runs with (`KWK_ISA` respected) and the kernels of
/// each kind of weight on it, e.g. "vnni: float32 avx512f, bf16 avx512bf16, int8/int4
/// avx512vnni".
pub fn kernels_in_use() -> String {
    kwk::kernels::kernels_summary()
}

/// This machine's peaks on `threads` threads for the tier kwk runs (about a second), and
/// for the best tier too when `KWK_ISA` forced a lower one.
pub fn measure_peaks(threads: usize) -> (kwk::roofline::Peaks, Option<kwk::roofline::Peaks>) {
    use kwk::kernels::{active_isa, best_isa};
    use kwk::roofline as peaks;
    let active = peaks::measure(active_isa(), threads);
    let best = (best_isa() != active_isa()).then(|| peaks::measure(best_isa(), threads));
    (active, best)
}

/// The git commit of the tree this binary was built from, if build.rs could read it.
pub fn kwk_git_sha() -> Option<String> {
    option_env!("KWK_GIT_SHA")
        .filter(|s| !s.is_empty())
        .map(String::from)
}

/// Cores available to this process.
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Civil date (y, m, d) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The current UTC time as RFC 3339 (`2026-11-29T14:00:00Z`) and as a folder name
/// (`20261129-140000`).
pub fn utc_now() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    format_utc(secs)
}

fn format_utc(secs: i64) -> (String, String) {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let (hh, mm, ss) = (s / 3600, s % 3600 / 60, s % 60);
    (
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z"),
        format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}"),
    )
}

/// Resets this process's resident high-water mark (`VmHWM`) to its current resident size
/// by writing `5` to /proc/self/clear_refs (Linux 4.0 and later); false when that fails
/// (then [`peak_rss_bytes`] keeps counting from the process start).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's resident size now in bytes (`VmRSS`); `None` off Linux.
pub fn rss_bytes() -> Option<u64> {
    llamacpp::process::vm_rss_bytes("self")
}

/// The resident size this process had when this was first called (`console::run` calls
/// it first thing, before any text, tokenizer or model is read): the program's own share
/// of a row's peak, which a standalone engine process pays too.
pub fn startup_rss_bytes() -> Option<u64> {
    *STARTUP_RSS.get_or_init(rss_bytes)
}

static STARTUP_RSS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

/// This process's resident high-water mark in bytes (`VmHWM` of /proc/self/status) since
/// it started or since the last successful [`reset_peak_rss`]; `None` off Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    llamacpp::process::vm_hwm_bytes("self")
}

/// The machine's CPU counters now, for judging how quiet it was
/// ([`crate::protocol::steadiness`]); `None` where /proc cannot be read (not Linux).
pub fn cpu_snapshot() -> Option<crate::protocol::steadiness::Snapshot> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    let load = std::fs::read_to_string("/proc/loadavg").ok()?;
    crate::protocol::steadiness::Snapshot::parse(&stat, &own, &load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0).0, "1970-01-01T00:00:00Z");
        // 2026-11-29T14:26:46Z
        assert_eq!(
            format_utc(1_795_962_406),
            ("2026-11-29T14:26:46Z".into(), "20261129-142646".into())
        );
        assert_eq!(format_utc(951_782_400).0, "2000-02-29T00:00:00Z");
    }
}
