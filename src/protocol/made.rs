//! How a GGUF row of the llama.cpp ladder was made ([`MadeGguf`]): from which source, with
//! which tool, type and importance matrix, and what llama-quantize did to tensors whose rows
//! its type could not hold. Carried from the ladder step into the row of results.json.

use serde::{Deserialize, Serialize};

/// Tensors that fell back from one type to another, counted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FallbackGroup {
    /// The type the mix asked for (`q4_K`).
    pub wanted: String,
    /// The type llama-quantize used (`q5_0`).
    pub used: String,
    pub tensors: usize,
}

/// A GGUF the run made from `--llm` (the ladder).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct MadeGguf {
    /// The llama.cpp type asked for (`Q4_K_M`, or `F32` for the conversion itself).
    pub qtype: String,
    /// How the float GGUF the types are made from came to be: `convert_hf_to_gguf.py` from
    /// a Hugging Face folder, or `llama-quantize --allow-requantize` from a GGUF source
    /// (whose own types are named, since its weights are already rounded).
    pub from: String,
    /// SHA-256 of the importance matrix, when the type was made with one (`+imatrix` rows).
    pub imatrix_sha256: Option<String>,
    /// Tensors whose row length the type could not hold, by (wanted, used) type.
    pub fallbacks: Vec<FallbackGroup>,
    /// Tensors that fell back, of all tensors (`None` when llama-quantize printed no count).
    pub fallback_tensors: Option<usize>,
    pub tensors: Option<usize>,
    /// Bits per weight as llama-quantize printed them (two decimals).
    pub quantize_bits_per_weight: Option<f64>,
    /// Whether the file came from the cache (made by an earlier run).
    pub cached: bool,
    /// Seconds making it took (this run's, or the run that made it).
    pub make_s: f64,
    /// The cached file.
    pub path: String,
}

impl MadeGguf {
    /// One line on the fallbacks: `90 of 272 tensors fell back for row length (q4_K→q5_0
    /// ×60, q6_K→q8_0 ×30)`; `None` without any.
    pub fn fallback_line(&self) -> Option<String> {
        if self.fallbacks.is_empty() {
            return None;
        }
        let n: usize = self
            .fallback_tensors
            .unwrap_or_else(|| self.fallbacks.iter().map(|f| f.tensors).sum());
        let of = self.tensors.map_or(String::new(), |t| format!(" of {t}"));
        let groups: Vec<String> = self
            .fallbacks
            .iter()
            .map(|f| format!("{}→{} ×{}", f.wanted, f.used, f.tensors))
            .collect();
        Some(format!(
            "{n}{of} tensors fell back for row length ({})",
            groups.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_line_counts_each_pair() {
        let mut m = MadeGguf {
            qtype: "Q4_K_M".into(),
            ..Default::default()
        };
        assert_eq!(m.fallback_line(), None);
        m.fallbacks = vec![
            FallbackGroup {
                wanted: "q4_K".into(),
                used: "q5_0".into(),
                tensors: 60,
            },
            FallbackGroup {
                wanted: "q6_K".into(),
                used: "q8_0".into(),
                tensors: 30,
            },
        ];
        m.tensors = Some(272);
        assert_eq!(
            m.fallback_line().unwrap(),
            "90 of 272 tensors fell back for row length (q4_K→q5_0 ×60, q6_K→q8_0 ×30)"
        );
    }
}
