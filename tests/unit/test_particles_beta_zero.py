"""beta = 0: uniform weights over the allowed keys, with and without the causal mask."""

import pytest
import torch

import tokenfield as tf


@pytest.mark.parametrize("normalization", ["sa", "usa"])
@pytest.mark.parametrize("causal", [False, True])
def test_beta_zero_is_the_plain_mean(normalization, causal):
    x = tf.initial_condition("uniform", n=7, d=4, seed=3)
    v = tf.Dynamics(beta=0.0, causal=causal, normalization=normalization).vector_field(0.0, x)
    n = x.shape[0]
    if causal:
        counts = torch.arange(1, n + 1, dtype=x.dtype)[:, None]
        mean = x.cumsum(0) / counts  # SA: average over j <= i
        pulled = mean if normalization == "sa" else x.cumsum(0) / n  # USA: Z_i = n
    else:
        pulled = x.mean(0, keepdim=True).expand_as(x)
    expected = pulled - (pulled * x).sum(-1, keepdim=True) * x  # tangent projection
    assert not torch.isnan(v).any()
    torch.testing.assert_close(v, expected, rtol=1e-10, atol=1e-12)
