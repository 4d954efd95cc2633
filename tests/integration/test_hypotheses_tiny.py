"""The hypotheses on tiny random-weight models: the head vertices reproduce the
attention output, and ``tokenfield hypotheses`` runs end to end on a traced run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests._cli import run_cli
from tests.integration.tiny import PROMPTS, save_tiny, tiny_loaded
from tokenfield.models.heads import embedding_rows, prompt_internals, tied_embeddings
from tokenfield.models.hooks import hook


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_vertices_and_weights_reproduce_the_attention_output(kind):
    model = tiny_loaded(kind)
    internals = prompt_internals(model, PROMPTS[3])
    n = internals.ids.size
    assert internals.states.shape == (model.n_layers + 1, n, model.d_model)
    np.testing.assert_allclose(internals.states[0], embedding_rows(model, internals.ids), atol=1e-6)
    block = 1
    found = {}

    def read(out):
        found["out"] = out[0][0].double()

    with hook(model, f"attn.{block}", read):
        model.model(input_ids=torch.tensor([internals.ids.tolist()]), use_cache=False)
    theirs = found["out"].numpy()  # (n, d) the attention module's output (after o_proj)
    ours = np.einsum("hij,hjd->id", internals.attention[block], internals.vertices[block])
    layer = model.sites.blocks[block]
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma: the post-norm's gain only
        with torch.no_grad():
            theirs = (
                layer.post_attention_layernorm(torch.from_numpy(theirs).float()).double().numpy()
            )
        theirs = theirs / np.linalg.norm(theirs, axis=-1, keepdims=True)
        ours = ours / np.linalg.norm(ours, axis=-1, keepdims=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert isinstance(tied_embeddings(model), bool)


def test_the_command_writes_hypotheses_json(tmp_path, capsys):
    model_dir = save_tiny("llama", tmp_path / "tiny-llama")
    prompts = tmp_path / "p.jsonl"
    rows = [{"text": text, "category": "ab"[i % 2]} for i, text in enumerate(PROMPTS[:6])]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, extra in (("r", []), ("rw", ["--random-weights"])):
        code, _out, err = run_cli(
            ["trace", "--model", str(model_dir), "--prompts", str(prompts), "--out",
             str(tmp_path / name), *extra], capsys
        )  # fmt: skip
        assert code == 0, err
    code, out, err = run_cli(
        ["hypotheses", str(tmp_path / "r"), "--baseline", str(tmp_path / "rw"),
         "--out", str(tmp_path / "h"), "--shuffles", "19", "--bootstrap", "50"], capsys
    )  # fmt: skip
    assert code == 0, err
    data = json.loads((tmp_path / "h" / "hypotheses.json").read_text())
    section = (tmp_path / "h" / "hypotheses.html").read_text()  # the report's fragment
    assert "hypotheses-order" in section and "energy_beta_4" in section
    for part in (data, data["baseline"]):
        assert {"order", "convex_fit", "next_embedding"} <= part.keys()
        assert {"energy_beta_1", "energy_beta_4", "energy_beta_16", "matrix_entropy",
                "intrinsic_dimension", "fuzziness"} <= part["order"].keys()  # fmt: skip
        row = part["order"]["energy_beta_4"]
        assert len(row["per_layer"]) == 4 and {"slope", "slope_ci", "r2", "verdict"} <= row.keys()
        layers = part["convex_fit"]["targets"]["next_embedding"]
        assert len(layers) == 3 and all(0 <= la["share_passing"] <= 1 for la in layers)
        assert len(part["next_embedding"]["cosine"]) == 4
    assert data["baseline"]["model"]["random_weights"] is True
    assert "heads passing by layer" in out
    code, _out, err = run_cli(
        ["hypotheses", str(tmp_path / "r"), "--baseline", str(tmp_path)], capsys
    )
    assert code == 2 and "not a tokenfield run" in err
