//! The decoder as the calibration's activation sink: forward passes over calibration
//! tokens that record what every linear's input is (sums of squares per channel, and
//! Hessians one layer at a time for GPTQ) for the packing pipeline
//! ([`CalibrationPass`]); the pipeline decides what is measured and what it is used for.

use super::layers;
use super::*;
use crate::pack::calibrate::{CalibrationPass, LayerGrams, LayerRecord, PassRecords};
use crate::quantize::equalize::ActivationStats;

impl CalibrationPass for KwkDecoder {
    fn activation_stats(
        &mut self,
        tokens: &[u32],
        window: usize,
        fallback: &ActivationStats,
    ) -> Result<ActivationStats> {
        KwkDecoder::activation_stats(self, tokens, window, fallback)
    }

    fn layer_hessians(
        &mut self,
        tokens: &[u32],
        window: usize,
        each: &mut dyn FnMut(usize, LayerGrams) -> Result<()>,
    ) -> Result<PassRecords> {
        KwkDecoder::layer_hessians(self, tokens, window, each)
    }
}

impl KwkDecoder {
    /// Per-channel second moments of every linear's input over `tokens`, run in windows of
    /// `window` tokens from an empty cache (calibration). An expert no token was routed to
    /// gets `fallback`'s estimate for its `down` input.
    pub fn activation_stats(
        &mut self,
        tokens: &[u32],
        window: usize,
        fallback: &ActivationStats,
    ) -> Result<ActivationStats> {
        if tokens.is_empty() || window == 0 {
            return Err(KwkError::InvalidArgument(
                "calibration needs at least one token and a window of at least one".into(),
            ));
        }
        let n_layers = self.layers.len();
        self.scratch.record = Some(vec![LayerRecord::default(); n_layers]);
        self.scratch.head_record = Some((Vec::new(), 0));
        let mut run = || -> Result<()> {
            for w in tokens.chunks(window.min(self.max_cache_len)) {
                crate::interrupt::check()?;
                self.reset();
                // Only the last position's logits: the statistics are taken inside.
                self.forward(w, w.len() - 1)?;
            }
            Ok(())
        };
        let ran = run();
        let records = PassRecords {
            layers: self.scratch.record.take().unwrap_or_default(),
            head: self.scratch.head_record.take(),
        };
        self.reset();
        ran?;
        Ok(records.stats(fallback))
    }

    /// The Hessians `Σ x xᵀ` of every linear input over `tokens` (run in windows of
    /// `window` tokens from an empty cache, as [`Self::activation_stats`]), one layer at a
    /// time: the residual stream of every calibration token is kept (`tokens × hidden`
    /// float32) and pushed through layer 0, then 1, ...; after each layer `each(layer,
    /// hessians)` gets that layer's Hessians, which are then dropped. Peak memory: the
    /// residual streams plus one layer's Hessians (f64) and what `each` holds. Returns the
    /// sums of squares of the same pass ([`Self::activation_stats`]'s, the same values).
    pub(crate) fn layer_hessians(
        &mut self,
        tokens: &[u32],
        window: usize,
        each: &mut dyn FnMut(usize, LayerGrams) -> Result<()>,
    ) -> Result<PassRecords> {
        if tokens.is_empty() || window == 0 {
            return Err(KwkError::InvalidArgument(
                "calibration needs at least one token and a window of at least one".into(),
            ));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(KwkError::InvalidArgument(format!(
                "calibration token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let d = self.config.hidden_size;
        let win = window.min(self.max_cache_len);
        let mut streams: Vec<Vec<f32>> = tokens
            .chunks(win)
            .map(|w| {
                let mut x = vec![0f32; w.len() * d];
                super::embed_rows(self.embed.as_ref(), self.gemma.as_ref(), w, &mut x);
                x
            })
            .collect();
        let n_layers = self.layers.len();
        let mut pass = PassRecords {
            layers: Vec::with_capacity(n_layers),
            head: None,
        };
        let mut run = || -> Result<()> {
            for li in 0..n_layers {
                crate::interrupt::check()?;
                let mut records = vec![LayerRecord::default(); n_layers];
                records[li].gram = Some(LayerGrams::default());
                self.scratch.record = Some(records);
                for x in streams.iter_mut() {
                    let mut pos = 0;
                    for chunk in x.chunks_mut(MICRO_BATCH * d) {
                        self.layers[li].forward(
                            &super::layer_runtime(
                                &self.config,
                                &self.pool,
                                &self.rope,
                                self.gemma.as_ref(),
                                li,
                            ),
                            &mut self.kv,
                            li,
                            pos,
                            chunk,
                            &mut self.scratch,
                        );
                        pos += chunk.len() / d;
                    }
                }
                let mut records = self.scratch.record.take().unwrap_or_default();
                let mut record = records.swap_remove(li);
                let mut grams = record.gram.take().unwrap_or_default();
                pass.layers.push(record);
                for h in [&mut grams.attn_in, &mut grams.o_in, &mut grams.ffn_in]
                    .into_iter()
                    .chain(grams.down_in.iter_mut())
                {
                    layers::mirror_gram(h);
                }
                each(li, grams)?;
            }
            // lm_head's input: the final norm of every stream.
            let mut head = (Vec::new(), 0u64);
            for x in &streams {
                let mut xn = x.clone();
                let eps = self.config.rms_norm_eps;
                layers::rms_norm_rows(&self.pool, &mut xn, &self.final_norm, eps);
                layers::accumulate_squares(&mut head.0, &xn, d);
                head.1 += (x.len() / d) as u64;
            }
            pass.head = Some(head);
            Ok(())
        };
        let ran = run();
        layers::release_gram_scratch();
        self.reset();
        ran.map(|()| pass)
    }
}
