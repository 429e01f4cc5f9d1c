//! Every bad input of issue 2 item 10: one `error:` line naming the input and the fix,
//! exit status 2, no panic, and no report left behind.

mod common;
use common::*;
use std::path::Path;

fn no_run_folder(out: &Path) {
    assert!(
        !out.join("results.json").exists(),
        "a report was left in {}",
        out.display()
    );
}

#[test]
fn odd_or_tiny_ctx() {
    for ctx in ["7", "4", "0", "513"] {
        let line = assert_error(
            kwk_eval().args(["--llm", "x", "--text", "x.txt", "--ctx", ctx]),
            2,
            &format!("--ctx {ctx} is not usable"),
        );
        assert!(line.contains("Pass e.g. --ctx 512"), "{line}");
    }
}

#[test]
fn unknown_format_name() {
    let line = assert_error(
        kwk_eval().args(["--llm", "x", "--text", "x.txt", "--formats", "float32,int7"]),
        2,
        "invalid value 'int7' for '--formats <LIST>': unknown weight format 'int7'; valid formats: float32 (f32), bf16,",
    );
    // The formats are listed once, with the harness's own GGUF rows.
    assert_eq!(line.matches("bf16").count(), 1, "{line}");
    assert!(
        line.contains(", or gguf:PATH for a GGUF run by llama.cpp"),
        "{line}"
    );
}

#[test]
fn missing_text_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        kwk_eval()
            .args([
                "--llm",
                "x",
                "--formats",
                "float32",
                "--text",
                "/nonexistent/notes.txt",
                "--out",
            ])
            .arg(&out),
        2,
        "reading --text '/nonexistent/notes.txt'",
    );
    assert!(line.contains("No such file"), "{line}");
    no_run_folder(&out);
}

#[test]
fn empty_and_non_utf8_text() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    assert_error(
        kwk_eval()
            .args(["--llm", "x", "--formats", "float32", "--text"])
            .arg(&empty),
        2,
        &format!("--text '{}' is empty", empty.display()),
    );
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait").unwrap();
    let line = assert_error(
        kwk_eval()
            .args(["--llm", "x", "--formats", "float32", "--text"])
            .arg(&latin1),
        2,
        &format!("--text '{}' is not UTF-8", latin1.display()),
    );
    assert!(
        line.contains("offset 3") && line.contains("convert it to UTF-8"),
        "{line}"
    );
}

#[test]
fn text_shorter_than_two_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("notes.txt");
    std::fs::write(&short, "A few words only.\n").unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        kwk_eval()
            .args(["--formats", "float32", "--ctx", "64", "--llm"])
            .arg(tiny_llama())
            .arg("--text")
            .arg(&short)
            .arg("--out")
            .arg(&out),
        2,
        &format!(
            "--ctx 64 needs at least 128 tokens; '{}' tokenizes to ",
            short.display()
        ),
    );
    assert!(
        line.ends_with("Pass a longer text or a smaller --ctx"),
        "{line}"
    );
    no_run_folder(&out);
}

#[test]
fn kwk_isa_the_cpu_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        kwk_eval()
            .env("KWK_ISA", "avx1024")
            .args([
                "--formats",
                "float32",
                "--ctx",
                "64",
                "--pp",
                "16",
                "--tg",
                "4",
            ])
            .arg("--llm")
            .arg(tiny_llama())
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        "KWK_ISA=avx1024 is not a kernel tier this CPU supports; set it to one of ",
    );
    assert!(
        line.contains("scalar") && line.ends_with(" or unset it"),
        "{line}"
    );
    no_run_folder(&out);
}

#[test]
fn directory_that_is_not_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let not_model = dir.path().join("photos");
    std::fs::create_dir(&not_model).unwrap();
    std::fs::write(not_model.join("cat.jpg"), b"\xff\xd8").unwrap();
    let out = dir.path().join("run");
    assert_error(
        kwk_eval()
            .args(["--formats", "float32", "--llm"])
            .arg(&not_model)
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        &format!("loading --llm '{}'", not_model.display()),
    );
    no_run_folder(&out);
}

#[test]
fn missing_gguf_and_not_gguf() {
    let dir = tempfile::tempdir().unwrap();
    assert_error(
        kwk_eval()
            .args([
                "--llm",
                "x",
                "--formats",
                "none",
                "--gguf",
                "/nonexistent/m.gguf",
                "--text",
            ])
            .arg(eval_txt()),
        2,
        "GGUF file '/nonexistent/m.gguf' does not exist",
    );
    let fake = dir.path().join("fake.gguf");
    std::fs::write(&fake, b"PK\x03\x04 this is a zip").unwrap();
    let line = assert_error(
        kwk_eval()
            .args(["--llm", "x", "--formats", "none", "--text"])
            .arg(eval_txt())
            .arg("--gguf")
            .arg(&fake),
        2,
        &format!("'{}' is not a GGUF file", fake.display()),
    );
    assert!(line.contains("pass a .gguf model file"), "{line}");
    assert_error(
        kwk_eval()
            .args(["--llm", "x", "--formats", "none", "--text"])
            .arg(eval_txt())
            .arg("--gguf")
            .arg(dir.path()),
        2,
        &format!("'{}' is a directory, not a GGUF file", dir.path().display()),
    );
}

/// A named pipe at `path` (no writer: an `open` of it would block forever).
fn fifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Refused in well under the time limit (a blocking `open` would hang until it).
fn quick(cmd: &mut assert_cmd::Command) -> &mut assert_cmd::Command {
    cmd.timeout(std::time::Duration::from_secs(60))
}

/// Named pipes and devices where a file belongs are refused before anything opens them
/// (an `open` of a pipe without a writer blocks forever): one line saying what they are.
#[test]
fn named_pipes_and_devices_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("model.gguf");
    fifo(&pipe);
    let out = dir.path().join("run");
    // --gguf (and gguf:PATH, the same check).
    assert_error(
        quick(
            kwk_eval()
                .args(["--formats", "none", "--llm"])
                .arg(tiny_llama())
                .arg("--text")
                .arg(eval_txt())
                .arg("--gguf")
                .arg(&pipe)
                .arg("--out")
                .arg(&out),
        ),
        2,
        &format!(
            "GGUF file '{}' is not a regular file (a named pipe); pass a .gguf model file",
            pipe.display()
        ),
    );
    // --baseline and compare's inputs.
    let results = dir.path().join("results.json");
    fifo(&results);
    assert_error(
        quick(
            kwk_eval()
                .args(["--formats", "float32", "--llm"])
                .arg(tiny_llama())
                .arg("--text")
                .arg(eval_txt())
                .arg("--baseline")
                .arg(&results)
                .arg("--out")
                .arg(&out),
        ),
        2,
        &format!(
            "reading --baseline: '{}' is not a regular file (a named pipe); pass a results.json written by kwk-eval",
            results.display()
        ),
    );
    for files in [[&results, &results], [&pipe, &results]] {
        assert_error(
            quick(kwk_eval().arg("compare").args(files)),
            2,
            &format!(
                "'{}' is not a regular file (a named pipe); pass a results.json written by kwk-eval",
                files[0].display()
            ),
        );
    }
    // --llm: a pipe, a device (each says what it is, not "does not exist").
    for (llm, kind) in [
        (pipe.display().to_string(), "a named pipe"),
        ("/dev/zero".to_string(), "a character device"),
    ] {
        for generate in [false, true] {
            let mut cmd = kwk_eval();
            if generate {
                cmd.args(["generate", "--prompt", "hi"]);
            } else {
                cmd.args(["--formats", "float32", "--text"])
                    .arg(eval_txt())
                    .arg("--out")
                    .arg(&out);
            }
            assert_error(
                quick(cmd.args(["--llm", &llm])),
                2,
                &format!(
                    "loading --llm '{llm}': '{llm}' is not a regular file or folder ({kind}); pass a .gguf file or a Hugging Face model folder"
                ),
            );
        }
    }
    // A model folder's tokenizer.json.
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(tiny_llama().join(f), model.join(f)).unwrap();
    }
    fifo(&model.join("tokenizer.json"));
    assert_error(
        quick(
            kwk_eval()
                .args(["--formats", "float32", "--llm"])
                .arg(&model)
                .arg("--text")
                .arg(eval_txt())
                .arg("--out")
                .arg(&out),
        ),
        2,
        &format!(
            "loading --llm '{}': tokenizer: {}: cannot read (not a regular file (a named pipe))",
            model.display(),
            model.join("tokenizer.json").display()
        ),
    );
    no_run_folder(&out);
}

/// A tokenizer with ids past the embedding's rows is refused when the model loads, naming
/// both sizes, not accepted until some row meets such an id.
#[test]
fn a_tokenizer_of_another_model_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny_llama().join(f), model.join(f)).unwrap();
    }
    let tok = model.join("tokenizer.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&tok).unwrap()).unwrap();
    let added = v["added_tokens"].as_array_mut().unwrap();
    let mut extra = added[0].clone();
    extra["id"] = 600.into();
    extra["content"] = "<|another-model|>".into();
    added.push(extra);
    std::fs::write(&tok, serde_json::to_vec(&v).unwrap()).unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        kwk_eval()
            .args(["--formats", "float32", "--ctx", "64", "--no-speed", "--llm"])
            .arg(&model)
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        &format!(
            "loading --llm '{}': tokenizer: {}: has ids up to ",
            model.display(),
            tok.display()
        ),
    );
    assert!(
        line.ends_with(
            "but the embedding has 512 rows (ids 0 to 511): the tokenizer does not belong to this model (use the model's own tokenizer.json)"
        ),
        "{line}"
    );
    no_run_folder(&out);
}

/// A shard the index lists but the folder lacks: one line naming the shard, the index and
/// the fix, when the model loads (not the I/O error twice when a row reads weights).
#[test]
fn a_missing_shard_is_one_line_naming_it_and_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(tiny_llama().join(f), model.join(f)).unwrap();
    }
    let first = model.join("model-00001-of-00002.safetensors");
    std::fs::copy(tiny_llama().join("model.safetensors"), &first).unwrap();
    let bytes = std::fs::read(&first).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut map = serde_json::Map::new();
    for name in header.as_object().unwrap().keys() {
        if name != "__metadata__" {
            let shard = if name.contains("layers.1.") { 2 } else { 1 };
            map.insert(
                name.clone(),
                format!("model-0000{shard}-of-00002.safetensors").into(),
            );
        }
    }
    let index = model.join("model.safetensors.index.json");
    std::fs::write(
        &index,
        serde_json::to_vec(&serde_json::json!({"metadata": {}, "weight_map": map})).unwrap(),
    )
    .unwrap();
    let out = dir.path().join("run");
    let line = assert_error(
        kwk_eval()
            .args(["--formats", "float32", "--ctx", "64", "--no-speed", "--llm"])
            .arg(&model)
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        &format!(
            "loading --llm '{m}': {i}: lists shard 'model-00002-of-00002.safetensors', which is not in the folder (1 of 2 shards missing); download the missing shards into '{m}' again",
            m = model.display(),
            i = index.display()
        ),
    );
    assert_eq!(line.matches("No such file").count(), 0, "{line}");
    no_run_folder(&out);
}

#[test]
fn baseline_missing_or_not_results() {
    let dir = tempfile::tempdir().unwrap();
    assert_error(
        kwk_eval()
            .args([
                "--llm",
                "x",
                "--formats",
                "float32",
                "--baseline",
                "/nonexistent/results.json",
                "--text",
            ])
            .arg(eval_txt()),
        2,
        "reading --baseline: reading '/nonexistent/results.json'",
    );
    let bad = dir.path().join("results.json");
    std::fs::write(&bad, "{\"runners\": []}").unwrap();
    assert_error(
        kwk_eval()
            .args(["--llm", "x", "--formats", "float32", "--text"])
            .arg(eval_txt())
            .arg("--baseline")
            .arg(&bad),
        2,
        &format!(
            "reading --baseline: '{}' has no schema_version",
            bad.display()
        ),
    );
}

#[test]
fn kld_without_float32_and_out_with_old_results() {
    assert_error(
        kwk_eval().args([
            "--llm",
            "x",
            "--text",
            "x.txt",
            "--formats",
            "int8",
            "--kld",
        ]),
        2,
        "--kld compares against the float32 reference",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("results.json"), "{}").unwrap();
    assert_error(
        kwk_eval()
            .args(["--llm", "x", "--formats", "float32", "--text"])
            .arg(eval_txt())
            .arg("--out")
            .arg(dir.path()),
        2,
        &format!(
            "--out '{}' already holds a results.json",
            dir.path().display()
        ),
    );
}

#[test]
fn clap_errors_are_one_line_too() {
    assert_error(
        kwk_eval().args(["--llm", "x"]),
        2,
        "the following required arguments were not provided",
    );
    assert_error(
        kwk_eval().args(["--llm", "x", "--text", "t", "--ctx", "abc"]),
        2,
        "invalid value 'abc'",
    );
}

#[test]
fn help_explains_every_flag() {
    let out = kwk_eval().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--llm",
        "--text",
        "--formats",
        "--gguf",
        "--llama-bench",
        "--llama-cpp-dir",
        "--llama-fa",
        "--ctx",
        "--chunks",
        "--threads",
        "--pp",
        "--tg",
        "--reps",
        "--out",
        "--baseline",
        "--max-ppl-regression",
        "--max-speed-regression",
        "--no-speed",
        "--kld",
        "--keep-logits",
        "--reference",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    let out = kwk_eval().args(["generate", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--prompt",
        "--max-new-tokens",
        "--format",
        "--temperature",
        "--top-k",
        "--top-p",
        "--seed",
    ] {
        assert!(help.contains(flag), "generate --help lacks {flag}");
    }
}

/// kwk-eval asked for a GGUF row, with llama.cpp looked up only where `dir` says.
fn gguf_run(dir: &Path, llama_dir: &Path, gguf: &Path) -> assert_cmd::Command {
    let mut c = kwk_eval();
    c.env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("KWK_CACHE")
        .args(["--formats", "none", "--llm"])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--llama-cpp-dir")
        .arg(llama_dir)
        .arg("--gguf")
        .arg(gguf)
        .arg("--out")
        .arg(dir.join("run"));
    c
}

#[test]
fn llama_cpp_missing() {
    let dir = tempfile::tempdir().unwrap();
    let line = assert_error(
        &mut gguf_run(
            dir.path(),
            &dir.path().join("no-llama"),
            &tiny_llama().join("model.gguf"),
        ),
        2,
        "llama.cpp tool `llama-perplexity` not found",
    );
    assert!(line.contains("--llama-cpp-dir"), "{line}");
    no_run_folder(&dir.path().join("run"));
}

#[test]
fn llama_cpp_too_old() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("old-llama");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["llama-perplexity", "llama-bench"] {
        let p = bin.join(tool);
        llamacpp::process::write_executable(
            &p,
            "#!/bin/sh\necho 'version: 1000 (0123abc)' >&2\necho 'usage: old' >&2\n",
        )
        .unwrap();
    }
    let line = assert_error(
        &mut gguf_run(dir.path(), &bin, &tiny_llama().join("model.gguf")),
        2,
        &format!(
            "llama.cpp tool {} is too old",
            bin.join("llama-perplexity").display()
        ),
    );
    assert!(line.contains("build number 1000"), "{line}");
    no_run_folder(&dir.path().join("run"));
}

#[test]
fn truncated_gguf() {
    let Some(llama_dir) = std::env::var_os("KWK_LLAMA_CPP_DIR_FOR_TESTS")
        .or_else(|| std::env::var_os("KWK_LLAMA_CPP_DIR"))
        .map(std::path::PathBuf::from)
        .or_else(default_llama_dir)
    else {
        panic!(
            "llama.cpp tools not found: run scripts/setup-llama-cpp.sh or set KWK_LLAMA_CPP_DIR"
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(tiny_llama().join("model.gguf")).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let line = assert_error(
        &mut gguf_run(dir.path(), &llama_dir, &cut),
        2,
        &format!(
            "{} cannot be run by llama.cpp; pass a complete GGUF model file",
            cut.display()
        ),
    );
    assert!(!line.is_empty());
    no_run_folder(&dir.path().join("run"));
}

/// The set-up script's build folder (`ROOT/llama.cpp-*/build/bin`, docs/paths.md).
fn default_llama_dir() -> Option<std::path::PathBuf> {
    let root = kwk::paths::cache_root(&kwk::paths::CacheEnv::from_env())?;
    let mut bins: Vec<_> = std::fs::read_dir(&root)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("build/bin"))
        .filter(|p| p.join("llama-perplexity").exists())
        .collect();
    bins.sort();
    bins.pop()
}

#[test]
fn context_longer_than_the_model_allows() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // tiny-llama was trained for 256 positions; pp 512 + tg 128 needs 640.
    let line = assert_error(
        kwk_eval()
            .args(["--formats", "float32", "--ctx", "64", "--llm"])
            .arg(tiny_llama())
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        &format!(
            "the in-tree decoder cannot run --llm '{}' with --ctx 64 and --pp 512 + --tg 128",
            tiny_llama().display()
        ),
    );
    assert!(line.contains("256"), "{line}");
    no_run_folder(&out);
}

#[test]
fn calibration_on_the_scored_text_or_too_short() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let copy = dir.path().join("copy.txt");
    std::fs::copy(eval_txt(), &copy).unwrap();
    let run = |calib: &Path| {
        let mut c = kwk_eval();
        c.args([
            "--formats",
            "int4:calib",
            "--ctx",
            "64",
            "--no-speed",
            "--llm",
        ])
        .arg(tiny_llama())
        .arg("--text")
        .arg(eval_txt())
        .arg("--calib-text")
        .arg(calib)
        .arg("--out")
        .arg(&out);
        c
    };
    let line = assert_error(
        &mut run(&copy),
        2,
        &format!(
            "--calib-text '{}' is the same text as --text",
            copy.display()
        ),
    );
    assert!(line.ends_with("(the report marks the run)"), "{line}");
    no_run_folder(&out);
    // A text holding a slice of the scored chunks is refused too.
    let eval = std::fs::read_to_string(eval_txt()).unwrap();
    let holds = dir.path().join("holds.txt");
    std::fs::write(
        &holds,
        format!("Some other words first.\n{}", &eval[..3000]),
    )
    .unwrap();
    let line = assert_error(
        &mut run(&holds),
        2,
        &format!(
            "--calib-text '{}' shares 64 tokens in a row with the scored text",
            holds.display()
        ),
    );
    assert!(line.ends_with("(the report marks the run)"), "{line}");
    no_run_folder(&out);
    // The same file with a token range over the scored chunks is refused.
    let line = assert_error(
        run(&copy).args(["--chunks", "2", "--calib-range", "0:800"]),
        2,
        &format!(
            "--calib-text '{}' shares 64 tokens in a row",
            copy.display()
        ),
    );
    assert!(
        line.contains("(calibration token 0, scored token 0)"),
        "{line}"
    );
    no_run_folder(&out);
    let line = assert_error(
        run(&copy).args(["--calib-range", "5:1"]),
        2,
        "invalid value '5:1' for '--calib-range",
    );
    assert!(line.contains("START must be below END"), "{line}");
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "Too few words to calibrate on.\n").unwrap();
    let line = assert_error(
        &mut run(&short),
        2,
        &format!("--calib-text '{}' has ", short.display()),
    );
    assert!(line.ends_with("pass a longer text"), "{line}");
    no_run_folder(&out);
}

/// A GGUF whose tensor table has Llama-2-7B's shape (`layers` of 32 layers of 4096, FFN
/// 11008; the fixtures' tokenizer and vocabulary) with float32 data, sparse on disk: 26 GB
/// with 32 layers, never read.
fn sparse_7b_gguf(dir: &Path, layers: usize) -> std::path::PathBuf {
    use kwk_fixtures::models::{specs, VOCAB};
    let texts = kwk_fixtures::text::read();
    let bpe = kwk_fixtures::bpe::train(&texts.training, VOCAB);
    let spec = kwk_fixtures::models::Spec {
        name: "big",
        hidden: 4096,
        intermediate: 11008,
        layers,
        heads: 32,
        kv_heads: 32,
        ..specs()[0].clone()
    };
    let (d, f) = (spec.hidden, spec.intermediate);
    let mut tensors = vec![("token_embd.weight".to_string(), vec![d, VOCAB])];
    for l in 0..spec.layers {
        for (name, dims) in [
            ("attn_norm", vec![d]),
            ("attn_q", vec![d, d]),
            ("attn_k", vec![d, d]),
            ("attn_v", vec![d, d]),
            ("attn_output", vec![d, d]),
            ("ffn_norm", vec![d]),
            ("ffn_gate", vec![d, f]),
            ("ffn_up", vec![d, f]),
            ("ffn_down", vec![f, d]),
        ] {
            tensors.push((format!("blk.{l}.{name}.weight"), dims));
        }
    }
    tensors.push(("output_norm.weight".to_string(), vec![d]));
    let (header, data) = kwk_fixtures::gguf::header_bytes(&spec.gguf_metadata(&bpe), &tensors);
    let path = dir.join(format!("big-{layers}.gguf"));
    std::fs::write(&path, &header).unwrap();
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.set_len(header.len() as u64 + data).unwrap();
    path
}

/// A row that cannot fit in memory is refused before anything is loaded, naming the need
/// and what is available (issue 42 item 8: a 7B F32 GGUF was packed towards the OOM
/// killer). The available memory is the testing override, so the result does not depend
/// on this machine; the check reads no weight (the file is sparse) and hashes nothing.
#[test]
fn rows_that_cannot_fit_in_memory_are_refused_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    let big = sparse_7b_gguf(dir.path(), 32);
    let out = dir.path().join("run");
    let started = std::time::Instant::now();
    assert_error(
        kwk_eval()
            .env("KWK_TEST_MEM_AVAILABLE_BYTES", "20000000000")
            .env_remove("KWK_MEMORY_CHECK")
            .args(["--formats", "int4,float32", "--ctx", "64", "--no-speed", "--llm"])
            .arg(&big)
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        "float32 of big-32.gguf needs about 51.9 GB resident (weights 51.8 GB as float32 while packing, KV cache 0.1 GB); \
         this machine has 20.0 GB available (KWK_TEST_MEM_AVAILABLE_BYTES) — use a smaller model or fewer formats \
         (KWK_MEMORY_CHECK=0 skips this check)",
    );
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
    no_run_folder(&out);
    // `generate` checks the same before it reads a weight.
    assert_error(
        kwk_eval()
            .env("KWK_TEST_MEM_AVAILABLE_BYTES", "20000000000")
            .env_remove("KWK_MEMORY_CHECK")
            .args(["generate", "--format", "float32", "--prompt", "the", "--llm"])
            .arg(&big),
        2,
        "float32 of big-32.gguf needs about 52.0 GB resident (weights 51.8 GB as float32 while packing, KV cache 0.2 GB); \
         this machine has 20.0 GB available (KWK_TEST_MEM_AVAILABLE_BYTES) — use a smaller model, another --format or \
         fewer --max-new-tokens (KWK_MEMORY_CHECK=0 skips this check)",
    );

    // With speed every row is kept until the speed rounds end. Two of the 7B's layers
    // (0.4 G parameters, 1.6 GB sparse): float32 alone needs 3.3 GB (masters and panels)
    // and fits in 3.6 GB; bf16 needs 2.5 GB plus the 1.6 GB float32 keeps.
    let small = sparse_7b_gguf(dir.path(), 2);
    let line = assert_error(
        kwk_eval()
            .env("KWK_TEST_MEM_AVAILABLE_BYTES", "3600000000")
            .env_remove("KWK_MEMORY_CHECK")
            .args([
                "--formats",
                "float32,bf16",
                "--ctx",
                "64",
                "--pp",
                "64",
                "--tg",
                "16",
                "--llm",
            ])
            .arg(&small)
            .arg("--text")
            .arg(eval_txt())
            .arg("--out")
            .arg(&out),
        2,
        "bf16 of big-2.gguf needs about ",
    );
    assert!(line.contains("1.6 GB kept by the rows before it"), "{line}");
    no_run_folder(&out);
}
