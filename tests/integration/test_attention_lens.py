"""`tokenfield lens` end to end on tiny models: every section, the notes, the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tokenfield as tf
from tests.integration.tiny import tiny_loaded
from tokenfield.analysis.theory import THEORY_JSON
from tokenfield.cli import main
from tokenfield.errors import UserError
from tokenfield.pipelines.theory import theory_lens
from tokenfield.prompts import Prompt
from tokenfield.viz.theory import theory_html_section

WORDS_A = [
    "the capital of France is Paris",
    "the first people made words",
    "she said that it was",
    "water is in the long time",
    "they were at the first time",
]
WORDS_B = ["1 + 2 = 3", "def print ( a )", "2 * 3 = 5 + 1", "print ( 4 )", "( 1 + 5 ) * 2 ="]
PROMPTS = [Prompt(t, "words") for t in WORDS_A] + [Prompt(t, "code") for t in WORDS_B]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lens")
    model = tiny_loaded("llama")
    baseline = tiny_loaded("llama", seed=7)
    options = {"positions": "all", "attention": True, "logit_lens": True, "batch_size": 4}
    tf.trace(model, PROMPTS, out=root / "model", **options)
    tf.trace(baseline, PROMPTS, out=root / "baseline", **options)
    tf.trace(model, PROMPTS, positions="last", out=root / "last")
    return root


def test_cli_writes_every_section_and_figure(runs, capsys):
    main(
        [
            "lens",
            str(runs / "model"),
            "--baseline",
            str(runs / "baseline"),
            "--simulate",
            "--permutations",
            "3",
        ]
    )
    theory = json.loads((runs / "model" / THEORY_JSON).read_text())
    layers = 3
    assert theory["notes"] == []
    assert len(theory["clouds"]["mean"]["mean_cos"]) == layers + 1
    assert len(theory["baseline_clouds"]["mean"]["cluster_count@0.1"]) == layers + 1
    assert len(theory["simulated_clouds"]["mean"]["mean_cos"]) == layers + 1
    assert theory["simulated_clouds"]["dt"] > 0
    assert len(theory["effective_beta"]["r2"]) == layers
    assert np.array(theory["attention"]["per_head"]["sink_mass"]).shape == (layers, 4)
    assert len(theory["attention"]["top_tokens"]) == len(PROMPTS)
    assert set(theory["probes"]) == {"last", "pooled"}
    assert theory["probes"]["last"]["cv"] == "5-fold"
    assert theory["logit_lens"]["top1"][-1] == 1.0
    figures = {p.name for p in (runs / "model" / "figures").iterdir()}
    for name in ("clouds", "attention", "beta", "probes", "logit_lens"):
        assert f"theory_{name}.png" in figures
    html = theory_html_section(theory)
    assert "mean cos (sim)" in html and html.count("<tr>") == layers + 2
    fragment = (runs / "model" / "theory.html").read_text()
    assert fragment.startswith("<section>") and "R^2 (own heads)" not in fragment
    out = capsys.readouterr()
    # results on stdout, the progress bar and the notes on stderr
    assert "through the lens of the theory" in out.out and "wrote" in out.out
    assert "steps" in out.err and "through the lens" not in out.err
    out_html = runs / "report.html"
    main(["report", "--section", str(runs / "model" / "theory.html"), "--out", str(out_html)])
    text = out_html.read_text()
    assert "mean cos (sim)" in text
    for name in ("clouds", "attention", "beta", "probes", "logit_lens"):
        assert f'alt="theory_{name}"' in text  # the lens's figures come with its section
    out = capsys.readouterr()
    assert "wrote" in out.out and "wrote" not in out.err


def test_report_of_a_run_shows_its_theory_figures(runs, capsys, tmp_path):
    """`report RUN --section RUN/theory.html` on a run never analysed: the lens's
    figures are read from RUN/figures, the run is left untouched, and a note says so."""
    run = runs / "model"
    if not (run / THEORY_JSON).is_file():
        main(["lens", str(run), "--permutations", "0"])
    assert not (run / "metrics.json").exists()
    before = sorted(p.name for p in run.rglob("*"))
    out_html = tmp_path / "report.html"
    main(["report", str(run), "--section", str(run / "theory.html"), "--out", str(out_html)])
    text = out_html.read_text()
    for name in ("clouds", "attention", "beta", "probes", "logit_lens"):
        assert text.count(f'alt="theory_{name}"') == 1, name  # once, in the run's section
    assert "Token clouds by layer" in text  # with the lens's captions
    assert sorted(p.name for p in run.rglob("*")) == before
    err = capsys.readouterr().err
    assert "has no metrics.json" in err and "tokenfield analyze" in err


def test_simulated_cloud_starts_at_the_models_layer_zero(runs):
    result = theory_lens(runs / "model", simulate=True, permutations=0, sim_beta=2.0, sim_dt=0.5)
    np.testing.assert_allclose(
        result.simulated.clouds.values["mean_cos"][0],
        result.clouds.values["mean_cos"][0],
        atol=1e-6,
    )
    assert result.simulated.beta == 2.0 and result.simulated.source == "given"
    # the ideal flow pulls tokens together: mean cosine grows with depth
    sim = result.simulated.clouds.mean("mean_cos")
    assert sim[-1] > sim[0]


def test_last_token_runs_skip_with_notes(runs):
    result = theory_lens(runs / "last", permutations=2)
    assert result.clouds is None and result.beta is None and result.attention is None
    assert "last" in result.probes and "pooled" not in result.probes
    text = " ".join(result.notes)
    assert "--positions all" in text and "--attention" in text and "--logit-lens" in text


def test_bad_runs_are_user_errors(runs, tmp_path):
    sim = tmp_path / "sim"
    tf.simulate(tf.Dynamics(beta=1.0), np.eye(3), t_max=0.2, dt=0.1, out=sim)
    with pytest.raises(UserError):
        theory_lens(sim)
    with pytest.raises(UserError):
        theory_lens(tmp_path / "missing")
    with pytest.raises(SystemExit) as exc:
        main(["lens", str(tmp_path / "missing")])
    assert exc.value.code == 2


def test_own_heads_fit_is_added_when_the_model_is_given(runs):
    result = theory_lens(runs / "model", model=tiny_loaded("llama"), permutations=0)
    assert result.beta_heads is not None and result.beta_heads.field == "heads"
    assert len(result.beta_heads.fits) == 3
    data = result.to_json()
    assert data["effective_beta_heads"]["field"] == "heads"
    assert data["effective_beta"]["field"] == "identity"
    with pytest.raises(UserError):
        _wrong_depth(runs)  # a model that did not make the run


def _wrong_depth(runs):
    import transformers as tr

    from tests.integration.tiny import tiny_tokenizer
    from tokenfield.models.load import wrap_model

    config = tr.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    model = wrap_model(tr.AutoModelForCausalLM.from_config(config), tiny_tokenizer())
    theory_lens(runs / "model", model=model, permutations=0)


def test_lens_json_is_what_theory_json_holds(runs, capsys):
    import json

    main(
        [
            "lens",
            str(runs / "model"),
            "--no-figures",
            "--permutations",
            "2",
            "--overwrite",
            "--json",
        ]
    )
    out = capsys.readouterr()
    printed = json.loads(out.out)  # stdout holds only the JSON; "wrote" and notes on stderr
    assert printed["theory"] == json.loads((runs / "model" / "theory.json").read_text())
    assert "wrote" in out.err
