"""KwkDecoder: kwk's CPU decoder for a ``transformers`` model object, a Hugging Face folder,
a hub id or a GGUF file, with ``generate`` and ``forward`` taking torch tensors, numpy arrays
or lists of shape ``[batch, seq]`` and returning the same kind.

Everything numeric runs in Rust (the ``kwk`` crate): this module turns Python inputs into
token ids and the model's ``state_dict()`` into borrowed arrays (float32 tensors are read in
place, bf16/f16 ones through a uint16 view of their bits), and shapes the results. The GIL is
released while the decoder computes, and Ctrl-C stops a ``generate`` between tokens.
"""

import json
import math
import os
import random
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from kwk import _kwk

__all__ = ["KwkDecoder", "runner_unsupported"]

_LOW_BIT = ("int3", "int4", "int5", "int6")
_FORMATS = ("float32", "f32", "bf16", "int8", "balanced") + _LOW_BIT
_GROUP_SIZES = (32, 64, 128)
_MIX_BITS = (6, 8)


def _precision_spec(
    precision: str,
    mix_bits: Optional[int],
    group_size: Optional[int],
    calib: Any,
    gptq: bool,
) -> str:
    """The format name the Rust side parses (``int4:g64:mix8:calib``, ...), after checking
    that each option applies to the format asked for."""
    if not isinstance(precision, str) or precision.lower() not in _FORMATS:
        raise ValueError(
            f"precision {precision!r} is not a kwk format; use one of "
            "'float32', 'bf16', 'int8' ('balanced'), 'int4', 'int3', 'int5', 'int6'"
        )
    base = precision.lower()
    if base == "balanced":
        base = "int8"
    for names, applies, where in (
        ((("mix_bits", mix_bits), ("group_size", group_size)), base in _LOW_BIT, "precision='int4' (or int3, int5, int6) only"),
        ((("calib", calib), ("gptq", True if gptq else None)), base == "int8" or base in _LOW_BIT, "precision='int8' or 'int4' (or int3, int5, int6)"),
    ):
        given = [n for n, v in names if v is not None]
        if given and not applies:
            raise ValueError(f"{', '.join(given)} apply to {where} (got precision={precision!r})")
    spec = base
    if group_size is not None:
        if group_size not in _GROUP_SIZES:
            raise ValueError(f"group_size {group_size!r} is not one of {_GROUP_SIZES}")
        spec += f":g{group_size}"
    if mix_bits is not None:
        if mix_bits not in _MIX_BITS:
            raise ValueError(f"mix_bits {mix_bits!r} is not one of {_MIX_BITS} (or None)")
        spec += f":mix{mix_bits}"
    if gptq and calib is None:
        raise ValueError("gptq=True needs calib= (calibration token ids or text)")
    if base == "int8":
        # int8:gptq includes int8:calib (one format, one canonical name).
        if gptq:
            spec += ":gptq"
        elif calib is not None:
            spec += ":calib"
        return spec
    if calib is not None:
        spec += ":calib"
    if gptq:
        spec += ":gptq"
    return spec


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _token_list(ids: Any, what: str) -> List[int]:
    """A flat list of token ids from a torch tensor, numpy array or sequence of ints."""
    if _is_torch(ids):
        ids = ids.detach().cpu().reshape(-1).tolist()
    elif isinstance(ids, np.ndarray):
        ids = ids.reshape(-1).tolist()
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"{what} must hold non-negative integer token ids, found {t!r}")
        out.append(int(t))
    return out


def _rows(input_ids: Any) -> Tuple[List[List[int]], str, Any]:
    """(rows of ids, kind, original) for a ``[batch, seq]`` (or ``[seq]``) input; kind is
    'torch', 'numpy' or 'list', with '1d' appended for a single unbatched row."""
    if _is_torch(input_ids):
        kind, nd = "torch", input_ids.dim()
        data = input_ids.detach().cpu().tolist()
    elif isinstance(input_ids, np.ndarray):
        kind, nd = "numpy", input_ids.ndim
        data = input_ids.tolist()
    elif isinstance(input_ids, (list, tuple)):
        kind = "list"
        nd = 2 if input_ids and isinstance(input_ids[0], (list, tuple, np.ndarray)) else 1
        data = [list(r) for r in input_ids] if nd == 2 else list(input_ids)
    else:
        raise TypeError(
            f"input_ids must be a torch tensor, a numpy array or a list, not {type(input_ids).__name__}"
        )
    if nd == 1:
        data, kind = [data], kind + "1d"
    elif nd != 2:
        raise ValueError(f"input_ids must have shape [batch, seq] (or [seq]), got {nd} dimensions")
    rows = [_token_list(r, "input_ids") for r in data]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("input_ids must hold at least one token per row")
    return rows, kind, input_ids


def _ids_like(rows: List[List[int]], kind: str, original: Any) -> Any:
    """Token rows as the kind of input they answer."""
    one = kind.endswith("1d")
    base = kind[:-2] if one else kind
    if base == "list":
        return rows[0] if one else rows
    arr = np.asarray(rows, dtype=np.int64)
    if base == "numpy":
        if np.issubdtype(original.dtype, np.integer):
            arr = arr.astype(original.dtype)
        return arr[0] if one else arr
    import torch

    t = torch.as_tensor(arr, dtype=original.dtype if not original.is_floating_point() else torch.long)
    t = t.to(original.device)
    return t[0] if one else t


def _logits_like(logits: np.ndarray, kind: str, original: Any) -> Any:
    """float32 logits ``[batch, seq, vocab]`` as a torch tensor for torch input, else numpy."""
    if kind.endswith("1d"):
        logits = logits[0]
    if kind.startswith("torch"):
        import torch

        return torch.from_numpy(logits).to(original.device)
    return logits


def _config_json(config: Any) -> str:
    if hasattr(config, "to_json_string"):
        try:
            return config.to_json_string(use_diff=False)
        except TypeError:
            return config.to_json_string()
    if hasattr(config, "to_dict"):
        return json.dumps(config.to_dict(), default=str)
    if isinstance(config, dict):
        return json.dumps(config, default=str)
    raise TypeError("the model has no transformers config (model.config)")


def _state_arrays(model: Any) -> Tuple[List[Tuple[str, str, np.ndarray]], List[Any]]:
    """``(name, dtype, array)`` of every floating-point tensor of ``model.state_dict()``:
    numpy views of the tensors' memory (float32 as is, bf16/f16 as uint16 bits) when they
    are contiguous on the CPU, copies otherwise. The second list keeps the tensors alive."""
    import torch

    out, keep = [], []
    for name, t in model.state_dict().items():
        if not torch.is_tensor(t) or not t.is_floating_point():
            continue
        if t.device.type == "meta":
            raise ValueError(
                f"tensor '{name}' is on the meta device (not loaded); load the model's weights first"
            )
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.dtype == torch.float32:
            arr, dt = t.numpy(), "float32"
        elif t.dtype == torch.bfloat16:
            arr, dt = t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
        elif t.dtype == torch.float16:
            arr, dt = t.numpy().view(np.uint16), "float16"
        else:  # float64 and 8-bit floats: converted (a copy)
            arr, dt = t.to(torch.float32).numpy(), "float32"
        keep.append(t)
        out.append((name, dt, arr))
    return out, keep


def _unsupported_dtypes(model: Any) -> Optional[str]:
    try:
        params = list(model.named_parameters())
    except Exception:  # not a torch module
        return "the model is not a torch module with named_parameters()"
    for name, p in params:
        if not p.is_floating_point():
            return (
                f"parameter '{name}' has dtype {p.dtype}; kwk reads float32, bfloat16 and float16 "
                "weights (not pre-quantized models)"
            )
        if p.device.type == "meta":
            return f"parameter '{name}' is on the meta device (weights not loaded)"
    return None


def runner_unsupported(model: Any, max_cache_len: int) -> Optional[str]:
    """Why ``model`` (a ``transformers`` ``PreTrainedModel``) cannot run in kwk's decoder
    with a KV cache of ``max_cache_len`` tokens, or ``None`` when it can.

    The reasons come from the Rust decoder's own checks on the config: an architecture it
    does not run (it runs llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe), an
    unknown rope scaling, sliding-window attention shorter than the cache, a cache longer
    than ``max_position_embeddings``; and from the weights: dtypes other than
    float32/bf16/f16, weights not loaded."""
    config = getattr(model, "config", None)
    if config is None:
        return "not a transformers model: it has no .config"
    if not isinstance(max_cache_len, (int, np.integer)) or max_cache_len < 0:
        return f"max_cache_len must be a non-negative integer, got {max_cache_len!r}"
    try:
        text = _config_json(config)
    except Exception as e:  # a config that cannot be serialised
        return f"the model's config cannot be read as JSON: {e}"
    why = _kwk.config_unsupported(text, int(max_cache_len))
    if why is not None:
        return why
    return _unsupported_dtypes(model)


def _default_cache_dir() -> Path:
    """``$KWK_CACHE/pack``, else ``${XDG_CACHE_HOME:-~/.cache}/kwk/pack``, as kwk-eval's
    ``--pack-cache`` (docs/paths.md)."""
    root = os.environ.get("KWK_CACHE")
    if root:
        return Path(root) / "pack"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kwk" / "pack"


def _cache_folder(cache_dir: Union[None, bool, str, "os.PathLike[str]"]) -> Optional[str]:
    """The pack cache folder ``cache_dir`` names: ``True`` the default, ``None``/``False`` none."""
    if cache_dir is True:
        return str(_default_cache_dir())
    if cache_dir is None or cache_dir is False:
        return None
    return os.fspath(cache_dir)


def _eos_of(model: Any) -> List[int]:
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(holder, "eos_token_id", None) if holder is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def _pad_of(model: Any) -> Optional[int]:
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        pad = getattr(holder, "pad_token_id", None) if holder is not None else None
        if pad is not None:
            return int(pad)
    return None


class KwkDecoder:
    """kwk's CPU decoder holding one model's weights packed in one format, and a KV cache.

    ``KwkDecoder(model, max_cache_len, precision="int8", ...)`` takes a ``transformers``
    causal-LM model of an architecture kwk runs (Llama, Mistral, Qwen2, Qwen3, Mixtral,
    Qwen2-MoE, Qwen3-MoE); ``KwkDecoder.from_pretrained(path_or_hub_id_or_gguf, ...)`` loads
    any source ``kwk-eval --llm`` takes.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` (``...ForCausalLM``). Its config is read
            from ``model.config``, its weights from ``model.state_dict()``.
        max_cache_len: the longest sequence (prompt + new tokens) the KV cache holds.
        precision: ``"float32"``, ``"bf16"``, ``"int8"`` (also ``"balanced"``), ``"int4"``, or
            the other low-bit widths ``"int3"``, ``"int5"``, ``"int6"`` (int4's options apply).
        mix_bits: int4 only: bits of the tensors the sensitivity mix keeps wider (6 or 8;
            ``None`` picks by model size).
        group_size: int4 only: weights per scale group (32, 64 or 128; ``None``: 32).
        calib: int8 and int4: calibration token ids (list, numpy array or torch tensor; for
            ``from_pretrained`` also a text, tokenized with the model's tokenizer): scales are
            fitted to the activations of that text (``int8:calib``, ``int4:calib``). Do not
            calibrate on the text you score.
        gptq: int8 and int4: GPTQ rounding on top of calibration (``int8:gptq``,
            ``int4:gptq``; needs ``calib``).
            Raises ``NotImplementedError`` with the Rust message while kwk does not
            implement it.
        cache_dir: ``None`` (no pack cache), ``True`` (``~/.cache/kwk/pack``) or a folder:
            int8/int4 weights packed once are kept there and read back on the next start. A
            model object is keyed by the SHA-256 of its config and tensors (hashed on every
            start, about 1 s per GB of weights on two threads; a changed weight is a new
            entry, and the old one is evicted by the cache's size limit).
        threads: worker threads (default: all available cores; at most 4 x the cores, as
            ``kwk-eval --threads``).

    Errors from the Rust side are raised with its message: ``NotImplementedError`` for what
    kwk does not implement, ``FileNotFoundError`` for a missing model, ``OSError`` for read
    failures, ``ValueError`` for bad input (also a non-finite weight), ``MemoryError`` when the
    estimated memory the decoder needs (float32 weights while packing, packed weights, the KV
    cache of ``max_cache_len``) exceeds what the machine has available (Linux's
    ``MemAvailable``; ``KWK_MEMORY_CHECK=0`` skips the check), ``RuntimeError`` for an
    internal error.
    """

    def __init__(
        self,
        model: Any,
        max_cache_len: int,
        precision: str = "int8",
        mix_bits: Optional[int] = None,
        group_size: Optional[int] = None,
        calib: Any = None,
        gptq: bool = False,
        cache_dir: Union[None, bool, str, "os.PathLike[str]"] = None,
        threads: Optional[int] = None,
    ) -> None:
        spec = _precision_spec(precision, mix_bits, group_size, calib, gptq)
        _check_cache_len(max_cache_len)
        if isinstance(calib, str):
            raise ValueError(
                "calib for a model object must be token ids (tokenize the text with the model's "
                "tokenizer); text is accepted by KwkDecoder.from_pretrained"
            )
        config = getattr(model, "config", None)
        if config is None:
            raise TypeError(
                f"KwkDecoder takes a transformers PreTrainedModel, not {type(model).__name__}; "
                "use KwkDecoder.from_pretrained for a folder, hub id or GGUF file"
            )
        why = runner_unsupported(model, max_cache_len)
        if why is not None:
            raise NotImplementedError(f"kwk cannot run this model: {why}")
        tensors, keep = _state_arrays(model)
        origin = getattr(config, "_name_or_path", "") or type(model).__name__
        self._dec = _kwk.Decoder.from_tensors(
            _config_json(config),
            tensors,
            max_cache_len=int(max_cache_len),
            precision=spec,
            threads=threads,
            calib=None if calib is None else _token_list(calib, "calib"),
            origin=f"<{type(model).__name__} {origin}>",
            cache_dir=_cache_folder(cache_dir),
        )
        del keep
        self._eos = _eos_of(model)
        self._pad = _pad_of(model)

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: Union[str, "os.PathLike[str]"],
        max_cache_len: int,
        precision: str = "int8",
        mix_bits: Optional[int] = None,
        group_size: Optional[int] = None,
        calib: Any = None,
        gptq: bool = False,
        cache_dir: Union[None, bool, str, "os.PathLike[str]"] = None,
        threads: Optional[int] = None,
    ) -> "KwkDecoder":
        """A decoder for a Hugging Face folder, a ``.gguf`` file, a hub id
        (``ORG/NAME[@REV]``, read from the Hugging Face cache or downloaded) or a short name,
        resolved exactly as ``kwk-eval --llm`` resolves it. Options as for the constructor;
        ``calib`` may also be a text here."""
        spec = _precision_spec(precision, mix_bits, group_size, calib, gptq)
        _check_cache_len(max_cache_len)
        folder = _cache_folder(cache_dir)
        calib_ids = calib_text = None
        if isinstance(calib, str):
            calib_text = calib
        elif calib is not None:
            calib_ids = _token_list(calib, "calib")
        self = cls.__new__(cls)
        self._dec = _kwk.Decoder.from_pretrained(
            os.fspath(path_or_hub_id),
            max_cache_len=int(max_cache_len),
            precision=spec,
            threads=threads,
            calib=calib_ids,
            calib_text=calib_text,
            cache_dir=folder,
        )
        self._eos = list(self._dec.eos_token_ids)
        self._pad = None
        return self

    # -- running -----------------------------------------------------------------------

    def forward(self, input_ids: Any) -> Any:
        """Float32 logits ``[batch, seq, vocab]`` of every position of ``input_ids``.

        One row (``[1, seq]`` or ``[seq]``) is appended after the tokens already in the KV
        cache, which keeps them (call :meth:`reset` to start over; a new decoder and
        :meth:`generate` leave it empty). Several rows need an empty cache: each runs from
        position 0 and the cache is empty afterwards. Returns a torch tensor for torch
        input, else a numpy array."""
        rows, kind, original = _rows(input_ids)
        vocab = self._dec.vocab_size
        if len(rows) == 1:
            out = [np.asarray(self._dec.forward(rows[0])).reshape(len(rows[0]), vocab)]
        else:
            if self._dec.position != 0:
                raise ValueError(
                    f"forward of {len(rows)} rows needs an empty KV cache, which holds "
                    f"{self._dec.position} tokens; call reset() first"
                )
            out = []
            try:
                for r in rows:
                    self._dec.reset()
                    out.append(np.asarray(self._dec.forward(r)).reshape(len(r), vocab))
            finally:
                self._dec.reset()
        return _logits_like(np.stack(out), kind, original)

    __call__ = forward

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 50,
        top_p: float = 1.0,
        eos_token_id: Union[None, int, Sequence[int]] = None,
        seed: Optional[int] = None,
        pad_token_id: Optional[int] = None,
    ) -> Any:
        """The prompt rows followed by up to ``max_new_tokens`` new tokens each, as the kind
        of ``input_ids`` (torch tensor, numpy array or list; shape ``[batch, seq + new]``).

        Greedy unless ``do_sample``; sampling keeps the ``top_k`` most likely tokens (0: all)
        and then the smallest set reaching ``top_p``, at ``temperature``, from a seeded
        generator (row ``i`` uses ``seed + i``; ``seed=None`` draws one). A row stops after
        an ``eos_token_id`` (default: the model's), which is kept; rows that stop early are
        filled with ``pad_token_id`` (default: the model's, else the first EOS id), as
        ``transformers``' ``generate`` does. Each row runs from an empty cache; the cache is
        empty afterwards. Ctrl-C stops between tokens with ``KeyboardInterrupt``."""
        rows, kind, original = _rows(input_ids)
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        longest = max(len(r) for r in rows)
        if longest + max_new_tokens > self._dec.max_cache_len:
            raise ValueError(
                f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} does not fit the "
                f"KV cache of {self._dec.max_cache_len} tokens; build the decoder with a larger "
                "max_cache_len"
            )
        if eos_token_id is None:
            eos = list(self._eos)
        elif isinstance(eos_token_id, (int, np.integer)):
            eos = [int(eos_token_id)]
        else:
            eos = [int(e) for e in eos_token_id]
        # Checked whether or not sampling uses them: NaN compares false with everything,
        # so `temperature <= 0` let temperature=nan through.
        if not _is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if not _is_number(top_p) or not math.isfinite(top_p) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {top_k!r}")
        if do_sample:
            if temperature <= 0:
                raise ValueError("temperature must be positive when do_sample=True")
            if seed is None:
                seed = random.SystemRandom().getrandbits(63)
            sampling = dict(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
        else:
            sampling = dict(temperature=0.0, top_k=0, top_p=1.0)
            seed = 0 if seed is None else seed
        new_rows = []
        try:
            for i, r in enumerate(rows):
                new_rows.append(
                    self._dec.generate(
                        r, int(max_new_tokens), seed=int(seed) + i, eos=eos, **sampling
                    )
                )
        finally:
            self._dec.reset()
        width = max(len(n) for n in new_rows)
        if any(len(n) < width for n in new_rows):
            pad = pad_token_id if pad_token_id is not None else self._pad
            if pad is None:
                if not eos:
                    raise ValueError("rows stopped at different lengths and there is no pad_token_id")
                pad = eos[0]
            new_rows = [n + [int(pad)] * (width - len(n)) for n in new_rows]
        return _ids_like([r + n for r, n in zip(rows, new_rows)], kind, original)

    def reset(self) -> None:
        """Empties the KV cache."""
        self._dec.reset()

    # -- what it is --------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Tokens in the KV cache."""
        return self._dec.position

    @property
    def max_cache_len(self) -> int:
        return self._dec.max_cache_len

    @property
    def vocab_size(self) -> int:
        return self._dec.vocab_size

    @property
    def precision(self) -> str:
        """The format's canonical name (``int8``, ``int4:g64:calib``, ...)."""
        return self._dec.precision

    @property
    def kernels(self) -> str:
        """The kernels the weight matmuls run on this CPU."""
        return self._dec.kernels

    @property
    def eos_token_ids(self) -> List[int]:
        return list(self._eos)

    @property
    def weight_bytes(self) -> int:
        """Bytes of packed weights held."""
        return self._dec.weight_bytes

    @property
    def bits_per_weight(self) -> float:
        return self._dec.bits_per_weight

    @property
    def n_params(self) -> int:
        return self._dec.n_params

    @property
    def pack_seconds(self) -> float:
        """Seconds spent packing the weights (or reading the pack cache)."""
        return self._dec.pack_s

    @property
    def type_mix(self) -> dict:
        """Packed layouts and how many linears use each."""
        return dict(self._dec.type_mix)

    @property
    def pack_cache(self) -> Optional[str]:
        """What the pack cache did (``None`` when not used)."""
        return self._dec.pack_cache

    def encode(self, text: str, add_special: bool = False) -> List[int]:
        """Token ids of ``text`` (decoders from ``from_pretrained`` only)."""
        return list(self._dec.encode(text, add_special))

    def decode(self, ids: Any) -> str:
        """Text of token ids (decoders from ``from_pretrained`` only)."""
        return self._dec.decode(_token_list(ids, "ids"))

    def __repr__(self) -> str:
        return (
            f"KwkDecoder(precision={self.precision!r}, max_cache_len={self.max_cache_len}, "
            f"vocab_size={self.vocab_size}, weight_bytes={self.weight_bytes})"
        )


def _is_number(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float, np.integer, np.floating))


def _check_cache_len(max_cache_len: Any) -> None:
    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, (int, np.integer)):
        raise TypeError(f"max_cache_len must be an integer, got {max_cache_len!r}")
    if max_cache_len < 1:
        raise ValueError(f"max_cache_len must be at least 1, got {max_cache_len}")
