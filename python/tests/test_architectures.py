"""KwkDecoder on tiny random transformers models of every architecture kwk runs: float32
logits against the transformers model's own, greedy generation against
``model.generate(do_sample=False)``, and the quantized formats' KL divergence from float32."""

import numpy as np
import pytest
import torch

from conftest import ARCHS, kld, prompt, rel_err, rtn_logits, tiny_model
from kwk.decode import KwkDecoder, runner_unsupported

# KL divergence limits from float32 on these tiny models (nats per token, mean over the
# prompt's positions). bf16 rounds weights to 8 significant bits; int8 quantizes weights
# (8-bit codes, groups of 64) and activations (8-bit, per 32) for its integer kernels: on
# these random models the measured KLDs were at most 5e-4 (bf16) and 1.1e-2 (int8, mixtral:
# quantization flips some expert choices). int4's limit is relative: it must do better than
# plain 4-bit round-to-nearest of the weights alone (symmetric, groups of 32, computed in
# torch by conftest.rtn_logits), although it quantizes the activations as well.
KLD_LIMITS = {"bf16": 2e-3, "int8": 3e-2}

@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch_model(request):
    return request.param, tiny_model(request.param)


def test_runner_supports_every_architecture(arch_model):
    arch, model = arch_model
    assert runner_unsupported(model, 256) is None


def test_float32_forward_matches_transformers(arch_model):
    arch, model = arch_model
    ids = torch.from_numpy(prompt(24, batch=2))
    with torch.no_grad():
        ref = model(ids).logits
    dec = KwkDecoder(model, max_cache_len=64, precision="float32")
    got = dec.forward(ids)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert got.shape == ref.shape == (2, 24, 320)
    err = rel_err(got, ref)
    assert err < 1e-4, f"{arch}: relative error {err:.2e}"
    # Row by row through the cache (one row continues at the cache position) gives the same.
    dec.reset()
    first = dec.forward(ids[:1, :10])
    rest = dec.forward(ids[:1, 10:])
    assert dec.position == 24
    assert rel_err(torch.cat([first, rest], 1), ref[:1]) < 1e-4


def test_greedy_generate_matches_transformers(arch_model):
    arch, model = arch_model
    ids = torch.from_numpy(prompt(8, seed=3, batch=2))
    n_new = 16
    with torch.no_grad():
        want = model.generate(
            ids, max_new_tokens=n_new, do_sample=False, attention_mask=torch.ones_like(ids)
        )
        # The comparison means something only if greedy choices are not near-ties.
        logits = model(want).logits[:, ids.shape[1] - 1 : -1]
        top2 = logits.topk(2, dim=-1).values
        margin = (top2[..., 0] - top2[..., 1]).min().item()
    assert margin > 1e-3, f"{arch}: a greedy choice is a near-tie ({margin:.2e})"
    dec = KwkDecoder(model, max_cache_len=64, precision="float32")
    got = dec.generate(ids, max_new_tokens=n_new)
    assert isinstance(got, torch.Tensor)
    assert got.tolist() == want.tolist(), arch
    assert dec.position == 0


@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
def test_quantized_formats_stay_near_float32(arch_model, precision):
    arch, model = arch_model
    ids = prompt(32, seed=5)
    ref = KwkDecoder(model, max_cache_len=64, precision="float32").forward(ids)
    dec = KwkDecoder(model, max_cache_len=64, precision=precision)
    got = dec.forward(ids)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    d = kld(ref, got)
    if precision == "int4":
        with torch.no_grad():
            hf = model(torch.from_numpy(ids)).logits.numpy()
        limit = kld(hf, rtn_logits(model, ids, bits=4))
    else:
        limit = KLD_LIMITS[precision]
    assert 0 < d < limit, f"{arch} {precision}: KLD {d:.3e}, limit {limit:.3e}"
    assert dec.weight_bytes < KwkDecoder(model, max_cache_len=8, precision="float32").weight_bytes
