//! A sweep's cells and its shared work, from a checked [`Sweep`]: one cell per (model,
//! text, format, thread count, depth), each a plain kwk-eval run into its own folder
//! `cells/NNN-...` of the sweep folder; one shared job per model that makes what the
//! cells would otherwise each make (llama.cpp's F32 conversion and the ladder's types,
//! cached in `$KWK_CACHE/gguf`; kwk's packed formats, cached in the pack cache), so the
//! cells reuse it; and, when the cells compare against float32, one shared job per
//! (model, text) that computes the float32 reference once into its folder
//! (`--keep-logits`), which every cell of that model and text loads (`--reference`)
//! instead of computing it again. Nothing here runs anything: the plan is the command
//! lines.

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
    /// kwk-eval's arguments (without the program, `--reference` and `--out`).
    pub args: Vec<String>,
    /// The shared job whose folder holds the float32 reference this cell loads.
    pub reference: Option<String>,
}

/// What a shared job makes.
#[derive(Debug, Clone, PartialEq)]
pub enum SharedKind {
    /// The conversion, the ladder's types and the packed formats, into the caches.
    Caches,
    /// The float32 reference of one text, kept in its folder for the cells to load.
    Reference { text: PathBuf },
}

/// The work one model's cells share, done once before them.
#[derive(Debug, Clone, PartialEq)]
pub struct Shared {
    pub index: usize,
    pub name: String,
    pub model: String,
    pub kind: SharedKind,
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

/// The reference file a reference job leaves in its folder `dir`.
pub fn reference_file(dir: &Path) -> PathBuf {
    dir.join(crate::run_folder::REFERENCE_LOGITS)
}

/// A cell's kwk-eval arguments in the sweep folder `out`: its own, and `--reference` of
/// the shared folder holding its float32 reference.
pub fn cell_command(c: &Cell, out: &Path) -> Vec<String> {
    let mut a = c.args.clone();
    if let Some(r) = &c.reference {
        a.push("--reference".into());
        a.push(
            reference_file(&shared_dir(out).join(r))
                .display()
                .to_string(),
        );
    }
    a
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
                            reference: None,
                        });
                    }
                }
            }
        }
    }
    let mut shared: Vec<Shared> = Vec::new();
    for model in &s.models {
        if let Some(mut j) = shared_job(s, model) {
            j.index = shared.len();
            j.name = format!("{:02}-{}", j.index, slug(&model_short(model)));
            shared.push(j);
        }
        if !shares_reference(s) {
            continue;
        }
        for text in &s.texts {
            let mut j = reference_job(s, model, text);
            j.index = shared.len();
            j.name = format!(
                "{:02}-{}-{}-float32",
                j.index,
                slug(&model_short(model)),
                slug(&text_short(text))
            );
            for c in cells
                .iter_mut()
                .filter(|c| c.model == *model && c.text == *text)
            {
                c.reference = Some(j.name.clone());
            }
            shared.push(j);
        }
    }
    Plan { cells, shared }
}

/// Whether the cells compare against float32 through one shared reference per (model,
/// text): with `reference = true` (the default) and KL divergence not turned off.
fn shares_reference(s: &Sweep) -> bool {
    s.reference && !s.args.iter().any(|a| a == "--no-kld")
}

/// The reference job of `model` on `text`: float32 alone over the sweep's chunks, its
/// log-probs kept (`--keep-logits`) for the cells to load.
fn reference_job(s: &Sweep, model: &str, text: &Path) -> Shared {
    let mut args = vec![
        "--llm".to_string(),
        model.to_string(),
        "--text".into(),
        text.display().to_string(),
        "--threads".into(),
        s.threads.iter().max().copied().unwrap_or(1).to_string(),
        "--formats".into(),
        "float32".into(),
        "--ladder".into(),
        "none".into(),
        "--kld".into(),
        "--keep-logits".into(),
        "--no-speed".into(),
        "--ctx".into(),
        s.ctx.to_string(),
        "--chunks".into(),
        s.chunks.to_string(),
    ];
    args.extend(s.args.iter().cloned());
    Shared {
        index: 0,
        name: String::new(),
        model: model.to_string(),
        kind: SharedKind::Reference {
            text: text.to_path_buf(),
        },
        makes: vec![format!(
            "the float32 reference on {} ({} chunks of {}), computed once; every cell of this model and text loads it (--reference)",
            text_short(text),
            s.chunks,
            s.ctx
        )],
        args,
    }
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
    // The weights to pack: a `+kv:` row packs as its format (its cache is made at run time).
    let mut kwk: Vec<&str> = Vec::new();
    for f in &s.formats {
        if let SweepFormat::Kwk(n) = f {
            let weights = n.split_once('+').map_or(n.as_str(), |(w, _)| w);
            if weights != "float32" && !kwk.contains(&weights) {
                kwk.push(weights);
            }
        }
    }
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
        kind: SharedKind::Caches,
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
        "{} cells, {} shared job(s) (run first; the cells reuse what they make through the caches and the shared folders)",
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
        let reference = c
            .reference
            .as_ref()
            .map(|r| {
                format!(
                    " --reference {}",
                    shell_quote(
                        &reference_file(&Path::new("shared").join(r))
                            .display()
                            .to_string()
                    )
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "    {}{reference} --out cells/{}",
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
        // Per model: the caches' job and the float32 reference of the one text.
        assert_eq!(p.shared.len(), 4);
        assert_eq!(p.shared[1].name, "01-a-t-float32");
        assert_eq!(
            p.shared[3].kind,
            SharedKind::Reference {
                text: p.cells[0].text.clone()
            }
        );
        assert!(p.cells[..6]
            .iter()
            .all(|c| c.reference.as_deref() == Some("01-a-t-float32")));
        assert!(p.cells[6..]
            .iter()
            .all(|c| c.reference.as_deref() == Some("03-b-t-float32")));
        let r = p.shared[1].args.join(" ");
        assert!(
            r.contains("--formats float32 --ladder none --kld --keep-logits --no-speed --ctx 512 --chunks 4"),
            "{r}"
        );
        let full = cell_command(&p.cells[3], Path::new("/s")).join(" ");
        assert!(
            full.ends_with("--reference /s/shared/01-a-t-float32/float32-kl-divergence-base.bin"),
            "{full}"
        );
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
        assert!(text.starts_with("12 cells, 4 shared job(s)"), "{text}");
        assert!(
            text.contains("--reference shared/01-a-t-float32/float32-kl-divergence-base.bin --out cells/003-a-int8-t2"),
            "{text}"
        );
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
