"""KwkDecoder's Python surface: the example in docs/python.md, input and output kinds, options and
their errors, sampling, the fixture models through from_pretrained, Ctrl-C and the GIL."""

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import kwk.cpu_backend as kcb
from conftest import kld, prompt, rel_err, tiny_model
from kwk.decode import KwkDecoder, runner_unsupported

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def f32(llama):
    return KwkDecoder(llama, max_cache_len=128, precision="float32")


def test_readme_example_prints_the_shape():
    out = subprocess.run(
        [sys.executable, str(HERE.parent / "examples" / "quickstart.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "torch.Size([1, 12])\n"


def test_cpu_backend_reports_availability():
    assert kcb.decoder_available() is True
    assert kcb.unavailable_reason() is None
    assert kcb.active_isa()


def test_cpu_backend_refuses_an_isa_this_cpu_lacks():
    # KWK_ISA naming no tier is refused with the Rust message (read at process start).
    code = "import kwk.cpu_backend as k; print(k.decoder_available()); print(k.unavailable_reason())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "KWK_ISA": "no-such-tier"},
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    lines = out.stdout.splitlines()
    assert lines[0] == "False"
    assert "KWK_ISA" in lines[1] and "no-such-tier" in lines[1]


def test_inputs_and_outputs_keep_their_kind(f32, llama):
    ids = prompt(6, seed=9, batch=2)
    as_torch = f32.generate(torch.from_numpy(ids), max_new_tokens=4)
    as_numpy = f32.generate(ids, max_new_tokens=4)
    as_list = f32.generate(ids.tolist(), max_new_tokens=4)
    assert isinstance(as_torch, torch.Tensor) and as_torch.dtype == torch.int64
    assert isinstance(as_numpy, np.ndarray) and as_numpy.dtype == np.int64
    assert isinstance(as_list, list) and isinstance(as_list[0], list)
    assert as_torch.shape == (2, 10)
    assert as_torch.tolist() == as_numpy.tolist() == as_list
    assert as_list[0][:6] == ids[0].tolist()
    # A single unbatched row comes back unbatched.
    one = f32.generate(ids[0].tolist(), max_new_tokens=4)
    assert one == as_list[0]
    logits = f32.forward(ids.astype(np.int32))
    assert isinstance(logits, np.ndarray) and logits.shape == (2, 6, 320)
    assert f32.position == 0


def test_eos_stops_a_row_and_pads_the_others(f32):
    ids = prompt(6, seed=11, batch=2)
    free = f32.generate(ids, max_new_tokens=6, eos_token_id=[])
    stop = int(free[0, 7])  # row 0's second new token
    got = f32.generate(ids, max_new_tokens=6, eos_token_id=stop, pad_token_id=0)
    assert got[0, :8].tolist() == free[0, :8].tolist()  # the EOS id is kept
    row1 = free[1, 6:].tolist()
    if stop in row1:
        pytest.fail("the chosen EOS appears in row 1 too; pick another seed")
    assert got.shape == free.shape
    assert got[0, 8:].tolist() == [0] * 4
    assert got[1].tolist() == free[1].tolist()


def test_sampling_is_seeded_and_follows_top_k(f32):
    ids = prompt(5, seed=2)
    a = f32.generate(ids, max_new_tokens=12, do_sample=True, seed=7, eos_token_id=[])
    b = f32.generate(ids, max_new_tokens=12, do_sample=True, seed=7, eos_token_id=[])
    c = f32.generate(ids, max_new_tokens=12, do_sample=True, seed=8, eos_token_id=[])
    greedy = f32.generate(ids, max_new_tokens=12, eos_token_id=[])
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()
    assert (
        f32.generate(ids, max_new_tokens=12, do_sample=True, top_k=1, seed=3, eos_token_id=[]).tolist()
        == greedy.tolist()
    )


def test_bad_options_raise_clear_errors(llama, f32):
    with pytest.raises(ValueError, match="not a kwk format"):
        KwkDecoder(llama, max_cache_len=16, precision="fp16")
    with pytest.raises(ValueError, match="int4"):
        KwkDecoder(llama, max_cache_len=16, precision="int8", group_size=64)
    with pytest.raises(ValueError, match="group_size"):
        KwkDecoder(llama, max_cache_len=16, precision="int4", group_size=48)
    with pytest.raises(ValueError, match="mix_bits"):
        KwkDecoder(llama, max_cache_len=16, precision="int4", mix_bits=4)
    with pytest.raises(ValueError, match="max_cache_len"):
        f32.generate(prompt(100), max_new_tokens=40)
    # Errors from Rust carry its message.
    with pytest.raises(ValueError, match="outside the vocabulary of 320"):
        f32.forward([[1, 2, 999]])
    f32.reset()
    with pytest.raises(ValueError, match="overflow the KV cache"):
        f32.forward(prompt(129, seed=4))
    f32.reset()
    with pytest.raises(ValueError, match="empty KV cache"):
        f32.forward([[1, 2]])
        f32.forward([[1, 2], [3, 4]])
    f32.reset()
    with pytest.raises(TypeError):
        f32.forward("not tokens")


def test_unsupported_models_say_why():
    import transformers

    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50)
    )
    why = runner_unsupported(gpt2, 16)
    assert why is not None and "gpt2" in why
    with pytest.raises(NotImplementedError, match="gpt2"):
        KwkDecoder(gpt2, max_cache_len=16)
    llama = tiny_model("llama")
    assert "max_position_embeddings" in runner_unsupported(llama, 4096)
    mistral = tiny_model("mistral", sliding_window=32)
    assert "sliding-window" in runner_unsupported(mistral, 64)
    assert runner_unsupported(mistral, 32) is None


def test_bf16_and_f16_weights_are_read_as_stored(llama):
    ids = prompt(16, seed=6)
    for dtype in (torch.bfloat16, torch.float16):
        m = tiny_model("llama").to(dtype)
        rounded = tiny_model("llama").to(dtype).float()  # the same weights, widened by torch
        got = KwkDecoder(m, max_cache_len=32, precision="float32").forward(ids)
        want = KwkDecoder(rounded, max_cache_len=32, precision="float32").forward(ids)
        assert np.array_equal(got, want), dtype


def test_int4_calibration_and_gptq(llama):
    ids = prompt(32, seed=5)
    ref = KwkDecoder(llama, max_cache_len=64, precision="float32").forward(ids)
    calib = prompt(600, seed=21).ravel()
    # Each forward appends to the decoder's KV cache (64 tokens): one call per decoder.
    plain = KwkDecoder(llama, max_cache_len=64, precision="int4").forward(ids)
    cal = KwkDecoder(llama, max_cache_len=64, precision="int4", calib=torch.from_numpy(calib))
    assert cal.precision == "int4:calib"
    cal_logits = cal.forward(ids)
    assert not np.array_equal(plain, cal_logits)
    assert kld(ref, cal_logits) < 2 * kld(ref, plain)
    with pytest.raises(ValueError, match="calib"):
        KwkDecoder(llama, max_cache_len=64, precision="int4", gptq=True)
    try:
        g = KwkDecoder(llama, max_cache_len=64, precision="int4", calib=calib, gptq=True)
    except NotImplementedError as e:  # the Rust side's refusal, with its message
        assert "gptq" in str(e)
    else:
        assert g.precision == "int4:calib:gptq"
        assert kld(ref, g.forward(ids)) < 2 * kld(ref, plain)


def test_the_other_low_bit_widths(llama):
    ids = prompt(32, seed=5)
    ref = KwkDecoder(llama, max_cache_len=64, precision="float32").forward(ids)
    klds = []
    for width in ("int3", "int5", "int6"):
        d = KwkDecoder(llama, max_cache_len=64, precision=width)
        assert d.precision == width
        klds.append(kld(ref, d.forward(ids)))
    # Budgets of Q3_K_M, Q5_K_M and Q6_K's size: the error falls with the width.
    assert klds[0] > klds[1] > klds[2], klds
    g = KwkDecoder(llama, max_cache_len=16, precision="int3", group_size=32, mix_bits=8)
    assert g.precision == "int3:g32:mix8"


def test_int8_calibration_and_gptq(llama):
    ids = prompt(32, seed=5)
    ref = KwkDecoder(llama, max_cache_len=64, precision="float32").forward(ids)
    calib = prompt(600, seed=21).ravel()
    plain = KwkDecoder(llama, max_cache_len=64, precision="int8").forward(ids)
    cal = KwkDecoder(llama, max_cache_len=64, precision="balanced", calib=calib)
    assert cal.precision == "int8:calib"
    assert kld(ref, cal.forward(ids)) < 2 * kld(ref, plain) + 1e-6
    g = KwkDecoder(llama, max_cache_len=64, precision="int8", calib=calib, gptq=True)
    assert g.precision == "int8:gptq"
    assert kld(ref, g.forward(ids)) < 2 * kld(ref, plain) + 1e-6
    with pytest.raises(ValueError, match="calib"):
        KwkDecoder(llama, max_cache_len=64, precision="int8", gptq=True)
    with pytest.raises(ValueError, match="precision='int8' or 'int4'"):
        KwkDecoder(llama, max_cache_len=64, precision="bf16", calib=calib)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mixtral"])
def test_from_pretrained_fixtures_match_the_model_objects(fixtures_dir, name):
    import transformers

    folder = fixtures_dir / name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = prompt(20, vocab=model.config.vocab_size, seed=13)
    with torch.no_grad():
        hf = model(torch.from_numpy(ids)).logits.numpy()
    from_object = KwkDecoder(model, max_cache_len=32, precision="float32").forward(ids)
    from_folder = KwkDecoder.from_pretrained(folder, max_cache_len=32, precision="float32")
    from_gguf = KwkDecoder.from_pretrained(folder / "model.gguf", max_cache_len=32, precision="float32")
    assert rel_err(from_object, hf) < 1e-4
    assert np.array_equal(from_folder.forward(ids), from_object)
    assert rel_err(from_gguf.forward(ids), from_object) < 1e-4
    # The files' tokenizer comes along.
    text = "The quick brown fox"
    assert from_folder.decode(from_folder.encode(text)) == text
    with pytest.raises(FileNotFoundError):
        KwkDecoder.from_pretrained(folder / "missing.gguf", max_cache_len=8)


def test_from_pretrained_pack_cache_round_trips(fixtures_dir, tmp_path):
    folder = fixtures_dir / "tiny-llama"
    ids = prompt(10, vocab=512, seed=3)
    cold = KwkDecoder.from_pretrained(folder, max_cache_len=16, precision="int8", cache_dir=tmp_path)
    warm = KwkDecoder.from_pretrained(folder, max_cache_len=16, precision="int8", cache_dir=tmp_path)
    assert list(tmp_path.iterdir())
    assert cold.pack_cache != warm.pack_cache
    assert np.array_equal(cold.forward(ids), warm.forward(ids))


def test_model_object_pack_cache_is_keyed_by_contents(llama, tmp_path):
    # Cold then warm from the same object: one file, the same logits; a changed weight (same
    # shapes) is a new key, packed anew, with different logits.
    ids = prompt(10, seed=4)
    cold = KwkDecoder(llama, max_cache_len=16, precision="int4", cache_dir=tmp_path)
    warm = KwkDecoder(llama, max_cache_len=16, precision="int4", cache_dir=tmp_path)
    packs = [p for p in tmp_path.iterdir() if p.suffix == ".kwkpack"]
    assert len(packs) == 1, list(tmp_path.iterdir())
    assert cold.pack_cache.startswith("Written"), cold.pack_cache
    assert warm.pack_cache.startswith("Loaded"), warm.pack_cache
    cold_logits = cold.forward(ids)
    assert np.array_equal(cold_logits, warm.forward(ids))
    changed = tiny_model("llama")
    with torch.no_grad():
        changed.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    other = KwkDecoder(changed, max_cache_len=16, precision="int4", cache_dir=tmp_path)
    assert other.pack_cache.startswith("Written"), other.pack_cache
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".kwkpack"]) == 2
    assert not np.array_equal(other.forward(ids), cold_logits)


def test_ctrl_c_interrupts_generate_and_the_gil_is_released():
    # In a child process. The GIL: with a 10 s switch interval a thread holding the GIL is
    # never preempted, so the main thread can count while the worker's forward computes only
    # if forward released it (held, the count stays 0); every 1000 counts it sleeps 0.1 ms,
    # so the worker can take the GIL back when forward returns (with `sleep(0)` the main
    # thread can re-take it before the woken worker runs, and on 2026-12-07 it did so until
    # the test's timeout). Ctrl-C: SIGINT is sent once the main
    # thread is demonstrably inside the native generate call (its frame stopped at the
    # `self._dec.generate(..., **sampling)` instruction, the GIL released), and generation
    # cannot end first: 2**18 - 8 new tokens with EOS disabled take minutes on any machine
    # (attention over a growing cache). So the interrupt always lands between tokens, however
    # fast or loaded the machine (a timer raced generation and lost on a loaded machine).
    code = r"""
import dis, os, signal, threading, time, sys
sys.path.insert(0, %r)
from conftest import tiny_model, prompt
from kwk.decode import KwkDecoder
dec = KwkDecoder(tiny_model("llama", hidden_size=256, num_hidden_layers=4, intermediate_size=512,
                 max_position_embeddings=4096), max_cache_len=4096, precision="float32", threads=1)
ids = prompt(2000)
entered, done = threading.Event(), []
def work():
    entered.set()
    dec.forward(ids)
    done.append(True)
sys.setswitchinterval(10)
t = threading.Thread(target=work)
t.start()
entered.wait()
n = 0
while not done:
    n += 1
    if n %% 1000 == 0:
        time.sleep(0.0001)
t.join()
sys.setswitchinterval(0.005)
print("counted", n)
long = 2**18
dec = KwkDecoder(tiny_model("llama", max_position_embeddings=long), max_cache_len=long,
                 precision="float32", threads=1)
gen = KwkDecoder.generate.__code__
native_call = [i.offset for i in dis.get_instructions(gen) if i.opname == "CALL_FUNCTION_EX"]
assert len(native_call) == 1, native_call
main = threading.main_thread().ident
def interrupter():
    while True:
        f = sys._current_frames().get(main)
        if f is not None and f.f_code is gen and f.f_lasti in native_call:
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.001)
threading.Thread(target=interrupter, daemon=True).start()
try:
    out = dec.generate(prompt(8), max_new_tokens=long - 8, eos_token_id=[])
    print("finished", out.shape)
except KeyboardInterrupt:
    print("interrupted")
""" % str(HERE)
    out = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("counted ") and int(lines[0].split()[1]) > 0, lines
    assert lines[1] == "interrupted", lines


def test_state_dict_tensors_are_read_in_place():
    from kwk.decode import _state_arrays

    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_model("qwen2").to(dtype)
        arrays, _keep = _state_arrays(model)
        params = dict(model.state_dict())
        assert arrays
        for name, _dt, arr in arrays:
            assert arr.ctypes.data == params[name].data_ptr(), (dtype, name)


def test_a_rust_panic_is_a_runtime_error_not_an_abort(llama):
    # The test hooks panic inside the same guards real calls run in (module functions and
    # decoder methods); the process survives and the decoder refuses further use.
    from kwk import _kwk

    with pytest.raises(RuntimeError, match=r"a Rust panic\): module hook"):
        _kwk._panic_for_test("module hook")
    dec = KwkDecoder(llama, max_cache_len=16, precision="float32")
    with pytest.raises(RuntimeError, match=r"a Rust panic\): decoder hook"):
        dec._dec._panic_for_test("decoder hook")
    with pytest.raises(RuntimeError, match="cannot be used; build a new one"):
        dec.forward(torch.tensor([[1, 2, 3]]))
    # Other decoders are unaffected.
    fresh = KwkDecoder(llama, max_cache_len=16, precision="float32")
    assert fresh.forward(torch.tensor([[1, 2, 3]])).shape[1] == 3
