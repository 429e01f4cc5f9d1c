//! GGUF metadata values: the type tags (`enum gguf_type`), one value, and arrays stored
//! compactly by element type.

/// The type tag of a metadata value (`enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    pub(super) fn from_u32(t: u32) -> Option<GgufValueType> {
        use GgufValueType::*;
        Some(match t {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type occupies (for allocation guards).
    pub(super) fn min_size(self) -> usize {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,    // u64 length
            Array => 4 + 8, // element type + count
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, stored compactly by element type: numbers and bools as typed vectors,
/// strings as one buffer ([`GgufStrings`]), nested arrays (one level) as arrays.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(GgufStrings),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// The strings of a string array: their texts one after another and where each ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufStrings {
    pub(super) text: String,
    pub(super) ends: Vec<usize>,
}

impl GgufStrings {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    /// The strings in order (an exact-size iterator, so collecting allocates once).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }
}

impl<S: AsRef<str>> FromIterator<S> for GgufStrings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut out = GgufStrings::default();
        for s in iter {
            out.text.push_str(s.as_ref());
            out.ends.push(out.text.len());
        }
        out
    }
}

impl GgufArray {
    pub fn element_type(&self) -> GgufValueType {
        use GgufValueType as T;
        match self {
            GgufArray::U8(_) => T::U8,
            GgufArray::I8(_) => T::I8,
            GgufArray::U16(_) => T::U16,
            GgufArray::I16(_) => T::I16,
            GgufArray::U32(_) => T::U32,
            GgufArray::I32(_) => T::I32,
            GgufArray::F32(_) => T::F32,
            GgufArray::Bool(_) => T::Bool,
            GgufArray::String(_) => T::String,
            GgufArray::Array(_) => T::Array,
            GgufArray::U64(_) => T::U64,
            GgufArray::I64(_) => T::I64,
            GgufArray::F64(_) => T::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a value (strings and nested arrays are copied).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        Some(match self {
            GgufArray::U8(v) => GgufValue::U8(*v.get(i)?),
            GgufArray::I8(v) => GgufValue::I8(*v.get(i)?),
            GgufArray::U16(v) => GgufValue::U16(*v.get(i)?),
            GgufArray::I16(v) => GgufValue::I16(*v.get(i)?),
            GgufArray::U32(v) => GgufValue::U32(*v.get(i)?),
            GgufArray::I32(v) => GgufValue::I32(*v.get(i)?),
            GgufArray::F32(v) => GgufValue::F32(*v.get(i)?),
            GgufArray::Bool(v) => GgufValue::Bool(*v.get(i)?),
            GgufArray::String(v) => GgufValue::String(v.get(i)?.to_string()),
            GgufArray::Array(v) => GgufValue::Array(v.get(i)?.clone()),
            GgufArray::U64(v) => GgufValue::U64(*v.get(i)?),
            GgufArray::I64(v) => GgufValue::I64(*v.get(i)?),
            GgufArray::F64(v) => GgufValue::F64(*v.get(i)?),
        })
    }
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Any integer type, if the value is a non-negative integer that fits in a u64.
    /// (Writers differ: `context_length` is u32 in most files, u64 or i32 in some.)
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, if it fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v as i64),
            GgufValue::I16(v) => Some(v as i64),
            GgufValue::I32(v) => Some(v as i64),
            GgufValue::I64(v) => Some(v),
            GgufValue::U8(v) => Some(v as i64),
            GgufValue::U16(v) => Some(v as i64),
            GgufValue::U32(v) => Some(v as i64),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// F32 or F64 (narrowed) values.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}
