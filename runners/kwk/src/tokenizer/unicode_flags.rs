//! Code point classes as llama.cpp's tokenizer sees them: letter (`\p{L}`), number
//! (`\p{N}`), punctuation (`\p{P}`) and whitespace (`\s`), for the pre-tokenizer splits in
//! [`super::bpe_pretokenizers`].
//!
//! llama.cpp classifies code points with a table generated from UnicodeData.txt
//! (src/unicode-data.cpp, scripts/gen-unicode-data.py). The table in llama.cpp 0.3.36 is
//! Unicode 15.1 (U+2EBF0..U+2EE5D, CJK Extension I, are letters; U+1C89, new in 16.0, is
//! unassigned). We build the same classes from the `regex-syntax` crate's Unicode 16.0 tables,
//! intersected with `Age <= 15.1` so that code points assigned in 16.0 stay unassigned, as in
//! llama.cpp ("other": neither letter, number nor whitespace). Whitespace is the fixed
//! `White_Space` list of gen-unicode-data.py, not a general category.

use std::sync::OnceLock;

pub(crate) const LETTER: u8 = 1;
pub(crate) const NUMBER: u8 = 2;
pub(crate) const WHITESPACE: u8 = 4;
pub(crate) const PUNCTUATION: u8 = 8;

/// Number of code points (U+0000..=U+10FFFF).
const MAX_CODEPOINTS: usize = 0x110000;

/// `White_Space` code points, as listed in llama.cpp scripts/gen-unicode-data.py
/// ("table_whitespace"): U+0009..U+000D, U+2000..U+200A and nine singles.
const WHITESPACE_CODEPOINTS: &[(u32, u32)] = &[
    (0x0009, 0x000D),
    (0x0020, 0x0020),
    (0x0085, 0x0085),
    (0x00A0, 0x00A0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
];

/// Ranges of one Unicode class expression, e.g. `[\p{L}&&\p{age:15.1}]`.
fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    // The patterns are constants of this file; a failure here is a programming error that
    // every tokenizer test would hit at once.
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .unwrap_or_else(|e| panic!("unicode class pattern {pattern:?}: {e}"));
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        other => panic!("unicode class pattern {pattern:?} parsed to {other:?}"),
    }
}

fn flag_table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![0u8; MAX_CODEPOINTS];
        let classes = [
            (r"[\p{L}&&\p{age:15.1}]", LETTER),
            (r"[\p{N}&&\p{age:15.1}]", NUMBER),
            (r"[\p{P}&&\p{age:15.1}]", PUNCTUATION),
        ];
        for (pattern, flag) in classes {
            for (lo, hi) in class_ranges(pattern) {
                for cp in lo..=hi {
                    table[cp as usize] |= flag;
                }
            }
        }
        for &(lo, hi) in WHITESPACE_CODEPOINTS {
            for cp in lo..=hi {
                table[cp as usize] |= WHITESPACE;
            }
        }
        table
    })
}

/// The class flags of one code point (a combination of [`LETTER`], [`NUMBER`],
/// [`PUNCTUATION`], [`WHITESPACE`]; 0 for every other assigned or unassigned code point).
pub(crate) fn flags_of(c: char) -> u8 {
    flag_table()[c as usize]
}

/// llama.cpp's `unicode_tolower`: the simple lowercase mapping of UnicodeData.txt, or the
/// code point itself. Only compared against ASCII letters by the contraction rules, so a
/// multi-character full lowercase mapping (e.g. U+0130) counts as "no mapping".
pub(crate) fn to_lower(c: char) -> char {
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_classes() {
        assert_eq!(flags_of('a'), LETTER);
        assert_eq!(flags_of('Z'), LETTER);
        assert_eq!(flags_of('7'), NUMBER);
        assert_eq!(flags_of(' '), WHITESPACE);
        assert_eq!(flags_of('\r'), WHITESPACE);
        assert_eq!(flags_of('\n'), WHITESPACE);
        assert_eq!(flags_of('\''), PUNCTUATION);
        assert_eq!(flags_of('$'), 0, "$ is a symbol (Sc), not punctuation");
        assert_eq!(flags_of('`'), 0, "` is a symbol (Sk)");
    }

    #[test]
    fn non_ascii_classes_and_unicode_version() {
        assert_eq!(flags_of('é'), LETTER);
        assert_eq!(flags_of('²'), NUMBER, "No is a number");
        assert_eq!(flags_of('Ⅻ'), NUMBER, "Nl is a number");
        assert_eq!(flags_of('\u{3000}'), WHITESPACE);
        assert_eq!(flags_of('\u{85}'), WHITESPACE);
        assert_eq!(
            flags_of('\u{200B}'),
            0,
            "zero width space is Cf, not whitespace"
        );
        assert_eq!(flags_of('—'), PUNCTUATION);
        assert_eq!(flags_of('😀'), 0);
        // Unicode 15.1 (CJK Extension I) is in llama.cpp's table ...
        assert_eq!(flags_of('\u{2EBF0}'), LETTER);
        // ... Unicode 16.0 (Cyrillic TJE) is not.
        assert_eq!(flags_of('\u{1C89}'), 0);
    }

    /// llama.cpp's own table (src/unicode-data.cpp of the source tree that
    /// scripts/setup-llama-cpp.sh keeps beside the build): every code point must get the
    /// same letter / number / punctuation / whitespace classes here.
    #[test]
    fn every_code_point_matches_llama_cpp_unicode_data() {
        let bin = match std::env::var_os("KWK_LLAMA_CPP_DIR") {
            Some(d) => std::path::PathBuf::from(d),
            None => crate::paths::cache_root(&crate::paths::CacheEnv::from_env())
                .expect("none of KWK_CACHE, XDG_CACHE_HOME, HOME is set")
                .join("llama.cpp-0.3.36/build/bin"),
        };
        let path = bin.join("../../src/src/unicode-data.cpp");
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run scripts/setup-llama-cpp.sh (or set KWK_LLAMA_CPP_DIR to its build/bin)",
                path.display()
            )
        });
        let section = |name: &str| -> &str {
            let start = source
                .find(name)
                .unwrap_or_else(|| panic!("{name} not in unicode-data.cpp"));
            let body = &source[start..];
            let open = body.find('{').unwrap() + 1;
            let close = body.find("};").unwrap();
            &body[open..close]
        };
        let hex = |s: &str| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
        // `{start, flags}` pairs: flags hold from start to the next start - 1.
        let ranges: Vec<(u32, u16)> = section("unicode_ranges_flags")
            .lines()
            .filter_map(|line| {
                let entry = line.trim().strip_prefix('{')?.strip_suffix("},")?;
                let (a, b) = entry.split_once(',')?;
                Some((hex(a), hex(b) as u16))
            })
            .collect();
        assert!(ranges.len() > 1000, "parsed {} ranges", ranges.len());
        let whitespace: Vec<u32> = section("unicode_set_whitespace")
            .lines()
            .filter_map(|line| {
                line.trim()
                    .strip_suffix(',')
                    .filter(|s| s.starts_with("0x"))
            })
            .map(hex)
            .collect();
        assert_eq!(whitespace.len(), 25);
        let mut mismatches = Vec::new();
        for window in ranges.windows(2) {
            let ((start, llama_flags), (end, _)) = (window[0], window[1]);
            for cp in start..end.min(MAX_CODEPOINTS as u32) {
                let mut expected = 0u8;
                if llama_flags & 0x0004 != 0 {
                    expected |= LETTER;
                }
                if llama_flags & 0x0002 != 0 {
                    expected |= NUMBER;
                }
                if llama_flags & 0x0020 != 0 {
                    expected |= PUNCTUATION;
                }
                if whitespace.contains(&cp) {
                    expected |= WHITESPACE;
                }
                let ours = flag_table()[cp as usize];
                if ours != expected {
                    mismatches.push(format!(
                        "U+{cp:04X}: llama.cpp {expected:#x}, kwk {ours:#x}"
                    ));
                }
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} code points differ, first: {:?}",
            mismatches.len(),
            &mismatches[..mismatches.len().min(20)]
        );
    }

    #[test]
    fn lowercase() {
        assert_eq!(to_lower('S'), 's');
        assert_eq!(to_lower('s'), 's');
        assert_eq!(to_lower('\u{130}'), '\u{130}');
        assert_eq!(to_lower('Ä'), 'ä');
    }
}
