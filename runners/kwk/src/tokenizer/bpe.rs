//! Byte-level BPE from GGUF metadata (`tokenizer.ggml.model = gpt2`), merging like
//! llama.cpp's `llm_tokenizer_bpe_session` (src/llama-vocab.cpp): each pre-tokenizer word is
//! byte-encoded with GPT-2's byte → character table, split into one symbol per byte, and
//! the adjacent pair with the lowest merge rank (leftmost on ties) is merged until no pair
//! has a rank. Symbols that are not vocabulary tokens at the end fall back to one token per
//! byte when such tokens exist (llama.cpp drops the bytes it cannot find).

use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::bpe_pretokenizers::PreTokenizer;
use super::gguf_vocab::GgufVocab;
use crate::error::{KwkError, Result};

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the others to U+0100 +
/// n in byte order (llama.cpp unicode.cpp `unicode_byte_to_utf8_map`).
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(256 + n).unwrap_or('\0');
            n += 1;
            c
        };
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// A fast hasher for the (left id, right id) merge keys.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type PairMap = HashMap<u64, Merge, BuildHasherDefault<PairHasher>>;

#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    result: u32,
}

fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

#[derive(Debug)]
pub(crate) struct BpeModel {
    pub pre: PreTokenizer,
    merges: PairMap,
    /// Token id of each byte's GPT-2 character, when the vocabulary has it.
    byte_token: [Option<u32>; 256],
    byte_char: [char; 256],
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    /// Token id of the symbol's text (`None`: a byte whose character is not a token).
    id: Option<u32>,
    /// Byte offset of the symbol in the word and its length in bytes of the original text.
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Buffers reused from word to word.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    encoded: String,
}

/// A candidate merge in the queue: lowest rank first, then leftmost (llama.cpp
/// `llm_bigram_bpe::comparator`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Bigram {
    rank: std::cmp::Reverse<u32>,
    left: std::cmp::Reverse<usize>,
    right: usize,
    left_id: u32,
    right_id: u32,
}

impl BpeModel {
    /// Merge table from `tokenizer.ggml.merges` ("left right" per entry, rank = index).
    /// Every part and every result must be a vocabulary token.
    pub fn new(vocab: &GgufVocab, merges: &[String], pre: PreTokenizer) -> Result<Self> {
        let mut table: PairMap =
            HashMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (rank, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte (`word.find(' ', 1)`).
            let split = merge
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1)
                .ok_or_else(|| {
                    KwkError::Tokenizer(format!(
                        "tokenizer.ggml.merges[{rank}] = {merge:?} is not \"left right\""
                    ))
                })?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let lookup = |s: &str| {
                vocab.text_to_token(s).ok_or_else(|| {
                    KwkError::Tokenizer(format!(
                        "tokenizer.ggml.merges[{rank}] = {merge:?} references {s:?}, which is \
                         not in tokenizer.ggml.tokens"
                    ))
                })
            };
            let left_id = lookup(left)?;
            let right_id = lookup(right)?;
            let result = lookup(&format!("{left}{right}"))?;
            // First occurrence wins, as `bpe_ranks.emplace` in llama.cpp.
            table.entry(pair_key(left_id, right_id)).or_insert(Merge {
                rank: rank as u32,
                result,
            });
        }
        let byte_char = byte_to_char_table();
        let mut byte_token = [None; 256];
        let mut buf = [0u8; 4];
        for b in 0..256 {
            byte_token[b] = vocab.text_to_token(byte_char[b].encode_utf8(&mut buf));
        }
        Ok(BpeModel {
            pre,
            merges: table,
            byte_token,
            byte_char,
        })
    }

    /// Appends the tokens of `text` (no special tokens inside) to `out`.
    pub fn tokenize(&self, vocab: &GgufVocab, text: &str, out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        // The ids of a word depend on the word alone: repeated words are copied from their
        // first occurrence in `out`.
        let mut seen: HashMap<&[u8], (usize, usize)> = HashMap::new();
        for word in self.pre.split(text) {
            let bytes = &text.as_bytes()[word];
            if bytes.is_empty() {
                continue;
            }
            if let Some(&(start, len)) = seen.get(bytes) {
                out.extend_from_within(start..start + len);
                continue;
            }
            let start = out.len();
            self.tokenize_word(vocab, bytes, &mut scratch, out);
            seen.insert(bytes, (start, out.len() - start));
        }
    }

    /// Appends the tokens of one pre-tokenizer word.
    fn tokenize_word(
        &self,
        vocab: &GgufVocab,
        bytes: &[u8],
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        let Scratch {
            symbols,
            queue,
            encoded,
        } = scratch;
        if self.pre.ignore_merges {
            encoded.clear();
            encoded.extend(bytes.iter().map(|&b| self.byte_char[b as usize]));
            if let Some(id) = vocab.text_to_token(encoded) {
                out.push(id);
                return;
            }
        }
        symbols.clear();
        queue.clear();
        for (i, &b) in bytes.iter().enumerate() {
            symbols.push(Symbol {
                id: self.byte_token[b as usize],
                start: i,
                len: 1,
                prev: i.checked_sub(1),
                next: (i + 1 < bytes.len()).then_some(i + 1),
            });
        }
        for i in 1..symbols.len() {
            self.push_bigram(symbols, i - 1, i, queue);
        }
        while let Some(bigram) = queue.pop() {
            let left = bigram.left.0;
            let right = bigram.right;
            let (l, r) = (symbols[left], symbols[right]);
            if l.len == 0
                || r.len == 0
                || l.id != Some(bigram.left_id)
                || r.id != Some(bigram.right_id)
            {
                continue; // outdated
            }
            let Some(merge) = self.merges.get(&pair_key(bigram.left_id, bigram.right_id)) else {
                continue;
            };
            symbols[left].len += r.len;
            symbols[left].id = Some(merge.result);
            symbols[left].next = r.next;
            symbols[right].len = 0;
            if let Some(next) = r.next {
                symbols[next].prev = Some(left);
            }
            if let Some(prev) = symbols[left].prev {
                self.push_bigram(symbols, prev, left, queue);
            }
            if let Some(next) = symbols[left].next {
                self.push_bigram(symbols, left, next, queue);
            }
        }
        let mut i = Some(0);
        while let Some(s) = i {
            let sym = symbols[s];
            i = sym.next;
            if sym.len == 0 {
                continue;
            }
            match sym.id {
                Some(id) => out.push(id),
                None => {
                    // llama.cpp looks each byte of the byte-encoded text up as a
                    // one-byte token and drops the bytes it cannot find; only ASCII
                    // bytes can be one-byte UTF-8 token texts.
                    for &b in &bytes[sym.start..sym.start + sym.len] {
                        let c = self.byte_char[b as usize];
                        let mut buf = [0u8; 4];
                        for &eb in c.encode_utf8(&mut buf).as_bytes() {
                            if eb.is_ascii() {
                                let s = [eb];
                                if let Some(id) = std::str::from_utf8(&s)
                                    .ok()
                                    .and_then(|s| vocab.text_to_token(s))
                                {
                                    out.push(id);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn push_bigram(
        &self,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (Some(left_id), Some(right_id)) = (symbols[left].id, symbols[right].id) else {
            return;
        };
        if let Some(merge) = self.merges.get(&pair_key(left_id, right_id)) {
            queue.push(Bigram {
                rank: std::cmp::Reverse(merge.rank),
                left: std::cmp::Reverse(left),
                right,
                left_id,
                right_id,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[&str], merges: &[&str], pre: &str) -> (GgufVocab, BpeModel) {
        let tokens: Vec<String> = tokens.iter().map(|s| s.to_string()).collect();
        let vocab = GgufVocab::new(&tokens, None, None).unwrap();
        let merges: Vec<String> = merges.iter().map(|s| s.to_string()).collect();
        let bpe = BpeModel::new(
            &vocab,
            &merges,
            PreTokenizer::from_gguf_pre(Some(pre)).unwrap(),
        )
        .unwrap();
        (vocab, bpe)
    }

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[0xAD], '\u{143}');
        let inverse = char_to_byte_map();
        assert_eq!(inverse.len(), 256);
        assert_eq!(inverse[&'Ġ'], b' ');
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        // "aaa": a+a has one rank; the leftmost pair merges first -> "aa" "a".
        let (v, m) = model(
            &["a", "aa", "b", "ab", "aab"],
            &["a a", "a b", "aa b"],
            "gpt-2",
        );
        let mut out = Vec::new();
        m.tokenize(&v, "aaa", &mut out);
        assert_eq!(out, vec![1, 0]);
        // "aab": "a a" (rank 0) before "a b" (rank 1), then "aa b".
        out.clear();
        m.tokenize(&v, "aab", &mut out);
        assert_eq!(out, vec![4]);
    }

    #[test]
    fn words_do_not_merge_across_pre_tokenizer_splits() {
        let (v, m) = model(&["a", "Ġ", "Ġa", "aĠ"], &["Ġ a", "a Ġ"], "gpt-2");
        let mut out = Vec::new();
        m.tokenize(&v, "a a", &mut out);
        // words "a", " a": the "a Ġ" merge never sees both.
        assert_eq!(out, vec![0, 2]);
    }

    #[test]
    fn unknown_bytes_are_dropped_like_llama_cpp() {
        let (v, m) = model(&["a"], &[], "gpt-2");
        let mut out = Vec::new();
        m.tokenize(&v, "aé", &mut out);
        assert_eq!(out, vec![0]);
    }

    #[test]
    fn bad_merges_are_errors_naming_the_key() {
        let tokens: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        let vocab = GgufVocab::new(&tokens, None, None).unwrap();
        let pre = PreTokenizer::from_gguf_pre(Some("gpt-2")).unwrap();
        let err = BpeModel::new(&vocab, &["a b".to_string()], pre.clone()).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.merges[0]"),
            "{err}"
        );
        assert!(err.to_string().contains("\"ab\""), "{err}");
        let err = BpeModel::new(&vocab, &["ab".to_string()], pre).unwrap_err();
        assert!(err.to_string().contains("not \"left right\""), "{err}");
    }
}
