//! Paired statistics between two rows scored on the same tokens: the mean of the per-token
//! differences and its standard error `sqrt(var/(N-1))` with the population variance, which
//! is what llama-perplexity prints for `Mean ln(PPL(Q)/PPL(base))`
//! (`sqrt(u_Q² + u_base² − 2·cov)`, protocol doc §2.5). Because both rows see the same
//! tokens, the token-to-token spread of difficulty cancels and the error is far smaller than
//! either perplexity's own. Tokens are treated as independent, as llama.cpp does.

use crate::protocol::results::PairedChange;
use crate::protocol::TokenScores;
use anyhow::{ensure, Result};

/// A mean difference and its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    pub mean: f64,
    pub se: f64,
}

/// `mean(a − b)` and its standard error over paired values (at least 2, equal lengths).
pub fn paired(a: &[f64], b: &[f64]) -> Result<Paired> {
    ensure!(
        a.len() == b.len(),
        "paired values of unequal length ({} and {}): the rows were not scored on the same tokens",
        a.len(),
        b.len()
    );
    ensure!(a.len() >= 2, "a paired error needs at least 2 tokens");
    let n = a.len() as f64;
    let (mut sum, mut sum2) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let d = x - y;
        sum += d;
        sum2 += d * d;
    }
    let mean = sum / n;
    let var = (sum2 / n - mean * mean).max(0.0);
    let se = (var / (n - 1.0)).sqrt();
    ensure!(
        mean.is_finite() && se.is_finite(),
        "a paired difference is not finite"
    );
    Ok(Paired { mean, se })
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn bools(v: &[bool]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(u8::from(x))).collect()
}

/// `this` against `other` (named `other_name`) on the same tokens.
pub fn paired_change(
    this: &TokenScores,
    other: &TokenScores,
    other_name: &str,
) -> Result<PairedChange> {
    let ppl = paired(&f64s(&this.nll), &f64s(&other.nll))?;
    let kld = paired(&f64s(&this.kld), &f64s(&other.kld))?;
    let top1 = paired(&bools(&this.same_top), &bools(&other.same_top))?;
    Ok(PairedChange {
        row: other_name.to_string(),
        ln_ppl_ratio: ppl.mean,
        ln_ppl_ratio_err: ppl.se,
        kld_diff: kld.mean,
        kld_diff_err: kld.se,
        top1_diff: top1.mean,
        top1_diff_err: top1.se,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_error_equals_a_hand_computation() {
        // d = a − b = [0.5, −0.5, 1, 1]: mean 0.5; population variance
        // (0.25 + 0.25 + 1 + 1)/4 − 0.25 = 0.375; SE = sqrt(0.375/3) = sqrt(0.125).
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [0.5, 2.5, 2.0, 3.0];
        let p = paired(&a, &b).unwrap();
        assert!((p.mean - 0.5).abs() < 1e-15);
        assert!((p.se - 0.125f64.sqrt()).abs() < 1e-15, "{}", p.se);
        // The same as llama.cpp's sqrt(u_a² + u_b² − 2 cov), each term over N − 1.
        let n = 4.0;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / n;
        let (ma, mb) = (mean(&a), mean(&b));
        let var = |v: &[f64], m: f64| v.iter().map(|x| x * x).sum::<f64>() / n - m * m;
        let cov = a.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>() / n - ma * mb;
        let llama = ((var(&a, ma) + var(&b, mb) - 2.0 * cov) / (n - 1.0)).sqrt();
        assert!((p.se - llama).abs() < 1e-12);
        // Far below the unpaired error: the rows share the tokens' difficulty.
        let unpaired = ((var(&a, ma) + var(&b, mb)) / (n - 1.0)).sqrt();
        assert!(p.se < unpaired);
        assert!(paired(&a, &b[..3]).is_err());
        assert!(paired(&a[..1], &b[..1]).is_err());
    }

    #[test]
    fn paired_change_of_token_scores() {
        let this = TokenScores {
            nll: vec![1.0, 2.0, 3.0, 4.0],
            kld: vec![0.1, 0.2, 0.1, 0.2],
            same_top: vec![true, false, true, true],
        };
        let other = TokenScores {
            nll: vec![0.5, 2.5, 2.0, 3.0],
            kld: vec![0.0; 4],
            same_top: vec![true; 4],
        };
        let c = paired_change(&this, &other, "float32").unwrap();
        assert_eq!(c.row, "float32");
        assert!((c.ln_ppl_ratio - 0.5).abs() < 1e-7);
        assert!((c.kld_diff - 0.15).abs() < 1e-7);
        assert!((c.top1_diff + 0.25).abs() < 1e-12);
        // d = [0, −1, 0, 0]: var 3/16, SE sqrt(1/16) = 0.25.
        assert!((c.top1_diff_err - 0.25).abs() < 1e-12);
        assert!(c.beyond_2se());
    }
}
