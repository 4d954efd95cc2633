"""Cascade attention (shared prefix, per-prompt middles, per-row tokens, nothing copied)
gives the logits of a plain forward pass over each whole, unpadded sequence."""

from __future__ import annotations

import pytest
import torch

from tests.integration.tiny import VOCAB, tiny_hf_model
from tokenfield.models.cascade import SharedKV, cascade


def _kv(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3"])  # gemma3: sliding window 4
def test_cascade_equals_a_plain_forward_of_each_whole_sequence(kind):
    from transformers import DynamicCache

    hf = tiny_hf_model(kind)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, VOCAB, (7,), generator=gen).tolist()
    middles = [[], torch.randint(3, VOCAB, (2,), generator=gen).tolist(),
               torch.randint(3, VOCAB, (5,), generator=gen).tolist()]  # fmt: skip
    lasts = torch.randint(3, VOCAB, (3,), generator=gen).tolist()
    b, conditions, shared = len(middles), 2, len(prefix)
    with torch.inference_mode():
        prefix_cache = DynamicCache()
        hf(input_ids=torch.tensor([prefix]), position_ids=torch.arange(shared)[None],
           past_key_values=prefix_cache, use_cache=True)  # fmt: skip
        width = max(len(m) for m in middles)
        mid_ids = torch.zeros((b, width), dtype=torch.long)
        mid_mask = torch.zeros((b, width), dtype=torch.long)
        for r, middle in enumerate(middles):
            if middle:
                mid_ids[r, width - len(middle) :] = torch.tensor(middle)
                mid_mask[r, width - len(middle) :] = 1
        mid_positions = shared + (mid_mask.cumsum(-1) - 1).clamp(min=0)
        mid_cache = DynamicCache()
        with cascade(hf, SharedKV(prefix=_kv(prefix_cache), own_mask=mid_mask.bool())):
            hf(input_ids=mid_ids, position_ids=mid_positions, past_key_values=mid_cache,
               use_cache=True)  # fmt: skip
        levels = SharedKV(
            prefix=_kv(prefix_cache),
            middle=_kv(mid_cache),
            middle_mask=mid_mask.bool(),
            middle_positions=mid_positions,
            conditions=conditions,
        )
        own = DynamicCache()
        position = (shared + mid_mask.sum(-1, keepdim=True)).repeat(conditions, 1)
        step = torch.tensor(lasts)[:, None].repeat(conditions, 1)
        got = []
        with cascade(hf, levels):
            for _ in range(3):  # the last prompt token, then two generated ones
                logits = hf(input_ids=step, position_ids=position, past_key_values=own,
                            use_cache=True).logits[:, -1]  # fmt: skip
                got.append(logits)
                step, position = logits.argmax(-1)[:, None], position + 1
        assert hf.config._attn_implementation != "tokenfield_cascade"  # restored
        for i in range(b):
            sequence = prefix + middles[i] + [lasts[i]]
            for logits in got:
                reference = hf(input_ids=torch.tensor([sequence])).logits[0, -1]
                for j in range(conditions):  # every condition's row of prompt i
                    torch.testing.assert_close(logits[j * b + i], reference, rtol=1e-4, atol=1e-5)
                sequence = sequence + [int(logits[i].argmax())]


def test_cascade_restores_the_attention_even_on_error():
    hf = tiny_hf_model("llama")
    before = hf.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), cascade(hf, SharedKV()):
        raise RuntimeError("boom")
    assert hf.config._attn_implementation == before
