//! The GGUF tokenizer against llama.cpp's own: the ids of SmolLM2-135M-Instruct's
//! byte-level BPE (`tokenizer.ggml.pre = smollm`) must equal `llama-tokenize`'s, on the whole
//! of wiki.test.raw as llama-perplexity reads it and on strings chosen to hit the
//! pre-tokenizer's corner cases.

mod common;

use std::time::Instant;

use kwk::tokenizer::Tokenizer;

fn smollm2_tokenizer() -> Tokenizer {
    let meta = common::temp_gguf_metadata::read(&common::smollm2_gguf());
    Tokenizer::from_gguf(&meta).expect("SmolLM2 GGUF tokenizer")
}

/// Panics with the first difference and its surroundings.
fn assert_same_ids(what: &str, ours: &[u32], theirs: &[u32]) {
    if ours == theirs {
        return;
    }
    let first = ours
        .iter()
        .zip(theirs)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.len().min(theirs.len()));
    let lo = first.saturating_sub(5);
    panic!(
        "{what}: kwk has {} ids, llama-tokenize {}; first difference at index {first}:\n  kwk   {:?}\n  llama {:?}",
        ours.len(),
        theirs.len(),
        &ours[lo..(first + 6).min(ours.len())],
        &theirs[lo..(first + 6).min(theirs.len())]
    );
}

#[test]
fn smollm2_wiki_test_raw_ids_equal_llama_tokenize() {
    let tokenizer = smollm2_tokenizer();
    assert!(
        !tokenizer.add_bos(),
        "SmolLM2's GGUF sets tokenizer.ggml.add_bos_token = false"
    );
    let text = common::perplexity_text(&common::wiki_test_raw());
    let start = Instant::now();
    let ours = tokenizer.encode(&text, true).expect("encode");
    let elapsed = start.elapsed();
    eprintln!(
        "kwk tokenized wiki.test.raw ({} bytes) into {} tokens in {:.3} s",
        text.len(),
        ours.len(),
        elapsed.as_secs_f64()
    );
    let theirs = common::llama_tokenize(&common::smollm2_gguf(), &text);
    assert_same_ids("wiki.test.raw", &ours, &theirs);
    // Byte-level BPE is lossless: the ids decode back to the exact text.
    assert_eq!(tokenizer.decode(&ours).expect("decode"), text);
}

/// Strings that exercise every branch of llama.cpp's GPT-2 scanner and the digit split.
const TRICKY: &[&str] = &[
    "",
    " ",
    "  ",
    "\n",
    "\r\n",
    "Hello world",
    " Hello  world  ",
    "line one\r\nline two\r\n\r\n = Heading = \r\n",
    "tabs\tand\t\tmore\t",
    "it's, we're, they've, I'm, he'll, she'd, don't",
    "IT'S WE'RE THEY'VE I'M HE'LL SHE'D",
    " 's 't 're 've 'm 'll 'd '",
    "'''quoted''' and ''double''",
    "1234567890 12 345 6,789.01 1e-5 -42",
    "2024-01-31T12:00:00Z",
    "x²+y³=z¹ ½ ⅓ Ⅻ ① ٣٤٥ १२३",
    "naïve café résumé Ångström",
    "Привет мир, Γειά σου Κόσμε",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "ℌello ﬁne ＦＵＬＬＷＩＤＴＨ",
    "non\u{a0}breaking\u{2009}thin\u{3000}ideographic\u{2028}sep",
    "zero\u{200b}width\u{feff}bom",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<repo_name>kwk<file_sep>main.rs",
    "@-@ @,@ @.@ — – ‘single’ “double” …",
    "$100 + 5% = <tag> ^caret~ |pipe| `code` {brace} [bracket] #hash",
    "a\u{0301}e\u{0300} combining marks",
    "\u{1c89}\u{2ebf0} unicode 16 and 15.1",
    "trailing spaces   ",
    "    leading spaces",
    "mixed \n \r\n\t \u{a0}\n end",
];

#[test]
fn smollm2_tricky_strings_equal_llama_tokenize() {
    let tokenizer = smollm2_tokenizer();
    let model = common::smollm2_gguf();
    for text in TRICKY {
        let ours = tokenizer.encode(text, true).expect("encode");
        let theirs = common::llama_tokenize(&model, text);
        assert_same_ids(&format!("{text:?}"), &ours, &theirs);
        assert_eq!(&tokenizer.decode(&ours).expect("decode"), text);
    }
}
