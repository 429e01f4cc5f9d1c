//! A minimal GGUF writer for tests (here and in the loader's tests): metadata and tensors
//! laid out as llama.cpp's `gguf_write_to_file` does.

use super::*;
use crate::format::ggml_blocks::GgmlType;

pub(crate) struct TestTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(t: GgufValueType) -> u32 {
    use GgufValueType::*;
    match t {
        U8 => 0,
        I8 => 1,
        U16 => 2,
        I16 => 3,
        U32 => 4,
        I32 => 5,
        F32 => 6,
        Bool => 7,
        String => 8,
        Array => 9,
        U64 => 10,
        I64 => 11,
        F64 => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
        GgufValue::Array(a) => {
            out.extend(type_id(a.element_type()).to_le_bytes());
            out.extend((a.len() as u64).to_le_bytes());
            for v in (0..a.len()).filter_map(|i| a.get(i)) {
                put_value(out, &v);
            }
        }
    }
}

/// The bytes of a GGUF v3 file with these metadata pairs and tensors (alignment 32
/// unless `general.alignment` says otherwise).
pub(crate) fn gguf_bytes(metadata: &[(String, GgufValue)], tensors: &[TestTensor]) -> Vec<u8> {
    let alignment = metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| v.as_u64())
        .unwrap_or(32) as usize;
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut out, k);
        out.extend(type_id(v.value_type()).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.ggml_type.0.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset += t.data.len().div_ceil(alignment) * alignment;
    }
    out.resize(out.len().div_ceil(alignment) * alignment, 0);
    for t in tensors {
        out.extend(&t.data);
        out.resize(out.len().div_ceil(alignment) * alignment, 0);
    }
    out
}

pub(crate) fn f32_tensor(name: &str, dims: &[u64], values: &[f32]) -> TestTensor {
    TestTensor {
        name: name.to_string(),
        dims: dims.to_vec(),
        ggml_type: GgmlType::F32,
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}
