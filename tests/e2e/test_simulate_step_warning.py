"""`tokenfield simulate` warns when a fixed step is too large for the flow."""

from tokenfield.cli import main


def run(args, capsys):
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None)
    return capsys.readouterr().err


def test_large_step_warns_and_small_step_does_not(tmp_path, capsys):
    common = ["simulate", "--dynamics", "usa", "--dim", "2", "--n", "32", "--init", "equispaced"]
    err = run(
        [*common, "--beta", "9", "--dt", "0.05", "--t-max", "0.1", "--out", str(tmp_path / "a")],
        capsys,
    )
    assert "warning" in err and "rad per step" in err
    err = run(
        [*common, "--beta", "1", "--dt", "0.05", "--t-max", "0.1", "--out", str(tmp_path / "b")],
        capsys,
    )
    assert "warning" not in err
