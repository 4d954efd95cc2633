"""`tokenfield report --section` appends HTML fragments (mean-field, theory lens)."""

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
