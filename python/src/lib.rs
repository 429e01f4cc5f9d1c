//! `kwk._kwk`, the native module of the `kwk` Python package: the kwk crate's decoder
//! ([`Decoder`], built from a `transformers` model's tensors or from any source the CLI
//! takes), its support checks, and kwk-eval's command line run in-process ([`run_eval`]).
//! Nothing is computed here: this file converts arguments, releases the GIL around the
//! Rust calls, and turns errors and panics into Python exceptions. The Python side
//! (`python/kwk/*.py`) holds the user-facing API.

use kwk::decoder::{decoder_available as rust_decoder_available, DecoderOptions, KwkDecoder};
use kwk::decoder::{Precision, Sampling};
use kwk::model::memory::{weights_from_hf_tensors, NamedTensor, NamedTensors, TensorData};
use kwk::tokenizer::Tokenizer;
use kwk::{KwkError, ModelConfig};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{
    PyFileNotFoundError, PyMemoryError, PyNotImplementedError, PyOSError, PyRuntimeError,
    PyValueError,
};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The Python exception for a kwk error, carrying the Rust message: a model or option this
/// decoder does not implement is `NotImplementedError`, a missing model
/// `FileNotFoundError`, a read failure `OSError`, anything else (bad input) `ValueError`.
fn to_py(e: KwkError) -> PyErr {
    let msg = e.to_string();
    match e {
        KwkError::Unsupported(_) => PyNotImplementedError::new_err(msg),
        KwkError::NotFound(_) => PyFileNotFoundError::new_err(msg),
        KwkError::Io { .. } => PyOSError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f` without the GIL; a panic inside becomes `RuntimeError` instead of crossing
/// into Python as pyo3's `PanicException` (a `BaseException` that `except Exception`
/// would not catch).
fn compute<T: Send>(py: Python<'_>, f: impl FnOnce() -> PyResult<T> + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(f)))
        .unwrap_or_else(|p| {
            Err(PyRuntimeError::new_err(format!(
                "kwk internal error (a Rust panic): {}",
                panic_text(p.as_ref())
            )))
        })
}

/// A kwk decoder: packed weights in one format, a KV cache, and (when built from files)
/// the model's tokenizer.
#[pyclass(module = "kwk._kwk")]
struct Decoder {
    /// `None` after a panic left the decoder in an unknown state.
    inner: Mutex<Option<KwkDecoder>>,
    tokenizer: Option<Tokenizer>,
    eos: Vec<u32>,
    vocab_size: usize,
    config_json: String,
}

/// Locks `m`, ignoring poisoning (a panic is caught and recorded in the `Option`).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn options(
    max_cache_len: usize,
    precision: &str,
    threads: Option<usize>,
    calib: Option<Vec<u32>>,
    cache_dir: Option<PathBuf>,
) -> PyResult<DecoderOptions> {
    let precision = Precision::parse(precision).map_err(to_py)?;
    // The CLI's bound (`--threads`): more threads than that only make spinning workers
    // wait on each other, and a huge count failed to spawn inside the thread pool.
    let max = kwk_eval::limits::max_threads();
    let threads = match threads {
        Some(n) if n == 0 || n > max => {
            return Err(PyValueError::new_err(format!(
            "threads={n} is out of range: pass 1 to {max} (at most {} x the {} cores available)",
            kwk_eval::limits::THREADS_PER_CORE,
            kwk_eval::machine::available_threads()
        )))
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    Ok(DecoderOptions {
        max_cache_len,
        precision,
        kv: Default::default(),
        threads,
        calibration_tokens: calib,
        pack_cache_dir: cache_dir,
    })
}

/// Refuses a decoder of `config` whose estimated resident need (float32 masters while
/// packing, packed weights, KV cache of `max_cache_len`, calibration) exceeds the memory
/// available, with `MemoryError` naming both (`kwk::decoder::resident`).
fn check_memory(config: &ModelConfig, opts: &DecoderOptions, origin: &str) -> PyResult<()> {
    use kwk::decoder::resident::{available_memory, check_fits, resident_need, Build};
    let need = resident_need(
        config,
        &opts.precision,
        opts.kv,
        opts.max_cache_len,
        Build::FromWeights,
    );
    check_fits(
        &format!(
            "KwkDecoder({origin}, max_cache_len={}, precision={:?})",
            opts.max_cache_len,
            opts.precision.name()
        ),
        &need,
        0,
        available_memory(),
        "use a smaller max_cache_len, a smaller precision or a smaller model (KWK_MEMORY_CHECK=0 skips this check)",
    )
    .map_err(PyMemoryError::new_err)
}

/// A borrowed array of the state dict: float32 elements, or bf16/f16 bits as uint16.
enum Borrowed<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    Bits(PyReadonlyArrayDyn<'py, u16>, bool),
}

impl Decoder {
    /// Runs `f` on the decoder without the GIL.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut KwkDecoder) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        let inner = &self.inner;
        let out = py.detach(|| {
            let mut guard = lock(inner);
            let Some(dec) = guard.as_mut() else {
                return Err(PyRuntimeError::new_err(
                    "this decoder hit an internal error earlier and cannot be used; build a new one",
                ));
            };
            match catch_unwind(AssertUnwindSafe(|| f(dec))) {
                Ok(r) => r,
                Err(p) => {
                    *guard = None;
                    Err(PyRuntimeError::new_err(format!(
                        "kwk internal error (a Rust panic): {}",
                        panic_text(p.as_ref())
                    )))
                }
            }
        });
        out
    }

    fn wrap(
        dec: KwkDecoder,
        tokenizer: Option<Tokenizer>,
        eos: Vec<u32>,
        config: &ModelConfig,
    ) -> Decoder {
        Decoder {
            inner: Mutex::new(Some(dec)),
            tokenizer,
            eos,
            vocab_size: config.vocab_size,
            config_json: serde_json::to_string(config).unwrap_or_default(),
        }
    }
}

#[pymethods]
impl Decoder {
    /// Builds a decoder from a Hugging Face config (JSON text) and tensors by their Hugging
    /// Face names: `tensors` is a list of `(name, dtype, array)` where `array` is a
    /// C-contiguous numpy array of float32 (dtype "float32") or of uint16 holding bfloat16
    /// or float16 bits (dtype "bfloat16" / "float16"). The arrays are read in place.
    /// `cache_dir`: a pack cache folder; the model is keyed by the SHA-256 of the config and
    /// tensors (`kwk::pack_cache::memory_source`), so a hit skips packing.
    #[staticmethod]
    #[pyo3(signature = (config_json, tensors, *, max_cache_len, precision, threads=None, calib=None, origin="<model object>", cache_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_tensors(
        py: Python<'_>,
        config_json: &str,
        tensors: Vec<(String, String, Bound<'_, PyAny>)>,
        max_cache_len: usize,
        precision: &str,
        threads: Option<usize>,
        calib: Option<Vec<u32>>,
        origin: &str,
        cache_dir: Option<PathBuf>,
    ) -> PyResult<Decoder> {
        let origin = PathBuf::from(origin);
        let config = ModelConfig::from_hf_config_str(config_json, &origin).map_err(to_py)?;
        let use_cache = cache_dir.is_some();
        let opts = options(max_cache_len, precision, threads, calib, cache_dir)?;
        check_memory(&config, &opts, &origin.display().to_string())?;
        let mut arrays = Vec::with_capacity(tensors.len());
        for (name, dtype, array) in &tensors {
            let b = match dtype.as_str() {
                "float32" => Borrowed::F32(array.extract().map_err(|e| {
                    PyValueError::new_err(format!("tensor '{name}': not a float32 array ({e})"))
                })?),
                "bfloat16" | "float16" => {
                    Borrowed::Bits(array.extract().map_err(|e| {
                        PyValueError::new_err(format!(
                            "tensor '{name}': {dtype} must come as a uint16 array of its bits ({e})"
                        ))
                    })?, dtype == "bfloat16")
                }
                other => {
                    return Err(PyValueError::new_err(format!(
                        "tensor '{name}' has dtype {other}; kwk reads float32, bfloat16 and float16 weights"
                    )))
                }
            };
            arrays.push((name.clone(), b));
        }
        let mut named: NamedTensors<'_> = NamedTensors::new();
        for (name, b) in &arrays {
            let not_contiguous =
                || PyValueError::new_err(format!("tensor '{name}' is not C-contiguous"));
            let (shape, data) = match b {
                Borrowed::F32(a) => (
                    a.shape().to_vec(),
                    TensorData::F32(a.as_slice().map_err(|_| not_contiguous())?),
                ),
                Borrowed::Bits(a, bf16) => {
                    let s = a.as_slice().map_err(|_| not_contiguous())?;
                    (
                        a.shape().to_vec(),
                        if *bf16 {
                            TensorData::Bf16(s)
                        } else {
                            TensorData::F16(s)
                        },
                    )
                }
            };
            named.insert(name.clone(), NamedTensor { shape, data });
        }
        let dec = compute(py, || {
            // With a pack cache the model is named by its contents (the cache's identity
            // of an in-memory model); a hit needs no float32 copy of the weights.
            let source = if use_cache {
                let source = kwk::pack_cache::memory_source(config_json, &named);
                let eos = Vec::new();
                let cached = KwkDecoder::from_pack_cache(&config, eos, &source, opts.clone())
                    .map_err(to_py)?;
                if let Some(dec) = cached {
                    return Ok(dec);
                }
                source
            } else {
                origin.clone()
            };
            let weights = weights_from_hf_tensors(&config, &named, &origin).map_err(to_py)?;
            KwkDecoder::from_weights(&config, &weights, Vec::new(), &source, opts).map_err(to_py)
        })?;
        Ok(Decoder::wrap(
            dec,
            None,
            config.eos_token_ids.clone(),
            &config,
        ))
    }

    /// Loads a model the way the CLI's `--llm` does (a Hugging Face folder, a .gguf file,
    /// a hub id or a short name) and builds a decoder; the tokenizer is kept.
    /// `calib_text` is tokenized with the model's tokenizer (special tokens added, as
    /// kwk-eval's `--calib-text`) and used in place of `calib`.
    #[staticmethod]
    #[pyo3(signature = (spec, *, max_cache_len, precision, threads=None, calib=None, calib_text=None, cache_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_pretrained(
        py: Python<'_>,
        spec: &str,
        max_cache_len: usize,
        precision: &str,
        threads: Option<usize>,
        calib: Option<Vec<u32>>,
        calib_text: Option<String>,
        cache_dir: Option<PathBuf>,
    ) -> PyResult<Decoder> {
        let mut opts = options(max_cache_len, precision, threads, calib, cache_dir)?;
        let (dec, model) = compute(py, || {
            // The header first (config and tokenizer, no weights), so a build that cannot
            // fit is refused before the weights are read.
            let header = kwk::model::load_model_header(spec).map_err(to_py)?;
            check_memory(&header.config, &opts, spec)?;
            drop(header);
            let model = kwk::load_model(spec).map_err(to_py)?;
            if let Some(text) = &calib_text {
                opts.calibration_tokens = Some(model.tokenizer.encode(text, true).map_err(to_py)?);
            }
            let dec = KwkDecoder::from_weights(
                &model.config,
                &model.weights,
                Vec::new(),
                &model.info.resolved_path,
                opts,
            )
            .map_err(to_py)?;
            Ok((dec, model))
        })?;
        let mut eos = model.config.eos_token_ids.clone();
        for &id in model.tokenizer.eos_ids() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let config = model.config.clone();
        Ok(Decoder::wrap(dec, Some(model.tokenizer), eos, &config))
    }

    /// Appends `tokens` after those in the KV cache and returns the logits of every one of
    /// them as a flat float32 array (`len(tokens) * vocab_size`).
    fn forward<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<u32>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let logits = self.with(py, |d| d.forward(&tokens, 0).map_err(to_py))?;
        // A Ctrl-C that arrived while the GIL was released is KeyboardInterrupt here,
        // before any NumPy call could run Python code with it pending.
        py.check_signals()?;
        Ok(PyArray1::from_vec(py, logits))
    }

    /// Runs `prompt` from an empty cache and returns up to `max_new_tokens` new ids,
    /// stopping after the first id in `eos` (which is included) or when the cache is full.
    /// Ctrl-C between tokens raises KeyboardInterrupt. The cache is left as generation
    /// left it.
    #[pyo3(signature = (prompt, max_new_tokens, *, temperature=0.0, top_k=0, top_p=1.0, seed=0, eos=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Vec<u32>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        eos: Vec<u32>,
    ) -> PyResult<Vec<u32>> {
        check_sampling(temperature, top_p)?;
        if max_new_tokens == 0 {
            return Ok(Vec::new());
        }
        let sampling = Sampling {
            temperature,
            top_k,
            top_p,
            seed,
        };
        self.with(py, |d| {
            // Grows as tokens arrive: max_new_tokens is the caller's number, not a size to trust.
            let mut out = Vec::new();
            let mut interrupted = None;
            d.generate(&prompt, max_new_tokens, &sampling, &mut |t| {
                out.push(t);
                if eos.contains(&t) {
                    return false;
                }
                match Python::attach(|py| py.check_signals()) {
                    Ok(()) => true,
                    Err(e) => {
                        interrupted = Some(e);
                        false
                    }
                }
            })
            .map_err(to_py)?;
            match interrupted {
                Some(e) => Err(e),
                None => Ok(out),
            }
        })
    }

    /// Empties the KV cache.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |d| {
            d.reset();
            Ok(())
        })
    }

    /// Tokens in the KV cache.
    #[getter]
    fn position(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |d| Ok(d.position()))
    }

    #[getter]
    fn max_cache_len(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |d| Ok(d.max_cache_len()))
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The canonical name of the weight format (`int4:g64:calib`, ...).
    #[getter]
    fn precision(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |d| Ok(d.precision().name()))
    }

    /// The kernels the weight matmuls run on this CPU (e.g. `avx512vnni`).
    #[getter]
    fn kernels(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |d| Ok(d.precision().kernels().to_string()))
    }

    /// End-of-sequence ids the model declares (config and tokenizer).
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    #[getter]
    fn weight_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |d| Ok(d.weight_bytes()))
    }

    #[getter]
    fn bits_per_weight(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, |d| Ok(d.bits_per_weight()))
    }

    #[getter]
    fn n_params(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |d| Ok(d.n_params()))
    }

    /// Seconds spent packing (or reading the pack cache).
    #[getter]
    fn pack_s(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, |d| Ok(d.pack_s()))
    }

    /// Packed layouts and how many linears use each (`{"4-bit g32": 12, ...}`).
    #[getter]
    fn type_mix(&self, py: Python<'_>) -> PyResult<Vec<(String, usize)>> {
        self.with(py, |d| Ok(d.type_mix().into_iter().collect()))
    }

    /// What the pack cache did (`None` when not used), as its debug text.
    #[getter]
    fn pack_cache(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, |d| Ok(d.pack_cache_outcome().map(|o| format!("{o:?}"))))
    }

    /// The model's config as kwk read it (JSON).
    #[getter]
    fn config_json(&self) -> String {
        self.config_json.clone()
    }

    /// Token ids of `text` with the model's tokenizer (decoders built from files only).
    #[pyo3(signature = (text, add_special=false))]
    fn encode(&self, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        self.tokenizer()?.encode(text, add_special).map_err(to_py)
    }

    /// The text of token ids (decoders built from files only).
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        self.tokenizer()?.decode(&ids).map_err(to_py)
    }

    /// Test hook: panics on purpose with `message` inside the guard every decoder call
    /// runs in, so a test can show a Rust panic becomes `RuntimeError` (and the decoder
    /// refuses further calls) rather than aborting Python. Not part of the API.
    #[pyo3(name = "_panic_for_test")]
    fn panic_for_test(&self, py: Python<'_>, message: String) -> PyResult<()> {
        self.with(py, move |_| panic!("{message}"))
    }
}

/// `temperature` 0 (greedy) to the CLI's largest, finite; `top_p` in (0, 1]. (`top_k` is
/// unsigned: a negative one is refused by the conversion.)
fn check_sampling(temperature: f32, top_p: f32) -> PyResult<()> {
    let max = kwk_eval::generate::MAX_TEMPERATURE;
    if !(temperature.is_finite() && (0.0..=max).contains(&temperature)) {
        return Err(PyValueError::new_err(format!(
            "temperature={temperature} is out of range: pass 0 (greedy) to {max}"
        )));
    }
    if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
        return Err(PyValueError::new_err(format!(
            "top_p={top_p} is out of range: pass a number in (0, 1]"
        )));
    }
    Ok(())
}

impl Decoder {
    fn tokenizer(&self) -> PyResult<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            PyValueError::new_err(
                "this decoder was built from a model object and has no tokenizer; use the \
                 transformers tokenizer",
            )
        })
    }
}

/// Why a model with this Hugging Face config (JSON text) cannot run with a cache of
/// `max_cache_len` tokens, or `None` when it can: the checks `KwkDecoder` itself makes.
#[pyfunction]
fn config_unsupported(config_json: &str, max_cache_len: usize) -> Option<String> {
    match ModelConfig::from_hf_config_str(config_json, Path::new("model.config")) {
        Ok(c) => kwk::decoder::config_unsupported(&c, max_cache_len),
        Err(e) => Some(e.to_string()),
    }
}

/// `None` when this CPU and build can run the decoder, else why not.
#[pyfunction]
fn decoder_unavailable() -> Option<String> {
    rust_decoder_available().err()
}

/// The kernel tier the decoder runs on this CPU (`KWK_ISA` respected).
#[pyfunction]
fn active_isa() -> String {
    kwk::kernels::active_isa().name().to_string()
}

/// Runs kwk-eval with `argv` (program name first) in this process and returns its exit
/// status (0 ok, 1 the regression gate failed, 2 error); output goes to the process's
/// stdout/stderr as the binary's does.
#[pyfunction]
fn run_eval(py: Python<'_>, argv: Vec<String>) -> PyResult<u8> {
    compute(py, || Ok(kwk_eval::run(argv)))
}

/// Test hook: panics on purpose with `message` inside the guard the module's functions
/// run in (as `run_eval` does), so a test can show the panic becomes `RuntimeError`. Not
/// part of the API.
#[pyfunction]
#[pyo3(name = "_panic_for_test")]
fn panic_for_test(py: Python<'_>, message: String) -> PyResult<()> {
    compute(py, move || panic!("{message}"))
}

#[pymodule]
fn _kwk(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // NumPy's C API and borrow-checking capsules, fetched now: fetched lazily by the first
    // `forward`, their import ran Python code that a pending Ctrl-C interrupted, and the
    // numpy crate turned that into a panic (PanicException, not KeyboardInterrupt).
    let probe = numpy::PyArray1::<f32>::zeros(m.py(), 0, false);
    // The decoder crate never prints: its warnings (a damaged pack cache file, an unusable
    // KWK_ISA) reach stderr through the sink kwk-eval's program installs, for decoders
    // built here as for `run_eval`.
    kwk_eval::console::install_notice_sink();
    drop(probe.readonly());
    m.add_class::<Decoder>()?;
    m.add_function(wrap_pyfunction!(config_unsupported, m)?)?;
    m.add_function(wrap_pyfunction!(decoder_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(active_isa, m)?)?;
    m.add_function(wrap_pyfunction!(run_eval, m)?)?;
    m.add_function(wrap_pyfunction!(panic_for_test, m)?)?;
    Ok(())
}
