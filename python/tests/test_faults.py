"""Faults the Python surface must turn into clear Python exceptions (issue 42): thread
counts beyond the CLI's bound, non-finite sampling settings, a decoder that cannot fit in
memory, non-finite weights, and Ctrl-C while the GIL is released in ``forward``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import prompt, tiny_model
from kwk.decode import KwkDecoder

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def f32(llama):
    return KwkDecoder(llama, max_cache_len=64, precision="float32", threads=1)


def test_threads_beyond_the_cli_bound_are_a_value_error(llama):
    # 100000 threads failed to spawn inside the thread pool: a Rust panic, not a message.
    bound = 4 * (os.cpu_count() or 1)
    with pytest.raises(ValueError, match=r"threads=100000 is out of range: pass 1 to \d+"):
        KwkDecoder(llama, max_cache_len=8, precision="float32", threads=100000)
    with pytest.raises(ValueError, match="threads=0 is out of range"):
        KwkDecoder(llama, max_cache_len=8, precision="float32", threads=0)
    # The largest allowed count still builds (the same bound as kwk-eval --threads).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else bound // 4
    dec = KwkDecoder(llama, max_cache_len=8, precision="float32", threads=4 * cores)
    assert dec.forward([[1, 2, 3]]).shape == (1, 3, 320)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(do_sample=True, temperature=float("nan")), "temperature"),
        (dict(do_sample=False, temperature=float("nan")), "temperature"),
        (dict(do_sample=True, temperature=float("inf")), "temperature"),
        (dict(do_sample=True, temperature=-1.0), "temperature"),
        (dict(do_sample=False, temperature=-0.5), "temperature"),
        (dict(do_sample=True, top_p=float("nan")), "top_p"),
        (dict(do_sample=True, top_p=0.0), "top_p"),
        (dict(do_sample=False, top_p=1.5), "top_p"),
        (dict(do_sample=True, top_k=-1), "top_k"),
    ],
)
def test_non_finite_or_out_of_range_sampling_is_a_value_error(f32, kwargs, match):
    with pytest.raises(ValueError, match=match):
        f32.generate(prompt(4), max_new_tokens=2, **kwargs)


def test_the_native_generate_checks_sampling_too(f32):
    raw = f32._dec
    with pytest.raises(ValueError, match="temperature=NaN is out of range"):
        raw.generate([1, 2, 3], 2, temperature=float("nan"), top_p=1.0)
    with pytest.raises(ValueError, match="temperature=1000 is out of range"):
        raw.generate([1, 2, 3], 2, temperature=1000.0, top_p=1.0)
    with pytest.raises(ValueError, match="top_p=NaN is out of range"):
        raw.generate([1, 2, 3], 2, temperature=1.0, top_p=float("nan"))
    with pytest.raises(ValueError, match="top_p=0 is out of range"):
        raw.generate([1, 2, 3], 2, temperature=1.0, top_p=0.0)
    raw.reset()


def test_a_kv_cache_that_cannot_fit_is_a_memory_error():
    # 2**27 positions of a 2-layer model with 2 KV heads of 16: 2 x 2 x 2 x 16 x 4 bytes
    # per position = 68.7 GB. The constructor reserved and filled it.
    big = tiny_model("llama", max_position_embeddings=2**27)
    with pytest.raises(MemoryError, match=r"needs about 68\.7 GB resident .*KV cache 68\.7 GB.*available"):
        KwkDecoder(big, max_cache_len=2**27, precision="int8")


def test_memory_check_uses_the_testing_override_and_can_be_skipped(llama, fixtures_dir, monkeypatch):
    monkeypatch.setenv("KWK_TEST_MEM_AVAILABLE_BYTES", "1000")
    with pytest.raises(MemoryError, match=r"available \(KWK_TEST_MEM_AVAILABLE_BYTES\)"):
        KwkDecoder(llama, max_cache_len=16, precision="float32")
    with pytest.raises(MemoryError, match="tiny-llama"):
        KwkDecoder.from_pretrained(fixtures_dir / "tiny-llama", max_cache_len=16, precision="int4")
    monkeypatch.setenv("KWK_MEMORY_CHECK", "0")
    KwkDecoder(llama, max_cache_len=16, precision="float32")


def test_non_finite_weights_are_refused_with_the_tensor_named():
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight[3, :10] = float("nan")
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.self_attn\.q_proj\.weight' has 10 non-finite values"):
        KwkDecoder(model, max_cache_len=16, precision="float32")
    # float16 weights that overflowed to Inf when converted.
    model = tiny_model("llama").to(torch.float16)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, :3] = float("inf")
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight' has 3 non-finite values"):
        KwkDecoder(model, max_cache_len=16, precision="int8")


def test_ctrl_c_during_forward_is_keyboard_interrupt(fixtures_dir):
    # In a child process whose first NumPy use by the native module is the first forward
    # (from_pretrained reads no array). SIGINT is sent once the main thread is inside the
    # native forward call (its frame stopped at the call instruction, the GIL released),
    # so it is pending when forward returns: it must surface as KeyboardInterrupt, not as
    # a PanicException from the NumPy capsule's import. The forward repeats until then. The
    # interrupter polls every 1 ms: spinning, it held the GIL against the main thread and
    # took 46 s to land alone, and more than the 120 s deadline once on a loaded machine
    # (2026-12-07); polling, about 1 s.
    code = r"""
import dis, os, signal, sys, threading, time
from kwk.decode import KwkDecoder
dec = KwkDecoder.from_pretrained(sys.argv[1], max_cache_len=256, precision="float32", threads=1)
raw, ids = dec._dec, list(range(3, 258))
def call():
    return raw.forward(ids)
at = [i.offset for i in dis.get_instructions(call) if i.opname.startswith("CALL")]
main = threading.main_thread().ident
def interrupter():
    while True:
        f = sys._current_frames().get(main)
        if f is not None and f.f_code is call.__code__ and f.f_lasti in at:
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.001)
threading.Thread(target=interrupter, daemon=True).start()
deadline = time.monotonic() + 120
try:
    while time.monotonic() < deadline:
        raw.reset()
        call()
    print("never interrupted")
except KeyboardInterrupt:
    print("interrupted")
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(fixtures_dir / "tiny-llama")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert "PanicException" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted", (out.stdout, out.stderr)
