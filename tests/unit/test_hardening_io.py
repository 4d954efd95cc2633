"""Issue 21, items 1-6 and 8: no write or read through a symlink that leaves the run,
a cache memo and a store that cannot lie, a ``run.json`` checked against its store,
and ``--overwrite`` that deletes only tokenfield's own files.

Each attack test plants the attacker's file and checks afterwards that it is
byte-for-byte untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests._cli import one_error_line, run_cli
from tokenfield import _lock
from tokenfield.errors import UserError
from tokenfield.runs import RunWriter

SECRET = b"the attacker's target: must stay exactly as it is\n"


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


# --- item 1: the lock never follows a symlink -------------------------------------

WRITERS = {
    "simulate": ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1"],
    "trace": ["trace", "-m", "smollm2", "--prompts", "{prompts}"],
    "phase-diagram": ["phase-diagram", "--dims", "2", "--betas", "1"],
    "predict-clusters": ["predict-clusters", "--betas", "1", "--n", "8", "--seeds", "1"],
    "pde": ["pde", "--n", "8", "--times", "0", "--cells", "16"],
    "metastability": ["metastability", "--betas", "2", "--caps", "2", "--seeds", "1"],
}


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo"])
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_planted_lock_file_is_refused_and_its_target_untouched(
    tmp_path, target, command, planted, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / _lock.LOCK_NAME
    if planted == "symlink":
        lock.symlink_to(target)
    elif planted == "hardlink":
        os.link(target, lock)
    else:
        os.mkfifo(lock)
    prompts = tmp_path / "p.txt"
    prompts.write_text("one prompt\n")
    args = [a.replace("{prompts}", str(prompts)) for a in WRITERS[command]]
    code, _out, err = run_cli([*args, "--out", out], capsys)
    assert code == 2, err
    line = one_error_line(err)
    assert "not tokenfield's lock" in line and f"remove '{lock}'" in line
    assert target.read_bytes() == SECRET
    assert sorted(p.name for p in out.iterdir()) == [_lock.LOCK_NAME]  # nothing written
    assert lock.is_symlink() == (planted == "symlink")


def test_the_library_writer_refuses_a_symlinked_lock(tmp_path, target):
    out = tmp_path / "run"
    out.mkdir()
    (out / _lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link"):
        RunWriter(out, "trace", {"a": 1}, append_dim="particle")
    assert target.read_bytes() == SECRET
    # a dangling symlink is not created through either
    (out / _lock.LOCK_NAME).unlink()
    (out / _lock.LOCK_NAME).symlink_to(tmp_path / "elsewhere" / "new-file")
    with pytest.raises(UserError, match="is a symbolic link"):
        _lock.acquire(out)
    assert not (tmp_path / "elsewhere" / "new-file").exists()


# --- item 2: the cache's hash memo is checked against the entry it selects -----------


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    """A private cache whose "dequantisation" writes the GGUF's own bytes as the
    weights (the real build's directory handling, without transformers)."""
    from tokenfield.models import sources

    monkeypatch.setenv("TOKENFIELD_CACHE", str(tmp_path / "cache"))
    builds: list[str] = []

    def build(gguf, file_hash, target):
        builds.append(gguf.name)

        def save(directory):
            (directory / "model.safetensors").write_bytes(b"weights of " + gguf.read_bytes())

        sources._install_entry(gguf, file_hash, target, save)

    monkeypatch.setattr(sources, "_build_entry", build)
    models = tmp_path / "models"
    models.mkdir()
    small = models / "small.gguf"
    other = models / "other.gguf"
    small.write_bytes(b"SMALL MODEL " * 1000)
    other.write_bytes(b"OTHER MODEL " * 2000)
    return sources, small, other, builds


def _weights(entry: Path) -> bytes:
    return (entry / "model.safetensors").read_bytes()


def test_a_memo_that_names_another_models_hash_is_never_believed(fake_cache, capsys):
    import hashlib
    import json

    sources, small, other, builds = fake_cache
    small_dir, small_hash, _ = sources._gguf_entry(small)
    other_dir, other_hash, _ = sources._gguf_entry(other)
    assert small_hash == "sha256:" + hashlib.sha256(small.read_bytes()).hexdigest()
    assert builds == ["small.gguf", "other.gguf"] and small_dir != other_dir
    capsys.readouterr()
    memo_file = sources.cache_root() / "hashes.json"
    memo = json.loads(memo_file.read_text())
    (key,) = [k for k in memo if k.startswith(str(small.resolve()))]
    memo[key] = other_hash  # the attack: small's memo entry now names other's hash
    memo_file.write_text(json.dumps(memo))
    entry, file_hash, _ = sources._gguf_entry(small)
    assert (entry, file_hash) == (small_dir, small_hash)  # its own entry, not other's
    assert _weights(entry) == b"weights of " + small.read_bytes()
    assert builds == ["small.gguf", "other.gguf"]  # nothing rebuilt: it was not needed
    assert "hash memo" in capsys.readouterr().err
    assert json.loads(memo_file.read_text())[key] == small_hash  # the memo is repaired
    # the same through resolve_source, as `trace -m PATH.gguf` calls it
    memo[key] = other_hash
    memo_file.write_text(json.dumps(memo))
    directory, weights_id, _name, weights = sources.resolve_source(str(small))
    assert (directory, weights_id) == (small_dir, small_hash)


def test_a_memo_naming_an_uncached_hash_never_labels_an_entry_with_it(fake_cache, capsys):
    import json

    sources, small, other, builds = fake_cache
    memo_file = sources.cache_root() / "hashes.json"
    sources._file_hash(other)  # memo entry for other
    memo = json.loads(memo_file.read_text())
    (key,) = list(memo)
    fake = "sha256:" + "ab" * 32
    memo[key] = fake
    memo_file.write_text(json.dumps(memo))
    entry, file_hash, _ = sources._gguf_entry(other)
    assert file_hash != fake and not sources._entry_path(fake).exists()
    assert _weights(entry) == b"weights of " + other.read_bytes()


def test_an_entry_whose_source_record_names_another_file_is_checked(fake_cache, capsys):
    """An entry built from the same content elsewhere (a copied cache, a moved file)
    is reused after one hash; one whose record names other content is rebuilt."""
    import json
    import shutil

    sources, small, other, builds = fake_cache
    entry, small_hash, _ = sources._gguf_entry(small)
    moved = small.with_name("moved.gguf")
    shutil.copy(small, moved)
    again, moved_hash, _ = sources._gguf_entry(moved)
    assert (again, moved_hash) == (entry, small_hash) and builds == ["small.gguf"]
    record = json.loads((entry / sources.SOURCE_RECORD).read_text())
    assert record["gguf"] == str(moved.resolve())  # the record now names where it is
    assert record["inode"] == moved.stat().st_ino and record["size"] == moved.stat().st_size
    assert sources.verify_entry(entry)[0] is not None  # with its manifest updated
    # an entry relabelled to claim another hash, manifest and all
    record["hash"] = "sha256:" + "cd" * 32
    (entry / sources.SOURCE_RECORD).write_text(json.dumps(record))
    sources.write_manifest(entry)
    rebuilt, _, _ = sources._gguf_entry(moved)
    assert rebuilt == entry and builds == ["small.gguf", "moved.gguf"]
    assert json.loads((entry / sources.SOURCE_RECORD).read_text())["hash"] == small_hash


# --- item 3: every chunk of the store carries a checksum -----------------------------


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run

    states, labels = clustered(n_per_category=3, n_time=4, n_feature=8)
    ds = trace_dataset(states, labels)
    ds.attrs["run"]["config"]["model"] = {"name": "synthetic", "d_model": 8}
    return write_run(tmp_path_factory.mktemp("clean") / "run", ds)


def _copy(run: Path, where: Path) -> Path:
    import shutil

    shutil.copytree(run, where)
    return where


def _chunk(run: Path) -> Path:
    return run / "trajectory.zarr" / "states" / "c" / "0" / "0" / "0"


def _xor3(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for at in (len(data) // 4, len(data) // 2, 3 * len(data) // 4):
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))


DAMAGE = {
    "xor3": _xor3,
    "garbage": lambda p: p.write_bytes(os.urandom(p.stat().st_size)),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
}


def test_the_store_is_checksummed_and_plain_xarray_reads_it(clean_run):
    import json

    import numpy as np
    import xarray as xr

    from tokenfield.runs import open_run

    for array in ("prompt", "category"):
        codecs = json.loads((clean_run / "trajectory.zarr" / array / "zarr.json").read_text())
        zstd = [c for c in codecs["codecs"] if c["name"] == "zstd"]
        assert zstd and zstd[0]["configuration"]["checksum"] is True, array
    # float states: raw bytes and a CRC-32C per chunk (issue 25: they barely compress)
    codecs = json.loads((clean_run / "trajectory.zarr" / "states" / "zarr.json").read_text())
    assert [c["name"] for c in codecs["codecs"]] == ["bytes", "crc32c"]
    plain = xr.open_zarr(clean_run / "trajectory.zarr")
    np.testing.assert_array_equal(plain["states"].values, open_run(clean_run)["states"].values)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_chunk_is_one_line_for_every_reader(clean_run, tmp_path, damage, capsys):
    from tokenfield.runs import open_run

    run = _copy(clean_run, tmp_path / "run")
    DAMAGE[damage](_chunk(run))
    for args in (
        ["analyze", run, "--no-figures"],
        ["report", run, "--out", tmp_path / "r.html"],
    ):
        code, _out, err = run_cli(args, capsys)
        assert code == 2, err
        line = one_error_line(err)
        assert f"run '{run}' has a damaged chunk in trajectory.zarr" in line
        assert "--overwrite" in line
    assert not (tmp_path / "r.html").exists() and not (run / "metrics.json").exists()
    with pytest.raises(UserError, match="has a damaged chunk"):
        open_run(run)["states"].load()


def test_a_run_from_before_the_checksum_still_opens(clean_run, tmp_path, monkeypatch):
    import json

    import numpy as np
    from zarr.codecs import ZstdCodec

    from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
    from tokenfield import runs

    monkeypatch.setattr(runs.store, "checksummed", lambda: (ZstdCodec(level=0, checksum=False),))
    monkeypatch.setenv("TOKENFIELD_STORE_COMPRESSOR", "zstd")  # the states too, as then
    states, labels = clustered(n_per_category=3, n_time=4, n_feature=8)
    old = write_run(tmp_path / "old", trace_dataset(states, labels))
    meta = json.loads((old / "trajectory.zarr" / "states" / "zarr.json").read_text())
    assert meta["codecs"][-1]["configuration"]["checksum"] is False
    monkeypatch.undo()
    np.testing.assert_array_equal(
        runs.open_run(old)["states"].values, runs.open_run(clean_run)["states"].values
    )


# --- item 4: run.json is checked against the store -----------------------------------


def _edit(run: Path, change) -> None:
    import json

    data = json.loads((run / "run.json").read_text())
    change(data)
    (run / "run.json").write_text(json.dumps(data))


EDITS = {
    "future format": (lambda d: d.update(format=2), "has run format 2, newer than"),
    "future version": (
        lambda d: (d.pop("format"), d.update(tokenfield_version="99.0.0")),
        "written by tokenfield 99.0.0, newer than this one",
    ),
    "size": (lambda d: d["progress"].update(size=5), "progress size = 5, but trajectory.zarr"),
    "done": (lambda d: d["progress"].update(done=4), "progress done = 4 prompts"),
    "d_model": (
        lambda d: d["config"]["model"].update(d_model=640),
        "the model has d = 640, the states have 8 features",
    ),
    "more prompts": (
        lambda d: d["config"].update(prompts=[{"text": f"p{i}"} for i in range(21)]),
        "marked complete, but holds 15 of its 21 prompts",
    ),
    "text done": (lambda d: d["progress"].update(done="4"), "progress 'done' is '4', not a count"),
    "float size": (lambda d: d["progress"].update(size=4.5), "progress 'size' is 4.5, not a count"),
    "bool done": (lambda d: d["progress"].update(done=True), "progress 'done' is True, not a"),
    "negative": (lambda d: d["progress"].update(size=-1), "progress 'size' is -1, not a count"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_run_json_is_refused_by_every_reader(clean_run, tmp_path, edit, capsys):
    from tokenfield.runs import open_run

    change, message = EDITS[edit]
    run = _copy(clean_run, tmp_path / "run")
    _edit(run, change)
    for args in (
        ["analyze", run, "--no-figures"],
        ["report", run, "--out", tmp_path / "r.html"],
    ):
        code, _out, err = run_cli(args, capsys)
        assert code == 2, err
        assert message in one_error_line(err)
    with pytest.raises(UserError, match="run.json"):
        open_run(run)


def _partial_trace(path: Path, prompts: int = 3, per_prompt: int = 2) -> Path:
    """A partial trace: ``prompts`` prompts of ``per_prompt`` tokens each written."""
    import numpy as np
    import xarray as xr

    from tokenfield.runs import strings

    config = {"prompts": [{"text": f"p{i}"} for i in range(5)], "model": {"d_model": 2}}
    writer = RunWriter(path, "trace", config, append_dim="particle", batch_size=1)
    for i in range(prompts):
        start = i * per_prompt
        writer.append(
            xr.Dataset(
                {"states": (("time", "particle", "feature"), np.ones((3, per_prompt, 2), "f4"))},
                coords={
                    "particle": np.arange(start, start + per_prompt),
                    "prompt_index": ("particle", np.full(per_prompt, i)),
                    "prompt": ("particle", strings([f"p{i}"] * per_prompt)),
                },
            ),
            done=i + 1,
        )
    writer.close()
    return path


@pytest.mark.parametrize(
    ("done", "size"), [(2, 6), (4, 8), (3, 4), (3, 9)], ids=["done<", "both>", "size<", "size>"]
)
def test_a_resume_refuses_progress_that_disagrees_with_the_store(tmp_path, done, size):
    from tokenfield.runs import read_run_info

    run = _partial_trace(tmp_path / "run")
    assert read_run_info(run).progress["done"] == 3 and read_run_info(run).progress["size"] == 6
    _edit(run, lambda d: d["progress"].update(done=done, size=size))
    before = (run / "run.json").read_bytes()
    config = read_run_info(run).config
    with pytest.raises(UserError, match="does not match its store"):
        RunWriter(run, "trace", config, append_dim="particle", batch_size=1)
    assert (run / "run.json").read_bytes() == before  # nothing trimmed or rewritten


def test_a_partial_run_edited_to_complete_is_refused(tmp_path, capsys):
    run = _partial_trace(tmp_path / "run")
    _edit(run, lambda d: d.update(status="complete"))
    code, _out, err = run_cli(["analyze", run, "--no-figures"], capsys)
    assert code == 2
    assert "marked complete, but holds 3 of its 5 prompts" in one_error_line(err)


# --- messages: the resume line and the partial-run fix as a CLI user reads them -------


def test_an_interrupt_after_the_run_finished_says_there_is_nothing_to_resume(
    tmp_path, monkeypatch, capsys
):
    from tokenfield import runs

    finish = runs.RunWriter.finish

    def finish_then_interrupt(self, **progress):
        finish(self, **progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.RunWriter, "finish", finish_then_interrupt)
    out = tmp_path / "sim"
    args = ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1", "--out", out]
    code, _out, err = run_cli(args, capsys)
    assert code == 130
    assert err.strip().splitlines()[-1] == (
        f"tokenfield: interrupted after '{out}' was complete; nothing to resume."
    )
    assert runs.read_run_info(out).complete

    def interrupt(self, piece, done, **progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.RunWriter, "append", interrupt)
    args[-1] = tmp_path / "sim2"
    code, _out, err = run_cli(args, capsys)
    assert code == 130
    assert err.strip().splitlines()[-1] == (
        "tokenfield: interrupted; run the same command again to resume."
    )


def test_a_partial_run_tells_a_cli_user_what_to_run_not_a_python_argument(tmp_path, capsys):
    from tokenfield.runs import open_run

    run = _partial_trace(tmp_path / "run")
    code, _out, err = run_cli(["analyze", run, "--no-figures"], capsys)
    line = one_error_line(err)
    assert code == 2 and "is partial" in line
    assert "allow_partial" not in line and "again to finish it" in line
    with pytest.raises(UserError, match="allow_partial=True"):  # the library's own fix
        open_run(run)


def test_a_partial_run_opened_as_partial_is_checked_too(tmp_path):
    from tokenfield.runs import open_run

    run = _partial_trace(tmp_path / "run")
    assert open_run(run, allow_partial=True).sizes["particle"] == 6
    _edit(run, lambda d: d["progress"].update(done=2))
    with pytest.raises(UserError, match="progress says 2 prompts in 6 rows; those rows hold 3"):
        open_run(run, allow_partial=True)


# --- item 5: no figure is written or embedded through a symlink ----------------------


def test_analyze_refuses_a_symlinked_figures_dir_and_writes_nothing_there(
    clean_run, tmp_path, capsys, monkeypatch
):
    from tokenfield.pipelines import analyze

    def no_work(*args, **kwargs):
        raise AssertionError("the analysis ran before the figures directory was checked")

    monkeypatch.setattr(analyze, "analyze", no_work)
    run = _copy(clean_run, tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "figures").symlink_to(elsewhere)
    code, _out, err = run_cli(["analyze", run], capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"'{run / 'figures'}' is a symbolic link" in line and "remove the link" in line
    assert list(elsewhere.iterdir()) == []
    assert not (run / "metrics.json").exists()  # refused before the work


def test_a_figure_name_that_is_a_symlink_is_replaced_not_written_through(
    clean_run, tmp_path, target
):
    from tokenfield.pipelines.analyze import analyze_run

    run = _copy(clean_run, tmp_path / "run")
    (run / "figures").mkdir()
    (run / "figures" / "speed.png").symlink_to(target)
    analyze_run(run, n_permutations=0)
    assert target.read_bytes() == SECRET
    speed = run / "figures" / "speed.png"
    assert not speed.is_symlink() and speed.read_bytes().startswith(b"\x89PNG")


def test_the_report_never_embeds_a_file_reached_through_a_symlink(clean_run, tmp_path, capsys):
    import base64

    from tokenfield.pipelines.analyze import analyze_run

    private = tmp_path / "private" / "id_rsa.png"
    private.parent.mkdir()
    key = b"-----BEGIN PRIVATE KEY----- attacker wants this -----END PRIVATE KEY-----"
    private.write_bytes(key)
    secret = base64.b64encode(key).decode()
    run = _copy(clean_run, tmp_path / "run")
    analyze_run(run, n_permutations=0)
    (run / "figures" / "zz_key.png").symlink_to(private)  # a link among real figures
    out = tmp_path / "r.html"
    assert run_cli(["report", run, "--out", out], capsys)[0] == 0
    page = out.read_text()
    assert secret not in page and "zz_key" not in page
    assert base64.b64encode((run / "figures" / "speed.png").read_bytes()).decode() in page
    # the whole figures/ a link to a directory of "figures"
    import shutil

    shutil.rmtree(run / "figures")
    (run / "figures").symlink_to(private.parent)
    assert run_cli(["report", run, "--out", out, "--overwrite"], capsys)[0] == 0
    assert secret not in out.read_text()


# --- item 6: --overwrite deletes only tokenfield's own files, after checking them ------


def test_overwrite_keeps_the_users_files_in_figures(tmp_path, capsys):
    from tokenfield.pipelines.analyze import analyze_run
    from tokenfield.runs import DERIVED, read_run_info

    out = tmp_path / "sim"
    assert run_cli(["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1", "--out", out])[0] == 0
    analyze_run(out, n_permutations=0)
    drawn = sorted(p.name for p in (out / "figures").iterdir())
    assert "simulation_particles.png" in drawn and "speed.png" in drawn
    (out / "figures" / "my_notes.txt").write_text("mine")
    (out / "figures" / "my_plot.png").write_bytes(b"mine too")
    (out / "notes.md").write_text("mine")
    for name in ("flow.json", "flow.html", "theory.json", "theory.html"):
        (out / name).write_text("{}")
    assert {"flow.json", "flow.html"} <= set(DERIVED)
    code, _o, err = run_cli(
        ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.2", "--out", out, "--overwrite"],
        capsys,
    )
    assert code == 0, err
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["my_notes.txt", "my_plot.png"]
    assert (out / "notes.md").read_text() == "mine"
    for name in ("flow.json", "flow.html", "theory.json", "theory.html", "metrics.json"):
        assert not (out / name).exists(), name
    assert read_run_info(out).config["t_max"] == 0.2


def test_overwrite_with_a_symlinked_figures_dir_deletes_nothing(tmp_path, target, capsys):
    from tokenfield.runs import read_run_info

    out = tmp_path / "sim"
    assert run_cli(["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1", "--out", out])[0] == 0
    elsewhere = target.parent
    (elsewhere / "speed.png").write_bytes(b"not tokenfield's")
    (out / "figures").symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    store = sorted(str(p) for p in (out / "trajectory.zarr").rglob("*"))
    code, _o, err = run_cli(
        ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.2", "--out", out, "--overwrite"],
        capsys,
    )
    assert code == 2
    assert "is a symbolic link; --overwrite deletes only" in one_error_line(err)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before
    assert read_run_info(out).config["t_max"] == 0.1  # the old run is intact
    assert sorted(str(p) for p in (out / "trajectory.zarr").rglob("*")) == store
    (out / "figures").unlink()  # the fix the message names: the retry then works
    code, _o, err = run_cli(
        ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.2", "--out", out, "--overwrite"],
        capsys,
    )
    assert code == 0, err and read_run_info(out).config["t_max"] == 0.2


def test_every_figure_tokenfield_draws_is_one_overwrite_deletes(clean_run, tmp_path):
    """DERIVED and is_figure are the names the writers use: analyze (with a baseline
    and per-layer figures) and a simulation's figures all match."""
    from tokenfield.pipelines.analyze import analyze_run
    from tokenfield.runs import is_figure

    run = _copy(clean_run, tmp_path / "run")
    analyze_run(run, baseline=clean_run, per_layer=True, n_permutations=0)
    sim = tmp_path / "sim"
    assert run_cli(["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1", "--out", sim])[0] == 0
    analyze_run(sim, n_permutations=0)
    names = [p.name for d in (run, sim) for p in (d / "figures").iterdir()]
    assert len(names) > 15 and all(is_figure(n) for n in names), names
    assert not any(is_figure(n) for n in ("notes.png.txt", "mine.png", "theory_../x.png"))


# --- item 8 (part): --overwrite repairs a run whose run.json is damaged ----------------


@pytest.mark.parametrize("damage", ["garbage", "missing", "future"])
def test_overwrite_replaces_a_run_with_a_damaged_run_json(tmp_path, damage, capsys):
    from tokenfield.runs import read_run_info

    out = tmp_path / "sim"
    args = ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1", "--out", out]
    assert run_cli(args)[0] == 0
    (out / "notes.md").write_text("mine") if damage != "missing" else None
    if damage == "garbage":
        (out / "run.json").write_bytes(b"{not json")
    elif damage == "missing":
        (out / "run.json").unlink()
    else:
        _edit(out, lambda d: d.update(format=99))
    code, _o, err = run_cli(args, capsys)
    assert code == 2 and "--overwrite" in one_error_line(err)
    code, _o, err = run_cli([*args, "--overwrite"], capsys)
    assert code == 0, err
    assert read_run_info(out).complete
    if damage != "missing":
        assert (out / "notes.md").read_text() == "mine"


def test_overwrite_still_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "run.json").write_text("{not json")  # a damaged run.json among the user's data
    (out / "data.csv").write_text("1,2")
    code, _o, err = run_cli(
        ["simulate", "--n", "4", "--dim", "3", "--t-max", "0.1", "--out", out, "--overwrite"],
        capsys,
    )
    assert code == 2 and "is damaged" in one_error_line(err)
    assert sorted(p.name for p in out.iterdir()) == ["data.csv", "run.json"]
    assert (out / "run.json").read_text() == "{not json"


def test_steering_overwrite_deletes_only_its_own_figures(tmp_path):
    from tokenfield.pipelines.steer import prepare_steering_out

    out = tmp_path / "eval"
    (out / "figures").mkdir(parents=True)
    (out / "eval.json").write_text("{}")
    for name in ("test_summary.png", "accuracy_vs_alpha.svg", "notes.txt", "mine.png"):
        (out / "figures" / name).write_text("x")
    prepare_steering_out(out, True, "eval.json")
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["mine.png", "notes.txt"]
    assert not (out / "eval.json").exists()


def test_steering_overwrite_refuses_a_symlinked_figures_dir(tmp_path):
    from tokenfield.errors import UserError
    from tokenfield.pipelines.steer import prepare_steering_out

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "test_summary.png").write_text("precious")
    out = tmp_path / "eval"
    out.mkdir()
    (out / "eval.json").write_text("{}")
    (out / "figures").symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        prepare_steering_out(out, True, "eval.json")
    assert (elsewhere / "test_summary.png").read_text() == "precious"
    assert (out / "eval.json").exists()  # nothing deleted before the refusal
