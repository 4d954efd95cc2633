"""The attractor analysis on tiny random-weight models: the last token's layer map,
its Jacobian products against finite differences and full Jacobians, and the
command end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.integration.tiny import PROMPTS, tiny_loaded
from tokenfield.models.jacobian import (
    lanczos_singular,
    product_spectra,
    tangent_maps,
    top_singular,
)
from tokenfield.models.layer_map import LayerMap

MULTI = [p for p in PROMPTS if len(p.split()) > 1]


def _layer_map(kind: str = "llama", double: bool = False) -> LayerMap:
    model = tiny_loaded(kind)
    if double:
        model.model.double()
    ids = [model.tokenizer(p)["input_ids"] for p in MULTI]
    return LayerMap(model, ids)


def _full_jacobian(f, x: torch.Tensor) -> torch.Tensor:
    """``(B, d, d)`` built column by column: ``J e_i`` by central differences in
    float64 would be noisier than needed, so column ``i`` is ``jvp(f, e_i)`` of the
    plain map (no projection, no subspace code)."""
    batch, d = x.shape
    cols = []
    for i in range(d):
        e = torch.zeros_like(x)
        e[:, i] = 1
        cols.append(torch.func.jvp(f, (x,), (e,))[1])
    return torch.stack(cols, dim=-1)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_layer_map_replays_each_prompt_alone(kind):
    """The batched, left-padded map gives every prompt's own last-token states
    (plain Hugging Face, one prompt at a time), block by block."""
    layer_map = _layer_map(kind)
    model = layer_map.model
    for row, text in enumerate(MULTI):
        ids = torch.tensor([model.tokenizer(text)["input_ids"]])
        hidden = model.model(ids, output_hidden_states=True).hidden_states
        for t in range(layer_map.n_blocks):  # the last entry is after the final norm
            assert torch.allclose(layer_map.states[row, t], hidden[t][0, -1], atol=1e-5)
        x = layer_map.states[:, 1]
        assert torch.allclose(layer_map.block(1, x), layer_map.states[:, 2], atol=1e-6)


def test_jvp_and_vjp_match_central_differences():
    """``J v`` and ``u^T J`` of a block of the float32 model against central
    differences of the same float32 map. Float32 rounds at eps = 1.2e-7; with the
    step ``h = 1e-2 |x|`` the difference quotient's rounding error is about
    eps |f| / h ~ 1e-5 relative and its truncation error h^2 |f'''| ~ 1e-4: a
    relative tolerance of 2e-3 holds with a margin of about 10, while a wrong
    column or prompt order is off by O(1)."""
    layer_map = _layer_map()
    block = 1
    x = layer_map.states[:, block]  # (B, d) float32
    batch, d = x.shape
    m = 3
    matvec, rmatvec = tangent_maps(layer_map.block_fn(block), x, m)
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(batch, d, m, generator=gen)
    u = torch.randn(batch, d, m, generator=gen)
    h = 1e-2 * x.norm(dim=-1)[:, None]
    f = layer_map.block_fn(block)
    jv = matvec(v)
    ujt = rmatvec(u)
    for col in range(m):
        step = h * v[..., col]
        fd = (f(x + step) - f(x - step)) / (2 * h)
        err = (jv[..., col] - fd).norm(dim=-1) / fd.norm(dim=-1)
        assert float(err.max()) < 2e-3
        # u^T J v from the vjp against u . (J v) from the differences
        lhs = (ujt[..., col] * v[..., col]).sum(-1)
        rhs = (u[..., col] * fd).sum(-1)
        scale = u[..., col].norm(dim=-1) * fd.norm(dim=-1)  # |u^T w| <= |u| |w|
        assert float(((lhs - rhs).abs() / scale).max()) < 2e-3


def test_singular_values_match_the_full_jacobian():
    """Top-4 singular values of a block Jacobian and of its angular part
    ``P(y') J P(y) |x| / |x'|`` (float64) against the SVD of the Jacobian built
    column by column: within 1e-5 relative."""
    layer_map = _layer_map(double=True)
    block = 1
    x = layer_map.states[:, block]
    f = layer_map.block_fn(block)
    jac = _full_jacobian(f, x)  # (B, d, d)
    exact = torch.linalg.svdvals(jac)[:, :4]
    spec = top_singular(f, x, 4, oversample=32, tol=1e-12, max_iter=3)
    assert float(((spec.values - exact).abs() / exact).max()) < 1e-5
    y, out = x / x.norm(dim=-1, keepdim=True), f(x)
    y_out = out / out.norm(dim=-1, keepdim=True)
    eye = torch.eye(x.shape[-1], dtype=x.dtype)
    p_in = eye - y[:, :, None] * y[:, None, :]
    p_out = eye - y_out[:, :, None] * y_out[:, None, :]
    scale = (x.norm(dim=-1) / out.norm(dim=-1))[:, None, None]
    exact_angular = torch.linalg.svdvals(p_out @ jac @ p_in * scale)[:, :4]
    spec = top_singular(f, x, 4, angular=True, oversample=32, tol=1e-12, max_iter=3)
    assert float(((spec.values - exact_angular).abs() / exact_angular).max()) < 1e-5
    # the most sensitive direction is tangent
    assert float((spec.right[..., 0] * y).sum(-1).abs().max()) < 1e-10
    # stopped early, the reported residual bounds the top value's error
    for steps in (2, 3, 4):
        spec = lanczos_singular(f, x, 1, angular=True, tol=1e-12, max_iter=steps)
        top = torch.linalg.svdvals(p_out @ jac @ p_in * scale)[:, 0]
        error = (spec.values[:, 0] - top).abs() / top
        assert bool((error <= spec.residual[:, 0] * (1 + 1e-9)).all())


def test_lanczos_singular_values_match_the_full_jacobian():
    """Golub-Kahan-Lanczos (the block spectra's solver) against the SVD of the block
    Jacobian built column by column and of its angular part (float64): the top value
    within 1e-8 relative and the top four within 1e-4 at tol 1e-10; the residual it
    reports is below tol, and after 2-4 steps it bounds the top value's error; the
    sensitive direction is tangent."""
    layer_map = _layer_map(double=True)
    block = 1
    x = layer_map.states[:, block]
    f = layer_map.block_fn(block)
    jac = _full_jacobian(f, x)
    y, out = x / x.norm(dim=-1, keepdim=True), f(x)
    y_out = out / out.norm(dim=-1, keepdim=True)
    eye = torch.eye(x.shape[-1], dtype=x.dtype)
    p_in = eye - y[:, :, None] * y[:, None, :]
    p_out = eye - y_out[:, :, None] * y_out[:, None, :]
    scale = (x.norm(dim=-1) / out.norm(dim=-1))[:, None, None]
    for angular, matrix in ((False, jac), (True, p_out @ jac @ p_in * scale)):
        exact = torch.linalg.svdvals(matrix)[:, :4]
        spec = lanczos_singular(f, x, 4, angular=angular, tol=1e-10, max_iter=64)
        assert float(spec.residual[:, 0].max()) <= 1e-10
        rel = (spec.values - exact).abs() / exact
        assert float(rel[:, 0].max()) < 1e-8
        assert float(rel.max()) < 1e-4
    assert float((spec.right[..., 0] * y).sum(-1).abs().max()) < 1e-10


def test_block_product_matches_the_composite_map():
    """``J_{L-1} ... J_0`` (each block's Jacobian at its own traced state) against
    the Jacobian of the composite map ``x_0 -> x_L`` (float64, within 1e-6), and the
    top FTLE singular value of the composite against the product's."""
    layer_map = _layer_map(double=True)
    n = layer_map.n_blocks
    product = None
    for block in range(n):
        jac = _full_jacobian(layer_map.block_fn(block), layer_map.states[:, block])
        product = jac if product is None else jac @ product
    x0 = layer_map.states[:, 0]
    composite = _full_jacobian(layer_map.onward_fn(0), x0)
    rel = (product - composite).norm(dim=(-2, -1)) / composite.norm(dim=(-2, -1))
    assert float(rel.max()) < 1e-6
    spec = top_singular(layer_map.onward_fn(0), x0, 1, oversample=32, tol=1e-12, max_iter=3)
    exact = torch.linalg.svdvals(product)[:, 0]
    assert float(((spec.values[:, 0] - exact).abs() / exact).max()) < 1e-6


def test_sweep_spectra_match_the_product_from_every_start():
    """The FTLE sweep (every start block at once) against the SVD of the product of
    full block Jacobians ``P(y_L) J_{L-1} ... J_l P(y_l) |x_l| / |x_L|`` from each
    start ``l`` (float64): the residual below 1e-7, the top value within 1e-6
    relative, its right vector the top right singular vector (|cos| within 1e-6 of
    1), the plain product too."""
    layer_map = _layer_map(double=True)
    n = layer_map.n_blocks
    states = layer_map.states
    jacs = [_full_jacobian(layer_map.block_fn(b), states[:, b]) for b in range(n)]
    unit = states / states.norm(dim=-1, keepdim=True)
    eye = torch.eye(states.shape[-1], dtype=states.dtype)

    def proj(y):
        return eye - y[:, :, None] * y[:, None, :]

    fns = [layer_map.block_fn(b) for b in range(n)]
    p = n + 1 + 8  # columns: starts + k - 1 + oversample
    # plain in one batch; angular in slices of two prompts (max_rows), as in the pipeline
    for angular, max_rows in ((True, 2 * n * p), (False, 8192)):
        spec = product_spectra(fns, states, range(n), 2, angular=angular, oversample=8,
                               tol=1e-7, max_iter=400, max_rows=max_rows)  # fmt: skip
        assert spec.values.shape == (states.shape[0], n, 2)
        assert spec.starts == tuple(range(n))
        # converged: the forward sweep's M_l v_l agrees with sigma_1 u_1 (float64
        # stalls near sqrt(eps) = 1.5e-8; a wrong forward sweep never gets there)
        assert float(spec.residual.max()) <= 1e-7
        for start in range(n):
            product = jacs[start]
            for b in range(start + 1, n):
                product = jacs[b] @ product
            if angular:
                scale = states[:, start].norm(dim=-1) / states[:, -1].norm(dim=-1)
                product = proj(unit[:, -1]) @ product @ proj(unit[:, start]) * scale[:, None, None]
            _, sv, vh = torch.linalg.svd(product)
            got = spec.values[:, start, 0]
            assert float(((got - sv[:, 0]).abs() / sv[:, 0]).max()) < 1e-6
            cos = (spec.right[:, start] * vh[:, 0]).sum(-1).abs()
            assert float((1 - cos).abs().max()) < 1e-6


def test_small_perturbations_follow_the_linear_map():
    """At theta = 1e-4 along the most sensitive direction, the final angle ratio
    is the top angular singular value of the product (the linear regime), and the
    recovery arrays have the documented shapes."""
    from tokenfield.models.layer_map import perturbation_recovery

    layer_map = _layer_map(double=True)
    start = 1
    x = layer_map.states[:, start]
    spec = top_singular(layer_map.onward_fn(start), x, 1, angular=True, oversample=32,
                        tol=1e-12, max_iter=3)  # fmt: skip
    direction = spec.right[..., 0][None]  # (1, B, d)
    out = perturbation_recovery(layer_map, start, [1e-4, 1e-3], direction)
    assert out["angle_ratio"].shape == (2, 1, len(MULTI))
    ratio = out["angle_ratio"][0, 0]
    assert float(((ratio - spec.values[:, 0]).abs() / spec.values[:, 0]).max()) < 1e-2
    assert not bool(out["flipped"][0].any())


def test_final_readout_kl_is_the_plain_kl():
    """The perturbed rows' KL(p_ref || p), computed without repeating the reference
    per row (negative entropy, cross term, log-normaliser), equals the textbook
    ``sum p_ref (log p_ref - log p)`` from float64 log_softmax of the same logits,
    row by row. The logits are float32 (``LayerMap.logits``): the difference is
    float32 rounding of ``log V``-sized terms, under 1e-6 (a wrong prompt order or
    a missing normaliser is off by 1e-3 or more here). The top-1 token is the argmax."""
    from tokenfield.models.layer_map import _final_readout

    layer_map = _layer_map(double=True)
    final = layer_map.states[:, -1]
    gen = torch.Generator().manual_seed(3)
    rows = final.repeat(3, 1) + 0.3 * torch.randn(3 * final.shape[0], final.shape[1],
                                                  generator=gen, dtype=final.dtype)  # fmt: skip
    ref_logits = layer_map.logits(final)
    kl, top = _final_readout(layer_map, rows, ref_logits)
    ref_logp = torch.log_softmax(ref_logits.double(), -1)
    logp = torch.log_softmax(layer_map.logits(rows).double(), -1)
    ref = ref_logp.repeat(3, 1)
    expected = (ref.exp() * (ref - logp)).sum(-1)
    assert float(expected.min()) > 1e-6  # the rows moved: a real, nonzero KL
    assert float((kl.double() - expected).abs().max()) < 1e-6
    assert torch.equal(top, logp.argmax(-1))


def test_attractors_command_end_to_end(tmp_path, cli):
    """Trace a tiny model, run 'tokenfield attractors' on it: attractors.json with
    verdicts for the model and its random copy, attractors.zarr with the arrays;
    a bad theta grid is one line and exit status 2."""
    import xarray as xr

    from tests.integration.tiny import save_tiny

    model_dir = save_tiny("llama", tmp_path / "tiny-llama")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"text": t, "category": "ab"[i % 2]}) + "\n"
                               for i, t in enumerate(MULTI)))  # fmt: skip
    run = tmp_path / "run"
    result = cli(["trace", "-m", model_dir, "-p", prompts, "-o", run])
    assert result.code == 0, result.err
    args = ["attractors", str(run), "--directions", "4", "--thetas", "0.01,0.1,1",
            "--pairs", "3", "--lambdas", "5", "--max-iter", "4", "--bootstrap", "50",
            "--workers", "2"]  # fmt: skip
    result = cli(args)
    assert result.code == 0, result.err
    data = json.loads((run / "attractors.json").read_text())
    assert data["trained"]["n_blocks"] == 3 and data["random"] is not None
    assert data["trained"]["workers"] == 2 == data["config"]["workers"]
    assert data["verdicts"]["basins"]["text"].startswith("the category regions act as basins")
    assert all("toward the output" in v["text"] or "neutral" in v["text"]
               for v in data["verdicts"]["ftle"])  # fmt: skip
    section = (run / "attractors.html").read_text()
    assert section.startswith("<section>") and "Is it an attractor?" in section
    report = cli(["report", "--section", run / "attractors.html", "-o", tmp_path / "r.html"])
    assert report.code == 0, report.err
    assert "Is it an attractor?" in (tmp_path / "r.html").read_text()
    ds = xr.open_zarr(run / "attractors.zarr")
    assert ds["ftle"].shape == (len(MULTI), 3, 4)
    codecs = json.loads((run / "attractors.zarr" / "ftle" / "zarr.json").read_text())["codecs"]
    assert [c["name"] for c in codecs] == ["bytes", "crc32c"]  # every chunk checksummed
    assert ds["random_basin_radius"].shape == (len(data["trained"]["blocks"]), len(MULTI))
    bad = cli(["attractors", run, "--thetas", "1,0.1"])
    assert bad.code == 2
    assert "--thetas" in bad.err and "Traceback" not in bad.err
    bad = cli(["attractors", run, "--workers", "0"])
    assert bad.code == 2 and "--workers" in bad.err and "Traceback" not in bad.err


def test_perturbation_chunks_fit_the_logits_budget(monkeypatch):
    """A large vocabulary reads out fewer perturbed rows at once (LOGITS_BYTES), and
    the chunking changes no number: a budget of one prompt's rows gives the same
    arrays as one chunk."""
    from tokenfield.models import layer_map as lm

    assert lm._rows_for(4096, 49_152) == 4096  # SmolLM2: unchanged
    assert lm._rows_for(4096, 262_144) == 768  # Gemma 3: 3 GiB of logits -> 768 MiB
    layer_map = _layer_map(double=True)
    gen = torch.Generator().manual_seed(5)
    x = layer_map.states[:, 1]
    directions = torch.randn((3, *x.shape), generator=gen, dtype=x.dtype)
    directions = directions - (directions * x).sum(-1, keepdim=True) * x / (x * x).sum(
        -1, keepdim=True
    )
    directions = directions / directions.norm(dim=-1, keepdim=True)
    whole = lm.perturbation_recovery(layer_map, 1, [0.01, 0.3], directions)
    vocab = layer_map.logits(layer_map.states[:1, -1]).shape[-1]
    assert layer_map.vocab_size == vocab
    monkeypatch.setattr(lm, "LOGITS_BYTES", 4 * vocab * layer_map.batch)  # one copy a chunk
    assert lm._rows_for(4096, vocab) == layer_map.batch
    calls = []
    onward = lm.LayerMap.onward
    monkeypatch.setattr(lm.LayerMap, "onward", lambda *a, **k: calls.append(1) or onward(*a, **k))
    sliced = lm.perturbation_recovery(layer_map, 1, [0.01, 0.3], directions)
    assert len(calls) == 2 * 3  # one chunk per (angle, direction) copy of the prompts
    # the great circles' runs read out within the same budget: one chunk per lambda
    pairs = torch.tensor([[0, 1], [1, 0]])
    monkeypatch.setattr(lm, "LOGITS_BYTES", 4 * vocab * len(pairs))
    calls.clear()
    circles = lm.great_circle_runs(layer_map, 1, pairs, [0.0, 0.5, 1.0])
    assert len(calls) == 3 and circles["top"].shape == (3, 2)
    for name in ("angle_ratio", "kl", "flipped"):
        torch.testing.assert_close(sliced[name], whole[name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3"])
def test_prefix_attention_equals_eager(kind):
    """The layer map's own attention (the prefix read once per prompt, never repeated
    per copy) gives the eager path's block outputs, pullbacks and pushes, on
    left-padded prompts of different lengths, for 3 copies of the batch; gemma3's
    layers alternate a sliding window of 4 tokens with full attention. Float64
    with eager's float32 softmax: 1e-6 relative."""
    from tokenfield.models.attention import eager_attention
    from tokenfield.models.jacobian import _Linearised
    from tokenfield.models.layer_map import (
        PREFIX_ATTENTION,
        layer_map_attention,
        supports_prefix_attention,
    )

    layer_map = _layer_map(kind, double=True)
    model = layer_map.model.model
    lengths = {len(layer_map.model.tokenizer(p)["input_ids"]) for p in MULTI}
    assert len(lengths) > 2  # padding is exercised
    reps = 3
    gen = torch.Generator().manual_seed(0)
    x = layer_map.states[:, 0].repeat(reps, 1)
    x = x + 0.1 * torch.randn(x.shape, generator=gen, dtype=x.dtype) * x.norm(dim=-1, keepdim=True)
    u = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    results = {}
    for name, context in (("eager", eager_attention), ("prefix", layer_map_attention)):
        with context(model) as implementation:
            if name == "prefix":
                assert implementation == PREFIX_ATTENTION and supports_prefix_attention(model)
            with torch.no_grad():
                out = layer_map.onward(0, x)
            block = layer_map.n_blocks - 1
            linear = _Linearised(layer_map.block_fn(block), layer_map.states[:, block])
            results[name] = (out, linear.pull(u), linear.push(u))
    assert model.config._attn_implementation != PREFIX_ATTENTION  # restored on exit
    for eager, prefix in zip(results["eager"], results["prefix"], strict=True):
        gap = (eager - prefix).abs().max() / eager.abs().max()
        assert gap <= 1e-6, (kind, float(gap))


def test_families_the_prefix_attention_does_not_reproduce_keep_eager():
    """GPT-NeoX's eager function takes a head mask, GPT-2's has no ``scaling``:
    neither is switched."""
    from tokenfield.models.layer_map import layer_map_attention, supports_prefix_attention

    for kind in ("gpt_neox", "gpt2"):
        model = tiny_loaded(kind).model
        assert not supports_prefix_attention(model)
        with layer_map_attention(model) as implementation:
            assert implementation == "eager" == model.config._attn_implementation


def test_the_numbers_do_not_depend_on_the_workers(monkeypatch):
    """Two worker threads give one thread's arrays bit for bit (each task writes its
    own rows; the directions are drawn before the tasks), with chunks, slices and
    prompt parts small enough that every stage has several tasks; and an error in
    a task reaches the caller."""
    from tokenfield.models import jacobian
    from tokenfield.pipelines import attractors
    from tokenfield.pipelines.attractors import AttractorConfig, measure_attractors
    from tokenfield.prompts import Prompt

    model = tiny_loaded("llama")
    prompts = [Prompt(p, category="ab"[i % 2]) for i, p in enumerate(MULTI * 2)]
    monkeypatch.setattr(attractors, "PROMPTS_PER_TASK", 3)
    config = dict(directions=4, thetas=(0.01, 0.1, 1.0), pairs=3, max_iter=20, n_boot=20,
                  chunk=3)  # fmt: skip
    monkeypatch.setattr(jacobian, "product_slice", lambda *a, **k: 4)
    before = torch.get_num_threads()
    one = measure_attractors(model, prompts, AttractorConfig(workers=1, **config))
    reports: list[tuple[str, float]] = []
    two = measure_attractors(model, prompts, AttractorConfig(workers=2, **config),
                             progress=lambda stage, f: reports.append((stage, f)))  # fmt: skip
    assert torch.get_num_threads() == before  # restored
    # progress as the tasks end, not only when all of a stage's have
    spectra = [f for stage, f in reports if stage == "block Jacobians"]
    assert spectra[0] == 0.0 and spectra[-1] == 1.0 and len(set(spectra)) > 4
    for name in ("jacobian_sv", "angular_sv", "ftle", "sensitive_direction", "angle_ratio",
                 "kl", "flipped", "basin_radius"):  # fmt: skip
        assert one["arrays"][name].shape == two["arrays"][name].shape
        assert np.array_equal(one["arrays"][name], two["arrays"][name], equal_nan=True), name
    for kind in ("same", "different"):
        a, b = one["arrays"]["basins"][kind], two["arrays"]["basins"][kind]
        assert np.array_equal(a["slope"], b["slope"], equal_nan=True)
    assert np.isfinite(one["arrays"]["ftle"]).all()

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(jacobian, "lanczos_singular", broken)
    with pytest.raises(RuntimeError, match="planted"):
        measure_attractors(model, prompts, AttractorConfig(workers=2, **config))
