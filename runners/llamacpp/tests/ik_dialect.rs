//! ik_llama.cpp as a dialect of llama.cpp: its parsers on output captured from its real
//! tools, beside mainline's on the same command, and discovery telling the two apart (fake
//! tools answering `--version`/`--help` with the captured text of each engine).
//!
//! How the files in tests/data were made (ik_llama.cpp from scripts/setup-ik-llama-cpp.sh,
//! ik-llama-cpp-python 0.1.5; llama.cpp from scripts/setup-llama-cpp.sh, 0.3.36; this
//! machine, 2026-12-06; the model's folder removed from the paths):
//! - ik-smollm2-q4km-wiki-c128-4.*: ik's `llama-perplexity -m
//!   SmolLM2-135M-Instruct-Q4_K_M.gguf -f wiki.test.raw -c 128 -b 128 -ub 128 --chunks 4 -t 2
//!   -tb 2 -ngl 0 -fa on -ctk f16 -ctv f16 -rtr`; smollm2-q4km-wiki-c128-4.*: mainline's, the
//!   same command without `-rtr`
//! - ik-smollm2-too-short.*: ik's, the same on the first 150 bytes of wiki.test.raw
//! - ik-smollm2-q4km-bench.json: ik's `llama-bench -m ...Q4_K_M.gguf -p 64 -n 16 -r 2 -t 2
//!   -ngl 0 -fa 1 -ctk f16 -ctv f16 -b 2048 -ub 512 -rtr 1 -o json`; smollm2-q4km-bench.json:
//!   mainline's, the same without `-rtr 1`
//! - ik-llama-*-help.txt, ik-llama-perplexity-version.txt: ik's `--help` / `--version`

use llamacpp::bench::{check_matches, parse_bench_json};
use llamacpp::perplexity::{parse_perplexity_of, PerplexityProblem};
use llamacpp::process;
use llamacpp::tools::Search;
use llamacpp::{
    BenchRequest, BuildInfo, ComputeSettings, Engine, Error, KvType, LlamaCppTools,
    PerplexityRequest, TokenizeRequest,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn data_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn data(name: &str) -> String {
    let p = data_path(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn ik_perplexity_summary_is_read_from_its_own_output() {
    let out = parse_perplexity_of(
        Engine::Ik,
        &data("ik-smollm2-q4km-wiki-c128-4.stdout"),
        &data("ik-smollm2-q4km-wiki-c128-4.stderr"),
    )
    .unwrap();
    assert_eq!(out.ppl, 33.4133);
    assert_eq!(out.ppl_err, 7.56562);
    assert_eq!(out.running, [9.6279, 24.5354, 33.6377, 33.4133]);
    assert_eq!(out.chunks, Some(4));
    assert_eq!(out.n_ctx, Some(128));
    assert_eq!(out.batch_size, Some(128));
    assert_eq!(out.n_seq, Some(1));
    assert_eq!(out.seconds_per_pass, Some(1.12));
    // No timestamps in its log.
    assert_eq!(out.ready_s, None);
    let features = out.cpu_features.unwrap();
    for f in ["AVX2", "AVX512", "AVX512_VNNI", "FMA", "F16C"] {
        assert!(features.iter().any(|x| x == f), "{f} not in {features:?}");
    }
    assert!(!features.iter().any(|x| x == "NEON" || x == "MATMUL_INT8"));
}

#[test]
fn mainline_perplexity_summary_of_the_same_command() {
    let out = parse_perplexity_of(
        Engine::LlamaCpp,
        &data("smollm2-q4km-wiki-c128-4.stdout"),
        &data("smollm2-q4km-wiki-c128-4.stderr"),
    )
    .unwrap();
    assert_eq!(out.ppl, 34.1628);
    assert_eq!(out.ppl_err, 7.76221);
    assert_eq!(out.running, [9.6823, 25.1070, 34.4634, 34.1628]);
    assert_eq!(out.chunks, Some(4));
    assert!(out.ready_s.is_some());
}

/// Each engine's parser finds no result in the other's output (the Final line is in another
/// stream and form), so output is never read in the wrong dialect.
#[test]
fn a_parser_finds_no_result_in_the_other_engines_output() {
    let (ik_out, ik_err) = (
        data("ik-smollm2-q4km-wiki-c128-4.stdout"),
        data("ik-smollm2-q4km-wiki-c128-4.stderr"),
    );
    let (ml_out, ml_err) = (
        data("smollm2-q4km-wiki-c128-4.stdout"),
        data("smollm2-q4km-wiki-c128-4.stderr"),
    );
    assert_eq!(
        parse_perplexity_of(Engine::LlamaCpp, &ik_out, &ik_err),
        Err(PerplexityProblem::Truncated)
    );
    assert_eq!(
        parse_perplexity_of(Engine::Ik, &ml_out, &ml_err),
        Err(PerplexityProblem::Truncated)
    );
}

#[test]
fn ik_too_short_text_and_reported_errors() {
    assert_eq!(
        parse_perplexity_of(
            Engine::Ik,
            &data("ik-smollm2-too-short.stdout"),
            &data("ik-smollm2-too-short.stderr"),
        ),
        Err(PerplexityProblem::TooShort {
            needed: 256,
            ctx: 128,
            got: Some(36)
        })
    );
    // A failed decode: ik prints a plain `perplexity: failed to eval` line and no Final.
    let stderr = data("ik-smollm2-q4km-wiki-c128-4.stderr") + "perplexity : failed to eval\n";
    match parse_perplexity_of(Engine::Ik, "[1]9.6279,", &stderr) {
        Err(PerplexityProblem::Reported(lines)) => {
            assert_eq!(lines, ["perplexity : failed to eval"])
        }
        other => panic!("{other:?}"),
    }
    // The running values must number the chunks of the Final line.
    let stdout = data("ik-smollm2-q4km-wiki-c128-4.stdout").replace("[4]33.4133,", "");
    match parse_perplexity_of(
        Engine::Ik,
        &stdout,
        &data("ik-smollm2-q4km-wiki-c128-4.stderr"),
    ) {
        Err(PerplexityProblem::Malformed(m)) => assert!(m.contains("3 running values"), "{m}"),
        other => panic!("{other:?}"),
    }
}

fn bench_request(pp: usize, tg: usize, reps: usize) -> BenchRequest {
    BenchRequest {
        model: PathBuf::from("m.gguf"),
        pp,
        tg,
        depth: 0,
        reps,
        compute: ComputeSettings::new(2, KvType::F16),
        flash_attn: vec![],
        timeout: Duration::from_secs(60),
    }
}

/// Both llama-benches' JSON parse into the same tests; the ik run is checked for its speed
/// settings (`repack`, and `flash_attn` as its boolean), which mainline's JSON does not
/// report that way (its `flash_attn` is a number).
#[test]
fn bench_json_of_both_engines() {
    let req = bench_request(64, 16, 2);
    let ik = parse_bench_json(&data("ik-smollm2-q4km-bench.json")).unwrap();
    let (pp, tg) = (&ik.pp[0], &ik.tg[0]);
    assert_eq!(pp.flash_attn, Some(true));
    assert_eq!((pp.n_prompt, tg.n_gen), (64, 16));
    assert_eq!(pp.samples_ts, [71.4638, 70.212]);
    assert_eq!(pp.avg_ts, 70.837904);
    assert_eq!(tg.avg_ts, 17.073868);
    assert_eq!(pp.raw["repack"], serde_json::json!(true));
    assert!(pp.raw.get("n_depth").is_none());
    check_matches(&ik, &req, Engine::Ik).unwrap();

    let ml = parse_bench_json(&data("smollm2-q4km-bench.json")).unwrap();
    assert_eq!(ml.pp[0].avg_ts, 106.953230);
    assert_eq!(ml.tg[0].avg_ts, 20.093337);
    assert_eq!(ml.tg[0].flash_attn, Some(true));
    check_matches(&ml, &req, Engine::LlamaCpp).unwrap();
    let e = check_matches(&ml, &req, Engine::Ik).unwrap_err();
    assert!(e.contains("no boolean `flash_attn`"), "{e}");
    // An ik run without repacking is not the run asked for.
    let unpacked =
        data("ik-smollm2-q4km-bench.json").replace("\"repack\": true", "\"repack\": false");
    let e = check_matches(&parse_bench_json(&unpacked).unwrap(), &req, Engine::Ik).unwrap_err();
    assert!(e.contains("`repack` is false"), "{e}");
}

/// ik_llama.cpp's llama-bench takes the list `-fa 0,1` too (`-p 16 -n 4 -r 2 -t 1 -rtr 1` on
/// the tiny fixture), its `flash_attn` a boolean per object; each is checked for its own
/// setting.
#[test]
fn ik_bench_json_with_both_flash_attn_settings() {
    let mut req = bench_request(16, 4, 2);
    req.compute = ComputeSettings::new(1, KvType::F16);
    req.flash_attn = vec![false, true];
    let ik = parse_bench_json(&data("ik-tiny-llama-bench-fa01.json")).unwrap();
    assert_eq!(ik.pp_at(Some(false)).unwrap().raw["flash_attn"], false);
    assert_eq!(ik.tg_at(Some(true)).unwrap().raw["flash_attn"], true);
    check_matches(&ik, &req, Engine::Ik).unwrap();
}

#[test]
fn ik_version_and_help_as_its_tools_print_them() {
    // The fork prints mainline's older version form: not enough to tell them apart.
    let b = BuildInfo::parse(&data("ik-llama-perplexity-version.txt")).unwrap();
    assert_eq!(b.raw, "version: 0 (unknown)");
    assert_eq!(
        (b.version, b.build_number, b.build_commit),
        (None, None, None)
    );
    // Its --help is: it lists options mainline never had.
    assert_eq!(
        Engine::identify(&data("ik-llama-perplexity-help.txt")),
        Engine::Ik
    );
    assert_eq!(
        Engine::identify(&data("llama-perplexity-help.txt")),
        Engine::LlamaCpp
    );
}

// Fake tools answering `--version` and `--help` with an engine's captured text.

fn script(path: &Path, body: &str) {
    process::write_executable(path, &format!("#!/bin/sh\n{body}")).unwrap();
}

/// A fake tool printing `version` for `--version` and `help` for `--help`, exiting with
/// the status the real ones do (ik_llama.cpp's llama-perplexity exits 1 after its usage).
fn fake_tool(dir: &Path, name: &str, version: &str, help: &str, body: &str) {
    let help_file = dir.join(format!("{name}.help"));
    std::fs::write(&help_file, help).unwrap();
    let help_status = u8::from(version.starts_with("ik-") && name == "llama-perplexity");
    script(
        &dir.join(name),
        &format!(
            "case \"$1\" in\n--version) cat '{}' >&2; exit 0;;\n\
             --help) cat '{}'; exit {help_status};;\nesac\n{body}\n",
            data_path(version).display(),
            help_file.display()
        ),
    );
}

/// A fake tool set of `engine` in `dir`; `perplexity_body` is what llama-perplexity does.
fn fake_set(dir: &Path, engine: Engine, perplexity_body: &str) {
    let (prefix, version) = match engine {
        Engine::LlamaCpp => ("", "llama-perplexity-version.txt"),
        Engine::Ik => ("ik-", "ik-llama-perplexity-version.txt"),
    };
    let help = |tool: &str| data(&format!("{prefix}{tool}-help.txt"));
    std::fs::create_dir_all(dir).unwrap();
    fake_tool(
        dir,
        "llama-perplexity",
        version,
        &help("llama-perplexity"),
        perplexity_body,
    );
    fake_tool(dir, "llama-bench", version, &help("llama-bench"), "exit 0");
    // ik's llama-tokenize has no --no-escape: the fake refuses it as the real one does.
    fake_tool(
        dir,
        "llama-tokenize",
        version,
        &help("llama-tokenize"),
        "case \"$*\" in *--no-escape*) echo 'error: unknown argument: --no-escape' >&2; exit 1;; esac\n\
         echo '[1, 2]'",
    );
    fake_tool(dir, "llama-quantize", version, "usage", "exit 1");
}

fn search(engine: Engine, dir: &Path) -> Search {
    Search {
        engine,
        dir: Some(dir.to_path_buf()),
        ..Search::default()
    }
}

#[test]
fn discovery_tells_the_engines_apart_by_their_help() {
    let (ml, ik) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fake_set(ml.path(), Engine::LlamaCpp, "exit 0");
    fake_set(ik.path(), Engine::Ik, "exit 0");
    let t = LlamaCppTools::locate_in(&search(Engine::Ik, ik.path())).unwrap();
    assert_eq!(t.engine(), Engine::Ik);
    assert_eq!(t.source(), "--ik-llama-cpp-dir");
    assert_eq!(t.build().raw, "version: 0 (unknown)");
    assert!(t.tokenize_path().is_some(), "{:?}", t.notes());
    let t = LlamaCppTools::locate_in(&search(Engine::LlamaCpp, ml.path())).unwrap();
    assert_eq!(t.engine(), Engine::LlamaCpp);

    // Each engine's folder given for the other: one line naming both and the fix.
    let msg = LlamaCppTools::locate_in(&search(Engine::Ik, ml.path()))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("is not ik_llama.cpp but llama.cpp"), "{msg}");
    assert!(msg.contains("scripts/setup-ik-llama-cpp.sh"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    let msg = LlamaCppTools::locate_in(&search(Engine::LlamaCpp, ik.path()))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("is not llama.cpp but ik_llama.cpp"), "{msg}");
    assert!(msg.contains("scripts/setup-llama-cpp.sh"), "{msg}");
}

/// The same file names on PATH and in the cache: each engine takes its own, passing the
/// other's over (by what the tools print, whatever the folders are called).
#[test]
fn path_and_cache_give_each_engine_its_own_tools() {
    let (on_path, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fake_set(on_path.path(), Engine::LlamaCpp, "exit 0");
    let ml_bin = cache.path().join("llama.cpp-0.3.36/build/bin");
    let ik_bin = cache.path().join("ik_llama.cpp-0.1.5/build/bin");
    for (bin, engine) in [(&ml_bin, Engine::LlamaCpp), (&ik_bin, Engine::Ik)] {
        fake_set(bin, engine, "exit 0");
        std::fs::write(bin.join("../../.build-complete"), "").unwrap();
    }
    let s = |engine| Search {
        engine,
        path: Some(on_path.path().as_os_str().to_owned()),
        cache_root: Some(cache.path().into()),
        ..Search::default()
    };
    let ik = LlamaCppTools::locate_in(&s(Engine::Ik)).unwrap();
    assert_eq!(ik.bin_dir(), Some(ik_bin.as_path()));
    assert_eq!(ik.source(), "the setup script's cache");
    let ml = LlamaCppTools::locate_in(&s(Engine::LlamaCpp)).unwrap();
    assert_eq!(ml.source(), "PATH");

    // No ik build in the cache: PATH's mainline tools are named as passed over.
    std::fs::remove_dir_all(cache.path().join("ik_llama.cpp-0.1.5")).unwrap();
    let msg = LlamaCppTools::locate_in(&s(Engine::Ik))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("not ik_llama.cpp"), "{msg}");
}

#[test]
fn missing_ik_build_is_one_line_naming_the_tool_and_the_set_up() {
    let empty = tempfile::tempdir().unwrap();
    let e = LlamaCppTools::locate_in(&Search {
        engine: Engine::Ik,
        path: Some(empty.path().as_os_str().to_owned()),
        cache_root: Some(empty.path().into()),
        ..Search::default()
    })
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ToolNotFound {
                engine: Engine::Ik,
                tool: "llama-perplexity",
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with("ik_llama.cpp tool `llama-perplexity` not found"),
        "{msg}"
    );
    assert!(
        msg.contains("ik_llama.cpp-*/build/bin: none built"),
        "{msg}"
    );
    assert!(
        msg.contains("scripts/setup-ik-llama-cpp.sh")
            && msg.contains("--ik-llama-cpp-dir DIR")
            && msg.contains("KWK_IK_LLAMA_CPP_DIR"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn too_old_ik_build_names_what_it_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), Engine::Ik, "exit 0");
    // An ik_llama.cpp from before `-fa` took on|off (it was a bare switch then).
    let old = data("ik-llama-perplexity-help.txt")
        .replace("--flash-attn (auto|on|off|0|1)", "--flash-attn");
    fake_tool(
        tmp.path(),
        "llama-perplexity",
        "ik-llama-perplexity-version.txt",
        &old,
        "exit 0",
    );
    let e = LlamaCppTools::locate_in(&search(Engine::Ik, tmp.path())).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::ToolTooOld {
                engine: Engine::Ik,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.starts_with("ik_llama.cpp tool "), "{msg}");
    assert!(msg.contains("`-fa on|off`"), "{msg}");
    assert!(msg.contains("ik-llama-cpp-python 0.1.5"), "{msg}");
    assert!(msg.contains("scripts/setup-ik-llama-cpp.sh"), "{msg}");
    assert!(!msg.contains("b6343"), "{msg}");
}

#[test]
fn ik_commands_carry_its_speed_settings() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), Engine::Ik, "exit 0");
    let ik = LlamaCppTools::locate_in(&search(Engine::Ik, tmp.path())).unwrap();
    let req = PerplexityRequest::new(
        "m.gguf".into(),
        "t.txt".into(),
        128,
        ComputeSettings::new(2, KvType::F16),
    );
    let cmd = req.command(&ik).unwrap().display();
    assert!(cmd.contains("-fa on -ctk f16 -ctv f16 -rtr"), "{cmd}");
    let cmd = bench_request(64, 16, 1).command(&ik).unwrap().display();
    assert!(cmd.contains("-rtr 1 -o json"), "{cmd}");
    assert!(!cmd.contains("--progress"), "{cmd}");
}

/// Output an ik_llama.cpp tool cannot have printed (here mainline's): the error names the
/// engine.
#[test]
fn unparseable_output_names_the_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let body = format!(
        "cat '{}'; cat '{}' >&2",
        data_path("smollm2-q4km-wiki-c128-4.stdout").display(),
        data_path("smollm2-q4km-wiki-c128-4.stderr").display()
    );
    fake_set(tmp.path(), Engine::Ik, &body);
    let ik = LlamaCppTools::locate_in(&search(Engine::Ik, tmp.path())).unwrap();
    let mut req = PerplexityRequest::new(
        "m.gguf".into(),
        "t.txt".into(),
        128,
        ComputeSettings::new(2, KvType::F16),
    );
    req.attempts = 1;
    let msg = llamacpp::run_perplexity(&ik, &req, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("ik_llama.cpp's llama-perplexity: "),
        "{msg}"
    );
}

#[test]
fn ik_tokenize_runs_without_no_escape() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), Engine::Ik, "exit 0");
    let ik = LlamaCppTools::locate_in(&search(Engine::Ik, tmp.path())).unwrap();
    let text = tmp.path().join("t.txt");
    std::fs::write(&text, "hello\n").unwrap();
    let run = llamacpp::run_tokenize(
        &ik,
        &TokenizeRequest {
            model: "m.gguf".into(),
            text,
            timeout: Duration::from_secs(60),
        },
    )
    .unwrap();
    assert_eq!(run.ids, [1, 2]);
    assert!(
        run.command.contains("--ids --no-parse-special"),
        "{}",
        run.command
    );
}
