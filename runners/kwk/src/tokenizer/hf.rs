//! The Hugging Face folder tokenizer: `tokenizer.json` through the `tokenizers` crate, with
//! the BOS/EOS policy read from `tokenizer_config.json`, the post-processor template and
//! `generation_config.json`.
//!
//! Special tokens in the input: llama.cpp (`parse_special = false`) tokenizes the text of
//! control tokens as plain text but still matches user-defined tokens. The `tokenizers`
//! crate matches every added token by default; with `set_encode_special_tokens(true)` it
//! skips the added tokens marked `special` and still matches the others, which is the same
//! rule (llama.cpp's GGUF converter writes special added tokens as CONTROL and the others as
//! USER_DEFINED).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::bpe::char_to_byte_map;
use crate::error::{KwkError, Result};

/// How token strings of the model map back to bytes (for [`HfBackend::token_to_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceEncoding {
    /// GPT-2 byte-level: every character stands for one byte.
    ByteLevel,
    /// SentencePiece style: "▁" is a space, `<0xXX>` a byte.
    Metaspace,
    /// The token string is the text.
    Plain,
}

pub(crate) struct HfBackend {
    pub inner: tokenizers::Tokenizer,
    encoding: PieceEncoding,
    char_to_byte: std::collections::HashMap<char, u8>,
}

/// The special-token policy found in a Hugging Face folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HfSpecials {
    pub add_bos: bool,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
}

fn tok_err(path: &Path, what: impl std::fmt::Display) -> KwkError {
    KwkError::Tokenizer(format!("{}: {what}", path.display()))
}

/// Reads an optional JSON file: `Ok(None)` when it does not exist, an error naming it when
/// it cannot be read or parsed.
fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    match crate::files::read_regular(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| tok_err(path, format!("not valid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(tok_err(path, format!("cannot read: {e}"))),
    }
}

/// The token text of a `tokenizer_config.json` special-token entry: a string, or an
/// object with `content` (AddedToken serialization).
fn special_token_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// The token id a post-processor puts first, if it puts a special token before the
/// sequence: TemplateProcessing (`single` starting with a SpecialToken), a Sequence
/// containing one, or Bert/Roberta processing (their `cls`).
fn template_bos(post: &Value) -> Option<u32> {
    match post.get("type")?.as_str()? {
        "TemplateProcessing" => {
            let first = post.get("single")?.as_array()?.first()?;
            let name = first.get("SpecialToken")?.get("id")?.as_str()?;
            let ids = post
                .get("special_tokens")?
                .get(name)?
                .get("ids")?
                .as_array()?;
            ids.first()?.as_u64().map(|id| id as u32)
        }
        "Sequence" => post
            .get("processors")?
            .as_array()?
            .iter()
            .find_map(template_bos),
        "BertProcessing" | "RobertaProcessing" => post
            .get("cls")?
            .as_array()?
            .get(1)?
            .as_u64()
            .map(|id| id as u32),
        _ => None,
    }
}

/// Whether a decoder or pre-tokenizer (or a `Sequence` of them) has a part of type `kind`.
fn component_has(component: &Value, kind: &str) -> bool {
    match component.get("type").and_then(Value::as_str) {
        Some("Sequence") => ["decoders", "pretokenizers"].iter().any(|list| {
            component
                .get(*list)
                .and_then(Value::as_array)
                .is_some_and(|parts| parts.iter().any(|p| component_has(p, kind)))
        }),
        Some(t) => t == kind,
        None => false,
    }
}

impl HfBackend {
    pub fn load(dir: &Path) -> Result<(Self, HfSpecials)> {
        let tokenizer_path: PathBuf = dir.join("tokenizer.json");
        let bytes = crate::files::read_regular(&tokenizer_path).map_err(|e| {
            tok_err(
                &tokenizer_path,
                format!("cannot read ({e}); a Hugging Face model folder needs its tokenizer.json"),
            )
        })?;
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|e| tok_err(&tokenizer_path, format!("not valid JSON: {e}")))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            tok_err(
                &tokenizer_path,
                format!("not a tokenizer the tokenizers crate can load: {e}"),
            )
        })?;
        inner.set_encode_special_tokens(true);

        let decoder = json.get("decoder").cloned().unwrap_or(Value::Null);
        let pre = json.get("pre_tokenizer").cloned().unwrap_or(Value::Null);
        let encoding = if component_has(&decoder, "ByteLevel") || component_has(&pre, "ByteLevel") {
            PieceEncoding::ByteLevel
        } else if component_has(&decoder, "Metaspace")
            || component_has(&decoder, "ByteFallback")
            || component_has(&decoder, "Replace")
        {
            PieceEncoding::Metaspace
        } else {
            PieceEncoding::Plain
        };

        let config_path = dir.join("tokenizer_config.json");
        let config = read_optional_json(&config_path)?;
        let generation_path = dir.join("generation_config.json");
        let generation = read_optional_json(&generation_path)?;
        let special_map_path = dir.join("special_tokens_map.json");
        let special_map = read_optional_json(&special_map_path)?;
        // A special token named in tokenizer_config.json, else in special_tokens_map.json.
        let named = |key: &str| -> Option<(&Path, Value)> {
            let entry = |file: &Option<Value>| {
                file.as_ref()
                    .and_then(|c| c.get(key))
                    .filter(|v| !v.is_null())
                    .cloned()
            };
            entry(&config)
                .map(|v| (config_path.as_path(), v))
                .or_else(|| entry(&special_map).map(|v| (special_map_path.as_path(), v)))
        };

        let lookup = |path: &Path, key: &str, v: &Value| -> Result<u32> {
            let text = special_token_text(v).ok_or_else(|| {
                tok_err(
                    path,
                    format!("{key} is neither a string nor an object with \"content\""),
                )
            })?;
            inner.token_to_id(text).ok_or_else(|| {
                tok_err(
                    path,
                    format!("{key} = {text:?} is not a token of tokenizer.json"),
                )
            })
        };

        let post = json.get("post_processor").cloned().unwrap_or(Value::Null);
        let template_bos_id = template_bos(&post);
        let add_bos = match config.as_ref().and_then(|c| c.get("add_bos_token")) {
            Some(Value::Bool(b)) => *b,
            Some(Value::Null) | None => template_bos_id.is_some(),
            Some(other) => {
                return Err(tok_err(
                    &config_path,
                    format!("add_bos_token = {other} is not a boolean"),
                ))
            }
        };

        let mut bos_id = None;
        if let Some((path, v)) = named("bos_token") {
            bos_id = Some(lookup(path, "bos_token", &v)?);
        }
        if bos_id.is_none() {
            bos_id = template_bos_id;
        }
        if bos_id.is_none() {
            bos_id = generation
                .as_ref()
                .and_then(|g| g.get("bos_token_id"))
                .and_then(Value::as_u64)
                .map(|id| id as u32);
        }

        let mut eos_ids = Vec::new();
        if let Some((path, v)) = named("eos_token") {
            eos_ids.push(lookup(path, "eos_token", &v)?);
        }
        if let Some(v) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
            let list: Vec<&Value> = match v {
                Value::Array(a) => a.iter().collect(),
                Value::Null => Vec::new(),
                other => vec![other],
            };
            for item in list {
                let id = item.as_u64().ok_or_else(|| {
                    tok_err(
                        &generation_path,
                        format!("eos_token_id entry {item} is not a token id"),
                    )
                })? as u32;
                if !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }
        // Special added tokens whose text llama.cpp treats as end of generation.
        for (id, added) in inner.get_added_tokens_decoder() {
            if added.special
                && super::gguf_vocab::is_end_of_generation_text(&added.content)
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }
        eos_ids.sort_unstable();

        let vocab_size = hf_vocab_size(&inner);
        for (what, id) in bos_id
            .iter()
            .map(|&id| ("bos", id))
            .chain(eos_ids.iter().map(|&id| ("eos", id)))
        {
            if id as usize >= vocab_size {
                return Err(tok_err(
                    dir,
                    format!(
                        "{what} token id {id} is outside the vocabulary of {vocab_size} tokens"
                    ),
                ));
            }
        }
        if add_bos && bos_id.is_none() {
            return Err(tok_err(
                dir,
                "the tokenizer adds a BOS token but none is named (bos_token in tokenizer_config.json)",
            ));
        }

        Ok((
            HfBackend {
                inner,
                encoding,
                char_to_byte: char_to_byte_map(),
            },
            HfSpecials {
                add_bos,
                bos_id,
                eos_ids,
            },
        ))
    }

    /// Ids of `text` with no special tokens added and special-token text taken literally.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            // No character offsets are needed: `encode_fast` skips computing them.
            .encode_fast(text, false)
            .map_err(|e| KwkError::Tokenizer(format!("tokenizer.json encode failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| KwkError::Tokenizer(format!("tokenizer.json decode failed: {e}")))
    }

    /// The bytes one token stands for (added tokens: their text).
    pub fn token_to_bytes(&self, id: u32) -> Result<Vec<u8>> {
        if let Some(added) = self.inner.get_added_vocabulary().simple_id_to_token(id) {
            return Ok(added.into_bytes());
        }
        let piece = self.inner.id_to_token(id).ok_or_else(|| {
            KwkError::Tokenizer(format!("token id {id} is not in tokenizer.json"))
        })?;
        Ok(match self.encoding {
            PieceEncoding::ByteLevel => {
                let mut out = Vec::with_capacity(piece.len());
                for c in piece.chars() {
                    match self.char_to_byte.get(&c) {
                        Some(&b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
                    }
                }
                out
            }
            PieceEncoding::Metaspace => {
                if let Some(b) = parse_byte_token(&piece) {
                    vec![b]
                } else {
                    piece.replace('\u{2581}', " ").into_bytes()
                }
            }
            PieceEncoding::Plain => piece.into_bytes(),
        })
    }
}

/// One past the largest token id of the model and its added tokens (the row count of the
/// embedding the ids index).
pub(crate) fn hf_vocab_size(inner: &tokenizers::Tokenizer) -> usize {
    inner
        .get_vocab(true)
        .values()
        .max()
        .map_or(0, |&max| max as usize + 1)
}

/// `<0xXX>` → the byte.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
