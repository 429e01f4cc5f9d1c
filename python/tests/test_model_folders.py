"""The model files the set-up makes for kwk-eval's llama.cpp ladder:

- the Hugging Face folder of SmolLM2-135M-Instruct (scripts/make-hf-folder.py, made by
  scripts/setup-model.sh, which scripts/test.sh runs first) is the F32 GGUF: its tokenizer
  gives llama-tokenize's ids, transformers gives the GGUF's logits, kwk-eval gives the same
  float32 perplexity on either, and llama.cpp's own converter turns it back into the same
  GGUF, bit for bit;
- the widened off-grid copy (scripts/make-offgrid.py --variant wide) keeps the function of
  the model it is made from, with every linear's rows a multiple of 256, and the logits
  check refuses a copy whose norms were not folded (shown on the tiny fixture model: the
  real copy takes minutes and 900 MB, and scripts/check-offgrid.sh checks it).

The real model is found as the Rust tests find it (KWK_MODELS_DIR, else
$KWK_CACHE/models, else ~/.cache/kwk/models); a missing file fails, naming the set-up
script, rather than skipping.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts" / "lib"))
import gguf_io  # noqa: E402
import hf_check  # noqa: E402
from llama_ref import MAX_KLD, MAX_LOGIT_DIFF  # noqa: E402

NAME = "SmolLM2-135M-Instruct"
WIKI = REPO / "datasets" / "wikitext-2-raw" / "wiki.test.raw"
CONVERTER_ADDS = {"llama.attention.key_length", "llama.attention.value_length", "tokenizer.ggml.add_eos_token"}


def cache_root() -> Path:
    c = os.environ.get("KWK_CACHE")
    if c:
        return Path(c)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kwk"


def model_file(rel: str) -> Path:
    d = Path(os.environ.get("KWK_MODELS_DIR") or cache_root() / "models") / NAME
    p = d / rel
    assert p.exists(), f"{p} is missing: run scripts/setup-model.sh (or set KWK_MODELS_DIR)"
    return p


def llama_bin() -> Path:
    b = Path(os.environ.get("KWK_LLAMA_CPP_DIR") or cache_root() / "llama.cpp-0.3.36" / "build" / "bin")
    assert (b / "llama-tokenize").is_file(), f"{b}/llama-tokenize is missing: run scripts/setup-llama-cpp.sh"
    return b


def llama_src() -> Path:
    # The build is <llama.cpp>/build/bin; the converter is in the source tree beside it.
    s = llama_bin().parent.parent / "src"
    assert (s / "convert_hf_to_gguf.py").is_file(), f"{s}/convert_hf_to_gguf.py is missing: run scripts/setup-llama-cpp.sh"
    return s


def kwk_ppl(kwk_eval_bin, model, text, out, *extra):
    p = subprocess.run(
        [str(kwk_eval_bin), "--llm", str(model), "--text", str(text), "--formats", "float32", "--no-speed",
         "--threads", "2", "--out", str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((out / "results.json").read_text())["runners"][0]["ppl"]


# ---------------------------------------------------------------- the Hugging Face folder


def test_hf_folder_ids_equal_llama_tokenize():
    bad, n_texts, n_ids = hf_check.check_tokens(
        str(model_file(f"{NAME}-hf")), str(model_file(f"{NAME}-F32.gguf")), str(llama_bin()), str(WIKI), lines=0
    )
    assert not bad, "\n".join(bad[:10])
    assert n_ids > 300_000, n_ids  # the whole of wiki.test.raw was among the texts


def test_hf_folder_logits_equal_the_gguf_forward():
    diff, kld, top1, spread = hf_check.check_logits(
        str(model_file(f"{NAME}-hf")), str(model_file(f"{NAME}-F32.gguf")), n_tokens=16
    )
    assert diff <= MAX_LOGIT_DIFF and kld <= MAX_KLD, (diff, kld, top1, spread)
    assert spread > 10  # real logits, not a degenerate model


def test_hf_folder_float32_perplexity_equals_the_gguf(kwk_eval_bin, tmp_path):
    a = kwk_ppl(kwk_eval_bin, model_file(f"{NAME}-F32.gguf"), WIKI, tmp_path / "gguf", "--chunks", "2")
    b = kwk_ppl(kwk_eval_bin, model_file(f"{NAME}-hf"), WIKI, tmp_path / "hf", "--chunks", "2")
    assert abs(a - b) <= 1e-6 * a, (a, b)


def test_llama_cpp_converter_round_trips_the_folder(tmp_path):
    out = tmp_path / "roundtrip-F32.gguf"
    python = os.environ.get("KWK_PYTHON") or sys.executable
    hf_check.convert(str(model_file(f"{NAME}-hf")), str(out), str(llama_src()), python)
    tensors, meta = hf_check.compare_ggufs(str(model_file(f"{NAME}-F32.gguf")), str(out))
    assert tensors == [], tensors[:5]
    assert [m for m in meta if m[0] not in CONVERTER_ADDS] == [], meta


# ---------------------------------------------------------------- the widened copy


def make_wide(src: Path, *extra):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make-offgrid.py"), str(src), "--variant", "wide", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900,
    )


def test_wide_copy_keeps_the_function_with_rows_on_256(fixtures_dir, kwk_eval_bin, tmp_path):
    src = tmp_path / "tiny-F32.gguf"
    shutil.copy(fixtures_dir / "tiny-llama" / "model.gguf", src)
    p = make_wide(src)
    assert p.returncode == 0, p.stderr
    wide = Path(p.stdout.strip().splitlines()[-1])
    assert wide == tmp_path / "tiny-offgrid-wide-F32.gguf"
    g, o = gguf_io.GGUF(str(wide)), gguf_io.GGUF(str(src))
    # d 64 -> 256 with head_dim 16: 4/2 heads -> 16/8; eps scaled by 64/256.
    assert g.get("llama.embedding_length") == 256
    assert (g.get("llama.attention.head_count"), g.get("llama.attention.head_count_kv")) == (16, 8)
    eps = o.get("llama.attention.layer_norm_rms_epsilon")
    assert g.get("llama.attention.layer_norm_rms_epsilon") == float(np.float32(eps * 64 / 256))
    for name, (_, shape, _) in g.tensors.items():
        if len(shape) == 2 and not name.endswith("ffn_down.weight"):
            assert shape[1] == 256, (name, shape)  # ffn_down keeps the fixture's 160 inputs
    # No zero channel is left standing: the rotation spread the padding over all 256.
    emb = g.array("token_embd.weight")
    assert np.all(np.abs(emb).max(axis=0) > 0)
    # The same float32 perplexity as the source, by kwk-eval (make-offgrid.py has already
    # checked the float64 logits).
    text = fixtures_dir / "eval.txt"
    a = kwk_ppl(kwk_eval_bin, src, text, tmp_path / "a", "--ctx", "64", "--chunks", "4")
    b = kwk_ppl(kwk_eval_bin, wide, text, tmp_path / "b", "--ctx", "64", "--chunks", "4")
    assert abs(a - b) <= 1e-4 * a, (a, b)
    # A second run reuses the file.
    again = make_wide(src)
    assert again.returncode == 0 and "present:" in again.stderr, again.stderr


def test_logits_check_refuses_a_wide_copy_without_the_norm_fold(fixtures_dir, tmp_path):
    src = tmp_path / "tiny-F32.gguf"
    shutil.copy(fixtures_dir / "tiny-llama" / "model.gguf", src)
    p = make_wide(src)
    assert p.returncode == 0, p.stderr
    wide = gguf_io.GGUF(p.stdout.strip().splitlines()[-1])
    # Undo the sqrt(d/D) fold of the RMSNorm change: norm weights sqrt(D/d) = 2 times too big.
    shapes = {n: wide.tensors[n][1] for n in wide.order}
    bad = tmp_path / "bad-F32.gguf"

    def tensors():
        for n in wide.order:
            a = np.array(wide.array(n))
            yield n, (a * 2.0 if n.endswith("norm.weight") else a).astype(np.float32)

    gguf_io.write(str(bad), wide.meta, shapes, tensors(), wide.version, wide.alignment)
    v = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make-offgrid.py"), "--verify", str(src), str(bad)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900,
    )
    assert v.returncode == 1 and "does not compute the same function" in v.stderr, v.stderr


def test_hf_folder_of_the_untied_wide_copy_gives_its_logits(fixtures_dir, tmp_path):
    src = tmp_path / "tiny-F32.gguf"
    shutil.copy(fixtures_dir / "tiny-llama" / "model.gguf", src)
    p = make_wide(src)
    assert p.returncode == 0, p.stderr
    wide = p.stdout.strip().splitlines()[-1]
    h = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make-hf-folder.py"), wide],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900,
    )
    assert h.returncode == 0, h.stderr
    folder = h.stdout.strip().splitlines()[-1]
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["num_key_value_heads"] == 8
    diff, kld, _, _ = hf_check.check_logits(folder, wide, n_tokens=16)
    assert diff <= MAX_LOGIT_DIFF and kld <= MAX_KLD, (diff, kld)


# ---------------------------------------------------------------- the off-grid Gemma copy

TINY_GEMMA = REPO / "runners" / "kwk" / "tests" / "data" / "tiny-gemma3" / "model.gguf"


def make_gemma_copy(src: Path, *extra):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make-offgrid-gemma.py"), str(src), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900,
    )


def kwk_float32_logits(path: Path, ids):
    import torch
    from kwk.decode import KwkDecoder

    dec = KwkDecoder.from_pretrained(str(path), max_cache_len=64, precision="float32")
    return dec.forward(torch.from_numpy(ids)).numpy()


def test_gemma_copy_keeps_the_function_off_every_grid(tmp_path):
    # The tiny Gemma 3 (a window of 6 inside 40 tokens, local and global layers, 2 query heads
    # per KV head) through kwk's own decoder, an implementation independent of the script's
    # numpy check: the copy without the dither gives the source's logits.
    src = tmp_path / "tiny-gemma-F32.gguf"
    shutil.copy(TINY_GEMMA, src)
    p = make_gemma_copy(src, "--dither", "0", "--name", "exact")
    assert p.returncode == 0, p.stderr
    exact = Path(p.stdout.strip().splitlines()[-1])
    assert exact == tmp_path / "exact-F32.gguf"
    ids = np.random.default_rng(7).integers(3, 64, size=(1, 40)).astype(np.int64)
    ref = kwk_float32_logits(src, ids)
    got = kwk_float32_logits(exact, ids)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    # Every linear moved (no weight left where it was), the norms that absorbed a fold too.
    g, o = gguf_io.GGUF(str(exact)), gguf_io.GGUF(str(src))
    for name in o.order:
        a, b = np.asarray(o.array(name)), np.asarray(g.array(name))
        moves = name.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                               "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                               "attn_norm.weight", "ffn_norm.weight"))
        if moves:
            assert np.mean(a != b) > 0.99, name
        else:
            assert np.array_equal(a, b), name
    # The default copy also dithers the table, and records what that cost; a second run reuses it.
    d = make_gemma_copy(src)
    assert d.returncode == 0, d.stderr
    dithered = gguf_io.GGUF(d.stdout.strip().splitlines()[-1])
    assert np.mean(np.asarray(dithered.array("token_embd.weight")) != np.asarray(o.array("token_embd.weight"))) > 0.99
    record = json.loads(Path(d.stdout.strip().splitlines()[-1] + ".json").read_text())
    assert 0 < record["dither_kld"] < 0.05
    again = make_gemma_copy(src)
    assert again.returncode == 0 and "present:" in again.stderr, again.stderr


def test_gemma_logits_check_refuses_a_copy_without_the_fold(tmp_path):
    src = tmp_path / "tiny-gemma-F32.gguf"
    shutil.copy(TINY_GEMMA, src)
    p = make_gemma_copy(src, "--dither", "0")
    assert p.returncode == 0, p.stderr
    copy = gguf_io.GGUF(p.stdout.strip().splitlines()[-1])
    orig = gguf_io.GGUF(str(src))
    # The source's pre-norm weights put back: the folded factors are then applied twice.
    bad = tmp_path / "bad-F32.gguf"

    def tensors():
        for n in copy.order:
            a = orig.array(n) if n.endswith(("attn_norm.weight", "ffn_norm.weight")) else copy.array(n)
            yield n, np.array(a, dtype=np.float32)

    gguf_io.write(str(bad), copy.meta, {n: copy.tensors[n][1] for n in copy.order}, tensors(),
                  copy.version, copy.alignment)
    v = make_gemma_copy(src, str(bad), "--verify")
    # argparse puts the two files first: SOURCE OTHER --verify.
    assert v.returncode == 1 and "does not compute the same function" in v.stderr, v.stderr
