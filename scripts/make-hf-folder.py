#!/usr/bin/env python3
"""Makes a Hugging Face (transformers) folder from a float32 llama GGUF, with numpy alone.

No model hub is reachable here, and the test model ships as a GGUF only, yet people hold
checkpoints, not GGUFs, and kwk-eval's llama.cpp ladder starts from one (llama.cpp's
convert_hf_to_gguf.py). This script writes the folder that checkpoint would be:

  config.json             LlamaForCausalLM with transformers' field names (transformers 5
                          layout: rope_parameters), tie_word_embeddings as the GGUF has it
                          (no output.weight: tied)
  model.safetensors       float32, written here: an 8-byte little-endian header length, the
                          JSON header (dtype, shape, data_offsets; padded with spaces to a
                          multiple of 8), then the raw little-endian data
  tokenizer.json          the byte-level BPE rebuilt from tokenizer.ggml.* (tokens, merges,
                          token types: control tokens become special added tokens) with the
                          pre-tokenizer llama.cpp names in tokenizer.ggml.pre: "smollm" is
                          individual digits, then GPT-2's byte-level split (llama.cpp's
                          src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM), "gpt-2" the
                          byte-level split alone
  tokenizer_config.json   bos/eos/pad/unk, add_bos_token, chat template, model_max_length
  special_tokens_map.json, generation_config.json

Tensor layout: GGUF stores W[out][in] as transformers does, except that llama.cpp's converter
permutes the rows of attn_q and attn_k of llama models (LlamaModel.permute in llama.cpp's
conversion/llama.py: rows viewed as [heads][2][head_dim/2] are transposed to
[heads][head_dim/2][2], turning rotate-half rope pairs (i, i + hd/2) into adjacent pairs
(2i, 2i+1)). The inverse is applied here: rows viewed as [heads][head_dim/2][2] are
transposed back to [heads][2][head_dim/2] (k with the kv head count).

Check before the rename: the safetensors file is read back and every tensor, re-permuted,
must equal the GGUF's bit for bit. The function-level proofs (transformers' logits against
the float64 forward of the GGUF, the tokenizer's ids against llama-tokenize, float32
perplexity, llama.cpp's converter round trip) are in scripts/check-hf-folder.py.

Usage:
  scripts/make-hf-folder.py SRC-F32.gguf [--out DIR]
      default DIR: <source without -F32.gguf>-hf beside the source
The folder is written under a temporary name and renamed when complete; a folder whose
record (hf-folder.json) matches the source is reused. Its path is the last line of stdout.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_ref import Model, fail  # noqa: E402

# Bumped when the folder's contents change, so that folders made by an older script are remade.
FOLDER_VERSION = 1
RECORD = "hf-folder.json"

# GGUF token types (llama.cpp's llama_token_type / gguf-py TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PRE_TOKENIZERS = {
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL],
    },
    "gpt-2": BYTE_LEVEL,
}


def hf_name(gguf_name):
    """The transformers parameter name of a GGUF llama tensor."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, layer, kind, _ = gguf_name.split(".")
    sub = {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }[kind]
    return f"model.layers.{layer}.{sub}.weight"


def unpermute(w, n_head):
    """Inverse of llama.cpp's LlamaModel.permute on the rows of a q or k matrix."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(m):
    """(transformers name, float32 array) in GGUF order, q/k rows in transformers' order."""
    for name in m.order:
        w = m.w(name)
        if name.endswith(".attn_q.weight"):
            w = unpermute(w, m.n_head)
        elif name.endswith(".attn_k.weight"):
            w = unpermute(w, m.n_kv)
        yield hf_name(name), np.ascontiguousarray(w, dtype="<f4")


def write_safetensors(path, tensors):
    """tensors: list of (name, float32 array)."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * ((-len(blob)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, a in tensors:
            f.write(a.tobytes())
        f.flush()
        os.fsync(f.fileno())


def read_safetensors(path):
    """name -> float32 array (a memory map), for the read-back check."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    n = struct.unpack("<Q", bytes(mm[:8]))[0]
    header = json.loads(bytes(mm[8 : 8 + n]).decode("utf-8"))
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F32", name
        lo, hi = h["data_offsets"]
        out[name] = np.frombuffer(mm, dtype="<f4", count=(hi - lo) // 4, offset=base + lo).reshape(h["shape"])
    return out


def f32_literal(x):
    """The shortest decimal that reads back as the same float32 (1e-05, not 9.99999974e-06)."""
    return float(repr(np.float32(x)).replace("np.float32(", "").rstrip(")"))


def config_json(m):
    g = m.gguf
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": g.get("tokenizer.ggml.bos_token_id"),
        "dtype": "float32",
        "eos_token_id": g.get("tokenizer.ggml.eos_token_id"),
        "head_dim": m.head_dim,
        "hidden_act": "silu",
        "hidden_size": m.d,
        "initializer_range": 0.02,
        "intermediate_size": int(m.w("blk.0.ffn_gate.weight").shape[0]),
        "max_position_embeddings": int(g.get("llama.context_length", 2048)),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": m.n_head,
        "num_hidden_layers": m.n_layer,
        "num_key_value_heads": m.n_kv,
        "pad_token_id": g.get("tokenizer.ggml.padding_token_id"),
        "pretraining_tp": 1,
        "rms_norm_eps": f32_literal(m.eps),
        "rope_parameters": {"rope_theta": f32_literal(m.rope_base), "rope_type": "default"},
        "tie_word_embeddings": m.tied,
        "use_cache": True,
        "vocab_size": int(m.w("token_embd.weight").shape[0]),
    }


def tokenizer_files(m):
    """(tokenizer.json, tokenizer_config.json, special_tokens_map.json) as dicts."""
    g = m.gguf
    model = g.get("tokenizer.ggml.model")
    pre = g.get("tokenizer.ggml.pre", "default")
    if model != "gpt2" or pre not in PRE_TOKENIZERS:
        fail(
            f"{m.path}: tokenizer '{model}' with pre-tokenizer '{pre}'; this script rebuilds byte-level "
            f"BPE ('gpt2') with pre-tokenizer {sorted(PRE_TOKENIZERS)} only"
        )
    tokens = list(g.get("tokenizer.ggml.tokens"))
    types = [int(t) for t in g.get("tokenizer.ggml.token_type")]
    merges = list(g.get("tokenizer.ggml.merges"))
    pairs = []
    for i, mrg in enumerate(merges):
        parts = mrg.split(" ")
        if len(parts) != 2:
            fail(f"{m.path}: merge {i} {mrg!r} is not two tokens separated by one space")
        pairs.append(parts)
    added = []
    for i, (tok, t) in enumerate(zip(tokens, types)):
        if t in (CONTROL, USER_DEFINED):
            added.append(
                {
                    "id": i,
                    "content": tok,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": t == CONTROL,
                }
            )
        elif t not in (NORMAL, UNUSED):
            fail(f"{m.path}: token {i} {tok!r} has type {t}; byte-level BPE has normal, control and user tokens")
    if len(set(tokens)) != len(tokens):
        fail(f"{m.path}: the token list has duplicates; a vocabulary cannot be rebuilt")
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": pairs,
        },
    }

    def tok(key):
        i = g.get(f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[int(i)]

    special = {k: tok(key) for k, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown"))}
    special = {k: v for k, v in special.items() if v is not None}
    config = {
        "add_prefix_space": bool(g.get("tokenizer.ggml.add_space_prefix", False)),
        "added_tokens_decoder": {
            str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in added
        },
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(g.get("llama.context_length", 2048)),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": len(tokens),
        **special,
    }
    for key in ("add_bos_token", "add_eos_token"):
        v = g.get(f"tokenizer.ggml.{key}")
        if v is not None:
            config[key] = bool(v)
    template = g.get("tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return tokenizer, config, special


def generation_config(m):
    g = m.gguf
    out = {"_from_model_config": True}
    for key, gkey in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        v = g.get(f"tokenizer.ggml.{gkey}_token_id")
        if v is not None:
            out[key] = int(v)
    return out


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def make(m, tmp):
    os.makedirs(tmp)
    tensors = list(hf_tensors(m))
    write_safetensors(os.path.join(tmp, "model.safetensors"), tensors)
    write_json(os.path.join(tmp, "config.json"), config_json(m))
    tokenizer, tok_config, special = tokenizer_files(m)
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    write_json(os.path.join(tmp, "tokenizer_config.json"), tok_config)
    write_json(os.path.join(tmp, "special_tokens_map.json"), special)
    write_json(os.path.join(tmp, "generation_config.json"), generation_config(m))
    # Read back: every tensor, re-permuted as llama.cpp's converter does, equals the GGUF's.
    back = read_safetensors(os.path.join(tmp, "model.safetensors"))
    if set(back) != {hf_name(n) for n in m.order}:
        fail(f"{tmp}: the safetensors file does not hold exactly the GGUF's tensors")
    for name in m.order:
        w = back[hf_name(name)]
        if name.endswith((".attn_q.weight", ".attn_k.weight")):
            n = m.n_head if ".attn_q." in name else m.n_kv
            w = w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if not np.array_equal(w.view(np.uint32), np.asarray(m.w(name)).view(np.uint32)):
            fail(f"{tmp}: {hf_name(name)} read back differs from the GGUF's {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a float32 llama GGUF (e.g. SmolLM2-135M-Instruct-F32.gguf)")
    ap.add_argument("--out", help="the folder to write (default: <source without -F32.gguf>-hf beside it)")
    args = ap.parse_args()
    if not os.path.isfile(args.source):
        fail(f"{args.source} not found; scripts/setup-model.sh makes the F32 GGUF")
    src = os.path.abspath(args.source)
    stem = os.path.basename(src)
    stem = stem[: -len(".gguf")] if stem.endswith(".gguf") else stem
    stem = stem[: -len("-F32")] if stem.endswith("-F32") else stem
    out = os.path.abspath(args.out or os.path.join(os.path.dirname(src), f"{stem}-hf"))
    st = os.stat(src)
    record = {
        "folder_version": FOLDER_VERSION,
        "source": os.path.basename(src),
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
    }
    record_path = os.path.join(out, RECORD)
    if os.path.isfile(record_path):
        try:
            with open(record_path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = None
        if old == record:
            print(f"present: {out}", file=sys.stderr)
            print(out)
            return
        print(f"remaking {out}: its record {record_path} differs from this source", file=sys.stderr)
    elif os.path.exists(out):
        fail(f"{out} exists but has no {RECORD}: not made by this script; remove it or pass --out")

    m = Model(src)
    print(f"making {out} from {src} (d={m.d}, {m.n_layer} layers, {'tied' if m.tied else 'untied'})", file=sys.stderr)
    tmp = f"{out}.tmp.{os.getpid()}"
    old_dir = f"{out}.old.{os.getpid()}"
    try:
        make(m, tmp)
        write_json(os.path.join(tmp, RECORD), record)
        if os.path.exists(out):
            os.rename(out, old_dir)
        os.rename(tmp, out)
    finally:
        for p in (tmp, old_dir):
            if os.path.exists(p):
                shutil.rmtree(p)
    print(out)


if __name__ == "__main__":
    main()
