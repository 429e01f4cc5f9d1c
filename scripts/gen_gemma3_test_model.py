#!/usr/bin/env python3
"""Writes a tiny random Gemma 3 (text) model for kwk's tests, made with transformers'
own Gemma3ForCausalLM, with its golden logits:

    runners/kwk/tests/data/tiny-gemma3/
        config.json          transformers' Gemma3TextConfig as save_pretrained writes it
        model.safetensors    float32, Hugging Face names, RMSNorm weights as `w` of (1 + w)
        model.gguf           the same weights as llama.cpp lays out a gemma3 GGUF
                             (conversion/gemma.py: norms stored as 1 + w, no q/k permutation,
                             `gemma3.attention.sliding_window`), written with gguf-py
        golden.json          token ids and transformers' float32 logits for them (eager
                             attention), every position

The model is shaped so every Gemma 3 detail matters: the window (6) is shorter than the
golden sequence (40 tokens), two of three layers are local (layer_types), the local and
global RoPE bases differ, query_pre_attn_scalar (24) differs from head_dim (16), there are
two query heads per KV head, and every norm weight is random (transformers initialises
them to 0, which would hide the 1 + w). Weights are normal(0, 0.25), seeded.

Usage (the venv scripts/setup-convert.sh makes; gguf-py from the llama.cpp tree):
    PYTHONPATH=~/.cache/kwk/llama.cpp-0.3.36/src/gguf-py \\
        ~/.cache/kwk/python-venv/bin/python scripts/gen_gemma3_test_model.py
"""

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import MODEL_TENSOR as MT
from safetensors.torch import save_file
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

OUT = Path(__file__).resolve().parent.parent / "runners/kwk/tests/data/tiny-gemma3"
SEED = 20261206
N_TOKENS = 40

CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    query_pre_attn_scalar=24,
    sliding_window=6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)


def make_model() -> Gemma3ForCausalLM:
    torch.manual_seed(SEED)
    cfg = Gemma3TextConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    model = Gemma3ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.25)
    return model


def write_gguf(path: Path, cfg: dict, t: dict[str, np.ndarray]) -> None:
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GEMMA3])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    # llama.cpp's default pattern is 6; this model's is its own, one bool per layer.
    w.add_array(
        gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch="gemma3"),
        [t == "sliding_attention" for t in cfg["layer_types"]],
    )
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(cfg["vocab_size"])])
    w.add_token_scores([0.0] * cfg["vocab_size"])
    w.add_token_types([1] * cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def name(kind: MT, bid: int | None = None) -> str:
        base = gguf.TENSOR_NAMES[kind]
        return (base.format(bid=bid) if bid is not None else base) + ".weight"

    def norm(a: np.ndarray) -> np.ndarray:  # Gemma3Model.norm_shift
        return (a + 1.0).astype(np.float32)

    w.add_tensor(name(MT.TOKEN_EMBD), t["model.embed_tokens.weight"])
    w.add_tensor(name(MT.OUTPUT_NORM), norm(t["model.norm.weight"]))
    for b in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{b}."
        for kind, hf in [
            (MT.ATTN_NORM, "input_layernorm.weight"),
            (MT.ATTN_POST_NORM, "post_attention_layernorm.weight"),
            (MT.FFN_NORM, "pre_feedforward_layernorm.weight"),
            (MT.FFN_POST_NORM, "post_feedforward_layernorm.weight"),
            (MT.ATTN_Q_NORM, "self_attn.q_norm.weight"),
            (MT.ATTN_K_NORM, "self_attn.k_norm.weight"),
        ]:
            w.add_tensor(name(kind, b), norm(t[p + hf]))
        for kind, hf in [
            (MT.ATTN_Q, "self_attn.q_proj.weight"),
            (MT.ATTN_K, "self_attn.k_proj.weight"),
            (MT.ATTN_V, "self_attn.v_proj.weight"),
            (MT.ATTN_OUT, "self_attn.o_proj.weight"),
            (MT.FFN_GATE, "mlp.gate_proj.weight"),
            (MT.FFN_UP, "mlp.up_proj.weight"),
            (MT.FFN_DOWN, "mlp.down_proj.weight"),
        ]:
            w.add_tensor(name(kind, b), t[p + hf])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    model = make_model()
    model.config.save_pretrained(OUT)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(tensors, OUT / "model.safetensors", metadata={"format": "pt"})
    write_gguf(OUT / "model.gguf", CONFIG, {k: v.numpy() for k, v in tensors.items()})
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, N_TOKENS), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    golden = {
        "tokens": ids[0].tolist(),
        "vocab": CONFIG["vocab_size"],
        "logits": [float(x) for x in logits.flatten()],
    }
    (OUT / "golden.json").write_text(json.dumps(golden) + "\n")
    print(OUT, sum(v.numel() for v in tensors.values()), "parameters")


if __name__ == "__main__":
    main()
