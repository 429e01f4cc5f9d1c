//! llama.cpp's own converter, `convert_hf_to_gguf.py`: a Hugging Face folder to a float GGUF
//! llama.cpp's tools read, so llama.cpp's rows start from the user's checkpoint and not from
//! a file made some other way.
//!
//! Where it is found: the script in `KWK_LLAMA_CPP_SRC`, else in the source tree beside the
//! tools' build (`<src>/build/bin/../../convert_hf_to_gguf.py`, the set-up's layout:
//! `$KWK_CACHE/llama.cpp-VERSION/{src,build/bin}`). Its Python is `KWK_PYTHON`, else the
//! set-up's virtualenv (`KWK_PYTHON_VENV`, default `$KWK_CACHE/python-venv`), else `python3`
//! on PATH; it needs
//! numpy, torch, transformers and safetensors, and reads the vendored `gguf-py` (put on
//! `PYTHONPATH`), which [`Converter::locate`] checks before anything runs.

use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The script's name in llama.cpp's source tree.
pub const CONVERT_SCRIPT: &str = "convert_hf_to_gguf.py";
pub use crate::error::CONVERT_SETUP_HINT;

/// The modules the script imports at its top (or the first model class does).
const NEEDED_MODULES: &[&str] = &["numpy", "torch", "transformers", "safetensors", "gguf"];

/// A checked converter: the script and the Python that runs it.
#[derive(Debug, Clone)]
pub struct Converter {
    pub python: PathBuf,
    pub script: PathBuf,
    /// `PYTHONPATH` for the script: the source tree's `gguf-py` first.
    pub python_path: OsString,
}

/// Where to look (the environment, read once by the caller).
#[derive(Debug, Clone, Default)]
pub struct ConverterSearch {
    /// `KWK_LLAMA_CPP_SRC`.
    pub src_env: Option<PathBuf>,
    /// `KWK_PYTHON`.
    pub python_env: Option<PathBuf>,
    /// `KWK_PYTHON_VENV` (the set-up's virtualenv when moved).
    pub venv_env: Option<PathBuf>,
    /// The folder llama.cpp's tools were found in.
    pub bin_dir: Option<PathBuf>,
    /// The kwk cache root.
    pub cache_root: Option<PathBuf>,
    /// `PATH`.
    pub path: Option<OsString>,
}

impl ConverterSearch {
    pub fn from_env(bin_dir: Option<&Path>) -> ConverterSearch {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        ConverterSearch {
            src_env: var("KWK_LLAMA_CPP_SRC").map(PathBuf::from),
            python_env: var("KWK_PYTHON").map(PathBuf::from),
            venv_env: var("KWK_PYTHON_VENV").map(PathBuf::from),
            bin_dir: bin_dir.map(Path::to_path_buf),
            cache_root: crate::tools::Search::from_env(None).cache_root,
            path: var("PATH"),
        }
    }

    /// The script: `KWK_LLAMA_CPP_SRC`'s, or the one two folders above the tools.
    fn script(&self) -> std::result::Result<PathBuf, String> {
        let mut looked = Vec::new();
        let candidates = [
            self.src_env.clone(),
            self.bin_dir
                .as_deref()
                .and_then(|b| b.parent()?.parent().map(|p| p.join("src"))),
            self.bin_dir
                .as_deref()
                .and_then(|b| b.parent()?.parent().map(Path::to_path_buf)),
        ];
        for dir in candidates.into_iter().flatten() {
            let p = dir.join(CONVERT_SCRIPT);
            if p.is_file() {
                return Ok(p);
            }
            looked.push(p.display().to_string());
            if self.src_env.as_deref() == Some(dir.as_path()) {
                break;
            }
        }
        Err(looked.join(", "))
    }

    /// The Python: `KWK_PYTHON`, the set-up's virtualenv, or `python3` on PATH.
    fn python(&self) -> std::result::Result<PathBuf, String> {
        if let Some(p) = &self.python_env {
            if p.is_file() {
                return Ok(p.clone());
            }
            return Err(format!("KWK_PYTHON={} (no such file)", p.display()));
        }
        let mut looked = Vec::new();
        let venv = self
            .venv_env
            .clone()
            .or_else(|| self.cache_root.as_ref().map(|r| r.join("python-venv")));
        if let Some(venv) = venv {
            let p = venv.join("bin/python");
            if p.is_file() {
                return Ok(p);
            }
            looked.push(p.display().to_string());
        }
        if let Some(path) = &self.path {
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
            if let Ok(p) = which::which_in("python3", Some(path), cwd) {
                return Ok(p);
            }
        }
        looked.push("python3 on PATH".to_string());
        Err(looked.join(", "))
    }
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

impl Converter {
    /// Finds the script and a Python that imports what it needs.
    pub fn locate(search: &ConverterSearch) -> Result<Converter> {
        let script = search.script().map_err(|looked| Error::ConverterNotFound {
            what: format!("the script {CONVERT_SCRIPT}"),
            searched: vec![looked],
        })?;
        let python = search.python().map_err(|looked| Error::ConverterNotFound {
            what: "a Python".to_string(),
            searched: vec![looked],
        })?;
        let src = script.parent().unwrap_or(Path::new("."));
        let mut paths = vec![src.join("gguf-py")];
        if let Some(old) = std::env::var_os("PYTHONPATH") {
            paths.extend(std::env::split_paths(&old));
        }
        let python_path = std::env::join_paths(paths).map_err(|e| {
            Error::InvalidSettings(format!("PYTHONPATH cannot hold {}: {e}", src.display()))
        })?;
        let conv = Converter {
            python,
            script,
            python_path,
        };
        conv.check_modules(NEEDED_MODULES)?;
        Ok(conv)
    }

    fn command(&self, timeout: Duration, hint: &str) -> ToolCommand {
        let mut cmd = ToolCommand::new(CONVERT_SCRIPT, &self.python, timeout, hint);
        cmd.env
            .push(("PYTHONPATH".into(), self.python_path.clone()));
        cmd.env.push(("PYTHONUNBUFFERED".into(), "1".into()));
        cmd
    }

    /// Imports each module the script needs; a missing one is named with the fix.
    fn check_modules(&self, modules: &[&str]) -> Result<()> {
        let mut cmd = self.command(PROBE_TIMEOUT, CONVERT_SETUP_HINT);
        let probe = format!(
            "import importlib.util, sys\nmissing = [m for m in {:?} if importlib.util.find_spec(m) is None]\nprint('missing:', ' '.join(missing))",
            modules
        );
        cmd.arg("-c").arg(probe);
        let out = process::run(&cmd, |_, _| {})?;
        let missing = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("missing:"))
            .map(|m| m.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .ok_or_else(|| Error::BadOutput {
                tool: CONVERT_SCRIPT.to_string(),
                what: format!("{} did not run the module probe", self.python.display()),
                command: out.command.clone(),
                stderr_tail: out.stderr_tail(),
                hint: CONVERT_SETUP_HINT.to_string(),
            })?;
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::ConverterNotFound {
            what: format!("the Python modules {}", missing.join(", ")),
            searched: vec![format!("{} (it lacks them)", self.python.display())],
        })
    }

    /// The bytes of the script, for a cache key (a changed converter makes new files).
    pub fn script_bytes(&self) -> Result<Vec<u8>> {
        std::fs::read(&self.script).map_err(|source| Error::Io {
            path: self.script.clone(),
            source,
        })
    }
}

/// Convert the Hugging Face folder `model` to `output` with tensors of `outtype` (`f32`,
/// `bf16`, `f16`).
#[derive(Debug, Clone)]
pub struct ConvertRequest {
    pub model: PathBuf,
    pub output: PathBuf,
    pub outtype: String,
    pub timeout: Duration,
}

/// A finished conversion.
#[derive(Debug, Clone)]
pub struct ConvertRun {
    pub text: String,
    pub command: String,
    pub elapsed: Duration,
}

/// Runs the converter; the output exists when this returns `Ok`.
pub fn run_convert(conv: &Converter, req: &ConvertRequest) -> Result<ConvertRun> {
    let mut cmd = conv.command(
        req.timeout,
        "check the folder is a Hugging Face model llama.cpp's converter supports (config.json, \
         *.safetensors, tokenizer.json)",
    );
    cmd.arg(&conv.script)
        .arg(&req.model)
        .arg("--outfile")
        .arg(&req.output)
        .arg("--outtype")
        .arg(&req.outtype);
    let out = process::run(&cmd, |_, _| {})?;
    if !req.output.is_file() {
        return Err(Error::BadOutput {
            tool: CONVERT_SCRIPT.to_string(),
            what: format!("it exited 0 but wrote no '{}'", req.output.display()),
            command: out.command.clone(),
            stderr_tail: out.stderr_tail(),
            hint: "check the model folder".to_string(),
        });
    }
    Ok(ConvertRun {
        text: format!("{}\n{}", out.stdout, out.stderr),
        command: out.command,
        elapsed: out.elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_found_beside_the_setup_build_or_in_the_named_source() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("llama.cpp-0.3.36");
        std::fs::create_dir_all(root.join("build/bin")).unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src").join(CONVERT_SCRIPT), "").unwrap();
        let s = ConverterSearch {
            bin_dir: Some(root.join("build/bin")),
            ..Default::default()
        };
        assert_eq!(s.script().unwrap(), root.join("src").join(CONVERT_SCRIPT));
        let other = tmp.path().join("mine");
        std::fs::create_dir_all(&other).unwrap();
        let named = ConverterSearch {
            src_env: Some(other.clone()),
            ..s.clone()
        };
        // A named source without the script is an error naming it, not a silent fallback.
        let e = named.script().unwrap_err();
        assert!(
            e.contains(&other.join(CONVERT_SCRIPT).display().to_string()),
            "{e}"
        );
        let none = ConverterSearch::default();
        assert!(none.script().is_err());
    }

    #[test]
    fn a_python_without_the_modules_is_named_with_the_fix() {
        let Ok(py) = which::which("python3") else {
            return; // no Python on this machine: nothing to probe
        };
        let conv = Converter {
            python: py,
            script: PathBuf::from("/nonexistent/convert_hf_to_gguf.py"),
            python_path: OsString::from("/nonexistent"),
        };
        conv.check_modules(&["sys", "json"]).unwrap();
        let msg = conv
            .check_modules(&["sys", "kwk_no_such_module_x"])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("the Python modules kwk_no_such_module_x not found"),
            "{msg}"
        );
        assert!(msg.contains("setup-convert.sh"), "{msg}");
    }
}
