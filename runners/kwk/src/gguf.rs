//! The GGUF container: header, metadata, tensor directory, memory-mapped tensor data.
//!
//! SKELETON: lands with the decoder issue.
