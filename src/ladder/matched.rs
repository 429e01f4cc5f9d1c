//! kwk's rows at the ladder's sizes. kwk's fixed ladder rows stand at the sizes of five
//! llama.cpp types (int8 under Q8_0; int6, int5, int4 and int3 sized to Q6_K, Q5_K_M,
//! Q4_K_M and Q3_K_M on the same model) and at `bpw:3.5`; the other types of a ladder
//! (Q4_0, IQ4_XS, IQ3_XXS, Q2_K, ik_llama.cpp's IQ*_K) land between them, where "at ≤ X
//! bpw, kwk's best loses a%" would otherwise name a kwk row a whole size smaller. A run
//! without `--formats` therefore adds a `bpw:X` row at each such size, X its GGUF's bits
//! per weight (rounded down to the hundredth `bpw:` takes), so every ladder row has a kwk
//! row of the same or a smaller size beside it. Plain rows only: the `+imatrix` rows are
//! the same sizes as their plain twins.

use crate::protocol::FormatSpec;
use crate::ui::Reporter;
use anyhow::{Context, Result};

/// The llama.cpp types kwk's fixed ladder rows stand for: int8 (under Q8_0's size), and
/// int6, int5, int4, int3 (sized to the rest on the same model).
pub const SIZED_BY_FIXED_ROWS: &[(&str, &str)] = &[
    ("int8", "Q8_0"),
    ("int6", "Q6_K"),
    ("int5", "Q5_K_M"),
    ("int4", "Q4_K_M"),
    ("int3", "Q3_K_M"),
];

/// The float GGUFs the ladder is made from (the reference's twins, not sizes of it).
const FLOAT_TYPES: &[&str] = &["F32", "F16", "BF16"];

/// How far under a ladder row's size a kwk row may stand and still answer for it: a
/// `bpw:X` row lands up to 0.05 under X, and two ladder types this close are one size.
pub const NEAR_BPW: f64 = 0.10;

/// A made GGUF of the ladder: its row label (`Q4_0`, `IQ4_K`, `Q4_K_M+imatrix`) and its
/// bits per weight (every tensor, as the reports count them).
#[derive(Debug, Clone, PartialEq)]
pub struct MadeSize {
    pub label: String,
    pub bpw: f64,
}

/// What [`matched_budgets`] adds and leaves out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Matched {
    /// Budgets in hundredths of a bit, each with the ladder rows it answers for (`Q4_0
    /// 4.85`: label and size).
    pub budgets: Vec<(u32, Vec<String>)>,
    /// Ladder rows with no kwk row at their size, and why (one line each).
    pub unmatched: Vec<String>,
}

/// The `bpw:X` budgets that give every plain ladder row of `made` a kwk row at its size
/// or at most [`NEAR_BPW`] under it. `fixed` are the sizes kwk's rows already stand at;
/// `range` the budgets `bpw:` accepts (a size outside it is listed in `unmatched`).
pub fn matched_budgets(made: &[MadeSize], fixed: &[f64], range: (f64, f64)) -> Matched {
    let mut stands: Vec<f64> = fixed.to_vec();
    let mut plain: Vec<&MadeSize> = made
        .iter()
        .filter(|m| {
            !m.label.ends_with(super::IMATRIX_SUFFIX)
                && !FLOAT_TYPES.contains(&m.label.as_str())
                && m.bpw.is_finite()
        })
        .collect();
    plain.sort_by(|a, b| a.bpw.total_cmp(&b.bpw));
    let mut out = Matched::default();
    for m in plain {
        // A hundredth under the size when it is not a whole hundredth: never above it.
        let centi = (m.bpw * 100.0 + 1e-9).floor() as u32;
        let x = centi as f64 / 100.0;
        // A row of size `s` answers for this type.
        let near = |s: f64| s <= m.bpw + 1e-9 && s >= m.bpw - NEAR_BPW;
        if stands.iter().any(|&s| near(s)) {
            // The nearest budget added here that stands for it (none when a fixed row does).
            if let Some(b) = out
                .budgets
                .iter_mut()
                .rev()
                .find(|(c, _)| near(*c as f64 / 100.0))
            {
                b.1.push(format!("{} {:.2}", m.label, m.bpw));
            }
            continue;
        }
        if x < range.0 || x > range.1 {
            out.unmatched.push(format!(
                "{} ({:.2} bpw): outside the budgets bpw:X takes ({:.2} to {:.2})",
                m.label, m.bpw, range.0, range.1
            ));
            continue;
        }
        stands.push(x);
        out.budgets
            .push((centi, vec![format!("{} {:.2}", m.label, m.bpw)]));
    }
    out
}

/// The sizes the run's fixed kwk rows stand at: `bpw:X` rows at X, and int8..int3 at the
/// size of the type they are sized to (when the ladder made it).
pub fn fixed_sizes(formats: &[FormatSpec], made: &[MadeSize]) -> Vec<f64> {
    let mut out = Vec::new();
    for f in formats {
        let FormatSpec::Kwk {
            name, precision, ..
        } = f
        else {
            continue;
        };
        if let ::kwk::Precision::Bpw(o) = precision {
            out.push(o.bits());
            continue;
        }
        if let Some((_, qtype)) = SIZED_BY_FIXED_ROWS.iter().find(|(n, _)| n == name) {
            if let Some(m) = made.iter().find(|m| m.label == *qtype) {
                out.push(m.bpw);
            }
        }
    }
    out
}

/// Adds kwk's `bpw:X` rows at the sizes of the ladder's GGUFs `made` that no kwk row of
/// the plan stands at ([`matched_budgets`]), after the plan's last kwk row, and says so.
pub fn add_rows(
    plan: &mut crate::plan::RunPlan,
    made: &[FormatSpec],
    ui: &dyn Reporter,
) -> Result<()> {
    // Each file's size as the reports count it (8 · tensor bytes / parameters, from its
    // header): llama-quantize's printed figure, which the ladder's lines show, is rounded
    // to two decimals and may count otherwise.
    let mut sizes = Vec::new();
    for f in made {
        if let FormatSpec::Gguf { path, label, .. } = f {
            let file = kwk::gguf::GgufFile::open(path).with_context(|| {
                format!("reading the size of the ladder's '{}'", path.display())
            })?;
            sizes.push(MadeSize {
                label: label.clone(),
                bpw: file.summary().bits_per_weight,
            });
        }
    }
    let fixed = fixed_sizes(&plan.formats, &sizes);
    let matched = matched_budgets(&sizes, &fixed, kwk::format::quantized::budget_range());
    let at = plan
        .formats
        .iter()
        .rposition(|f| matches!(f, FormatSpec::Kwk { .. }))
        .map_or(0, |i| i + 1);
    let mut names = Vec::new();
    for (i, (centi, labels)) in matched.budgets.iter().enumerate() {
        let name = format!("bpw:{}.{:02}", centi / 100, centi % 100);
        let spec = crate::protocol::parse_format(&name)
            .map_err(|e| anyhow::anyhow!("the ladder-sized row '{name}': {e}"))?;
        plan.formats.insert(at + i, spec);
        names.push(format!("{name} ({})", labels.join(", ")));
        plan.stands_for.push((name, labels.clone()));
    }
    if !names.is_empty() {
        ui.line(&format!(
            "kwk: {} added at the ladder's sizes (--formats sets the rows yourself)",
            names.join(", ")
        ));
    }
    for line in &matched.unmatched {
        ui.line(&format!("kwk: no row at the size of {line}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(list: &[(&str, f64)]) -> Vec<MadeSize> {
        list.iter()
            .map(|&(l, b)| MadeSize {
                label: l.into(),
                bpw: b,
            })
            .collect()
    }

    /// The 768-wide copy's ladder (sizes from its run): the types between kwk's fixed
    /// rows get a budget each, the +imatrix twins and those a row stands near do not.
    #[test]
    fn every_plain_size_between_the_fixed_rows_gets_a_budget() {
        let m = made(&[
            ("Q8_0", 8.50),
            ("Q6_K", 6.57),
            ("Q5_K_M", 5.77),
            ("Q4_K_M", 5.02),
            ("Q4_0", 4.85),
            ("IQ4_XS", 4.66),
            ("Q3_K_M", 4.24),
            ("IQ3_XXS", 3.3147),
            ("Q2_K", 3.49),
            ("Q4_K_M+imatrix", 5.02),
            ("IQ4_XS+imatrix", 4.66),
            ("F32", 32.0),
        ]);
        let fixed = [8.50, 6.57, 5.77, 5.02, 4.24, 3.5];
        let got = matched_budgets(&m, &fixed, (3.25, 8.5));
        assert_eq!(
            got.budgets,
            vec![
                (331, vec!["IQ3_XXS 3.31".to_string()]),
                (349, vec!["Q2_K 3.49".to_string()]),
                (466, vec!["IQ4_XS 4.66".to_string()]),
                (485, vec!["Q4_0 4.85".to_string()]),
            ]
        );
        assert!(got.unmatched.is_empty());
    }

    /// Two types within [`NEAR_BPW`] share the smaller's budget; a size under the range is
    /// named, not planned.
    #[test]
    fn near_sizes_share_a_row_and_out_of_range_sizes_are_named() {
        let m = made(&[
            ("Q2_K", 5.14),
            ("IQ3_XXS", 5.16),
            ("IQ4_XS", 5.32),
            ("Q4_0", 5.35),
            ("IQ2_K", 3.03),
        ]);
        let got = matched_budgets(&m, &[3.5], (3.25, 8.5));
        assert_eq!(
            got.budgets,
            vec![
                (
                    514,
                    vec!["Q2_K 5.14".to_string(), "IQ3_XXS 5.16".to_string()]
                ),
                (
                    532,
                    vec!["IQ4_XS 5.32".to_string(), "Q4_0 5.35".to_string()]
                ),
            ]
        );
        assert_eq!(got.unmatched.len(), 1);
        assert!(got.unmatched[0].starts_with("IQ2_K (3.03 bpw)"));
    }

    /// A budget is never above its GGUF's size: 4.659 gives 4.65, a whole hundredth stays.
    #[test]
    fn budgets_round_down_to_a_hundredth() {
        let got = matched_budgets(&made(&[("A", 4.659), ("B", 6.0)]), &[], (3.0, 8.5));
        assert_eq!(got.budgets[0].0, 465);
        assert_eq!(got.budgets[1].0, 600);
    }

    /// The fixed rows stand at their sized-to types' sizes and at their budgets.
    #[test]
    fn fixed_rows_stand_at_their_types_sizes() {
        let formats: Vec<FormatSpec> = ["float32", "int8", "int4", "bpw:3.5"]
            .iter()
            .map(|f| crate::protocol::parse_format(f).unwrap())
            .collect();
        let m = made(&[("Q8_0", 8.5), ("Q4_K_M", 5.02), ("Q6_K", 6.57)]);
        assert_eq!(fixed_sizes(&formats, &m), vec![8.5, 5.02, 3.5]);
    }
}
