//! Finding llama.cpp's tools, or ik_llama.cpp's ([`Engine`]), and checking they are the
//! engine asked for and new enough.
//!
//! Search order: the directory given by the caller (`--llama-cpp-dir`, or
//! `--ik-llama-cpp-dir` for ik_llama.cpp), then the directory in `KWK_LLAMA_CPP_DIR`
//! (`KWK_IK_LLAMA_CPP_DIR`), then `PATH` (via `which`), then the build that
//! `scripts/setup-llama-cpp.sh` (`scripts/setup-ik-llama-cpp.sh`) leaves under the user's
//! cache (`${KWK_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwk}/llama.cpp-*/build/bin`,
//! `ik_llama.cpp-*/build/bin`). An explicit directory (flag or variable) is authoritative:
//! when it lacks a tool, or holds the other engine's tools, that is an error, not a silent
//! fall-through to another build. On `PATH` and in the cache, the other engine's tools (the
//! two have the same file names) are passed over and named among the places searched.
//!
//! Which engine a build is comes from its own output, never its path: llama-perplexity's
//! `--help` ([`Engine::identify`]), with the `--version` line kept for the report.
//!
//! "Too old" is decided from each tool's `--help`: every flag this crate passes must be
//! listed there, in the syntax we pass it. Build numbers cannot decide it on their own,
//! because a build from a source archive (as `scripts/setup-llama-cpp.sh` makes, from the
//! llama-cpp-python sdist) reports `build 0, commit unknown`. The newest requirement is
//! llama-perplexity's `-fa on|off|auto` (before it `-fa` was a bare switch); llama.cpp
//! switched between b6300 and b6343 (WasmEdge's bump to b6343 notes "the type of flash
//! attention is changed from bool to string"), so [`MIN_BUILD_NUMBER`] is b6343; when a
//! build reports a plausible number, one below that is rejected too.
//!
//! A build number is the count of commits in the checkout it was built from, so a shallow
//! clone (`git clone --depth 1`) reports `build 1` however new it is. A number below
//! [`PLAUSIBLE_BUILD_FLOOR`] (llama.cpp passed 1000 commits in August 2023, long before
//! any build whose flags kwk could use) is therefore not evidence of age: such a build is
//! judged by its `--help` alone ([`LlamaCppTools::judged_by`] says which way it was).

pub use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::process::{self, ToolCommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The oldest llama.cpp build whose tools accept every flag this crate passes (see the
/// module docs for how it was chosen); defined beside the error that names it.
pub use crate::error::MIN_BUILD_NUMBER;

/// Build numbers below this come from shallow clones, not from old trees (see the module
/// docs): they neither date a build nor refuse it.
pub const PLAUSIBLE_BUILD_FLOOR: u64 = 1000;

pub const PERPLEXITY: &str = "llama-perplexity";
pub const BENCH: &str = "llama-bench";
pub const QUANTIZE: &str = "llama-quantize";
pub const TOKENIZE: &str = "llama-tokenize";
pub const IMATRIX: &str = "llama-imatrix";

/// The environment variable naming the directory of llama.cpp's tools
/// (`Engine::Ik.dir_env()` names ik_llama.cpp's).
pub const DIR_ENV: &str = "KWK_LLAMA_CPP_DIR";

const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Substrings each tool's `--help` must contain, with what they stand for (mainline
/// llama.cpp's; ik_llama.cpp's are in [`crate::ik`]).
const PERPLEXITY_NEEDS: &[(&str, &str)] = &[
    ("--flash-attn [on|off|auto]", "`-fa on|off`"),
    ("--chunks", "`--chunks`"),
    ("--kl-divergence-base", "`--kl-divergence-base`"),
    ("--kl-divergence ", "`--kl-divergence`"),
    ("--cache-type-k", "`-ctk`"),
    ("--cache-type-v", "`-ctv`"),
    ("--ubatch-size", "`-ub`"),
    ("--threads-batch", "`-tb`"),
    ("--n-gpu-layers", "`-ngl`"),
];
const BENCH_NEEDS: &[(&str, &str)] = &[
    ("json", "`-o json`"),
    ("--flash-attn", "`-fa`"),
    ("--cache-type-k", "`-ctk`"),
    ("--cache-type-v", "`-ctv`"),
    ("--repetitions", "`-r`"),
    ("--n-gpu-layers", "`-ngl`"),
    ("--ubatch-size", "`-ub`"),
];
const TOKENIZE_NEEDS: &[(&str, &str)] = &[
    ("--ids", "`--ids`"),
    ("--no-parse-special", "`--no-parse-special`"),
    ("--no-escape", "`--no-escape`"),
];

/// The build a tool reports with `--version`: `version: 0.5.0-dev (build 0, commit
/// unknown)` in current trees (common/build-info.cpp.in), `version: 4585 (cae9fb43)` in
/// older ones.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BuildInfo {
    /// Semantic version when printed (`0.5.0-dev`).
    pub version: Option<String>,
    /// `None` when unknown: builds outside a git checkout print `build 0`.
    pub build_number: Option<u64>,
    /// `None` when unknown (`commit unknown`).
    pub build_commit: Option<String>,
    /// The first line as printed.
    pub raw: String,
}

impl BuildInfo {
    /// Parses `--version` output (stderr). Returns `None` when there is no `version:` line.
    pub fn parse(text: &str) -> Option<BuildInfo> {
        let new =
            regex::Regex::new(r"(?m)^version: (\S+) \(build (\d+), commit ([0-9A-Za-z_.-]+)\)")
                .expect("static regex");
        let old =
            regex::Regex::new(r"(?m)^version: (\d+) \(([0-9A-Za-z_.-]+)\)").expect("static regex");
        let known_commit = |c: &str| (c != "unknown").then(|| c.to_string());
        if let Some(c) = new.captures(text) {
            let number: u64 = c[2].parse().ok()?;
            return Some(BuildInfo {
                version: Some(c[1].to_string()),
                build_number: (number != 0).then_some(number),
                build_commit: known_commit(&c[3]),
                raw: c[0].to_string(),
            });
        }
        if let Some(c) = old.captures(text) {
            let number: u64 = c[1].parse().ok()?;
            return Some(BuildInfo {
                version: None,
                build_number: (number != 0).then_some(number),
                build_commit: known_commit(&c[2]),
                raw: c[0].to_string(),
            });
        }
        None
    }

    /// The build number when it can date the build: reported, and at least
    /// [`PLAUSIBLE_BUILD_FLOOR`].
    pub fn plausible_build_number(&self) -> Option<u64> {
        self.build_number.filter(|&n| n >= PLAUSIBLE_BUILD_FLOOR)
    }

    /// How a build that passed was judged new enough: `build number and --help flags`, or
    /// `--help flags (build number 1 not plausible)` / `--help flags (no build number)`.
    pub fn judged_by(&self) -> String {
        match (self.build_number, self.plausible_build_number()) {
            (_, Some(_)) => "build number and --help flags".to_string(),
            (Some(n), None) => format!("--help flags (build number {n} not plausible)"),
            (None, _) => "--help flags (no build number)".to_string(),
        }
    }
}

/// Where to look for the tools. [`Search::from_env`] reads the process environment; tests
/// build one by hand.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// The engine looked for (llama.cpp by default).
    pub engine: Engine,
    /// `--llama-cpp-dir` (`--ik-llama-cpp-dir`).
    pub dir: Option<PathBuf>,
    /// The value of `KWK_LLAMA_CPP_DIR` (`KWK_IK_LLAMA_CPP_DIR`).
    pub env_dir: Option<PathBuf>,
    /// The value of `PATH`.
    pub path: Option<OsString>,
    /// The kwk cache root (`${KWK_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwk}`).
    pub cache_root: Option<PathBuf>,
}

impl Search {
    /// Mainline llama.cpp's search from the process environment.
    pub fn from_env(dir: Option<&Path>) -> Search {
        Self::from_env_for(Engine::LlamaCpp, dir)
    }

    /// `engine`'s search from the process environment (`dir` is its `--...-dir` flag).
    pub fn from_env_for(engine: Engine, dir: Option<&Path>) -> Search {
        let non_empty = |v: Option<OsString>| v.filter(|v| !v.is_empty());
        let cache_root = non_empty(std::env::var_os("KWK_CACHE"))
            .map(PathBuf::from)
            .or_else(|| {
                non_empty(std::env::var_os("XDG_CACHE_HOME")).map(|x| PathBuf::from(x).join("kwk"))
            })
            .or_else(|| {
                non_empty(std::env::var_os("HOME")).map(|h| PathBuf::from(h).join(".cache/kwk"))
            });
        Search {
            engine,
            dir: dir.map(Path::to_path_buf),
            env_dir: non_empty(std::env::var_os(engine.dir_env())).map(PathBuf::from),
            path: non_empty(std::env::var_os("PATH")),
            cache_root,
        }
    }
}

/// llama.cpp's command-line tools, found and checked.
#[derive(Debug, Clone)]
pub struct LlamaCppTools {
    engine: Engine,
    perplexity: PathBuf,
    bench: PathBuf,
    quantize: Option<PathBuf>,
    tokenize: Option<PathBuf>,
    imatrix: Option<PathBuf>,
    build: BuildInfo,
    source: String,
    notes: Vec<String>,
    /// Whether llama-bench takes `-d` / `--n-depth` (a prefill before each test): mainline's
    /// does; ik_llama.cpp 0.1.5's does not (its `--help` lists no depth).
    bench_depth: bool,
}

fn is_executable(p: &Path) -> bool {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                m.permissions().mode() & 0o111 != 0
            }
            #[cfg(not(unix))]
            {
                true
            }
        }
        _ => false,
    }
}

/// The tools in one directory, if the required two are there.
struct Found {
    perplexity: PathBuf,
    bench: PathBuf,
    quantize: Option<PathBuf>,
    tokenize: Option<PathBuf>,
    imatrix: Option<PathBuf>,
    source: String,
}

fn in_dir(dir: &Path, source: String, searched: &mut Vec<String>) -> Option<Found> {
    let tool = |name: &str| {
        let p = dir.join(name);
        is_executable(&p).then_some(p)
    };
    let what = if dir.is_dir() {
        format!("{source} ({})", dir.display())
    } else {
        format!("{source} ({}: no such directory)", dir.display())
    };
    searched.push(what);
    Some(Found {
        perplexity: tool(PERPLEXITY)?,
        bench: tool(BENCH)?,
        quantize: tool(QUANTIZE),
        tokenize: tool(TOKENIZE),
        imatrix: tool(IMATRIX),
        source,
    })
}

fn missing_required(dir: &Path) -> &'static str {
    if !is_executable(&dir.join(PERPLEXITY)) {
        PERPLEXITY
    } else {
        BENCH
    }
}

/// `llama.cpp-*/build/bin` (`ik_llama.cpp-*/build/bin`) directories under the cache root
/// with a finished build, newest version last.
fn cache_bins(cache_root: &Path, engine: Engine) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(cache_root) else {
        return Vec::new();
    };
    let mut dirs: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix(engine.cache_prefix())?;
            let key: Vec<u64> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
            let root = e.path();
            root.join(".build-complete")
                .is_file()
                .then(|| (key, root.join("build/bin")))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().map(|(_, p)| p).collect()
}

impl LlamaCppTools {
    /// Finds the tools (`dir` is `--llama-cpp-dir`), then checks their version and flags.
    pub fn locate(dir: Option<&Path>) -> Result<LlamaCppTools> {
        Self::locate_in(&Search::from_env(dir))
    }

    /// [`LlamaCppTools::locate`] for `engine` (`dir` is its `--...-dir` flag).
    pub fn locate_engine(engine: Engine, dir: Option<&Path>) -> Result<LlamaCppTools> {
        Self::locate_in(&Search::from_env_for(engine, dir))
    }

    /// [`LlamaCppTools::locate`] with an explicit search.
    pub fn locate_in(search: &Search) -> Result<LlamaCppTools> {
        let found = Self::find(search)?;
        Self::check(found, search.engine)
    }

    fn find(search: &Search) -> Result<Found> {
        let engine = search.engine;
        let mut searched = Vec::new();
        for (dir, source) in [
            (&search.dir, engine.dir_flag()),
            (&search.env_dir, engine.dir_env()),
        ] {
            if let Some(dir) = dir {
                return in_dir(dir, source.to_string(), &mut searched).ok_or_else(|| {
                    Error::ToolNotFound {
                        engine,
                        tool: missing_required(dir),
                        searched,
                    }
                });
            }
        }
        // Elsewhere the other engine's tools, which have the same names, are passed over.
        let other_engine =
            |perplexity: &Path| identify(perplexity, engine).is_ok_and(|found| found != engine);
        if let Some(path) = &search.path {
            searched.push("PATH".to_string());
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
            let which = |name: &str| which::which_in(name, Some(path), &cwd).ok();
            if let (Some(perplexity), Some(bench)) = (which(PERPLEXITY), which(BENCH)) {
                if other_engine(&perplexity) {
                    searched.pop();
                    searched.push(format!(
                        "PATH ({}: not {})",
                        perplexity.display(),
                        engine.project()
                    ));
                } else {
                    return Ok(Found {
                        perplexity,
                        bench,
                        quantize: which(QUANTIZE),
                        tokenize: which(TOKENIZE),
                        imatrix: which(IMATRIX),
                        source: "PATH".to_string(),
                    });
                }
            }
        }
        if let Some(root) = &search.cache_root {
            let bins = cache_bins(root, engine);
            if bins.is_empty() {
                searched.push(format!(
                    "the setup script's cache ({}/{}*/build/bin: none built)",
                    root.display(),
                    engine.cache_prefix()
                ));
            }
            for bin in bins.iter().rev() {
                if let Some(f) = in_dir(bin, "the setup script's cache".to_string(), &mut searched)
                {
                    if !other_engine(&f.perplexity) {
                        return Ok(f);
                    }
                    if let Some(last) = searched.last_mut() {
                        last.push_str(&format!(": not {}", engine.project()));
                    }
                }
            }
        }
        Err(Error::ToolNotFound {
            engine,
            tool: PERPLEXITY,
            searched,
        })
    }

    fn check(found: Found, engine: Engine) -> Result<LlamaCppTools> {
        let build = probe_version(&found.perplexity, engine)?;
        let found_engine = identify(&found.perplexity, engine)?;
        if found_engine != engine {
            return Err(Error::WrongEngine {
                path: found.perplexity.clone(),
                wanted: engine,
                found: found_engine,
                version: build.raw.clone(),
            });
        }
        let mut notes = Vec::new();
        // Build numbers count each project's own commits: only mainline's date a build.
        if let (Engine::LlamaCpp, Some(n)) = (engine, build.plausible_build_number()) {
            if n < MIN_BUILD_NUMBER {
                return Err(Error::ToolTooOld {
                    engine,
                    path: found.perplexity.clone(),
                    missing: vec![format!("build number {n} < {MIN_BUILD_NUMBER}")],
                    version: build.raw.clone(),
                });
            }
        }
        let needs = Needs::of(engine);
        require_flags(&found.perplexity, needs.perplexity, &build, engine)?;
        let bench_help = require_flags(&found.bench, needs.bench, &build, engine)?;
        let tokenize = match found.tokenize {
            Some(t) => match require_flags(&t, needs.tokenize, &build, engine) {
                Ok(_) => Some(t),
                Err(e) => {
                    notes.push(format!(
                        "{TOKENIZE} unusable, token ids will not be compared: {e}"
                    ));
                    None
                }
            },
            None => {
                notes.push(format!(
                    "{TOKENIZE} not found beside {}: token ids will not be compared",
                    found.perplexity.display()
                ));
                None
            }
        };
        if found.quantize.is_none() {
            notes.push(format!(
                "{QUANTIZE} not found beside {}: GGUFs cannot be made here",
                found.perplexity.display()
            ));
        }
        Ok(LlamaCppTools {
            engine,
            perplexity: found.perplexity,
            bench: found.bench,
            quantize: found.quantize,
            tokenize,
            imatrix: found.imatrix,
            build,
            source: found.source,
            notes,
            bench_depth: bench_help.contains(BENCH_DEPTH_FLAG),
        })
    }

    /// Whether this llama-bench takes `-d` (speed after a prefill of D tokens; issue 39).
    pub fn bench_knows_depth(&self) -> bool {
        self.bench_depth
    }

    /// The engine these tools are (checked from their own `--help`).
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// A tool's name in messages: `llama-perplexity` for llama.cpp's,
    /// `ik_llama.cpp's llama-perplexity` for the fork's, so every error says which engine.
    pub fn tool_label(&self, tool: &str) -> String {
        tool_label(self.engine, tool)
    }

    pub fn perplexity_path(&self) -> &Path {
        &self.perplexity
    }
    pub fn bench_path(&self) -> &Path {
        &self.bench
    }
    pub fn quantize_path(&self) -> Option<&Path> {
        self.quantize.as_deref()
    }
    pub fn tokenize_path(&self) -> Option<&Path> {
        self.tokenize.as_deref()
    }
    pub fn imatrix_path(&self) -> Option<&Path> {
        self.imatrix.as_deref()
    }
    /// The directory the tools were found in (llama-perplexity's).
    pub fn bin_dir(&self) -> Option<&Path> {
        self.perplexity.parent()
    }
    /// The build number llama-perplexity reports; `None` when it reports `build 0`
    /// (a build outside a git checkout, such as the sdist build of the setup script). It
    /// may be implausibly small (a shallow clone's `build 1`): see
    /// [`BuildInfo::plausible_build_number`].
    pub fn build_number(&self) -> Option<u64> {
        self.build.build_number
    }
    /// How the tools were judged new enough ([`BuildInfo::judged_by`]).
    pub fn judged_by(&self) -> String {
        self.build.judged_by()
    }
    /// The commit llama-perplexity reports; `None` for `commit unknown`.
    pub fn build_commit(&self) -> Option<&str> {
        self.build.build_commit.as_deref()
    }
    pub fn build(&self) -> &BuildInfo {
        &self.build
    }
    /// Where the tools were found: `--llama-cpp-dir`, `KWK_LLAMA_CPP_DIR`, `PATH` or the
    /// setup script's cache.
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Optional tools that are missing or unusable, one sentence each.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
}

/// `tool` as messages name it for `engine` ([`LlamaCppTools::tool_label`]).
pub fn tool_label(engine: Engine, tool: &str) -> String {
    match engine {
        Engine::LlamaCpp => tool.to_string(),
        Engine::Ik => format!("{}'s {tool}", engine.project()),
    }
}

/// The `--help` substrings each tool of an engine must list.
struct Needs {
    perplexity: &'static [(&'static str, &'static str)],
    bench: &'static [(&'static str, &'static str)],
    tokenize: &'static [(&'static str, &'static str)],
}

impl Needs {
    fn of(engine: Engine) -> Needs {
        match engine {
            Engine::LlamaCpp => Needs {
                perplexity: PERPLEXITY_NEEDS,
                bench: BENCH_NEEDS,
                tokenize: TOKENIZE_NEEDS,
            },
            Engine::Ik => Needs {
                perplexity: crate::ik::PERPLEXITY_NEEDS,
                bench: crate::ik::BENCH_NEEDS,
                tokenize: crate::ik::TOKENIZE_NEEDS,
            },
        }
    }
}

fn probe_version(tool: &Path, engine: Engine) -> Result<BuildInfo> {
    let hint = format!("the binary does not run; {}", engine.setup_hint());
    let mut cmd = ToolCommand::new(PERPLEXITY, tool, PROBE_TIMEOUT, &hint);
    cmd.arg("--version");
    let out = process::run(&cmd, |_, _| {})?;
    let text = format!("{}\n{}", out.stderr, out.stdout);
    BuildInfo::parse(&text).ok_or_else(|| Error::BadOutput {
        tool: PERPLEXITY.to_string(),
        what: format!(
            "`--version` printed no `version: ...` line; is this {}?",
            engine.project()
        ),
        command: out.command.clone(),
        stderr_tail: out.stderr_tail(),
        hint: engine.setup_hint(),
    })
}

/// `tool --help`, stdout and stderr. ik_llama.cpp's llama-perplexity exits 1 after printing
/// its usage (common.cpp's `gpt_params_parse` returns false for `--help`), so a failed exit
/// with a usage printed is its answer; one that printed nothing is the error it is.
fn help_text(tool: &Path, engine: Engine) -> Result<String> {
    let name = tool
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut cmd = ToolCommand::new(&name, tool, PROBE_TIMEOUT, &engine.setup_hint());
    cmd.arg("--help");
    let mut printed = String::new();
    match process::run(&cmd, |o, e| printed = format!("{o}\n{e}")) {
        Ok(out) => Ok(format!("{}\n{}", out.stdout, out.stderr)),
        Err(Error::Failed { .. }) if printed.contains("usage") => Ok(printed),
        Err(e) => Err(e),
    }
}

/// The engine llama-perplexity at `perplexity` is, from its `--help` (`wanted` names the
/// set-up in messages should it not run).
fn identify(perplexity: &Path, wanted: Engine) -> Result<Engine> {
    Ok(Engine::identify(&help_text(perplexity, wanted)?))
}

/// What llama-bench's `--help` lists when it takes `-d` (mainline: `-d, --n-depth <n>`).
pub const BENCH_DEPTH_FLAG: &str = "--n-depth";

/// Checks that `tool --help` lists every flag in `needs`; the help text.
fn require_flags(
    tool: &Path,
    needs: &[(&str, &str)],
    build: &BuildInfo,
    engine: Engine,
) -> Result<String> {
    let help = help_text(tool, engine)?;
    let missing = missing_flags(&help, needs);
    if missing.is_empty() {
        Ok(help)
    } else {
        Err(Error::ToolTooOld {
            engine,
            path: tool.to_path_buf(),
            missing,
            version: build.raw.clone(),
        })
    }
}

/// The descriptions of the `needs` entries whose substring is not in `help`.
pub fn missing_flags(help: &str, needs: &[(&str, &str)]) -> Vec<String> {
    needs
        .iter()
        .filter(|(needle, _)| !help.contains(needle))
        .map(|(_, what)| what.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_current_version_line() {
        let b = BuildInfo::parse(
            "version: 0.5.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64\n",
        )
        .unwrap();
        assert_eq!(b.version.as_deref(), Some("0.5.0-dev"));
        assert_eq!(b.build_number, None);
        assert_eq!(b.build_commit, None);
        assert_eq!(b.raw, "version: 0.5.0-dev (build 0, commit unknown)");
        let b = BuildInfo::parse("version: 0.9.1 (build 7001, commit 0c1e570)\n").unwrap();
        assert_eq!(b.build_number, Some(7001));
        assert_eq!(b.build_commit.as_deref(), Some("0c1e570"));
    }

    #[test]
    fn parses_old_version_line() {
        let b = BuildInfo::parse("version: 4585 (cae9fb43)\nbuilt with cc\n").unwrap();
        assert_eq!(b.version, None);
        assert_eq!(b.build_number, Some(4585));
        assert_eq!(b.build_commit.as_deref(), Some("cae9fb43"));
        assert_eq!(BuildInfo::parse("llama-quantize usage: ..."), None);
    }

    #[test]
    fn flags_missing_from_help_are_listed() {
        let old = "-fa,   --flash-attn                     enable Flash Attention\n--chunks N\n";
        let m = missing_flags(old, PERPLEXITY_NEEDS);
        assert!(m.contains(&"`-fa on|off`".to_string()), "{m:?}");
        assert!(m.contains(&"`--kl-divergence-base`".to_string()));
        assert!(!m.contains(&"`--chunks`".to_string()));
    }
}
