"""`tokenfield report --section` appends HTML fragments (mean-field, theory lens); a
run's own attractors.html comes with it."""

import pytest

from tests.unit.synthetic_trajectories import split_groups, trace_dataset, write_run
from tokenfield.errors import UserError
from tokenfield.pipelines.report import write_report


def test_sections_are_appended_and_sections_alone_are_enough(tmp_path):
    run = write_run(tmp_path / "run", trace_dataset(*split_groups()))
    fragment = tmp_path / "mf.html"
    fragment.write_text("<section><h2>Mean-field theory</h2><p>k_max = 4</p></section>")
    page = write_report([run], tmp_path / "r.html", sections=[fragment]).read_text()
    assert page.index("k_max = 4") > page.index("run-0")  # after the run's section
    alone = write_report([], tmp_path / "only.html", sections=[fragment]).read_text()
    assert "k_max = 4" in alone and "run-0" not in alone
    with pytest.raises(UserError, match="section file .* does not exist"):
        write_report([run], tmp_path / "x.html", sections=[tmp_path / "missing.html"])
    assert not (tmp_path / "x.html").exists()


def test_a_runs_attractors_section_comes_with_the_run_once(tmp_path):
    """RUN/attractors.html ('tokenfield attractors') is appended with RUN without
    --section, and only once when it is also named."""
    run = write_run(tmp_path / "run", trace_dataset(*split_groups()))
    (run / "attractors.html").write_text("<section><h2>Is it an attractor?</h2></section>")
    page = write_report([run], tmp_path / "r.html").read_text()
    assert page.count("Is it an attractor?") == 1
    assert page.index("Is it an attractor?") > page.index("run-0")
    named = write_report([run], tmp_path / "r2.html", sections=[run / "attractors.html"])
    assert named.read_text().count("Is it an attractor?") == 1
