"""Issue 21, the command-line items: prompts read as written, one line (exit 2)
where a traceback was, bounded waits, no partial run left by a failure found
before any work, and ``lens`` adding to a run instead of replacing it.

Each test drives the real command (``tokenfield.cli.main``) or the real library
function and checks the outcome (on disk where there is one). No model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import one_error_line, run_cli, tree
from tests._sockets import silent_server
from tokenfield.errors import UserError
from tokenfield.prompts import load_prompts

# --- prompts: read as written ----------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".yaml", ".csv"])
def test_a_category_or_label_of_zero_is_kept(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    if suffix == ".jsonl":
        path.write_text('{"text": "a", "category": 0, "label": 0}\n{"text": "b"}\n')
    elif suffix == ".yaml":
        path.write_text("- {text: a, category: 0, label: 0}\n- {text: b}\n")
    else:
        path.write_text("text,category,label\na,0,0\nb,,\n")
    first, second = load_prompts(path)
    assert (first.category, first.label) == ("0", "0")
    assert (second.category, second.label) == ("", "")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0c", "\x1e", "\r"])
def test_a_line_separator_inside_a_txt_prompt_keeps_it_one_prompt(tmp_path, separator):
    path = tmp_path / "p.txt"
    path.write_bytes(f"one{separator}two\r\nthree\n".encode())
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == [f"one{separator}two", "three"]


def test_a_line_separator_inside_a_jsonl_string_keeps_the_line_whole(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "one\u2028two"}\n{"text": "three"}\n', encoding="utf-8")
    assert [p.text for p in load_prompts(path)] == ["one\u2028two", "three"]


def test_a_quoted_newline_in_a_csv_field_is_kept(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('text,category\n"first line\nsecond line",a\nplain,b\n', newline="")
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["first line\nsecond line", "plain"]
    assert [p.category for p in prompts] == ["a", "b"]


def test_a_csv_row_with_an_extra_field_is_an_error(tmp_path, capsys):
    path = tmp_path / "p.csv"
    path.write_text("text,category\nhello,a,oops\n")
    with pytest.raises(UserError, match="row 1 .* more fields than the header"):
        load_prompts(path)
    code, _out, err = run_cli(["trace", "-p", path, "-o", tmp_path / "r"], capsys)
    assert code == 2
    assert "more fields than the header" in one_error_line(err)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "name, content",
    [("p.jsonl", '{"text": "bad \\ud800 text"}\n'), ("p.yaml", '- "bad \\ud800 text"\n')],
)
def test_a_lone_surrogate_in_a_prompt_is_one_line(tmp_path, name, content, capsys):
    path = tmp_path / name
    path.write_text(content)
    code, _out, err = run_cli(["trace", "-p", path, "-o", tmp_path / "r"], capsys)
    assert code == 2
    assert "lone surrogate (U+D800)" in one_error_line(err)
    assert not (tmp_path / "r").exists()


# --- the Dask scheduler: a checked address, a bounded handshake, loopback only ----


@pytest.fixture
def silent_scheduler():
    with silent_server() as server:
        yield server


def test_the_handshake_with_a_silent_scheduler_is_bounded(silent_scheduler):
    from tokenfield._dask import connect

    address, accepted = silent_scheduler
    with pytest.raises(UserError, match="accepted no handshake within 0.5 s"):
        connect(address, timeout=0.5)
    assert accepted  # it did connect: the wait was for the answer


PHASE = ["phase-diagram", "--dims", "2", "--betas", "1", "--t-max", "0.2", "--frames", "3",
         "--n", "4", "--systems", "2"]  # fmt: skip


def test_phase_diagram_with_a_silent_scheduler_leaves_no_store(
    silent_scheduler, tmp_path, monkeypatch, capsys
):
    import tokenfield._dask as dask_module

    monkeypatch.setattr(dask_module, "HANDSHAKE_TIMEOUT", 0.5)
    address, _accepted = silent_scheduler
    out = tmp_path / "sweep"
    code, _out, err = run_cli([*PHASE, "--scheduler", address, "--out", out], capsys)
    assert code == 2
    assert "accepted no handshake within 0.5 s" in one_error_line(err)
    assert not (out / "phase_diagram.zarr").exists()


@pytest.mark.parametrize(
    "address, said",
    [
        ("tls://127.0.0.1:8786", "asks for TLS"),
        ("wss://127.0.0.1:8786", "asks for TLS"),
        ("tcp://127.0.0.1:notaport", "is not HOST:PORT"),
        ("tcp://127.0.0.1:99999", "bad port"),
        ("nonsense", "is not HOST:PORT"),
        ("foo://host:1", "unsupported scheme 'foo'"),
        ("ucx://host:1", "unsupported scheme 'ucx'"),
        ("inproc://x", "unsupported scheme 'inproc'"),
    ],
)
def test_a_bad_scheduler_address_is_one_line_before_any_work(tmp_path, address, said, capsys):
    out = tmp_path / "sweep"
    code, _out, err = run_cli([*PHASE, "--scheduler", address, "--out", out], capsys)
    assert code == 2
    assert said in one_error_line(err)
    assert not out.exists()


def test_the_sweep_itself_connects_before_it_creates_the_store(
    silent_scheduler, tmp_path, monkeypatch
):
    import tokenfield._dask as dask_module
    from tokenfield.meanfield.phase import PhaseDiagramConfig, phase_diagram

    monkeypatch.setattr(dask_module, "HANDSHAKE_TIMEOUT", 0.5)
    config = PhaseDiagramConfig(dims=(2,), betas=(1.0,), t_max=0.2, frames=3, n_particles=4,
                                n_systems=2)  # fmt: skip
    with pytest.raises(UserError, match="accepted no handshake"):
        phase_diagram(config, store=tmp_path / "s.zarr", scheduler=silent_scheduler[0])
    assert not (tmp_path / "s.zarr").exists()


def test_a_local_cluster_listens_on_loopback_only():
    from dask.distributed import Client

    from tokenfield._dask import local_cluster

    with local_cluster(1, processes=True, dashboard=True, threads_per_worker=1) as cluster:
        with Client(cluster) as client:
            worker_hosts = {
                w.split("://")[1].rsplit(":", 1)[0] for w in client.scheduler_info()["workers"]
            }  # noqa: E501
        scheduler = cluster.scheduler
        sockets = [s.getsockname()[0] for s in scheduler.http_server._sockets.values()]
        assert sockets and set(sockets) == {"127.0.0.1"}  # the dashboard
        assert scheduler.address.startswith("tcp://127.0.0.1:")
        assert worker_hosts == {"127.0.0.1"}


# --- --generate against the model's context; --max-memory in bytes ---------------


@pytest.mark.parametrize("generate", [10**6, 65])
def test_generate_beyond_the_context_is_refused_before_loading(tmp_path, generate, capsys):
    # a model directory with a config and no weights: refused before any loading
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": 64})
    )
    out = tmp_path / "r"
    code, _out, err = run_cli(["trace", "-m", model, "--generate", generate, "-o", out], capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"--generate {generate} is beyond the context of model" in line
    assert "(64 tokens); pass --generate 63 or less" in line
    assert not out.exists()


def test_generate_after_a_long_prompt_names_the_room_left():
    from tokenfield.errors import ParameterError
    from tokenfield.models.trace_config import check_generate_length

    check_generate_length(54, 64, "m", prompt_tokens=10)  # exactly fills the context
    with pytest.raises(ParameterError, match="55 after a prompt of 10 tokens .* pass generate 54"):
        check_generate_length(55, 64, "m", prompt_tokens=10)
    check_generate_length(10**6, None, "m")  # a config without a context: no bound to check


def test_max_memory_takes_a_number_of_bytes():
    from accelerate.utils import convert_file_size_to_int

    from tokenfield.models.placement import Placement, parse_max_memory

    memory = parse_max_memory("cpu=1, disk=2GiB")
    assert memory == {"cpu": 1, "disk": "2GiB"}
    assert convert_file_size_to_int(memory["cpu"]) == 1  # what accelerate will do with it
    placement = Placement.parse("auto", "cpu=1000000")
    again = placement.load_args()
    assert Placement.parse(again["device_map"], again["max_memory"]) == placement
    with pytest.raises(UserError, match="bad size '0'"):
        parse_max_memory("cpu=0")


# --- disk full in the final consolidation ----------------------------------------


def _piece(start: int, n: int):
    import numpy as np
    import xarray as xr

    from tokenfield.runs import strings

    return xr.Dataset(
        {"states": (("time", "particle", "feature"), np.ones((3, n, 2), dtype=np.float32))},
        coords={
            "particle": np.arange(start, start + n),
            "prompt": ("particle", strings(f"p{i}" for i in range(start, start + n))),
        },
    )


def test_disk_full_while_consolidating_is_one_line_and_the_run_finishes_later(
    tmp_path, monkeypatch
):
    from tokenfield.runs import RunWriter, open_run, read_run_info
    from tokenfield.runs import writer as runs_writer

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    run = tmp_path / "r"
    writer = RunWriter(run, "trace", {"a": 1}, append_dim="particle")
    writer.append(_piece(0, 2), done=1)
    monkeypatch.setattr(runs_writer, "consolidate", full)
    with pytest.raises(UserError, match="No space left on device.*run the same command again"):
        writer.finish()
    writer.close()
    assert read_run_info(run).status == "partial"  # never marked complete without metadata
    monkeypatch.undo()
    again = RunWriter(run, "trace", {"a": 1}, append_dim="particle")
    again.finish()
    assert read_run_info(run).status == "complete"
    assert open_run(run).sizes["particle"] == 2


# --- files that are not what they claim to be ------------------------------------


def test_report_section_that_is_not_utf8_is_one_line(tmp_path, capsys):
    from tests.unit.synthetic_trajectories import split_groups, trace_dataset, write_run

    run = write_run(tmp_path / "run", trace_dataset(*split_groups()))
    section = tmp_path / "latin1.html"
    section.write_bytes("<p>caf\u00e9</p>".encode("latin-1"))
    out = tmp_path / "r.html"
    code, _out, err = run_cli(["report", run, "--section", section, "--out", out], capsys)
    assert code == 2
    line = one_error_line(err)
    assert "cannot read section file" in line and "not UTF-8 text" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a safetensors file at all",
        b"",
        (8).to_bytes(8, "little") + b'{"a": 1}',
        b"\xff" * 64,
    ],
)
def test_steer_with_a_file_that_is_not_safetensors_is_one_line(tmp_path, content, capsys):
    vector = tmp_path / "vector.safetensors"
    vector.write_bytes(content)
    out = tmp_path / "r"
    code, _out, err = run_cli(
        ["trace", "--steer", vector, "--steer-positions", "last", "-o", out], capsys
    )
    assert code == 2
    assert "is not a tokenfield steering vector" in one_error_line(err)
    assert not out.exists()


def _zarr_v2_run(root: Path, codec) -> tuple[Path, list[str]]:
    """A complete run whose store is Zarr v2 with 'prompt' as Python objects in ``codec``."""
    import shutil

    import numpy as np
    import xarray as xr

    from tests.unit.synthetic_trajectories import split_groups, trace_dataset, write_run

    run = write_run(root / "run", trace_dataset(*split_groups()))
    store = run / "trajectory.zarr"
    ds = xr.open_zarr(store).load().drop_encoding()
    shutil.rmtree(store)
    ds.to_zarr(store, zarr_format=2, consolidated=False)
    array = store / "prompt"
    meta = json.loads((array / ".zarray").read_text())
    meta.update(dtype="|O", filters=[codec.get_config()], compressor=None, fill_value=None)
    (array / ".zarray").write_text(json.dumps(meta))
    for chunk in array.glob("[0-9]*"):
        chunk.unlink()
    (array / "0").write_bytes(codec.encode(np.asarray(ds["prompt"].values, dtype=object)))
    return run, [str(p) for p in ds["prompt"].values]


@pytest.mark.parametrize("codec_name", ["Pickle", "MsgPack", "JSON"])
def test_a_zarr_v2_store_with_an_object_codec_is_one_line(tmp_path, codec_name, capsys):
    import numcodecs

    codec = getattr(numcodecs, codec_name)()
    run, _prompts = _zarr_v2_run(tmp_path, codec)
    for command in (
        ["analyze", run, "--no-figures"],
        ["report", run, "--out", tmp_path / "r.html"],
    ):
        code, _out, err = run_cli(command, capsys)
        assert code == 2
        line = one_error_line(err)
        assert f"codec '{codec.codec_id}', which tokenfield cannot read" in line
    assert not (run / "metrics.json").exists() and not (tmp_path / "r.html").exists()


def test_a_zarr_v2_store_with_utf8_strings_still_opens(tmp_path):
    import numcodecs

    from tokenfield.runs import open_run

    run, prompts = _zarr_v2_run(tmp_path, numcodecs.VLenUTF8())
    assert [str(p) for p in open_run(run)["prompt"].values] == prompts


# --- a read-only run: refused before the work, not after ------------------------


@pytest.mark.parametrize("command", ["analyze", "lens"])
def test_a_read_only_run_is_refused_before_any_work(tmp_path, monkeypatch, command, capsys):
    import tempfile

    from tests.unit.synthetic_trajectories import split_groups, trace_dataset, write_run
    from tokenfield.pipelines import analyze as analyze_pipeline
    from tokenfield.pipelines import theory as theory_pipeline

    run = write_run(tmp_path / "run", trace_dataset(*split_groups()))
    before = tree(run)
    real_mkstemp = tempfile.mkstemp

    def read_only(*args, **kwargs):  # root writes through file modes: fail as EROFS does
        if Path(kwargs.get("dir") or "").resolve() == run.resolve():
            raise OSError(30, "Read-only file system")
        return real_mkstemp(*args, **kwargs)

    calls = []
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(analyze_pipeline, "analyze_run", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(theory_pipeline, "theory_lens", lambda *a, **k: calls.append(a))
    code, _out, err = run_cli([command, run, "--no-figures"], capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"'{command}' cannot write its results into" in line and "Read-only file system" in line
    assert calls == []  # refused before the analysis ran
    assert tree(run) == before
