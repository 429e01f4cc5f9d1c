//! Tests of the measuring passes: the roofline shares by hand.

use super::*;
use kwk::roofline::Peaks;

fn peaks(isa: &str, fp32: f64, int8: f64, read: f64) -> Peaks {
    Peaks {
        threads: 2,
        isa: isa.into(),
        fp32_gflops: fp32,
        fp32_instruction: "fma".into(),
        int8_gops: int8,
        int8_instruction: "dot".into(),
        bf16_gflops: None,
        read_gbps: read,
        read_gbps_probes: vec![read],
        read_buffer_bytes: 1 << 28,
        llc_bytes: None,
        llc_read_gbps: None,
        compute_probes: 1,
        seconds: 1.0,
    }
}

/// pp and tg shares by hand: the row's rate times the cost model's numerators over the
/// matching ceiling; an engine that picks its own kernels is put against the best tier.
#[test]
fn roofline_percentages_by_hand() {
    let model = kwk_fixtures::model_dir("tiny-llama");
    let config = kwk::model::ModelConfig::from_hf_config_json(&model.join("config.json")).unwrap();
    let spec = SpeedSpec {
        pp: 64,
        tg: 16,
        depth: 0,
        reps: 1,
        threads: 2,
    };
    let machine = Machine {
        cpu: "x".into(),
        isa: vec![],
        kernels: None,
        threads: 2,
        peaks: Some(peaks("avx2", 10.0, 40.0, 5.0)),
        peaks_best_tier: Some(peaks("vnni", 20.0, 80.0, 8.0)),
        steadiness: None,
    };
    let cost = |compute, best| RooflineCost {
        compute,
        weight_bytes_per_token: 1e6,
        kv_bytes_per_value: 4.0,
        best_kernels: best,
    };
    let roof = |row: &mut RunnerRecord, compute, best| {
        set_roofline(row, Some(&cost(compute, best)), &config, &spec, &machine)
    };
    let ops = kwk::model::cost::prompt_ops_per_token(&config, 64);
    let bytes = 1e6 + kwk::model::cost::kv_bytes_per_token(&config, 4.0, 0, 16);
    let mut row = RunnerRecord {
        pp_tokens_per_s: Some(1000.0),
        tg_tokens_per_s: Some(100.0),
        ..Default::default()
    };
    roof(&mut row, ComputeKind::Int8, false);
    let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9 * b.abs().max(1.0);
    assert!(close(row.pp_roofline_pct, 100.0 * 1000.0 * ops / 40e9));
    assert!(close(row.tg_roofline_pct, 100.0 * 100.0 * bytes / 5e9));
    roof(&mut row, ComputeKind::Fp32, true);
    assert!(close(row.pp_roofline_pct, 100.0 * 1000.0 * ops / 20e9));
    assert!(close(row.tg_roofline_pct, 100.0 * 100.0 * bytes / 8e9));
    // bf16 without a bf16 peak falls back to the fp32 ceiling.
    roof(&mut row, ComputeKind::Bf16, false);
    assert!(close(row.pp_roofline_pct, 100.0 * 1000.0 * ops / 10e9));
    assert_eq!(
        row.tg_roofline_paired_pct, None,
        "no probes around the repetitions"
    );
    // Paired: each repetition's rate over the bandwidth probed around it; the median
    // of 100·bytes/4e9, 120·bytes/3e9 and 90·bytes/6e9 is the first.
    row.tg_samples_tokens_per_s = vec![100.0, 120.0, 90.0];
    row.tg_samples_read_gbps = vec![4.0, 3.0, 6.0];
    roof(&mut row, ComputeKind::Int8, false);
    assert!(close(
        row.tg_roofline_paired_pct,
        100.0 * 100.0 * bytes / 4e9
    ));
    assert!(close(row.tg_roofline_pct, 100.0 * 100.0 * bytes / 5e9));
    // Probes that do not line up with the samples give no paired figure.
    row.tg_samples_read_gbps.pop();
    roof(&mut row, ComputeKind::Int8, false);
    assert_eq!(row.tg_roofline_paired_pct, None);
    assert_eq!(row.tg_ceiling.as_deref(), Some("dram"));
    // At a depth the prompt also attends to the cached positions, and a generated
    // token reads them.
    let deep = SpeedSpec {
        depth: 100,
        ..spec.clone()
    };
    set_roofline(
        &mut row,
        Some(&cost(ComputeKind::Int8, false)),
        &config,
        &deep,
        &machine,
    );
    let extra = 4.0 * (config.n_heads * config.head_dim * config.n_layers) as f64 * 100.0;
    assert!(close(row.pp_ops_per_token, ops + extra));
    let deep_bytes = 1e6 + kwk::model::cost::kv_bytes_per_token(&config, 4.0, 100, 16);
    assert!(close(row.tg_bytes_per_token, deep_bytes) && deep_bytes > bytes);
}

/// A row whose bytes per token fit in the last-level cache is put against the cache's
/// read bandwidth; one that does not (or without a measured cache) against memory's.
#[test]
fn the_tg_ceiling_is_the_cache_where_the_bytes_fit() {
    let mut p = peaks("avx2", 10.0, 40.0, 50.0);
    assert_eq!(tg_ceiling(1e6, &p), ("dram", 50.0), "no cache measured");
    p.llc_bytes = Some(32 << 20);
    p.llc_read_gbps = Some(400.0);
    assert_eq!(tg_ceiling(20e6, &p), ("llc", 400.0));
    assert_eq!(tg_ceiling((32 << 20) as f64, &p), ("llc", 400.0));
    assert_eq!(tg_ceiling(140e6, &p), ("dram", 50.0));
    // Through set_roofline: 30 MB per token at 100 t/s is 3 GB/s, 0.75 % of the cache's
    // 400 GB/s (it would be 6 % of memory's 50).
    let model = kwk_fixtures::model_dir("tiny-llama");
    let config = kwk::model::ModelConfig::from_hf_config_json(&model.join("config.json")).unwrap();
    let spec = SpeedSpec {
        pp: 0,
        tg: 1,
        depth: 0,
        reps: 1,
        threads: 2,
    };
    let machine = Machine {
        cpu: "x".into(),
        isa: vec![],
        kernels: None,
        threads: 2,
        peaks: Some(p),
        peaks_best_tier: None,
        steadiness: None,
    };
    let cost = RooflineCost {
        compute: ComputeKind::Int8,
        weight_bytes_per_token: 30e6,
        kv_bytes_per_value: 4.0,
        best_kernels: false,
    };
    let mut row = RunnerRecord {
        tg_tokens_per_s: Some(100.0),
        tg_samples_tokens_per_s: vec![100.0],
        tg_samples_read_gbps: vec![50.0],
        ..Default::default()
    };
    set_roofline(&mut row, Some(&cost), &config, &spec, &machine);
    let bytes = row.tg_bytes_per_token.unwrap();
    assert_eq!(row.tg_ceiling.as_deref(), Some("llc"));
    assert!((row.tg_roofline_pct.unwrap() - 100.0 * 100.0 * bytes / 400e9).abs() < 1e-9);
    assert_eq!(
        row.tg_roofline_paired_pct, None,
        "memory probes do not pair with llc"
    );
}
