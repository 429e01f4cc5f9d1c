"""Type stubs of kwk's native module (Rust, PyO3). Use :mod:`kwk.decode`,
:mod:`kwk.cpu_backend` and :mod:`kwk.bench` rather than this module directly."""

from typing import List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

class Decoder:
    """A kwk decoder: packed weights in one format and a KV cache."""

    @staticmethod
    def from_tensors(
        config_json: str,
        tensors: Sequence[Tuple[str, str, np.ndarray]],
        *,
        max_cache_len: int,
        precision: str,
        threads: Optional[int] = None,
        calib: Optional[Sequence[int]] = None,
        origin: str = "<model object>",
        cache_dir: Optional[str] = None,
    ) -> "Decoder":
        """From a Hugging Face config (JSON) and ``(name, dtype, array)`` tensors: float32
        arrays, or uint16 arrays of bfloat16/float16 bits; read in place. With
        ``cache_dir`` the pack cache keys the model by the SHA-256 of config and tensors."""
    @staticmethod
    def from_pretrained(
        spec: str,
        *,
        max_cache_len: int,
        precision: str,
        threads: Optional[int] = None,
        calib: Optional[Sequence[int]] = None,
        calib_text: Optional[str] = None,
        cache_dir: Optional[str] = None,
    ) -> "Decoder":
        """From a Hugging Face folder, .gguf file, hub id or short name (as ``kwk-eval --llm``)."""
    def forward(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits of ``tokens`` appended to the cache, flat ``len(tokens) * vocab_size``."""
    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        eos: Sequence[int] = ...,
    ) -> List[int]:
        """New ids after ``prompt`` (run from an empty cache), the EOS id that stops it kept."""
    def reset(self) -> None: ...
    @property
    def position(self) -> int: ...
    @property
    def max_cache_len(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def kernels(self) -> str: ...
    @property
    def eos_token_ids(self) -> List[int]: ...
    @property
    def weight_bytes(self) -> int: ...
    @property
    def bits_per_weight(self) -> float: ...
    @property
    def n_params(self) -> int: ...
    @property
    def pack_s(self) -> float: ...
    @property
    def type_mix(self) -> List[Tuple[str, int]]: ...
    @property
    def pack_cache(self) -> Optional[str]: ...
    @property
    def config_json(self) -> str: ...
    def encode(self, text: str, add_special: bool = False) -> List[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def _panic_for_test(self, message: str) -> None:
        """Test hook: a Rust panic on purpose, raised as ``RuntimeError``; the decoder
        refuses further calls. Not part of the API."""

def config_unsupported(config_json: str, max_cache_len: int) -> Optional[str]:
    """Why a model with this Hugging Face config cannot run, or ``None``."""

def decoder_unavailable() -> Optional[str]:
    """``None`` when this CPU and build can run the decoder, else why not."""

def active_isa() -> str:
    """The kernel tier the decoder runs on this CPU."""

def run_eval(argv: Sequence[str]) -> int:
    """kwk-eval's command line in-process; returns its exit status."""

def _panic_for_test(message: str) -> None:
    """Test hook: a Rust panic on purpose, raised as ``RuntimeError``. Not part of the API."""
