//! Tests of the ladder's planning: the choice, the rungs, when it runs, fallbacks.

use super::*;

fn allowed() -> Vec<String> {
    [
        "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS", "Q3_K_M", "IQ3_XXS", "Q2_K", "F32",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn the_choice_parses() {
    assert_eq!(LadderChoice::parse("none"), Ok(LadderChoice::Off));
    assert_eq!(LadderChoice::parse("default"), Ok(LadderChoice::Default));
    assert_eq!(
        LadderChoice::parse("q4_k_m, Q2_K+imatrix"),
        Ok(LadderChoice::Types(vec![
            "q4_k_m".into(),
            "Q2_K+imatrix".into()
        ]))
    );
    assert!(LadderChoice::parse("Q4_K_M,,Q2_K").is_err());
    assert!(LadderChoice::parse("").is_err());
}

#[test]
fn the_default_ladder_takes_the_imatrix_when_there_is_a_calibration_text() {
    let plain = rungs(&LadderChoice::Default, &allowed(), None, false).unwrap();
    assert_eq!(plain.len(), DEFAULT_LADDER.len());
    assert!(plain.iter().all(|r| !r.imatrix));
    let calib = rungs(&LadderChoice::Auto, &allowed(), None, true).unwrap();
    assert!(calib.iter().all(|r| r.imatrix));
    assert_eq!(calib[3].label(), "Q4_K_M+imatrix");
}

#[test]
fn types_are_checked_against_the_tool() {
    let r = rungs(
        &LadderChoice::Types(vec!["q4_k_m".into(), "Q2_K+imatrix".into()]),
        &allowed(),
        None,
        true,
    )
    .unwrap();
    assert_eq!(r[0].label(), "Q4_K_M");
    assert_eq!(r[1].label(), "Q2_K+imatrix");
    let e = rungs(
        &LadderChoice::Types(vec!["Q9_9".into()]),
        &allowed(),
        None,
        false,
    )
    .unwrap_err();
    assert!(e.contains("'Q9_9' is not a type"), "{e}");
    let e = rungs(
        &LadderChoice::Types(vec!["Q2_K+imatrix".into()]),
        &allowed(),
        None,
        false,
    )
    .unwrap_err();
    assert!(e.contains("pass --calib-text"), "{e}");
    let e = rungs(
        &LadderChoice::Types(vec!["Q2_K".into(), "q2_k".into()]),
        &allowed(),
        None,
        false,
    )
    .unwrap_err();
    assert!(e.contains("given twice"), "{e}");
}

#[test]
fn the_ladder_runs_when_asked_or_when_llama_bench_has_no_gguf() {
    let mut ask = LadderAsk {
        choice: &LadderChoice::Auto,
        llm: "m",
        llama_bench: true,
        has_gguf: false,
        calib: None,
        cache_dir: None,
    };
    assert!(wanted(&ask));
    ask.has_gguf = true;
    assert!(!wanted(&ask));
    ask.choice = &LadderChoice::Default;
    assert!(wanted(&ask));
    ask.choice = &LadderChoice::Off;
    ask.has_gguf = false;
    assert!(!wanted(&ask));
}

#[test]
fn fallbacks_are_grouped_by_pair() {
    let f = |t: &str, w: &str, u: &str| llamacpp::Fallback {
        tensor: t.into(),
        wanted: w.into(),
        used: u.into(),
    };
    let g = group_fallbacks(&[
        f("a", "q4_K", "q5_0"),
        f("b", "q6_K", "q8_0"),
        f("c", "q4_K", "q5_0"),
    ]);
    assert_eq!(g[0].tensors, 2);
    assert_eq!((g[1].wanted.as_str(), g[1].tensors), ("q6_K", 1));
}

fn ik_allowed() -> Vec<String> {
    [
        "Q8_0", "Q4_K_M", "IQ6_K", "IQ5_K", "IQ4_K", "IQ4_KS", "IQ3_K", "IQ2_K", "IQ3_KT",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn ik_types_are_made_by_ik_and_checked_against_its_tool() {
    // The default ladder with ik among the peers: mainline's types, then ik's own.
    let r = rungs(
        &LadderChoice::Default,
        &allowed(),
        Some(&ik_allowed()),
        true,
    )
    .unwrap();
    assert_eq!(r.len(), DEFAULT_LADDER.len() + IK_LADDER.len());
    assert!(r[..DEFAULT_LADDER.len()]
        .iter()
        .all(|x| x.maker == Engine::LlamaCpp));
    let ik = &r[DEFAULT_LADDER.len()];
    assert_eq!(
        (ik.maker, ik.label().as_str()),
        (Engine::Ik, "IQ6_K+imatrix")
    );
    // Named ones: the prefix in any case; mainline's list does not have them.
    let r = rungs(
        &LadderChoice::Types(vec!["IK:iq4_ks".into(), "Q4_K_M".into()]),
        &allowed(),
        Some(&ik_allowed()),
        false,
    )
    .unwrap();
    assert_eq!((r[0].maker, r[0].qtype.as_str()), (Engine::Ik, "IQ4_KS"));
    assert_eq!(r[1].maker, Engine::LlamaCpp);
    let e = rungs(
        &LadderChoice::Types(vec!["IQ4_KS".into()]),
        &allowed(),
        Some(&ik_allowed()),
        false,
    )
    .unwrap_err();
    assert!(
        e.contains("'IQ4_KS' is not a type this llama-quantize"),
        "{e}"
    );
    // ... and the line says how to name it.
    assert!(e.contains("name it ik:IQ4_KS"), "{e}");
    let e = rungs(
        &LadderChoice::Types(vec!["ik:Q9_9".into()]),
        &allowed(),
        Some(&ik_allowed()),
        false,
    )
    .unwrap_err();
    assert!(e.contains("'ik:Q9_9' is not a type ik_llama.cpp's"), "{e}");
    let e = rungs(
        &LadderChoice::Types(vec!["ik:IQ4_KS".into()]),
        &allowed(),
        None,
        false,
    )
    .unwrap_err();
    assert!(e.contains("--peer llama.cpp,ik"), "{e}");
    // The same type on both engines is two rungs, not a repeat.
    let r = rungs(
        &LadderChoice::Types(vec!["Q4_K_M".into(), "ik:Q4_K_M".into()]),
        &allowed(),
        Some(&ik_allowed()),
        false,
    )
    .unwrap();
    assert_eq!(r.len(), 2);
    assert!(LadderChoice::parse("Q4_K_M,ik:IQ4_KS").unwrap().names_ik());
    assert!(!LadderChoice::parse("Q4_K_M").unwrap().names_ik());
}

#[test]
fn ik_rows_run_on_ik_alone_and_mainline_rows_on_every_peer() {
    let peers = [Engine::LlamaCpp, Engine::Ik];
    let mk = |qtype: &str, maker| Rung {
        qtype: qtype.into(),
        imatrix: true,
        maker,
    };
    let ik = rows_on_peers(&mk("IQ4_KS", Engine::Ik).row("x.gguf".into()), &peers);
    let names: Vec<String> = ik.iter().map(FormatSpec::name).collect();
    assert_eq!(names, ["ik:IQ4_KS+imatrix"]);
    let main = rows_on_peers(&mk("Q4_K_M", Engine::LlamaCpp).row("y.gguf".into()), &peers);
    let names: Vec<String> = main.iter().map(FormatSpec::name).collect();
    assert_eq!(names, ["llama.cpp:Q4_K_M+imatrix", "ik:Q4_K_M+imatrix"]);
    // Mainline alone: the row keeps its gguf: name.
    let alone = rows_on_peers(
        &mk("Q4_K_M", Engine::LlamaCpp).row("y.gguf".into()),
        &[Engine::LlamaCpp],
    );
    assert_eq!(alone[0].name(), "gguf:Q4_K_M+imatrix");
}
