"""The command line's vocabulary: every `tokenfield ...` line in README.md and
docs/*.md parses (old spellings included), every old spelling in
docs/cli-renames.md parses to the same command and parameters as its new one,
and every hidden name in the code has its row there.

Parsing uses click's ``make_context`` on the typer app: options and arguments
are checked and converted, nothing runs. No model is loaded.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer import exceptions as typer_errors
from typer._click import exceptions as click_errors
from typer.core import TyperGroup
from typer.main import get_command

from tokenfield.cli import app
from tokenfield.cli._app import aliases

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RENAMES = ROOT / "docs" / "cli-renames.md"
# An upper-case word in a synopsis stands for a value: RUN, N, DIR, A:B:N, ...
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_:.,/-]*$")
SAMPLE = {"int": "1", "float": "1.0"}


_ROOT_COMMAND = []


def _root():
    if not _ROOT_COMMAND:
        _ROOT_COMMAND.append(get_command(app))
    return _ROOT_COMMAND[0]


def _same(callback):
    return None if callback is None else (callback.__module__, callback.__qualname__)


def parse(argv: list[str]):
    """(the command's callback, its parsed parameters, the command path), without
    running it. Raises click's errors on an unknown command or option."""
    command = _root()
    ctx = command.make_context("tokenfield", list(argv))
    path = ["tokenfield"]
    while isinstance(command, TyperGroup):
        args = [*ctx._protected_args, *ctx.args]
        if not args:
            return None, {}, " ".join(path)  # a group's --help
        name, command, rest = command.resolve_command(ctx, args)
        path.append(name)
        ctx = command.make_context(name, _fill_placeholders(command, rest), parent=ctx)
    return command.callback, ctx.params, " ".join(path)


def _fill_placeholders(command, args: list[str]) -> list[str]:
    """A synopsis's placeholders (``--seed N``) replaced by a value of the option's type."""
    types = {}
    for param in command.params:
        for name in getattr(param, "opts", []):
            types[name] = param.bare_type()
    out = list(args)
    for i in range(1, len(out)):
        if PLACEHOLDER.match(out[i]) and out[i - 1] in types:
            out[i] = SAMPLE.get(types[out[i - 1]], out[i])
    return out


def _logical_lines(block: str) -> list[str]:
    return block.replace("\\\n", " ").splitlines()


def _command_in(line: str) -> list[str] | None:
    """The ``tokenfield`` command in a shell line: after a ``$`` prompt or a venv
    path, before a comment, ``&&``, ``;`` or ``|`` (a synopsis's ``[...]`` is
    read as given and its ``a|b`` as ``a``)."""
    synopsis = "[" in line
    text = line.replace("[", " ").replace("]", " ") if synopsis else line
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return None
    while tokens and tokens[0] in ("$", ">>>"):
        tokens = tokens[1:]  # a prompt
    program = tokens[0] if tokens else ""
    if not (program == "tokenfield" or program.endswith("/tokenfield")):
        return None  # prose in a code block, or another program
    if len(tokens) > 1 and not re.match(r"^(-|[a-z][a-z-]*$)", tokens[1]):
        return None  # "tokenfield (__init__.py) ...": a file tree, not a command
    argv = []
    for token in tokens[1:]:
        if token in ("&&", ";", "||", "|", ">", "2>", ">>") or token.startswith(">"):
            break
        if synopsis and "|" in token:
            token = token.split("|")[0]
        argv.append(token)
    return argv


def doc_commands() -> list[tuple[str, bool, list[str]]]:
    """Every ``tokenfield ...`` line of a fenced code block in README.md and docs/*.md,
    and every ```tokenfield ...``` in their prose: (where, complete, argv), where
    ``complete`` says the line must also hold every required option."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in re.finditer(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
            first = text.count("\n", 0, match.start(1)) + 1
            for offset, line in enumerate(_logical_lines(match.group(1))):
                if "python" in text[match.start() : match.start(1)]:
                    continue
                argv = _command_in(line)
                if argv:
                    # a runnable line has every required option; a synopsis may not
                    found.append(
                        (f"{doc.relative_to(ROOT)}:{first + offset}", "[" not in line, argv)
                    )
        # and `tokenfield ...` in the prose (a table cell, a sentence)
        for match in re.finditer(r"`((?:\S*/)?tokenfield [^`\n]+)`", text):
            argv = _command_in(match.group(1).replace("...", " "))
            if argv:
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{doc.relative_to(ROOT)}:{line}", False, argv))
    return found


def check_parses(argv: list[str], complete: bool = True) -> str | None:
    """None when ``argv`` parses; else the reason. A missing required option or
    argument is fine unless ``complete``; an unknown command or option, or a bad
    value, never is."""
    try:
        parse(argv)
    except typer_errors.Exit:
        return None  # --help
    except click_errors.NoArgsIsHelpError:
        return None if not complete else "a group without a command"
    except click_errors.MissingParameter as exc:
        return None if not complete else exc.format_message()
    except click_errors.ClickException as exc:
        return exc.format_message()
    return None


def test_the_docs_hold_many_command_lines():
    lines = doc_commands()
    assert len(lines) >= 40
    assert any(argv[:1] == ["theory"] for _w, _n, argv in lines)


@pytest.mark.parametrize("where,complete,argv", doc_commands())
def test_every_documented_command_line_parses(where, complete, argv):
    problem = check_parses(argv, complete)
    assert problem is None, f"{where}: tokenfield {shlex.join(argv)}: {problem}"


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "--modle", "smollm2", "-o", "r"],  # an unknown option
        ["theory", "pdee"],  # an unknown command
        ["simulate", "--n-particle", "8", "-o", "r"],
        ["analyze", "RUN", "--permutations", "many"],  # a bad value
        ["steer", "vector", "RUN", "--alphaz", "1"],
    ],
)
def test_the_check_fails_on_a_typo(argv):
    assert check_parses(argv) is not None


def test_a_runnable_line_must_hold_the_required_options():
    argv = ["theory", "phase-diagram", "--dims", "2"]  # no --out
    assert "--out" in check_parses(argv, complete=True)
    assert check_parses(argv, complete=False) is None
    assert check_parses(["theory"], complete=True) is not None


def test_a_planted_typo_in_a_doc_is_caught(tmp_path, monkeypatch):
    doc = tmp_path / "typo.md"
    doc.write_text("```\n$ tokenfield theory pde --bta 4 --out mf/\n```\n", encoding="utf-8")
    monkeypatch.setattr(__import__(__name__, fromlist=["DOCS"]), "DOCS", [doc])
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    [(where, _n, argv)] = doc_commands()
    assert where == "typo.md:2"
    assert "--bta" in check_parses(argv)


def rename_rows() -> list[tuple[list[str], list[str]]]:
    rows = []
    for line in RENAMES.read_text(encoding="utf-8").splitlines():
        cells = re.findall(r"`(tokenfield [^`]*)`", line)
        if line.startswith("|") and len(cells) >= 2:
            rows.append((shlex.split(cells[0])[1:], shlex.split(cells[1])[1:]))
    return rows


def test_the_rename_table_has_rows():
    assert len(rename_rows()) >= 25


@pytest.mark.parametrize("old,new", rename_rows(), ids=lambda argv: " ".join(argv))
def test_an_old_spelling_parses_to_the_new_one(old, new):
    old_cb, old_params, old_path = parse(old)
    new_cb, new_params, new_path = parse(new)
    assert _same(old_cb) == _same(new_cb), (old_path, new_path)
    assert _resolved(old_params) == _resolved(new_params)
    assert old != new


def _resolved(params: dict) -> dict:
    """What the command does with its parameters where an old spelling is a separate
    hidden option: steer's --run RUN is its RUN, phase-diagram's --dask a local
    cluster of 2 workers (--workers 2)."""
    if "run_option" in params:
        params = {**params, "run": params["run"] or params["run_option"], "run_option": None}
    if "dask" not in params:
        return params
    from tokenfield.cli.meanfield_cmd import dask_workers

    out = {k: v for k, v in params.items() if k != "dask"}
    out["workers"] = dask_workers(params["dask"], params["workers"])
    return out


def _commands(command, path=()):
    for name, sub in command.commands.items():
        yield (*path, name), sub
        if isinstance(sub, TyperGroup):
            yield from _commands(sub, (*path, name))


def test_every_hidden_name_has_a_row_in_the_table():
    text = RENAMES.read_text(encoding="utf-8")
    olds = [old for old, _new in rename_rows()]
    spelled = {(argv[0], token) for argv in olds for token in argv if token.startswith("--")}
    missing = []
    for path, command in _commands(_root()):
        if command.hidden and f"`tokenfield {' '.join(path)} " not in text:
            missing.append(" ".join(path))
        hidden = [p.opts[0] for p in command.params if getattr(p, "hidden", False)]
        for old in [*aliases(command.params), *hidden]:
            if not any(token == old or token == "--no-" + old[2:] for _c, token in spelled):
                missing.append(f"{' '.join(path)} {old}")
    assert not missing, f"not in docs/cli-renames.md: {missing}"


def help_text(path: list[str]) -> str:
    """The ``--help`` of the command at ``path`` (e.g. ["theory", "pde"]), as printed."""
    command = _root()
    ctx = command.make_context("tokenfield", [], resilient_parsing=True)
    for name in path:
        command = command.commands[name]
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    return command.get_help(ctx)


def test_help_shows_new_names_only():
    shown = help_text(["theory", "phase-diagram"])
    assert "--n-particles" in shown and "--solver" in shown and "--seeds" in shown
    for old in ("--n ", "--integrator", "--systems", "--delta", "--dask", "--dynamics"):
        assert old not in shown
    demo = help_text(["demo"])
    assert "--random-baseline / --no-random-baseline" in demo and "--no-baseline" not in demo
    assert "-n, --n-particles" in help_text(["simulate"])  # a short name stays
    top = help_text([]).split("Commands:")[1]
    assert "theory" in top and "steer" in top and "eval-steering" not in top
    assert "predict-clusters" not in top


def test_steer_without_a_subcommand_is_steer_vector():
    argv = ["RUN", "--from", "A", "--to", "B", "--layer", "3", "--out", "s"]
    old = parse(["steer", *argv])
    new = parse(["steer", "vector", *argv])
    assert _same(old[0]) == _same(new[0]) and old[1] == new[1]
    assert old[2] == "tokenfield steer vector"
    assert parse(["steer", "eval", "--out", "e"])[2] == "tokenfield steer eval"


def test_every_library_parameter_in_an_error_is_a_flag():
    """flag_for(param) is '--' + param: every ParameterError label that a command's
    input can reach names one of the command line's (shown) options."""
    from tokenfield.cli._options import flag_for

    shown = set()
    for _path, command in _commands(_root()):
        for param in command.params:
            longs = [n for n in getattr(param, "opts", []) if n.startswith("--")]
            shown.update(longs[:1])
    labels = set()
    for source in (ROOT / "src" / "tokenfield").rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        labels.update(re.findall(r'ParameterError\(\s*"([a-z_0-9]+)"', text))
        for line in re.findall(r"for label, value in (.*)", text):
            labels.update(re.findall(r'\("([a-z_0-9]+)", ', line))
    library_only = {"t0", "lens_k"}  # set by no flag
    # PhaseDiagramConfig.delta is stored with a sweep (resume compares it); the
    # phase-diagram command names it --eps itself.
    named_by_the_command = {"delta"}
    missing = sorted(
        p for p in labels - library_only - named_by_the_command if flag_for(p) not in shown
    )
    assert not missing, missing


def test_the_merge_threshold_is_named_eps(capsys, tmp_path):
    from tokenfield.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["theory", "phase-diagram", "--eps", "5", "--out", str(tmp_path / "p")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--eps must be in (0, 2), not 5" in err and "delta" not in err
