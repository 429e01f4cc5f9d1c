#!/usr/bin/env python3
"""Proves that a Hugging Face folder made by scripts/make-hf-folder.py is the float32 GGUF
it was made from, and prints the figures:

  1. logits: transformers' float32 forward of the folder against the float64 numpy
     forward of the GGUF on 32 seeded tokens, max |diff| within float32 rounding (2e-3,
     the bound make-offgrid.py uses)
  2. tokens: the folder's tokenizer (transformers) against llama-tokenize on the GGUF:
     the whole of wiki.test.raw as llama-perplexity reads it, its first 60 non-empty lines
     one by one, and strings for the pre-tokenizer's corner cases; all ids equal
  3. round trip: llama.cpp's convert_hf_to_gguf.py on the folder (--outtype f32): every
     tensor bit-identical to the GGUF's and all non-general metadata equal, except the
     keys the converter always adds (listed), then llama-perplexity on both files equal
  4. kwk-eval --formats float32 on the folder and on the GGUF: equal perplexity

Run it with the converter's python (scripts/setup-convert.sh prints it):
  $PY scripts/check-hf-folder.py FOLDER SRC-F32.gguf [--chunks 10] [--kwk-eval BIN]
      [--llama-bin DIR] [--llama-src DIR] [--skip-ppl]
Exit 1 on any mismatch.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import hf_check  # noqa: E402
from llama_ref import MAX_KLD, MAX_LOGIT_DIFF  # noqa: E402

REPO = os.path.dirname(HERE)
WIKI = os.path.join(REPO, "datasets", "wikitext-2-raw", "wiki.test.raw")
CACHE = os.environ.get("KWK_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kwk"
)
# Keys llama.cpp's converter writes whatever the source: head sizes (equal to
# embedding_length / head_count here) and add_eos_token = false.
CONVERTER_ADDS = {"llama.attention.key_length", "llama.attention.value_length", "tokenizer.ggml.add_eos_token"}


def llama_ppl(bin_dir, gguf, chunks, threads):
    env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
    for k in [k for k in env if k.startswith("LLAMA_ARG_")]:
        del env[k]
    p = subprocess.run(
        [os.path.join(bin_dir, "llama-perplexity"), "-m", gguf, "-f", WIKI, "-c", "512", "--chunks", str(chunks),
         "-b", "512", "-ctk", "f32", "-ctv", "f32", "-t", str(threads)],
        capture_output=True, text=True, env=env,
    )
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        sys.exit(f"error: llama-perplexity failed on {gguf}:\n{(p.stdout + p.stderr)[-2000:]}")
    return float(m.group(1))


def kwk_ppl(bin_path, model, chunks, threads, out):
    p = subprocess.run(
        [bin_path, "--llm", model, "--text", WIKI, "--formats", "float32", "--no-speed", "--chunks", str(chunks),
         "--threads", str(threads), "--out", out],
        capture_output=True, text=True,
    )
    if p.returncode != 0:
        sys.exit(f"error: kwk-eval failed on {model}:\n{(p.stdout + p.stderr)[-2000:]}")
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)["runners"][0]["ppl"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("gguf")
    ap.add_argument("--chunks", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--kwk-eval", help="the kwk-eval binary (step 4 is skipped without it)")
    ap.add_argument("--llama-bin", default=os.environ.get("KWK_LLAMA_CPP_DIR") or os.path.join(CACHE, "llama.cpp-0.3.36", "build", "bin"))
    ap.add_argument("--llama-src", default=os.path.join(CACHE, "llama.cpp-0.3.36", "src"))
    ap.add_argument("--skip-ppl", action="store_true", help="skip the perplexity runs of steps 3 and 4")
    args = ap.parse_args()
    ok = True

    t = time.time()
    diff, kld, top1, spread = hf_check.check_logits(args.folder, args.gguf)
    good = diff <= MAX_LOGIT_DIFF and kld <= MAX_KLD
    ok &= good
    print(f"1. logits: transformers float32 vs numpy float64 on the GGUF: max |diff| {diff:.3g} (range {spread:.3g}), "
          f"mean KLD {kld:.3g}, top-1 {top1:.3f}  {'ok' if good else 'MISMATCH'}  ({time.time() - t:.0f} s)")

    t = time.time()
    bad, n_texts, n_ids = hf_check.check_tokens(args.folder, args.gguf, args.llama_bin, WIKI)
    ok &= not bad
    print(f"2. tokens: {n_texts} texts, {n_ids} ids from llama-tokenize: "
          f"{'all equal' if not bad else f'{len(bad)} MISMATCHES'}  ({time.time() - t:.0f} s)")
    for b in bad[:10]:
        print(f"   {b}")

    t = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        rt = os.path.join(tmp, "roundtrip-F32.gguf")
        hf_check.convert(args.folder, rt, args.llama_src, sys.executable)
        tensors, meta = hf_check.compare_ggufs(args.gguf, rt)
        extra = [k for k, _, _ in meta if k in CONVERTER_ADDS]
        meta = [x for x in meta if x[0] not in CONVERTER_ADDS]
        good = not tensors and not meta
        ok &= good
        print(f"3. round trip (convert_hf_to_gguf.py --outtype f32): tensors differing {len(tensors)}, metadata "
              f"differing {len(meta)} (keys the converter adds: {', '.join(extra) or 'none'})  "
              f"{'ok' if good else 'MISMATCH'}  ({time.time() - t:.0f} s)")
        for x in (tensors[:5] + meta[:5]):
            print(f"   {x}")
        if not args.skip_ppl:
            t = time.time()
            a = llama_ppl(args.llama_bin, args.gguf, args.chunks, args.threads)
            b = llama_ppl(args.llama_bin, rt, args.chunks, args.threads)
            ok &= a == b
            print(f"   llama-perplexity ({args.chunks} chunks, f32 KV): GGUF {a}, round trip {b}  "
                  f"{'equal' if a == b else 'DIFFERENT'}  ({time.time() - t:.0f} s)")

    if args.kwk_eval and not args.skip_ppl:
        t = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            a = kwk_ppl(args.kwk_eval, args.gguf, args.chunks, args.threads, os.path.join(tmp, "gguf"))
            b = kwk_ppl(args.kwk_eval, args.folder, args.chunks, args.threads, os.path.join(tmp, "hf"))
        rel = abs(a - b) / a
        ok &= rel <= 1e-6
        print(f"4. kwk-eval float32 ({args.chunks} chunks): GGUF {a!r}, folder {b!r} (rel diff {rel:.2e})  "
              f"{'ok' if rel <= 1e-6 else 'MISMATCH'}  ({time.time() - t:.0f} s)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
