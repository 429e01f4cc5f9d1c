//! Tokenizer: Hugging Face `tokenizer.json` (through the `tokenizers` crate) and tokenizers
//! rebuilt from GGUF metadata so that their ids equal llama.cpp's.
//!
//! Both kinds follow llama.cpp's `add_special = true, parse_special = false` when asked to add
//! special tokens (what llama-perplexity does): a BOS first when the model wants one, never
//! an EOS, and the text of control/special tokens inside the input tokenized as plain text
//! (user-defined, non-special added tokens are still matched as whole tokens).
//!
//! Layout: `hf` (tokenizer.json folder), `gguf_vocab` (the GGUF vocabulary: attributes,
//! user-defined token split, end-of-generation set), `bpe` + `bpe_pretokenizers` +
//! `unicode_flags` (byte-level BPE, `tokenizer.ggml.model = gpt2`), `spm` (SentencePiece,
//! `tokenizer.ggml.model = llama`).

mod bpe;
mod bpe_pretokenizers;
mod gguf_vocab;
mod hf;
mod spm;
mod unicode_flags;

use crate::error::{KwkError, Result};
use bpe::BpeModel;
use bpe_pretokenizers::PreTokenizer;
use gguf_vocab::{
    Fragment, GgufVocab, ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED,
};

/// The tokenizer fields of a GGUF file (`tokenizer.ggml.*`), as the GGUF loader reads them.
#[derive(Debug, Clone, Default)]
pub struct GgufTokenizerMetadata {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer ("default", "gpt-2", "llama-bpe", "smollm", "qwen2", ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    pub token_types: Option<Vec<i32>>,
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

enum GgufModel {
    Bpe(Box<BpeModel>),
    Spm { add_space_prefix: bool },
}

enum Backend {
    Hf(Box<hf::HfBackend>),
    Gguf { vocab: GgufVocab, model: GgufModel },
}

pub struct Tokenizer {
    backend: Backend,
    add_bos: bool,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    vocab_size: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.backend {
            Backend::Hf(_) => "tokenizer.json".to_string(),
            Backend::Gguf {
                model: GgufModel::Bpe(b),
                ..
            } => format!("gguf gpt2 (pre {})", b.pre.name),
            Backend::Gguf {
                model: GgufModel::Spm { .. },
                ..
            } => "gguf llama (SentencePiece)".to_string(),
        };
        f.debug_struct("Tokenizer")
            .field("kind", &kind)
            .field("vocab_size", &self.vocab_size)
            .field("add_bos", &self.add_bos)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

/// Checks a special-token id from the metadata against the vocabulary.
fn checked_id(key: &str, id: Option<u32>, n_tokens: usize) -> Result<Option<u32>> {
    match id {
        Some(id) if id as usize >= n_tokens => Err(KwkError::Tokenizer(format!(
            "{key} = {id} is outside the vocabulary of {n_tokens} tokens (tokenizer.ggml.tokens)"
        ))),
        other => Ok(other),
    }
}

impl Tokenizer {
    /// From GGUF metadata; ids equal llama.cpp's for the same file.
    pub fn from_gguf(meta: &GgufTokenizerMetadata) -> Result<Self> {
        let vocab = GgufVocab::new(
            &meta.tokens,
            meta.token_types.as_deref(),
            meta.scores.as_deref(),
        )?;
        let n = vocab.len();
        // llama.cpp's per-model defaults (llama-vocab.cpp `load`), dropped when outside the
        // vocabulary, then replaced by the GGUF keys.
        let in_range = |id: u32| ((id as usize) < n).then_some(id);
        let (model, default_bos, default_eos, default_add_bos) = match meta.model.as_str() {
            "gpt2" => {
                let merges = meta.merges.as_deref().ok_or_else(|| {
                    KwkError::Tokenizer(
                        "tokenizer.ggml.model = gpt2 but tokenizer.ggml.merges is missing".into(),
                    )
                })?;
                let pre = PreTokenizer::from_gguf_pre(meta.pre.as_deref())?;
                let add_bos = pre.default_add_bos;
                let bpe = BpeModel::new(&vocab, merges, pre)?;
                (
                    GgufModel::Bpe(Box::new(bpe)),
                    in_range(11),
                    in_range(11),
                    add_bos,
                )
            }
            "llama" => (
                GgufModel::Spm {
                    add_space_prefix: meta.add_space_prefix.unwrap_or(true),
                },
                in_range(1),
                in_range(2),
                true,
            ),
            other => {
                let supported = "\"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)";
                return Err(KwkError::Tokenizer(format!(
                    "tokenizer.ggml.model = {other:?} is not supported; kwk reads {supported}"
                )));
            }
        };
        let bos_id = checked_id("tokenizer.ggml.bos_token_id", meta.bos_id, n)?.or(default_bos);
        let eos_id = checked_id("tokenizer.ggml.eos_token_id", meta.eos_id, n)?.or(default_eos);
        checked_id("tokenizer.ggml.unknown_token_id", meta.unk_id, n)?;
        checked_id("tokenizer.ggml.padding_token_id", meta.pad_id, n)?;
        let add_bos = meta.add_bos.unwrap_or(default_add_bos);
        if add_bos && bos_id.is_none() {
            return Err(KwkError::Tokenizer(
                "the tokenizer adds a BOS token but has none (tokenizer.ggml.bos_token_id)".into(),
            ));
        }
        let eos_ids = vocab.end_of_generation_ids(eos_id);
        Ok(Tokenizer {
            backend: Backend::Gguf { vocab, model },
            add_bos,
            bos_id,
            eos_ids,
            vocab_size: n,
        })
    }

    /// From a Hugging Face folder: `tokenizer.json`, plus `tokenizer_config.json` for the
    /// BOS policy when present.
    ///
    /// BOS: `add_bos_token` of tokenizer_config.json when present, else whether the
    /// post-processor template puts a special token before the text. BOS id:
    /// `bos_token` of tokenizer_config.json (else of special_tokens_map.json), else the
    /// template's, else `generation_config.json` `bos_token_id`. End of generation:
    /// `eos_token` (tokenizer_config.json, else special_tokens_map.json), generation_config's
    /// `eos_token_id` (a number or a list), and the special added tokens llama.cpp treats as
    /// end of generation (`<|im_end|>`, `<|eot_id|>`, ...).
    pub fn from_hf_folder(dir: &std::path::Path) -> Result<Self> {
        let (backend, specials) = hf::HfBackend::load(dir)?;
        let vocab_size = hf::hf_vocab_size(&backend.inner);
        Ok(Tokenizer {
            backend: Backend::Hf(Box::new(backend)),
            add_bos: specials.add_bos,
            bos_id: specials.bos_id,
            eos_ids: specials.eos_ids,
            vocab_size,
        })
    }

    /// Token ids of `text`; with `add_special`, a BOS first when [`Self::add_bos`]
    /// (llama.cpp's `add_special=true, parse_special=false`).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        if add_special && self.add_bos {
            // Checked at construction: add_bos implies a BOS id.
            out.extend(self.bos_id);
        }
        match &self.backend {
            Backend::Hf(hf) => out.extend(hf.encode(text)?),
            Backend::Gguf { vocab, model } => {
                let fragments = vocab.partition_user_defined(text);
                match model {
                    GgufModel::Bpe(bpe) => {
                        for fragment in fragments {
                            match fragment {
                                Fragment::Text(range) => {
                                    bpe.tokenize(vocab, &text[range], &mut out)
                                }
                                Fragment::Token(id) => out.push(id),
                            }
                        }
                    }
                    GgufModel::Spm { add_space_prefix } => {
                        // llama.cpp: a space goes in front of the text at the start and
                        // after every special token (`is_prev_special`).
                        let mut is_prev_special = true;
                        for fragment in fragments {
                            match fragment {
                                Fragment::Text(range) => {
                                    let piece = &text[range];
                                    if *add_space_prefix && is_prev_special {
                                        spm::tokenize(vocab, &format!(" {piece}"), &mut out)?;
                                    } else {
                                        spm::tokenize(vocab, piece, &mut out)?;
                                    }
                                    is_prev_special = false;
                                }
                                Fragment::Token(id) => {
                                    out.push(id);
                                    is_prev_special = true;
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The bytes one token stands for, special tokens as their text (llama.cpp
    /// `token_to_piece` with `special = true`). A UTF-8 character may span several tokens;
    /// [`StreamDecoder`] joins them for streaming output.
    pub fn token_to_bytes(&self, id: u32) -> Result<Vec<u8>> {
        if id as usize >= self.vocab_size {
            return Err(KwkError::Tokenizer(format!(
                "token id {id} is outside the vocabulary of {} tokens",
                self.vocab_size
            )));
        }
        match &self.backend {
            Backend::Hf(hf) => hf.token_to_bytes(id),
            Backend::Gguf { vocab, model } => {
                let text = &vocab.texts[id as usize];
                let attr = vocab.attrs[id as usize];
                Ok(
                    if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
                        text.as_bytes().to_vec()
                    } else if attr & ATTR_NORMAL != 0 {
                        match model {
                            GgufModel::Bpe(_) => {
                                // llama.cpp `llama_decode_text`: GPT-2 characters back to bytes.
                                let table = byte_decoder();
                                let mut out = Vec::with_capacity(text.len());
                                for c in text.chars() {
                                    match table.get(&c) {
                                        Some(&b) => out.push(b),
                                        None => out.extend_from_slice(
                                            c.encode_utf8(&mut [0u8; 4]).as_bytes(),
                                        ),
                                    }
                                }
                                out
                            }
                            GgufModel::Spm { .. } => text.replace('\u{2581}', " ").into_bytes(),
                        }
                    } else if attr & ATTR_BYTE != 0 {
                        match (hf::parse_byte_token(text), model) {
                            (Some(b), _) => vec![b],
                            (None, GgufModel::Bpe(_)) => {
                                let mut chars = text.chars();
                                match (
                                    chars.next().and_then(|c| byte_decoder().get(&c)),
                                    chars.next(),
                                ) {
                                    (Some(&b), None) => vec![b],
                                    _ => text.as_bytes().to_vec(),
                                }
                            }
                            (None, GgufModel::Spm { .. }) => text.as_bytes().to_vec(),
                        }
                    } else {
                        // UNUSED and UNDEFINED tokens print nothing in llama.cpp.
                        Vec::new()
                    },
                )
            }
        }
    }

    /// Text of `ids` as one sequence. Special tokens appear as their text; bytes that do
    /// not form UTF-8 become U+FFFD. A SentencePiece model drops the space it put in front
    /// of the text (llama.cpp `detokenize`; Hugging Face decoders do the same), so decoding
    /// only the generated tokens of a SentencePiece model loses the space before the first
    /// one: for streaming, feed the ids to a [`StreamDecoder`] (token by token, no strip), or
    /// decode prompt + generated tokens and print the new suffix. No other clean-up.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(KwkError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.vocab_size
            )));
        }
        match &self.backend {
            Backend::Hf(hf) => hf.decode(ids),
            Backend::Gguf { model, .. } => {
                let mut bytes = Vec::new();
                for (i, &id) in ids.iter().enumerate() {
                    let piece = self.token_to_bytes(id)?;
                    let strip = i == 0
                        && matches!(
                            model,
                            GgufModel::Spm {
                                add_space_prefix: true
                            }
                        )
                        && piece.first() == Some(&b' ');
                    bytes.extend_from_slice(if strip { &piece[1..] } else { &piece });
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    /// Whether the model wants a BOS at the start (and as the first token of every
    /// perplexity chunk).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Tokens that end generation: the EOS and the end-of-turn tokens llama.cpp also stops on.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

fn byte_decoder() -> &'static std::collections::HashMap<char, u8> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<char, u8>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(bpe::char_to_byte_map)
}

/// Turns generated token ids into text as soon as it forms complete UTF-8 characters.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text completed by it (possibly empty). Invalid UTF-8
    /// becomes U+FFFD; an incomplete character at the end waits for the next token.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.pending.extend(tokenizer.token_to_bytes(id)?);
        let mut text = String::new();
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(s) => {
                    text.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Valid by construction: `valid_up_to` bytes are UTF-8.
                    text.push_str(&String::from_utf8_lossy(
                        &self.pending[consumed..consumed + valid],
                    ));
                    consumed += valid;
                    match e.error_len() {
                        Some(bad) => {
                            text.push('\u{FFFD}');
                            consumed += bad;
                        }
                        None => break, // incomplete character: keep it
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        Ok(text)
    }

    /// Whatever is left at the end (an incomplete character, as U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}
