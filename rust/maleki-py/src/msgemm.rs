//! `maleki_rs._core.msgemm`: bindings of the msGeMM core (private; the public API is the
//! Python package `maleki_rs.msgemm`, which validates arguments and converts dtypes first).

use std::sync::{Arc, RwLock};

use maleki_common::alloc;
use maleki_common::Result as CoreResult;
use maleki_msgemm::bf16;
use maleki_msgemm::count::{self, compare, formula, CountParams, OpCounts};
use maleki_msgemm::float8;
use maleki_msgemm::gemm::{self as core_gemm, Depth, GemmOptions, XLayout, YLayout};
use maleki_msgemm::interop::{self, NBitsZeros};
use maleki_msgemm::kernels::{self, Backend};
use maleki_msgemm::layout::LayoutKind;
use maleki_msgemm::quantize::{quantize, QuantizeOptions, ScaleDtype};
use maleki_msgemm::{Codebook, Format, PackedWeights, TablePrecision};
use numpy::ndarray::{Array1, Array2};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{borrow_out, slice, Ro1, Ro2, Ro3};
use crate::errors::to_pyerr;
use crate::progress::run_quick;

fn to_array2<T: numpy::Element>(
    py: Python<'_>,
    data: Vec<T>,
    rows: usize,
    cols: usize,
) -> PyResult<Bound<'_, PyArray2<T>>> {
    let a = Array2::from_shape_vec((rows, cols), data)
        .map_err(|e| PyValueError::new_err(format!("internal shape error: {e}")))?;
    Ok(a.into_pyarray(py))
}

/// Runs a `gemm` core call with the GIL released, on the library pool or (`threads`) on a
/// pool of that many threads. Called off every pool, the core runs on this thread and hands
/// work to that pool itself (a GEMV on 1-2 threads runs here and on at most the helper thread
/// of `pool::join_here`: `gemm::gemv_here`); from a worker of some rayon pool (a polars UDF, say) it would run on
/// that pool, so the call is moved onto ours instead.
fn run_gemm<T: Send>(
    py: Python<'_>,
    threads: Option<usize>,
    job: impl FnOnce() -> CoreResult<T> + Send,
) -> PyResult<T> {
    use maleki_common::pool;
    let sized = threads
        .map(pool::sized_pool)
        .transpose()
        .map_err(to_pyerr)?;
    match sized {
        None if !pool::on_a_pool() => py.detach(job).map_err(to_pyerr),
        None => run_quick(py, job),
        Some(p) if !pool::on_a_pool() => py.detach(|| pool::with_pool(p, job)).map_err(to_pyerr),
        Some(p) => py.detach(|| p.install(job)).map_err(to_pyerr),
    }
}

fn codebook_of(format: &str, codebook: Option<Vec<f32>>) -> CoreResult<Codebook> {
    let f = Format::from_name(format)?;
    Codebook::for_format(f, codebook.as_deref())
}

/// Packed low-bit weights (the core object behind `maleki_rs.msgemm.PackedWeights`).
#[pyclass(frozen, module = "maleki_rs._core.msgemm", name = "Packed")]
pub struct Packed {
    /// Swapped for a copy without caches by `clear_cache`; a call holds its own `Arc` for
    /// its whole run, so a swap never pulls the weights from under one.
    inner: RwLock<Arc<PackedWeights>>,
}

impl Packed {
    fn wrap(pw: PackedWeights) -> Packed {
        Packed {
            inner: RwLock::new(Arc::new(pw)),
        }
    }

    /// The current weights (a poisoned lock still holds valid weights: nothing panics while
    /// holding it).
    fn get(&self) -> Arc<PackedWeights> {
        Arc::clone(&self.inner.read().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Scales, zero points (if any) and K permutation (if any), owned.
type GroupData = (Vec<f32>, Option<Vec<f32>>, Option<Vec<u32>>);

/// Owned copies of the scales, zero points and K permutation handed to the core constructors.
fn owned_group_data(
    scales: &Ro2<'_, f32>,
    zeros: Option<&Ro2<'_, f32>>,
    k_perm: Option<&Ro1<'_, u32>>,
) -> PyResult<GroupData> {
    let s = slice(scales, "scales")?.to_vec();
    let z = zeros
        .map(|z| slice(z, "zeros").map(<[f32]>::to_vec))
        .transpose()?;
    let p = k_perm
        .map(|p| slice(p, "k_perm").map(<[u32]>::to_vec))
        .transpose()?;
    Ok((s, z, p))
}

/// Quantizes `w` (M, K) of float32 or float64 (the two `quantize_*` entry points).
fn quantize_array<T: numpy::Element + Copy + Into<f64> + Sync>(
    py: Python<'_>,
    w: Ro2<'_, T>,
    opts: &QuantizeOptions,
) -> PyResult<Packed> {
    let (m, k) = (w.shape()[0], w.shape()[1]);
    let data = slice(&w, "w")?;
    run_quick(py, || quantize(data, m, k, opts)).map(Packed::wrap)
}

#[pymethods]
impl Packed {
    /// Quantizes float32 `w` (M, K).
    #[staticmethod]
    #[pyo3(signature = (w, format, group_size, symmetric, codebook, scale_dtype))]
    fn quantize_f32(
        py: Python<'_>,
        w: Ro2<'_, f32>,
        format: &str,
        group_size: Option<usize>,
        symmetric: Option<bool>,
        codebook: Option<Vec<f32>>,
        scale_dtype: &str,
    ) -> PyResult<Packed> {
        let opts =
            quant_opts(format, group_size, symmetric, codebook, scale_dtype).map_err(to_pyerr)?;
        quantize_array(py, w, &opts)
    }

    /// Quantizes float64 `w` (M, K).
    #[staticmethod]
    #[pyo3(signature = (w, format, group_size, symmetric, codebook, scale_dtype))]
    fn quantize_f64(
        py: Python<'_>,
        w: Ro2<'_, f64>,
        format: &str,
        group_size: Option<usize>,
        symmetric: Option<bool>,
        codebook: Option<Vec<f32>>,
        scale_dtype: &str,
    ) -> PyResult<Packed> {
        let opts =
            quant_opts(format, group_size, symmetric, codebook, scale_dtype).map_err(to_pyerr)?;
        quantize_array(py, w, &opts)
    }

    /// From unpacked codes (M, K) uint8, scales (M, K/G) float32, zeros (M, K/G) or None.
    #[staticmethod]
    #[pyo3(signature = (codes, scales, zeros, format, codebook, k_perm))]
    fn from_codes(
        py: Python<'_>,
        codes: Ro2<'_, u8>,
        scales: Ro2<'_, f32>,
        zeros: Option<Ro2<'_, f32>>,
        format: &str,
        codebook: Option<Vec<f32>>,
        k_perm: Option<Ro1<'_, u32>>,
    ) -> PyResult<Packed> {
        let (m, k) = (codes.shape()[0], codes.shape()[1]);
        let groups = scales.shape()[1];
        if scales.shape()[0] != m || groups == 0 || k % groups != 0 {
            return Err(PyValueError::new_err(format!(
                "scales: expected shape ({m}, K/G) with K/G dividing K = {k}, got {:?}",
                scales.shape()
            )));
        }
        let cb = codebook_of(format, codebook).map_err(to_pyerr)?;
        let c = slice(&codes, "codes")?;
        let (s, z, p) = owned_group_data(&scales, zeros.as_ref(), k_perm.as_ref())?;
        run_quick(py, || {
            PackedWeights::from_codes(cb, m, k, k / groups, c, s, z, p)
        })
        .map(Packed::wrap)
    }

    /// From canonical packed bytes (M, row_bytes) uint8 (the pickled state).
    #[staticmethod]
    #[pyo3(signature = (packed, k, scales, zeros, format, codebook, k_perm))]
    #[allow(clippy::too_many_arguments)] // one argument per field of the pickled state
    fn from_packed(
        py: Python<'_>,
        packed: Ro2<'_, u8>,
        k: usize,
        scales: Ro2<'_, f32>,
        zeros: Option<Ro2<'_, f32>>,
        format: &str,
        codebook: Option<Vec<f32>>,
        k_perm: Option<Ro1<'_, u32>>,
    ) -> PyResult<Packed> {
        let m = packed.shape()[0];
        let groups = scales.shape()[1];
        if groups == 0 || !k.is_multiple_of(groups) {
            return Err(PyValueError::new_err(format!(
                "scales: {groups} groups do not divide K = {k}"
            )));
        }
        let cb = codebook_of(format, codebook).map_err(to_pyerr)?;
        let b =
            alloc::copied_vec(slice(&packed, "packed")?, "the packed weights").map_err(to_pyerr)?;
        let (s, z, p) = owned_group_data(&scales, zeros.as_ref(), k_perm.as_ref())?;
        run_quick(py, || {
            PackedWeights::from_packed(cb, m, k, k / groups, b, s, z, p)
        })
        .map(Packed::wrap)
    }

    /// GPTQ tensors (see `maleki_msgemm::interop::from_gptq`).
    #[staticmethod]
    #[pyo3(signature = (qweight, qzeros, scales, g_idx, bits, group_size, zero_offset))]
    #[allow(clippy::too_many_arguments)]
    fn from_gptq(
        py: Python<'_>,
        qweight: Ro2<'_, i32>,
        qzeros: Ro2<'_, i32>,
        scales: Ro2<'_, f32>,
        g_idx: Option<Ro1<'_, i32>>,
        bits: u32,
        group_size: Option<usize>,
        zero_offset: i32,
    ) -> PyResult<Packed> {
        let m = qweight.shape()[1];
        let k = qweight.shape()[0] * 32 / (bits.max(1) as usize);
        let (qw, qz, s) = (
            slice(&qweight, "qweight")?,
            slice(&qzeros, "qzeros")?,
            slice(&scales, "scales")?,
        );
        if scales.shape()[1] != m {
            return Err(PyValueError::new_err(format!(
                "scales: expected shape (groups, {m}), got {:?}",
                scales.shape()
            )));
        }
        let gi = g_idx.as_ref().map(|g| slice(g, "g_idx")).transpose()?;
        run_quick(py, || {
            interop::from_gptq(qw, qz, s, gi, m, k, bits, group_size, zero_offset)
        })
        .map(Packed::wrap)
    }

    /// AutoAWQ GEMM tensors.
    #[staticmethod]
    fn from_awq(
        py: Python<'_>,
        qweight: Ro2<'_, i32>,
        qzeros: Ro2<'_, i32>,
        scales: Ro2<'_, f32>,
        group_size: usize,
    ) -> PyResult<Packed> {
        let k = qweight.shape()[0];
        let m = qweight.shape()[1] * 8;
        let (qw, qz, s) = (
            slice(&qweight, "qweight")?,
            slice(&qzeros, "qzeros")?,
            slice(&scales, "scales")?,
        );
        run_quick(py, || interop::from_awq(qw, qz, s, m, k, group_size)).map(Packed::wrap)
    }

    /// ONNX Runtime MatMulNBits: B (N, k_blocks, blob) uint8, scales (N*k_blocks,) float32,
    /// zero points: None, packed uint8 or float32.
    #[staticmethod]
    #[pyo3(signature = (b, scales, k, bits, block_size, zeros_packed=None, zeros_float=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_matmulnbits(
        py: Python<'_>,
        b: Ro3<'_, u8>,
        scales: Ro1<'_, f32>,
        k: usize,
        bits: u32,
        block_size: usize,
        zeros_packed: Option<Ro1<'_, u8>>,
        zeros_float: Option<Ro1<'_, f32>>,
    ) -> PyResult<Packed> {
        let m = b.shape()[0];
        let bs = b
            .as_slice()
            .map_err(|_| PyValueError::new_err("B: array must be C-contiguous"))?;
        let s = slice(&scales, "scales")?;
        let zp = zeros_packed
            .as_ref()
            .map(|z| slice(z, "zero_points"))
            .transpose()?;
        let zf = zeros_float
            .as_ref()
            .map(|z| slice(z, "zero_points"))
            .transpose()?;
        let zeros = match (zp, zf) {
            (Some(p), _) => NBitsZeros::Packed(p),
            (None, Some(f)) => NBitsZeros::Float(f),
            (None, None) => NBitsZeros::Default,
        };
        run_quick(py, || {
            interop::from_matmulnbits(bs, s, zeros, m, k, bits, block_size)
        })
        .map(Packed::wrap)
    }

    /// `(B (N, k_blocks, blob) uint8, scales (N*k_blocks,) float32, zero_points uint8 or None)`.
    fn to_matmulnbits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let pw = self.get();
        let (b, s, z) = interop::to_matmulnbits(&pw).map_err(to_pyerr)?;
        let kb = pw.groups();
        let blob = pw.row_bytes() / kb;
        let b = numpy::ndarray::Array3::from_shape_vec((pw.m(), kb, blob), b)
            .map_err(|e| PyValueError::new_err(format!("internal shape error: {e}")))?
            .into_pyarray(py);
        let s = Array1::from_vec(s).into_pyarray(py);
        let z = z.map(|z| Array1::from_vec(z).into_pyarray(py));
        pyo3::types::PyTuple::new(
            py,
            [
                b.into_any(),
                s.into_any(),
                z.map_or(py.None().into_bound(py), |z| z.into_any()),
            ],
        )
    }

    #[getter]
    fn format(&self) -> &'static str {
        self.get().codebook().format().name()
    }
    #[getter]
    fn m(&self) -> usize {
        self.get().m()
    }
    #[getter]
    fn k(&self) -> usize {
        self.get().k()
    }
    #[getter]
    fn group_size(&self) -> usize {
        self.get().group_size()
    }
    #[getter]
    fn levels(&self) -> usize {
        self.get().codebook().levels()
    }
    #[getter]
    fn natural_depth(&self) -> usize {
        self.get().natural_depth()
    }
    #[getter]
    fn max_depth(&self) -> usize {
        self.get().codebook().max_depth()
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.get().nbytes()
    }
    /// Whether every scale is a float16 value (then the kernels read them as float16).
    #[getter]
    fn scales_are_f16(&self) -> bool {
        self.get().scales_are_f16()
    }
    /// Bytes of the caches built on first use (tile layouts, tiled scales and zero points).
    #[getter]
    fn cache_bytes(&self) -> usize {
        self.get().cache_bytes()
    }
    /// Drops the caches: the weights are swapped for a copy without them, which shares the
    /// packed data (calls running now keep what they started with); the next call rebuilds
    /// what it needs.
    fn clear_cache(&self, py: Python<'_>) {
        let current = self.get();
        if current.cache_bytes() == 0 {
            return;
        }
        let fresh = Arc::new(current.as_ref().clone());
        let old = std::mem::replace(
            &mut *self.inner.write().unwrap_or_else(|e| e.into_inner()),
            fresh,
        );
        drop(current);
        // The caches are freed (unless a call still holds them) without the interpreter lock.
        py.detach(move || drop(old));
    }
    #[getter]
    fn bits_per_weight(&self) -> f64 {
        self.get().codebook().packing().bits_per_code()
    }
    /// `(involution name, shift)` of the codebook's mirror symmetry, or None.
    #[getter]
    fn mirror(&self) -> Option<(&'static str, f32)> {
        self.get().codebook().mirror().map(|m| {
            let name = match m.involution {
                maleki_msgemm::format::Involution::Reverse => "reverse",
                maleki_msgemm::format::Involution::SignBit => "signbit",
            };
            (name, m.shift)
        })
    }
    fn codebook<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        Array1::from_vec(self.get().codebook().values().to_vec()).into_pyarray(py)
    }
    fn packed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let pw = self.get();
        let bytes = alloc::copied_vec(pw.packed(), "the packed weights").map_err(to_pyerr)?;
        to_array2(py, bytes, pw.m(), pw.row_bytes())
    }
    fn scales<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let pw = self.get();
        to_array2(py, pw.scales().to_vec(), pw.m(), pw.groups())
    }
    fn zeros<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let pw = self.get();
        pw.zeros()
            .map(|z| to_array2(py, z.to_vec(), pw.m(), pw.groups()))
            .transpose()
    }
    fn k_perm<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<u32>>> {
        self.get()
            .k_perm()
            .map(|p| Array1::from_vec(p.to_vec()).into_pyarray(py))
    }
    fn codes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let pw = self.get();
        let c = run_quick(py, || pw.codes())?;
        to_array2(py, c, pw.m(), pw.k())
    }
    /// Dequantizes into `out` (M, K) float32 C-contiguous: the float64 values rounded once.
    fn dequantize_into_f32(&self, py: Python<'_>, out: Bound<'_, PyArray2<f32>>) -> PyResult<()> {
        let mut out = borrow_out(&out)?;
        let pw = self.get();
        let o = out_slice(&mut out, pw.m(), pw.k())?;
        run_quick(py, || {
            pw.dequantize_f32_into(o);
            Ok(())
        })
    }
    /// Dequantizes into `out` (M, K) float64 C-contiguous.
    fn dequantize_into_f64(&self, py: Python<'_>, out: Bound<'_, PyArray2<f64>>) -> PyResult<()> {
        let mut out = borrow_out(&out)?;
        let pw = self.get();
        let o = out_slice(&mut out, pw.m(), pw.k())?;
        run_quick(py, || {
            pw.dequantize_into(o);
            Ok(())
        })
    }
    /// Builds (and caches) what a call with `table` (backend auto) of `depth` (None: the depth
    /// such a GEMV resolves to) reads: the codes used, the tile layout (or the dense `i16`
    /// layout), the tiled scales and zero points; then even the first GEMV runs on the calling
    /// thread. `table="auto"` (the library's choice): the GEMV's (`i8` tables, or the dense
    /// layout where GEMVs take the dense path), and the dense layout too when batches take it
    /// (`core_gemm::auto_precision`).
    #[pyo3(signature = (depth=None, table="i8"))]
    fn prepare(&self, py: Python<'_>, depth: Option<usize>, table: &str) -> PyResult<()> {
        let pw = self.get();
        let parsed = options(depth, table, "auto", false).map_err(to_pyerr)?;
        run_quick(py, || {
            let opts = parsed.opts;
            if parsed.bf16 {
                return bf16::prepare(&pw);
            }
            if parsed.auto {
                // A batch: the dense `i16` decision is the same for every N >= 2, `bf16`'s
                // from its threshold on, and small groups leave the dense path for `bf16`
                // from their own (`bf16::dense_to_bf16_min_n`).
                let n = bf16::auto_min_n(opts.backend).unwrap_or(2).max(2);
                let small = bf16::dense_to_bf16_min_n(opts.backend, pw.group_size()).unwrap_or(n);
                for n in [n, small.max(n)] {
                    match parsed.for_call(&pw, n) {
                        Call::Tables(o) if o.precision == TablePrecision::I16 => {
                            pw.dense_layout()?;
                        }
                        Call::Bf16(_) => bf16::prepare(&pw)?,
                        Call::Tables(_) => {}
                    }
                }
            }
            // The default GEMV's own options: `i8` tables, or the dense path where
            // `dense::gemv_preferred` takes it (then no tile layout is built).
            let opts = if parsed.auto {
                core_gemm::auto_precision(&pw, 1, &opts)
            } else {
                opts
            };
            match (core_gemm::prepare(&pw, &opts), depth) {
                (Ok(_), _) => Ok(()),
                // A depth no i8 kernel runs (e.g. int4 d=3): its layout still serves f32 calls.
                (Err(_), Some(d)) => pw.layout(d).map(|_| ()),
                (Err(e), None) => Err(e),
            }
        })
    }
}

fn quant_opts(
    format: &str,
    group_size: Option<usize>,
    symmetric: Option<bool>,
    codebook: Option<Vec<f32>>,
    scale_dtype: &str,
) -> CoreResult<QuantizeOptions> {
    let scale_dtype = match scale_dtype {
        "float32" => ScaleDtype::F32,
        "float16" => ScaleDtype::F16,
        other => {
            return Err(maleki_common::Error::invalid(
                "scale_dtype",
                format!("must be float32 or float16, got {other:?}"),
            ))
        }
    };
    Ok(QuantizeOptions {
        format: Format::from_name(format)?,
        group_size,
        symmetric,
        codebook,
        scale_dtype,
    })
}

/// The options of a call. `table="auto"` (the Python default off the reference backend) is
/// `i8` until [`Opts::for_call`] resolves it for the call's column count; `table="bf16"` is
/// the `bf16` mode ([`maleki_msgemm::bf16`]: no tables, `opts.precision` unused).
fn options(depth: Option<usize>, table: &str, backend: &str, mirror: bool) -> CoreResult<Opts> {
    let auto = table == "auto";
    let bf16 = table == "bf16";
    Ok(Opts {
        opts: GemmOptions {
            depth: depth.map_or(Depth::Auto, Depth::Fixed),
            precision: if auto || bf16 {
                TablePrecision::I8
            } else {
                TablePrecision::from_name(table)?
            },
            backend: Backend::from_name(backend)?,
            mirror,
        },
        auto,
        bf16,
    })
}

/// Parsed options, whether the table precision is the library's choice, and whether the
/// call asked for `bf16` mode.
#[derive(Clone, Copy)]
struct Opts {
    opts: GemmOptions,
    auto: bool,
    bf16: bool,
}

/// How a call runs: on tables (or the dense `i16` path) with these options, or in `bf16`
/// mode on this backend.
#[derive(Clone, Copy)]
enum Call {
    Tables(GemmOptions),
    Bf16(Backend),
}

impl Opts {
    /// How a call of `n` columns runs (`core_gemm::auto_precision` and
    /// `bf16::auto_applies` when the precision is the library's choice; they may scan the
    /// weights once, so call it with the GIL released).
    fn for_call(&self, pw: &PackedWeights, n: usize) -> Call {
        if self.bf16 {
            return Call::Bf16(self.opts.backend);
        }
        if !self.auto {
            return Call::Tables(self.opts);
        }
        let opts = core_gemm::auto_precision(pw, n, &self.opts);
        if bf16::auto_applies(pw, n, &opts) {
            Call::Bf16(opts.backend)
        } else {
            Call::Tables(opts)
        }
    }
}

fn counts_dict<'py>(
    py: Python<'py>,
    p: &CountParams,
    c: &OpCounts,
) -> PyResult<Bound<'py, PyDict>> {
    let cmp = compare(p, c);
    let d = PyDict::new(py);
    d.set_item("table_mul", c.table_mul)?;
    d.set_item("table_add", c.table_add)?;
    d.set_item("lookup", c.lookup)?;
    d.set_item("add", c.add)?;
    d.set_item("mul", c.mul)?;
    d.set_item("dense_mul", cmp.dense_mul)?;
    d.set_item("dense_add", cmp.dense_add)?;
    d.set_item("dequant_mul", cmp.dequant_mul)?;
    d.set_item("mac_ratio", cmp.mac_ratio)?;
    d.set_item("op_ratio", cmp.op_ratio)?;
    d.set_item(
        "model_ratio",
        count::model_ratio(p.m, p.levels, p.depth, p.mirror),
    )?;
    d.set_item("depth", p.depth)?;
    d.set_item("zero_term", p.zero_term)?;
    d.set_item("mirror", p.mirror)?;
    Ok(d)
}

/// `y = Wd @ X`: `x` float32 C-contiguous, `(K, N)` (`transposed=False`) or `(N, K)`
/// (`transposed=True`); returns (or writes into `out`) `y` `(M, N)` float32.
#[pyfunction]
#[pyo3(signature = (pw, x, transposed, depth, table, backend, mirror, threads, out=None, y_transposed=false))]
#[allow(clippy::too_many_arguments)]
fn gemm<'py>(
    py: Python<'py>,
    pw: &Packed,
    x: Ro2<'py, f32>,
    transposed: bool,
    depth: Option<usize>,
    table: &str,
    backend: &str,
    mirror: bool,
    threads: Option<usize>,
    out: Option<Bound<'py, PyArray2<f32>>>,
    y_transposed: bool,
) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
    let opts = options(depth, table, backend, mirror).map_err(to_pyerr)?;
    let (n, layout) = columns_of(&x, transposed);
    let xs = slice(&x, "x")?;
    let w = pw.get();
    let m = w.m();
    // Y as (M, N), or transposed (N, M) (a linear layer's (B, M) outputs, without a copy).
    let (y_layout, shape) = if y_transposed {
        (YLayout::NbyM, [n, m])
    } else {
        (YLayout::MbyN, [m, n])
    };
    let run = |y: &mut [f32]| match opts.for_call(&w, n) {
        Call::Tables(opts) => {
            core_gemm::gemm_into_layout(&w, xs, n, layout, y_layout, &opts, y).map(|_| ())
        }
        Call::Bf16(backend) => {
            bf16::gemm_into_layout(&w, xs, n, layout, y_layout, backend, y).map(|_| ())
        }
    };
    match out {
        Some(o) => {
            let mut o = borrow_out(&o)?;
            if o.shape() != shape {
                return Err(PyValueError::new_err(format!(
                    "out: expected shape ({}, {}), got {:?}",
                    shape[0],
                    shape[1],
                    o.shape()
                )));
            }
            let ys = o
                .as_slice_mut()
                .map_err(|_| PyValueError::new_err("out: array must be C-contiguous"))?;
            run_gemm(py, threads, || run(ys))?;
            Ok(None)
        }
        None => {
            let y = run_gemm(py, threads, || {
                let mut y = alloc::zeroed_vec::<f32>(m * n, "the output")?;
                run(&mut y)?;
                Ok(y)
            })?;
            Ok(Some(to_array2(py, y, shape[0], shape[1])?))
        }
    }
}

/// The benchmark's anchor A2, `Wd @ x` by the fused dequantize-and-multiply GEMV
/// (`maleki_msgemm::fused`; 4-bit packings): `x` `(K,)` float32 C-contiguous -> `y` `(M,)`.
#[pyfunction]
fn fused_gemv<'py>(
    py: Python<'py>,
    pw: &Packed,
    x: Ro1<'py, f32>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let xs = slice(&x, "x")?;
    let w = pw.get();
    let y = run_gemm(py, None, || {
        let mut y = vec![0f32; w.m()];
        maleki_msgemm::fused::fused_gemv(&w, xs, &mut y)?;
        Ok(y)
    })?;
    Ok(y.into_pyarray(py))
}

/// The number of columns of X and its layout: `(N, K)` when `transposed`, else `(K, N)`.
fn columns_of(x: &Ro2<'_, f32>, transposed: bool) -> (usize, XLayout) {
    if transposed {
        (x.shape()[0], XLayout::NbyK)
    } else {
        (x.shape()[1], XLayout::KbyN)
    }
}

/// The instrumented reference: `(y (M, N) float32, counts dict)`.
#[pyfunction]
#[pyo3(signature = (pw, x, transposed, depth, table, mirror))]
fn gemm_counted<'py>(
    py: Python<'py>,
    pw: &Packed,
    x: Ro2<'py, f32>,
    transposed: bool,
    depth: Option<usize>,
    table: &str,
    mirror: bool,
) -> PyResult<(Bound<'py, PyArray2<f32>>, Bound<'py, PyDict>)> {
    let opts = options(depth, table, "reference", mirror)
        .map_err(to_pyerr)?
        .opts;
    let (n, layout) = columns_of(&x, transposed);
    let xs = slice(&x, "x")?;
    let w = pw.get();
    let (y, c, plan) = run_quick(py, || core_gemm::gemm_counted(&w, xs, n, layout, &opts))?;
    let p = CountParams {
        m: plan.m as u64,
        k: plan.k as u64,
        n: plan.n as u64,
        levels: plan.levels as u64,
        depth: plan.depth() as u64,
        group_size: plan.group_size as u64,
        zero_term: plan.zero_term,
        mirror: plan.mirror.is_some(),
    };
    Ok((to_array2(py, y, plan.m, n)?, counts_dict(py, &p, &c)?))
}

/// The resolved plan of a call, as a dict (depth, backend, slot, zero_term, ...).
#[pyfunction]
#[pyo3(signature = (pw, n, depth, table, backend, mirror))]
fn plan_info<'py>(
    py: Python<'py>,
    pw: &Packed,
    n: usize,
    depth: Option<usize>,
    table: &str,
    backend: &str,
    mirror: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = options(depth, table, backend, mirror).map_err(to_pyerr)?;
    // On the pool: a plan of fresh weights first finds the codes they use (in parallel).
    let w = pw.get();
    let (plan, kernel, run, dense, bf16_call, fp8) = run_quick(py, || {
        let opts = match opts.for_call(&w, n) {
            Call::Tables(o) => o,
            Call::Bf16(backend) => {
                // No tables: the default backend's `i8` plan fills the table fields, which
                // do not apply.
                let kernel = bf16::kernel_for(&w, backend)?;
                let i8_opts = GemmOptions {
                    backend: Backend::Auto,
                    ..opts.opts
                };
                let plan = core_gemm::plan(&w, n, &i8_opts)?;
                return Ok((plan, kernel.name(), None, None, Some(kernel), None));
            }
        };
        let plan = core_gemm::plan(&w, n, &opts)?;
        // fp8 weights in `f32` mode: no tables either (`maleki_msgemm::float8`).
        if let Some(k) = float8::kernel_for(&w, &opts) {
            return Ok((plan, k.backend().name(), None, None, None, Some(k)));
        }
        // What runs: the kernel, and the plan it executes (a mirror plan on folded indices
        // where that gives the same bits, see `gemm::execution_plan`).
        // The dense `i16` path runs at any depth, with no table kernel.
        let dense = maleki_msgemm::dense::kind_for_call(opts.backend, &plan)
            .filter(|_| maleki_msgemm::dense::applies(&plan, opts.backend));
        Ok(match (opts.backend, dense) {
            (Backend::Reference, _) => (plan, "reference", None, None, None, None),
            (_, Some(k)) => (plan, k.backend_name(), None, Some(k), None, None),
            (b, None) => {
                let (run, k) = core_gemm::execution_plan(&w, &plan, b)?;
                let kind = k.layout_kind(&run);
                (
                    plan,
                    k.backend().name(),
                    Some((run, kind)),
                    None,
                    None,
                    None,
                )
            }
        })
    })?;
    let d = PyDict::new(py);
    d.set_item("depth", plan.depth())?;
    d.set_item("backend", kernel)?;
    d.set_item(
        "table",
        if bf16_call.is_some() {
            "bf16"
        } else {
            plan.precision.name()
        },
    )?;
    d.set_item("levels", plan.levels)?;
    d.set_item("tuples_per_group", plan.tuples.per_group)?;
    d.set_item("last_depth", plan.tuples.last_depth)?;
    d.set_item("table_entries", plan.slot)?;
    d.set_item("zero_term", plan.zero_term)?;
    d.set_item("mirror", plan.mirror.is_some())?;
    d.set_item("int_exp", plan.int_exp)?;
    let (half, kind, labels) = run.as_ref().map_or(
        (
            plan.mirror.is_some(),
            LayoutKind::Plain,
            plan.labels.is_some(),
        ),
        |(r, k)| (r.mirror.is_some(), *k, r.labels.is_some()),
    );
    d.set_item("half_tables", half)?;
    d.set_item("folded_indices", kind == LayoutKind::Folded)?;
    d.set_item("paired_indices", kind == LayoutKind::Paired)?;
    d.set_item("label_space", labels)?;
    d.set_item("dense_int8", dense.is_some())?;
    d.set_item("dense_kernel", dense.map(|k| k.name()))?;
    d.set_item("dense_bf16", bf16_call.is_some())?;
    d.set_item("bf16_kernel", bf16_call.map(|k| k.id()))?;
    d.set_item("scalar_order", bf16_call.map(|k| k.scalar_order()))?;
    d.set_item("fp8_kernel", fp8.map(|k| k.name()))?;
    Ok(d)
}

/// Closed-form counts (spec section 2.5) as a dict.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn op_counts<'py>(
    py: Python<'py>,
    m: u64,
    k: u64,
    n: u64,
    levels: u64,
    depth: u64,
    group_size: u64,
    zero_term: bool,
    mirror: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let p = CountParams {
        m,
        k,
        n,
        levels,
        depth,
        group_size,
        zero_term,
        mirror,
    };
    p.validate().map_err(to_pyerr)?;
    counts_dict(py, &p, &formula(&p))
}

/// `argmax_d d / (1 + A_d(V)/M)` over `1..=max_depth`.
#[pyfunction]
fn best_depth(m: u64, levels: u64, max_depth: u64, mirror: bool) -> PyResult<u64> {
    if m == 0 || levels < 2 || max_depth == 0 || max_depth > 64 {
        return Err(PyValueError::new_err(
            "best_depth: needs M >= 1, V >= 2, 1 <= max_depth <= 64",
        ));
    }
    Ok(count::best_depth(m, levels, max_depth, mirror))
}

/// `R(d) = d / (1 + A_d(V)/M)`.
#[pyfunction]
fn model_ratio(m: u64, levels: u64, depth: u64, mirror: bool) -> PyResult<f64> {
    if m == 0 || levels < 2 || depth == 0 || depth > 64 {
        return Err(PyValueError::new_err(
            "model_ratio: needs M >= 1, V >= 2, 1 <= depth <= 64",
        ));
    }
    Ok(count::model_ratio(m, levels, depth, mirror))
}

/// Backends usable on this machine (compiled in and supported by the CPU), plus "reference".
#[pyfunction]
fn available_backends() -> Vec<&'static str> {
    kernels::available_backends()
        .into_iter()
        .map(|b| b.name())
        .collect()
}

/// Whether `backend` implements the plan of this call (False also when it is unavailable).
#[pyfunction]
#[pyo3(signature = (pw, n, depth, table, backend, mirror))]
fn backend_supports(
    py: Python<'_>,
    pw: &Packed,
    n: usize,
    depth: Option<usize>,
    table: &str,
    backend: &str,
    mirror: bool,
) -> PyResult<bool> {
    let opts = options(depth, table, backend, mirror).map_err(to_pyerr)?;
    // The plan of the named backend: under depth="auto" the depth is that backend's choice
    // (on the pool: a plan of fresh weights first finds the codes they use, in parallel).
    let w = pw.get();
    let Ok((plan, opts)) = run_quick(py, || {
        let opts = match opts.for_call(&w, n) {
            Call::Tables(o) => o,
            Call::Bf16(backend) => {
                bf16::kernel_for(&w, backend)?;
                return Ok((None, opts.opts));
            }
        };
        Ok((Some(core_gemm::plan(&w, n, &opts)?), opts))
    }) else {
        return Ok(false);
    };
    // A `bf16` call the backend runs.
    let Some(plan) = plan else {
        return Ok(true);
    };
    Ok(match opts.backend {
        Backend::Reference => plan.precision == TablePrecision::F32,
        b => {
            maleki_msgemm::dense::applies(&plan, b)
                || float8::kernel_for(&w, &opts).is_some()
                || kernels::select(b, &plan).is_ok()
        }
    })
}

/// Format facts: `(levels, natural_depth, max_depth, max_byte_depth, mirror shift or None)`.
#[pyfunction]
#[pyo3(signature = (format, codebook=None))]
fn format_info(
    format: &str,
    codebook: Option<Vec<f32>>,
) -> PyResult<(usize, usize, usize, usize, Option<f32>)> {
    let cb = codebook_of(format, codebook).map_err(to_pyerr)?;
    Ok((
        cb.levels(),
        cb.natural_depth(),
        cb.max_depth(),
        cb.max_byte_depth(),
        cb.mirror().map(|m| m.shift),
    ))
}

/// Codebook values of a built-in format.
#[pyfunction]
fn codebook_values<'py>(py: Python<'py>, format: &str) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let cb = codebook_of(format, None).map_err(to_pyerr)?;
    Ok(Array1::from_vec(cb.values().to_vec()).into_pyarray(py))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Packed>()?;
    m.add_function(wrap_pyfunction!(gemm, m)?)?;
    m.add_function(wrap_pyfunction!(gemm_counted, m)?)?;
    m.add_function(wrap_pyfunction!(fused_gemv, m)?)?;
    m.add_function(wrap_pyfunction!(plan_info, m)?)?;
    m.add_function(wrap_pyfunction!(op_counts, m)?)?;
    m.add_function(wrap_pyfunction!(best_depth, m)?)?;
    m.add_function(wrap_pyfunction!(model_ratio, m)?)?;
    m.add_function(wrap_pyfunction!(available_backends, m)?)?;
    m.add_function(wrap_pyfunction!(backend_supports, m)?)?;
    m.add_function(wrap_pyfunction!(format_info, m)?)?;
    m.add_function(wrap_pyfunction!(codebook_values, m)?)?;
    m.add("ROW_BLOCK", maleki_msgemm::layout::ROW_BLOCK)?;
    m.add(
        "FORMATS",
        Format::ALL.iter().map(|f| f.name()).collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// The writable data of `out`, which must be an `(m, k)` C-contiguous array.
fn out_slice<'a, T: numpy::Element>(
    out: &'a mut PyReadwriteArray2<'_, T>,
    m: usize,
    k: usize,
) -> PyResult<&'a mut [T]> {
    if out.shape() != [m, k] {
        return Err(PyValueError::new_err(format!(
            "out: expected shape ({m}, {k}), got {:?}",
            out.shape()
        )));
    }
    out.as_slice_mut()
        .map_err(|_| PyValueError::new_err("out: array must be C-contiguous"))
}
