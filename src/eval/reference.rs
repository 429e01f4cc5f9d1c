//! The float32 reference and what other runners are compared against it with: KL
//! divergence, same-top-token agreement, Δp and per-token NLL, with llama-perplexity's
//! `--kl-divergence` per-token arithmetic (tools/perplexity/perplexity.cpp P:191-252) and
//! statistics (P:1892-1982).
//!
//! Log-probs are kept in llama.cpp's own `--kl-divergence-base` file format: the reference
//! runner writes one, and llama-perplexity writes one for each GGUF row (the same file a
//! `--kl-divergence` run would read). Layout: header `_logits_`, n_ctx,
//! n_vocab, n_chunk (int32), the token stream (int32 × n_chunk·n_ctx), then one record per
//! scored position of `2·ceil(n_vocab/2) + 4` uint16 words: f32 scale, f32 min_log_prob,
//! the uint16 codes, one padding word when n_vocab is odd. Host byte order (little-endian
//! on x86). Size: `20 + 4·n_chunk·n_ctx + 2·words·n_chunk·(n_ctx-1-n_ctx/2)` bytes, about
//! 1 GB for 40 chunks of 512 with a 49k vocabulary.
//!
//! Every row is compared record against record: an in-tree row's logits are encoded into
//! the same 16-bit record a GGUF row's llama-perplexity writes (`--kl-divergence-base`), so
//! both engines' KLD, top-1 and per-token NLL come from the same arithmetic on the same
//! representation. The per-token values are kept ([`TokenScores`]) for paired errors.

use crate::eval::paired::paired;
use crate::eval::perplexity::ChunkLogits;
use crate::protocol::{ChunkPlan, ReferenceComparison, TokenScores};
use anyhow::{bail, ensure, Context, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The file magic (P:466).
pub const MAGIC: &[u8; 8] = b"_logits_";

/// uint16 words per record: `2·ceil(n_vocab/2) + 4` (P:524).
pub fn record_words(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Size in bytes of a base file (§2.2).
/// Saturates at `u64::MAX` (a size no disk holds) instead of overflowing.
pub fn base_file_bytes(ctx: usize, n_vocab: usize, chunks: usize) -> u64 {
    let scored = ctx.saturating_sub(1 + ctx / 2) as u64;
    let (ctx, chunks) = (ctx as u64, chunks as u64);
    let words = (n_vocab as u64)
        .div_ceil(2)
        .saturating_mul(2)
        .saturating_add(4);
    let tokens = chunks.saturating_mul(ctx).saturating_mul(4);
    let records = words
        .saturating_mul(2)
        .saturating_mul(chunks)
        .saturating_mul(scored);
    tokens.saturating_add(records).saturating_add(20)
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
fn record_header(rec: &[u16]) -> (f32, f32) {
    let scale = f32::from_bits(u32::from(rec[0]) | (u32::from(rec[1]) << 16));
    let min_log_prob = f32::from_bits(u32::from(rec[2]) | (u32::from(rec[3]) << 16));
    (scale, min_log_prob)
}

/// Decoded log-probability of token `i` of a record: `scale·q[i] + min_log_prob` (f32).
pub fn decode_log_prob(rec: &[u16], i: usize) -> f32 {
    let (scale, min_log_prob) = record_header(rec);
    scale * f32::from(rec[4 + i]) + min_log_prob
}

/// The header of a base file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseHeader {
    pub ctx: usize,
    pub n_vocab: usize,
    pub chunks: usize,
    pub tokens: Vec<u32>,
}

/// Writes the reference runner's scored log-probs, chunk by chunk.
pub struct LogitsBaseWriter {
    out: BufWriter<File>,
    path: PathBuf,
    n_vocab: usize,
    chunks: usize,
    written: usize,
    record: Vec<u16>,
    bytes: Vec<u8>,
    /// NLL of each scored target, decoded from its record.
    nll: Vec<f32>,
}

impl LogitsBaseWriter {
    /// Writes the header into `path`: `plan.chunks·plan.ctx` tokens of the stream (with its
    /// leading BOS, without the per-chunk BOS substitution, P:523). `path` must exist
    /// already, made by the caller with an exclusive create (the run reserves it, so it
    /// owns the file it later removes); it is opened for writing, never created here.
    pub fn create(path: &Path, plan: &ChunkPlan, n_vocab: usize, tokens: &[u32]) -> Result<Self> {
        let n_tokens = plan.chunks * plan.ctx;
        ensure!(
            tokens.len() >= n_tokens,
            "the token stream is shorter than the chunk plan"
        );
        let file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .with_context(|| format!("opening the KL-divergence base file '{}'", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut header = Vec::with_capacity(20 + 4 * n_tokens);
        header.extend_from_slice(MAGIC);
        for v in [plan.ctx, n_vocab, plan.chunks] {
            header.extend_from_slice(
                &i32::try_from(v)
                    .context("header value exceeds int32")?
                    .to_le_bytes(),
            );
        }
        for &t in &tokens[..n_tokens] {
            header.extend_from_slice(&(t as i32).to_le_bytes());
        }
        out.write_all(&header)
            .with_context(|| format!("writing '{}'", path.display()))?;
        Ok(LogitsBaseWriter {
            out,
            path: path.to_path_buf(),
            n_vocab,
            chunks: plan.chunks,
            written: 0,
            record: vec![0; record_words(n_vocab)],
            bytes: Vec::new(),
            nll: Vec::new(),
        })
    }

    pub fn write_chunk(&mut self, c: &ChunkLogits) -> Result<()> {
        ensure!(
            c.vocab == self.n_vocab,
            "the reference runner returned rows of {} logits, the base file holds {}",
            c.vocab,
            self.n_vocab
        );
        ensure!(
            self.written < self.chunks,
            "more chunks than the base file header announced"
        );
        self.bytes.clear();
        for (row, &t) in c.rows.chunks_exact(c.vocab).zip(c.targets) {
            encode_log_probs(row, &mut self.record);
            self.nll.push(-decode_log_prob(&self.record, t as usize));
            for w in &self.record {
                self.bytes.extend_from_slice(&w.to_le_bytes());
            }
        }
        self.out
            .write_all(&self.bytes)
            .with_context(|| format!("writing '{}' (is the disk full?)", self.path.display()))?;
        self.written += 1;
        Ok(())
    }

    /// Flushes the file; the reference's own per-token figures (KLD 0, same top).
    pub fn finish(mut self) -> Result<TokenScores> {
        ensure!(
            self.written == self.chunks,
            "the base file '{}' got {} of {} chunks",
            self.path.display(),
            self.written,
            self.chunks
        );
        self.out
            .flush()
            .with_context(|| format!("writing '{}'", self.path.display()))?;
        let n = self.nll.len();
        Ok(TokenScores {
            nll: self.nll,
            kld: vec![0.0; n],
            same_top: vec![true; n],
        })
    }
}

/// Reads a base file record by record.
pub struct LogitsBaseReader {
    input: BufReader<File>,
    path: PathBuf,
    pub header: BaseHeader,
    bytes: Vec<u8>,
}

fn read_i32(r: &mut impl Read) -> std::io::Result<i32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(i32::from_le_bytes(b))
}

impl LogitsBaseReader {
    pub fn open(path: &Path) -> Result<Self> {
        let what = || format!("reading the KL-divergence base file '{}'", path.display());
        let file = File::open(path).with_context(what)?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic).with_context(what)?;
        if &magic != MAGIC {
            bail!(
                "'{}' is not a llama.cpp KL-divergence base file (no _logits_ magic)",
                path.display()
            );
        }
        let mut dims = [0usize; 3];
        for d in &mut dims {
            let v = read_i32(&mut input).with_context(what)?;
            *d = usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .with_context(|| {
                    format!(
                        "'{}': header value {v} is not a positive size",
                        path.display()
                    )
                })?;
        }
        let [ctx, n_vocab, chunks] = dims;
        // The sizes come from the file: check them against its length before allocating.
        let file_len = input.get_ref().metadata().with_context(what)?.len();
        let token_bytes = ctx
            .checked_mul(chunks)
            .and_then(|n| n.checked_mul(4))
            .filter(|&n| n as u64 <= file_len.saturating_sub(20))
            .with_context(|| {
                format!(
                    "'{}': its header announces {chunks} chunks of ctx {ctx}, more tokens than the {file_len}-byte file holds; the file is corrupt or truncated",
                    path.display()
                )
            })?;
        let mut raw = vec![0u8; token_bytes];
        input.read_exact(&mut raw).with_context(what)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect();
        Ok(LogitsBaseReader {
            input,
            path: path.to_path_buf(),
            header: BaseHeader {
                ctx,
                n_vocab,
                chunks,
                tokens,
            },
            bytes: vec![0; 2 * record_words(n_vocab)],
        })
    }

    /// Fails unless the file was written for this plan and these tokens.
    pub fn check_matches(&self, plan: &ChunkPlan, n_vocab: usize, tokens: &[u32]) -> Result<()> {
        let h = &self.header;
        ensure!(
            h.ctx == plan.ctx && h.chunks == plan.chunks,
            "'{}' holds {} chunks of ctx {}, this run scores {} chunks of ctx {}",
            self.path.display(),
            h.chunks,
            h.ctx,
            plan.chunks,
            plan.ctx
        );
        ensure!(
            h.n_vocab == n_vocab,
            "'{}' holds a vocabulary of {}, this runner's is {}",
            self.path.display(),
            h.n_vocab,
            n_vocab
        );
        ensure!(
            h.tokens[..] == tokens[..h.tokens.len().min(tokens.len())]
                && tokens.len() >= h.tokens.len(),
            "'{}' was written for other tokens than this run's",
            self.path.display()
        );
        Ok(())
    }

    /// Reads the next record into `rec` (`record_words(n_vocab)` words).
    pub fn read_record(&mut self, rec: &mut [u16]) -> Result<()> {
        self.input
            .read_exact(&mut self.bytes)
            .with_context(|| format!("reading '{}': the file is truncated", self.path.display()))?;
        for (w, b) in rec.iter_mut().zip(self.bytes.chunks_exact(2)) {
            *w = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}

/// llama.cpp's `mean_and_uncertainty` (P:1750-1758): mean and `sqrt(var/(N-1))`, the
/// latter 0 unless the variance is positive and N > 10.
pub fn mean_and_unc(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let unc = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, unc)
}

/// llama.cpp's percentile over ascending `values` (P:1930-1936), in f32.
pub fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let mut p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// First index of the largest code (codes are monotone in the log-prob, scale ≥ 0).
fn first_argmax(codes: &[u16]) -> usize {
    let mut imax = 0;
    for (i, &c) in codes.iter().enumerate() {
        if c > codes[imax] {
            imax = i;
        }
    }
    imax
}

/// Per-token figures of §2.4 over scored tokens, kept token by token.
#[derive(Debug, Clone, Default)]
pub struct KldAccumulator {
    pub nll: Vec<f32>,
    pub nll_base: Vec<f32>,
    pub kld: Vec<f32>,
    pub same_top: Vec<bool>,
    pub p_diff: Vec<f32>,
    record: Vec<u16>,
}

impl KldAccumulator {
    /// One scored position from this runner's `logits`: encoded into a record first, so an
    /// in-tree row is measured exactly like a GGUF row ([`Self::add_records`]).
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let mut q = std::mem::take(&mut self.record);
        q.resize(record_words(logits.len()), 0);
        encode_log_probs(logits, &mut q);
        self.add_records(&q, base, tok, logits.len());
        self.record = q;
    }

    /// One scored position: this runner's record `q`, the reference `base`, the target.
    /// llama.cpp's per-token arithmetic (P:191-252) on decoded log-probs: KLD over tokens
    /// whose reference log-prob exceeds −16, first-argmax agreement, Δp of the target.
    pub fn add_records(&mut self, q: &[u16], base: &[u16], tok: usize, n_vocab: usize) {
        let (qs, qm) = record_header(q);
        let (bs, bm) = record_header(base);
        let (qc, bc) = (&q[4..4 + n_vocab], &base[4..4 + n_vocab]);
        let nll = -(qs * f32::from(qc[tok]) + qm);
        let nll_base = -(bs * f32::from(bc[tok]) + bm);
        let mut sum = 0.0f64;
        for (&b, &c) in bc.iter().zip(qc) {
            let lb = bs * f32::from(b) + bm;
            if lb > -16.0 {
                let lq = qs * f32::from(c) + qm;
                sum += f64::from(lb.exp() * (lb - lq));
            }
        }
        self.nll.push(nll);
        self.nll_base.push(nll_base);
        self.kld.push(sum as f32);
        self.same_top.push(first_argmax(qc) == first_argmax(bc));
        self.p_diff.push((-nll).exp() - (-nll_base).exp());
    }

    /// The report's figures (§2.5) and the per-token values: mean KLD ± unc, 99th-percentile
    /// KLD, same-top fraction ± `sqrt(p(1-p)/(N-1))`, RMS Δp, and ln(PPL/PPL_ref) ± its
    /// paired error. Errors when a figure is not finite.
    pub fn finish(self) -> Result<(ReferenceComparison, TokenScores)> {
        let n = self.kld.len();
        ensure!(
            n > 1,
            "fewer than 2 scored tokens to compare against the reference"
        );
        let sum = |v: &[f32], pow: i32| v.iter().map(|&x| f64::from(x).powi(pow)).sum::<f64>();
        let (kld_mean, kld_mean_err) = mean_and_unc(sum(&self.kld, 1), sum(&self.kld, 2), n);
        let mut sorted = self.kld.clone();
        sorted.sort_by(f32::total_cmp);
        let kld_p99 = f64::from(percentile(&sorted, 0.990));
        let (p_diff_mse, _) = mean_and_unc(sum(&self.p_diff, 2), sum(&self.p_diff, 4), n);
        let top1 = self.same_top.iter().filter(|&&s| s).count() as f64 / n as f64;
        let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let ratio = paired(&f64s(&self.nll), &f64s(&self.nll_base))?;
        let r = ReferenceComparison {
            kld_mean,
            kld_mean_err,
            kld_p99,
            top1_agreement: top1,
            top1_agreement_err: (top1 * (1.0 - top1) / (n as f64 - 1.0)).sqrt(),
            delta_p_rms: p_diff_mse.sqrt(),
            ln_ppl_ratio: ratio.mean,
            ln_ppl_ratio_err: ratio.se,
        };
        for (name, v) in [
            ("mean KLD", r.kld_mean),
            ("KLD uncertainty", r.kld_mean_err),
            ("99% KLD", r.kld_p99),
            ("RMS Δp", r.delta_p_rms),
        ] {
            ensure!(
                v.is_finite(),
                "{name} against the reference is {v}: NaN or infinite logits"
            );
        }
        let tokens = TokenScores {
            nll: self.nll,
            kld: self.kld,
            same_top: self.same_top,
        };
        Ok((r, tokens))
    }
}

/// Compares a row's own log-prob file (llama-perplexity `--kl-divergence-base` of a GGUF)
/// with the reference's, record by record. Both must hold `plan`'s chunks of `tokens`.
pub fn compare_files(
    row: &Path,
    base: &Path,
    plan: &ChunkPlan,
    n_vocab: usize,
    tokens: &[u32],
) -> Result<(ReferenceComparison, TokenScores)> {
    let mut q = LogitsBaseReader::open(row)?;
    q.check_matches(plan, n_vocab, tokens)?;
    let mut b = LogitsBaseReader::open(base)?;
    b.check_matches(plan, n_vocab, tokens)?;
    let (mut qr, mut br) = (
        vec![0u16; record_words(n_vocab)],
        vec![0u16; record_words(n_vocab)],
    );
    let mut acc = KldAccumulator::default();
    for k in 0..plan.chunks {
        for t in plan.targets(tokens, k) {
            q.read_record(&mut qr)?;
            b.read_record(&mut br)?;
            acc.add_records(&qr, &br, *t as usize, n_vocab);
        }
    }
    acc.finish()
}

/// Compares chunk after chunk of a runner's logits with a base file.
pub struct ReferenceComparer {
    reader: LogitsBaseReader,
    record: Vec<u16>,
    acc: KldAccumulator,
}

impl ReferenceComparer {
    pub fn open(path: &Path, plan: &ChunkPlan, n_vocab: usize, tokens: &[u32]) -> Result<Self> {
        let reader = LogitsBaseReader::open(path)?;
        reader.check_matches(plan, n_vocab, tokens)?;
        Ok(ReferenceComparer {
            reader,
            record: vec![0; record_words(n_vocab)],
            acc: KldAccumulator::default(),
        })
    }

    pub fn compare_chunk(&mut self, c: &ChunkLogits) -> Result<()> {
        for (row, &t) in c.rows.chunks_exact(c.vocab).zip(c.targets) {
            self.reader.read_record(&mut self.record)?;
            self.acc.add(row, &self.record, t as usize);
        }
        Ok(())
    }

    pub fn finish(self) -> Result<(ReferenceComparison, TokenScores)> {
        self.acc.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header announcing more tokens than the file holds is refused before anything is
    /// allocated (2^31 − 1 chunks of ctx 2^31 − 1 would ask for 2^64 bytes).
    #[test]
    fn huge_header_sizes_are_refused_not_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("base.bin");
        let mut b = MAGIC.to_vec();
        for v in [i32::MAX, 49152, i32::MAX] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 64]);
        std::fs::write(&p, &b).unwrap();
        let e = format!("{:#}", LogitsBaseReader::open(&p).err().unwrap());
        assert!(
            e.contains("announces 2147483647 chunks of ctx 2147483647")
                && e.contains("corrupt or truncated"),
            "{e}"
        );
        // 16 tokens fit in 64 bytes: the header is read (and the records are not checked here).
        let mut b = MAGIC.to_vec();
        for v in [8i32, 10, 2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 64]);
        std::fs::write(&p, &b).unwrap();
        assert_eq!(LogitsBaseReader::open(&p).unwrap().header.tokens.len(), 16);
    }

    #[test]
    fn base_file_bytes_by_hand_and_saturating() {
        // ctx 8: positions 4..=6 scored (3 per chunk); vocab 10: 2·5 + 4 = 14 words a record.
        assert_eq!(base_file_bytes(8, 10, 2), 20 + 4 * 16 + 2 * 14 * 2 * 3);
        assert_eq!(base_file_bytes(1 << 30, 1 << 24, usize::MAX), u64::MAX);
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(1234.4), 1234);
    }

    #[test]
    fn record_layout_and_file_size() {
        assert_eq!(record_words(49152), 49156);
        assert_eq!(record_words(5), 10);
        // 40 chunks of 512 at 49152: 20 + 4*20480 + 2*49156*40*255 bytes (~1.0 GB).
        assert_eq!(
            base_file_bytes(512, 49152, 40),
            20 + 81920 + 2 * 49156 * 40 * 255
        );
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

    #[test]
    fn kld_of_a_row_against_itself_is_tiny_and_against_a_known_shift_is_hand_computed() {
        // Reference p = softmax([0, ln 3]) = (1/4, 3/4); Q = softmax([0, 0]) = (1/2, 1/2).
        let base_row = [0.0f32, 3.0f32.ln()];
        let mut rec = vec![0u16; record_words(2)];
        encode_log_probs(&base_row, &mut rec);
        let mut same = KldAccumulator::default();
        same.add(&base_row, &rec, 1);
        assert!(same.kld[0].abs() < 1e-6);
        assert!(same.same_top[0]);

        let mut acc = KldAccumulator::default();
        acc.add(&[0.0, 0.0], &rec, 1);
        // KL(p||q) = 1/4 ln(1/2) + 3/4 ln(3/2)
        let kl = 0.25 * (0.5f64).ln() + 0.75 * (1.5f64).ln();
        assert!(
            (f64::from(acc.kld[0]) - kl).abs() < 1e-4,
            "{} vs {kl}",
            acc.kld[0]
        );
        // Q's argmax is token 0 (first of equals), the reference's token 1.
        assert!(!acc.same_top[0]);
        // Δp = q(1) - p(1) = 1/2 - 3/4.
        assert!((acc.p_diff[0] + 0.25).abs() < 1e-4);
        // NLL: ln 2 for Q, ln(4/3) for the reference: ln(PPL/PPL_ref) = ln(3/2).
        assert!((acc.nll[0] - 2f32.ln()).abs() < 1e-4);
        assert!((acc.nll_base[0] - (4.0f32 / 3.0).ln()).abs() < 1e-4);
        acc.add(&[0.0, 0.0], &rec, 1);
        let (r, t) = acc.finish().unwrap();
        assert!((r.delta_p_rms - 0.25).abs() < 1e-4);
        assert_eq!(r.top1_agreement, 0.0);
        assert_eq!(r.kld_mean_err, 0.0, "N <= 10 gives no uncertainty");
        assert!((r.ln_ppl_ratio - 1.5f64.ln()).abs() < 1e-4);
        assert!(r.ln_ppl_ratio_err < 1e-6, "identical differences");
        assert_eq!(t.nll.len(), 2);
    }

    #[test]
    fn statistics_follow_llama_cpp_helpers() {
        let (m, u) = mean_and_unc(10.0, 30.0, 5);
        assert_eq!((m, u), (2.0, 0.0));
        // 12 values: 6 zeros, 6 twos -> mean 1, var 1, unc sqrt(1/11).
        let (m, u) = mean_and_unc(12.0, 24.0, 12);
        assert_eq!(m, 1.0);
        assert!((u - (1.0f64 / 11.0).sqrt()).abs() < 1e-12);
        let v = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert!((percentile(&v, 0.99) - 3.96).abs() < 1e-5);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(percentile(&v, 0.0), 0.0);
    }

    /// The streamed path (the reference's records written to the base file chunk by
    /// chunk, read back one record at a time while a row is scored) gives exactly what
    /// holding every reference record in memory gives: the same per-token KLD, NLL, top-1
    /// and Δp, bit for bit, and the same statistics. Rows are random over a vocabulary of
    /// 1001 (odd: the padding word), 3 chunks of ctx 16.
    #[test]
    fn streamed_reference_equals_records_held_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.bin");
        let vocab = 1001;
        let mut state = 7u64;
        let mut rand = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let tokens: Vec<u32> = (0..50).map(|_| (rand() * vocab as f32) as u32).collect();
        let plan = ChunkPlan::new(tokens.len(), 16, None).unwrap();
        assert_eq!(plan.chunks, 3);
        let rows = plan.scored_per_chunk();
        let logits = |scale: f32, rand: &mut dyn FnMut() -> f32| -> Vec<Vec<f32>> {
            (0..plan.chunks)
                .map(|_| (0..rows * vocab).map(|_| rand() * scale - 4.0).collect())
                .collect()
        };
        let base = logits(12.0, &mut rand);
        // The row: the reference perturbed.
        let row: Vec<Vec<f32>> = base
            .iter()
            .map(|c| c.iter().map(|&l| l + (rand() - 0.5) * 0.8).collect())
            .collect();
        std::fs::write(&path, b"").unwrap();
        let mut w = LogitsBaseWriter::create(&path, &plan, vocab, &tokens).unwrap();
        for (k, b) in base.iter().enumerate() {
            let targets = plan.targets(&tokens, k);
            let c = ChunkLogits {
                chunk: k,
                rows: b,
                vocab,
                targets,
            };
            w.write_chunk(&c).unwrap();
        }
        w.finish().unwrap();
        let mut streamed = ReferenceComparer::open(&path, &plan, vocab, &tokens).unwrap();
        let mut held = KldAccumulator::default();
        for (k, (b, r)) in base.iter().zip(&row).enumerate() {
            let targets = plan.targets(&tokens, k);
            let c = ChunkLogits {
                chunk: k,
                rows: r,
                vocab,
                targets,
            };
            streamed.compare_chunk(&c).unwrap();
            // In memory: every reference record of the chunk encoded and kept at once.
            let records: Vec<Vec<u16>> = b
                .chunks_exact(vocab)
                .map(|b| {
                    let mut rec = vec![0u16; record_words(vocab)];
                    encode_log_probs(b, &mut rec);
                    rec
                })
                .collect();
            for ((q, rec), &t) in r.chunks_exact(vocab).zip(&records).zip(targets) {
                held.add(q, rec, t as usize);
            }
        }
        let (a, ta) = streamed.finish().unwrap();
        let (b, tb) = held.finish().unwrap();
        assert_eq!(ta.kld, tb.kld);
        assert_eq!(ta.nll, tb.nll);
        assert_eq!(ta.same_top, tb.same_top);
        assert_eq!(
            (
                a.kld_mean,
                a.kld_p99,
                a.top1_agreement,
                a.delta_p_rms,
                a.ln_ppl_ratio
            ),
            (
                b.kld_mean,
                b.kld_p99,
                b.top1_agreement,
                b.delta_p_rms,
                b.ln_ppl_ratio
            )
        );
        assert!(
            a.kld_mean > 1e-4,
            "the perturbation moved the distributions"
        );
        assert!(a.top1_agreement < 1.0);
    }

    #[test]
    fn base_file_round_trips_and_rejects_other_plans() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.bin");
        let tokens: Vec<u32> = (0..20).map(|i| i % 3).collect();
        let plan = ChunkPlan::new(tokens.len(), 8, None).unwrap();
        assert_eq!(plan.chunks, 2);
        let vocab = 3;
        let rows: Vec<f32> = (0..plan.scored_per_chunk() * vocab)
            .map(|i| (i % 7) as f32 * 0.5)
            .collect();
        // Not reserved yet: refused, never created.
        assert!(LogitsBaseWriter::create(&path, &plan, vocab, &tokens).is_err());
        std::fs::write(&path, b"").unwrap();
        let mut w = LogitsBaseWriter::create(&path, &plan, vocab, &tokens).unwrap();
        for k in 0..plan.chunks {
            let c = ChunkLogits {
                chunk: k,
                rows: &rows,
                vocab,
                targets: plan.targets(&tokens, k),
            };
            w.write_chunk(&c).unwrap();
        }
        let own = w.finish().unwrap();
        assert_eq!(own.nll.len(), plan.scored_tokens());
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, base_file_bytes(8, vocab, 2));
        let r = LogitsBaseReader::open(&path).unwrap();
        assert_eq!(r.header.tokens, tokens[..16]);
        assert_eq!((r.header.ctx, r.header.n_vocab, r.header.chunks), (8, 3, 2));
        let other = ChunkPlan::new(tokens.len(), 10, None).unwrap();
        assert!(r.check_matches(&other, vocab, &tokens).is_err());
        assert!(r.check_matches(&plan, 4, &tokens).is_err());
        let mut cmp = ReferenceComparer::open(&path, &plan, vocab, &tokens).unwrap();
        for k in 0..plan.chunks {
            let c = ChunkLogits {
                chunk: k,
                rows: &rows,
                vocab,
                targets: plan.targets(&tokens, k),
            };
            cmp.compare_chunk(&c).unwrap();
        }
        let (res, scores) = cmp.finish().unwrap();
        assert!(res.kld_mean.abs() < 1e-5);
        assert_eq!(res.top1_agreement, 1.0);
        // The same rows give the same per-token NLL as the reference wrote.
        assert_eq!(scores.nll, own.nll);
        assert_eq!(res.ln_ppl_ratio, 0.0);
        // A second file with the same rows compares file against file alike.
        let copy = dir.path().join("row.bin");
        std::fs::copy(&path, &copy).unwrap();
        let (f, fs) = compare_files(&copy, &path, &plan, vocab, &tokens).unwrap();
        assert_eq!((f.top1_agreement, f.ln_ppl_ratio), (1.0, 0.0));
        assert_eq!(fs.nll, own.nll);
        std::fs::write(&path, b"_logits_\x08\x00").unwrap();
        assert!(LogitsBaseReader::open(&path).is_err());
        std::fs::write(&path, b"GGUF....").unwrap();
        assert!(LogitsBaseReader::open(&path).is_err());
    }
}
