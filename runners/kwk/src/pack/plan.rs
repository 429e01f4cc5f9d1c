//! The grid plan: which grid each (role, layer) gets, chosen by sensitivity, for the
//! formats that choose: the low-bit mix of `int3`..`int6` (`quantize::mix`, within the bits
//! llama.cpp's k-quant of that width, e.g. Q4_K_M for `int4`, would give the model) and
//! `bpw:X` (`quantize::budget`, every tensor within `X` bits per
//! weight of the whole model). One [`GridPlanner`] for every source.

use crate::error::{KwkError, Result};
use crate::format::quantized::{grid_for, Grid, BUDGET_GRIDS};
use crate::format::source_grid::SourceHomes;
use crate::format::{Precision, TensorPlace, TensorRole};
use crate::kernels::quant::Bits;
use crate::model::{FeedForward, LayerWeights, Mlp, ModelConfig, Tensor};
use crate::quantize::budget::{allocate_budget, Allocation, CELL_BPW};
use crate::quantize::equalize::{estimate_head, LayerImportance};
use crate::quantize::mix::{
    allocate_curves, head_ladder, k_quant_bits_per_weight, ladder, unit_curve_on, unit_homes,
    unit_ladder, Curve, MixUnit,
};
use std::collections::HashMap;

/// The mix units of layer `i` (q, k, v, o, gate, up, down; an MoE layer's experts share a
/// unit per role), each tensor with the second moments of its input (`li`'s importance when
/// it has them, else ones) and its rounding importance.
fn layer_mix_units<'a>(
    i: usize,
    l: &'a LayerWeights,
    li: Option<&'a LayerImportance>,
    ones: &'a [f32],
) -> Vec<MixUnit<'a>> {
    // The moments of each input (ones when equalization produced none); rounding is
    // weighted by them when it did.
    let m = |v: Option<&'a [f32]>, t: &Tensor| -> (&'a [f32], Option<&'a [f32]>) {
        match v.filter(|v| v.len() == t.cols()) {
            Some(v) => (v, Some(v)),
            None => (&ones[..t.cols().min(ones.len())], None),
        }
    };
    let mlps: Vec<&Mlp> = match &l.ffn {
        FeedForward::Dense(m) => vec![m],
        FeedForward::Moe(m) => m.experts.iter().chain(m.shared_expert.iter()).collect(),
    };
    let attn_in = li.map(|x| &x.attn_in[..]);
    let ffn_in = li.map(|x| &x.ffn_in[..]);
    type Inputs<'b> = Vec<(&'b Tensor, Option<&'b [f32]>)>;
    let groups: Vec<(TensorRole, Inputs)> = vec![
        (TensorRole::AttnQ, vec![(&l.q, attn_in)]),
        (TensorRole::AttnK, vec![(&l.k, attn_in)]),
        (TensorRole::AttnV, vec![(&l.v, attn_in)]),
        (
            TensorRole::AttnOutput,
            vec![(&l.o, li.map(|x| &x.o_in[..]))],
        ),
        (
            TensorRole::FfnGate,
            mlps.iter().map(|mm| (&mm.gate, ffn_in)).collect(),
        ),
        (
            TensorRole::FfnUp,
            mlps.iter().map(|mm| (&mm.up, ffn_in)).collect(),
        ),
        (
            TensorRole::FfnDown,
            mlps.iter()
                .enumerate()
                .map(|(j, mm)| (&mm.down, li.and_then(|x| x.down_in.get(j)).map(|v| &v[..])))
                .collect(),
        ),
    ];
    groups
        .into_iter()
        .map(|(role, tensors)| MixUnit {
            role,
            layer: Some(i),
            tensors: tensors
                .into_iter()
                .map(|(t, v)| {
                    let (moment, imp) = m(v, t);
                    (t, moment, imp)
                })
                .collect(),
        })
        .collect()
}

/// The grid plan by sensitivity, one way for every source: a grid per (role, layer). The
/// units are handed in as the source yields them (the embedding and output tables, then
/// each equalized layer in order); only their curves are kept, so a streamed model need
/// not stay in memory.
pub(crate) struct GridPlanner {
    n_layers: usize,
    rule: Rule,
    /// The grids of the layers' units (and of every unit under `bpw`).
    steps: Vec<Grid>,
    /// `intB`'s output projection: its own ladder ([`head_ladder`]).
    head_steps: Option<Vec<Grid>>,
    keys: Vec<(TensorRole, Option<usize>)>,
    /// Each unit's ladder, in the order added.
    ladders: Vec<Vec<Grid>>,
    curves: Vec<Curve>,
}

/// What the plan spends, and on what.
enum Rule {
    /// `intB` (`bits` = B): every linear, `lm_head` on its own ladder;
    /// `budget` is what llama.cpp's k-quant of that width (Q4_K_M for `int4`) would spend
    /// on the covered units.
    Mix { bits: Bits, budget: f64 },
    /// `bpw:X`: every tensor; the float vectors (weights no unit covers) stay float32.
    Budget {
        precision: Precision,
        bpw: f64,
        model_params: u64,
        covered: u64,
    },
}

impl GridPlanner {
    /// The planner of `precision` (`None`: its grids come from its rule alone).
    pub fn new(
        config: &ModelConfig,
        precision: &Precision,
        place: &(dyn Fn(TensorRole, Option<usize>) -> TensorPlace + Sync),
    ) -> Result<Option<GridPlanner>> {
        let n_layers = config.n_layers;
        let model_params = place(TensorRole::LmHead, None).model_params;
        let (rule, steps, head_steps) = match precision {
            Precision::LowBit(opts) => {
                // The format's rule must place the output projection (it checks the
                // options), though the mix chooses its grid on its own ladder.
                grid_for(precision, &place(TensorRole::LmHead, None))?.ok_or_else(|| {
                    KwkError::InvalidArgument(format!("{}: lm_head has no grid", precision.name()))
                })?;
                let mix_bits = opts.mix_bits_for(config.hidden_size);
                // The budget grows by what the width's k-quant would spend on each unit
                // as it is added (the float vectors cost the same in both).
                let rule = Rule::Mix {
                    bits: opts.bits,
                    budget: 0.0,
                };
                let steps = ladder(opts.bits, opts.group_size, mix_bits);
                (rule, steps, Some(head_ladder()))
            }
            Precision::Bpw(o) => (
                Rule::Budget {
                    precision: *precision,
                    bpw: o.bits(),
                    model_params,
                    covered: 0,
                },
                BUDGET_GRIDS.to_vec(),
                None,
            ),
            _ => return Ok(None),
        };
        Ok(Some(GridPlanner {
            n_layers,
            rule,
            steps,
            head_steps,
            keys: Vec::new(),
            ladders: Vec::new(),
            curves: Vec::new(),
        }))
    }

    fn add(&mut self, u: &MixUnit) {
        // `intB`'s units climb ladders of their own: a near copy's grid joins the ladder of
        // a unit whose source has one (`bpw:X` allocates on one ladder, BUDGET_GRIDS, which
        // holds every g32 grid already).
        let homes = unit_homes(u);
        let ladder = match self.rule {
            Rule::Mix { .. } => unit_ladder(&self.steps, &homes),
            Rule::Budget { .. } => self.steps.clone(),
        };
        self.add_weighted(u, 1.0, ladder, &homes);
    }

    /// Adds `u` (its [`unit_homes`] `homes`) on `ladder` with its error counted `weight`
    /// times (the output projection).
    fn add_weighted(&mut self, u: &MixUnit, weight: f64, ladder: Vec<Grid>, homes: &[SourceHomes]) {
        match &mut self.rule {
            Rule::Mix { bits, budget } => {
                for (t, _, _) in &u.tensors {
                    *budget += t.data.len() as f64
                        * k_quant_bits_per_weight(*bits, u.role, u.layer, self.n_layers, t.cols());
                }
            }
            Rule::Budget { covered, .. } => *covered += u.params(),
        }
        let mut curve = unit_curve_on(u, &ladder, homes);
        curve.err.iter_mut().for_each(|e| *e *= weight);
        self.curves.push(curve);
        self.ladders.push(ladder);
        self.keys.push((u.role, u.layer));
    }

    /// The embedding table `embed` and the untied output projection `lm_head`, whose
    /// input is the final norm's output (`final_norm`'s weights estimate its second
    /// moments unless `head_moments`, measured, are given). Both tables are planned, a
    /// tied one as `lm_head`; under `intB` the output projection climbs its own ladder
    /// ([`head_ladder`]).
    pub fn add_tables(
        &mut self,
        embed: &Tensor,
        lm_head: Option<&Tensor>,
        final_norm: &[f32],
        head_moments: &[f32],
    ) {
        let ones = vec![1f32; embed.cols()];
        let embedding = |t| MixUnit {
            role: TensorRole::Embedding,
            layer: None,
            tensors: vec![(t, &ones[..], None)],
        };
        let estimated;
        let moments = if head_moments.len() == embed.cols() {
            head_moments
        } else {
            estimated = estimate_head(final_norm);
            &estimated[..]
        };
        let head = |t| MixUnit {
            role: TensorRole::LmHead,
            layer: None,
            tensors: vec![(t, moments, None)],
        };
        // The output projection's relative noise is the logits' own; a layer's linear adds
        // its noise to one of the 2L + 1 contributions the residual stream sums (the
        // embedding, each attention and feed-forward output), so it counts 2L + 1 times
        // (`quantize::budget`).
        let head_weight = (2 * self.n_layers + 1) as f64;
        let head_steps = self
            .head_steps
            .clone()
            .unwrap_or_else(|| self.steps.clone());
        if lm_head.is_some() {
            self.add(&embedding(embed));
        }
        let head = head(lm_head.unwrap_or(embed));
        self.add_weighted(&head, head_weight, head_steps, &unit_homes(&head));
    }

    /// Layer `i`, equalized, with its rounding importance when equalization kept one.
    pub fn add_layer(&mut self, i: usize, l: &LayerWeights, imp: &LayerImportance) {
        let ones = vec![1f32; layer_width(l)];
        let li = Some(imp).filter(|x| !x.attn_in.is_empty());
        for u in layer_mix_units(i, l, li, &ones) {
            self.add(&u);
        }
    }

    /// `bpw`'s allocation of every unit added (see `quantize::budget`); an error names the
    /// budgets this model can take when `X` is outside them.
    fn allocate(&self) -> Result<Allocation> {
        let Rule::Budget {
            precision,
            bpw,
            model_params,
            covered,
        } = self.rule
        else {
            unreachable!("allocate is bpw's")
        };
        let n = model_params.max(1) as f64;
        let fixed = 32.0 * model_params.saturating_sub(covered) as f64;
        let span = |pick: fn(f64, f64) -> f64| {
            let units: f64 = self
                .curves
                .iter()
                .map(|c| c.bits.iter().copied().fold(c.bits[0], pick))
                .sum();
            (units + fixed) / n
        };
        let (fewest, most) = (span(f64::min), span(f64::max));
        let name = precision.name();
        if bpw > most + 0.05 {
            return Err(KwkError::InvalidArgument(format!(
                "{name}: this model packs to at most {most:.2} bits per weight (every tensor on \
                 the widest grid, float vectors at 32 bits); give a budget up to that"
            )));
        }
        allocate_budget(&self.curves, &self.steps, bpw * n - fixed, CELL_BPW * n).ok_or_else(|| {
            KwkError::InvalidArgument(format!(
                "{name}: this model packs to no fewer than {fewest:.2} bits per weight \
                     (every tensor on the cheapest grid, float vectors at 32 bits); give a \
                     budget of at least that"
            ))
        })
    }

    /// The grids chosen.
    pub fn finish(self) -> Result<HashMap<(TensorRole, Option<usize>), Grid>> {
        let grids = match self.rule {
            Rule::Mix { budget, .. } => allocate_curves(&self.curves, budget)
                .into_iter()
                .zip(&self.ladders)
                .map(|(step, ladder)| ladder[step])
                .collect(),
            Rule::Budget { .. } => self.allocate()?.grids,
        };
        Ok(self.keys.into_iter().zip(grids).collect())
    }
}

/// The widest input of a layer's linears.
fn layer_width(l: &LayerWeights) -> usize {
    let mut n = l.q.cols().max(l.o.cols());
    match &l.ffn {
        FeedForward::Dense(m) => n = n.max(m.down.cols()),
        FeedForward::Moe(m) => {
            for e in m.experts.iter().chain(m.shared_expert.iter()) {
                n = n.max(e.down.cols());
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::{DecoderOptions, KwkDecoder};
    use crate::model::load_model;
    use crate::pack::build::count_params;

    fn fixture(name: &str) -> crate::model::Model {
        load_model(kwk_fixtures::model_dir(name).to_str().unwrap()).unwrap()
    }

    fn options(precision: Precision) -> DecoderOptions {
        DecoderOptions {
            max_cache_len: 16,
            precision,
            kv: Default::default(),
            threads: 2,
            calibration_tokens: None,
            pack_cache_dir: None,
        }
    }

    /// `bpw:X` packs every fixture (tied, untied with biases, mixture of experts) to `X`
    /// bits per weight within 0.05, counted over every tensor, and runs; budgets under 4
    /// bits per weight take the 3-bit grids (the fixtures' float vectors are a large share,
    /// and their short rows each carry a whole super-block of scales: tiny-llama packs to
    /// no fewer than 3.77, so 4 is the lowest budget tested).
    #[test]
    fn bpw_meets_its_budget_within_0_05() {
        for name in ["tiny-llama", "tiny-qwen2", "tiny-mixtral"] {
            let model = fixture(name);
            for spec in [
                "bpw:4", "bpw:4.25", "bpw:4.75", "bpw:5.5", "bpw:6.25", "bpw:8",
            ] {
                let p = Precision::parse(spec).unwrap();
                let mut d = KwkDecoder::new(&model, options(p)).unwrap();
                let got = d.bits_per_weight();
                let Precision::Bpw(o) = p else { unreachable!() };
                assert!(
                    got <= o.bits() + 1e-9 && got >= o.bits() - 0.05,
                    "{name} {spec}: {got} bits per weight"
                );
                let logits = d.forward(&[1, 5, 9], 0).unwrap();
                assert!(logits.iter().all(|x| x.is_finite()), "{name} {spec}");
            }
        }
    }

    /// The planner on a fixture's weights: the plan never exceeds its budget, and more
    /// budget never gives a larger total proxy error.
    #[test]
    fn more_budget_never_gives_a_larger_error() {
        for name in ["tiny-llama", "tiny-qwen2"] {
            let model = fixture(name);
            let (config, w) = (&model.config, &model.weights);
            let n_params = count_params(w);
            let place = |role, layer| TensorPlace {
                role,
                layer,
                n_layers: config.n_layers,
                model_params: n_params,
                model_width: config.hidden_size,
            };
            let mut last = f64::INFINITY;
            for centibits in (400..=880).step_by(20) {
                let p = Precision::Bpw(crate::format::BpwOptions {
                    centibits,
                    calibrate: false,
                });
                let mut planner = GridPlanner::new(config, &p, &place).unwrap().unwrap();
                planner.add_tables(&w.embed, w.lm_head.as_ref(), &w.final_norm, &[]);
                for (i, l) in w.layers.iter().enumerate() {
                    planner.add_layer(i, l, &LayerImportance::default());
                }
                let a = planner.allocate().unwrap();
                let Rule::Budget { covered, .. } = planner.rule else {
                    unreachable!("a bpw planner")
                };
                let floats = 32.0 * (n_params - covered) as f64;
                let bpw = (a.bits + floats) / n_params as f64;
                assert!(
                    bpw <= centibits as f64 / 100.0 + 1e-9,
                    "{name} {centibits}: {bpw}"
                );
                assert!(a.error <= last, "{name} {centibits}: {} > {last}", a.error);
                last = a.error;
            }
        }
    }

    /// A budget inside the grids' range that this model cannot meet is one clear error.
    #[test]
    fn a_budget_the_model_cannot_meet_is_refused() {
        let model = fixture("tiny-llama");
        let p = Precision::parse("bpw:3.25").unwrap();
        let e = KwkDecoder::new(&model, options(p))
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("bpw:3.25") && e.contains("no fewer than"), "{e}");
    }
}
