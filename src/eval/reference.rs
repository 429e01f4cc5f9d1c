//! What other runners are compared against the float32 reference with: KL divergence,
//! same-top-token agreement, Δp, per-token NLL and the change of entropy, with llama-perplexity's
//! `--kl-divergence` per-token arithmetic (tools/perplexity/perplexity.cpp P:191-252) and
//! statistics (P:1892-1982), on the reference's log-probs as [`crate::eval::base_file`]
//! stores them.
//!
//! Every row is compared record against record: an in-tree row's logits are encoded into
//! the same 16-bit record ([`crate::eval::records`]) a GGUF row's llama-perplexity writes
//! (`--kl-divergence-base`), so both engines' KLD, top-1 and per-token NLL come from the
//! same arithmetic on the same representation. The per-token values are kept
//! ([`TokenScores`]) for paired errors.

use crate::eval::base_file::LogitsBaseReader;
use crate::eval::paired::paired;
use crate::eval::perplexity::ChunkLogits;
use crate::eval::records::{encode_log_probs, record_header, record_words};
use crate::protocol::{ChunkPlan, ReferenceComparison, TokenScores};
use anyhow::{ensure, Result};
use std::path::Path;

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
    /// The row's entropy less the reference's, per position (nats).
    pub entropy_diff: Vec<f32>,
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
        let (mut sum, mut h_base, mut h_row) = (0.0f64, 0.0f64, 0.0f64);
        for (&b, &c) in bc.iter().zip(qc) {
            let lb = bs * f32::from(b) + bm;
            let lq = qs * f32::from(c) + qm;
            if lb > -16.0 {
                let pb = lb.exp();
                sum += f64::from(pb * (lb - lq));
                h_base -= f64::from(pb * lb);
            }
            // Each distribution's entropy over its own tokens above the same floor.
            if lq > -16.0 {
                h_row -= f64::from(lq.exp() * lq);
            }
        }
        self.nll.push(nll);
        self.nll_base.push(nll_base);
        self.kld.push(sum as f32);
        self.same_top.push(first_argmax(qc) == first_argmax(bc));
        self.p_diff.push((-nll).exp() - (-nll_base).exp());
        self.entropy_diff.push((h_row - h_base) as f32);
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
        let (entropy_delta, entropy_delta_err) =
            mean_and_unc(sum(&self.entropy_diff, 1), sum(&self.entropy_diff, 2), n);
        let r = ReferenceComparison {
            kld_mean,
            kld_mean_err,
            kld_p99,
            top1_agreement: top1,
            top1_agreement_err: (top1 * (1.0 - top1) / (n as f64 - 1.0)).sqrt(),
            delta_p_rms: p_diff_mse.sqrt(),
            ln_ppl_ratio: ratio.mean,
            ln_ppl_ratio_err: ratio.se,
            entropy_delta,
            entropy_delta_err,
        };
        for (name, v) in [
            ("mean KLD", r.kld_mean),
            ("KLD uncertainty", r.kld_mean_err),
            ("99% KLD", r.kld_p99),
            ("RMS Δp", r.delta_p_rms),
            ("entropy change", r.entropy_delta),
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
    use crate::eval::base_file::tests::{test_ppl, test_stamp};
    use crate::eval::base_file::{
        base_file_bytes, read_verified, reference_scores, LogitsBaseWriter,
    };
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
        // Entropy: ln 2 for Q, -(1/4 ln 1/4 + 3/4 ln 3/4) for the reference; Q is flatter.
        let h_ref = -(0.25 * 0.25f64.ln() + 0.75 * 0.75f64.ln());
        assert!((f64::from(acc.entropy_diff[0]) - (2f64.ln() - h_ref)).abs() < 1e-4);
        assert!(
            same.entropy_diff[0].abs() < 1e-5,
            "{}",
            same.entropy_diff[0]
        );
        acc.add(&[0.0, 0.0], &rec, 1);
        let (r, t) = acc.finish().unwrap();
        assert!((r.delta_p_rms - 0.25).abs() < 1e-4);
        assert_eq!(r.top1_agreement, 0.0);
        assert_eq!(r.kld_mean_err, 0.0, "N <= 10 gives no uncertainty");
        assert!((r.ln_ppl_ratio - 1.5f64.ln()).abs() < 1e-4);
        assert!(r.ln_ppl_ratio_err < 1e-6, "identical differences");
        assert!((r.entropy_delta - (2f64.ln() - h_ref)).abs() < 1e-4);
        assert_eq!(t.nll.len(), 2);
    }

    /// Logits scaled up (a lower temperature) give a sharper distribution and a negative
    /// entropy change, scaled down a positive one, over a vocabulary of 101.
    #[test]
    fn entropy_change_tells_a_sharper_row_from_a_flatter_one() {
        let base: Vec<f32> = (0..101).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        let mut rec = vec![0u16; record_words(base.len())];
        encode_log_probs(&base, &mut rec);
        let scaled = |f: f32| base.iter().map(|&z| z * f).collect::<Vec<_>>();
        let mut sharp = KldAccumulator::default();
        let mut flat = KldAccumulator::default();
        for t in 0..12 {
            sharp.add(&scaled(1.5), &rec, t);
            flat.add(&scaled(0.5), &rec, t);
        }
        let (s, _) = sharp.finish().unwrap();
        let (f, _) = flat.finish().unwrap();
        assert!(s.entropy_delta < -0.05, "{}", s.entropy_delta);
        assert!(f.entropy_delta > 0.05, "{}", f.entropy_delta);
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
        let partial = dir.path().join("base.bin.partial");
        std::fs::write(&partial, b"").unwrap();
        let mut w = LogitsBaseWriter::create(&partial, &path, &plan, vocab, &tokens).unwrap();
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
        w.finish(&test_stamp(), &test_ppl()).unwrap();
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
        let partial = dir.path().join("base.bin.partial");
        assert!(LogitsBaseWriter::create(&partial, &path, &plan, vocab, &tokens).is_err());
        std::fs::write(&partial, b"").unwrap();
        let mut w = LogitsBaseWriter::create(&partial, &path, &plan, vocab, &tokens).unwrap();
        for k in 0..plan.chunks {
            let c = ChunkLogits {
                chunk: k,
                rows: &rows,
                vocab,
                targets: plan.targets(&tokens, k),
            };
            w.write_chunk(&c).unwrap();
        }
        assert!(!path.exists(), "nothing under the final name before finish");
        let own = w.finish(&test_stamp(), &test_ppl()).unwrap();
        assert!(!partial.exists() && path.exists(), "renamed into place");
        assert_eq!(own.nll.len(), plan.scored_tokens());
        let id = read_verified(&path).unwrap();
        assert_eq!(id.body_bytes, base_file_bytes(8, vocab, 2));
        assert_eq!(id.stamp, test_stamp());
        assert_eq!((id.ppl, id.scored_tokens), (test_ppl().ppl, 6));
        // The float32 row's figures read back from the file are the ones its writer gave.
        assert_eq!(reference_scores(&path, &plan, &tokens).unwrap(), own);
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
