//! Loading a Hugging Face folder (config.json + safetensors).
