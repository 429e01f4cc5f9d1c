"""Whether this CPU and build can run kwk's decoder, from the same Rust checks the
``kwk-eval`` command line makes (``KWK_ISA`` naming a kernel tier this CPU lacks is the one
refusal: every kernel has a portable version)."""

from typing import Optional

from kwk import _kwk


def decoder_available() -> bool:
    """True when this CPU and build can run the decoder; :func:`unavailable_reason` says
    why not otherwise."""
    return _kwk.decoder_unavailable() is None


def unavailable_reason() -> Optional[str]:
    """``None`` when the decoder can run here, else the reason (one line)."""
    return _kwk.decoder_unavailable()


def active_isa() -> str:
    """The kernel tier the decoder runs on this CPU (``avx512vnni``, ``avx2``, ``scalar``,
    ...), ``KWK_ISA`` respected."""
    return _kwk.active_isa()


__all__ = ["decoder_available", "unavailable_reason", "active_isa"]
