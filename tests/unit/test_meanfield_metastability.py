"""Metastability: separated caps merge after a time exponential in beta."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.errors import UserError
from tokenfield.meanfield.metastability import (
    cap_centres,
    first_merge_times,
    metastability,
    predicted_slope,
)


def test_metastability_merge_time_grows_with_beta():
    assert predicted_slope(3, 2) == pytest.approx(1.0)
    assert predicted_slope(3, 2, "usa", "paper") == pytest.approx(0.0, abs=1e-15)
    assert cap_centres(3, 2).tolist() == [[1, 0], [-1, 0], [0, 1]]
    early = first_merge_times(2.0, seeds=2, per_cap=3)
    late = first_merge_times(5.0, seeds=2, per_cap=3)
    assert np.isfinite(early).all() and np.isfinite(late).all()
    assert np.all(late > 2 * early)
    capped = first_merge_times(8.0, seeds=1, per_cap=2, t_cap=5.0)
    assert np.isinf(capped).all()
    with pytest.raises(UserError):
        cap_centres(5, 2)


def test_the_fit_approaches_the_predicted_slope():
    """log T is convex in beta (the -log beta term fades): the local slope between
    beta = 6 and 8 is already within 25 % of s = 1, the global fit lower."""
    result = metastability([4.0, 6.0, 8.0], seeds=1, per_cap=2)
    median = result.median_times
    local = np.log(median[2] / median[1]) / 2.0
    assert 0.75 < local < 1.05, median
    assert result.slope < local + 1e-9 and result.slope_corrected > result.slope
    assert result.predicted_slope == 1.0
    assert result.to_dict()["median_time"][0] == pytest.approx(median[0])
