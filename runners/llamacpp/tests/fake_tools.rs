//! Discovery, "too old" detection, timeouts, environment cleaning and failure messages,
//! with fake tools (shell scripts) so every case is exercised without llama.cpp.

use llamacpp::process::{self, ToolCommand};
use llamacpp::tools::{Search, DIR_ENV};
use llamacpp::{ComputeSettings, Error, KvType, LlamaCppTools, PerplexityRequest};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn script(path: &Path, body: &str) {
    process::write_executable(path, &format!("#!/bin/sh\n{body}")).unwrap();
}

/// A fake tool that answers `--version` and `--help` like the real one (help text captured
/// from the real binary, optionally edited) and otherwise runs `body`.
fn fake_tool(dir: &Path, name: &str, help: &str, body: &str) {
    fake_tool_of_version(dir, name, &data("llama-perplexity-version.txt"), help, body);
}

/// [`fake_tool`] printing the captured `--version` output in `version` (on stderr, as the
/// real tools do).
fn fake_tool_of_version(dir: &Path, name: &str, version: &Path, help: &str, body: &str) {
    let help_file = dir.join(format!("{name}.help"));
    std::fs::write(&help_file, help).unwrap();
    script(
        &dir.join(name),
        &format!(
            "case \"$1\" in\n--version) cat '{}' >&2; exit 0;;\n\
             --help) cat '{}'; exit 0;;\nesac\n{body}\n",
            version.display(),
            help_file.display()
        ),
    );
}

fn real_help(tool: &str) -> String {
    std::fs::read_to_string(data(&format!("{tool}-help.txt"))).unwrap()
}

/// A complete fake tool set in `dir`; `perplexity_body` is what llama-perplexity does.
fn fake_set(dir: &Path, perplexity_body: &str) {
    fake_tool(
        dir,
        "llama-perplexity",
        &real_help("llama-perplexity"),
        perplexity_body,
    );
    fake_tool(dir, "llama-bench", &real_help("llama-bench"), "exit 0");
    fake_tool(
        dir,
        "llama-tokenize",
        &real_help("llama-tokenize"),
        "echo '[1, 2]'",
    );
    fake_tool(dir, "llama-quantize", "usage", "exit 1");
}

fn search_dir(dir: &Path) -> Search {
    Search {
        dir: Some(dir.to_path_buf()),
        ..Search::default()
    }
}

#[test]
fn finds_tools_in_the_given_directory() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), "exit 0");
    let t = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    assert_eq!(t.perplexity_path(), tmp.path().join("llama-perplexity"));
    assert_eq!(t.bench_path(), tmp.path().join("llama-bench"));
    assert_eq!(
        t.tokenize_path(),
        Some(tmp.path().join("llama-tokenize").as_path())
    );
    assert_eq!(t.source(), "--llama-cpp-dir");
    assert_eq!(t.build_number(), None);
    assert_eq!(t.build_commit(), None);
    assert_eq!(t.build().version.as_deref(), Some("0.5.0-dev"));
    assert!(t.notes().is_empty(), "{:?}", t.notes());
}

#[test]
fn search_order_flag_then_env_then_path_then_cache() {
    let (a, b, c, d) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    for dir in [a.path(), b.path(), c.path()] {
        fake_set(dir, "exit 0");
    }
    // The setup script's cache layout: <root>/llama.cpp-<version>/build/bin + .build-complete.
    let cache_bin = d.path().join("llama.cpp-0.3.36/build/bin");
    std::fs::create_dir_all(&cache_bin).unwrap();
    std::fs::write(d.path().join("llama.cpp-0.3.36/.build-complete"), "").unwrap();
    fake_set(&cache_bin, "exit 0");

    let all = Search {
        engine: llamacpp::Engine::LlamaCpp,
        dir: Some(a.path().into()),
        env_dir: Some(b.path().into()),
        path: Some(c.path().as_os_str().to_owned()),
        cache_root: Some(d.path().into()),
    };
    let found = |s: &Search| {
        let t = LlamaCppTools::locate_in(s).unwrap();
        (
            t.perplexity_path().parent().unwrap().to_path_buf(),
            t.source().to_string(),
        )
    };
    assert_eq!(found(&all), (a.path().into(), "--llama-cpp-dir".into()));
    let s = Search {
        dir: None,
        ..all.clone()
    };
    assert_eq!(found(&s), (b.path().into(), DIR_ENV.into()));
    let s = Search { env_dir: None, ..s };
    assert_eq!(found(&s), (c.path().into(), "PATH".into()));
    let s = Search { path: None, ..s };
    assert_eq!(found(&s), (cache_bin, "the setup script's cache".into()));
}

#[test]
fn missing_tools_name_what_was_searched_and_the_fix() {
    let empty = tempfile::tempdir().unwrap();
    // An explicit directory without the tools: an error, not a fall-through to PATH.
    let e = LlamaCppTools::locate_in(&Search {
        dir: Some(empty.path().into()),
        path: Some(std::env::var_os("PATH").unwrap_or_default()),
        ..Search::default()
    })
    .unwrap_err();
    assert!(matches!(
        e,
        Error::ToolNotFound {
            tool: "llama-perplexity",
            ..
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("--llama-cpp-dir") && msg.contains(&empty.path().display().to_string()),
        "{msg}"
    );
    assert!(
        msg.contains("scripts/setup-llama-cpp.sh") && msg.contains("KWK_LLAMA_CPP_DIR"),
        "{msg}"
    );

    let msg = LlamaCppTools::locate_in(&Search {
        dir: Some(empty.path().join("nope")),
        ..Search::default()
    })
    .unwrap_err()
    .to_string();
    assert!(msg.contains("no such directory"), "{msg}");

    // Nothing anywhere.
    let msg = LlamaCppTools::locate_in(&Search {
        path: Some(empty.path().as_os_str().to_owned()),
        cache_root: Some(empty.path().into()),
        ..Search::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("PATH") && msg.contains("cache") && msg.contains("none built"),
        "{msg}"
    );

    // llama-perplexity present, llama-bench missing.
    fake_tool(
        empty.path(),
        "llama-perplexity",
        &real_help("llama-perplexity"),
        "exit 0",
    );
    let e = LlamaCppTools::locate_in(&search_dir(empty.path())).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ToolNotFound {
                tool: "llama-bench",
                ..
            }
        ),
        "{e}"
    );
}

/// A build from a shallow clone (`git clone --depth 1`) reports `build 1` (captured output
/// of the real tools, the version line as such a build prints it): the number cannot date
/// the build, so its `--help` alone decides, and the tools say how they were judged.
#[test]
fn a_shallow_clone_build_is_judged_by_its_help_not_its_build_number() {
    let tmp = tempfile::tempdir().unwrap();
    let shallow = data("llama-perplexity-version-shallow-clone.txt");
    fake_set(tmp.path(), "exit 0");
    let help = real_help("llama-perplexity");
    fake_tool_of_version(tmp.path(), "llama-perplexity", &shallow, &help, "exit 0");
    let t = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    assert_eq!(t.build_number(), Some(1));
    assert_eq!(t.build_commit(), Some("abcdef0"));
    assert_eq!(t.build().plausible_build_number(), None);
    assert_eq!(t.judged_by(), "--help flags (build number 1 not plausible)");

    // The same build number with a --help that lacks a flag: too old for the flag only.
    let old_help = help.replace("--flash-attn [on|off|auto]", "--flash-attn");
    fake_tool_of_version(
        tmp.path(),
        "llama-perplexity",
        &shallow,
        &old_help,
        "exit 0",
    );
    let msg = LlamaCppTools::locate_in(&search_dir(tmp.path()))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`-fa on|off`"), "{msg}");
    assert!(!msg.contains("build number"), "{msg}");

    // A build outside a git checkout (build 0), and a plausible build number.
    fake_set(tmp.path(), "exit 0");
    let t = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    assert_eq!(t.judged_by(), "--help flags (no build number)");
    let b = llamacpp::tools::BuildInfo::parse("version: 7001 (0c1e570)\n").unwrap();
    assert_eq!(b.plausible_build_number(), Some(7001));
    assert_eq!(b.judged_by(), "build number and --help flags");
}

#[test]
fn too_old_tools_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), "exit 0");
    // A llama-perplexity from before `-fa on|off|auto` (flash attention was a bare switch).
    let old_help =
        real_help("llama-perplexity").replace("--flash-attn [on|off|auto]", "--flash-attn");
    fake_tool(tmp.path(), "llama-perplexity", &old_help, "exit 0");
    let e = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::ToolTooOld { .. }), "{msg}");
    assert!(
        msg.contains("`-fa on|off`") && msg.contains("b6343"),
        "{msg}"
    );
    assert!(msg.contains("scripts/setup-llama-cpp.sh"), "{msg}");

    // A build that reports a number below the minimum.
    fake_set(tmp.path(), "exit 0");
    script(
        &tmp.path().join("llama-perplexity"),
        "echo 'version: 4585 (cae9fb43)' >&2\n",
    );
    let msg = LlamaCppTools::locate_in(&search_dir(tmp.path()))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("build number 4585"), "{msg}");

    // A llama-bench without JSON output.
    fake_set(tmp.path(), "exit 0");
    fake_tool(
        tmp.path(),
        "llama-bench",
        "-o, --output <csv|md>\n",
        "exit 0",
    );
    let msg = LlamaCppTools::locate_in(&search_dir(tmp.path()))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`-o json`"), "{msg}");

    // An old llama-tokenize is optional: reported, not fatal.
    fake_set(tmp.path(), "exit 0");
    fake_tool(tmp.path(), "llama-tokenize", "--ids\n", "exit 0");
    std::fs::remove_file(tmp.path().join("llama-quantize")).unwrap();
    let t = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    assert_eq!(t.tokenize_path(), None);
    assert_eq!(t.quantize_path(), None);
    assert_eq!(t.notes().len(), 2, "{:?}", t.notes());
    assert!(t.notes()[0].contains("--no-escape"), "{:?}", t.notes());
}

#[test]
fn a_binary_that_is_not_llama_cpp() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), "exit 0");
    script(&tmp.path().join("llama-perplexity"), "echo hello\n");
    let msg = LlamaCppTools::locate_in(&search_dir(tmp.path()))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no `version: ...` line"), "{msg}");
    // Missing shared libraries make the loader fail: the stderr tail says so.
    script(
        &tmp.path().join("llama-perplexity"),
        "echo 'llama-perplexity: error while loading shared libraries: libllama.so.0' >&2\nexit 127\n",
    );
    let msg = LlamaCppTools::locate_in(&search_dir(tmp.path()))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("exit code 127") && msg.contains("libllama.so.0"),
        "{msg}"
    );
}

#[test]
fn timeout_kills_the_tool_and_its_children() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("slow-tool");
    // A child that would keep the pipes open for a minute if it survived the kill.
    script(&tool, "echo starting >&2\nsleep 60 &\nsleep 60\n");
    let cmd = ToolCommand::new("slow-tool", &tool, Duration::from_millis(300), "hint");
    let start = Instant::now();
    let e = process::run(&cmd, |_, _| {}).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Timeout { .. }), "{msg}");
    assert!(
        msg.contains("slow-tool timed out after 0.3 s and was killed"),
        "{msg}"
    );
    assert!(msg.contains("starting"), "stderr tail missing: {msg}");
    // The pipes were released by the group kill (not after the grandchild's 60 s). Loose
    // bound: this is a liveness check, not a timing measurement.
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn timeout_error_names_the_tool_and_duration() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), "sleep 30");
    let tools = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    let mut req = PerplexityRequest::new(
        "m.gguf".into(),
        "t.txt".into(),
        64,
        ComputeSettings::new(1, KvType::F32),
    );
    req.timeout = Duration::from_secs(1);
    let msg = llamacpp::run_perplexity(&tools, &req, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("llama-perplexity timed out after 1 s"),
        "{msg}"
    );
    assert!(msg.contains("-c 64"), "{msg}");
}

#[test]
fn llama_env_vars_are_removed_and_libraries_found() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("print-env");
    script(&tool, "env\n");
    // Set in this test process only; every other test ignores these names.
    std::env::set_var("LLAMA_ARG_CTX_SIZE", "7");
    std::env::set_var("LLAMA_ARG_FLASH_ATTN", "on");
    std::env::set_var("GGML_CPU_DISABLE_FUSION", "1");
    // Logging, scheduler debugging, OpenMP thread limits, download secrets.
    std::env::set_var("LLAMA_ARG_LOG_VERBOSITY", "9");
    std::env::set_var("LLAMA_TRACE", "1");
    std::env::set_var("GGML_SCHED_DEBUG", "2");
    std::env::set_var("OMP_THREAD_LIMIT", "1");
    std::env::set_var("GOMP_SPINCOUNT", "0");
    std::env::set_var("HF_TOKEN", "secret-value");
    std::env::set_var("KWK_UNRELATED_VAR", "kept");
    let cleared = process::cleared_env_vars();
    for name in [
        "LLAMA_ARG_CTX_SIZE",
        "LLAMA_ARG_LOG_VERBOSITY",
        "LLAMA_TRACE",
        "GGML_SCHED_DEBUG",
        "OMP_THREAD_LIMIT",
        "GOMP_SPINCOUNT",
        "HF_TOKEN",
    ] {
        assert!(cleared.contains(&name.to_string()), "{name}: {cleared:?}");
    }
    assert!(!cleared.contains(&"KWK_UNRELATED_VAR".to_string()));
    assert!(!cleared.iter().any(|n| n.contains("secret")));
    let cmd = ToolCommand::new("print-env", &tool, Duration::from_secs(30), "");
    let removed: Vec<String> = cmd
        .to_command()
        .get_envs()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    assert!(
        removed.contains(&"LLAMA_ARG_CTX_SIZE".to_string()),
        "{removed:?}"
    );
    let out = process::run(&cmd, |_, _| {}).unwrap();
    assert!(!out.stdout.contains("LLAMA_ARG_"), "{}", out.stdout);
    assert!(!out.stdout.contains("GGML_CPU_DISABLE_FUSION"));
    for name in [
        "LLAMA_TRACE",
        "GGML_SCHED_DEBUG",
        "OMP_THREAD_LIMIT",
        "GOMP_SPINCOUNT",
        "HF_TOKEN",
    ] {
        assert!(
            !out.stdout.contains(&format!("{name}=")),
            "{name}: {}",
            out.stdout
        );
    }
    assert!(out.stdout.contains("KWK_UNRELATED_VAR=kept"));
    let ld = out
        .stdout
        .lines()
        .find(|l| l.starts_with("LD_LIBRARY_PATH="))
        .unwrap();
    assert!(
        ld["LD_LIBRARY_PATH=".len()..].starts_with(&tmp.path().display().to_string()),
        "{ld}"
    );
}

#[test]
fn failure_carries_the_last_stderr_lines_and_the_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("failing");
    script(
        &tool,
        "i=1; while [ $i -le 30 ]; do echo \"line $i\" >&2; i=$((i+1)); done\nexit 3\n",
    );
    let cmd = ToolCommand::new("failing", &tool, Duration::from_secs(30), "do the thing");
    let msg = process::run(&cmd, |_, _| {}).unwrap_err().to_string();
    assert!(msg.contains("failing failed (exit code 3)"), "{msg}");
    assert!(msg.contains("line 11") && msg.contains("line 30"), "{msg}");
    assert!(!msg.contains("line 10\n"), "more than 20 lines kept: {msg}");
    assert!(msg.contains("Hint: do the thing"), "{msg}");
}

#[test]
fn large_output_on_both_pipes_does_not_block() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("chatty");
    // 2 MB on each pipe, far more than a pipe buffer holds.
    script(
        &tool,
        "head -c 2000000 /dev/zero | tr '\\0' o\nhead -c 2000000 /dev/zero | tr '\\0' e >&2\n",
    );
    let cmd = ToolCommand::new("chatty", &tool, Duration::from_secs(60), "");
    let out = process::run(&cmd, |_, _| {}).unwrap();
    assert_eq!(out.stdout.len(), 2_000_000);
    assert_eq!(out.stderr.len(), 2_000_000);
}

#[test]
fn perplexity_output_lost_every_time_is_an_error_not_a_result() {
    let tmp = tempfile::tempdir().unwrap();
    let counter = tmp.path().join("runs");
    fake_set(
        tmp.path(),
        &format!(
            "echo run >> '{}'\ncat '{}'\ncat '{}' >&2\nexit 0",
            counter.display(),
            data("tiny-llama-ppl-truncated.stdout").display(),
            data("tiny-llama-ppl-truncated.stderr").display()
        ),
    );
    let tools = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    let mut req = PerplexityRequest::new(
        "m.gguf".into(),
        "t.txt".into(),
        64,
        ComputeSettings::new(2, KvType::F32),
    );
    req.attempts = 3;
    let msg = llamacpp::run_perplexity(&tools, &req, |_| {})
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no `Final estimate` line"), "{msg}");
    assert!(msg.contains("in 3 run(s)"), "{msg}");
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap().lines().count(),
        3
    );
}

#[test]
fn perplexity_retry_recovers_a_lost_final_line() {
    let tmp = tempfile::tempdir().unwrap();
    let counter = tmp.path().join("runs");
    // First run: output cut short; second run: complete.
    fake_set(
        tmp.path(),
        &format!(
            "echo run >> '{c}'\nif [ \"$(wc -l < '{c}')\" -lt 2 ]; then cat '{ts}'; cat '{te}' >&2; \
             else cat '{s}'; cat '{e}' >&2; fi\nexit 0",
            c = counter.display(),
            ts = data("tiny-llama-ppl-truncated.stdout").display(),
            te = data("tiny-llama-ppl-truncated.stderr").display(),
            s = data("tiny-llama-ppl.stdout").display(),
            e = data("tiny-llama-ppl.stderr").display(),
        ),
    );
    let tools = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    let req = PerplexityRequest::new(
        "m.gguf".into(),
        "t.txt".into(),
        64,
        ComputeSettings::new(2, KvType::F32),
    );
    let mut seen = Vec::new();
    let run = llamacpp::run_perplexity(&tools, &req, |d| seen.push(d)).unwrap();
    assert_eq!(run.attempts, 2);
    assert_eq!(run.output.ppl, 25954.9134);
    assert_eq!(seen.last(), Some(&8));
}

#[test]
fn too_short_text_from_llama_perplexity_is_not_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let counter = tmp.path().join("runs");
    fake_set(
        tmp.path(),
        &format!(
            "echo run >> '{}'\ncat '{}' >&2\nexit 0",
            counter.display(),
            data("tiny-llama-too-short.stderr").display()
        ),
    );
    let tools = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    let req = PerplexityRequest::new(
        "m.gguf".into(),
        "short.txt".into(),
        64,
        ComputeSettings::new(2, KvType::F32),
    );
    let e = llamacpp::run_perplexity(&tools, &req, |_| {}).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::TextTooShort {
                got: Some(71),
                needed: 128,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("short.txt") && msg.contains("only 71 tokens"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap().lines().count(),
        1
    );
}

#[test]
fn commands_pin_every_result_changing_flag() {
    let tmp = tempfile::tempdir().unwrap();
    fake_set(tmp.path(), "exit 0");
    let tools = LlamaCppTools::locate_in(&search_dir(tmp.path())).unwrap();
    let mut req = PerplexityRequest::new(
        "/m/x.gguf".into(),
        "/t/wiki.test.raw".into(),
        512,
        ComputeSettings::new(2, KvType::F16),
    );
    req.chunks = Some(40);
    let cmd = req.command(&tools).unwrap().display();
    let tail = cmd.split_once(' ').unwrap().1;
    assert_eq!(
        tail,
        "-m /m/x.gguf -f /t/wiki.test.raw -c 512 -b 512 -ub 512 --chunks 40 -t 2 -tb 2 -ngl 0 -fa on -ctk f16 -ctv f16"
    );
    // Larger contexts keep llama.cpp's 512-token ubatch; one chunk is still one batch.
    let mut req2 = req.clone();
    req2.ctx = 1024;
    req2.compute = ComputeSettings::new(2, KvType::F32);
    let cmd = req2.command(&tools).unwrap().display();
    assert!(
        cmd.contains("-c 1024 -b 1024 -ub 512") && cmd.contains("-fa off -ctk f32 -ctv f32"),
        "{cmd}"
    );

    let bench = llamacpp::BenchRequest {
        model: "/m/x.gguf".into(),
        pp: 512,
        tg: 128,
        depth: 0,
        reps: 5,
        compute: ComputeSettings::new(2, KvType::F16),
        flash_attn: vec![],
        timeout: Duration::from_secs(60),
    };
    let cmd = bench.command(&tools).unwrap().display();
    assert_eq!(
        cmd.split_once(' ').unwrap().1,
        "-m /m/x.gguf -p 512 -n 128 -r 5 -t 2 -ngl 0 -fa 1 -ctk f16 -ctv f16 -b 2048 -ub 512 -o json --progress"
    );
    // At a depth, `-d D` after `-p/-n` (llama-bench's --n-depth); depth 0 passes none.
    let mut deep = bench.clone();
    deep.depth = 4096;
    deep.compute = ComputeSettings::new(1, KvType::F16);
    assert_eq!(
        deep.command(&tools).unwrap().display().split_once(' ').unwrap().1,
        "-m /m/x.gguf -p 512 -n 128 -d 4096 -r 5 -t 1 -ngl 0 -fa 1 -ctk f16 -ctv f16 -b 2048 -ub 512 -o json --progress"
    );
    let mut bad = bench.clone();
    bad.compute = ComputeSettings::new(2, KvType::F32);
    assert!(bad.command(&tools).unwrap_err().to_string().contains("f32"));
    // Both flash-attention settings in one invocation, as llama-bench's list `-fa 0,1`;
    // flash attention off with a quantized cache, or a setting twice, is refused.
    let mut both = bench.clone();
    both.flash_attn = vec![false, true];
    assert!(
        both.command(&tools)
            .unwrap()
            .display()
            .contains(" -fa 0,1 -ctk f16 "),
        "{}",
        both.command(&tools).unwrap().display()
    );
    both.compute = ComputeSettings::new(2, KvType::Q8_0);
    let e = both.command(&tools).unwrap_err().to_string();
    assert!(e.contains("q8_0") && e.contains("-fa 0"), "{e}");
    both.flash_attn = vec![true, true];
    let e = both.command(&tools).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");

    // Settings llama.cpp would misread are refused before anything runs.
    let mut odd = req.clone();
    odd.ctx = 511;
    assert!(odd.command(&tools).is_err());
    let mut zero = req.clone();
    zero.compute.threads = 0;
    assert!(zero.command(&tools).is_err());
}

/// The tool's peak RSS is its own: a shell holding a 48 MiB string reports at least that,
/// and less than the whole machine's memory.
#[cfg(target_os = "linux")]
#[test]
fn max_rss_is_the_tools_own_high_water_mark() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("big-tool");
    script(
        &tool,
        "x=$(head -c 50331648 /dev/zero | tr '\\0' a)\nsleep 0.3\necho ${#x}\n",
    );
    let cmd = ToolCommand::new("big-tool", &tool, Duration::from_secs(60), "");
    let out = process::run(&cmd, |_, _| {}).unwrap();
    assert_eq!(out.stdout.trim(), "50331648");
    let rss = out.max_rss_bytes.expect("VmHWM read while the tool ran");
    let total = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = total.lines().next().unwrap()["MemTotal:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    assert!(rss >= 48 << 20, "{rss}");
    assert!(rss < total_kib * 1024, "{rss}");
}

/// Writing a fake tool while other threads fork must not leave it "Text file busy": forks
/// happen continuously on two threads while 1000 freshly written scripts are each run once
/// (written with `std::fs::write` and `chmod`, about 2 % of them failed to start).
#[test]
fn scripts_written_while_other_threads_fork_can_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let forkers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::process::Command::new("true").status().unwrap();
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for i in 0..1000 {
        let path = tmp.path().join(format!("tool-{i}"));
        process::write_executable(&path, "#!/bin/sh\nexit 0\n").unwrap();
        if let Err(e) = std::process::Command::new(&path).status() {
            failures.push(format!("{}: {e}", path.display()));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in forkers {
        f.join().unwrap();
    }
    assert!(failures.is_empty(), "{failures:?}");
}
