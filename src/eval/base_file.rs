//! llama.cpp's `--kl-divergence-base` file, written and read record by record, with kwk's
//! trailer: the reference runner writes one, llama-perplexity writes one for each GGUF
//! row (the same file a `--kl-divergence` run would read). Layout: header `_logits_`, n_ctx,
//! n_vocab, n_chunk (int32), the token stream (int32 × n_chunk·n_ctx), then one
//! [`crate::eval::records`] record per scored position. Host byte order (little-endian on
//! x86). Size: `20 + 4·n_chunk·n_ctx + 2·words·n_chunk·(n_ctx-1-n_ctx/2)` bytes, about
//! 1 GB for 40 chunks of 512 with a 49k vocabulary.

use crate::eval::perplexity::ChunkLogits;
use crate::eval::records::{decode_log_prob, encode_log_probs, record_words};
use crate::protocol::{ChunkPlan, ReferenceStamp, TokenScores};
use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The file magic (P:466).
pub const MAGIC: &[u8; 8] = b"_logits_";

/// Size in bytes of a base file (§2.2), the trailer not counted.
/// Saturates at `u64::MAX` (a size no disk holds) instead of overflowing.
pub fn base_file_bytes(ctx: usize, n_vocab: usize, chunks: usize) -> u64 {
    let scored = ctx.saturating_sub(1 + ctx / 2) as u64;
    let (ctx, chunks) = (ctx as u64, chunks as u64);
    let words = (n_vocab as u64)
        .div_ceil(2)
        .saturating_mul(2)
        .saturating_add(4);
    let tokens = chunks.saturating_mul(ctx).saturating_mul(4);
    let records = words
        .saturating_mul(2)
        .saturating_mul(chunks)
        .saturating_mul(scored);
    tokens.saturating_add(records).saturating_add(20)
}

/// The header of a base file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseHeader {
    pub ctx: usize,
    pub n_vocab: usize,
    pub chunks: usize,
    pub tokens: Vec<u32>,
}

/// The last 8 bytes of a file kwk-eval's float32 row wrote completely: the trailer's magic.
pub const TRAILER_MAGIC: &[u8; 8] = b"_kwkref1";

/// kwk's trailer after the last record: what the file is of (its identity, checked before
/// another run uses it with `--reference`), how many bytes come before it and their
/// SHA-256, and the float32 row's perplexity. Stored as JSON, then its length (u64 LE),
/// then [`TRAILER_MAGIC`]. llama-perplexity reads the records by count
/// (perplexity.cpp P:1842) and never reaches it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceIdentity {
    #[serde(flatten)]
    pub stamp: ReferenceStamp,
    pub ctx: usize,
    pub chunks: usize,
    pub n_vocab: usize,
    /// Bytes before the trailer (header, tokens, records) and their SHA-256.
    pub body_bytes: u64,
    pub body_sha256: String,
    /// The float32 row's perplexity as the run that wrote the file measured it.
    pub ppl: f64,
    pub ppl_err: f64,
    pub running_ppl: Vec<f64>,
    pub scored_tokens: usize,
}

/// The float32 row's perplexity figures the trailer keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferencePerplexity {
    pub ppl: f64,
    pub ppl_err: f64,
    pub running: Vec<f64>,
    pub scored_tokens: usize,
}

/// Writes the reference runner's scored log-probs, chunk by chunk, into a partial file
/// that [`LogitsBaseWriter::finish`] completes with the trailer and renames into place:
/// a killed run leaves no file under the final name that looks complete.
pub struct LogitsBaseWriter {
    out: BufWriter<File>,
    partial: PathBuf,
    path: PathBuf,
    hash: Sha256,
    bytes_out: u64,
    plan: ChunkPlan,
    n_vocab: usize,
    written: usize,
    record: Vec<u16>,
    bytes: Vec<u8>,
    /// NLL of each scored target, decoded from its record.
    nll: Vec<f32>,
}

impl LogitsBaseWriter {
    /// Writes the header into `partial`: `plan.chunks·plan.ctx` tokens of the stream (with
    /// its leading BOS, without the per-chunk BOS substitution, P:523). `partial` must
    /// exist already, made by the caller with an exclusive create (the run reserves it, so
    /// it owns the file it later removes); it is opened for writing, never created here.
    /// The finished file is renamed to `path`.
    pub fn create(
        partial: &Path,
        path: &Path,
        plan: &ChunkPlan,
        n_vocab: usize,
        tokens: &[u32],
    ) -> Result<Self> {
        let n_tokens = plan.chunks * plan.ctx;
        ensure!(
            tokens.len() >= n_tokens,
            "the token stream is shorter than the chunk plan"
        );
        let file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(partial)
            .with_context(|| {
                format!(
                    "opening the KL-divergence base file '{}'",
                    partial.display()
                )
            })?;
        let mut w = LogitsBaseWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            partial: partial.to_path_buf(),
            path: path.to_path_buf(),
            hash: Sha256::new(),
            bytes_out: 0,
            plan: *plan,
            n_vocab,
            written: 0,
            record: vec![0; record_words(n_vocab)],
            bytes: Vec::new(),
            nll: Vec::new(),
        };
        let mut header = Vec::with_capacity(20 + 4 * n_tokens);
        header.extend_from_slice(MAGIC);
        for v in [plan.ctx, n_vocab, plan.chunks] {
            header.extend_from_slice(
                &i32::try_from(v)
                    .context("header value exceeds int32")?
                    .to_le_bytes(),
            );
        }
        for &t in &tokens[..n_tokens] {
            header.extend_from_slice(&(t as i32).to_le_bytes());
        }
        w.body(&header)?;
        Ok(w)
    }

    /// Writes bytes of the body (before the trailer), hashing them.
    fn body(&mut self, bytes: &[u8]) -> Result<()> {
        self.hash.update(bytes);
        self.bytes_out += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .with_context(|| format!("writing '{}' (is the disk full?)", self.partial.display()))
    }

    pub fn write_chunk(&mut self, c: &ChunkLogits) -> Result<()> {
        ensure!(
            c.vocab == self.n_vocab,
            "the reference runner returned rows of {} logits, the base file holds {}",
            c.vocab,
            self.n_vocab
        );
        ensure!(
            self.written < self.plan.chunks,
            "more chunks than the base file header announced"
        );
        let mut bytes = std::mem::take(&mut self.bytes);
        bytes.clear();
        for (row, &t) in c.rows.chunks_exact(c.vocab).zip(c.targets) {
            encode_log_probs(row, &mut self.record);
            self.nll.push(-decode_log_prob(&self.record, t as usize));
            for w in &self.record {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
        }
        let written = self.body(&bytes);
        self.bytes = bytes;
        written?;
        self.written += 1;
        Ok(())
    }

    /// Writes the trailer (`stamp`, the counts, the digest, `ppl`), syncs the file and
    /// renames it to its final path; the reference's own per-token figures (KLD 0, same
    /// top).
    pub fn finish(
        mut self,
        stamp: &ReferenceStamp,
        ppl: &ReferencePerplexity,
    ) -> Result<TokenScores> {
        ensure!(
            self.written == self.plan.chunks,
            "the base file '{}' got {} of {} chunks",
            self.partial.display(),
            self.written,
            self.plan.chunks
        );
        let identity = ReferenceIdentity {
            stamp: stamp.clone(),
            ctx: self.plan.ctx,
            chunks: self.plan.chunks,
            n_vocab: self.n_vocab,
            body_bytes: self.bytes_out,
            body_sha256: hex(&self.hash.clone().finalize()),
            ppl: ppl.ppl,
            ppl_err: ppl.ppl_err,
            running_ppl: ppl.running.clone(),
            scored_tokens: ppl.scored_tokens,
        };
        let json = serde_json::to_vec(&identity).context("encoding the reference's trailer")?;
        let what = || format!("writing '{}' (is the disk full?)", self.partial.display());
        self.out.write_all(&json).with_context(what)?;
        self.out
            .write_all(&(json.len() as u64).to_le_bytes())
            .with_context(what)?;
        self.out.write_all(TRAILER_MAGIC).with_context(what)?;
        self.out.flush().with_context(what)?;
        self.out.get_ref().sync_all().with_context(what)?;
        std::fs::rename(&self.partial, &self.path).with_context(|| {
            format!(
                "renaming '{}' to '{}'",
                self.partial.display(),
                self.path.display()
            )
        })?;
        let n = self.nll.len();
        Ok(TokenScores {
            nll: self.nll,
            kld: vec![0.0; n],
            same_top: vec![true; n],
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The trailer of the reference file at `path`, checked against the file's length and
/// header, without reading the records: an error naming the file and the fix when it has
/// none (a run killed while writing it, a file truncated in a copy, or one llama.cpp wrote).
pub fn read_identity(path: &Path) -> Result<ReferenceIdentity> {
    let incomplete = |why: &str| {
        anyhow::anyhow!(
            "reference '{}' {why}: it is incomplete (a run killed while writing it, a copy cut short) or was not written by kwk-eval's float32 row; make it again (kwk-eval --formats float32 --keep-logits)",
            path.display()
        )
    };
    let mut f = File::open(path)
        .with_context(|| format!("reading the reference file '{}'", path.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("reading '{}'", path.display()))?
        .len();
    if len < 20 + 16 {
        return Err(incomplete(&format!("holds {len} bytes")));
    }
    let mut tail = [0u8; 16];
    f.seek(SeekFrom::Start(len - 16))
        .and_then(|_| f.read_exact(&mut tail))
        .with_context(|| format!("reading '{}'", path.display()))?;
    if &tail[8..] != TRAILER_MAGIC {
        return Err(incomplete("has no trailer (no _kwkref1 at its end)"));
    }
    let json_len = u64::from_le_bytes(tail[..8].try_into().expect("8 bytes"));
    let Some(body_bytes) = (len - 16).checked_sub(json_len) else {
        return Err(incomplete("has a trailer longer than the file"));
    };
    let mut json = vec![0u8; json_len as usize];
    f.seek(SeekFrom::Start(body_bytes))
        .and_then(|_| f.read_exact(&mut json))
        .with_context(|| format!("reading '{}'", path.display()))?;
    let id: ReferenceIdentity = serde_json::from_slice(&json)
        .map_err(|e| incomplete(&format!("has a trailer that does not parse ({e})")))?;
    let expected = base_file_bytes(id.ctx, id.n_vocab, id.chunks);
    if id.body_bytes != body_bytes || body_bytes != expected {
        return Err(incomplete(&format!(
            "holds {body_bytes} bytes before its trailer, its trailer says {} and {} chunks of ctx {} at a vocabulary of {} take {expected}",
            id.body_bytes, id.chunks, id.ctx, id.n_vocab
        )));
    }
    let header = LogitsBaseReader::open(path)?.header;
    if (header.ctx, header.n_vocab, header.chunks) != (id.ctx, id.n_vocab, id.chunks) {
        return Err(incomplete(&format!(
            "has a header of {} chunks of ctx {} at a vocabulary of {}, its trailer says {} of {} at {}",
            header.chunks, header.ctx, header.n_vocab, id.chunks, id.ctx, id.n_vocab
        )));
    }
    Ok(id)
}

/// [`read_identity`], and the body's SHA-256 computed again against the trailer's (the
/// whole file is read once): for a file another run wrote.
pub fn read_verified(path: &Path) -> Result<ReferenceIdentity> {
    let id = read_identity(path)?;
    let f = File::open(path).with_context(|| format!("reading '{}'", path.display()))?;
    let mut body = BufReader::with_capacity(1 << 20, f).take(id.body_bytes);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = body
            .read(&mut buf)
            .with_context(|| format!("reading '{}'", path.display()))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    let got = hex(&hash.finalize());
    if got != id.body_sha256 {
        bail!(
            "reference '{}': its bytes hash to {got}, its trailer says {}; the file was changed or damaged after it was written; make it again (kwk-eval --formats float32 --keep-logits)",
            path.display(),
            id.body_sha256
        );
    }
    Ok(id)
}

/// The float32 row's per-token figures from its reference file (what
/// [`LogitsBaseWriter::finish`] returned to the run that wrote it, bit for bit).
pub fn reference_scores(path: &Path, plan: &ChunkPlan, tokens: &[u32]) -> Result<TokenScores> {
    let mut r = LogitsBaseReader::open(path)?;
    let n_vocab = r.header.n_vocab;
    r.check_matches(plan, n_vocab, tokens)?;
    let mut rec = vec![0u16; record_words(n_vocab)];
    let mut nll = Vec::with_capacity(plan.scored_tokens());
    for k in 0..plan.chunks {
        for &t in plan.targets(tokens, k) {
            r.read_record(&mut rec)?;
            ensure!(
                (t as usize) < n_vocab,
                "token {t} is outside the reference's vocabulary of {n_vocab}"
            );
            nll.push(-decode_log_prob(&rec, t as usize));
        }
    }
    let n = nll.len();
    Ok(TokenScores {
        nll,
        kld: vec![0.0; n],
        same_top: vec![true; n],
    })
}

/// Reads a base file record by record.
pub struct LogitsBaseReader {
    input: BufReader<File>,
    path: PathBuf,
    pub header: BaseHeader,
    bytes: Vec<u8>,
}

fn read_i32(r: &mut impl Read) -> std::io::Result<i32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(i32::from_le_bytes(b))
}

impl LogitsBaseReader {
    pub fn open(path: &Path) -> Result<Self> {
        let what = || format!("reading the KL-divergence base file '{}'", path.display());
        let file = File::open(path).with_context(what)?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic).with_context(what)?;
        if &magic != MAGIC {
            bail!(
                "'{}' is not a llama.cpp KL-divergence base file (no _logits_ magic)",
                path.display()
            );
        }
        let mut dims = [0usize; 3];
        for d in &mut dims {
            let v = read_i32(&mut input).with_context(what)?;
            *d = usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .with_context(|| {
                    format!(
                        "'{}': header value {v} is not a positive size",
                        path.display()
                    )
                })?;
        }
        let [ctx, n_vocab, chunks] = dims;
        // The sizes come from the file: check them against its length before allocating.
        let file_len = input.get_ref().metadata().with_context(what)?.len();
        let token_bytes = ctx
            .checked_mul(chunks)
            .and_then(|n| n.checked_mul(4))
            .filter(|&n| n as u64 <= file_len.saturating_sub(20))
            .with_context(|| {
                format!(
                    "'{}': its header announces {chunks} chunks of ctx {ctx}, more tokens than the {file_len}-byte file holds; the file is corrupt or truncated",
                    path.display()
                )
            })?;
        let mut raw = vec![0u8; token_bytes];
        input.read_exact(&mut raw).with_context(what)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect();
        Ok(LogitsBaseReader {
            input,
            path: path.to_path_buf(),
            header: BaseHeader {
                ctx,
                n_vocab,
                chunks,
                tokens,
            },
            bytes: vec![0; 2 * record_words(n_vocab)],
        })
    }

    /// Fails unless the file was written for this plan and these tokens.
    pub fn check_matches(&self, plan: &ChunkPlan, n_vocab: usize, tokens: &[u32]) -> Result<()> {
        let h = &self.header;
        ensure!(
            h.ctx == plan.ctx && h.chunks == plan.chunks,
            "'{}' holds {} chunks of ctx {}, this run scores {} chunks of ctx {}",
            self.path.display(),
            h.chunks,
            h.ctx,
            plan.chunks,
            plan.ctx
        );
        ensure!(
            h.n_vocab == n_vocab,
            "'{}' holds a vocabulary of {}, this runner's is {}",
            self.path.display(),
            h.n_vocab,
            n_vocab
        );
        ensure!(
            h.tokens[..] == tokens[..h.tokens.len().min(tokens.len())]
                && tokens.len() >= h.tokens.len(),
            "'{}' was written for other tokens than this run's",
            self.path.display()
        );
        Ok(())
    }

    /// Reads the next record into `rec` (`record_words(n_vocab)` words).
    pub fn read_record(&mut self, rec: &mut [u16]) -> Result<()> {
        self.input
            .read_exact(&mut self.bytes)
            .with_context(|| format!("reading '{}': the file is truncated", self.path.display()))?;
        for (w, b) in rec.iter_mut().zip(self.bytes.chunks_exact(2)) {
            *w = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn test_stamp() -> ReferenceStamp {
        ReferenceStamp {
            model: "tiny.gguf".into(),
            model_sha256: "aa".into(),
            text: "t.txt".into(),
            text_sha256: "bb".into(),
            tokens_sha256: "cc".into(),
            made_by: "a test".into(),
        }
    }

    pub fn test_ppl() -> ReferencePerplexity {
        ReferencePerplexity {
            ppl: 12.345678901234567,
            ppl_err: 0.5,
            running: vec![13.0, 12.345678901234567],
            scored_tokens: 6,
        }
    }

    /// A reference of 2 chunks of ctx 8 over a vocabulary of 5, written completely; its
    /// path and what its writer returned.
    fn written(dir: &Path) -> (PathBuf, ChunkPlan, Vec<u32>, TokenScores) {
        let tokens: Vec<u32> = (0..20).map(|i| i % 5).collect();
        let plan = ChunkPlan::new(tokens.len(), 8, None).unwrap();
        let rows: Vec<f32> = (0..plan.scored_per_chunk() * 5)
            .map(|i| (i % 7) as f32 * 0.3)
            .collect();
        let (partial, path) = (dir.join("ref.partial"), dir.join("ref.bin"));
        std::fs::write(&partial, b"").unwrap();
        let mut w = LogitsBaseWriter::create(&partial, &path, &plan, 5, &tokens).unwrap();
        for k in 0..plan.chunks {
            w.write_chunk(&ChunkLogits {
                chunk: k,
                rows: &rows,
                vocab: 5,
                targets: plan.targets(&tokens, k),
            })
            .unwrap();
        }
        let own = w.finish(&test_stamp(), &test_ppl()).unwrap();
        (path, plan, tokens, own)
    }

    /// Written and read back: the trailer holds the stamp, the counts, the digest and the
    /// float32 figures, and the per-token NLL read from the records is the writer's.
    #[test]
    fn a_reference_round_trips_with_its_identity() {
        let dir = tempfile::tempdir().unwrap();
        let (path, plan, tokens, own) = written(dir.path());
        let id = read_verified(&path).unwrap();
        assert_eq!(id.stamp, test_stamp());
        assert_eq!((id.ctx, id.chunks, id.n_vocab), (8, 2, 5));
        assert_eq!(id.body_bytes, base_file_bytes(8, 5, 2));
        assert_eq!(id.ppl.to_bits(), test_ppl().ppl.to_bits());
        assert_eq!(id.running_ppl, test_ppl().running);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            id.body_sha256,
            crate::digest::sha256_hex(&bytes[..id.body_bytes as usize])
        );
        assert_eq!(read_identity(&path).unwrap(), id);
        assert_eq!(reference_scores(&path, &plan, &tokens).unwrap(), own);
        // llama.cpp's reader sees its own layout: header, tokens, then records by count.
        assert_eq!(&bytes[..8], MAGIC);
        assert_eq!(&bytes[bytes.len() - 8..], TRAILER_MAGIC);
    }

    /// A file cut anywhere (in the records, in the trailer, one byte short), or one whose
    /// records changed after it was written, is refused naming the file and the fix.
    #[test]
    fn a_truncated_or_changed_reference_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, ..) = written(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        let body = base_file_bytes(8, 5, 2) as usize;
        let cut = dir.path().join("cut.bin");
        for len in [
            0,
            30,
            body / 2,
            body,
            body + 5,
            bytes.len() - 9,
            bytes.len() - 1,
        ] {
            std::fs::write(&cut, &bytes[..len]).unwrap();
            let e = format!("{:#}", read_verified(&cut).unwrap_err());
            assert!(
                e.contains("cut.bin") && e.contains("incomplete") && e.contains("--keep-logits"),
                "{len}: {e}"
            );
        }
        let mut changed = bytes.clone();
        changed[body - 3] ^= 1;
        std::fs::write(&cut, &changed).unwrap();
        assert!(
            read_identity(&cut).is_ok(),
            "the trailer alone does not see it"
        );
        let e = format!("{:#}", read_verified(&cut).unwrap_err());
        assert!(e.contains("changed or damaged"), "{e}");
    }

    /// A writer dropped before `finish` (a run killed, a row that failed) leaves nothing
    /// under the final name.
    #[test]
    fn an_unfinished_reference_never_takes_the_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u32> = (0..20).map(|i| i % 5).collect();
        let plan = ChunkPlan::new(tokens.len(), 8, None).unwrap();
        let (partial, path) = (dir.path().join("p"), dir.path().join("ref.bin"));
        std::fs::write(&partial, b"").unwrap();
        let rows = vec![0.5f32; plan.scored_per_chunk() * 5];
        let mut w = LogitsBaseWriter::create(&partial, &path, &plan, 5, &tokens).unwrap();
        w.write_chunk(&ChunkLogits {
            chunk: 0,
            rows: &rows,
            vocab: 5,
            targets: plan.targets(&tokens, 0),
        })
        .unwrap();
        let e = w.finish(&test_stamp(), &test_ppl()).unwrap_err();
        assert!(format!("{e:#}").contains("got 1 of 2 chunks"), "{e:#}");
        assert!(!path.exists());
    }

    /// A header announcing more tokens than the file holds is refused before anything is
    /// allocated (2^31 − 1 chunks of ctx 2^31 − 1 would ask for 2^64 bytes).
    #[test]
    fn huge_header_sizes_are_refused_not_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("base.bin");
        let mut b = MAGIC.to_vec();
        for v in [i32::MAX, 49152, i32::MAX] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 64]);
        std::fs::write(&p, &b).unwrap();
        let e = format!("{:#}", LogitsBaseReader::open(&p).err().unwrap());
        assert!(
            e.contains("announces 2147483647 chunks of ctx 2147483647")
                && e.contains("corrupt or truncated"),
            "{e}"
        );
        // 16 tokens fit in 64 bytes: the header is read (and the records are not checked here).
        let mut b = MAGIC.to_vec();
        for v in [8i32, 10, 2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 64]);
        std::fs::write(&p, &b).unwrap();
        assert_eq!(LogitsBaseReader::open(&p).unwrap().header.tokens.len(), 16);
    }

    #[test]
    fn base_file_bytes_by_hand_and_saturating() {
        // ctx 8: positions 4..=6 scored (3 per chunk); vocab 10: 2·5 + 4 = 14 words a record.
        assert_eq!(base_file_bytes(8, 10, 2), 20 + 4 * 16 + 2 * 14 * 2 * 3);
        assert_eq!(base_file_bytes(1 << 30, 1 << 24, usize::MAX), u64::MAX);
    }

    #[test]
    fn record_layout_and_file_size() {
        assert_eq!(record_words(49152), 49156);
        assert_eq!(record_words(5), 10);
        // 40 chunks of 512 at 49152: 20 + 4*20480 + 2*49156*40*255 bytes (~1.0 GB).
        assert_eq!(
            base_file_bytes(512, 49152, 40),
            20 + 81920 + 2 * 49156 * 40 * 255
        );
    }
}
