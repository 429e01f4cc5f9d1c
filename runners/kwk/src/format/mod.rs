//! Weight formats: the GGUF block types kwk can read (`ggml_blocks`) and the formats the
//! decoder runs in (float32, bf16, int8, int4).
