//! Quantization: rounding weights to int8/int4 grids (`rounding`), activation-aware
//! scales from calibration text (`calibrate`), GPTQ (`gptq`).

pub mod rounding;

#[cfg(test)]
mod fixture_tests;
