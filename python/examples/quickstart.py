# The example in docs/python.md: a transformers model run by kwk's decoder in int8.
from transformers import LlamaConfig, LlamaForCausalLM
import torch, kwk.cpu_backend as kcb
from kwk.decode import KwkDecoder, runner_unsupported

model = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1)).eval()
if kcb.decoder_available() and runner_unsupported(model, 64) is None:
    dec = KwkDecoder(model, max_cache_len=64, precision="int8")    # or "int4"; "balanced" = int8
    out = dec.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=8,
                       eos_token_id=[])                             # random weights: no stop token
    print(out.shape)                                                # torch.Size([1, 12])
