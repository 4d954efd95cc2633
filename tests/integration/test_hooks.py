"""The one hook API (tokenfield.models.hooks): sites, order and clean-up."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integration.tiny import PROMPTS, tiny_loaded
from tokenfield.models.capture import capture_residual
from tokenfield.models.hooks import Order, hook, hooks, resolve_site, site_for_time
from tokenfield.steering import SteeringVector, steering


def _vector(model, layer: int) -> SteeringVector:
    rng = np.random.default_rng(layer)
    provenance = {"model": model.run_config(), "from": "a", "to": "b"}
    return SteeringVector(rng.standard_normal(model.d_model).astype(np.float32), layer, provenance)


def _ids(model):
    return torch.tensor([model.tokenizer(PROMPTS[3])["input_ids"]])


def _capture(model, ids):
    with capture_residual(model.sites) as cap, torch.no_grad():
        cap.reset(model.n_layers + 1, torch.ones(ids.shape, dtype=torch.bool))
        model.model(ids)
    return [s.clone() for s in cap.states]


def _total_hooks(model) -> int:
    modules = [*model.sites.blocks, model.sites.final_norm]
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in modules)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("layer", [0, 2])
def test_a_readout_registered_before_steering_sees_the_steered_value(kind, layer):
    """The capture enters first, the steering second: the capture still reads the
    steered states (interventions run before read-outs at every site)."""
    model = tiny_loaded(kind)
    ids = _ids(model)
    plain = _capture(model, ids)
    vector = _vector(model, layer)
    delta = torch.from_numpy(2.0 * vector.vector)
    with capture_residual(model.sites) as cap, torch.no_grad():
        cap.reset(model.n_layers + 1, torch.ones(ids.shape, dtype=torch.bool))
        with steering(model, vector, 2.0, positions="all"):  # registered after the read-out
            model.model(ids)
        states = list(cap.states)
    for time in range(layer):
        torch.testing.assert_close(states[time], plain[time], rtol=0, atol=0)
    # at the steered site the read-out sees exactly the unsteered value plus the vector
    torch.testing.assert_close(states[layer], plain[layer] + delta, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(states[layer + 1], plain[layer + 1])
    assert _total_hooks(model) == 0


def test_order_not_registration_decides_and_replacements_chain():
    model = tiny_loaded("llama")
    ids = _ids(model)
    seen: list[tuple[str, float]] = []

    def read(name):
        return lambda h: seen.append((name, float(h[0, 0, 0])))

    with (
        hook(model, "block.1", read("read-1")),
        hook(model, "block.1", lambda h: h + 1.0, order=Order.INTERVENE),
        hook(model, "block.1", read("read-2")),
        hook(model, "block.1", lambda h: h * 2.0, order=Order.INTERVENE),
        torch.no_grad(),
    ):
        model.model(ids)
    (name1, v1), (name2, v2) = seen
    assert (name1, name2) == ("read-1", "read-2")  # read-outs in registration order
    plain = _capture(model, ids)[2]  # time 2 = block.1's output
    assert v1 == v2 == pytest.approx((float(plain[0, 0]) + 1.0) * 2.0, rel=1e-6)


def test_hooks_are_removed_on_exit_even_on_error():
    model = tiny_loaded("gpt2")
    before = _total_hooks(model)

    def nothing(_value):
        return None

    pairs = [("embed", nothing), ("block.0", nothing), ("final_norm", nothing)]
    with pytest.raises(RuntimeError, match="boom"), hooks(model, pairs):
        assert _total_hooks(model) == before + 3
        with hook(model, "block.0", nothing, order=Order.INTERVENE):
            assert _total_hooks(model) == before + 3  # one dispatcher per module
        raise RuntimeError("boom")
    assert _total_hooks(model) == before
    assert not any("_tokenfield_dispatchers" in b.__dict__ for b in model.sites.blocks)


def test_sites_resolve_once():
    model = tiny_loaded("llama")
    blocks = model.sites.blocks
    embed = resolve_site(model, "embed")
    assert embed.module is blocks[0] and embed.pre
    assert resolve_site(model, "block.2").module is blocks[2]
    assert not resolve_site(model, "block.2").pre
    assert resolve_site(model, "final_norm").module is model.sites.final_norm
    assert resolve_site(model, "attn.1").module is blocks[1].self_attn
    assert [site_for_time(t) for t in range(3)] == ["embed", "block.0", "block.1"]
    for bad in ("block.3", "head.0", "block.x"):
        with pytest.raises(ValueError):
            resolve_site(model, bad)
    with pytest.raises(ValueError, match="no final norm"):
        resolve_site(tiny_loaded("bert"), "final_norm")
