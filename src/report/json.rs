//! results.json: [`Results`] as pretty JSON (the contract other programs read), and
//! reading one back for the regression gate.

use super::exporter::{Exporter, Run};
use super::files::write_atomically;
use crate::protocol::results::{Results, RunnerRecord, SCHEMA_VERSION};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// results.json's name in a run folder.
pub const FILE_NAME: &str = "results.json";

/// results.json as an [`Exporter`].
pub struct Json;

impl Exporter for Json {
    fn file_name(&self) -> &'static str {
        FILE_NAME
    }
    fn serialize(&self, run: &Run<'_>) -> Result<Vec<u8>> {
        to_bytes(run.results)
    }
}

/// `results` as pretty JSON with a final newline.
pub fn to_bytes(results: &Results) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(results).context("serializing results")?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes results.json to `path` alone (atomically).
pub fn write(path: &Path, results: &Results) -> Result<()> {
    write_atomically(path, &to_bytes(results)?)
}

/// Reads a results.json, checking its schema version.
pub fn read(path: &Path) -> Result<Results> {
    let what = format!("'{}'", path.display());
    crate::text::regular_file(path, &what, "pass a results.json written by kwk-eval")?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut crate::text::open_input(path).with_context(|| format!("reading {what}"))?,
        &mut text,
    )
    .with_context(|| format!("reading {what}"))?;
    let value: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "'{}' is not JSON; pass a results.json written by kwk-eval",
            path.display()
        )
    })?;
    match value.get("schema_version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(SCHEMA_VERSION) => {}
        Some(v) => bail!(
            "'{}' has schema_version {v}; this kwk-eval reads version {SCHEMA_VERSION}. Re-run the baseline with this build",
            path.display()
        ),
        None => bail!(
            "'{}' has no schema_version; pass a results.json written by kwk-eval",
            path.display()
        ),
    }
    let mut results: Results = serde_json::from_value(value).with_context(|| {
        format!(
            "'{}' does not follow the results.json schema version {SCHEMA_VERSION}",
            path.display()
        )
    })?;
    results
        .runners
        .iter_mut()
        .for_each(RunnerRecord::settle_status);
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::results::testdata::sample_results;

    #[test]
    fn round_trips_and_checks_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("results.json");
        let r = sample_results();
        write(&p, &r).unwrap();
        assert_eq!(read(&p).unwrap(), r);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        // Unmeasured figures are null, not absent and not zero.
        assert!(v["runners"][0]["kld_mean"].is_null());
        assert_eq!(v["schema_version"], 2);
        std::fs::write(&p, r#"{"schema_version": 7}"#).unwrap();
        assert!(format!("{:#}", read(&p).unwrap_err()).contains("schema_version 7"));
        std::fs::write(&p, "not json").unwrap();
        assert!(read(&p).is_err());
    }
}
