//! Typed samples and their summaries. Speed figures are the mean of per-repetition
//! tokens/s and their sample (n-1) standard deviation (llama-bench's definition, computed
//! with statrs); a single repetition has no spread and reports 0, as llama-bench does.
//! Nothing non-finite leaves this module as a number: a NaN or infinite figure is an error
//! for the runner that produced it.

use crate::protocol::SpeedSample;
use anyhow::{ensure, Result};
use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::Statistics;

/// Returns `value` when it is finite, an error naming `what` otherwise.
pub fn finite(what: &str, value: f64) -> Result<f64> {
    ensure!(value.is_finite(), "{what} is {value}, not a finite number");
    Ok(value)
}

/// Mean and sample standard deviation (0 for one sample) of `samples`.
pub fn mean_and_sample_std(samples: &[f64]) -> (f64, f64) {
    let mean = samples.iter().mean();
    let std = if samples.len() > 1 {
        samples.iter().std_dev()
    } else {
        0.0
    };
    (mean, std)
}

/// A speed figure from per-repetition tokens/s.
pub fn speed_sample(what: &str, samples: Vec<f64>) -> Result<SpeedSample> {
    ensure!(!samples.is_empty(), "{what}: no repetitions were measured");
    for &s in &samples {
        finite(&format!("{what} tokens/s of a repetition"), s)?;
        ensure!(s > 0.0, "{what}: a repetition measured {s} tokens/s");
    }
    let (mean, std) = mean_and_sample_std(&samples);
    Ok(SpeedSample {
        tokens_per_s: finite(&format!("{what} mean tokens/s"), mean)?,
        tokens_per_s_std: finite(&format!("{what} tokens/s stddev"), std)?,
        samples_tokens_per_s: samples,
    })
}

/// Median of `values` (the mean of the middle two for an even count), `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut s = values.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Half-width of the two-sided 95% Student-t interval of the mean, `None` for fewer than
/// two samples.
pub fn ci95_half_width(samples: &[f64]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let n = samples.len() as f64;
    let (_, std) = mean_and_sample_std(samples);
    let t = StudentsT::new(0.0, 1.0, n - 1.0).ok()?.inverse_cdf(0.975);
    Some(t * std / n.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_stddev() {
        let s = speed_sample("pp", vec![10.0, 12.0, 14.0]).unwrap();
        assert_eq!(s.tokens_per_s, 12.0);
        assert!((s.tokens_per_s_std - 2.0).abs() < 1e-12, "n-1 stddev");
        let one = speed_sample("tg", vec![5.0]).unwrap();
        assert_eq!((one.tokens_per_s, one.tokens_per_s_std), (5.0, 0.0));
        assert!(speed_sample("tg", vec![]).is_err());
        assert!(speed_sample("tg", vec![1.0, f64::NAN]).is_err());
        assert!(speed_sample("tg", vec![1.0, f64::INFINITY]).is_err());
        assert!(finite("ppl", f64::NAN).is_err());
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn student_t_interval() {
        // t(0.975, 2) = 4.302653; std 2, n 3 -> 4.302653 * 2 / sqrt(3).
        let h = ci95_half_width(&[10.0, 12.0, 14.0]).unwrap();
        assert!((h - 4.302_653 * 2.0 / 3f64.sqrt()).abs() < 1e-4, "{h}");
        assert!(ci95_half_width(&[1.0]).is_none());
    }
}
