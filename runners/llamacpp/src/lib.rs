//! llamacpp: finds llama.cpp's command-line tools (llama-perplexity, llama-bench,
//! llama-quantize, llama-tokenize), runs them defensively (pinned flags, cleared
//! `LLAMA_ARG_*`, timeouts, stderr tail kept) and parses what they print. Knows nothing of
//! the harness.
