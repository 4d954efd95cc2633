"""Issue 21 on tiny models: ``lens`` adds to a run instead of replacing it, checks
``--flow`` before it writes, and a ``--scheduler`` that never answers leaves no
partial run behind to block the retry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import one_error_line, run_cli
from tests._sockets import silent_server
from tests.integration.tiny import save_tiny

WORDS = [
    "the capital of France is Paris",
    "the first people made words",
    "she said that it was",
    "water is in the long time",
    "1 + 2 = 3",
    "def print ( a )",
    "2 * 3 = 5 + 1",
    "print ( 4 )",
]


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hardening")
    model = save_tiny("llama", root / "tiny-llama")
    prompts = root / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"text": t, "category": "words" if i < 4 else "code"}) + "\n"
            for i, t in enumerate(WORDS)
        )
    )
    common = ["trace", "-m", model, "-p", prompts, "--batch-size", "4"]
    every = ["--positions", "all", "--attention", "--logit-lens"]
    runs = {"model": root / "model", "baseline": root / "baseline", "last": root / "last"}
    assert run_cli([*common, *every, "-o", runs["model"]])[0] == 0
    assert run_cli([*common, *every, "--random-weights", "-o", runs["baseline"]])[0] == 0
    assert run_cli([*common, "-o", runs["last"]])[0] == 0
    return {**runs, "model_dir": model, "prompts": prompts, "root": root}


def theory(run: Path) -> dict:
    return json.loads((run / "theory.json").read_text())


def test_lens_adds_to_a_run_and_overwrite_starts_afresh(traced, capsys):
    run, base = traced["model"], traced["baseline"]
    first = ["lens", run, "--baseline", base, "--simulate", "--heads", "--permutations", "5"]
    assert run_cli([*first, "--no-figures"], capsys)[0] == 0
    full = theory(run)
    assert full["baseline_clouds"] and full["simulated_clouds"] and full["effective_beta_heads"]
    assert full["info"]["permutations"] == 5

    # --flow alone: the flow goes into its own files and theory.json is kept as it was
    before = (run / "theory.json").stat()
    code, _out, err = run_cli(["lens", run, "--flow", "--no-figures"], capsys)
    assert code == 0, err
    after = (run / "theory.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    assert (run / "flow.json").is_file() and "kept" in err
    code, out, err = run_cli(["lens", run, "--flow", "--no-figures", "--json"], capsys)
    assert code == 0, err
    printed = json.loads(out)  # the kept theory.json and the flow, on stdout
    assert printed["theory"] == full and printed["flow"] == json.loads(
        (run / "flow.json").read_text()
    )

    # another option: added, and every earlier section and setting is kept
    code, _out, err = run_cli(["lens", run, "--no-figures", "--seed", "0"], capsys)
    assert code == 0, err
    again = theory(run)
    assert again["info"]["permutations"] == 5
    for section in ("baseline_clouds", "simulated_clouds", "effective_beta_heads",
                    "baseline_probes", "probes", "clouds"):  # fmt: skip
        assert again[section] == full[section], section
    note = " ".join(err.split())  # the console wraps long notes
    assert "added to the earlier theory.json: kept" in note
    assert all(flag in note for flag in ("--baseline", "--simulate", "--heads"))

    # a setting that contradicts the recorded one is one line, and nothing changes
    before = (run / "theory.json").read_bytes()
    code, _out, err = run_cli(["lens", run, "--permutations", "7", "--no-figures"], capsys)
    assert code == 2
    line = one_error_line(err)
    assert "was measured with --permutations 5" in line and "--overwrite" in line
    assert (run / "theory.json").read_bytes() == before

    # --overwrite: only what is given
    code, _out, err = run_cli(
        ["lens", run, "--permutations", "2", "--overwrite", "--no-figures"], capsys
    )
    assert code == 0, err
    fresh = theory(run)
    assert fresh["info"]["permutations"] == 2
    assert fresh["baseline_clouds"] is None and fresh["simulated_clouds"] is None
    assert fresh["effective_beta_heads"] is None


def test_lens_flow_on_a_last_token_run_fails_before_writing(traced, capsys):
    run = traced["last"]
    code, _out, err = run_cli(["lens", run, "--flow"], capsys)
    assert code == 2
    assert "needs a run traced with --positions all" in one_error_line(err)
    assert not (run / "theory.json").exists() and not (run / "flow.json").exists()


def test_a_silent_scheduler_leaves_no_run_to_block_the_retry(traced, monkeypatch, capsys):
    import tokenfield._dask as dask_module

    monkeypatch.setattr(dask_module, "HANDSHAKE_TIMEOUT", 0.5)
    out = traced["root"] / "par"
    common = ["trace", "-m", traced["model_dir"], "-p", traced["prompts"], "-o", out]
    with silent_server() as (address, accepted):
        code, _out, err = run_cli([*common, "--scheduler", address], capsys)
    assert code == 2
    assert "accepted no handshake within 0.5 s" in one_error_line(err)
    assert accepted
    assert not (out / "run.json").exists() and not (out / "trajectory.zarr").exists()
    code, _out, err = run_cli(common, capsys)  # the retry, without the scheduler
    assert code == 0, err


@pytest.mark.parametrize("address", ["tls://127.0.0.1:8786", "tcp://127.0.0.1:port"])
def test_a_bad_scheduler_address_in_trace_is_one_line(traced, address, capsys):
    out = traced["root"] / "bad"
    common = ["trace", "-m", traced["model_dir"], "-p", traced["prompts"], "-o", out]
    code, _out, err = run_cli([*common, "--scheduler", address], capsys)
    assert code == 2
    assert address in one_error_line(err)
    assert not (out / "run.json").exists()
