//! llama-bench's two flash-attention settings, measured side by side in every round under
//! `--llama-fa best`: per test, the setting with the higher mean tokens/s over the rounds
//! gives the row its figures (all its samples, from that one setting, so the rounds stay
//! paired with the other rows'); both settings' figures are kept for the record. Ties go
//! to flash attention on, `auto`'s choice on CPU.

use crate::protocol::points::FlashAttnSpeed;
use crate::stats::speed_sample;
use anyhow::Result;
use std::collections::BTreeMap;

/// Samples `(round, tokens/s)` of one test, per flash-attention setting.
pub type BySetting = BTreeMap<bool, Vec<(usize, f64)>>;

/// The faster setting of one test and every setting's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// The setting with the higher mean.
    pub flash_attn: bool,
    /// Its samples, each with its round.
    pub samples: Vec<(usize, f64)>,
    /// Every setting's figures, in setting order (off before on).
    pub by_setting: Vec<FlashAttnSpeed>,
}

/// The faster of the settings of test `what`; `None` when no setting has a sample. An
/// error for a sample that is not a positive finite rate.
pub fn faster(what: &str, settings: &BySetting) -> Result<Option<Pick>> {
    let mut by_setting = Vec::new();
    for (&fa, samples) in settings.iter().filter(|(_, s)| !s.is_empty()) {
        let values = samples.iter().map(|s| s.1).collect();
        let label = format!("{what} at -fa {}", u8::from(fa));
        let s = speed_sample(&label, values)?;
        by_setting.push(FlashAttnSpeed {
            flash_attn: fa,
            tokens_per_s: s.tokens_per_s,
            tokens_per_s_std: s.tokens_per_s_std,
            samples_tokens_per_s: s.samples_tokens_per_s,
            rounds: samples.iter().map(|s| s.0).collect(),
        });
    }
    // Settings are in order off, on: `>=` lets a later (on) setting win a tie.
    let best = by_setting
        .iter()
        .fold(None::<&FlashAttnSpeed>, |best, s| match best {
            Some(b) if b.tokens_per_s > s.tokens_per_s => Some(b),
            _ => Some(s),
        });
    Ok(best.map(|b| Pick {
        flash_attn: b.flash_attn,
        samples: b
            .rounds
            .iter()
            .copied()
            .zip(b.samples_tokens_per_s.iter().copied())
            .collect(),
        by_setting: by_setting.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(off: &[f64], on: &[f64]) -> BySetting {
        let rounds = |v: &[f64]| v.iter().copied().enumerate().collect::<Vec<_>>();
        BTreeMap::from([(false, rounds(off)), (true, rounds(on))])
    }

    /// Each test keeps the setting with the higher mean, with all of its own samples (not a
    /// per-round maximum mixing the two), and both settings' figures.
    #[test]
    fn the_higher_mean_wins_per_test() {
        // tg at depth: off wins though on has the single best round.
        let tg = faster(
            "tg64@d4096",
            &settings(&[52.0, 51.0, 50.0], &[15.0, 16.0, 60.0]),
        )
        .unwrap()
        .unwrap();
        assert!(!tg.flash_attn);
        assert_eq!(tg.samples, [(0, 52.0), (1, 51.0), (2, 50.0)]);
        assert_eq!(tg.by_setting.len(), 2);
        assert_eq!(tg.by_setting[0].tokens_per_s, 51.0);
        assert!((tg.by_setting[1].tokens_per_s - 91.0 / 3.0).abs() < 1e-12);
        // pp: on wins.
        let pp = faster("pp512", &settings(&[1203.0, 1199.0], &[1747.0, 1750.0]))
            .unwrap()
            .unwrap();
        assert!(pp.flash_attn);
        assert_eq!(pp.samples, [(0, 1747.0), (1, 1750.0)]);
    }

    #[test]
    fn a_tie_goes_to_flash_attention_on_and_one_setting_is_itself() {
        let tie = faster("tg", &settings(&[10.0, 12.0], &[11.0, 11.0]))
            .unwrap()
            .unwrap();
        assert!(tie.flash_attn);
        let one = BTreeMap::from([(false, vec![(3, 7.0)])]);
        let only = faster("tg", &one).unwrap().unwrap();
        assert_eq!(
            (only.flash_attn, only.samples.clone()),
            (false, vec![(3, 7.0)])
        );
        assert_eq!(only.by_setting.len(), 1);
        assert_eq!(faster("tg", &BTreeMap::new()).unwrap(), None);
        assert_eq!(faster("tg", &settings(&[], &[])).unwrap(), None);
    }

    #[test]
    fn a_bad_sample_is_an_error_naming_its_setting() {
        let e = faster("pp512", &settings(&[10.0], &[f64::NAN])).unwrap_err();
        assert!(format!("{e:#}").contains("pp512 at -fa 1"), "{e:#}");
    }
}
