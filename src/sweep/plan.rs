//! A sweep's cells and its shared work, from a checked [`Sweep`]: one cell per (model,
//! text, format, thread count, depth), each a plain kwk-eval run into its own folder
//! `cells/NNN-...` of the sweep folder; and one shared job per model that makes what the
//! cells would otherwise each make (llama.cpp's F32 conversion and the ladder's types,
//! cached in `$KWK_CACHE/gguf`; kwk's packed formats, cached in the pack cache), so the
//! cells reuse it. Nothing here runs anything: the plan is the command lines.

use super::file::{Sweep, SweepFormat};
pub use crate::merge::model_short;
use std::path::{Path, PathBuf};

/// One cell: a kwk-eval run.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub index: usize,
    /// The folder's name under `cells/` (`003-SmolLM2-wiki-int8-t2`).
    pub name: String,
    pub model: String,
    pub text: PathBuf,
    pub format: SweepFormat,
    pub threads: usize,
    pub depth: usize,
    /// kwk-eval's arguments (without the program and `--out`).
    pub args: Vec<String>,
}

/// The work one model's cells share, done once before them.
#[derive(Debug, Clone, PartialEq)]
pub struct Shared {
    pub index: usize,
    pub name: String,
    pub model: String,
    /// What it makes, for the plan's listing.
    pub makes: Vec<String>,
    pub args: Vec<String>,
}

/// A sweep's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub cells: Vec<Cell>,
    pub shared: Vec<Shared>,
}

/// The cells' folder in a sweep folder.
pub fn cells_dir(out: &Path) -> PathBuf {
    out.join("cells")
}

/// The shared jobs' folder in a sweep folder.
pub fn shared_dir(out: &Path) -> PathBuf {
    out.join("shared")
}

/// Letters, digits and `.+-` kept, anything else `_` (a folder name from a label).
fn slug(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.chars().take(48).collect()
}

/// A text's short name: its file name without the extension.
pub fn text_short(text: &Path) -> String {
    text.file_stem()
        .map_or_else(|| "text".into(), |s| s.to_string_lossy().into_owned())
}

/// The protocol flags every run of the sweep shares.
fn protocol_args(s: &Sweep, chunks: usize) -> Vec<String> {
    let mut a = vec![
        "--ctx".to_string(),
        s.ctx.to_string(),
        "--chunks".into(),
        chunks.to_string(),
    ];
    if let Some(c) = &s.calib_text {
        a.extend(["--calib-text".into(), c.display().to_string()]);
    }
    a.extend(s.args.iter().cloned());
    a
}

/// The cells and shared jobs of `s`, in the order models, texts, formats, threads, depths.
pub fn plan(s: &Sweep) -> Plan {
    let mut cells = Vec::new();
    let several_texts = s.texts.len() > 1;
    for model in &s.models {
        for text in &s.texts {
            for format in &s.formats {
                for &threads in &s.threads {
                    for &depth in &s.depths {
                        let index = cells.len();
                        let mut name = format!("{index:03}-{}", slug(&model_short(model)));
                        if several_texts {
                            name.push('-');
                            name.push_str(&slug(&text_short(text)));
                        }
                        name.push_str(&format!("-{}-t{threads}", slug(&format.label())));
                        if depth > 0 {
                            name.push_str(&format!("-d{depth}"));
                        }
                        cells.push(Cell {
                            index,
                            name,
                            model: model.clone(),
                            text: text.clone(),
                            format: format.clone(),
                            threads,
                            depth,
                            args: cell_args(s, model, text, format, threads, depth),
                        });
                    }
                }
            }
        }
    }
    let shared = s
        .models
        .iter()
        .filter_map(|m| shared_job(s, m))
        .enumerate()
        .map(|(i, mut j)| {
            j.index = i;
            j.name = format!("{i:02}-{}", slug(&model_short(&j.model)));
            j
        })
        .collect();
    Plan { cells, shared }
}

/// kwk-eval's arguments for one cell (`--depth` only for a depth other than 0, so a cell at
/// depth 0 runs the command it always did).
fn cell_args(
    s: &Sweep,
    model: &str,
    text: &Path,
    f: &SweepFormat,
    threads: usize,
    depth: usize,
) -> Vec<String> {
    let mut a = vec![
        "--llm".to_string(),
        model.to_string(),
        "--text".into(),
        text.display().to_string(),
        "--threads".into(),
        threads.to_string(),
    ];
    let reference = if s.reference { "float32" } else { "none" };
    match f {
        SweepFormat::Kwk(name) => {
            let formats = if s.reference && name != "float32" {
                format!("float32,{name}")
            } else {
                name.clone()
            };
            a.extend([
                "--formats".into(),
                formats,
                "--ladder".into(),
                "none".into(),
            ]);
        }
        SweepFormat::Ladder(ty) => {
            a.extend([
                "--formats".into(),
                reference.into(),
                "--ladder".into(),
                ty.clone(),
            ]);
        }
        SweepFormat::Gguf(p) => {
            a.extend([
                "--formats".into(),
                reference.into(),
                "--ladder".into(),
                "none".into(),
                "--gguf".into(),
                p.display().to_string(),
            ]);
        }
    }
    a.extend(protocol_args(s, s.chunks));
    if s.speed {
        if !matches!(f, SweepFormat::Kwk(_)) {
            a.push("--llama-bench".into());
        }
        a.extend(["--reps".into(), s.reps.to_string()]);
        if let Some(pp) = s.pp {
            a.extend(["--pp".into(), pp.to_string()]);
        }
        if let Some(tg) = s.tg {
            a.extend(["--tg".into(), tg.to_string()]);
        }
        if depth > 0 {
            a.extend(["--depth".into(), depth.to_string()]);
        }
    } else {
        a.push("--no-speed".into());
    }
    a
}

/// The shared job of `model`: one quality-only run of one chunk over every packed kwk
/// format and every ladder type of the sweep, which leaves the conversion, the types and
/// the packed weights in the caches. `None` when there is nothing to share (float32 and
/// GGUF files only).
fn shared_job(s: &Sweep, model: &str) -> Option<Shared> {
    let kwk: Vec<&str> = s
        .formats
        .iter()
        .filter_map(|f| match f {
            SweepFormat::Kwk(n) if n != "float32" => Some(n.as_str()),
            _ => None,
        })
        .collect();
    let ladder: Vec<&str> = s
        .formats
        .iter()
        .filter_map(|f| match f {
            SweepFormat::Ladder(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    if kwk.is_empty() && ladder.is_empty() {
        return None;
    }
    let mut makes = Vec::new();
    if !ladder.is_empty() {
        makes.push(format!(
            "llama.cpp's F32 conversion and {} into $KWK_CACHE/gguf",
            ladder.join(", ")
        ));
    }
    if !kwk.is_empty() {
        makes.push(format!(
            "kwk's {} packed into the pack cache",
            kwk.join(", ")
        ));
    }
    let mut args = vec![
        "--llm".to_string(),
        model.to_string(),
        "--text".into(),
        s.texts[0].display().to_string(),
        "--threads".into(),
        s.threads.iter().max().copied().unwrap_or(1).to_string(),
        "--formats".into(),
        if kwk.is_empty() {
            "none".into()
        } else {
            kwk.join(",")
        },
        "--ladder".into(),
        if ladder.is_empty() {
            "none".into()
        } else {
            ladder.join(",")
        },
        "--no-kld".into(),
        "--no-speed".into(),
    ];
    args.extend(protocol_args(s, 1));
    Some(Shared {
        index: 0,
        name: String::new(),
        model: model.to_string(),
        makes,
        args,
    })
}

/// `args` as one shell-quoted line (for the plan and the sbatch scripts).
pub fn shell_line(program: &str, args: &[String]) -> String {
    std::iter::once(program.to_string())
        .chain(args.iter().cloned())
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `s` quoted for a POSIX shell where needed.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=+,@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The plan as `kwk-eval sweep plan` prints it: the shared work, then one line per cell
/// with its command.
pub fn render(p: &Plan, program: &str) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} cells, {} shared job(s) (run first; the cells reuse what they make through the caches)",
        p.cells.len(),
        p.shared.len()
    );
    for j in &p.shared {
        let _ = writeln!(s, "shared {}: {}", j.name, j.makes.join("; "));
        let _ = writeln!(s, "    {}", shell_line(program, &j.args));
    }
    for c in &p.cells {
        let _ = writeln!(
            s,
            "cell {}: {} × {} × {} × {} threads × depth {}",
            c.name,
            model_short(&c.model),
            text_short(&c.text),
            c.format.label(),
            c.threads,
            c.depth
        );
        let _ = writeln!(
            s,
            "    {} --out cells/{}",
            shell_line(program, &c.args),
            c.name
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_the_product_and_share_one_job_per_model() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.txt"), "x").unwrap();
        let s = super::super::file::parse(
            &dir.path().join("s.toml"),
            "models = [\"a.gguf\", \"b\"]\ntexts = [\"t.txt\"]\nformats = [\"float32\", \"int8\", \"Q8_0\"]\nthreads = [1, 2]\nchunks = 4\nreps = 2\n",
        )
        .unwrap();
        let p = plan(&s);
        assert_eq!(p.cells.len(), 2 * 3 * 2);
        assert_eq!(p.shared.len(), 2);
        let c = &p.cells[3];
        assert_eq!(c.name, "003-a-int8-t2");
        let line = c.args.join(" ");
        assert!(
            line.contains("--formats float32,int8 --ladder none"),
            "{line}"
        );
        assert!(
            line.contains("--threads 2") && line.contains("--chunks 4"),
            "{line}"
        );
        let q = p.cells[4].args.join(" ");
        assert!(
            q.contains("--formats float32 --ladder Q8_0") && q.contains("--llama-bench"),
            "{q}"
        );
        let shared = p.shared[0].args.join(" ");
        assert!(
            shared.contains("--formats int8 --ladder Q8_0") && shared.contains("--chunks 1"),
            "{shared}"
        );
        let text = render(&p, "kwk-eval");
        assert!(text.starts_with("12 cells, 2 shared job(s)"), "{text}");
        assert_eq!(shell_quote("a b'c"), "'a b'\\''c'");
    }

    /// Depth is a real axis: one cell per depth, named `-dD` and passing `--depth D`
    /// (nothing for depth 0, whose cell runs the command it always did).
    #[test]
    fn each_depth_is_a_cell_passing_its_depth() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.txt"), "x").unwrap();
        let s = super::super::file::parse(
            &dir.path().join("s.toml"),
            "models = [\"m\"]\ntexts = [\"t.txt\"]\nformats = [\"int8\"]\ndepths = [0, 4096]\n",
        )
        .unwrap();
        let p = plan(&s);
        let names: Vec<&str> = p.cells.iter().map(|c| c.name.as_str()).collect();
        let t = crate::machine::available_threads();
        assert_eq!(
            names,
            [format!("000-m-int8-t{t}"), format!("001-m-int8-t{t}-d4096")]
        );
        assert!(!p.cells[0].args.contains(&"--depth".to_string()));
        let line = p.cells[1].args.join(" ");
        assert!(line.ends_with("--depth 4096"), "{line}");
        assert_eq!(p.cells[1].depth, 4096);
    }
}
