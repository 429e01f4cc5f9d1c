//! The vocabulary of a GGUF tokenizer (`tokenizer.ggml.tokens`, `.token_type`, `.scores`),
//! as llama.cpp's `llama_vocab` holds it: token texts and attributes, the text → id map,
//! the split of user-defined tokens out of the input text, the end-of-generation set and
//! the bytes ("piece") each token decodes to.
//!
//! Not modelled: the lstrip/rstrip attributes llama.cpp gives special tokens of a few
//! models chosen by name (`general.name` containing "phi-3", jina-v2 and modern-bert
//! pre-tokenizers); they only change the ids when such a token is user-defined and its
//! text appears in the input.

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{KwkError, Result};

// llama.cpp `llama_token_attr` bits (include/llama.h).
pub(crate) const ATTR_UNKNOWN: u16 = 1 << 0;
pub(crate) const ATTR_UNUSED: u16 = 1 << 1;
pub(crate) const ATTR_NORMAL: u16 = 1 << 2;
pub(crate) const ATTR_CONTROL: u16 = 1 << 3;
pub(crate) const ATTR_USER_DEFINED: u16 = 1 << 4;
pub(crate) const ATTR_BYTE: u16 = 1 << 5;

/// Token texts llama.cpp treats as end-of-generation and forces to CONTROL
/// (llama-vocab.cpp, `special_eog_ids` "currently determined based on the token text").
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Whether llama.cpp stops generation on a token with this text.
pub(crate) fn is_end_of_generation_text(text: &str) -> bool {
    EOG_TEXTS.contains(&text)
}

/// A piece of input text after user-defined tokens were split out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

#[derive(Debug)]
pub(crate) struct GgufVocab {
    pub texts: Vec<String>,
    pub attrs: Vec<u16>,
    pub scores: Vec<f32>,
    pub token_to_id: HashMap<String, u32>,
    /// USER_DEFINED (and not CONTROL) tokens, longest text first: the ones llama.cpp
    /// still matches in the input with `parse_special = false`.
    user_defined_by_length: Vec<u32>,
}

impl GgufVocab {
    pub fn new(
        tokens: &[String],
        token_types: Option<&[i32]>,
        scores: Option<&[f32]>,
    ) -> Result<Self> {
        if tokens.is_empty() {
            return Err(KwkError::Tokenizer(
                "GGUF metadata has no tokenizer.ggml.tokens (or an empty list); this file \
                 carries no tokenizer"
                    .into(),
            ));
        }
        let n = tokens.len();
        if let Some(types) = token_types {
            if types.len() < n {
                return Err(KwkError::Tokenizer(format!(
                    "tokenizer.ggml.token_type has {} entries for {n} tokens",
                    types.len()
                )));
            }
        }
        if let Some(s) = scores {
            if s.len() < n {
                return Err(KwkError::Tokenizer(format!(
                    "tokenizer.ggml.scores has {} entries for {n} tokens",
                    s.len()
                )));
            }
        }
        let mut texts = Vec::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, word) in tokens.iter().enumerate() {
            // llama.cpp renames empty tokens so that they cannot match anything.
            let text = if word.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                word.clone()
            };
            // Later duplicates win, as `token_to_id[word] = i` in llama.cpp.
            token_to_id.insert(text.clone(), i as u32);
            texts.push(text);
            // llama.cpp maps `llama_token_type` to attributes (llama-vocab.cpp `load`);
            // without a token_type array every token is NORMAL.
            let attr = match token_types.map(|t| t[i]) {
                None | Some(1) => ATTR_NORMAL,
                Some(2) => ATTR_UNKNOWN,
                Some(3) => ATTR_CONTROL,
                Some(4) => ATTR_USER_DEFINED,
                Some(5) => ATTR_UNUSED,
                Some(6) => ATTR_BYTE,
                Some(_) => 0, // UNDEFINED
            };
            attrs.push(attr);
        }
        // End-of-generation texts are forced to CONTROL (llama.cpp warns "control-looking
        // token ... was not control-type ... its type will be overridden").
        for text in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*text) {
                attrs[id as usize] |= ATTR_CONTROL;
            }
        }
        let mut user_defined_by_length: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                let a = attrs[id as usize];
                a & ATTR_USER_DEFINED != 0 && a & (ATTR_CONTROL | ATTR_UNKNOWN) == 0
            })
            .collect();
        // llama.cpp sorts by text length, longest first (std::sort; the order of equal
        // lengths is unspecified there, by id here).
        user_defined_by_length.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
        Ok(GgufVocab {
            texts,
            attrs,
            scores: scores
                .map(|s| s[..n].to_vec())
                .unwrap_or_else(|| vec![0.0; n]),
            token_to_id,
            user_defined_by_length,
        })
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Token ids llama.cpp stops generation on: `eos` plus every token whose text is in
    /// its end-of-generation list.
    pub fn end_of_generation_ids(&self, eos: Option<u32>) -> Vec<u32> {
        let mut ids: Vec<u32> = eos.into_iter().collect();
        for text in EOG_TEXTS {
            if let Some(id) = self.text_to_token(text) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    /// llama.cpp `tokenizer_st_partition` with `parse_special = false`: every occurrence of
    /// a user-defined token's text becomes that token; control and unknown tokens are not
    /// matched (their text is tokenized as plain text).
    pub fn partition_user_defined(&self, text: &str) -> Vec<Fragment> {
        let mut fragments = vec![Fragment::Text(0..text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        for &id in &self.user_defined_by_length {
            let needle = self.texts[id as usize].as_str();
            let mut next = Vec::with_capacity(fragments.len());
            for fragment in fragments {
                let Fragment::Text(range) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut start = range.start;
                while let Some(found) = text[start..range.end].find(needle) {
                    let at = start + found;
                    if at > start {
                        next.push(Fragment::Text(start..at));
                    }
                    next.push(Fragment::Token(id));
                    start = at + needle.len();
                }
                if start < range.end {
                    next.push(Fragment::Text(start..range.end));
                }
            }
            fragments = next;
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str], types: &[i32]) -> GgufVocab {
        let tokens: Vec<String> = tokens.iter().map(|s| s.to_string()).collect();
        GgufVocab::new(&tokens, Some(types), None).unwrap()
    }

    #[test]
    fn user_defined_tokens_are_split_out_control_tokens_are_not() {
        let v = vocab(&["<ctl>", "<ud>", "<ud2>", "a"], &[3, 4, 4, 1]);
        let text = "x<ud2>y<ud><ctl>";
        let f = v.partition_user_defined(text);
        assert_eq!(
            f,
            vec![
                Fragment::Text(0..1),
                Fragment::Token(2),
                Fragment::Text(6..7),
                Fragment::Token(1),
                Fragment::Text(11..16),
            ]
        );
    }

    #[test]
    fn eog_text_tokens_become_control() {
        let v = vocab(&["<|im_end|>", "b"], &[4, 1]);
        assert_eq!(v.attrs[0] & ATTR_CONTROL, ATTR_CONTROL);
        assert_eq!(
            v.partition_user_defined("<|im_end|>"),
            vec![Fragment::Text(0..10)]
        );
        assert_eq!(v.end_of_generation_ids(Some(1)), vec![1, 0]);
    }

    #[test]
    fn empty_token_list_is_an_error() {
        let err = GgufVocab::new(&[], None, None).unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
    }

    #[test]
    fn short_token_type_array_is_an_error() {
        let tokens = vec!["a".to_string(), "b".to_string()];
        let err = GgufVocab::new(&tokens, Some(&[1]), None).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.token_type"),
            "{err}"
        );
    }
}
