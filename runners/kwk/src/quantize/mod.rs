//! Quantization: rounding weights onto the packed grids (`rounding`), function-preserving
//! channel equalization with estimated or calibrated activation statistics (`equalize`),
//! the int4 mix by sensitivity under a size budget (`mix`), the `bpw:X` allocation of a
//! bits-per-weight budget over every tensor (`budget`), and GPTQ error-compensated
//! rounding with the calibration inputs' Hessian (`gptq`).

pub mod budget;
pub mod equalize;
pub mod gptq;
pub mod mix;
pub mod rounding;

#[cfg(test)]
mod fixture_tests;
