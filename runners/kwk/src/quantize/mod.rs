//! Quantization: rounding weights to int8/int4 grids, activation-aware scales, GPTQ.
