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
