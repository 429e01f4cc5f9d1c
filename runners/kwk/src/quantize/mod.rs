//! Quantization: rounding weights onto the packed grids (`rounding`), function-preserving
//! channel equalization with estimated or calibrated activation statistics (`equalize`),
//! and the int4 mix by sensitivity under a size budget (`mix`).

pub mod equalize;
pub mod mix;
pub mod rounding;

#[cfg(test)]
mod fixture_tests;
