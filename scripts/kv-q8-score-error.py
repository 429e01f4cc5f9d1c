#!/usr/bin/env python3
"""How much each q8 KV-cache rounding rule perturbs attention, measured on a model's real
queries, keys and values (issue 39, reports/kv-quality-39/README.md, session 52).

Runs a Hugging Face Llama-family folder in float32 (transformers, eager attention) over
`--tokens` tokens of a text, taken from `--offset` tokens in (pick an offset past the
chunks perplexity scores, so the rule is chosen on held-out text), records every layer's
queries and keys after RoPE and its values, and for each rule rounds them as that rule
does and reports, averaged over layers and heads (causal pairs only):

- score MSE: mean of (s' - s)^2, s = q.k / sqrt(hd);
- attention KL: mean over queries of KL(softmax(s) || softmax(s'));
- output error: |o' - o|^2 / |o|^2 of the attention output (values rounded too).

Rules (blocks of 32 head dimensions, scale = max|x| / 127, code = round(x / scale)):
  plain          kwk before session 52: blocks over Hugging Face (rotate-half) order
  pair-blocks    blocks of 16 whole RoPE pairs (llama.cpp's grouping, no rotation)
  wht            keys and queries rotated by the orthonormal Walsh-Hadamard matrix of the
                 head dimension, values by that of 64 (llama.cpp's attn_rot since its
                 PR 21038), then plain blocks; the output rotated back
  wht-pairs      the same, the head's dimensions first put in GGUF order (llama.cpp's
                 exact coefficients on a Llama GGUF)
  plain+q        plain, the query rounded to q8_0 as well (llama.cpp's flash attention)
  wht-pairs+q    wht-pairs, the query rounded to q8_0 and scales to f16 (llama.cpp's whole rule)

Usage: kv-q8-score-error.py HF_FOLDER TEXT [--tokens 2048] [--offset 16384] [--layers all]
Needs torch, transformers and numpy (the converter's virtualenv has them).
"""

import argparse
import math
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("text")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--offset", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers.models.llama import modeling_llama
    except ImportError as e:
        print(f"kv-q8-score-error: {e}; run it with the converter's virtualenv python "
              "(scripts/setup-convert.sh)", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    tok = transformers.AutoTokenizer.from_pretrained(args.folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.folder, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with open(args.text, encoding="utf-8") as f:
        ids = tok(f.read(), add_special_tokens=False)["input_ids"]
    if len(ids) < args.offset + args.tokens:
        print(f"kv-q8-score-error: {args.text} has {len(ids)} tokens, fewer than "
              f"--offset + --tokens = {args.offset + args.tokens}", file=sys.stderr)
        sys.exit(2)
    ids = torch.tensor([ids[args.offset:args.offset + args.tokens]])

    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rec = {}
    orig = modeling_llama.apply_rotary_pos_emb

    def patched(q, k, cos, sin, *a, **kw):
        qo, ko = orig(q, k, cos, sin, *a, **kw)
        rec.setdefault("qk", []).append((qo[0].detach().clone(), ko[0].detach().clone()))
        return qo, ko

    modeling_llama.apply_rotary_pos_emb = patched
    vs = []
    hooks = [layer.self_attn.v_proj.register_forward_hook(
        lambda m, i, o: vs.append(o[0].detach().clone())) for layer in model.model.layers]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    modeling_llama.apply_rotary_pos_emb = orig

    def wht(n):
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return h / math.sqrt(n)

    def k_rot_size(d):
        # llama.cpp: the largest power of two (>= 64) dividing the head dimension.
        n = 64
        while d % (2 * n) == 0:
            n *= 2
        return n

    # GGUF order of a Llama head: dimension 2i is HF's i, 2i+1 is HF's i + hd/2.
    gguf = torch.tensor([(j // 2) + (j % 2) * (hd // 2) for j in range(hd)])

    def q8(x, f16_scale=False):
        shp = x.shape
        b = x.reshape(*shp[:-1], shp[-1] // 32, 32)
        amax = b.abs().amax(-1, keepdim=True)
        d = amax / 127
        inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        codes = torch.clamp(torch.round(b * inv), -127, 127)  # half-even; ties are rare
        if f16_scale:
            d = d.half().float()
        return (codes * d).reshape(shp)

    def rot(x, n):
        shp = x.shape
        return (x.reshape(*shp[:-1], shp[-1] // n, n) @ wht(n)).reshape(shp)

    def rules():
        kr, vr = k_rot_size(hd), 64
        return {
            "plain": lambda q, k, v: (q, q8(k), q8(v)),
            "pair-blocks": lambda q, k, v: (
                q[..., gguf], q8(k[..., gguf]), q8(v)),
            "wht": lambda q, k, v: (
                rot(q, kr), q8(rot(k, kr)), rot(q8(rot(v, vr)), vr)),
            "wht-pairs": lambda q, k, v: (
                rot(q[..., gguf], kr), q8(rot(k[..., gguf], kr)), rot(q8(rot(v, vr)), vr)),
            "plain+q": lambda q, k, v: (q8(q), q8(k), q8(v)),
            "wht-pairs+q": lambda q, k, v: (
                q8(rot(q[..., gguf], kr), True), q8(rot(k[..., gguf], kr), True),
                rot(q8(rot(v, vr), True), vr)),
        }

    if hd % 64 != 0:
        print(f"kv-q8-score-error: head_dim {hd} is not a multiple of 64 (no rotation rule)",
              file=sys.stderr)
        sys.exit(2)
    n = args.tokens
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    sums = {name: [0.0, 0.0, 0.0] for name in rules()}
    for layer, ((q, k), v) in enumerate(zip(rec["qk"], vs)):
        # q [nh][n][hd], k [nkv][n][hd], v [n][nkv*hd]
        v = v.reshape(n, nkv, hd).transpose(0, 1)
        k = k.repeat_interleave(nh // nkv, 0)
        v = v.repeat_interleave(nh // nkv, 0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, -1)
        o = p @ v
        for name, rule in rules().items():
            q2, k2, v2 = rule(q, k, v)
            s2 = (q2 @ k2.transpose(1, 2)) / math.sqrt(hd)
            s2 = s2.masked_fill(~mask, float("-inf"))
            err = torch.where(mask, s2 - s, torch.zeros_like(s))
            mse = (err ** 2).sum().item() / (mask.sum().item() * nh)
            logp, logp2 = torch.log_softmax(s, -1), torch.log_softmax(s2, -1)
            kl = torch.where(mask, p * (logp - logp2), torch.zeros_like(s)).sum(-1).mean().item()
            o2 = torch.softmax(s2, -1) @ v2
            oe = (((o2 - o) ** 2).sum() / (o ** 2).sum()).item()
            acc = sums[name]
            acc[0] += mse
            acc[1] += kl
            acc[2] += oe
        print(f"layer {layer} done", file=sys.stderr, flush=True)
    nl = len(vs)
    print(f"{args.folder}: {n} tokens from token {args.offset}, {nl} layers, hd {hd}")
    print(f"{'rule':<14} {'score MSE':>12} {'attn KL':>12} {'out rel err':>12}")
    for name, (mse, kl, oe) in sums.items():
        print(f"{name:<14} {mse / nl:12.4e} {kl / nl:12.4e} {oe / nl:12.4e}")


if __name__ == "__main__":
    main()
