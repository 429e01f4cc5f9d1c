"""GGUF files read and written with numpy alone (no `gguf` package): the header, the typed
key/value metadata (kept in order with each value's GGUF type, so a file is re-written byte
for byte), the tensor table and float32 tensor data (memory-mapped when read).

Format facts from llama.cpp's ggml/include/gguf.h and docs/gguf.md (GGUF v2/v3, little
endian): magic "GGUF", u32 version, u64 tensor count, u64 key/value count; each key a u64
length-prefixed UTF-8 string, a u32 value type, the value (arrays: u32 element type, u64
count, elements); each tensor info a name, u32 n_dims, u64 ne[0..n_dims) (ne[0] the
contiguous dimension), u32 ggml type, u64 offset into the data section; the data section
starts at the next multiple of general.alignment (default 32), each tensor aligned too.
"""
import os
import struct

import numpy as np

# GGUF value types (gguf.h, enum gguf_type).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {
    U8: "<u1",
    I8: "<i1",
    U16: "<u2",
    I16: "<i2",
    U32: "<u4",
    I32: "<i4",
    F32: "<f4",
    BOOL: "<u1",
    U64: "<u8",
    I64: "<i8",
    F64: "<f8",
}
GGML_F32 = 0
DEFAULT_ALIGNMENT = 32


class GGUFError(Exception):
    pass


class _Cursor:
    def __init__(self, buf, path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated at byte {self.pos} (needs {n} more)")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return bytes(self.take(self.u64())).decode("utf-8")

    def scalar(self, vtype):
        dt = np.dtype(_SCALAR[vtype])
        v = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0]
        if vtype == BOOL:
            return bool(v)
        return float(v) if vtype in (F32, F64) else int(v)

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype = self.u32()
            n = self.u64()
            if etype == STRING:
                return (etype, [self.string() for _ in range(n)])
            if etype not in _SCALAR:
                raise GGUFError(f"{self.path}: array of unsupported type {etype}")
            dt = np.dtype(_SCALAR[etype])
            return (etype, np.frombuffer(self.take(n * dt.itemsize), dtype=dt).copy())
        if vtype not in _SCALAR:
            raise GGUFError(f"{self.path}: unknown value type {vtype}")
        return self.scalar(vtype)


class GGUF:
    """A GGUF file: `meta` maps key -> (type, value) in file order (arrays as (type,
    (element type, list of str | numpy array))); `tensors` maps name -> (ggml type, numpy
    shape with the contiguous dimension last, absolute byte offset); `array(name)` gives a
    float32 tensor as a read-only memory map."""

    def __init__(self, path):
        self.path = path
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")
        c = _Cursor(self._mm, path)
        if bytes(c.take(4)) != b"GGUF":
            raise GGUFError(f"{path}: not a GGUF file (no GGUF magic)")
        self.version = c.u32()
        if self.version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {self.version}; versions 2 and 3 are read")
        n_tensors = c.u64()
        n_kv = c.u64()
        self.meta = {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.u32()
            self.meta[key] = (vtype, c.value(vtype))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.u32()
            ne = [c.u64() for _ in range(n_dims)]
            ttype = c.u32()
            off = c.u64()
            infos.append((name, ttype, tuple(reversed(ne)), off))
        self.alignment = int(self.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = c.pos + (-c.pos) % self.alignment
        self.tensors = {n: (t, shape, data_start + off) for n, t, shape, off in infos}
        self.order = [n for n, _, _, _ in infos]

    def get(self, key, default=None):
        if key not in self.meta:
            return default
        vtype, v = self.meta[key]
        return v[1] if vtype == ARRAY else v

    def array(self, name):
        ttype, shape, off = self.tensors[name]
        if ttype != GGML_F32:
            raise GGUFError(f"{self.path}: tensor {name} has ggml type {ttype}, not F32")
        n = int(np.prod(shape))
        if off + 4 * n > len(self._mm):
            raise GGUFError(f"{self.path}: tensor {name} runs past the end of the file")
        return np.frombuffer(self._mm, dtype="<f4", count=n, offset=off).reshape(shape)


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == STRING:
        return _string(v)
    if vtype == ARRAY:
        etype, items = v
        out = struct.pack("<IQ", etype, len(items))
        if etype == STRING:
            return out + b"".join(_string(s) for s in items)
        return out + np.asarray(items, dtype=_SCALAR[etype]).tobytes()
    return np.asarray(v, dtype=_SCALAR[vtype]).tobytes()


def write(path, meta, shapes, tensors, version=3, alignment=DEFAULT_ALIGNMENT):
    """Writes a GGUF: `meta` as in GGUF.meta (key -> (type, value), order kept), `shapes` an
    ordered dict name -> numpy shape of the float32 tensors, `tensors` an iterator of (name,
    float32 array) in that order (streamed, so a large model is never held twice)."""
    names = list(shapes)

    def pad(n):
        return (alignment - n % alignment) % alignment

    head = bytearray(b"GGUF")
    head += struct.pack("<IQQ", version, len(names), len(meta))
    for key, (vtype, v) in meta.items():
        head += _string(key) + struct.pack("<I", vtype) + _value(vtype, v)
    offset = 0
    offsets = {}
    for n in names:
        shape = shapes[n]
        head += _string(n) + struct.pack("<I", len(shape))
        for dim in reversed(shape):
            head += struct.pack("<Q", int(dim))
        head += struct.pack("<IQ", GGML_F32, offset)
        offsets[n] = offset
        nbytes = int(np.prod(shape)) * 4
        offset += nbytes + pad(nbytes)
    head += b"\0" * pad(len(head))
    with open(path, "wb") as f:
        f.write(head)
        for n, a in tensors:
            if tuple(a.shape) != tuple(shapes[n]) or a.dtype != np.float32:
                raise AssertionError(f"{n}: {a.dtype} {a.shape}, expected float32 {shapes[n]}")
            if f.tell() != len(head) + offsets[n]:
                raise AssertionError(f"{n}: written out of order")
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
            f.write(b"\0" * pad(a.nbytes))
        f.flush()
        os.fsync(f.fileno())
