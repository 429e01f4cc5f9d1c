//! `peak_rss_bytes` and `pack_peak_rss_bytes` per row, measured in this process
//! (`kwk_eval::run` in-process; this test binary holds one test, so nothing else allocates
//! meanwhile): every kwk row's run and build peaks are at least its packed bytes and at most
//! the process's peak virtual size (`VmPeak`, which the per-row reset of the resident
//! high-water mark does not touch), and the last row's own share is at most the resident
//! high-water mark read after the run (no reset since; up to the counters' per-CPU slack).

mod common;
use common::*;

/// A `/proc/self/status` field in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

#[cfg(target_os = "linux")]
#[test]
fn every_kwk_row_states_a_plausible_peak_rss() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let code = kwk_eval::run([
        "kwk-eval".into(),
        "--formats".into(),
        "float32,int8,int4".into(),
        "--ctx".into(),
        "64".into(),
        "--chunks".into(),
        "2".into(),
        "--no-speed".into(),
        "--threads".into(),
        "2".into(),
        "--no-pack-cache".into(),
        "--llm".into(),
        tiny_llama().into_os_string(),
        "--text".into(),
        eval_txt().into_os_string(),
        "--out".into(),
        out.clone().into_os_string(),
    ]);
    assert_eq!(code, 0);
    let (hwm, vm_peak) = (status_bytes("VmHWM:"), status_bytes("VmPeak:"));
    let text = std::fs::read_to_string(out.join("results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = v["runners"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for row in rows {
        let name = row["name"].as_str().unwrap();
        let peak = row["peak_rss_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: no peak_rss_bytes"));
        let packed = row["tensor_bytes"].as_u64().unwrap();
        assert!(peak >= packed, "{name}: peak {peak} < packed {packed}");
        assert!(peak <= vm_peak, "{name}: peak {peak} > VmPeak {vm_peak}");
        let build = row["pack_peak_rss_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: no pack_peak_rss_bytes"));
        assert!(
            build >= packed,
            "{name}: build peak {build} < packed {packed}"
        );
        assert!(
            build <= vm_peak,
            "{name}: build peak {build} > VmPeak {vm_peak}"
        );
    }
    // The kernel's resident counters are per-CPU approximations synced in batches, so two
    // readings of `VmHWM` can differ by a few pages either way (a CI run read the row's
    // peak 8 KiB above the later `VmHWM`); 1 MiB of slack keeps the check meaningful.
    let last = rows[2]["peak_rss_bytes"].as_u64().unwrap();
    let slack = 1 << 20;
    assert!(
        last <= hwm + slack,
        "int4: peak {last} > VmHWM {hwm} after the run (+{slack} slack)"
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("peak_rss_bytes"));
}
