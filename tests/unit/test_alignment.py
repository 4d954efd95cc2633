"""analysis/alignment.py against closed forms: a planted orthogonal map is recovered."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfield.analysis.alignment import (
    fit_alignment,
    match_times,
    pad_features,
    shared_rows,
    unit_rows,
)


def _orthogonal(rng: np.random.Generator, d: int, *, reflect: bool) -> np.ndarray:
    """A random orthogonal matrix with det +1 (a rotation) or -1 (rotation + reflection)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    if (np.linalg.det(q) < 0) != reflect:
        q[:, 0] = -q[:, 0]
    return q


def test_a_planted_rotation_and_reflection_is_recovered() -> None:
    rng = np.random.default_rng(0)
    n_time, n, d = 3, 20, 6
    planted = np.stack([_orthogonal(rng, d, reflect=t != 1) for t in range(n_time)])
    assert [round(np.linalg.det(q)) for q in planted] == [-1, 1, -1]
    source = rng.standard_normal((n_time, n, d))
    target = np.einsum("tnd,tde->tne", source, planted)

    alignment = fit_alignment(source, target)

    np.testing.assert_allclose(alignment.rotations, planted, atol=1e-10)
    np.testing.assert_allclose(alignment.apply(source), target, atol=1e-10)


def test_the_fit_is_the_least_squares_orthogonal_map() -> None:
    # noisy target: the fit equals the closed form U V^T of svd(A^T B), and beats the plant
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 30, 4))
    planted = _orthogonal(rng, 4, reflect=True)
    b = a @ planted + 0.3 * rng.standard_normal((1, 30, 4))
    u, _, vt = np.linalg.svd(a[0].T @ b[0])
    fitted = fit_alignment(a, b)
    np.testing.assert_allclose(fitted.rotations[0], u @ vt, atol=1e-10)
    r = fitted.rotations[0]
    np.testing.assert_allclose(r.T @ r, np.eye(4), atol=1e-12)
    assert np.linalg.norm(a[0] @ r - b[0]) <= np.linalg.norm(a[0] @ planted - b[0])


def test_narrower_source_is_padded_and_wider_target_kept() -> None:
    # source in 3 dims; the target is the source embedded in 5 dims and rotated there
    rng = np.random.default_rng(2)
    source = rng.standard_normal((2, 12, 3))
    planted = _orthogonal(rng, 5, reflect=True)
    target = pad_features(source, 5) @ planted
    alignment = fit_alignment(source, target)
    assert alignment.rotations.shape == (2, 5, 5)
    np.testing.assert_allclose(alignment.apply(source), target, atol=1e-10)


def test_wider_source_is_cut_back_to_the_target_width() -> None:
    # the source is a rotated copy of the (zero-padded) 3-dim target living in 5 dims
    rng = np.random.default_rng(3)
    target = rng.standard_normal((2, 12, 3))
    planted = _orthogonal(rng, 5, reflect=False)
    source = pad_features(target, 5) @ planted.T
    mapped = fit_alignment(source, target).apply(source)
    assert mapped.shape == target.shape
    np.testing.assert_allclose(mapped, target, atol=1e-10)


def test_sphere_fits_the_directions_only() -> None:
    rng = np.random.default_rng(4)
    source = rng.standard_normal((1, 15, 4))
    planted = _orthogonal(rng, 4, reflect=True)
    scales = rng.uniform(0.5, 40.0, size=(1, 15, 1))  # norms the sphere frame ignores
    target = (source @ planted) * scales
    alignment = fit_alignment(source, target, sphere=True)
    np.testing.assert_allclose(alignment.rotations[0], planted, atol=1e-10)
    np.testing.assert_allclose(alignment.apply(source), unit_rows(target), atol=1e-10)


def test_match_times_by_relative_depth() -> None:
    assert match_times(4, 4).tolist() == [0, 1, 2, 3]
    assert match_times(5, 9).tolist() == [0, 2, 4, 6, 8]  # a deeper source: every other step
    assert match_times(3, 5).tolist() == [0, 2, 4]
    assert match_times(5, 3).tolist() == [0, 1, 1, 2, 2]  # round half up: 0.5 -> 1, 1.5 -> 2
    assert match_times(1, 7).tolist() == [0]


def test_shared_rows_pairs_by_key() -> None:
    assert shared_rows(["b", "x", "a"], ["a", "b", "c"]) == [(0, 1), (2, 0)]
    assert shared_rows(["q"], ["a"]) == []


def test_unpaired_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="same"):
        fit_alignment(np.zeros((2, 3, 4)), np.zeros((2, 4, 4)))
