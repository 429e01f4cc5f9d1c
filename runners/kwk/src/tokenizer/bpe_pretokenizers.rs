//! Byte-level BPE pre-tokenizers, the way llama.cpp splits text into words before merging
//! (`tokenizer.ggml.pre`).
//!
//! llama.cpp (src/llama-vocab.cpp, `llm_tokenizer_bpe` constructor) gives each pre-tokenizer
//! type a list of regexes, applied one after the other: each regex splits every fragment
//! of the previous step into its matches and the gaps between them (both kept), as
//! `unicode_regex_split` in src/unicode.cpp does. The GPT-2, Llama-3 and Qwen2 regexes are not
//! run through a regex engine there but through hand-written scanners
//! (`unicode_regex_split_custom_gpt2/_llama3/_qwen2`), whose results differ from a true regex
//! in corner cases; this file ports those scanners line by line. The other regexes
//! (`\p{N}`, `\p{N}+`, `[\p{P}\$\+<=>\^~\|]+`, `[0-9][0-9][0-9]`) are plain character-class
//! runs, written out here as such.
//!
//! Supported `tokenizer.ggml.pre` values and the llama.cpp type they map to
//! (llama-vocab.cpp, `llama_vocab::impl::load`):
//! - `default` (and a missing key): DEFAULT
//! - `gpt-2`, `phi-2`, `jina-es`, `jina-de`, `gigachat`, `a.x-4.0`, `mellum`, `exaone4`,
//!   `mpt`, `olmo`, `jais`, `trillion`, `granite-docling`: GPT2 regex only (`jina-v2-es`,
//!   `jina-v2-de` and `modern-bert` share the regex but llama.cpp gives their mask token
//!   an lstrip attribute kwk does not model, so they are refused)
//! - `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`,
//!   `lfm2`, `jina-v5-nano`: LLAMA3 (with `ignore_merges`, BOS by default); `dbrx`,
//!   `smaug-bpe`: the same regex without `ignore_merges` or BOS
//! - `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`,
//!   `mellum2`: `\p{N}` (every digit alone), then the GPT2 regex
//! - `qwen2`, `deepseek-r1-qwen`, `kormo`, `f2llmv2`, `megrez`, `stablelm2`, `hunyuan`,
//!   `solar-open`: QWEN2
//!
//! Any other value is refused with an error naming it.

use super::unicode_flags::{flags_of, to_lower, LETTER, NUMBER, PUNCTUATION, WHITESPACE};
use crate::error::{KwkError, Result};

/// One split step of a pre-tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SplitStep {
    /// llama.cpp `unicode_regex_split_custom_gpt2`:
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// llama.cpp `unicode_regex_split_custom_llama3`:
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// llama.cpp `unicode_regex_split_custom_qwen2`: as Llama3 with `\p{N}` instead of `\p{N}{1,3}`.
    Qwen2,
    /// `\p{N}`: every number code point is its own fragment.
    EachNumber,
    /// `\p{N}+`: runs of number code points.
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+`, run by llama.cpp's std::regex on "collapsed" text where every
    /// non-ASCII punctuation code point becomes one byte and ASCII stays as is: runs of
    /// Unicode punctuation plus the ASCII symbols `$+<=>^~|` (the ASCII backtick is not
    /// in the class).
    PunctuationRuns,
    /// `[0-9][0-9][0-9]`: ASCII digit triples, leftmost first, non-overlapping.
    AsciiDigitTriples,
}

/// A llama.cpp BPE pre-tokenizer type: its split steps and the vocabulary flags that go
/// with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreTokenizer {
    /// The `tokenizer.ggml.pre` value it was built from ("default" when the key is absent).
    pub name: String,
    steps: Vec<SplitStep>,
    /// llama.cpp `ignore_merges`: a word that is itself a vocabulary token is emitted as
    /// that token without running the merges.
    pub ignore_merges: bool,
    /// llama.cpp's default `add_bos` for this type (before `tokenizer.ggml.add_bos_token`).
    pub default_add_bos: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value (`None`: the key is absent, which
    /// llama.cpp treats as "default").
    pub fn from_gguf_pre(pre: Option<&str>) -> Result<Self> {
        use SplitStep::*;
        let name = pre.unwrap_or("default");
        let (steps, ignore_merges, default_add_bos): (Vec<SplitStep>, bool, bool) = match name {
            "" | "default" => (
                vec![PunctuationRuns, Gpt2, NumberRuns, AsciiDigitTriples],
                false,
                false,
            ),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "a.x-4.0" | "mellum"
            | "exaone4" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
                (vec![Gpt2], false, false)
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (vec![Llama3], true, true),
            "dbrx" | "smaug-bpe" => (vec![Llama3], false, false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => (vec![EachNumber, Gpt2], false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => (vec![Qwen2], false, false),
            other => {
                return Err(KwkError::Tokenizer(format!(
                    "tokenizer.ggml.pre = {other:?} is not supported by kwk's BPE tokenizer \
                     (supported: default, gpt-2, llama3/llama-bpe, dbrx, smaug-bpe, smollm, \
                     starcoder, qwen2, stablelm2 and their llama.cpp aliases)"
                )))
            }
        };
        Ok(PreTokenizer {
            name: name.to_string(),
            steps,
            ignore_merges,
            default_add_bos,
        })
    }

    /// Splits `text` into words (as byte ranges of `text`), exactly as llama.cpp's
    /// `unicode_regex_split` does before byte-encoding them.
    pub fn split(&self, text: &str) -> Vec<std::ops::Range<usize>> {
        let cpts: Vec<char> = text.chars().collect();
        let flags: Vec<u8> = cpts.iter().map(|&c| flags_of(c)).collect();
        let mut offsets = vec![cpts.len()];
        for step in &self.steps {
            offsets = match step {
                SplitStep::Gpt2 => split_gpt2(&cpts, &flags, &offsets),
                SplitStep::Llama3 => split_llama3_like(&cpts, &flags, &offsets, Some(3)),
                SplitStep::Qwen2 => split_llama3_like(&cpts, &flags, &offsets, Some(1)),
                SplitStep::EachNumber => split_class_runs(&flags, &offsets, NUMBER, true),
                SplitStep::NumberRuns => split_class_runs(&flags, &offsets, NUMBER, false),
                SplitStep::PunctuationRuns => split_punctuation_runs(&cpts, &flags, &offsets),
                SplitStep::AsciiDigitTriples => split_ascii_digit_triples(&cpts, &offsets),
            };
        }
        // Code point lengths to byte ranges.
        let mut words = Vec::with_capacity(offsets.len());
        let mut byte_pos = 0usize;
        let mut cp_pos = 0usize;
        for len in offsets {
            let start = byte_pos;
            for c in &cpts[cp_pos..cp_pos + len] {
                byte_pos += c.len_utf8();
            }
            cp_pos += len;
            words.push(start..byte_pos);
        }
        words
    }
}

/// Accessors over one fragment `[ini, end)` of the code points, returning "out of range"
/// outside it, like the `_get_cpt`/`_get_flags` lambdas of llama.cpp's scanners.
struct Fragment<'a> {
    cpts: &'a [char],
    flags: &'a [u8],
    ini: usize,
    end: usize,
}

/// Flags of an out-of-range position: llama.cpp returns `unicode_cpt_flags{}` (all zero,
/// `as_uint() == 0`), while every in-range code point has a non-zero value (at least
/// "undefined"). We keep that distinction with a separate bit.
const IN_RANGE: u16 = 0x100;

impl Fragment<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.cpts[pos])
    }
    /// Class flags plus [`IN_RANGE`]; 0 outside the fragment.
    fn flags(&self, pos: usize) -> u16 {
        if self.ini <= pos && pos < self.end {
            self.flags[pos] as u16 | IN_RANGE
        } else {
            0
        }
    }
}

fn is(flags: u16, class: u8) -> bool {
    flags & class as u16 != 0
}

/// `[^\s\p{L}\p{N}]` for an in-range position (llama.cpp: `!(ws|letter|number) && as_uint()`).
fn is_other(flags: u16) -> bool {
    flags & (WHITESPACE | LETTER | NUMBER) as u16 == 0 && flags != 0
}

/// Port of llama.cpp `unicode_regex_split_custom_gpt2` (src/unicode.cpp).
fn split_gpt2(cpts: &[char], flags: &[u8], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &offset in offsets {
        let f = Fragment {
            cpts,
            flags,
            ini: start,
            end: start + offset,
        };
        start += offset;
        let mut prev_end = f.ini;
        let mut add_token = |end: usize, out: &mut Vec<usize>| -> usize {
            let len = end - prev_end;
            if len > 0 {
                out.push(len);
            }
            prev_end = end;
            len
        };
        let mut pos = f.ini;
        while pos < f.end {
            let cpt = f.cpts[pos];
            let fl = f.flags(pos);

            // 's|'t|'re|'ve|'m|'ll|'d
            if cpt == '\'' && pos + 1 < f.end {
                let next = f.cpts[pos + 1];
                if matches!(next, 's' | 't' | 'm' | 'd') {
                    pos += add_token(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < f.end {
                    let next_next = f.cpts[pos + 2];
                    if matches!((next, next_next), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                        pos += add_token(pos + 3, &mut out);
                        continue;
                    }
                }
            }

            let mut fl2 = if cpt == ' ' { f.flags(pos + 1) } else { fl };
            // <space>?\p{L}+
            if is(fl2, LETTER) {
                pos += (cpt == ' ') as usize;
                while is(fl2, LETTER) {
                    pos += 1;
                    fl2 = f.flags(pos);
                }
                add_token(pos, &mut out);
                continue;
            }
            // <space>?\p{N}+
            if is(fl2, NUMBER) {
                pos += (cpt == ' ') as usize;
                while is(fl2, NUMBER) {
                    pos += 1;
                    fl2 = f.flags(pos);
                }
                add_token(pos, &mut out);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+
            if is_other(fl2) {
                pos += (cpt == ' ') as usize;
                while is_other(fl2) {
                    pos += 1;
                    fl2 = f.flags(pos);
                }
                add_token(pos, &mut out);
                continue;
            }

            let mut num_whitespaces = 0usize;
            while is(f.flags(pos + num_whitespaces), WHITESPACE) {
                num_whitespaces += 1;
            }
            // \s+(?!\S)
            if num_whitespaces > 1 && f.cpt(pos + num_whitespaces).is_some() {
                pos += num_whitespaces - 1;
                add_token(pos, &mut out);
                continue;
            }
            // \s+
            if num_whitespaces > 0 {
                pos += num_whitespaces;
                add_token(pos, &mut out);
                continue;
            }
            // no match
            pos += 1;
            add_token(pos, &mut out);
        }
    }
    out
}

/// Port of llama.cpp `unicode_regex_split_custom_llama3` (`max_digits = Some(3)`) and
/// `unicode_regex_split_custom_qwen2` (`max_digits = Some(1)`), which differ only in the
/// number rule (`\p{N}{1,3}` against `\p{N}`).
fn split_llama3_like(
    cpts: &[char],
    flags: &[u8],
    offsets: &[usize],
    max_digits: Option<usize>,
) -> Vec<usize> {
    let max_digits = max_digits.unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &offset in offsets {
        let f = Fragment {
            cpts,
            flags,
            ini: start,
            end: start + offset,
        };
        start += offset;
        let mut prev_end = f.ini;
        let mut add_token = |end: usize, out: &mut Vec<usize>| -> usize {
            let len = end - prev_end;
            if len > 0 {
                out.push(len);
            }
            prev_end = end;
            len
        };
        let mut pos = f.ini;
        while pos < f.end {
            let cpt = f.cpts[pos];
            let fl = f.flags(pos);

            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if cpt == '\'' && pos + 1 < f.end {
                let next = to_lower(f.cpts[pos + 1]);
                if matches!(next, 's' | 't' | 'm' | 'd') {
                    pos += add_token(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < f.end {
                    let next_next = to_lower(f.cpts[pos + 2]);
                    if matches!((next, next_next), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                        pos += add_token(pos + 3, &mut out);
                        continue;
                    }
                }
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == '\r' || cpt == '\n' || is(fl, NUMBER))
                && (is(fl, LETTER) || is(f.flags(pos + 1), LETTER))
            {
                pos += 1;
                while is(f.flags(pos), LETTER) {
                    pos += 1;
                }
                add_token(pos, &mut out);
                continue;
            }

            // \p{N}{1,3} (llama3) or \p{N} (qwen2)
            if is(fl, NUMBER) {
                if max_digits == 1 {
                    pos += 1;
                    add_token(pos, &mut out);
                    continue;
                }
                let mut ini = pos;
                while is(f.flags(pos), NUMBER) {
                    pos += 1;
                    if pos - ini >= max_digits {
                        add_token(pos, &mut out);
                        ini = pos;
                    }
                }
                add_token(pos, &mut out);
                continue;
            }

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            // (llama.cpp tests `flags.as_uint()` of the current position here, not of
            // the one after the space; always non-zero in range.)
            let mut fl2 = if cpt == ' ' { f.flags(pos + 1) } else { fl };
            if fl2 & (WHITESPACE | LETTER | NUMBER) as u16 == 0 && fl != 0 {
                pos += (cpt == ' ') as usize;
                while is_other(fl2) {
                    pos += 1;
                    fl2 = f.flags(pos);
                }
                let mut cpt2 = f.cpt(pos);
                while matches!(cpt2, Some('\r') | Some('\n')) {
                    pos += 1;
                    cpt2 = f.cpt(pos);
                }
                add_token(pos, &mut out);
                continue;
            }

            let mut num_whitespaces = 0usize;
            let mut last_end_r_or_n = 0usize;
            while is(f.flags(pos + num_whitespaces), WHITESPACE) {
                let cpt2 = f.cpts[pos + num_whitespaces];
                if cpt2 == '\r' || cpt2 == '\n' {
                    last_end_r_or_n = pos + num_whitespaces + 1;
                }
                num_whitespaces += 1;
            }
            // \s*[\r\n]+
            if last_end_r_or_n > 0 {
                pos = last_end_r_or_n;
                add_token(pos, &mut out);
                continue;
            }
            // \s+(?!\S)
            if num_whitespaces > 1 && f.cpt(pos + num_whitespaces).is_some() {
                pos += num_whitespaces - 1;
                add_token(pos, &mut out);
                continue;
            }
            // \s+
            if num_whitespaces > 0 {
                pos += num_whitespaces;
                add_token(pos, &mut out);
                continue;
            }
            // no match
            pos += 1;
            add_token(pos, &mut out);
        }
    }
    out
}

/// Splits every fragment into the runs of code points with `class` (one code point per
/// match when `single`) and the gaps between them, like llama.cpp's
/// `unicode_regex_split_stl` with `[class]+` or `[class]`.
fn split_runs_by(offsets: &[usize], single: bool, in_class: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &offset in offsets {
        let end = start + offset;
        let mut gap_start = start;
        let mut pos = start;
        while pos < end {
            if in_class(pos) {
                if pos > gap_start {
                    out.push(pos - gap_start);
                }
                let run_start = pos;
                pos += 1;
                if !single {
                    while pos < end && in_class(pos) {
                        pos += 1;
                    }
                }
                out.push(pos - run_start);
                gap_start = pos;
            } else {
                pos += 1;
            }
        }
        if end > gap_start {
            out.push(end - gap_start);
        }
        start = end;
    }
    out
}

fn split_class_runs(flags: &[u8], offsets: &[usize], class: u8, single: bool) -> Vec<usize> {
    split_runs_by(offsets, single, |pos| flags[pos] & class != 0)
}

/// `[\p{P}\$\+<=>\^~\|]+` on llama.cpp's collapsed text. ASCII code points stay themselves
/// there and `\p{P}` becomes `[\xD3!-#%-*,-/:-;?-@\[-\]_\{\}]` (unicode.cpp `k_ucat_map`),
/// so the ASCII members are that list plus `$+<=>^~|`; a non-ASCII code point is in the
/// class when it is punctuation (and not whitespace, which collapses to 0x0B).
fn split_punctuation_runs(cpts: &[char], flags: &[u8], offsets: &[usize]) -> Vec<usize> {
    split_runs_by(offsets, false, |pos| {
        let c = cpts[pos];
        if c.is_ascii() {
            matches!(c,
                '!'..='#' | '%'..='*' | ','..='/' | ':'..=';' | '?'..='@' | '['..=']' | '_'
                | '{' | '}' | '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
        } else {
            flags[pos] & WHITESPACE == 0 && flags[pos] & PUNCTUATION != 0
        }
    })
}

/// `[0-9][0-9][0-9]`: leftmost non-overlapping triples of ASCII digits.
fn split_ascii_digit_triples(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &offset in offsets {
        let end = start + offset;
        let mut gap_start = start;
        let mut pos = start;
        while pos + 3 <= end {
            if cpts[pos..pos + 3].iter().all(|c| c.is_ascii_digit()) {
                if pos > gap_start {
                    out.push(pos - gap_start);
                }
                out.push(3);
                pos += 3;
                gap_start = pos;
            } else {
                pos += 1;
            }
        }
        if end > gap_start {
            out.push(end - gap_start);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::from_gguf_pre(Some(pre)).unwrap();
        p.split(text)
            .into_iter()
            .map(|r| text[r].to_string())
            .collect()
    }

    #[test]
    fn gpt2_regex_cases() {
        assert_eq!(
            words("gpt-2", "Hello world's  end\n\n 123 !!x"),
            vec!["Hello", " world", "'s", " ", " end", "\n\n", " 123", " !!", "x"]
        );
        // `\s+(?!\S)` leaves the last space for the next word; trailing spaces stay together.
        assert_eq!(words("gpt-2", "a   b  "), vec!["a", "  ", " b", "  "]);
        // Contractions are case-sensitive in GPT-2.
        assert_eq!(words("gpt-2", "I'M"), vec!["I", "'", "M"]);
        assert_eq!(words("gpt-2", "\r\nx"), vec!["\r", "\n", "x"]);
    }

    #[test]
    fn smollm_splits_digits_first() {
        assert_eq!(
            words("smollm", "in 2024, 3.5x"),
            vec!["in", " ", "2", "0", "2", "4", ",", " ", "3", ".", "5", "x"]
        );
    }

    #[test]
    fn llama3_regex_cases() {
        assert_eq!(
            words("llama-bpe", "I'M 12345 ok!!\r\n\r\n  x"),
            vec!["I", "'M", " ", "123", "45", " ok", "!!\r\n\r\n", " ", " x"]
        );
        assert_eq!(words("llama3", "a  \n b"), vec!["a", "  \n", " b"]);
    }

    #[test]
    fn qwen2_splits_single_digits() {
        assert_eq!(words("qwen2", "x 123"), vec!["x", " ", "1", "2", "3"]);
    }

    #[test]
    fn default_pre_tokenizer() {
        // punctuation runs first, then GPT-2, then number runs and ASCII digit triples.
        assert_eq!(
            words("default", "a+b=1234567 `x`"),
            vec!["a", "+", "b", "=", "123", "456", "7", " `", "x", "`"]
        );
    }

    #[test]
    fn unknown_pre_is_an_error_naming_it() {
        let err = PreTokenizer::from_gguf_pre(Some("no-such-pre")).unwrap_err();
        assert!(err.to_string().contains("no-such-pre"), "{err}");
    }
}
