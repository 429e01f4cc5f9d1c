//! Which llama.cpp a set of tools is: mainline llama.cpp, or its fork ik_llama.cpp (issue
//! 40). Both ship tools of the same names taking the same requests, so this crate treats the
//! fork as a dialect: the same request types, and one parser or flag list per difference
//! ([`crate::ik`] holds the fork's side).
//!
//! The two are told apart by what the tools print, never by where they are:
//! - `--version`: current mainline prints `version: 0.5.0-dev (build N, commit C)`; the fork
//!   prints the older form `version: N (C)`, as mainline did before late 2025, so the form
//!   alone cannot tell the fork from an old mainline;
//! - llama-perplexity's `--help`: the fork lists options mainline never had
//!   ([`IK_ONLY_OPTIONS`]: run-time repacking, MLA, fused MoE). One of them makes it the fork.

/// An engine whose tools this crate runs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum Engine {
    /// Mainline llama.cpp (github.com/ggml-org/llama.cpp), the default.
    #[default]
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// ik_llama.cpp (github.com/ikawrakow/ik_llama.cpp), the fork with run-time repacking
    /// and its own quant types.
    #[serde(rename = "ik")]
    Ik,
}

/// Options in ik_llama.cpp's common `--help` that mainline llama.cpp does not have.
pub const IK_ONLY_OPTIONS: &[&str] = &["--run-time-repack", "--mla-use", "--fused-moe"];

impl Engine {
    /// The short name rows and `--peer` use: `llama.cpp`, `ik`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llama.cpp",
            Engine::Ik => "ik",
        }
    }

    /// The project's own name, for messages: `llama.cpp`, `ik_llama.cpp`.
    pub fn project(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llama.cpp",
            Engine::Ik => "ik_llama.cpp",
        }
    }

    /// The set-up script that builds this engine's tools.
    pub fn setup_script(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "scripts/setup-llama-cpp.sh",
            Engine::Ik => "scripts/setup-ik-llama-cpp.sh",
        }
    }

    /// The environment variable naming the folder of this engine's tools.
    pub fn dir_env(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "KWK_LLAMA_CPP_DIR",
            Engine::Ik => "KWK_IK_LLAMA_CPP_DIR",
        }
    }

    /// kwk-eval's flag naming that folder.
    pub fn dir_flag(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "--llama-cpp-dir",
            Engine::Ik => "--ik-llama-cpp-dir",
        }
    }

    /// The prefix of the set-up script's folders under the kwk cache
    /// (`<prefix><version>/build/bin`).
    pub fn cache_prefix(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llama.cpp-",
            Engine::Ik => "ik_llama.cpp-",
        }
    }

    /// How a user gets this engine's tools; the fix in every "not found", "too old" and
    /// "wrong engine" error.
    pub fn setup_hint(self) -> String {
        format!(
            "build them with `{}` (it prints the bin directory) and pass that directory with \
             `{} DIR` or set {}=DIR",
            self.setup_script(),
            self.dir_flag(),
            self.dir_env()
        )
    }

    /// The engine whose llama-perplexity printed `help` for `--help` (see the module docs).
    pub fn identify(help: &str) -> Engine {
        if IK_ONLY_OPTIONS.iter().any(|o| help.contains(o)) {
            Engine::Ik
        } else {
            Engine::LlamaCpp
        }
    }

    /// Parses a `--peer` entry: `llama.cpp` (or `llamacpp`, `mainline`) and `ik` (or
    /// `ik_llama.cpp`, `ik-llama.cpp`).
    pub fn parse(s: &str) -> Result<Engine, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "llama.cpp" | "llamacpp" | "mainline" => Ok(Engine::LlamaCpp),
            "ik" | "ik_llama.cpp" | "ik-llama.cpp" => Ok(Engine::Ik),
            "" => Err("an empty engine name; separate engines with single commas".to_string()),
            other => Err(format!(
                "unknown engine '{other}'; the engines are llama.cpp and ik (ik_llama.cpp)"
            )),
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for e in [Engine::LlamaCpp, Engine::Ik] {
            assert_eq!(Engine::parse(e.as_str()), Ok(e));
            assert_eq!(Engine::parse(e.project()), Ok(e));
        }
        assert!(Engine::parse("vllm")
            .unwrap_err()
            .contains("llama.cpp and ik"));
        assert!(Engine::parse(" ").unwrap_err().contains("empty"));
    }

    #[test]
    fn hints_name_the_engines_script_flag_and_variable() {
        let h = Engine::Ik.setup_hint();
        assert!(h.contains("scripts/setup-ik-llama-cpp.sh"), "{h}");
        assert!(h.contains("--ik-llama-cpp-dir DIR"), "{h}");
        assert!(h.contains("KWK_IK_LLAMA_CPP_DIR=DIR"), "{h}");
    }
}
