//! Compute kernels. `scalar.rs` is the specification; `x86_64/` holds the AVX2 and AVX-512
//! versions (the only `unsafe` in the crate), chosen once at run time (`KWK_ISA` forces one).

pub mod int4_matmul;
pub mod int8_matmul;
pub mod q8_activations;

/// A row-major `[n_tokens][ld]` float32 output that worker threads fill in disjoint column
/// ranges (each thread owns a slice of the weight rows, i.e. of the output columns).
pub struct OutputMatrix {
    ptr: *mut f32,
    n_tokens: usize,
    ld: usize,
}

// SAFETY: threads only write through `OutputMatrix::write_cols`, whose contract is that
// concurrent callers use disjoint column ranges, so no element is written by two threads.
unsafe impl Sync for OutputMatrix {}
unsafe impl Send for OutputMatrix {}

impl OutputMatrix {
    /// Wraps `out` (length at least `n_tokens * ld`). The borrow ends when the caller stops
    /// using the matrix; callers keep `out` alive and untouched while threads write.
    pub fn new(out: &mut [f32], n_tokens: usize, ld: usize) -> Self {
        assert!(out.len() >= n_tokens * ld, "output buffer too small");
        OutputMatrix {
            ptr: out.as_mut_ptr(),
            n_tokens,
            ld,
        }
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn ld(&self) -> usize {
        self.ld
    }

    /// Writes `values` to token `t`, columns `col..col + values.len()`.
    ///
    /// Callers running concurrently must write disjoint column ranges.
    pub fn write_cols(&self, t: usize, col: usize, values: &[f32]) {
        assert!(t < self.n_tokens && col + values.len() <= self.ld);
        // SAFETY: in bounds by the assert; disjointness between threads is the caller's
        // contract documented above, so this is the only writer of these elements.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                self.ptr.add(t * self.ld + col),
                values.len(),
            );
        }
    }
}
