"""kwk: a CPU decoder for Llama-family models in float32, bf16, int8 and int4, over the kwk
Rust crates (nothing is reimplemented in Python).

- :class:`kwk.decode.KwkDecoder` runs a ``transformers`` model (or a Hugging Face folder, hub
  id or GGUF file) with ``generate``/``forward``;
- :func:`kwk.decode.runner_unsupported` says why a model cannot run, or ``None``;
- :func:`kwk.cpu_backend.decoder_available` says whether this CPU and build can run it;
- ``python -m kwk.bench`` is ``kwk-eval``, in-process.
"""

from kwk.decode import KwkDecoder, runner_unsupported

__all__ = ["KwkDecoder", "runner_unsupported"]
__version__ = "0.1.0"
