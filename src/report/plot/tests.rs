//! Tests of the plots: files written, labels, legends, one series per engine.

use super::*;
use crate::protocol::results::testdata::sample_results;

#[test]
fn writes_png_and_svg_with_text() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_plots(dir.path(), &sample_results()).unwrap();
    assert_eq!(files.quality.as_deref(), Some("quality_vs_bpw.svg"));
    assert_eq!(files.speed.as_deref(), Some("speed.svg"));
    for f in ["quality_vs_bpw.png", "speed.png"] {
        let bytes = std::fs::read(dir.path().join(f)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{f}");
    }
    let svg = std::fs::read_to_string(dir.path().join("quality_vs_bpw.svg")).unwrap();
    assert!(svg.contains("int4") && svg.contains("bits per weight"));
    let mut r = sample_results();
    for (i, n) in ["gguf:M-Q4_0.gguf", "gguf:M-Q4_1.gguf"].iter().enumerate() {
        r.runners[i].name = n.to_string();
    }
    let labels: Vec<String> = quality_points(&r).into_iter().map(|p| p.label).collect();
    assert_eq!(labels, ["Q4_0", "Q4_1"]);
    assert_eq!(model_short_name("/a/b/SmolLM2.gguf"), "SmolLM2");
    assert_eq!(
        model_short_name("m/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "SmolLM2-135M-Instruct"
    );
    assert_eq!(
        model_short_name("HuggingFaceTB/SmolLM2-1.7B"),
        "SmolLM2-1.7B"
    );
    let svg = std::fs::read_to_string(dir.path().join("speed.svg")).unwrap();
    assert!(svg.contains("float32") && svg.contains("tokens/s"));
    // One legend naming both engines.
    assert!(
        svg.contains("\nkwk\n") && svg.contains("\nllama.cpp\n"),
        "legend"
    );
    assert_eq!(files.tradeoff.as_deref(), Some("quality_vs_speed.svg"));
    let svg = std::fs::read_to_string(dir.path().join("quality_vs_speed.svg")).unwrap();
    assert!(svg.contains("tokens/s") && svg.contains("bpw"), "labels");
    // To look at the plots: KWK_KEEP_PLOTS=DIR cargo test -p kwk-eval --lib plot
    if let Some(keep) = std::env::var_os("KWK_KEEP_PLOTS") {
        std::fs::create_dir_all(&keep).unwrap();
        write_plots(Path::new(&keep), &ladder()).unwrap();
    }
}

/// A run like the default one: kwk's four formats and six GGUFs, one of them far worse.
fn ladder() -> Results {
    let mut r = sample_results();
    let base = r.runners[1].clone();
    r.runners.truncate(1);
    r.model = "models/SmolLM2-135M-Instruct.Q4_1.gguf".into();
    r.runners[0].bits_per_weight = Some(32.0);
    r.runners[0].tg_tokens_per_s = Some(79.8);
    r.runners[0].pp_tokens_per_s = Some(1446.0);
    let rows = [
        ("bf16", Engine::Kwk, 16.0, -0.02, 0.00015, 2593.0, 162.2),
        ("int8", Engine::Kwk, 8.51, 0.46, 0.00399, 3166.0, 283.8),
        ("int4", Engine::Kwk, 5.74, 0.37, 0.00294, 2965.0, 383.1),
        (
            "gguf:M-F32.gguf",
            Engine::LlamaCpp,
            32.0,
            -0.0,
            0.000001,
            933.0,
            68.9,
        ),
        (
            "gguf:M-BF16.gguf",
            Engine::LlamaCpp,
            16.0,
            0.01,
            0.00016,
            1517.0,
            122.3,
        ),
        (
            "gguf:M-Q8_0.gguf",
            Engine::LlamaCpp,
            8.51,
            0.42,
            0.00424,
            853.0,
            151.2,
        ),
        (
            "gguf:M-Q4_K_M.gguf",
            Engine::LlamaCpp,
            6.17,
            5.59,
            0.0589,
            762.0,
            146.6,
        ),
        (
            "gguf:M-Q4_1.gguf",
            Engine::LlamaCpp,
            5.74,
            0.50,
            0.00294,
            404.0,
            145.9,
        ),
        (
            "gguf:M-Q4_0.gguf",
            Engine::LlamaCpp,
            5.35,
            25.8,
            0.311,
            1290.0,
            204.9,
        ),
    ];
    for (name, engine, bpw, dp, kld, pp, tg) in rows {
        let mut x = base.clone();
        x.name = name.into();
        x.engine = engine;
        x.bits_per_weight = Some(bpw);
        x.ppl_delta_pct = Some(dp);
        x.kld_mean = Some(kld);
        x.pp_tokens_per_s = Some(pp);
        x.tg_tokens_per_s = Some(tg);
        x.pp_tokens_per_s_std = Some(pp * 0.08);
        x.tg_tokens_per_s_std = Some(tg * 0.1);
        x.pp_roofline_pct = Some(40.0);
        x.tg_roofline_pct = Some(50.0);
        r.runners.push(x);
    }
    r
}

/// One row far above the others is clipped, not allowed to flatten them; rows alike
/// set the axis themselves.
#[test]
fn a_far_outlier_is_clipped() {
    // The default run on the shipped model: Q4_K_M and Q4_0 far above the rest.
    let (top, clip) = clipped_top(&[0.01, 0.37, 0.46, 0.42, 0.50, 5.59, 25.8]);
    assert_eq!(clip, Some(top));
    assert!((top - 0.75).abs() < 1e-9, "{top}");
    // The off-grid copy: only Q4_1 and Q4_0 (+62 %, +68 %) are clipped, the int4 rows
    // between 3 and 11 % stay on the axis.
    let (top, clip) = clipped_top(&[0.38, 0.59, 3.74, 6.86, 7.14, 9.70, 10.21, 62.6, 68.4]);
    assert_eq!(clip, Some(top));
    assert!((top - 10.21 * 1.5).abs() < 1e-9, "{top}");
    let (top, clip) = clipped_top(&[0.37, 0.46, 0.42, 0.5]);
    assert_eq!(clip, None);
    assert!(top > 0.5 && top < 0.6, "{top}");
    assert_eq!(clipped_top(&[]).1, None);
    let dir = tempfile::tempdir().unwrap();
    let files = write_plots(dir.path(), &ladder()).unwrap();
    let svg = std::fs::read_to_string(dir.path().join(files.quality.unwrap())).unwrap();
    assert!(
        svg.contains("Q4_0 ↑ +25.8 %") || svg.contains("Q4_0 · tg") && svg.contains("↑ +25.8 %"),
        "the clipped row says its value"
    );
    assert!(
        svg.contains("off the axis: float32 32 bpw"),
        "16/32-bit rows named"
    );
    assert!(svg.contains("SmolLM2-135M-Instruct") && !svg.contains("Q4_1.gguf"));
}

/// Rows with a roofline share get the marker at mean × 100 / share and the share's
/// label; rows without one get neither.
#[test]
fn speed_plot_marks_the_roofline() {
    let mut r = sample_results();
    for row in r.runners.iter_mut() {
        row.pp_roofline_pct = None;
        row.tg_roofline_pct = None;
    }
    r.runners[0].tg_tokens_per_s = Some(50.0);
    r.runners[0].tg_roofline_pct = Some(37.0);
    let tg = speed_bars(&r, |row| {
        Some((row.tg_tokens_per_s?, 0.0, row.tg_roofline_pct))
    });
    assert!((tg[0].ceiling().unwrap() - 50.0 * 100.0 / 37.0).abs() < 1e-9);
    assert!(tg.iter().skip(1).all(|b| b.ceiling().is_none()));
    let dir = tempfile::tempdir().unwrap();
    write_plots(dir.path(), &r).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("speed.svg")).unwrap();
    assert_eq!(svg.matches("37%").count(), 1, "one roofline label");
}

#[test]
fn a_single_runner_plots_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = sample_results();
    r.runners.truncate(1);
    r.update_deltas();
    let files = write_plots(dir.path(), &r).unwrap();
    assert!(files.quality.is_some() && files.speed.is_some());
}

#[test]
fn no_data_no_plot() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = sample_results();
    for row in &mut r.runners {
        *row = crate::report::RunnerRecord::failed(&row.name, Engine::Kwk, "x".into());
    }
    r.update_deltas();
    assert_eq!(write_plots(dir.path(), &r).unwrap(), PlotFiles::default());
}

/// With `--peer llama.cpp,ik`, ik_llama.cpp's rows are a third series (own colour, marker,
/// legend entry and frontier) in every plot; without ik rows there is no ik entry.
#[test]
fn ik_rows_are_a_third_series() {
    let dir = tempfile::tempdir().unwrap();
    write_plots(dir.path(), &ladder()).unwrap();
    for f in ["quality_vs_bpw.svg", "quality_vs_speed.svg", "speed.svg"] {
        let svg = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(!svg.contains("\nik\n"), "{f}: no ik legend without ik rows");
    }
    let mut r = ladder();
    let base = r.runners.last().unwrap().clone();
    for (name, bpw, dp, tg) in [
        ("ik:IQ4_KS", 4.6, 3.1, 230.0),
        ("ik:IQ6_K", 6.7, 0.6, 190.0),
    ] {
        let mut x = base.clone();
        x.name = name.into();
        x.engine = Engine::Ik;
        x.bits_per_weight = Some(bpw);
        x.ppl_delta_pct = Some(dp);
        x.tg_tokens_per_s = Some(tg);
        r.runners.push(x);
    }
    let ik: Vec<Point> = points(&r)
        .into_iter()
        .filter(|p| p.engine == Engine::Ik)
        .collect();
    assert_eq!(ik.len(), 2);
    assert_eq!(ik[0].label, "ik:IQ4_KS");
    let dir = tempfile::tempdir().unwrap();
    write_plots(dir.path(), &r).unwrap();
    let green = format!("#{:02X}{:02X}{:02X}", IK_COLOR.0, IK_COLOR.1, IK_COLOR.2);
    for f in ["quality_vs_bpw.svg", "quality_vs_speed.svg", "speed.svg"] {
        let svg = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(svg.contains("\nik\n"), "{f}: ik in the legend");
        assert!(svg.contains(&green), "{f}: ik drawn in its own colour");
    }
    let svg = std::fs::read_to_string(dir.path().join("quality_vs_bpw.svg")).unwrap();
    assert!(svg.contains("IQ4_KS") && svg.contains("IQ6_K"));
    assert!(
        engine_rank(Engine::Kwk) < engine_rank(Engine::LlamaCpp)
            && engine_rank(Engine::LlamaCpp) < engine_rank(Engine::Ik)
    );
}
