"""Proofs that a Hugging Face folder made by scripts/make-hf-folder.py is the GGUF it came
from, shared by scripts/check-hf-folder.py and the Python tests (python/tests/
test_model_folders.py). Needs numpy, torch and transformers (the venv of
scripts/test-python.sh) and llama.cpp's tools:

  logits     transformers' float32 logits of the folder against the float64 numpy forward
             of the GGUF (scripts/lib/llama_ref.py) on seeded tokens
  tokens     transformers' tokenizer of the folder against llama-tokenize on the GGUF
  round trip llama.cpp's convert_hf_to_gguf.py run on the folder (--outtype f32): every
             tensor bit-identical to the GGUF's and the tokenizer metadata equal (the
             converter also checks the pre-tokenizer by hashing a test text's ids)
"""
import os
import subprocess
import tempfile

import numpy as np

import gguf_io
from llama_ref import Model, compare_logits, forward, seeded_tokens

# Strings for the pre-tokenizer's corner cases: digits, spaces, newlines, contractions,
# unicode letters and numbers, emoji, special tokens.
TRICKY = [
    " ",
    "  ",
    "\n",
    "\r\n",
    "Hello world",
    " Hello  world  ",
    "line one\r\nline two\r\n\r\n = Heading = \r\n",
    "tabs\tand\t\tmore\t",
    "it's, we're, they've, I'm, he'll, she'd, don't",
    "IT'S WE'RE THEY'VE I'M HE'LL SHE'D",
    "'''quoted''' and ''double''",
    "1234567890 12 345 6,789.01 1e-5 -42",
    "2024-01-31T12:00:00Z",
    "x\u00b2+y\u00b3=z\u00b9 \u00bd \u2153 \u216b \u2460 \u0663\u0664\u0665 \u0967\u0968\u0969",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00c5ngstr\u00f6m",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440, \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u6587\u672c\u3002\ud55c\uad6d\uc5b4",
    "emoji \U0001f600\U0001f389\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 flags \U0001f1eb\U0001f1f7",
    "non\u00a0breaking\u2009thin\u3000ideographic",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "@-@ @,@ @.@ \u2014 \u2013 \u2018single\u2019 \u201cdouble\u201d \u2026",
    "trailing spaces   ",
    "    leading spaces",
    "mixed \n \r\n\t \u00a0\n end",
]


def perplexity_text(path):
    """The text llama-perplexity scores: the file's bytes with one trailing newline removed."""
    with open(path, "rb") as f:
        b = f.read()
    if b.endswith(b"\n"):
        b = b[:-1]
    return b.decode("utf-8")


def llama_tokenize(bin_dir, gguf_path, text):
    """llama.cpp's ids for `text` (special tokens parsed, as transformers does by default;
    no BOS unless the model adds one)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        name = f.name
    try:
        env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
        out = subprocess.run(
            [os.path.join(bin_dir, "llama-tokenize"), "-m", gguf_path, "-f", name, "--ids", "--log-disable", "--no-escape"],
            check=True,
            capture_output=True,
            env=env,
        ).stdout.decode()
    finally:
        os.remove(name)
    line = [ln for ln in out.splitlines() if ln.strip().startswith("[")][-1]
    inner = line.strip()[1:-1].strip()
    return [int(x) for x in inner.split(",")] if inner else []


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_tokens(folder, gguf_path, bin_dir, wiki_path, lines=60):
    """Returns a list of mismatch descriptions (empty: all equal) and the number of texts and
    ids compared: the whole perplexity text, its first `lines` non-empty lines one by one,
    and TRICKY."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = perplexity_text(wiki_path)
    texts = [text] + [ln for ln in text.split("\n") if ln.strip()][:lines] + TRICKY
    # One llama-tokenize run per text (0.15 s each: it loads the vocabulary only).
    bad, n_ids = [], 0
    for t in texts:
        ours = tok.encode(t, add_special_tokens=True)
        theirs = llama_tokenize(bin_dir, gguf_path, t)
        n_ids += len(theirs)
        i = first_difference(ours, theirs)
        if i is not None:
            bad.append(
                f"{t[:60]!r}: transformers {len(ours)} ids, llama-tokenize {len(theirs)}; first difference at "
                f"{i}: {ours[max(0, i - 3) : i + 4]} vs {theirs[max(0, i - 3) : i + 4]}"
            )
    return bad, len(texts), n_ids


def check_logits(folder, gguf_path, n_tokens=32, seed=0):
    """(max |diff|, mean KLD, top-1 agreement, logit range) of transformers' float32 logits of
    the folder against the float64 forward of the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM

    m = Model(gguf_path)
    tokens = seeded_tokens(m.output_matrix().shape[0], n_tokens, seed)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    hf.eval()
    with torch.no_grad():
        got = hf(torch.tensor(tokens)[None]).logits[0].double().numpy()
    return compare_logits(forward(m, tokens), got)


def _norm(v):
    t, x = v
    if t == gguf_io.ARRAY:
        e, items = x
        return (t, e, list(items) if e == gguf_io.STRING else np.asarray(items).tolist())
    return v


def compare_ggufs(a_path, b_path):
    """Differences between two float32 GGUFs: (tensors not bit-identical or missing, metadata
    keys outside general.* that differ, with the values)."""
    a, b = gguf_io.GGUF(a_path), gguf_io.GGUF(b_path)
    tensors = sorted(set(a.order) ^ set(b.order))
    for n in a.order:
        if n in b.tensors and not np.array_equal(a.array(n).view(np.uint32), b.array(n).view(np.uint32)):
            tensors.append(n)
    meta = []
    for k in sorted(set(a.meta) | set(b.meta)):
        if k.startswith("general."):
            continue
        va, vb = a.meta.get(k), b.meta.get(k)
        if va is None or vb is None or _norm(va) != _norm(vb):
            meta.append((k, repr(va)[:80], repr(vb)[:80]))
    return tensors, meta


def convert(folder, out, llama_src, python):
    """Runs llama.cpp's convert_hf_to_gguf.py on the folder (float32); returns its log."""
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_src, "gguf-py"))
    p = subprocess.run(
        [python, os.path.join(llama_src, "convert_hf_to_gguf.py"), folder, "--outtype", "f32", "--outfile", out],
        capture_output=True,
        env=env,
        text=True,
    )
    if p.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder}:\n{p.stderr[-3000:]}")
    return p.stderr
