//! Structured-mutation fuzzing of the decoder's loaders, on stable Rust (no cargo-fuzz).
//!
//! Targets, each fed whole files written to a scratch folder:
//! - `gguf_header`: [`GgufFile::open`], the summary, every metadata accessor, every
//!   tensor's bytes.
//! - `gguf_model`: [`load_gguf`] (config, every weight dequantized, tokenizer fields) and
//!   the GGUF tokenizer built from it.
//! - `gguf_tokenizer`: the tokenizer from GGUF metadata alone (vocabulary, merges, scores,
//!   token types, special ids), then encode and decode.
//! - `hf_config`: [`ModelConfig::from_hf_config_json`].
//! - `safetensors`: [`load_hf_folder`] (config.json + a mutated model.safetensors).
//! - `tokenizer_json`: [`Tokenizer::from_hf_folder`] with a mutated tokenizer.json, then
//!   encode and decode.
//! - `pack_cache`: a mutated pack-cache file (`kwk::pack_cache`, layout version
//!   [`PACK_VERSION`]) placed where the cache looks for its model, then
//!   [`kwk::pack_cache::list`] and a warm start [`KwkDecoder::from_pack_cache`] (index,
//!   CRCs, every tensor mapped and checked against its shape) and, when it loads, a
//!   forward pass over three tokens (every packed array read).
//!
//! Seeds: the fixture models (`kwk_fixtures`: three tiny GGUFs, configs, safetensors and
//! tokenizer.json); for `pack_cache`, the real pack files the decoder writes for two fixture
//! models in int8 and int4 (packed at the start of the run, [`pack_seeds`]); and, in the long run only and when present, the header of each
//! `~/.cache/kwk/models/SmolLM2-135M-Instruct/*.gguf` with its tensor count set to 0 (a
//! real 49152-token vocabulary with merges, as a GGUF without tensors).
//!
//! Mutations (1 to 4 stacked per case): bit flips; bytes set to 0, 1, 0x7f, 0x80, 0xff;
//! 4- and 8-byte fields overwritten with boundary values (0, 1, 2^31, 2^32, 2^63,
//! u64::MAX, the file length ± 1, ...); truncation; insertion, deletion and duplication
//! of ranges; splices from another seed; and, aware of each format, edits of GGUF length
//! and count fields, value and ggml types, dimensions and offsets (found by walking the
//! header), of safetensors' header length, and of numbers in JSON. Positions favour the
//! header (the first bytes of a GGUF up to its data section, a safetensors JSON header).
//! A pack file's index is guarded by a SHA-256 in its trailer (and each entry by a CRC-32),
//! so most `pack_cache` cases edit the index JSON (or the data) and then re-seal it: new
//! trailer offsets and hash, and in half of them the entries' CRCs recomputed, so the
//! mutation reaches the shape and offset checks behind the integrity checks.
//!
//! Invariants checked per case:
//! - no panic: each case runs under `catch_unwind` (a panic in a rayon worker reaches the
//!   caller the same way);
//! - bounded memory: a counting global allocator measures the peak heap above the level
//!   before the case, which must stay under `factor × input bytes + 16 MiB` with the
//!   target's factor ([`Target::factor`], stated and argued there); any single request
//!   above 4 GiB aborts the run (the case files stay in the scratch folder printed first);
//! - no read outside the file: the loaders read memory-mapped files and buffers through
//!   Rust slices only (`get`, checked ranges; `unsafe` is limited to the mmap call and
//!   the SIMD kernels), so an out-of-bounds index is a panic, which the first invariant
//!   catches.
//!
//! `cargo test -p kwk --test fuzz` runs a fixed-seed slice (a few thousand cases, seconds).
//! The long run, one command:
//!
//! ```text
//! KWK_FUZZ_SECONDS=600 cargo test -p kwk --test fuzz -- --ignored --nocapture
//! ```
//!
//! (the test profile is optimised and keeps overflow checks, so arithmetic overflow
//! panics and is caught; `--release` would turn the checks off)
//! runs every target for `KWK_FUZZ_SECONDS` (default 600) each, one after another
//! (`KWK_FUZZ_TARGETS=gguf_header,hf_config` picks some; `KWK_FUZZ_SEED` sets the seed),
//! printing executions, executions per second and the largest memory ratio per target.
//! A failing case is written to `<temp>/kwk-fuzz-crashes/` and the run fails naming it;
//! every crash found so far is a regression test at the end of this file.

use kwk::decoder::{DecoderOptions, KwkDecoder, Precision};
use kwk::gguf::{GgufFile, HEADER_MEMORY_PER_BYTE};
use kwk::model::gguf_loader::{load_gguf, tokenizer_metadata_from_gguf};
use kwk::model::source::load_hf_folder;
use kwk::model::ModelConfig;
use kwk::pack_cache::PACK_VERSION;
use kwk::tokenizer::Tokenizer;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Counting allocator

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Any one request above this aborts: the fuzzed code must never ask for it.
const HARD_CAP: usize = 4 << 30;

fn add(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_CAP {
            // Null makes Rust's allocation-error handler abort with the size.
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_CAP {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > HARD_CAP {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the old block and the new one both live, as a moving realloc is.
            add(new_size);
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak heap above the level at the start, while `f` runs.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    (out, peak)
}

/// Tests in this binary run one at a time (the allocator's counters are global).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------
// Random numbers (SplitMix64: small, deterministic, good enough for choosing mutations)

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

// ---------------------------------------------------------------------------------------
// Format knowledge for the mutator

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    Gguf,
    Safetensors,
    Json,
    Pack,
}

/// A little-endian integer field of a file: where, how wide.
#[derive(Clone, Copy, Debug)]
struct Field {
    at: usize,
    width: usize,
}

/// The length, count, type, dimension and offset fields of a GGUF header (tolerant: stops
/// where the bytes stop making sense), and where the header ends. `top` are the header's
/// own fields, `inner` the lengths of strings inside arrays.
struct GgufFields {
    top: Vec<Field>,
    inner: Vec<Field>,
    end: usize,
}

fn gguf_fields(b: &[u8]) -> GgufFields {
    struct W<'a> {
        b: &'a [u8],
        pos: usize,
        f: GgufFields,
    }
    impl W<'_> {
        fn int(&mut self, width: usize, inner: bool) -> Option<u64> {
            let s = self.b.get(self.pos..self.pos + width)?;
            let mut a = [0u8; 8];
            a[..width].copy_from_slice(s);
            let field = Field {
                at: self.pos,
                width,
            };
            if inner {
                self.f.inner.push(field);
            } else {
                self.f.top.push(field);
            }
            self.pos += width;
            Some(u64::from_le_bytes(a))
        }
        fn skip(&mut self, n: u64) -> Option<()> {
            let n = usize::try_from(n).ok()?;
            if n > self.b.len() - self.pos {
                return None;
            }
            self.pos += n;
            Some(())
        }
        fn string(&mut self, inner: bool) -> Option<()> {
            let n = self.int(8, inner)?;
            self.skip(n)
        }
        fn value(&mut self, ty: u64, depth: usize) -> Option<()> {
            match ty {
                0 | 1 | 7 => self.skip(1),
                2 | 3 => self.skip(2),
                4..=6 => self.skip(4),
                10..=12 => self.skip(8),
                8 => self.string(depth > 0),
                9 if depth < 3 => {
                    let et = self.int(4, false)?;
                    let n = self.int(8, false)?;
                    if n > (self.b.len() - self.pos) as u64 {
                        return None;
                    }
                    for _ in 0..n {
                        self.value(et, depth + 1)?;
                    }
                    Some(())
                }
                _ => None,
            }
        }
        fn walk(&mut self) -> Option<()> {
            self.skip(4)?; // magic
            self.int(4, false)?; // version
            let n_tensors = self.int(8, false)?;
            let n_kv = self.int(8, false)?;
            for _ in 0..n_kv.min(1 << 20) {
                self.string(false)?;
                let ty = self.int(4, false)?;
                self.value(ty, 0)?;
            }
            for _ in 0..n_tensors.min(1 << 20) {
                self.string(false)?;
                let n_dims = self.int(4, false)?;
                for _ in 0..n_dims.min(8) {
                    self.int(8, false)?;
                }
                self.int(4, false)?; // ggml type
                self.int(8, false)?; // offset
            }
            Some(())
        }
    }
    let mut w = W {
        b,
        pos: 0,
        f: GgufFields {
            top: Vec::new(),
            inner: Vec::new(),
            end: 0,
        },
    };
    let _ = w.walk();
    w.f.end = w.pos.max(32).min(b.len());
    w.f
}

/// Where a safetensors header ends (8 + its declared length, clamped to the file).
fn safetensors_header_end(b: &[u8]) -> usize {
    let n = b
        .get(..8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        .unwrap_or(0);
    (8u64.saturating_add(n)).min(b.len() as u64) as usize
}

/// Byte ranges of JSON numbers (and literals) in `b[..end]`.
fn json_scalars(b: &[u8], end: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut in_string = false;
    while i < end {
        let c = b[i];
        if in_string {
            if c == b'\\' {
                i += 1;
            } else if c == b'"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if c == b'-' || c.is_ascii_digit() || c == b't' || c == b'f' || c == b'n' {
            let start = i;
            while i < end && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'-' | b'+' | b'.')) {
                i += 1;
            }
            out.push((start, i));
            continue;
        }
        i += 1;
    }
    out
}

const JSON_SCALARS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "-0",
    "0.5",
    "1e309",
    "-1e309",
    "2147483648",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "134217728",
    "1048577",
    "null",
    "true",
    "false",
    "\"\"",
    "\"x\"",
    "[]",
    "{}",
    "[0]",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
];

fn boundary_u64(rng: &mut Rng, old: u64, len: usize) -> u64 {
    let len = len as u64;
    let choices = [
        0,
        1,
        2,
        3,
        4,
        8,
        9,
        12,
        13,
        30,
        31,
        32,
        64,
        0x7f,
        0x80,
        0xff,
        0x100,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        1 << 32,
        1 << 40,
        1 << 62,
        1 << 63,
        u64::MAX,
        u64::MAX - 1,
        u64::MAX / 2,
        len,
        len + 1,
        len.saturating_sub(1),
        old.wrapping_add(1),
        old.wrapping_sub(1),
        old.wrapping_mul(2),
        old / 2,
        old ^ (1 << rng.below(64)),
        rng.next(),
    ];
    *rng.pick(&choices)
}

fn write_int(data: &mut [u8], f: Field, v: u64) {
    if f.at + f.width <= data.len() {
        data[f.at..f.at + f.width].copy_from_slice(&v.to_le_bytes()[..f.width]);
    }
}

fn read_int(data: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = data.get(f.at..f.at + f.width) {
        a[..f.width].copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// A position in `0..len`, usually below `hot` (the header).
fn position(rng: &mut Rng, len: usize, hot: usize) -> usize {
    if hot > 0 && rng.chance(85) {
        rng.below(hot.min(len))
    } else {
        rng.below(len)
    }
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, format: Format, seeds: &[Vec<u8>]) {
    let rounds = if rng.chance(80) {
        1 + rng.below(2)
    } else {
        1 + rng.below(4)
    };
    for _ in 0..rounds {
        if data.is_empty() {
            let s: &Vec<u8> = rng.pick(seeds);
            data.extend_from_slice(s);
        }
        let len = data.len();
        let hot = match format {
            Format::Gguf => gguf_fields(data).end,
            Format::Safetensors => safetensors_header_end(data),
            Format::Json | Format::Pack => len,
        };
        if format == Format::Pack && rng.chance(70) {
            structured(rng, data, format);
            continue;
        }
        match rng.below(10) {
            0 => {
                let p = position(rng, len, hot);
                data[p] ^= 1 << rng.below(8);
            }
            1 => {
                let p = position(rng, len, hot);
                data[p] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'"', b'9', b'{']);
            }
            2 => {
                let width = *rng.pick(&[4usize, 8]);
                if len >= width {
                    let at = position(rng, len - width + 1, hot);
                    let f = Field { at, width };
                    let v = boundary_u64(rng, read_int(data, f), len);
                    write_int(data, f, v);
                }
            }
            3..=5 => structured(rng, data, format),
            6 => {
                let p = position(rng, len, hot);
                data.truncate(p);
            }
            7 => {
                // Splice a range of some seed over or into this file.
                let src = rng.pick(seeds);
                if !src.is_empty() {
                    let s = rng.below(src.len());
                    let n = 1 + rng.below((src.len() - s).min(4096));
                    let p = position(rng, len, hot);
                    if rng.chance(50) {
                        let end = (p + n).min(len);
                        data[p..end].copy_from_slice(&src[s..s + (end - p)]);
                    } else {
                        data.splice(p..p, src[s..s + n].iter().copied());
                    }
                }
            }
            8 => {
                let p = position(rng, len, hot);
                let n = 1 + rng.below(64.min(len - p));
                if rng.chance(50) {
                    data.drain(p..p + n);
                } else {
                    let chunk: Vec<u8> = data[p..p + n].to_vec();
                    let times = 1 + rng.below(16);
                    for _ in 0..times {
                        data.splice(p..p, chunk.iter().copied());
                    }
                }
            }
            _ => {
                let p = position(rng, len, hot);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                data.splice(p..p, bytes);
            }
        }
    }
}

/// A format-aware edit.
fn structured(rng: &mut Rng, data: &mut Vec<u8>, format: Format) {
    let len = data.len();
    match format {
        Format::Gguf => {
            let fields = gguf_fields(data);
            let list = if fields.inner.is_empty() || rng.chance(75) {
                &fields.top
            } else {
                &fields.inner
            };
            if list.is_empty() {
                return;
            }
            let f = *rng.pick(list);
            let v = boundary_u64(rng, read_int(data, f), len);
            write_int(data, f, v);
        }
        Format::Safetensors => {
            if rng.chance(30) && len >= 8 {
                let f = Field { at: 0, width: 8 };
                let v = boundary_u64(rng, read_int(data, f), len);
                write_int(data, f, v);
            } else {
                let end = safetensors_header_end(data);
                replace_json_scalar(rng, data, end);
            }
        }
        Format::Json => replace_json_scalar(rng, data, len),
        Format::Pack => reseal_pack(rng, data),
    }
}

const PACK_HEADER: usize = 64;
const PACK_TRAILER: usize = 8 + 8 + 8 + 32;

/// Edits a pack file's index (a JSON scalar, or a byte of it) or a byte of its data, then
/// re-seals it: the trailer's offset, length and SHA-256 of the new index, and, half the
/// time, every entry's CRC-32 over the range it now names (when that range is in the data).
fn reseal_pack(rng: &mut Rng, data: &mut Vec<u8>) {
    let n = data.len();
    if n < PACK_HEADER + PACK_TRAILER
        || &data[n - PACK_TRAILER..n - PACK_TRAILER + 8] != b"KWKINDEX"
    {
        return;
    }
    let t = n - PACK_TRAILER;
    let off = u64::from_le_bytes(data[t + 8..t + 16].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(data[t + 16..t + 24].try_into().unwrap()) as usize;
    if off < PACK_HEADER || off.checked_add(len) != Some(t) {
        return;
    }
    let mut body = data[..off].to_vec();
    let mut index = data[off..t].to_vec();
    match rng.below(10) {
        0..=5 => {
            let end = index.len();
            replace_json_scalar(rng, &mut index, end);
        }
        6 | 7 if !index.is_empty() => {
            let p = rng.below(index.len());
            index[p] = *rng.pick(&[b'0', b'9', b'-', b'"', b'[', b']', b',', 0xff]);
        }
        _ if body.len() > PACK_HEADER => {
            let p = PACK_HEADER + rng.below(body.len() - PACK_HEADER);
            body[p] ^= 1 << rng.below(8);
        }
        _ => {}
    }
    if rng.chance(50) {
        if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&index) {
            fix_crcs(&mut v, &body);
            index = serde_json::to_vec(&v).unwrap();
        }
    }
    use sha2::Digest;
    let hash = sha2::Sha256::digest(&index);
    let off = body.len() as u64;
    body.extend_from_slice(&index);
    body.extend_from_slice(b"KWKINDEX");
    body.extend_from_slice(&off.to_le_bytes());
    body.extend_from_slice(&(index.len() as u64).to_le_bytes());
    body.extend_from_slice(&hash);
    *data = body;
}

/// Sets each tensor's and float vector's `crc` to the CRC-32 of the bytes its offset and
/// length name, where they lie in `body`.
fn fix_crcs(index: &mut serde_json::Value, body: &[u8]) {
    let Some(sections) = index.get_mut("sections").and_then(|s| s.as_array_mut()) else {
        return;
    };
    for s in sections {
        for (list, len_key, unit) in [("tensors", "len", 1u64), ("floats", "count", 4)] {
            let Some(entries) = s.get_mut(list).and_then(|l| l.as_array_mut()) else {
                continue;
            };
            for e in entries {
                let o = e.get("offset").and_then(|v| v.as_u64());
                let l = e.get(len_key).and_then(|v| v.as_u64());
                let range = o
                    .zip(l.and_then(|l| l.checked_mul(unit)))
                    .and_then(|(o, l)| {
                        let end = o.checked_add(l)?;
                        body.get(usize::try_from(o).ok()?..usize::try_from(end).ok()?)
                    });
                if let (Some(bytes), Some(obj)) = (range, e.as_object_mut()) {
                    obj.insert("crc".into(), crc32fast::hash(bytes).into());
                }
            }
        }
    }
}

fn replace_json_scalar(rng: &mut Rng, data: &mut Vec<u8>, end: usize) {
    let scalars = json_scalars(data, end);
    if scalars.is_empty() {
        return;
    }
    let (s, e) = *rng.pick(&scalars);
    let with = rng.pick(JSON_SCALARS).as_bytes().to_vec();
    data.splice(s..e, with);
}

// ---------------------------------------------------------------------------------------
// Targets

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    GgufHeader,
    GgufModel,
    GgufTokenizer,
    HfConfig,
    Safetensors,
    TokenizerJson,
    PackCache,
}

const TARGETS: [Target; 7] = [
    Target::GgufHeader,
    Target::GgufModel,
    Target::GgufTokenizer,
    Target::HfConfig,
    Target::Safetensors,
    Target::TokenizerJson,
    Target::PackCache,
];

const TEXT: &str = "Hello world! The quick brown fox, 12345 — café </s> <s> <|im_end|>\n\ttabs";

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::GgufHeader => "gguf_header",
            Target::GgufModel => "gguf_model",
            Target::GgufTokenizer => "gguf_tokenizer",
            Target::HfConfig => "hf_config",
            Target::Safetensors => "safetensors",
            Target::TokenizerJson => "tokenizer_json",
            Target::PackCache => "pack_cache",
        }
    }

    /// The file this target mutates, inside its case folder.
    fn file(self) -> &'static str {
        match self {
            Target::GgufHeader | Target::GgufModel | Target::GgufTokenizer => "model.gguf",
            Target::HfConfig => "config.json",
            Target::Safetensors => "model.safetensors",
            Target::TokenizerJson => "tokenizer.json",
            Target::PackCache => "model.kwkpack",
        }
    }

    fn format(self) -> Format {
        match self {
            Target::GgufHeader | Target::GgufModel | Target::GgufTokenizer => Format::Gguf,
            Target::Safetensors => Format::Safetensors,
            Target::HfConfig | Target::TokenizerJson => Format::Json,
            Target::PackCache => Format::Pack,
        }
    }

    /// Unchanged files the target also reads, copied from the seed's fixture folder.
    fn companions(self) -> &'static [&'static str] {
        match self {
            Target::Safetensors => &["config.json"],
            // The source model's folder and the precision packed ([`pack_seeds`]).
            Target::PackCache => &["source.txt"],
            _ => &[],
        }
    }

    /// Heap bytes allowed per input byte (plus a 16 MiB constant for thread pools, regex
    /// programs and other fixed costs):
    /// - GGUF header: [`HEADER_MEMORY_PER_BYTE`] (8; module docs of `kwk::gguf`).
    /// - GGUF model: float32 weights are at most 32/4.5 ≈ 7.1 × the tensor bytes (the
    ///   densest type the loader dequantizes is 4.5 bits per weight, and tensors cannot
    ///   overlap), plus the header (8×) and the tokenizer (below): 48.
    /// - GGUF tokenizer: per vocabulary entry (≥ 8 bytes on disk) the header's 8 bytes, the
    ///   loader's `String` (24), the vocabulary's text, `String` and hash entry (~70 with the
    ///   load factor), and BPE ranks of merges alike: 40 per byte.
    /// - JSON (config.json, tokenizer.json, safetensors header): a `serde_json::Value` node
    ///   is 32 bytes for as little as 2 bytes of text (`0,`), and tokenizer.json is held as
    ///   bytes, as a `Value` and as the `tokenizers` model (vocabulary and its reverse):
    ///   64 per byte.
    /// - pack cache: packed arrays are memory-mapped, not copied; float vectors are copied
    ///   (4 bytes per 4 bytes); the index is JSON (64 per byte, as above); the decoder's KV
    ///   cache and scratch for 8 positions are fixed costs: 64.
    fn factor(self) -> usize {
        match self {
            Target::GgufHeader => HEADER_MEMORY_PER_BYTE,
            Target::GgufModel => 48,
            Target::GgufTokenizer => 40,
            Target::HfConfig | Target::Safetensors | Target::TokenizerJson => 64,
            Target::PackCache => 64,
        }
    }

    /// Runs the target on a case folder; errors are fine, only panics and memory count.
    fn run(self, dir: &Path) {
        let file = dir.join(self.file());
        match self {
            Target::GgufHeader => {
                if let Ok(f) = GgufFile::open(&file) {
                    let _ = f.summary();
                    for (key, _) in f.metadata() {
                        let _ = f.get_str(key);
                        let _ = f.get_u32(key);
                        let _ = f.get_u64(key);
                        let _ = f.get_f32(key);
                        let _ = f.get_bool(key);
                        let _ = f.get_string_array(key);
                        let _ = f.get_f32_array(key);
                        let _ = f.get_i32_array(key);
                    }
                    for t in f.tensors() {
                        let _ = f.tensor_bytes(t);
                        let _ = t.shape_row_major();
                    }
                }
            }
            Target::GgufModel => {
                if let Ok((config, _weights, meta, _)) = load_gguf(&file) {
                    let _ = kwk::model::cost::matmul_params_per_token(&config);
                    let _ = kwk::model::cost::prompt_ops_per_token(&config, 512);
                    let _ = kwk::model::cost::kv_bytes_per_token(&config, 4.0, 0, 128);
                    exercise(Tokenizer::from_gguf(&meta));
                }
            }
            Target::GgufTokenizer => {
                if let Ok(f) = GgufFile::open(&file) {
                    if let Ok(meta) = tokenizer_metadata_from_gguf(&f) {
                        exercise(Tokenizer::from_gguf(&meta));
                    }
                }
            }
            Target::HfConfig => {
                let _ = ModelConfig::from_hf_config_json(&file);
            }
            Target::Safetensors => {
                let _ = load_hf_folder(dir);
            }
            Target::TokenizerJson => exercise(Tokenizer::from_hf_folder(dir)),
            Target::PackCache => warm_start(dir, &file),
        }
    }
}

/// Places the case's pack file where the cache looks for its source model's entry, lists
/// the folder, and starts a decoder from it (running three tokens when it loads).
fn warm_start(dir: &Path, file: &Path) {
    let Ok(meta) = std::fs::read_to_string(dir.join("source.txt")) else {
        return;
    };
    let Some((precision, source)) = meta.split_once('\n') else {
        return;
    };
    let (Ok(precision), source) = (Precision::parse(precision), Path::new(source)) else {
        return;
    };
    let Ok(config) = ModelConfig::from_hf_config_json(&source.join("config.json")) else {
        return;
    };
    let cache = dir.join("cache");
    let _ = std::fs::create_dir_all(&cache);
    let Ok(id) = kwk::pack_cache::source_identity(source) else {
        return;
    };
    if std::fs::copy(file, kwk::pack_cache::cache_file(&cache, &id)).is_err() {
        return;
    }
    let _ = kwk::pack_cache::list(&cache);
    let options = DecoderOptions {
        max_cache_len: 8,
        precision,
        kv: Default::default(),
        threads: 1,
        calibration_tokens: None,
        pack_cache_dir: Some(cache),
    };
    if let Ok(Some(mut d)) = KwkDecoder::from_pack_cache(&config, vec![], source, options) {
        let _ = d.forward(&[1, 2, 3], 0);
    }
}

fn exercise(t: kwk::Result<Tokenizer>) {
    let Ok(t) = t else { return };
    if let Ok(ids) = t.encode(TEXT, true) {
        let _ = t.decode(&ids);
        let mut stream = kwk::tokenizer::StreamDecoder::new();
        for &id in &ids {
            let _ = stream.push(&t, id);
        }
        let _ = stream.finish();
    }
    let n = t.vocab_size() as u32;
    for id in [0u32, 1, 2, n.saturating_sub(1), n, u32::MAX] {
        let _ = t.token_to_bytes(id);
    }
}

// ---------------------------------------------------------------------------------------
// Seeds and the driver

struct Seed {
    /// The fixture folder the companions come from.
    dir: PathBuf,
    bytes: Vec<u8>,
}

fn fixture_seeds(target: Target) -> Vec<Seed> {
    if target == Target::PackCache {
        return pack_seeds();
    }
    ["tiny-llama", "tiny-qwen2", "tiny-mixtral"]
        .iter()
        .map(|name| {
            let dir = kwk_fixtures::model_dir(name);
            let path = dir.join(target.file());
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Seed { dir, bytes }
        })
        .collect()
}

/// Real pack files: the decoder packs two fixture models (dense and mixture-of-experts) in
/// int8 and int4 into a scratch cache (a cold start writes the file), and each file is a
/// seed whose `source.txt` names the model folder and the precision.
fn pack_seeds() -> Vec<Seed> {
    let root = std::env::temp_dir()
        .join(format!("kwk-fuzz-{}", std::process::id()))
        .join("pack-seeds");
    let mut seeds = Vec::new();
    for name in ["tiny-llama", "tiny-mixtral"] {
        let source = kwk_fixtures::model_dir(name);
        let (config, weights, _) = load_hf_folder(&source).unwrap();
        for precision in ["int8", "int4"] {
            let dir = root.join(format!("{name}-{precision}"));
            // Fresh each call: a cache left by an earlier call would load, not write.
            let _ = std::fs::remove_dir_all(&dir);
            let cache = dir.join("cache");
            std::fs::create_dir_all(&cache).unwrap();
            let d = KwkDecoder::from_weights(
                &config,
                &weights,
                vec![],
                &source,
                DecoderOptions {
                    max_cache_len: 8,
                    precision: Precision::parse(precision).unwrap(),
                    kv: Default::default(),
                    threads: 1,
                    calibration_tokens: None,
                    pack_cache_dir: Some(cache),
                },
            )
            .unwrap();
            let path = match d.pack_cache_outcome() {
                Some(kwk::pack_cache::PackOutcome::Written(p)) => p.clone(),
                other => panic!("{name} {precision}: no pack file written: {other:?}"),
            };
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[..8], b"KWKPACK\0");
            assert_eq!(
                u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
                PACK_VERSION
            );
            std::fs::write(
                dir.join("source.txt"),
                format!("{precision}\n{}", source.display()),
            )
            .unwrap();
            seeds.push(Seed { dir, bytes });
        }
    }
    seeds
}

/// The headers of the SmolLM2 GGUFs set up by scripts/setup-model.sh, with the tensor
/// count set to 0: real vocabularies as GGUFs without tensors. Empty when absent.
fn smollm2_header_seeds() -> Vec<Seed> {
    let Some(models) = kwk::paths::default_models_dir() else {
        return Vec::new();
    };
    let dir = models.join("SmolLM2-135M-Instruct");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    paths.sort();
    let mut seeds = Vec::new();
    for path in paths.into_iter().take(2) {
        let Ok(f) = GgufFile::open(&path) else {
            continue;
        };
        let end = f.data_offset() as usize;
        let Ok(all) = std::fs::read(&path) else {
            continue;
        };
        let mut bytes = all[..end].to_vec();
        bytes[8..16].copy_from_slice(&0u64.to_le_bytes());
        seeds.push(Seed {
            dir: dir.clone(),
            bytes,
        });
    }
    seeds
}

#[derive(Default, Debug)]
struct Stats {
    cases: u64,
    seconds: f64,
    worst_ratio: f64,
    failures: Vec<String>,
}

/// A scratch folder per run, printed so that the case of an abort can be found.
fn scratch(target: Target) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("kwk-fuzz-{}", std::process::id()))
        .join(target.name());
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn silence_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::env::var_os("KWK_FUZZ_SHOW_PANICS").is_some() {
                default(info);
            }
        }));
    });
}

/// Writes a failing case where it can be kept and returns its path.
fn keep(target: Target, case: u64, dir: &Path) -> PathBuf {
    let out = std::env::temp_dir().join("kwk-fuzz-crashes");
    std::fs::create_dir_all(&out).unwrap();
    let dest = out.join(format!("{}-{case}-{}", target.name(), target.file()));
    std::fs::copy(dir.join(target.file()), &dest).unwrap();
    dest
}

/// Runs one case folder through `target`, checking the invariants: `Ok` holds the peak heap
/// per input byte, `Err` says what went wrong.
fn check(target: Target, dir: &Path) -> Result<f64, String> {
    let input: u64 = std::iter::once(target.file())
        .chain(target.companions().iter().copied())
        .map(|f| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0))
        .sum();
    let (result, peak) =
        peak_during(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.run(dir))));
    if let Err(payload) = result {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".into());
        return Err(format!("panicked: {msg}"));
    }
    let allowed = target.factor() as u64 * input + (16 << 20);
    if peak as u64 > allowed {
        return Err(format!(
            "allocated {peak} bytes at peak for {input} bytes of input (allowed {allowed})"
        ));
    }
    // The ratio is reported for inputs of 64 KiB or more only: below that the fixed costs
    // (the 16 MiB constant's share) dominate it.
    Ok(if input >= 64 << 10 {
        peak as f64 / input as f64
    } else {
        0.0
    })
}

fn fuzz(target: Target, seeds: &[Seed], seed: u64, budget: Budget) -> Stats {
    silence_panics();
    let dir = scratch(target);
    let seed_bytes: Vec<Vec<u8>> = seeds.iter().map(|s| s.bytes.clone()).collect();
    let mut rng = Rng(seed ^ (target as u64).wrapping_mul(0x1234_5678_9abc_def1));
    let mut stats = Stats::default();
    let start = Instant::now();
    // Warm-up on the unmutated seeds (thread pools, lazily built tables), unmeasured.
    for s in seeds {
        std::fs::write(dir.join(target.file()), &s.bytes).unwrap();
        target.run(&dir);
    }
    let mut companions_from: Option<PathBuf> = None;
    loop {
        match budget {
            Budget::Cases(n) if stats.cases >= n => break,
            Budget::Time(t) if start.elapsed() >= t => break,
            _ => {}
        }
        let s = rng.pick(seeds);
        if companions_from.as_deref() != Some(&s.dir) {
            for c in target.companions() {
                std::fs::copy(s.dir.join(c), dir.join(c)).unwrap();
            }
            companions_from = Some(s.dir.clone());
        }
        let mut bytes = s.bytes.clone();
        mutate(&mut rng, &mut bytes, target.format(), &seed_bytes);
        std::fs::write(dir.join(target.file()), &bytes).unwrap();
        match check(target, &dir) {
            Ok(ratio) => stats.worst_ratio = stats.worst_ratio.max(ratio),
            Err(why) => {
                let kept = keep(target, stats.cases, &dir);
                let msg = format!(
                    "{} case {} (seed {seed}): {why}; input kept at {}",
                    target.name(),
                    stats.cases,
                    kept.display()
                );
                // The slice stops at the first failure; the long run records it and goes
                // on (the test fails at the end, listing every kept input).
                match budget {
                    Budget::Cases(_) => panic!("{msg}"),
                    Budget::Time(_) => {
                        println!("FAILURE {msg}");
                        stats.failures.push(msg);
                    }
                }
            }
        }
        stats.cases += 1;
    }
    stats.seconds = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    stats
}

#[derive(Clone, Copy)]
enum Budget {
    Cases(u64),
    Time(Duration),
}

fn report(target: Target, stats: &Stats) {
    println!(
        "fuzz {:15} {:8} cases in {:7.1} s = {:7.1} execs/s; worst peak heap/input {:.2} \
         on inputs >= 64 KiB (allowed {} + 16 MiB); {} failures",
        target.name(),
        stats.cases,
        stats.seconds,
        stats.cases as f64 / stats.seconds.max(1e-9),
        stats.worst_ratio,
        target.factor(),
        stats.failures.len()
    );
}

/// The deterministic slice `cargo test` runs: fixed seed, fixture seeds only.
#[test]
fn fuzz_slice_fixed_seed() {
    let _guard = serial();
    for target in TARGETS {
        let cases = match target {
            Target::GgufModel | Target::Safetensors => 400,
            Target::PackCache => 500,
            _ => 600,
        };
        let stats = fuzz(
            target,
            &fixture_seeds(target),
            0x006b_776b,
            Budget::Cases(cases),
        );
        report(target, &stats);
    }
}

/// The long run (see the module docs for the command).
#[test]
#[ignore = "long: KWK_FUZZ_SECONDS per target"]
fn fuzz_long() {
    let _guard = serial();
    let seconds: u64 = std::env::var("KWK_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed: u64 = std::env::var("KWK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(1)
        });
    let only = std::env::var("KWK_FUZZ_TARGETS").ok();
    println!(
        "fuzz seed {seed}, {seconds} s per target, scratch {}",
        std::env::temp_dir()
            .join(format!("kwk-fuzz-{}", std::process::id()))
            .display()
    );
    let mut failures = Vec::new();
    for target in TARGETS {
        if let Some(only) = &only {
            if !only.split(',').any(|t| t.trim() == target.name()) {
                continue;
            }
        }
        let mut seeds = fixture_seeds(target);
        if matches!(target, Target::GgufHeader | Target::GgufTokenizer) {
            seeds.extend(smollm2_header_seeds());
        }
        let stats = fuzz(
            target,
            &seeds,
            seed,
            Budget::Time(Duration::from_secs(seconds)),
        );
        report(target, &stats);
        failures.extend(stats.failures);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Crafted worst cases for the GGUF header's memory bound

/// A GGUF v3 with `n_tensors` 0 and these raw key-value bytes.
fn gguf_with_kvs(n_kv: u64, kvs: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b.extend(kvs);
    b
}

fn kv_header(key: &str, ty: u32) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend(key.as_bytes());
    b.extend(ty.to_le_bytes());
    b
}

/// Peak heap of opening `bytes` as a GGUF, and whether it opened.
fn open_peak(bytes: &[u8]) -> (bool, usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crafted.gguf");
    std::fs::write(&path, bytes).unwrap();
    let (res, peak) = peak_during(|| GgufFile::open(&path).map(drop));
    if let Err(e) = &res {
        println!("crafted file: {e}");
    }
    (res.is_ok(), peak)
}

#[test]
fn crafted_headers_stay_within_the_stated_memory_bound() {
    let _guard = serial();
    let n = 200_000usize;
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // Many empty keys holding one byte each (the smallest key-value pair: 13 bytes).
    let mut kvs = Vec::new();
    for i in 0..n {
        // Keys must differ; 3 bytes of key keep the pairs small.
        let key = [
            (i % 94 + 33) as u8,
            (i / 94 % 94 + 33) as u8,
            (i / 8836 + 33) as u8,
        ];
        kvs.extend((3u64).to_le_bytes());
        kvs.extend(key);
        kvs.extend(0u32.to_le_bytes());
        kvs.push(7);
    }
    cases.push(("scalar keys", gguf_with_kvs(n as u64, &kvs)));
    // One array of many empty strings (8 bytes each on disk).
    let mut kv = kv_header("s", 9);
    kv.extend(8u32.to_le_bytes());
    kv.extend((n as u64 * 4).to_le_bytes());
    for _ in 0..n * 4 {
        kv.extend(0u64.to_le_bytes());
    }
    cases.push(("empty strings", gguf_with_kvs(1, &kv)));
    // One array of many empty arrays (12 bytes each).
    let mut kv = kv_header("a", 9);
    kv.extend(9u32.to_le_bytes());
    kv.extend((n as u64 * 2).to_le_bytes());
    for _ in 0..n * 2 {
        kv.extend(0u32.to_le_bytes());
        kv.extend(0u64.to_le_bytes());
    }
    cases.push(("empty nested arrays", gguf_with_kvs(1, &kv)));
    // A u8 array of 4 MiB (1 byte each).
    let mut kv = kv_header("u", 9);
    kv.extend(0u32.to_le_bytes());
    kv.extend((4u64 << 20).to_le_bytes());
    kv.extend(vec![1u8; 4 << 20]);
    cases.push(("u8 array", gguf_with_kvs(1, &kv)));
    // Many tensors of no elements (names must differ: 3 bytes each).
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((n as u64).to_le_bytes());
    b.extend(0u64.to_le_bytes());
    for i in 0..n {
        let name = [
            (i % 94 + 33) as u8,
            (i / 94 % 94 + 33) as u8,
            (i / 8836 + 33) as u8,
        ];
        b.extend(3u64.to_le_bytes());
        b.extend(name);
        b.extend(1u32.to_le_bytes());
        b.extend(0u64.to_le_bytes()); // one dimension of 0 elements
        b.extend(0u32.to_le_bytes()); // F32
        b.extend(0u64.to_le_bytes()); // offset 0: every tensor is empty
    }
    b.resize(b.len().div_ceil(32) * 32, 0); // the (empty) data section starts aligned
    cases.push(("empty tensors", b));
    for (what, bytes) in &cases {
        let (ok, peak) = open_peak(bytes);
        assert!(ok, "{what}: the crafted file should open");
        let ratio = peak as f64 / bytes.len() as f64;
        println!(
            "{what}: {} bytes, peak heap {peak} ({ratio:.2} per byte)",
            bytes.len()
        );
        assert!(
            peak <= HEADER_MEMORY_PER_BYTE * bytes.len() + (64 << 10),
            "{what}: {peak} bytes of heap for a {}-byte header",
            bytes.len()
        );
    }
    // Claimed counts far beyond the file allocate nothing big before failing.
    let mut kv = kv_header("u", 9);
    kv.extend(0u32.to_le_bytes());
    kv.extend((1u64 << 40).to_le_bytes());
    let (ok, peak) = open_peak(&gguf_with_kvs(1, &kv));
    assert!(!ok);
    assert!(peak < 64 << 10, "{peak}");
}

// ---------------------------------------------------------------------------------------
// Regression tests: every crash the fuzzer finds goes here, as the input that caused it
// (a constructed byte vector or a small committed file). The runs of 2026-12-01 (six
// targets, 10 minutes each, 845,263 cases, then 150 s each on the final build, 223,387
// cases; and, on the loaders of commit c63d25c, the six other than `pack_cache` 10 minutes
// each again, 2,573,586 cases: gguf_header 87, gguf_model 433, gguf_tokenizer 36,
// hf_config 2,515, safetensors 450, tokenizer_json 769 executions/s, one core while the
// other ran other jobs) found no panic and no allocation over the bounds; the crafted
// inputs above and in docs/bad-inputs.md cover the cases fixed before fuzzing. The `pack_cache` target's
// first slice found one crash and its first 10-minute run a second (both below).

/// `pack_cache` case 24 of the first slice (seed 7042923): a tensor entry whose `rows`
/// (or `cols`) is near 2^64 overflowed `tiles × tile bytes` in `LowBitWeights::from_parts`
/// (and would have in `Int8Weights::from_parts`); a float vector's `count` near 2^62
/// overflowed `count × 4` in the index check. Every such entry, in each real pack seed,
/// re-sealed with valid hash and CRCs, must now be refused without a panic.
#[test]
fn pack_index_sizes_near_2_64_are_refused_not_overflowed() {
    let _guard = serial();
    silence_panics();
    let seeds = pack_seeds();
    let dir = scratch(Target::PackCache);
    for seed in &seeds {
        std::fs::copy(seed.dir.join("source.txt"), dir.join("source.txt")).unwrap();
        let n = seed.bytes.len();
        let t = n - PACK_TRAILER;
        let off = u64::from_le_bytes(seed.bytes[t + 8..t + 16].try_into().unwrap()) as usize;
        let index: serde_json::Value = serde_json::from_slice(&seed.bytes[off..t]).unwrap();
        let edits: [(&str, &str, u64); 6] = [
            ("tensors", "rows", u64::MAX),
            ("tensors", "cols", u64::MAX - 31),
            ("tensors", "rows", 1 << 62),
            ("floats", "count", u64::MAX / 2),
            // Long run of 2026-12-01 (seed 1796102964, case 4148 and 9 more): an array
            // offset before its tensor's bytes underflowed `a - e.offset` when a changed
            // source identity (same contents) made the cache copy the entry to a new file.
            ("arrays", "offset", 0),
            // A code width no layout has (the file stores it as a number): refused by
            // name at the file boundary.
            ("tensors", "bits", 7),
        ];
        for (list, key, value) in edits {
            let mut v = index.clone();
            if list == "arrays" {
                // The stats differ, the contents hash the same: the rewrite path.
                v["source"]["files"][0]["mtime_ns"] = 1.into();
            }
            for s in v["sections"].as_array_mut().unwrap() {
                if list == "arrays" {
                    for e in s["tensors"].as_array_mut().unwrap() {
                        e["arrays"][0][0] = value.into();
                    }
                    continue;
                }
                for e in s[list].as_array_mut().unwrap() {
                    e[key] = value.into();
                }
            }
            let body = &seed.bytes[..off];
            let mut bytes = body.to_vec();
            let mut idx = v;
            fix_crcs(&mut idx, body);
            let idx = serde_json::to_vec(&idx).unwrap();
            use sha2::Digest;
            let hash = sha2::Sha256::digest(&idx);
            bytes.extend_from_slice(&idx);
            bytes.extend_from_slice(b"KWKINDEX");
            bytes.extend_from_slice(&(off as u64).to_le_bytes());
            bytes.extend_from_slice(&(idx.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&hash);
            std::fs::write(dir.join(Target::PackCache.file()), &bytes).unwrap();
            if let Err(why) = check(Target::PackCache, &dir) {
                panic!("{list}.{key} = {value}: {why}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
