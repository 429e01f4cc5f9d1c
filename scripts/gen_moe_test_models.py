#!/usr/bin/env python3
"""Writes two tiny random mixture-of-experts models (qwen2_moe with a shared expert,
qwen3_moe with q/k norms and an explicit head_dim) for kwk's loader tests, each as a
Hugging Face folder (config.json + model.safetensors) and as a GGUF written with gguf-py's
GGUFWriter, using llama.cpp's own tensor-name table (gguf.TENSOR_NAMES) and key writers,
laid out as conversion/qwen.py lays out these architectures (stacked expert tensors,
`ffn_gate_inp_shexp` as written from the [1, d] HF tensor). The loaders must give the same
weights from both files.

Output: runners/kwk/tests/data/tiny-moe/{qwen2_moe,qwen3_moe}/ (about 100 KB in all).

Usage (gguf-py is only needed here, at generation time):
    pip install gguf numpy
    python3 scripts/gen_moe_test_models.py
"""

import json
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import MODEL_TENSOR as MT

OUT = Path(__file__).resolve().parent.parent / "runners/kwk/tests/data/tiny-moe"
SEED = 20261129

COMMON = {
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "num_experts": 3,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 8,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
MODELS = {
    "qwen2_moe": dict(
        COMMON,
        model_type="qwen2_moe",
        architectures=["Qwen2MoeForCausalLM"],
        num_attention_heads=2,
        shared_expert_intermediate_size=12,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        use_sliding_window=False,
        sliding_window=128,
    ),
    "qwen3_moe": dict(
        COMMON,
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        num_attention_heads=4,
        head_dim=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
}
GGUF_ARCH = {"qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE, "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE}


def hf_tensors(cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim", d // cfg["num_attention_heads"])
    q_dim, kv_dim = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    ffn, e = cfg["moe_intermediate_size"], cfg["num_experts"]
    r = lambda *shape: rng.normal(0, 0.3, shape).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": r(v, d), "model.norm.weight": r(d), "lm_head.weight": r(v, d)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = r(d)
        t[p + "post_attention_layernorm.weight"] = r(d)
        t[p + "self_attn.q_proj.weight"] = r(q_dim, d)
        t[p + "self_attn.k_proj.weight"] = r(kv_dim, d)
        t[p + "self_attn.v_proj.weight"] = r(kv_dim, d)
        t[p + "self_attn.o_proj.weight"] = r(d, q_dim)
        if cfg["model_type"] == "qwen2_moe":
            for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                t[p + f"self_attn.{x}_proj.bias"] = r(n)
            s = cfg["shared_expert_intermediate_size"]
            t[p + "mlp.shared_expert.gate_proj.weight"] = r(s, d)
            t[p + "mlp.shared_expert.up_proj.weight"] = r(s, d)
            t[p + "mlp.shared_expert.down_proj.weight"] = r(d, s)
            t[p + "mlp.shared_expert_gate.weight"] = r(1, d)
        else:
            t[p + "self_attn.q_norm.weight"] = r(hd)
            t[p + "self_attn.k_norm.weight"] = r(hd)
        t[p + "mlp.gate.weight"] = r(e, d)
        for x in range(e):
            t[p + f"mlp.experts.{x}.gate_proj.weight"] = r(ffn, d)
            t[p + f"mlp.experts.{x}.up_proj.weight"] = r(ffn, d)
            t[p + f"mlp.experts.{x}.down_proj.weight"] = r(d, ffn)
    return t


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        b = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_gguf(path: Path, cfg: dict, t: dict[str, np.ndarray]) -> None:
    arch = GGUF_ARCH[cfg["model_type"]]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if "shared_expert_intermediate_size" in cfg:
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg["vocab_size"])])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def name(kind: MT, bid: int | None = None, suffix: str = "weight") -> str:
        base = gguf.TENSOR_NAMES[kind]
        return (base.format(bid=bid) if bid is not None else base) + "." + suffix

    w.add_tensor(name(MT.TOKEN_EMBD), t["model.embed_tokens.weight"])
    w.add_tensor(name(MT.OUTPUT_NORM), t["model.norm.weight"])
    w.add_tensor(name(MT.OUTPUT), t["lm_head.weight"])
    for b in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{b}."
        plain = [
            (MT.ATTN_NORM, "input_layernorm.weight"),
            (MT.FFN_NORM, "post_attention_layernorm.weight"),
            (MT.ATTN_Q, "self_attn.q_proj.weight"),
            (MT.ATTN_K, "self_attn.k_proj.weight"),
            (MT.ATTN_V, "self_attn.v_proj.weight"),
            (MT.ATTN_OUT, "self_attn.o_proj.weight"),
            (MT.FFN_GATE_INP, "mlp.gate.weight"),
        ]
        if cfg["model_type"] == "qwen2_moe":
            plain += [
                (MT.FFN_GATE_SHEXP, "mlp.shared_expert.gate_proj.weight"),
                (MT.FFN_UP_SHEXP, "mlp.shared_expert.up_proj.weight"),
                (MT.FFN_DOWN_SHEXP, "mlp.shared_expert.down_proj.weight"),
                (MT.FFN_GATE_INP_SHEXP, "mlp.shared_expert_gate.weight"),
            ]
            for kind, x in ((MT.ATTN_Q, "q"), (MT.ATTN_K, "k"), (MT.ATTN_V, "v")):
                w.add_tensor(name(kind, b, "bias"), t[p + f"self_attn.{x}_proj.bias"])
        else:
            plain += [(MT.ATTN_Q_NORM, "self_attn.q_norm.weight"), (MT.ATTN_K_NORM, "self_attn.k_norm.weight")]
        for kind, hf in plain:
            w.add_tensor(name(kind, b), t[p + hf])
        for kind, proj in ((MT.FFN_GATE_EXP, "gate_proj"), (MT.FFN_UP_EXP, "up_proj"), (MT.FFN_DOWN_EXP, "down_proj")):
            stacked = np.stack([t[p + f"mlp.experts.{x}.{proj}.weight"] for x in range(cfg["num_experts"])])
            w.add_tensor(name(kind, b), stacked)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    rng = np.random.default_rng(SEED)
    for folder, cfg in MODELS.items():
        out = OUT / folder
        out.mkdir(parents=True, exist_ok=True)
        tensors = hf_tensors(cfg, rng)
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        write_safetensors(out / "model.safetensors", tensors)
        write_gguf(out / "model.gguf", cfg, tensors)
        print(folder, sum(a.size for a in tensors.values()), "parameters")


if __name__ == "__main__":
    main()
