//! llama.cpp as a [`super::Runner`], one runner per GGUF file.
