//! The pack cache: int8/int4 weights packed once are kept in `pack_cache_dir`, and the next
//! start maps them from there instead of reading the model and quantizing again.
//!
//! **One file per model** (`kwk-pack-<sha256(canonical source path)[..12]>.kwkpack`), holding one
//! section per recipe packed for it. A warm start ([`try_load`]) reads only that file: the
//! source is identified by `stat` alone and never read, and every packed array is
//! memory-mapped in the layout the kernels use (each array starts on a 64-byte boundary),
//! not copied.
//!
//! **Identity.** The source is its canonical path (symlinks resolved; a hub model resolves
//! to its snapshot folder `models--ORG--NAME/snapshots/COMMIT`, so repo id and commit are
//! both in it) and, per weight/config file, size, mtime, ctime, inode and device. When they
//! all match the index, the file is used as is (fast path). On any difference the files are
//! hashed (SHA-256 in 64 MiB chunks on all threads, about 1 s per GB on two threads): same
//! contents → the index's stats are refreshed and the file used; different contents → the
//! model is read and every tensor whose key is unchanged is reused, the others packed again.
//! A model held in memory (a `transformers` object, no files) is named by the SHA-256 of its
//! config and tensors ([`memory_source`], `kwk-memory:HASH`, about 1 s per GB of weights on
//! two threads): that name is its whole identity, a changed tensor gives a new name (the old
//! file is then left to the size limit, as no file can say it is gone).
//!
//! **Key of a packed tensor** (`dep`): SHA-256 of the recipe ([`recipe_key`]: layout version
//! [`PACK_VERSION`], format with all its options, calibration-text hash), the tensor's
//! place, its grid, its per-column importance, the float32 values it was quantized from
//! (after channel equalization), and the ggml type of the GGUF blocks it was loaded from
//! (a tensor those blocks hold exactly is copied from them, `format::source_grid`). Equal keys mean the packing would write the same bytes,
//! so a tensor changed at the same size and mtime is repacked and the rest reused (a tensor
//! GPTQ rounded depends on its input's Hessian too, which the key does not hold: such
//! tensors are always written anew, never reused). Bump
//! [`PACK_VERSION`] whenever a packed layout or the rounding changes: the test
//! `layout_golden_hash_pins_pack_version` fails until you do.
//!
//! **File layout.** A 64-byte header (`KWKPACK\0`, version u32), the arrays (each padded
//! to 64 bytes), a JSON index (source identity, file hashes, sections: per tensor its name,
//! layout, shape, key, array offsets, CRC-32 of its bytes; per float vector the same), and
//! a trailer: `KWKINDEX`, index offset u64, index length u64, SHA-256 of the index. Little
//! endian. **Integrity**: the index by its SHA-256; each tensor of the section being loaded
//! by its CRC-32 (hardware CRC, about 0.1 s per GB; it also faults the pages in, which the
//! first token would do anyway). A file failing any check is deleted at once and rewritten
//! by the same run (never warned about twice).
//!
//! **Directory.** kwk touches only the files its own naming scheme made: every file it
//! writes starts with `kwk-pack-` (packs `kwk-pack-HEX.kwkpack`, locks `kwk-pack-HEX.lock`,
//! temporaries `.kwk-pack-HEX.kwkpack.tmp.PID.N`), and a folder kwk created (or found empty
//! or holding only kwk's files) gets the marker file [`MARKER`]. Packs of the older naming
//! scheme (`HEX.kwkpack`, `.HEX.kwkpack.tmp.PID.N`, `HEX.lock`) are recognised by that exact
//! pattern *and* by their contents (the `KWKPACK` magic; a lock or an unflushed temporary
//! is empty), and a pack of the old name is renamed to the new one when its model is used.
//! Any other file (`Cargo.lock`, `.notes.tmp.999999`) is never deleted; [`clear`] refuses a
//! folder without the marker that holds such files. Writes go to the temporary name and
//! are renamed into place when complete (a failed write removes its temporary file).
//! Packers of one model serialise on its lock (`flock`): the second one waiting finds the
//! first one's file and loads it. Last use is the file's mtime (set on every hit).
//!
//! **Limit.** `KWK_PACK_CACHE_GB` (default 16). After each write and each hit the folder is
//! swept (temporary files of dead processes, files of older layouts, files whose source no
//! longer exists) and least recently used files are deleted until the total is at or
//! under the limit. A pack larger than the whole limit is used for the run and not kept
//! ([`PackOutcome::NotKept`]): its writing stops at the limit (the bytes are counted, not
//! written), and a cached one is deleted after it was mapped. The library prints none of
//! this; the caller reports the outcome. [`list`], [`prune`] and [`clear`] back
//! `kwk-eval cache`.

mod dir;
mod file;
mod key;
mod session;

pub use dir::{clear, limit_bytes, list, prune, CacheEntryInfo, PruneReport};
pub use key::{
    cache_file, memory_source, recipe_key, source_identity, FileStat, SourceIdentity,
    MEMORY_SOURCE_PREFIX,
};
pub use session::{try_load, CachedModel, PackOutcome, PackSession, TensorToPack};

/// Version of the packed layouts, the rounding and this file format; part of every key
/// (4: two-level low-bit scales; 5: Gemma 3's post norms stored with each layer's float
/// vectors, so an older Gemma 3 entry, which lacks them, is never found; 6: tensors whose
/// GGUF source blocks a layout holds exactly are copied, not rounded, and entries say so;
/// 7: Q4_0/Q4_1/Q5_0/Q5_1 sources near copied with fitted scales, entries marked; 8: the
/// low-bit mix chooses `lm_head`'s grid on its ladder from 6 bits whatever `mix_bits`, so
/// a `:mix8` pack (int4's default on rows not a multiple of 256) is planned anew).
pub const PACK_VERSION: u32 = 8;
/// Every file kwk writes in the cache folder starts with this.
pub const PREFIX: &str = "kwk-pack-";
/// The marker file of a folder kwk created (see the module doc).
pub const MARKER: &str = "KWK-PACK-CACHE";
/// Default size limit of the cache folder, in GB (`KWK_PACK_CACHE_GB`).
pub const DEFAULT_LIMIT_GB: f64 = 16.0;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
