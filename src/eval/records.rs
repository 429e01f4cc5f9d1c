//! The 16-bit log-prob record of llama.cpp's KL-divergence base file
//! (tools/perplexity/perplexity.cpp P:79-107, P:524): one scored position's log-probs as
//! f32 scale, f32 min_log_prob and one uint16 code per token (`2·ceil(n_vocab/2) + 4`
//! words, one padding word when n_vocab is odd), encoded and decoded with llama.cpp's
//! arithmetic. Every engine's rows are compared in this representation.

/// uint16 words per record: `2·ceil(n_vocab/2) + 4` (P:524).
pub fn record_words(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// llama.cpp's `nearest_int` (P:72-77): round-half-even through the 1.5·2^23 trick.
fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0f32;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Encodes one logit row into a record of `record_words(row.len())` words (P:79-107).
pub fn encode_log_probs(row: &[f32], out: &mut [u16]) {
    let n = row.len();
    debug_assert_eq!(out.len(), record_words(n));
    let mut max_logit = row[0];
    let mut min_logit = row[0];
    for &l in &row[1..] {
        max_logit = if max_logit < l { l } else { max_logit };
        min_logit = if l < min_logit { l } else { min_logit };
    }
    min_logit = if min_logit < max_logit - 16.0 {
        max_logit - 16.0
    } else {
        min_logit
    };
    let mut sum_exp = 0.0f64;
    for &l in row {
        sum_exp += f64::from((l - max_logit).exp());
    }
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min_logit - max_logit - log_sum_exp;
    let scale = (max_logit - min_logit) / 65535.0f32;
    let (s, m) = (scale.to_bits(), min_log_prob.to_bits());
    out[0] = s as u16;
    out[1] = (s >> 16) as u16;
    out[2] = m as u16;
    out[3] = (m >> 16) as u16;
    let codes = &mut out[4..];
    if scale != 0.0 {
        let inv_scale = 1.0f32 / scale;
        for (q, &l) in codes.iter_mut().zip(row) {
            *q = if l > min_logit {
                nearest_int(inv_scale * (l - min_logit)) as u16
            } else {
                0
            };
        }
    } else {
        codes.iter_mut().for_each(|q| *q = 0);
    }
    // The padding word (odd vocabularies) stays 0, as in llama.cpp's zeroed buffer.
    codes[n..].iter_mut().for_each(|q| *q = 0);
}

/// `scale` and `min_log_prob` of a record.
pub fn record_header(rec: &[u16]) -> (f32, f32) {
    let scale = f32::from_bits(u32::from(rec[0]) | (u32::from(rec[1]) << 16));
    let min_log_prob = f32::from_bits(u32::from(rec[2]) | (u32::from(rec[3]) << 16));
    (scale, min_log_prob)
}

/// Decoded log-probability of token `i` of a record: `scale·q[i] + min_log_prob` (f32).
pub fn decode_log_prob(rec: &[u16], i: usize) -> f32 {
    let (scale, min_log_prob) = record_header(rec);
    scale * f32::from(rec[4 + i]) + min_log_prob
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(1234.4), 1234);
    }

    #[test]
    fn encoding_decodes_to_log_probs_within_the_quantization_step() {
        let row = [1.0f32, -3.0, 2.5, 0.25, -40.0];
        let mut rec = vec![0u16; record_words(row.len())];
        encode_log_probs(&row, &mut rec);
        let lse = row.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        let (scale, min_log_prob) = record_header(&rec);
        // min_logit = max(-40, 2.5-16) = -13.5; scale = 16/65535.
        assert!((scale - 16.0 / 65535.0).abs() < 1e-9);
        assert!((f64::from(min_log_prob) - (-13.5 - lse)).abs() < 1e-5);
        for (i, &l) in row.iter().enumerate().take(4) {
            let expected = l as f64 - lse;
            assert!(
                (f64::from(decode_log_prob(&rec, i)) - expected).abs() < 2e-4,
                "token {i}"
            );
        }
        // Below the floor: code 0, i.e. the floor log-prob.
        assert_eq!(rec[4 + 4], 0);
        assert_eq!(rec[9], 0, "padding word");
        // The maximum codes to 65535.
        assert_eq!(rec[4 + 2], 65535);
        // A flat row has scale 0 and all codes 0.
        let mut flat = vec![7u16; record_words(3)];
        encode_log_probs(&[1.0, 1.0, 1.0], &mut flat);
        assert_eq!(&flat[4..], &[0, 0, 0, 0]);
        assert!((decode_log_prob(&flat, 1) - (-(3.0f32).ln())).abs() < 1e-6);
    }
}
