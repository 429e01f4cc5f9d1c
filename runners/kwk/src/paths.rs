//! Where kwk's files live: one rule for the set-up scripts, the tests and the binaries
//! (docs/paths.md). The cache root is `$KWK_CACHE`, else `$XDG_CACHE_HOME/kwk`, else
//! `$HOME/.cache/kwk`; the models folder is `$KWK_MODELS_DIR`, else `ROOT/models`; the pack
//! cache is `ROOT/pack`. An empty variable counts as unset, as `${VAR:-...}` in the scripts.
//! The functions take the variables as a [`CacheEnv`] value (tests pass their own; no test
//! has to set the process environment).

use std::ffi::OsString;
use std::path::PathBuf;

/// The environment variables the rule reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheEnv {
    pub kwk_models_dir: Option<OsString>,
    pub kwk_cache: Option<OsString>,
    pub xdg_cache_home: Option<OsString>,
    pub home: Option<OsString>,
}

impl CacheEnv {
    /// The variables of this process.
    pub fn from_env() -> CacheEnv {
        CacheEnv {
            kwk_models_dir: std::env::var_os("KWK_MODELS_DIR"),
            kwk_cache: std::env::var_os("KWK_CACHE"),
            xdg_cache_home: std::env::var_os("XDG_CACHE_HOME"),
            home: std::env::var_os("HOME"),
        }
    }
}

fn set(v: &Option<OsString>) -> Option<PathBuf> {
    v.as_ref().filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// `$KWK_CACHE`, else `${XDG_CACHE_HOME:-$HOME/.cache}/kwk`; `None` when none is set.
pub fn cache_root(env: &CacheEnv) -> Option<PathBuf> {
    set(&env.kwk_cache)
        .or_else(|| set(&env.xdg_cache_home).map(|x| x.join("kwk")))
        .or_else(|| set(&env.home).map(|h| h.join(".cache").join("kwk")))
}

/// `$KWK_MODELS_DIR`, else `ROOT/models` ([`cache_root`]).
pub fn models_dir(env: &CacheEnv) -> Option<PathBuf> {
    set(&env.kwk_models_dir).or_else(|| cache_root(env).map(|r| r.join("models")))
}

/// `ROOT/pack` ([`cache_root`]): the default pack cache folder.
pub fn pack_cache_dir(env: &CacheEnv) -> Option<PathBuf> {
    cache_root(env).map(|r| r.join("pack"))
}

/// [`models_dir`] of this process's environment.
pub fn default_models_dir() -> Option<PathBuf> {
    models_dir(&CacheEnv::from_env())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(models: &str, cache: &str, xdg: &str, home: &str) -> CacheEnv {
        let v = |s: &str| (s != "-").then(|| OsString::from(s));
        CacheEnv {
            kwk_models_dir: v(models),
            kwk_cache: v(cache),
            xdg_cache_home: v(xdg),
            home: v(home),
        }
    }

    #[test]
    fn models_dir_follows_the_scripts_rule() {
        let p = PathBuf::from;
        // (KWK_MODELS_DIR, KWK_CACHE, XDG_CACHE_HOME, HOME) -> models, root; "-" = unset.
        let cases = [
            ("/m", "/c", "/x", "/h", Some("/m"), Some("/c")),
            ("-", "/c", "/x", "/h", Some("/c/models"), Some("/c")),
            ("-", "-", "/x", "/h", Some("/x/kwk/models"), Some("/x/kwk")),
            (
                "-",
                "-",
                "-",
                "/h",
                Some("/h/.cache/kwk/models"),
                Some("/h/.cache/kwk"),
            ),
            (
                "",
                "",
                "",
                "/h",
                Some("/h/.cache/kwk/models"),
                Some("/h/.cache/kwk"),
            ),
            ("-", "", "/x", "-", Some("/x/kwk/models"), Some("/x/kwk")),
            ("/m", "-", "-", "-", Some("/m"), None),
            ("-", "-", "-", "-", None, None),
        ];
        for (m, c, x, h, models, root) in cases {
            let e = env(m, c, x, h);
            assert_eq!(models_dir(&e), models.map(p), "{e:?}");
            assert_eq!(cache_root(&e), root.map(p), "{e:?}");
            assert_eq!(pack_cache_dir(&e), root.map(|r| p(r).join("pack")), "{e:?}");
        }
    }
}
