//! A row's type as a person names it ([`type_label`]): kwk's format, or the llama.cpp (or
//! ik_llama.cpp) type found in a GGUF row's label. A leaf of `report`.

use crate::protocol::results::RunnerRecord;

/// llama.cpp's quantization type names (`llama-quantize --help`), and ik_llama.cpp's own
/// (its `llama-quantize --help`: the IQ*_K, IQ*_KS and trellis IQ*_KT types), longest first
/// so that `Q4_K_M` is found before `Q4_K`.
const GGML_TYPES: &[&str] = &[
    "IQ4_KSS", "IQ2_KS", "IQ3_KS", "IQ4_KS", "IQ5_KS", "IQ2_KT", "IQ3_KT", "IQ4_KT", "IQ2_K",
    "IQ3_K", "IQ4_K", "IQ5_K", "IQ6_K", "IQ2_XXS", "IQ3_XXS", "Q2_K_S", "Q3_K_S", "Q3_K_M",
    "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "IQ1_S", "IQ1_M", "IQ2_XS", "IQ2_S", "IQ2_M",
    "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "Q4_0", "Q4_1",
    "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16", "F16", "F32",
];

/// A point's label in the plots: the row's type, with `ik:` before it for ik_llama.cpp's
/// rows, which the plots draw in llama.cpp's colour and shape (`--peer llama.cpp,ik` puts
/// both engines' rows of one type at one size).
pub fn plot_label(r: &RunnerRecord) -> String {
    match r.engine {
        crate::protocol::results::Engine::Ik => format!("{}:{}", r.engine, type_label(r)),
        _ => type_label(r),
    }
}

/// A row's type as a person names it: kwk's format (`int4:calib`), or for a GGUF the
/// llama.cpp type in its file name with what follows it (`Q4_K_M-imatrix`), else the
/// file's stem.
pub fn type_label(r: &RunnerRecord) -> String {
    let by_engine = format!("{}:", r.engine);
    let file = match r.name.strip_prefix("gguf:") {
        Some(file) => file,
        None if r.engine.is_external() => match r.name.strip_prefix(&by_engine) {
            Some(file) => file,
            None => return r.name.clone(),
        },
        None => return r.name.clone(),
    };
    let stem = file.strip_suffix(".gguf").unwrap_or(file);
    let upper = stem.to_ascii_uppercase();
    // The right-most type name that stands as a word of the stem (`-`, `.` or `_` around it).
    let boundary = |i: usize| {
        upper
            .as_bytes()
            .get(i)
            .is_none_or(|b| matches!(b, b'-' | b'.' | b'_' | b' ' | b'+'))
    };
    let mut best: Option<(usize, usize)> = None;
    for t in GGML_TYPES {
        for (at, _) in upper.match_indices(t) {
            let end = at + t.len();
            let before_ok = at == 0 || boundary(at - 1);
            if before_ok
                && boundary(end)
                && best.is_none_or(|(b, len)| at > b || (at == b && end - at > len))
            {
                best = Some((at, end - at));
            }
        }
    }
    match best {
        // ASCII upper-casing keeps byte offsets, so the offsets index `stem` too.
        Some((at, _)) if stem.is_char_boundary(at) => stem[at..].to_string(),
        _ => stem.to_string(),
    }
}
