"""``trace --generate N`` beyond a bundled model's context is refused before its
weights are loaded or even verified (issue 21: a million tokens would run for days)."""

from __future__ import annotations

import pytest

from tests._cli import run_cli

pytestmark = pytest.mark.slow


def test_generate_beyond_a_bundled_models_context_never_touches_its_weights(
    tmp_path, capsys, monkeypatch
):
    from tokenfield.models import load, sources

    # the cache entry exists after one load; the check must then read its config only
    load.ModelSpec("smollm2").load()

    def forbidden(*args, **kwargs):
        raise AssertionError("the weights were loaded or verified before the refusal")

    monkeypatch.setattr(load.ModelSpec, "load", forbidden)
    monkeypatch.setattr(sources, "verify_entry", forbidden)
    out = tmp_path / "r"
    code, _out, err = run_cli(["trace", "-m", "smollm2", "--generate", 10**6, "-o", out], capsys)
    assert code == 2
    assert "beyond the context of model 'smollm2' (8192 tokens)" in err
    assert "pass --generate 8191 or less" in err
    assert not out.exists()
