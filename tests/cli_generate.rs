//! `kwk-eval generate` on the tiny fixture: the prompt and a continuation on stdout, the
//! speeds on stderr; bad input exits 2 with one error line.

mod common;
use common::*;

#[test]
fn generate_streams_text_and_prints_speeds() {
    let out = kwk_eval()
        .args([
            "generate",
            "--prompt",
            "The quick brown fox",
            "--max-new-tokens",
            "8",
            "--format",
            "float32",
        ])
        .args(["--threads", "2", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.starts_with("The quick brown fox"), "{stdout}");
    assert!(
        stdout.len() > "The quick brown fox\n".len(),
        "nothing generated: {stdout:?}"
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("prompt: "))
        .expect(&stderr);
    assert!(
        line.contains("tokens/s); generation: ") && line.contains("format float32"),
        "{line}"
    );
    // Greedy decoding is deterministic.
    let again = kwk_eval()
        .args([
            "generate",
            "--prompt",
            "The quick brown fox",
            "--max-new-tokens",
            "8",
            "--format",
            "float32",
        ])
        .args(["--threads", "1", "--no-pack-cache", "--llm"])
        .arg(tiny_llama())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout);
}

#[test]
fn generate_bad_input() {
    assert_error(
        kwk_eval().args(["generate", "--llm", "x", "--prompt", ""]),
        2,
        "--prompt is empty",
    );
    assert_error(
        kwk_eval().args([
            "generate", "--llm", "x", "--prompt", "hi", "--format", "int7",
        ]),
        2,
        "--format: unknown weight format 'int7'; valid formats: float32",
    );
}

/// `KWK_ISA` naming no tier this CPU runs is refused by `generate` as by a run (exit 2),
/// not warned about and replaced by another tier.
#[test]
fn generate_refuses_a_bogus_kwk_isa() {
    let line = assert_error(
        kwk_eval()
            .env("KWK_ISA", "bogus")
            .args([
                "generate",
                "--prompt",
                "hi",
                "--max-new-tokens",
                "2",
                "--llm",
            ])
            .arg(tiny_llama()),
        2,
        "KWK_ISA=bogus is not a kernel tier this CPU supports; set it to one of ",
    );
    assert!(line.ends_with(" or unset it"), "{line}");
}

#[test]
fn generate_missing_model() {
    assert_error(
        kwk_eval().args([
            "generate",
            "--llm",
            "/nonexistent/model",
            "--prompt",
            "hi",
            "--format",
            "float32",
        ]),
        2,
        "loading --llm '/nonexistent/model'",
    );
}

/// Gemma 3's sliding window in generation (issue 38): greedy decoding of Gemma 3 270M in
/// float32 runs far past the 512-token window of its local layers (their KV cache a ring of
/// the window's length) and gives the same continuation as llama.cpp's llama-completion on
/// the same F32 GGUF with a float32 KV cache, token for token (compared as the text both
/// print).
#[test]
fn gemma3_greedy_past_the_window_matches_llama_completion() {
    let model = gemma3_f32_gguf();
    let prompt = "The history of the Roman Empire";
    let new_tokens = 560;
    let ours = kwk_eval()
        .args(["generate", "--prompt", prompt, "--format", "float32"])
        .args(["--max-new-tokens", &new_tokens.to_string()])
        .args(["--threads", "2", "--no-pack-cache", "--llm"])
        .arg(&model)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&ours.stderr);
    assert_eq!(ours.status.code(), Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("prompt: "))
        .expect(&stderr);
    assert!(
        line.contains(&format!("generation: {new_tokens} tokens")),
        "the generation stopped before {new_tokens} tokens, short of the window: {line}"
    );
    let ours = String::from_utf8_lossy(&ours.stdout);
    let ours = ours.strip_prefix(prompt).expect(&ours).trim_end();
    let theirs = std::process::Command::new(llama_dir().join("llama-completion"))
        .arg("-m")
        .arg(&model)
        .args(["-p", prompt, "-n", &new_tokens.to_string()])
        .args(["--temp", "0", "--top-k", "1", "--seed", "0", "-no-cnv"])
        // One thread: llama.cpp's spinning workers crawl on a shared machine.
        .args([
            "-ctk", "f32", "-ctv", "f32", "-c", "1024", "-t", "1", "-ngl", "0",
        ])
        .args(["--no-warmup", "--ignore-eos"])
        .output()
        .unwrap();
    let their_err = String::from_utf8_lossy(&theirs.stderr);
    assert!(theirs.status.success(), "llama-completion: {their_err}");
    let theirs = String::from_utf8_lossy(&theirs.stdout);
    let theirs = theirs.strip_prefix(prompt).expect(&theirs).trim_end();
    let same = ours
        .chars()
        .zip(theirs.chars())
        .take_while(|(a, b)| a == b)
        .count();
    assert_eq!(
        ours,
        theirs,
        "first difference after {same} characters:\nkwk:       {:?}\nllama.cpp: {:?}",
        ours.chars().skip(same).take(80).collect::<String>(),
        theirs.chars().skip(same).take(80).collect::<String>()
    );
}
