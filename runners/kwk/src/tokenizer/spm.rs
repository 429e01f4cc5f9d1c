//! SentencePiece from GGUF metadata (`tokenizer.ggml.model = llama`), tokenizing like
//! llama.cpp's `llm_tokenizer_spm_session` (src/llama-vocab.cpp): spaces become U+2581 "▁"
//! (with one "▁" in front of the text when `add_space_prefix`), the text starts as one
//! symbol per UTF-8 character, and the adjacent pair whose concatenation is a vocabulary
//! token with the highest score (leftmost on ties) merges, until no pair is a token. A
//! symbol that is not a token at the end is re-split along the merges that built it, and
//! characters that are not tokens become byte tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::gguf_vocab::GgufVocab;
use crate::error::{KwkError, Result};

#[derive(Debug, Clone, Copy)]
struct Symbol {
    /// Byte offset and length in the escaped text (length 0: merged away).
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: highest score first, then leftmost (llama.cpp
/// `llm_bigram_spm::comparator`).
#[derive(Debug)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // llama.cpp compares scores with `<` (so -0.0 == 0.0); NaN scores compare equal.
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// The token of byte `b`: `<0xXX>`, else the one-byte text (llama.cpp `byte_to_token`).
pub(crate) fn byte_to_token(vocab: &GgufVocab, b: u8) -> Option<u32> {
    vocab.text_to_token(&format!("<0x{b:02X}>")).or_else(|| {
        std::str::from_utf8(&[b])
            .ok()
            .and_then(|s| vocab.text_to_token(s))
    })
}

/// Appends the tokens of `text` (already prefixed with a space when llama.cpp would) to
/// `out`.
pub(crate) fn tokenize(vocab: &GgufVocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
    let escaped = text.replace(' ', "\u{2581}");
    let mut symbols: Vec<Symbol> = Vec::with_capacity(escaped.len());
    let n_chars = escaped.chars().count();
    for (index, (start, c)) in escaped.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: index.checked_sub(1),
            next: (index + 1 < n_chars).then_some(index + 1),
        });
    }
    let mut queue = BinaryHeap::new();
    let mut rev_merge: HashMap<&str, (usize, usize)> = HashMap::new();
    for i in 1..symbols.len() {
        try_add_bigram(
            vocab,
            &escaped,
            &symbols,
            i - 1,
            i,
            &mut queue,
            &mut rev_merge,
        );
    }
    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
            continue;
        }
        symbols[bigram.left].len += r.len;
        symbols[bigram.right].len = 0;
        symbols[bigram.left].next = r.next;
        if let Some(next) = r.next {
            symbols[next].prev = Some(bigram.left);
        }
        if let Some(prev) = symbols[bigram.left].prev {
            try_add_bigram(
                vocab,
                &escaped,
                &symbols,
                prev,
                bigram.left,
                &mut queue,
                &mut rev_merge,
            );
        }
        if let Some(next) = symbols[bigram.left].next {
            try_add_bigram(
                vocab,
                &escaped,
                &symbols,
                bigram.left,
                next,
                &mut queue,
                &mut rev_merge,
            );
        }
    }
    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(s) = i {
        resegment(vocab, &escaped, &symbols, s, &rev_merge, out)?;
        i = symbols[s].next;
    }
    Ok(())
}

/// llama.cpp `try_add_bigram`: queue the pair when its concatenation is a token.
fn try_add_bigram<'a>(
    vocab: &GgufVocab,
    escaped: &'a str,
    symbols: &[Symbol],
    left: usize,
    right: usize,
    queue: &mut BinaryHeap<Bigram>,
    rev_merge: &mut HashMap<&'a str, (usize, usize)>,
) {
    let start = symbols[left].start;
    let end = start + symbols[left].len + symbols[right].len;
    let text: &'a str = &escaped[start..end];
    if let Some(id) = vocab.text_to_token(text) {
        queue.push(Bigram {
            left,
            right,
            score: vocab.scores[id as usize],
            size: text.len(),
        });
        rev_merge.insert(text, (left, right));
    }
}

/// llama.cpp `resegment`: the symbol's token, else its two merge parts, else its bytes.
fn resegment(
    vocab: &GgufVocab,
    escaped: &str,
    symbols: &[Symbol],
    index: usize,
    rev_merge: &HashMap<&str, (usize, usize)>,
    out: &mut Vec<u32>,
) -> Result<()> {
    let mut stack = vec![index];
    while let Some(s) = stack.pop() {
        let sym = symbols[s];
        let text = &escaped[sym.start..sym.start + sym.len];
        if let Some(id) = vocab.text_to_token(text) {
            out.push(id);
            continue;
        }
        if let Some(&(left, right)) = rev_merge.get(text) {
            // Left first: push right below it.
            stack.push(right);
            stack.push(left);
            continue;
        }
        for &b in text.as_bytes() {
            let id = byte_to_token(vocab, b).ok_or_else(|| {
                KwkError::Tokenizer(format!(
                    "SentencePiece vocabulary has no token for {text:?} and no byte token \
                     <0x{b:02X}> to spell it with"
                ))
            })?;
            out.push(id);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made SentencePiece vocabulary: ids 0..=2 special, 3.. pieces with scores,
    /// then the 256 byte tokens.
    fn vocab() -> GgufVocab {
        let pieces: &[(&str, f32, i32)] = &[
            ("<unk>", 0.0, 2),
            ("<s>", 0.0, 3),
            ("</s>", 0.0, 3),
            ("▁", -1.0, 1),         // 3
            ("h", -2.0, 1),         // 4
            ("e", -2.0, 1),         // 5
            ("l", -2.0, 1),         // 6
            ("o", -2.0, 1),         // 7
            ("▁h", -3.0, 1),        // 8
            ("ll", -1.5, 1),        // 9
            ("he", -2.5, 1),        // 10
            ("▁he", -4.0, 1),       // 11
            ("llo", -1.2, 1),       // 12
            ("▁hello", -0.5, 1),    // 13
            ("▁hello▁", -100.0, 1), // 14, only reachable through "▁hello" + "▁"
            ("w", -2.0, 1),         // 15
            ("▁w", -2.0, 1),        // 16
            ("a", -2.0, 1),         // 17
            ("b", -2.0, 1),         // 18
            ("c", -2.0, 1),         // 19
            ("ab", -1.0, 1),        // 20
            ("bc", -1.0, 1),        // 21
        ];
        let mut tokens: Vec<String> = pieces.iter().map(|p| p.0.to_string()).collect();
        let mut scores: Vec<f32> = pieces.iter().map(|p| p.1).collect();
        let mut types: Vec<i32> = pieces.iter().map(|p| p.2).collect();
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(6);
        }
        GgufVocab::new(&tokens, Some(&types), Some(&scores)).unwrap()
    }

    fn ids(text: &str) -> Vec<u32> {
        let v = vocab();
        let mut out = Vec::new();
        tokenize(&v, text, &mut out).unwrap();
        out
    }

    fn byte_id(b: u8) -> u32 {
        22 + b as u32
    }

    #[test]
    fn merges_follow_scores() {
        // "▁hello": ll(-1.5) first, then llo(-1.2) over l+o, ▁h(-3) vs he(-2.5): he first;
        // then ▁+he = ▁he (-4); ▁he+llo = ▁hello (-0.5).
        assert_eq!(ids(" hello"), vec![13]);
        // trailing space: "▁hello" + "▁" = "▁hello▁" is a token, so it merges.
        assert_eq!(ids(" hello "), vec![14]);
        // "hel": he (-2.5) beats nothing else; "he" + "l".
        assert_eq!(ids("hel"), vec![10, 6]);
    }

    #[test]
    fn ties_go_to_the_leftmost_pair() {
        // "ab" and "bc" have the same score: the leftmost pair wins and takes the "b".
        assert_eq!(ids("abc"), vec![20, 19]);
        assert_eq!(ids("cabc"), vec![19, 20, 19]);
        // "▁w▁w": both "▁w" merge ("w▁" is not a token).
        assert_eq!(ids(" w w"), vec![16, 16]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        // 'é' = C3 A9 is not a piece.
        assert_eq!(ids("é"), vec![byte_id(0xC3), byte_id(0xA9)]);
        assert_eq!(ids(" hé"), vec![8, byte_id(0xC3), byte_id(0xA9)]);
    }

    #[test]
    fn missing_byte_tokens_are_an_error() {
        let tokens: Vec<String> = ["a"].iter().map(|s| s.to_string()).collect();
        let v = GgufVocab::new(&tokens, None, None).unwrap();
        let mut out = Vec::new();
        let err = tokenize(&v, "b", &mut out).unwrap_err();
        assert!(err.to_string().contains("<0x62>"), "{err}");
    }
}
