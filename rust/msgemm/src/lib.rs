//! msGeMM: low-bit GEMM through look-up tables (Maleki, arXiv:2310.06178).
//!
//! `Y = Wd @ X` for weights `Wd = s * (v[q] - z)` stored as low-bit codes `q`: phase 1 builds,
//! once per column of X and tuple of `d` consecutive inputs, a table of all `V^d` sums
//! `sum_j v[c_j] x_j`; phase 2 adds, for every row, one table entry per tuple (indexed by the
//! row's `d` codes) instead of `d` multiply-adds. The tables depend only on X and serve all M
//! rows, which is where the saving comes from (spec `shared/specs/msgemm.md`).
//!
//! Modules: [`format`] (codebooks, packings), [`quantize`] (RTN, min-max, nearest level, MX),
//! [`packed`] (the weight object), [`layout`] (kernel tile layout), [`plan`] (per-call
//! settings), [`table`] (phase 1), [`kernels`] (phase 2, runtime dispatch), [`gemm`]
//! (driver), [`count`] (operation-count model and instrumented reference), [`interop`]
//! (GPTQ/AWQ and ONNX Runtime MatMulNBits loaders), [`aligned`] (cache-line aligned buffers),
//! [`fused`] (the fused dequantize GEMV the benchmark compares against), [`dense`] (the
//! `i16` mode's dense int8 path: AVX-512 VNNI, AVX2, Arm64 `sdot`), [`bf16`] (the `bf16`
//! mode: bfloat16 weights and activations on AMX tiles), [`float8`] (`f32` calls of fp8
//! weights: codes decoded in registers, no tables).

pub mod aligned;
pub mod bf16;
pub mod count;
pub mod dense;
pub mod float8;
pub mod format;
pub mod fused;
pub mod gemm;
pub mod interop;
pub mod kernels;
pub mod layout;
pub mod packed;
pub mod plan;
pub mod quantize;
pub mod table;

pub use format::{Codebook, Format};
pub use gemm::{
    gemm, gemm_counted, gemm_into, gemm_into_layout, Depth, GemmOptions, XLayout, YLayout,
};
pub use kernels::Backend;
pub use packed::PackedWeights;
pub use plan::{Plan, TablePrecision};
pub use quantize::{quantize, QuantizeOptions, ScaleDtype};
