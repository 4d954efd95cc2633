"""Issue 15, items 1-8 and 16: every bad case ends with one line and exit 2, and
nothing on disk is lost, half-written or left behind to block the retry.

Each test drives the real command (``tokenfield.cli.main``) or the real library
function and checks the outcome on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from tests._cli import one_error_line, run_cli, tree
from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield import _lock
from tokenfield.errors import UserError
from tokenfield.prompts import load_prompts
from tokenfield.runs import RunWriter, check_baseline, open_run, read_run_info, strings

ROOT = Path(__file__).resolve().parents[2]


def piece(start: int, n: int, d: int = 2) -> xr.Dataset:
    return xr.Dataset(
        {"states": (("time", "particle", "feature"), np.ones((3, n, d), dtype=np.float32))},
        coords={
            "particle": np.arange(start, start + n),
            "prompt": ("particle", strings(f"p{i}" for i in range(start, start + n))),
        },
    )


@pytest.fixture(scope="module")
def trace_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    states, labels = clustered(n_per_category=3, n_time=4, n_feature=8)
    wide, _ = clustered(n_per_category=3, n_time=4, n_feature=12)
    return {
        "run": write_run(root / "run", trace_dataset(states, labels)),
        "wide": write_run(root / "wide", trace_dataset(wide, labels)),
        "sim": write_run(root / "sim", trace_dataset(states), kind="simulation"),
    }


# --- item 1: one writer per run -------------------------------------------------


HOLDER = """
import sys, time
from tokenfield import _lock
_lock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path, capsys):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"being written by process {holder.pid}"):
            RunWriter(out, "trace", {"a": 1}, append_dim="particle")
        code, _out, err = run_cli(
            ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.2", "--out", out], capsys
        )
        assert code == 2
        assert f"being written by process {holder.pid}" in one_error_line(err)
        # the Dask sweep's client takes the same lock before creating its store
        code, _out, err = run_cli(
            ["phase-diagram", "--dims", "2", "--betas", "1", "--out", out], capsys
        )
        assert code == 2
        assert f"being written by process {holder.pid}" in one_error_line(err)
        assert sorted(p.name for p in out.iterdir()) == [_lock.LOCK_NAME]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    # The OS dropped the killed holder's lock: the next writer goes ahead.
    with RunWriter(out, "trace", {"a": 1}, append_dim="particle") as writer:
        writer.append(piece(0, 2), done=1)
        writer.finish()
    assert read_run_info(out).complete
    assert not (out / _lock.LOCK_NAME).exists()


def test_the_lock_file_never_makes_a_directory_look_used(tmp_path):
    fresh = tmp_path / "new"
    with _lock.writer_lock(fresh):
        assert (fresh / _lock.LOCK_NAME).is_file()
        # counts as empty for a run, and the lock is re-entrant in one process
        RunWriter(fresh, "trace", {}, append_dim="particle").close()
    assert fresh.exists()  # the writer wrote run.json there
    empty = tmp_path / "empty"
    with _lock.writer_lock(empty):
        pass
    assert not empty.exists()  # a lock that made the directory takes it away again


# --- item 2: interrupts (the subprocess tests are in tests/integration/test_one_writer.py)


def test_an_interrupt_inside_a_command_exits_130_with_the_resume_line(
    tmp_path, capsys, monkeypatch
):
    import signal

    from tokenfield.particles import integrate

    def interrupted(*_a, **_k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(integrate, "_run_fixed", interrupted)
    # what the handler was before (SIG_IGN when the test runner was started in the
    # background by a non-interactive shell, Python's default otherwise)
    before = signal.getsignal(signal.SIGINT)
    out = tmp_path / "sim"
    code, _out, err = run_cli(["simulate", "--n", "4", "--t-max", "0.2", "--out", out], capsys)
    assert code == 130
    assert err.strip() == "tokenfield: interrupted; run the same command again to resume."
    assert read_run_info(out).status == "partial"
    assert signal.getsignal(signal.SIGINT) is before  # restored


# --- item 4: --overwrite deletes only what tokenfield wrote ---------------------


def test_trace_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    mine = tmp_path / "mine"
    (mine / "figures").mkdir(parents=True)
    (mine / "figures" / "a.png").write_bytes(b"png")
    (mine / "metrics.json").write_text('{"mine": 1}')
    before = tree(mine)
    code, _out, err = run_cli(
        ["simulate", "--n", "4", "--t-max", "0.2", "--out", mine, "--overwrite"], capsys
    )
    assert code == 2
    assert "not a tokenfield run" in one_error_line(err)
    assert tree(mine) == before


def test_report_keeps_a_file_that_is_not_a_report(trace_runs, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    code, _out, err = run_cli(["report", trace_runs["run"], "--out", notes], capsys)
    assert code == 2
    assert "not a tokenfield report" in one_error_line(err)
    assert notes.read_text() == "my notes"
    report = tmp_path / "report.html"
    assert run_cli(["report", trace_runs["run"], "--out", report], capsys)[0] == 0
    assert run_cli(["report", trace_runs["run"], "--out", report], capsys)[0] == 0  # its own
    assert run_cli(["report", trace_runs["run"], "--out", notes, "--overwrite"], capsys)[0] == 0
    assert "tokenfield report" in notes.read_text()


def test_a_report_from_before_the_marker_is_still_replaced(trace_runs, tmp_path, capsys):
    """`make demo` after an upgrade rewrites its own older report (no marker yet)."""
    old = tmp_path / "report.html"
    old.write_text(
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>tokenfield: "
        "the seed experiment on smollm2</title></head><body></body></html>"
    )
    assert run_cli(["report", trace_runs["run"], "--out", old], capsys)[0] == 0
    assert "Trajectories" in old.read_text()


def test_steer_overwrite_deletes_only_its_own_files(tmp_path):
    from tokenfield.pipelines.steer import prepare_steering_out

    out = tmp_path / "steer"
    out.mkdir()
    for name in ("steering.json", "vector.safetensors", "notes.md"):
        (out / name).write_text("x")
    prepare_steering_out(out, True, "steering.json")
    _lock.release_all()
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"]


# --- item 5: pairs and kinds ----------------------------------------------------


@pytest.mark.parametrize(
    ("baseline", "message"),
    [
        ("sim", "is a simulation run"),
        ("wide", "d = 12 features.*d = 8"),
    ],
)
def test_analyze_refuses_a_baseline_that_does_not_pair(trace_runs, baseline, message, capsys):
    code, _out, err = run_cli(
        ["analyze", trace_runs["run"], "--baseline", trace_runs[baseline], "--no-figures"], capsys
    )
    assert code == 2
    assert __import__("re").search(message, one_error_line(err))


def test_a_baseline_with_other_prompts_is_refused(tmp_path):
    def traced(path, texts):
        config = {"prompts": [{"text": t} for t in texts]}
        with RunWriter(path, "trace", config, append_dim="particle") as writer:
            writer.append(piece(0, len(texts)), done=len(texts))
            writer.finish()
        return path

    run = traced(tmp_path / "a", ["x", "y"])
    with pytest.raises(UserError, match="other prompts"):
        check_baseline(run, traced(tmp_path / "b", ["x", "z"]))
    with pytest.raises(UserError, match="same prompts in another order"):
        check_baseline(run, traced(tmp_path / "c", ["y", "x"]))
    check_baseline(run, traced(tmp_path / "d", ["x", "y"]))  # the same prompts pair


def test_simulate_init_takes_a_trace_not_a_simulation(trace_runs, tmp_path, capsys):
    code, _out, err = run_cli(
        ["simulate", "--init", f"run:{trace_runs['sim']}", "--out", tmp_path / "s"], capsys
    )
    assert code == 2
    assert "is a simulation run" in one_error_line(err)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'{"kind": "trace", "config": [1]}', "'config' is a list"),
        (b'{"kind": "bundle", "config": {}}', "unknown kind 'bundle'"),
    ],
)
@pytest.mark.parametrize("command", ["analyze", "report", "steer"])
def test_a_damaged_run_json_is_one_line_for_every_reader(
    trace_runs, tmp_path, content, message, command, capsys
):
    run = tmp_path / "run"
    shutil.copytree(trace_runs["run"], run)
    (run / "run.json").write_bytes(content)
    args = {
        "analyze": ["analyze", run, "--no-figures"],
        "report": ["report", run, "--out", tmp_path / "r.html"],
        "steer": ["steer", "--run", run, "--from", "a", "--to", "b", "--layer", "1", "--out", tmp_path / "s"],
    }[command]  # fmt: skip
    code, _out, err = run_cli(args, capsys)
    assert code == 2
    assert message in one_error_line(err)
    assert not (tmp_path / "s").exists() and not (tmp_path / "r.html").exists()


# --- item 6: batch size ---------------------------------------------------------


def test_a_resume_with_another_batch_size_is_refused(tmp_path):
    run = tmp_path / "r"
    with RunWriter(run, "trace", {"a": 1}, append_dim="particle", batch_size=8) as writer:
        writer.append(piece(0, 8), done=8)
    assert read_run_info(run).progress["batch_size"] == 8
    before = tree(run)
    with pytest.raises(UserError, match="--batch-size 8, not 4.*pass --batch-size 8"):
        RunWriter(run, "trace", {"a": 1}, append_dim="particle", batch_size=4)
    assert tree(run) == before
    with RunWriter(run, "trace", {"a": 1}, append_dim="particle", batch_size=8) as writer:
        assert writer.done == 8  # the original batch size resumes
    with RunWriter(
        run, "trace", {"a": 1}, append_dim="particle", batch_size=4, overwrite=True
    ) as w:
        assert w.done == 0


# --- item 3: the weights a run used ----------------------------------------------


def test_run_json_records_the_weights_and_a_resume_with_others_is_refused(tmp_path):
    run = tmp_path / "r"
    with RunWriter(run, "trace", {"a": 1}, append_dim="particle", weights_sha256="sha256:aa") as w:
        w.append(piece(0, 2), done=1)
    assert json.loads((run / "run.json").read_text())["weights_sha256"] == "sha256:aa"
    before = tree(run)
    with pytest.raises(UserError, match="started with other model weights.*--overwrite"):
        RunWriter(run, "trace", {"a": 1}, append_dim="particle", weights_sha256="sha256:bb")
    assert tree(run) == before
    with RunWriter(run, "trace", {"a": 1}, append_dim="particle", weights_sha256="sha256:aa") as w:
        assert w.done == 1


# --- item 7: one line and exit 2 ------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("- hello\n- 42\n", "prompt #2 .* is 42, not text"),
        ("- hello\n- null\n", "prompt #2 .* is empty"),
        ("- hello\n-\n", "prompt #2 .* is empty"),
        ("math:\n  - 42\n", "prompt #1 .* is 42, not text"),
    ],
)
def test_yaml_entries_that_are_not_text(tmp_path, yaml_text, message, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(yaml_text)
    with pytest.raises(UserError, match=message):
        load_prompts(path)
    code, _out, err = run_cli(["trace", "--prompts", path, "--out", tmp_path / "t"], capsys)
    assert code == 2
    line = one_error_line(err)
    assert "not text" in line or "is empty" in line
    assert not (tmp_path / "t").exists()


def test_a_deleted_chunk_is_found_when_the_run_is_opened(trace_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trace_runs["run"], run)
    chunks = sorted((run / "trajectory.zarr" / "states" / "c").rglob("*"))
    next(p for p in chunks if p.is_file()).unlink()
    with pytest.raises(UserError, match="chunk files of 'states'.*missing"):
        open_run(run)
    code, _out, err = run_cli(["analyze", run, "--no-figures"], capsys)
    assert code == 2
    assert "missing" in one_error_line(err)


def test_resuming_into_a_read_only_store(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    with RunWriter(run, "trace", {"a": 1}, append_dim="particle") as writer:
        writer.append(piece(0, 2), done=1)
    store = str(run / "trajectory.zarr")
    real_access = os.access
    # root ignores file modes: decide through os.access, as check_writable_dir does
    monkeypatch.setattr(
        os, "access", lambda p, m, **k: False if str(p).startswith(store) else real_access(p, m)
    )
    before = tree(run)
    with pytest.raises(UserError, match="cannot resume .* is read-only.*chmod"):
        RunWriter(run, "trace", {"a": 1}, append_dim="particle")
    assert tree(run) == before


def test_a_write_error_mid_run_is_one_line_and_resumable(tmp_path, monkeypatch):
    run = tmp_path / "r"
    writer = RunWriter(run, "trace", {"a": 1}, append_dim="particle")
    writer.append(piece(0, 2), done=1)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    import tokenfield.runs as runs

    monkeypatch.setattr(xr.Dataset, "to_zarr", full)
    monkeypatch.setattr(runs.writer, "_write_at", full)  # appends after the first are plain Zarr
    with pytest.raises(UserError, match="No space left.*run the same command again"):
        writer.append(piece(2, 2), done=2)
    writer.close()
    assert read_run_info(run).progress["done"] == 1


@pytest.mark.parametrize("n", ["10000000000", "100000000"])
def test_simulate_refuses_a_system_too_large_before_allocating(tmp_path, n, capsys, monkeypatch):
    from tokenfield.pipelines import simulate as simulate_pipeline

    monkeypatch.setattr(simulate_pipeline, "available_memory", lambda: 16 * 10**9)
    code, _out, err = run_cli(["simulate", "--n", n, "--out", tmp_path / "big"], capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"--n-particles {n} in d = 3 needs about" in line and "16 GB is available" in line
    assert not (tmp_path / "big").exists()


def test_a_cache_location_that_is_a_file_or_read_only(tmp_path, monkeypatch, capsys):
    from tokenfield.models import load

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF not really")
    cache_file = tmp_path / "cache"
    cache_file.write_text("a file")
    monkeypatch.setenv("TOKENFIELD_CACHE", str(cache_file))
    code, _out, err = run_cli(["trace", "--model", gguf, "--out", tmp_path / "t"], capsys)
    assert code == 2
    assert "model cache" in one_error_line(err) and "TOKENFIELD_CACHE" in err
    readonly = tmp_path / "ro"
    readonly.mkdir()
    monkeypatch.setenv("TOKENFIELD_CACHE", str(readonly))
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda p, m, **k: False if str(p).startswith(str(readonly)) else real_access(p, m),
    )
    with pytest.raises(UserError, match="model cache .* is not writable"):
        load._dequantised_dir(gguf)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("garbage", [b"", b"\x00garbage\xff", b"[1, 2, 3]", b'{"k": 5}'])
def test_a_damaged_hash_memo_is_only_a_miss(tmp_path, monkeypatch, garbage):
    import hashlib

    from tokenfield.models import load

    monkeypatch.setenv("TOKENFIELD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "hashes.json").write_bytes(garbage)
    data = tmp_path / "f.bin"
    data.write_bytes(b"weights")
    expected = "sha256:" + hashlib.sha256(b"weights").hexdigest()
    assert load._file_hash(data) == expected
    assert load._file_hash(data) == expected  # the rewritten memo is sound


def test_the_cache_manifest_finds_any_damaged_file(tmp_path):
    from tokenfield.models.load import MANIFEST, verify_entry, write_manifest

    entry = tmp_path / "entry"
    entry.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (entry / name).write_bytes(os.urandom(5000))
    hashes = write_manifest(entry)
    assert verify_entry(entry) == (hashes, "")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        original = (entry / name).read_bytes()
        (entry / name).write_bytes(original[:4000])  # truncated
        assert verify_entry(entry)[1] == f"{name} does not match its recorded SHA-256"
        (entry / name).unlink()
        assert verify_entry(entry)[1] == f"{name} is missing or unreadable"
        (entry / name).write_bytes(original)
    (entry / MANIFEST).write_text("{not json")
    assert "unreadable" in verify_entry(entry)[1]
    (entry / MANIFEST).unlink()
    assert "no checksums" in verify_entry(entry)[1]


@pytest.mark.parametrize("damaged", ["config.json", "tokenizer.json", "model.safetensors"])
def test_a_garbage_model_file_is_one_line(tmp_path, damaged, capsys):
    from tests.integration.tiny import save_tiny

    model = save_tiny("llama", tmp_path / "tiny")
    capsys.readouterr()  # transformers' own saving chatter
    path = model / damaged
    path.write_bytes(path.read_bytes()[: max(10, path.stat().st_size // 3)])
    code, _out, err = run_cli(["trace", "--model", model, "--out", tmp_path / "t"], capsys)
    assert code == 2
    assert "cannot load the model in" in one_error_line(err)
    assert not (tmp_path / "t").exists()


# --- item 8 ---------------------------------------------------------------------


def test_init_dim_larger_than_the_prompts_tokens(tmp_path, capsys):
    states = np.random.default_rng(0).normal(size=(3, 5, 32))
    ds = trace_dataset(states, ["a"] * 5)
    ds = ds.assign_coords(prompt_index=("particle", np.zeros(5, dtype=np.int64)))
    run = write_run(tmp_path / "spectrum", ds)
    code, _out, err = run_cli(
        ["simulate", "--init", f"run:{run}@2", "--dim", "16", "--out", tmp_path / "s"], capsys
    )
    assert code == 2
    assert "--dim 16 exceeds the 5 tokens" in one_error_line(err)
    assert not (tmp_path / "s").exists()
    code, _out, err = run_cli(
        ["simulate", "--init", f"run:{run}@2", "--dim", "4", "--t-max", "0.1", "--out", tmp_path / "s"],
        capsys,
    )  # fmt: skip
    assert code == 0, err


# --- item 16 --------------------------------------------------------------------


def test_a_simulation_that_blows_up_leaves_nothing_behind(tmp_path, capsys):
    out = tmp_path / "blow"
    args = [
        "simulate",
        "--dynamics",
        "usa",
        "--beta",
        "800",
        "--dt",
        "0.5",
        "--n",
        "16",
        "--out",
        out,
    ]
    code, _out, err = run_cli(args, capsys)
    assert code == 2
    assert "non-finite" in [line for line in err.splitlines() if "error" in line][0]
    assert not out.exists()
    # the retry with other settings needs no --overwrite
    code, _out, err = run_cli(
        ["simulate", "--dynamics", "usa", "--beta", "8", "--dt", "0.01", "--n", "16",
         "--t-max", "0.5", "--out", out], capsys,
    )  # fmt: skip
    assert code == 0, err
    assert read_run_info(out).complete


def test_eval_steering_on_an_encoder_leaves_no_directory(tmp_path, capsys):
    from tests.integration.tiny import save_tiny

    encoder = save_tiny("bert", tmp_path / "bert")
    capsys.readouterr()
    out = tmp_path / "eval"
    code, _out, err = run_cli(["eval-steering", "--model", encoder, "--out", out], capsys)
    assert code == 2
    assert "no language-model head" in one_error_line(err)
    assert not out.exists()


def test_a_second_writer_names_the_holder_that_has_not_written_its_pid_yet(tmp_path):
    """The holder locks first and writes its pid just after: a second writer that
    comes in between waits for the pid instead of saying 'another process'."""
    import fcntl
    import os
    import threading

    from tokenfield._lock import LOCK_NAME, acquire
    from tokenfield.errors import UserError

    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(run / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, still empty
    late = threading.Timer(0.2, lambda: os.write(fd, b"4242\n"))
    late.start()
    try:
        with pytest.raises(UserError, match="is being written by process 4242"):
            acquire(run, what="run")
    finally:
        late.join()
        os.close(fd)
