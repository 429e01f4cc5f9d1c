//! TEMPORARY, test-only: reads the `tokenizer.ggml.*` keys of a GGUF file into
//! `GgufTokenizerMetadata` until `kwk::gguf` / `kwk::model::gguf_loader` land on main; the
//! tests then switch to the loader. Reads only the header and key-value section (GGUF v2/v3,
//! little-endian; ggml docs/gguf.md).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use kwk::tokenizer::GgufTokenizerMetadata;

#[derive(Debug, Clone)]
enum Value {
    Int(i64),
    UInt(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    Other,
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b).expect("truncated GGUF");
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        let mut b = vec![0u8; n];
        self.0.read_exact(&mut b).expect("truncated GGUF string");
        String::from_utf8(b).expect("GGUF string is UTF-8")
    }
    fn value(&mut self, ty: u32) -> Value {
        match ty {
            0 => Value::UInt(self.bytes::<1>()[0] as u64),
            1 => Value::Int(self.bytes::<1>()[0] as i8 as i64),
            2 => Value::UInt(u16::from_le_bytes(self.bytes()) as u64),
            3 => Value::Int(i16::from_le_bytes(self.bytes()) as i64),
            4 => Value::UInt(self.u32() as u64),
            5 => Value::Int(i32::from_le_bytes(self.bytes()) as i64),
            6 => Value::F32(f32::from_le_bytes(self.bytes())),
            7 => Value::Bool(self.bytes::<1>()[0] != 0),
            8 => Value::Str(self.string()),
            9 => {
                let item_ty = self.u32();
                let n = self.u64();
                Value::Array((0..n).map(|_| self.value(item_ty)).collect())
            }
            10 => Value::UInt(self.u64()),
            11 => Value::Int(i64::from_le_bytes(self.bytes())),
            12 => {
                let _ = f64::from_le_bytes(self.bytes());
                Value::Other
            }
            t => panic!("unknown GGUF value type {t}"),
        }
    }
}

pub fn read(path: &Path) -> GgufTokenizerMetadata {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = Reader(std::io::BufReader::new(file));
    assert_eq!(
        &r.bytes::<4>(),
        b"GGUF",
        "{}: not a GGUF file",
        path.display()
    );
    let _version = r.u32();
    let _n_tensors = r.u64();
    let n_kv = r.u64();
    let mut kv = HashMap::new();
    for _ in 0..n_kv {
        let key = r.string();
        let ty = r.u32();
        let v = r.value(ty);
        kv.insert(key, v);
    }
    let get = |k: &str| kv.get(&format!("tokenizer.ggml.{k}")).cloned();
    let string = |k: &str| match get(k) {
        Some(Value::Str(s)) => Some(s),
        _ => None,
    };
    let id = |k: &str| match get(k) {
        Some(Value::UInt(v)) => Some(v as u32),
        Some(Value::Int(v)) => Some(v as u32),
        _ => None,
    };
    let flag = |k: &str| match get(k) {
        Some(Value::Bool(b)) => Some(b),
        _ => None,
    };
    let strings = |k: &str| match get(k) {
        Some(Value::Array(a)) => Some(
            a.into_iter()
                .map(|v| match v {
                    Value::Str(s) => s,
                    other => panic!("{k}: non-string item {other:?}"),
                })
                .collect::<Vec<_>>(),
        ),
        _ => None,
    };
    GgufTokenizerMetadata {
        model: string("model").unwrap_or_default(),
        pre: string("pre"),
        tokens: strings("tokens").unwrap_or_default(),
        scores: match get("scores") {
            Some(Value::Array(a)) => Some(
                a.into_iter()
                    .map(|v| match v {
                        Value::F32(f) => f,
                        other => panic!("scores: {other:?}"),
                    })
                    .collect(),
            ),
            _ => None,
        },
        token_types: match get("token_type") {
            Some(Value::Array(a)) => Some(
                a.into_iter()
                    .map(|v| match v {
                        Value::Int(i) => i as i32,
                        Value::UInt(u) => u as i32,
                        other => panic!("token_type: {other:?}"),
                    })
                    .collect(),
            ),
            _ => None,
        },
        merges: strings("merges"),
        bos_id: id("bos_token_id"),
        eos_id: id("eos_token_id"),
        unk_id: id("unknown_token_id"),
        pad_id: id("padding_token_id"),
        add_bos: flag("add_bos_token"),
        add_eos: flag("add_eos_token"),
        add_space_prefix: flag("add_space_prefix"),
    }
}
