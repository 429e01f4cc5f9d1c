//! The GGUF tokenizer against llama.cpp's own: the ids of SmolLM2-135M-Instruct's
//! byte-level BPE (`tokenizer.ggml.pre = smollm`) must equal `llama-tokenize`'s, on the whole
//! of wiki.test.raw as llama-perplexity reads it and on strings chosen to hit the
//! pre-tokenizer's corner cases.

mod common;

use std::time::Instant;

use kwk::tokenizer::Tokenizer;

fn smollm2_tokenizer() -> Tokenizer {
    let meta = common::gguf_tokenizer_metadata(&common::smollm2_gguf());
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

fn gemma3_tokenizer() -> Tokenizer {
    let meta = common::gguf_tokenizer_metadata(&common::gemma3_gguf());
    Tokenizer::from_gguf(&meta).expect("Gemma 3 GGUF tokenizer")
}

/// Gemma 3's SentencePiece (262,144 pieces, byte fallback, no space prefix, BOS added) on
/// the whole of wiki.test.raw as llama-perplexity reads it.
#[test]
fn gemma3_wiki_test_raw_ids_equal_llama_tokenize() {
    let tokenizer = gemma3_tokenizer();
    assert!(
        tokenizer.add_bos(),
        "Gemma 3's GGUF sets tokenizer.ggml.add_bos_token = true"
    );
    let text = common::perplexity_text(&common::wiki_test_raw());
    let ours = tokenizer.encode(&text, true).expect("encode");
    let theirs = common::llama_tokenize(&common::gemma3_gguf(), &text);
    assert_same_ids("gemma3, wiki.test.raw", &ours, &theirs);
    assert_eq!(ours.first(), Some(&2), "BOS first");
}

/// Gemma 3 on the corner strings, and on ones its vocabulary makes special: its chat
/// control tokens, runs of spaces, tabs and newlines (Gemma has whole-run pieces), and
/// characters outside the vocabulary (byte fallback).
#[test]
fn gemma3_tricky_strings_equal_llama_tokenize() {
    let tokenizer = gemma3_tokenizer();
    let model = common::gemma3_gguf();
    let gemma_specific = [
        "<start_of_turn>user\nWrite a poem<end_of_turn>\n<start_of_turn>model\n",
        "<bos><eos><pad> literal specials",
        "                                 thirty-three spaces",
        "\t\t\t\t\ttabs\n\n\n\n\nnewlines\r\n\r\n",
        "\u{10fffd}\u{e000} private use, \u{1}\u{7f} controls",
        "<0x41> looks like a byte token",
        "▁ the piece marker itself ▁▁",
    ];
    for text in TRICKY.iter().copied().chain(gemma_specific) {
        let ours = tokenizer.encode(text, true).expect("encode");
        let theirs = common::llama_tokenize(&model, text);
        assert_same_ids(&format!("gemma3, {text:?}"), &ours, &theirs);
    }
}

/// The first `n` bytes of the perplexity text, cut at a character boundary.
fn wiki_excerpt(n: usize) -> String {
    let text = common::perplexity_text(&common::wiki_test_raw());
    let mut end = n.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Compares kwk and llama-tokenize on `texts` for the tokenizer `meta` (written to a
/// tensorless GGUF that llama-tokenize loads).
fn check_against_llama_tokenize(
    label: &str,
    meta: &kwk::tokenizer::GgufTokenizerMetadata,
    texts: &[&str],
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let gguf = dir.path().join("vocab.gguf");
    common::vocab_only_gguf::write(&gguf, meta);
    let tokenizer = Tokenizer::from_gguf(meta).unwrap_or_else(|e| panic!("{label}: {e}"));
    for text in texts {
        let ours = tokenizer.encode(text, true).expect("encode");
        let theirs = common::llama_tokenize(&gguf, text);
        let shown: String = text.chars().take(60).collect();
        assert_same_ids(&format!("{label}, text {shown:?}"), &ours, &theirs);
    }
}

/// SmolLM2's vocabulary and merges under the other pre-tokenizer types: each one's split
/// rules (and llama3's ignore_merges and BOS default) against llama.cpp's.
#[test]
fn other_pre_tokenizers_equal_llama_tokenize() {
    let base = common::gguf_tokenizer_metadata(&common::smollm2_gguf());
    let excerpt = wiki_excerpt(60_000);
    // One llama-tokenize run per text and vocabulary load: the corner cases joined into
    // one text (they are separated by newlines), and the excerpt.
    let joined = TRICKY.join("\n");
    let texts = [
        joined.as_str(),
        excerpt.as_str(),
        "  ends in white space \r\n \t ",
    ];
    for pre in [
        "gpt-2",
        "default",
        "llama-bpe",
        "qwen2",
        "dbrx",
        "starcoder",
    ] {
        let mut meta = base.clone();
        meta.pre = Some(pre.to_string());
        // Let the pre-tokenizer type decide the BOS (llama-bpe: yes).
        meta.add_bos = None;
        check_against_llama_tokenize(&format!("pre {pre}"), &meta, &texts);
        let tokenizer = Tokenizer::from_gguf(&meta).unwrap();
        assert_eq!(
            tokenizer.add_bos(),
            pre == "llama-bpe",
            "pre {pre}: llama.cpp's BOS default"
        );
    }
}

/// A USER_DEFINED token is matched in the input even with parse_special = false; a
/// CONTROL token's text is tokenized as plain text.
#[test]
fn user_defined_tokens_split_like_llama_cpp() {
    let mut meta = common::gguf_tokenizer_metadata(&common::smollm2_gguf());
    let types = meta.token_types.as_mut().expect("token types");
    types[3] = 4; // <repo_name>: user-defined
    types[5] = 4; // <file_sep>
    let texts = [
        "<repo_name>kwk<file_sep>src/main.rs<filename>x",
        "a<repo_name><repo_name> b <file_sep>\n<|im_start|>",
        "<repo_name",
    ];
    check_against_llama_tokenize("user-defined tokens", &meta, &texts);
    let tokenizer = Tokenizer::from_gguf(&meta).unwrap();
    let ids = tokenizer.encode("x<repo_name>y", false).unwrap();
    assert!(ids.contains(&3), "{ids:?}");
    let ids = tokenizer.encode("x<|im_start|>y", false).unwrap();
    assert!(
        !ids.contains(&1),
        "control token text is plain text: {ids:?}"
    );
}

/// A small SentencePiece vocabulary: the 256 byte tokens, single characters, and pieces
/// cut from a few sentences with scores that depend on the piece, so that merge order
/// matters; one user-defined and one control token.
fn synthetic_spm(add_space_prefix: Option<bool>) -> kwk::tokenizer::GgufTokenizerMetadata {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0f32; 3];
    let mut types = vec![2, 3, 3];
    for (text, ty) in [("<sep>", 4), ("<ctl>", 3)] {
        tokens.push(text.into());
        scores.push(0.0);
        types.push(ty);
    }
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    let sentences = [
        "the quick brown fox jumps over the lazy dog",
        "hello world, hello there; theory of the thermal thing",
        "naïve café über straße",
        "1234 5678 2024 3.14",
    ];
    let mut seen = std::collections::HashSet::new();
    for sentence in sentences {
        let escaped = format!(" {sentence}").replace(' ', "\u{2581}");
        let chars: Vec<char> = escaped.chars().collect();
        for len in 1..=6 {
            for start in 0..chars.len().saturating_sub(len - 1) {
                let piece: String = chars[start..start + len].iter().collect();
                if seen.insert(piece.clone()) {
                    // A score from the piece's bytes: deterministic, uneven, with ties.
                    let h = piece
                        .bytes()
                        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
                    tokens.push(piece);
                    scores.push(-((h % 17) as f32) - len as f32 * 0.5);
                    types.push(1);
                }
            }
        }
    }
    kwk::tokenizer::GgufTokenizerMetadata {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_space_prefix,
        ..Default::default()
    }
}

#[test]
fn synthetic_sentencepiece_equals_llama_tokenize() {
    let texts = [
        "",
        "the quick brown fox",
        " the  quick\tbrown\n\nfox ",
        "hello world, hello there; theory of the thermal thing",
        "naïve café über straße — ünknown ç 日本 😀",
        "1234 5678 2024 3.14 99999",
        "a<sep>b <sep> c<ctl>d",
        "<sep>start",
        "end<sep>",
        "thethethe quickquick",
    ];
    // A long text: mostly single characters and byte fallbacks for this small vocabulary.
    let excerpt = wiki_excerpt(30_000);
    for add_space_prefix in [None, Some(false)] {
        let meta = synthetic_spm(add_space_prefix);
        let label = format!("SPM, add_space_prefix {add_space_prefix:?}");
        check_against_llama_tokenize(&label, &meta, &texts);
        check_against_llama_tokenize(&label, &meta, &[excerpt.as_str()]);
        let tokenizer = Tokenizer::from_gguf(&meta).unwrap();
        assert!(tokenizer.add_bos(), "SentencePiece adds a BOS by default");
        for text in texts {
            // With the space prefix, llama.cpp also puts a space after every user-defined
            // token (`is_prev_special`), which decoding keeps.
            if add_space_prefix != Some(false) && text.contains("<sep>") {
                continue;
            }
            let ids = tokenizer.encode(text, false).unwrap();
            assert_eq!(
                tokenizer.decode(&ids).unwrap(),
                text,
                "SPM decode(encode({text:?}))"
            );
        }
    }
}

/// A tokenizer.json in the layout of SmolLM2's (the StarCoder tokenizer: a BPE model,
/// pre-tokenizer `Sequence[Digits(individual_digits), ByteLevel(no prefix space)]`,
/// special added tokens), built from the GGUF's vocabulary and merges. Not the model's own
/// file (which is not installed here): it checks that the `tokenizers` crate path agrees
/// with llama.cpp for this layout, so an HF folder and its GGUF give the same tokens.
fn smollm2_layout_tokenizer_json(
    meta: &kwk::tokenizer::GgufTokenizerMetadata,
) -> serde_json::Value {
    use serde_json::json;
    let types = meta.token_types.as_ref().expect("token types");
    let vocab: serde_json::Map<String, serde_json::Value> = meta
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), json!(id)))
        .collect();
    let added: Vec<serde_json::Value> = meta
        .tokens
        .iter()
        .enumerate()
        .filter(|&(id, _)| types[id] == 3)
        .map(|(id, t)| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": meta.merges.as_ref().expect("merges")}
    })
}

#[test]
fn smollm2_layout_tokenizer_json_equals_llama_tokenize() {
    let meta = common::gguf_tokenizer_metadata(&common::smollm2_gguf());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        serde_json::to_vec(&smollm2_layout_tokenizer_json(&meta)).unwrap(),
    )
    .unwrap();
    let hf = Tokenizer::from_hf_folder(dir.path()).unwrap();
    assert!(!hf.add_bos());
    assert_eq!(hf.vocab_size(), meta.tokens.len());
    let text = common::perplexity_text(&common::wiki_test_raw());
    let start = Instant::now();
    let ours = hf.encode(&text, true).unwrap();
    eprintln!(
        "tokenizer.json path: wiki.test.raw into {} tokens in {:.3} s",
        ours.len(),
        start.elapsed().as_secs_f64()
    );
    let theirs = common::llama_tokenize(&common::smollm2_gguf(), &text);
    assert_same_ids("tokenizer.json path, wiki.test.raw", &ours, &theirs);
    let model = common::smollm2_gguf();
    let joined = TRICKY.join("\n");
    for text in [joined.as_str(), "  ends in white space \r\n \t "] {
        let ours = hf.encode(text, true).unwrap();
        let theirs = common::llama_tokenize(&model, text);
        assert_same_ids(&format!("tokenizer.json path, {text:?}"), &ours, &theirs);
    }
}

/// Pseudo-random text (fixed seed) drawn from the character classes the pre-tokenizers
/// treat differently: ASCII letters and digits, every kind of white space, apostrophes
/// followed by contraction letters, punctuation and symbols, non-ASCII letters and numbers,
/// combining marks, emoji, CJK, unassigned and Unicode-16 code points.
fn random_text(seed: u64, n_chars: usize) -> String {
    let pools: &[&str] = &[
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        "      \n\n\r\t\u{a0}\u{3000}\u{2009}\u{85}\u{b}\u{c}",
        "'''sStTmMdDrReEvVlL",
        "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~—–…‘’“”«»¿¡",
        "éüßçñøÅΩЖжחשعربي",
        "²³½Ⅻ①٣४",
        "\u{301}\u{300}\u{308}",
        "😀🎉👍🏽\u{200d}🇫🇷",
        "日本語中文한국어",
        "\u{378}\u{1c89}\u{2ebf0}\u{e000}\u{fffd}",
    ];
    let pools: Vec<Vec<char>> = pools.iter().map(|p| p.chars().collect()).collect();
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut text = String::new();
    for _ in 0..n_chars {
        // Letters and spaces most often, so that words form.
        let pool = match next() % 16 {
            0..=5 => &pools[0],
            6..=8 => &pools[2],
            9 => &pools[1],
            10 => &pools[3],
            11 => &pools[4],
            12 => &pools[5],
            13 => &pools[6 + (next() % 2) as usize],
            14 => &pools[8 + (next() % 2) as usize],
            _ => &pools[10],
        };
        text.push(pool[(next() % pool.len() as u64) as usize]);
    }
    text
}

/// Random text through every supported pre-tokenizer and the SmolLM2 vocabulary, extended
/// with two- and three-digit tokens and their merges (SmolLM2 has none, so without them a
/// pre-tokenizer's digit grouping would not show in the ids).
#[test]
fn random_text_equals_llama_tokenize_for_every_pre_tokenizer() {
    let mut base = common::gguf_tokenizer_metadata(&common::smollm2_gguf());
    let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
    for a in &digits {
        for b in &digits {
            base.tokens.push(format!("{a}{b}"));
            base.merges.as_mut().unwrap().push(format!("{a} {b}"));
        }
    }
    for ab in 10..100 {
        for c in &digits {
            base.tokens.push(format!("{ab}{c}"));
            base.merges.as_mut().unwrap().push(format!("{ab} {c}"));
        }
    }
    let n = base.tokens.len();
    base.token_types.as_mut().unwrap().resize(n, 1);
    let texts: Vec<String> = (1..=3)
        .map(|seed| random_text(seed * 0x9E37_79B9, 8000))
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    for pre in ["smollm", "gpt-2", "default", "llama-bpe", "qwen2", "dbrx"] {
        let mut meta = base.clone();
        meta.pre = Some(pre.to_string());
        meta.add_bos = None;
        check_against_llama_tokenize(&format!("random text, pre {pre}"), &meta, &texts);
    }
}
