"""The batched Lanczos ``|lambda_2|`` of the symmetrised chains equals dense ``eigvalsh``;
its batched Ritz check (``_ritz_batched``) equals LAPACK's ``dstemr``, one at a time."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tokenfield.models import _lanczos_cpu as compiled
from tokenfield.models import _omp, attention
from tokenfield.models.attention import (
    LANCZOS_FROM,
    _chain_spectrum,
    _lanczos_lambda2,
    _lanczos_rounds,
    reduce_attention_batch,
)
from tokenfield.models.markov import summarize_attention

TOL = 1e-9  # the promise of LANCZOS_TOL (measured: about 1e-13)
# float32 work arrays (the CPU's, REDUCE_DTYPE): the rounding of S and of the products,
# with LANCZOS_TOL_FLOAT32 (measured on SmolLM2's chains against the float64 reference:
# at most 5.2e-7)
TOL_FLOAT32 = 2e-6
PRECISIONS = [(torch.float64, TOL), (torch.float32, TOL_FLOAT32)]
# the adaptive schedule (the CPU's batched solver) and the fixed rounds (a GPU's)
SOLVERS = [
    pytest.param(_lanczos_lambda2, id="adaptive"),
    pytest.param(lambda s, top, valid: _lanczos_rounds(s, top, valid), id="rounds"),
]


def causal_attention(n: int, rng: np.random.Generator, heads: int = 1) -> np.ndarray:
    """``(heads, n, n)`` random causal softmax attention, some of it on the sink."""
    logits = rng.normal(size=(heads, n, n)) * 3
    logits[..., 0] += rng.uniform(0, 4, size=(heads, 1))  # sink-heavy heads
    logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return a / a.sum(-1, keepdims=True)


def symmetrised(a: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``S = D^-1/2 (a + a^T) D^-1/2`` of one ``(n, n)`` chain and its top eigenvector."""
    w = a + a.T
    degree = w.sum(1)
    s = w / np.sqrt(degree)[:, None] / np.sqrt(degree)[None, :]
    return torch.from_numpy(s), torch.from_numpy(np.sqrt(degree / degree.sum()))


def dense(a: np.ndarray) -> float:
    """``|lambda_2|`` of the symmetrised chain of ``a`` by dense ``eigvalsh``."""
    s, _top = symmetrised(a)
    values = np.linalg.eigvalsh(s.numpy())
    return min(1.0, max(abs(values[0]), abs(values[-2])))


def padded(chains: list[np.ndarray], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, 1, width, width)`` float64 with each chain in its top-left corner, and the
    ``(rows, 1, width)`` valid mask."""
    a = torch.zeros((len(chains), 1, width, width), dtype=torch.float64)
    valid = torch.zeros((len(chains), 1, width), dtype=torch.float64)
    for row, chain in enumerate(chains):
        n = chain.shape[0]
        a[row, 0, :n, :n] = torch.from_numpy(chain)
        valid[row, 0, :n] = 1.0
    return a, valid


@pytest.mark.parametrize(("dtype", "tol"), PRECISIONS)
def test_lanczos_equals_dense_on_padded_causal_chains(monkeypatch, dtype, tol):
    """Padded rows, a chain of 3 tokens and one of 2 (the Krylov space spent at once:
    in float32 a breakdown among rounding noise) included. The batched torch Lanczos
    in both precisions (float32: where numba is missing)."""
    monkeypatch.setattr(attention, "_compiled", lambda: None)
    rng = np.random.default_rng(0)
    width = LANCZOS_FROM + 40
    lengths = (width, width - 7, LANCZOS_FROM, 60, 3, 2)
    chains = [causal_attention(n, rng)[0] for n in lengths]
    calls = []
    solve = attention._lanczos_lambda2
    monkeypatch.setattr(
        attention, "_lanczos_lambda2", lambda *a, **k: calls.append(1) or solve(*a, **k)
    )
    a, valid = padded(chains, width)
    lam, _pi = _chain_spectrum(a.to(dtype), valid.to(dtype))
    assert calls  # the Lanczos path, not the dense one
    assert lam.dtype == torch.float64
    expected = [dense(chain) for chain in chains]
    np.testing.assert_allclose(lam[:, 0].numpy(), expected, rtol=0, atol=tol)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(("dtype", "tol"), PRECISIONS)
def test_a_disconnected_chain_has_lambda2_one(dtype, tol, solver):
    rng = np.random.default_rng(1)
    n, cut = LANCZOS_FROM + 20, 70
    a = np.zeros((n, n))
    a[:cut, :cut] = causal_attention(cut, rng)[0]  # two blocks that never read each other
    a[cut:, cut:] = causal_attention(n - cut, rng)[0]
    s, top = symmetrised(a)
    got = solver(s[None].to(dtype), top[None].to(dtype), torch.ones((1, n), dtype=dtype))
    assert dense(a) == pytest.approx(1.0, abs=1e-12)
    assert float(got[0]) == pytest.approx(1.0, abs=tol)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(("dtype", "tol"), PRECISIONS)
def test_the_most_negative_eigenvalue_wins_on_a_bipartite_like_chain(dtype, tol, solver):
    rng = np.random.default_rng(2)
    n = LANCZOS_FROM + 20
    i = np.arange(n)
    # every token reads the earlier tokens of the other parity, and a little of its own
    weight = np.where((i[:, None] + i[None, :]) % 2 == 1, 1.0, 0.02) * rng.uniform(size=(n, n))
    a = np.tril(weight)
    a /= a.sum(1, keepdims=True)
    s, top = symmetrised(a)
    values = np.linalg.eigvalsh(s.numpy())
    assert abs(values[0]) > abs(values[-2]) + 0.1  # the negative end wins by far
    got = solver(s[None].to(dtype), top[None].to(dtype), torch.ones((1, n), dtype=dtype))
    assert float(got[0]) == pytest.approx(abs(values[0]), abs=tol)


def test_matrices_lanczos_does_not_certify_are_solved_densely(monkeypatch):
    rng = np.random.default_rng(3)
    n = LANCZOS_FROM + 10
    pairs = [symmetrised(a) for a in causal_attention(n, rng, heads=4)]
    s = torch.stack([p[0] for p in pairs])
    top = torch.stack([p[1] for p in pairs])
    solved = []
    eigvalsh = torch.linalg.eigvalsh
    monkeypatch.setattr(
        torch.linalg, "eigvalsh", lambda x: solved.append(x.shape[0]) or eigvalsh(x)
    )
    got = _lanczos_lambda2(s.clone(), top, torch.ones((4, n), dtype=torch.float64), steps=3)
    assert solved == [4]  # three steps certify nothing: all four fall back
    values = eigvalsh(s)
    expected = torch.maximum(values[:, 0].abs(), values[:, -2].abs())
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-12)


def test_the_numbers_do_not_depend_on_the_global_random_state():
    rng = np.random.default_rng(4)
    a, valid = padded(list(causal_attention(LANCZOS_FROM + 5, rng, heads=3)), LANCZOS_FROM + 5)
    torch.manual_seed(1)
    first, _ = _chain_spectrum(a, valid)
    torch.manual_seed(2)
    torch.randn(10)
    second, _ = _chain_spectrum(a, valid)
    assert torch.equal(first, second)


@pytest.mark.parametrize(("dtype", "tol"), PRECISIONS)
def test_the_batched_reduction_above_the_crossover_equals_the_reference(monkeypatch, dtype, tol):
    """On the CPU's own work-array precision (float32) and in float64."""
    monkeypatch.setitem(attention.REDUCE_DTYPE, "cpu", dtype)
    rng = np.random.default_rng(5)
    lengths = [LANCZOS_FROM + 30, LANCZOS_FROM + 1, 40]
    width = max(lengths)
    weights = np.zeros((len(lengths), 2, width, width), dtype=np.float32)
    spans = []
    for row, n in enumerate(lengths):
        weights[row, :, width - n :, width - n :] = causal_attention(n, rng, heads=2)
        spans.append((width - n, n))
    got = reduce_attention_batch(torch.from_numpy(weights), spans, causal=True)
    for row, (offset, n) in enumerate(spans):
        cut = weights[row, :, offset : offset + n, offset : offset + n]
        expected = summarize_attention(cut, causal=True)
        for name in ("lambda2", "lambda2_nosink"):
            np.testing.assert_allclose(
                got[name][row].numpy(), getattr(expected, name), rtol=0, atol=tol, err_msg=name
            )


RITZ_CHECKS = {
    "dstemr": attention._ritz_dstemr,
    "recurrence": lambda alpha, beta, **k: attention._ritz_batched(alpha, beta, tree=False, **k),
    "tree": lambda alpha, beta, **k: attention._ritz_batched(alpha, beta, tree=True, **k),
}


@pytest.mark.parametrize("check", RITZ_CHECKS)
def test_the_ritz_check_bounds_both_ends_and_stops_at_a_breakdown(check):
    rng = np.random.default_rng(6)
    k = 30
    alpha = rng.normal(size=(3, k)) * 0.3
    beta = rng.uniform(0.05, 0.5, size=(3, k))
    alpha[1, 0] = -5.0  # row 1: a far lower end, its eigenvector's last entry tiny
    beta[2, 11] = 0.0  # row 2: a breakdown after step 12
    value, residual = RITZ_CHECKS[check](torch.from_numpy(alpha), torch.from_numpy(beta))
    for row in range(3):
        size = 12 if row == 2 else k
        t = np.diag(alpha[row, :size])
        t += np.diag(beta[row, : size - 1], 1) + np.diag(beta[row, : size - 1], -1)
        theta, y = np.linalg.eigh(t)
        assert float(value[row]) == pytest.approx(max(abs(theta[0]), abs(theta[-1])), abs=1e-12)
        bound = 0.0 if row == 2 else beta[row, -1] * max(abs(y[-1, 0]), abs(y[-1, -1]))
        assert residual[row] == pytest.approx(bound, rel=1e-6, abs=1e-300)


# the batched Ritz check (_ritz_batched) against dstemr, one matrix at a time: the values
# are in [0, 1]; bounds below 1e-8 are compared absolutely, to 1e-12 (a bound only decides
# against LANCZOS_TOL = 1e-7 or more): on the 2-core CI machine the compiled check was
# within 1e-14, on an H200 machine's host (numba there) 6.9e-13 where dstemr's bound of a
# glued tridiagonal was 3e-21
VALUE_TOL, BOUND_RTOL, BOUND_ATOL, TINY_BOUND = 1e-13, 1e-6, 1e-12, 1e-8


@pytest.fixture(scope="module")
def lanczos_rows() -> tuple[np.ndarray, np.ndarray]:
    """``alpha`` and ``beta`` ``(28, 100)`` of the Lanczos runs (:func:`_lanczos_group`)
    on attention-like chains of 128 and 192 tokens, never done (``tol`` 1e-300): the last
    check's tridiagonals, whose leading blocks are the earlier checks' ``T_k``."""
    rng = np.random.default_rng(7)
    seen = []
    check = attention._ritz_extremes

    def spy(alpha, beta, **k):
        seen.append((alpha.numpy().copy(), beta.numpy().copy()))
        return check(alpha, beta, **k)

    attention._ritz_extremes = spy
    try:
        for n, heads in ((128, 16), (192, 12)):
            pairs = [symmetrised(a) for a in causal_attention(n, rng, heads=heads)]
            s = torch.stack([pair[0] for pair in pairs])
            top = torch.stack([pair[1] for pair in pairs])
            ones = torch.ones((heads, n), dtype=torch.float64)
            _lanczos_lambda2(s, top, ones, tol=1e-300, steps=100)
    finally:
        attention._ritz_extremes = check
    last = [(alpha, beta) for alpha, beta in seen if alpha.shape[1] == 100]
    return np.concatenate([a for a, _ in last]), np.concatenate([b for _, b in last])


def with_spectrum(values: np.ndarray, coupling: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """A tridiagonal with eigenvalues ``values`` (Lanczos on ``diag(values)`` to the
    end, reorthogonalised twice) and last coupling ``coupling``."""
    q = rng.normal(size=len(values))
    basis = [q / np.linalg.norm(q)]
    alpha, beta = [], []
    for _ in range(len(values)):
        w = values * basis[-1]
        alpha.append(basis[-1] @ w)
        for _ in range(2):
            w -= np.array(basis).T @ (np.array(basis) @ w)
        beta.append(np.linalg.norm(w))
        basis.append(w / beta[-1])
    beta[-1] = coupling
    return np.array(alpha), np.array(beta)


def hard_tridiagonals() -> list[tuple[str, bool, np.ndarray, np.ndarray]]:
    """``(name, clustered, alpha, beta)``: random tridiagonals of sizes 1 to 100, with
    breakdowns, tiny couplings and entries not finite, and ones with clustered or
    repeated extreme eigenvalues."""
    rng = np.random.default_rng(8)
    cases = []

    def random(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        alpha = rng.normal(size=(n, k)) * rng.uniform(0.05, 1.0, size=(n, 1))
        beta = rng.uniform(0.01, 1.0, size=(n, k)) * rng.uniform(0.05, 1.0, size=(n, 1))
        return alpha, beta

    for k in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 100):
        cases.append((f"random k={k}", False, *random(12, k)))
    alpha, beta = random(24, 50)
    cut = rng.integers(0, 50, size=24)
    beta[np.arange(24), cut] = np.tile([0.0, 1e-13, np.nan, np.inf, -1.0, 0.0], 4)
    beta[0, :] = 0.0  # size 1
    cases.append(("breakdowns", False, alpha, beta))
    alpha, beta = random(24, 40)
    tiny = rng.uniform(size=beta.shape) < 0.1
    beta[tiny] = 10.0 ** rng.uniform(-11.9, -6, size=tiny.sum())
    cases.append(("tiny couplings", False, alpha, beta))
    alpha, beta = random(8, 30)
    alpha[0, 3], alpha[1, 0], alpha[2, 29], alpha[3, :] = np.nan, np.inf, -np.inf, 0.0
    cases.append(("alpha not finite", False, alpha, beta))
    for gap in (1e-2, 1e-4, 1e-7, 1e-10, 0.0):  # pairs and triples at both ends
        rows = []
        for i in range(9):
            values = np.sort(rng.uniform(-0.8, 0.8, size=int(rng.integers(4, 100))))
            values[:2] = -0.9, -0.9 + gap
            values[-2:] = 0.95 - gap, 0.95
            if i % 3 == 0:
                values[2] = -0.9 + 2 * gap
            rows.append(with_spectrum(values, rng.uniform(0.01, 0.5), rng))
        for alpha, beta in rows:  # one matrix a case: the sizes differ
            cases.append((f"cluster {gap:.0e}", True, alpha[None], beta[None]))
    for glue in (1e-3, 1e-6, 1e-11):  # two copies of a block: repeated extremes
        alpha, beta = random(8, 20)
        glued = np.full((8, 1), glue)
        beta = np.concatenate([beta[:, :-1], glued, beta[:, :-1][:, ::-1], beta[:, -1:]], 1)
        cases.append((f"glued {glue:.0e}", True, np.concatenate([alpha, alpha[:, ::-1]], 1), beta))
    return cases


def batched_and_redone(alpha, beta, tree, monkeypatch, **options):
    """:func:`_ritz_batched` of ``alpha``, ``beta`` (and ``options``), and how many
    matrices it passed to dstemr."""
    redone = []
    dstemr = attention._ritz_dstemr
    monkeypatch.setattr(
        attention, "_ritz_dstemr", lambda a, b: redone.append(len(a)) or dstemr(a, b)
    )
    out = attention._ritz_batched(
        torch.as_tensor(alpha), torch.as_tensor(beta), tree=tree, **options
    )
    monkeypatch.setattr(attention, "_ritz_dstemr", dstemr)
    return out, sum(redone)


def assert_ritz_close(got, expected, label=""):
    (value, residual), (value0, residual0) = got, expected
    np.testing.assert_allclose(value, value0, rtol=0, atol=VALUE_TOL, err_msg=label)
    tiny = residual0 < TINY_BOUND
    np.testing.assert_allclose(
        residual[~tiny], residual0[~tiny], rtol=BOUND_RTOL, atol=0, err_msg=label
    )
    np.testing.assert_allclose(
        residual[tiny], residual0[tiny], rtol=0, atol=BOUND_ATOL, err_msg=label
    )


@pytest.mark.parametrize("tree", [False, True], ids=["recurrence", "tree"])
def test_the_batched_ritz_check_equals_dstemr_on_lanczos_tridiagonals(
    lanczos_rows, tree, monkeypatch
):
    alpha, beta = lanczos_rows
    redone = 0
    for k in (1, 2, 5, 20, 24, 33, 40, 64, 100):
        a, b = torch.from_numpy(alpha[:, :k].copy()), torch.from_numpy(beta[:, :k].copy())
        got, count = batched_and_redone(a, b, tree, monkeypatch)
        assert_ritz_close(got, attention._ritz_dstemr(a, b), f"k={k}")
        redone += count
    assert redone <= 0.02 * 9 * len(alpha)  # the batched path did the work


@pytest.mark.parametrize("tree", [False, True], ids=["recurrence", "tree"])
def test_the_batched_ritz_check_equals_dstemr_on_hard_tridiagonals(tree, monkeypatch):
    redone = 0
    for name, clustered, alpha, beta in hard_tridiagonals():
        a, b = torch.from_numpy(alpha), torch.from_numpy(beta)
        got, count = batched_and_redone(a, b, tree, monkeypatch)
        assert_ritz_close(got, attention._ritz_dstemr(a, b), name)
        redone += 0 if clustered else count
    assert redone <= 10  # of 200 not clustered: the gap check's few


def test_the_cuda_graphs_padding_changes_nothing():
    # the graphs' parts run eagerly on the CPU: matrices and rows padded, buffers reused
    rng = np.random.default_rng(9)
    graphs = attention._RitzGraphs(64, 128, torch.device("cpu"))
    for n, k in ((50, 37), (3, 100), (64, 1), (20, 2)):
        alpha = rng.normal(size=(n, k)) * 0.3
        beta = rng.uniform(0.05, 0.5, size=(n, k))
        beta[0, k // 2] = 0.0
        a, b = torch.from_numpy(alpha), torch.from_numpy(beta)
        state = attention._RitzState(a, b[:, :-1], b[:, -1], k, True)
        for _ in range(attention._RITZ_FIRST_STOP, attention._RITZ_PASSES):
            state.step()
        expected = state.finish()
        got = graphs(a, b)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got[:2], expected[:2], rtol=1e-12, atol=1e-14)
        assert torch.equal(got[2], expected[2])
        np.testing.assert_allclose(got[3], expected[3], rtol=1e-8)  # the gap to the next root


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_lanczos_gives_the_same_with_the_batched_ritz_check(device, monkeypatch):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA graphs are tested where one exists")
    rng = np.random.default_rng(10)
    width = LANCZOS_FROM + 20
    a, valid = padded([causal_attention(n, rng)[0] for n in (width, width - 9, 70)], width)
    a = a.expand(-1, 4, -1, -1).clone()  # 4 heads of each: 12 chains a call
    valid = valid.expand(-1, 4, -1).clone()
    a, valid = a.to(device), valid.to(device)
    results = {}
    for name, first, check in (
        ("off", 10**9, attention._ritz_extremes),
        ("on", 0, attention._ritz_extremes),
        ("tree", 10**9, RITZ_CHECKS["tree"]),
    ):
        monkeypatch.setattr(attention, "RITZ_BATCHED_FROM", first)
        monkeypatch.setattr(attention, "RITZ_BATCHED_FROM_CUDA", first)
        monkeypatch.setattr(attention, "_ritz_extremes", check)
        results[name] = _chain_spectrum(a, valid)[0].cpu().numpy()
    np.testing.assert_allclose(results["on"], results["off"], rtol=0, atol=1e-13)
    np.testing.assert_allclose(results["tree"], results["off"], rtol=0, atol=1e-13)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_the_cuda_graphs_equal_dstemr(lanczos_rows, monkeypatch):
    alpha, beta = lanczos_rows
    cases = [(f"lanczos k={k}", alpha[:, :k], beta[:, :k]) for k in (20, 40, 100)]
    cases += [(name, a, b) for name, clustered, a, b in hard_tridiagonals() if not clustered]
    for name, a, b in cases:
        a, b = torch.from_numpy(a.copy()).cuda(), torch.from_numpy(b.copy()).cuda()
        with torch.inference_mode():  # the graphs made here serve outside it as well
            inside = attention._ritz_batched(a, b)
        assert_ritz_close(attention._ritz_batched(a, b), attention._ritz_dstemr(a, b), name)
        assert_ritz_close(inside, attention._ritz_dstemr(a, b), name)


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_chain_with_nothing_but_its_top_vector_has_lambda2_zero(solver):
    n = LANCZOS_FROM
    s = torch.zeros((1, n, n), dtype=torch.float64)
    s[0, 5, 5] = 1.0  # one valid token with a self-loop: S = [1] on it, zero elsewhere
    top = torch.zeros((1, n), dtype=torch.float64)
    top[0, 5] = 1.0
    valid = top.clone()
    assert float(solver(s, top, valid)[0]) == 0.0


# The compiled CPU Lanczos (models/_lanczos_cpu.py): float32 chains, one at a time.


def compiled_ritz(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_lanczos_cpu.ritz_check` of each row (no breakdown inside), as
    :func:`_ritz_dstemr` returns it: values and residual bounds ``beta_k |y_k|``."""
    plus, minus = np.empty(alpha.shape[1]), np.empty(alpha.shape[1])
    checks = [
        compiled.ritz_check(a, b, len(a), plus, minus) for a, b in zip(alpha, beta, strict=True)
    ]
    value = np.array([value for value, _ends in checks])
    return value, beta[:, -1] * np.array([ends for _value, ends in checks])


def test_the_compiled_ritz_check_equals_dstemr(lanczos_rows):
    alpha, beta = lanczos_rows
    for k in (1, 2, 5, 20, 24, 33, 40, 64, 100):
        a, b = alpha[:, :k].copy(), beta[:, :k].copy()
        expected = attention._ritz_dstemr(torch.from_numpy(a), torch.from_numpy(b))
        assert_ritz_close(compiled_ritz(a, b), (expected[0].numpy(), expected[1]), f"k={k}")
    for name, clustered, a, b in hard_tridiagonals():
        if name in ("breakdowns", "alpha not finite"):  # the Lanczos stops before those
            continue
        if clustered:  # eigh's own vectors (a cluster's are not unique; dstemr picks others)
            expected = dense_ritz(a, b)
        else:
            value, bound = attention._ritz_dstemr(torch.from_numpy(a), torch.from_numpy(b))
            expected = (value.numpy(), bound)
        assert_ritz_close(compiled_ritz(a, b), expected, name)


def dense_ritz(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and residual bounds of each row's ``T_k`` by ``numpy.linalg.eigh``."""
    values, bounds = [], []
    for a, b in zip(alpha, beta, strict=True):
        theta, y = np.linalg.eigh(np.diag(a) + np.diag(b[:-1], 1) + np.diag(b[:-1], -1))
        values.append(max(abs(theta[0]), abs(theta[-1])))
        bounds.append(b[-1] * max(abs(y[-1, 0]), abs(y[-1, -1])))
    return np.array(values), np.array(bounds)


def compiled_calls(monkeypatch) -> list[int]:
    """Count the compiled kernel's calls (chains per call)."""
    calls: list[int] = []
    kernel = attention._compiled()
    assert kernel is not None  # numba is a dependency

    def chain_lambda2(a, *args):
        calls.append(a.shape[0])
        return kernel.chain_lambda2(a, *args)

    monkeypatch.setattr(
        attention, "_compiled", lambda: SimpleNamespace(chain_lambda2=chain_lambda2)
    )
    return calls


def test_the_compiled_lanczos_equals_dense(monkeypatch):
    """Padded causal chains, chains of 3 and 2 tokens, a chain that is not lower
    triangular (read whole), a disconnected one (``|lambda_2| = 1``) and one whose
    negative end wins: float32 chains, the compiled path, within float32's rounding."""
    calls = compiled_calls(monkeypatch)
    rng = np.random.default_rng(9)
    width = attention.COMPILED_FROM + 90
    chains = [causal_attention(n, rng)[0] for n in (width, width - 9, 60, 3, 2)]
    full = np.exp(rng.normal(size=(width, width)) * 2)
    chains.append(full / full.sum(1, keepdims=True))
    split = np.zeros((width, width))
    split[:50, :50] = causal_attention(50, rng)[0]  # two blocks that never read each other
    split[50:, 50:] = causal_attention(width - 50, rng)[0]
    chains.append(split)
    i = np.arange(width)
    weight = np.where((i[:, None] + i[None, :]) % 2 == 1, 1.0, 0.02) * rng.uniform(
        size=(width, width)
    )
    chains.append(np.tril(weight) / np.tril(weight).sum(1, keepdims=True))
    a, valid = padded(chains, width)
    lam, pi = _chain_spectrum(a.float(), valid.float())
    assert calls == [len(chains)]
    expected = [dense(chain) for chain in chains]
    assert expected[-2] == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(lam[:, 0].numpy(), expected, rtol=0, atol=TOL_FLOAT32)
    _lam, pi64 = _chain_spectrum(a, valid)  # float64: the torch path
    np.testing.assert_allclose(pi.numpy(), pi64.numpy(), rtol=0, atol=1e-7)


def test_chains_the_compiled_lanczos_does_not_certify_are_solved_densely(monkeypatch):
    calls = compiled_calls(monkeypatch)
    monkeypatch.setattr(attention, "COMPILED_STEPS", 3)  # three steps certify nothing
    rng = np.random.default_rng(10)
    n = attention.COMPILED_FROM + 30
    chains = list(causal_attention(n, rng, heads=4))
    a, valid = padded(chains, n)
    solved = []
    eigvalsh = torch.linalg.eigvalsh
    monkeypatch.setattr(
        torch.linalg, "eigvalsh", lambda x: solved.append(x.shape[0]) or eigvalsh(x)
    )
    lam, _pi = _chain_spectrum(a.float(), valid.float())
    assert calls == [4] and solved == [4]
    expected = [dense(chain) for chain in chains]
    np.testing.assert_allclose(lam[:, 0].numpy(), expected, rtol=0, atol=TOL_FLOAT32)


def sink_free_dense(a: np.ndarray) -> float:
    """``|lambda_2|`` of ``a`` without the sink (the reference's ``without_sink``)."""
    from tokenfield.models.markov import without_sink

    return dense(without_sink(a))


def compiled_chains(
    chains: np.ndarray, masks: np.ndarray, skip: int, temple: float = 1e-6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lam, pi, taken)`` of the compiled kernel, ``(count, chains)`` etc."""
    count, m = chains.shape[0], chains.shape[-1]
    width = 2 if skip == 2 else 1
    lam, taken = np.empty((count, width)), np.empty((count, width), np.int64)
    pi = np.empty((count, width, m), np.float32)
    start = attention._start_vector(m, torch.device("cpu")).float().numpy()
    compiled.chain_lambda2(chains, masks, skip, start, 1e-5, temple, 250, 16, 1e-5, lam, pi, taken)
    return lam, pi, taken


def test_both_chains_in_lockstep_equal_each_chain_alone_and_dense():
    """``skip = 2`` (both chains of a matrix, one pass over it a step for both products)
    against ``skip = 0`` and ``skip = 1`` apart: causal chains (padded, one whose sink
    holds every row, so that the sink-free chain is all self-loops) and one that is not
    lower triangular (two products apart). Same steps and the same numbers up to
    float32's rounding, both equal to dense ``eigvalsh``."""
    rng = np.random.default_rng(21)
    width = attention.COMPILED_FROM + 61  # not a multiple of 4: the products' last rows alone
    chains = [causal_attention(n, rng)[0] for n in (width, width - 11, 50)]
    sink = np.zeros((width, width))
    sink[:, 0] = 1.0
    chains.append(sink)
    full = np.exp(rng.normal(size=(width, width)) * 2)
    chains.append(full / full.sum(1, keepdims=True))
    a, valid = padded(chains, width)
    a, valid = a[:, 0].float().contiguous().numpy(), valid[:, 0].float().contiguous().numpy()
    rest = valid.copy()
    rest[:, 0] = 0.0
    both = compiled_chains(a, valid, 2)
    alone = [compiled_chains(a, valid, 0), compiled_chains(a, rest, 1)]
    for j in range(2):
        np.testing.assert_allclose(both[0][:, j], alone[j][0][:, 0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(both[1][:, j], alone[j][1][:, 0], rtol=0, atol=1e-7)
        assert (np.abs(both[2][:, j] - alone[j][2][:, 0]) <= 2).all()  # rounding moves a check
    expected = np.array([[dense(c), sink_free_dense(c)] for c in chains])
    np.testing.assert_allclose(both[0], expected, rtol=0, atol=TOL_FLOAT32)
    assert both[0][3, 1] == 1.0 or abs(both[0][3, 1] - expected[3, 1]) < TOL_FLOAT32


def test_the_compiled_ritz_ends_give_the_neighbour_of_the_answer(lanczos_rows):
    """:func:`_lanczos_cpu.ritz_ends`: both ends, their last components, and the
    eigenvalue next to the end of larger modulus with its last component, against
    ``numpy.linalg.eigh`` of ``T_k``."""
    alpha, beta = lanczos_rows
    out, plus, minus = np.empty(6), np.empty(alpha.shape[1]), np.empty(alpha.shape[1])
    checked = 0
    for k in (2, 5, 24, 40):
        for a, b in zip(alpha[:, :k], beta[:, :k], strict=True):
            compiled.ritz_ends(a, b, k, plus, minus, out)
            theta, y = np.linalg.eigh(np.diag(a) + np.diag(b[:-1], 1) + np.diag(b[:-1], -1))
            top = abs(theta[-1]) >= abs(theta[0])
            near = k - 2 if top else 1
            scale = max(abs(theta[0]), abs(theta[-1]))
            np.testing.assert_allclose(out[:2], theta[[0, -1]], rtol=0, atol=1e-12 * scale)
            np.testing.assert_allclose(out[4], theta[near], rtol=0, atol=1e-12 * scale)
            np.testing.assert_allclose(out[2:4], np.abs(y[-1, [0, -1]]), rtol=1e-6, atol=1e-13)
            if np.isfinite(out[5]):
                np.testing.assert_allclose(out[5], abs(y[-1, near]), rtol=1e-6, atol=1e-13)
                checked += 1
    assert checked > 100


def test_the_certificate_takes_temples_bound_and_an_end_that_cannot_win():
    """:func:`_lanczos_cpu._excess` (below 0: certified), ``tol`` 1e-5: ends ``-0.3``
    and ``0.9``, the neighbour of ``0.9`` at ``0.5``."""
    excess = compiled._excess

    def ends(y_low, y_high, y_near, near=0.5):
        return np.array([-0.3, 0.9, y_low, y_high, near, y_near])

    assert excess(ends(1e-6, 1e-6, 1e-3), 1.0, 1e-5, 1e-6) < 0  # both bounds below tol
    # the answer's bound 1e-4: not by the bound, but r^2 / delta = 1e-8 / 0.4 by Temple's
    assert excess(ends(1e-6, 1e-4, 1e-3), 1.0, 1e-5, 0.0) > 0
    assert excess(ends(1e-6, 1e-4, 1e-3), 1.0, 1e-5, 1e-6) < 0
    # the neighbour's own bound (0.45) leaves delta below 0: no Temple
    assert excess(ends(1e-6, 1e-4, 0.45), 1.0, 1e-5, 1e-6) > 0
    # delta 1e-7 (the neighbour's own bound 0): r^2 / delta = 0.1, far above 1e-6
    assert excess(ends(1e-6, 1e-4, 0.0, near=0.9 - 1e-7), 1.0, 1e-5, 1e-6) > 0
    # ... and with r = 1e-7 it is the residual bound that certifies
    assert excess(ends(1e-6, 1e-7, 0.0, near=0.9 - 1e-7), 1.0, 1e-5, 1e-6) < 0
    # the other end's bound below a tenth of its distance to the answer (0.6): done
    assert excess(ends(0.05, 1e-6, 1e-3), 1.0, 1e-5, 1e-6) < 0
    assert excess(ends(0.07, 1e-6, 1e-3), 1.0, 1e-5, 1e-6) > 0
    # the coupling beta_k scales every bound
    assert excess(ends(0.05, 1e-6, 1e-3), 2.0, 1e-5, 1e-6) > 0
    # the negative end gives the answer: its neighbour is the next one up
    negative = np.array([-0.9, 0.3, 1e-4, 0.05, -0.5, 1e-3])
    assert excess(negative, 1.0, 1e-5, 1e-6) < 0  # Temple: 1e-8 / 0.399 < 1e-6
    assert excess(negative, 1.0, 1e-5, 0.0) > 0  # its bound alone: 1e-4 > 1e-5
    near = negative.copy()
    near[4] = -0.9 + 1e-7  # a neighbour 1e-7 away: Temple gives nothing
    assert excess(near, 1.0, 1e-5, 1e-6) > 0


def test_temples_bound_saves_steps_and_keeps_the_numbers():
    """On random causal chains: fewer Lanczos steps with Temple's bound than with the
    residual bounds alone, and still within float32's rounding of dense ``eigvalsh``."""
    rng = np.random.default_rng(22)
    n = 200
    chains = causal_attention(n, rng, heads=12).astype(np.float32)
    masks = np.ones((12, n), np.float32)
    with_temple = compiled_chains(chains, masks, 2, temple=1e-6)
    bounds_only = compiled_chains(chains, masks, 2, temple=0.0)
    assert with_temple[2].sum() < bounds_only[2].sum()
    expected = np.array([[dense(c), sink_free_dense(c)] for c in chains.astype(np.float64)])
    for got in (with_temple, bounds_only):
        np.testing.assert_allclose(got[0], expected, rtol=0, atol=TOL_FLOAT32)


def test_both_chains_the_compiled_lanczos_does_not_certify_are_solved_densely(monkeypatch):
    """``_compiled_pair`` with too few steps to certify anything: each chain's matrices go
    to dense float64 ``eigvalsh``, the sink-free ones as the sink-free chain (token 0 out
    of their masks)."""
    monkeypatch.setattr(attention, "COMPILED_STEPS", 3)
    rng = np.random.default_rng(23)
    n = attention.COMPILED_FROM + 30
    chains = list(causal_attention(n, rng, heads=4))
    a, valid = padded(chains, n)
    kernel = attention._compiled()
    (lam, _pi), (lam_ns, _pi_ns) = attention._compiled_pair(kernel, a.float(), valid.float())
    np.testing.assert_allclose(lam[:, 0].numpy(), [dense(c) for c in chains], atol=TOL_FLOAT32)
    np.testing.assert_allclose(
        lam_ns[:, 0].numpy(), [sink_free_dense(c) for c in chains], atol=TOL_FLOAT32
    )


def test_normalised_weights_skip_only_what_changes_nothing():
    """``_reduce_padded(normalised=True)`` on rows that are a float32 softmax's (padded, zero
    outside each corner) gives what the clamp, mask and renormalisation give, to float32's
    rounding of the row sums; on weights that are not normalised it would not."""
    rng = np.random.default_rng(24)
    width = attention.COMPILED_FROM + 20
    chains = [causal_attention(n, rng, heads=3) for n in (width, width - 5)]
    a = torch.zeros((2, 3, width, width), dtype=torch.float32)
    for row, chain in enumerate(chains):
        k = chain.shape[-1]
        a[row, :, :k, :k] = torch.from_numpy(chain).float()
    lengths = torch.tensor([width, width - 5])
    full = attention._reduce_padded(a.clone(), lengths, True)
    quick = attention._reduce_padded(a.clone(), lengths, True, normalised=True)
    for name, value in full.items():
        torch.testing.assert_close(quick[name], value, atol=2e-6, rtol=0, equal_nan=True)
    doubled = attention._reduce_padded(a.clone() * 2, lengths, True, normalised=True)
    assert not torch.allclose(doubled["entropy"], full["entropy"], atol=1e-3)


def test_a_gpus_chains_solved_on_the_host_come_back_as_the_compiled_pair_gives_them(
    monkeypatch,
):
    """The switch that sends a GPU's short chains to the host's compiled Lanczos
    (:data:`HOST_CHAINS_UNTIL_CUDA`, off by default): only float32 CUDA weights from
    COMPILED_FROM tokens below the limit; on the host path the statistics are the compiled
    pair's (here on the CPU, where the copies change nothing; the GPU's own test is in
    tests/integration/test_cuda.py)."""

    class Weights:  # what _on_host reads of a tensor
        def __init__(self, kind: str, dtype: torch.dtype, m: int) -> None:
            self.device, self.dtype, self.shape = torch.device(kind), dtype, (2, 3, m, m)

    assert attention.HOST_CHAINS_UNTIL_CUDA == 0
    assert not attention._on_host(Weights("cuda", torch.float32, 64))  # off by default
    monkeypatch.setattr(attention, "HOST_CHAINS_UNTIL_CUDA", 128)
    assert attention._on_host(Weights("cuda", torch.float32, 64))
    assert not attention._on_host(Weights("cuda", torch.float32, 128))
    assert not attention._on_host(Weights("cuda", torch.float32, attention.COMPILED_FROM - 1))
    assert not attention._on_host(Weights("cuda", torch.float64, 64))
    assert not attention._on_host(Weights("cpu", torch.float32, 64))

    rng = np.random.default_rng(25)
    width = attention.COMPILED_FROM + 12
    a = torch.zeros((2, 3, width, width), dtype=torch.float32)
    for row, n in enumerate((width, width - 7)):
        a[row, :, :n, :n] = torch.from_numpy(causal_attention(n, rng, heads=3)).float()
    lengths = torch.tensor([width, width - 7])
    here = attention._reduce_padded(a.clone(), lengths, True)
    copied = []
    real = attention._compiled_pair

    def pair(kernel, weights, valid):
        copied.append(weights.device.type)
        return real(kernel, weights, valid)

    monkeypatch.setattr(attention, "_on_host", lambda weights: True)
    monkeypatch.setattr(attention, "_compiled_pair", pair)
    hosted = attention._reduce_padded(a.clone(), lengths, True)
    assert copied == ["cpu"]
    for name, value in here.items():
        torch.testing.assert_close(hosted[name], value, atol=0, rtol=0, equal_nan=True)


def test_the_compiled_logarithm_is_within_two_ulp():
    """Cephes' ``logf`` polynomial (:func:`_lanczos_cpu._log`) against float64 ``log``,
    from the smallest normal float32 to 1 and around its branch at ``sqrt(1/2)``."""
    x = np.concatenate(
        [
            np.logspace(-37.9, 0, 20001),
            np.linspace(0.70, 0.72, 2001),
            np.random.default_rng(11).uniform(1e-6, 1, 5000),
        ]
    ).astype(np.float32)
    mantissa, exponent = np.frexp(x)  # x = mantissa * 2^exponent, mantissa in [0.5, 1)
    got = np.array(
        [
            compiled._log(np.float32(f), np.float32(e))
            for f, e in zip(mantissa, exponent, strict=True)
        ]
    )
    exact = np.log(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / np.maximum(ulp, np.spacing(np.float32(0.5)))) <= 2.0


def test_the_compiled_row_entropy_equals_float64():
    """Causal rows (read to the diagonal), full rows, rows with zeros and subnormal
    entries, an all-zero row: ``-sum a log a`` within float32's rounding of the sums."""
    rng = np.random.default_rng(12)
    n = 200
    causal = causal_attention(n, rng, heads=3)
    full = np.exp(rng.normal(size=(2, n, n)) * 3)
    full /= full.sum(-1, keepdims=True)
    odd = causal_attention(n, rng, heads=1)
    odd[0, 5:, 1] = 1e-42  # subnormal float32
    odd[0, 7] = 0.0
    odd[0, 50, 120] = 0.25  # one entry above the diagonal: that row is read whole
    a = np.concatenate([causal, full, odd]).astype(np.float32)
    out = np.empty(a.shape[:2], dtype=np.float32)
    compiled.row_entropy(a, out)
    x = a.astype(np.float64)
    expected = -np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0).sum(-1)
    assert out[-1, 7] == 0.0
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL_FLOAT32)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def five_chains() -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(13)
    n = attention.COMPILED_FROM + 20
    a, valid = padded(list(causal_attention(n, rng, heads=5)), n)
    return a.reshape(5, 1, n, n).float(), valid.reshape(5, 1, n).float()


@pytest.mark.parametrize("skip", [0, 1, 2])
def test_the_chains_on_torchs_openmp_team_give_the_same_numbers(skip):
    """Two torch threads: the compiled Lanczos runs inside a parallel region of torch's
    own OpenMP runtime (``_omp.chains_in_team``), each thread on its run of the chains;
    the numbers are those of one call on one thread, bit for bit."""
    a, valid = five_chains()
    m = a.shape[-1]
    if skip == 1:  # 2: both chains, token 0 valid (dropped for the second)
        valid[..., 0] = 0.0
    torch.tensor([1.0]).exp()  # torch (and its OpenMP runtime) loaded and started
    if _omp._team() is None:
        pytest.skip("torch runs no libgomp here")
    chains, masks = a.reshape(5, m, m).numpy(), valid.reshape(5, m).numpy()
    start = attention._start_vector(m, torch.device("cpu")).float().numpy()
    args = (skip, start, 1e-5, 1e-6, 250, 16, 1e-5)
    width = 2 if skip == 2 else 1
    one = (
        np.empty((5, width)),
        np.empty((5, width, m), np.float32),
        np.empty((5, width), np.int64),
    )
    compiled.chain_lambda2(chains, masks, *args, *one)
    team = (
        np.full((5, width), np.nan),
        np.full((5, width, m), np.nan, np.float32),
        np.zeros((5, width), np.int64),
    )
    assert _omp.chains_in_team(2, chains, masks, *args, *team)
    for expected, got in zip(one, team, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert (team[2] > 0).all()
    with pytest.raises(ValueError, match="C-contiguous"):
        _omp.chains_in_team(2, chains.astype(np.float64), masks, *args, *team)


def test_the_spectrum_takes_the_team_with_two_threads(monkeypatch, two_threads):
    a, valid = five_chains()
    torch.tensor([1.0]).exp()
    if _omp._team() is None:
        pytest.skip("torch runs no libgomp here")
    teams: list[int] = []
    chains_in_team = _omp.chains_in_team

    def spy(threads, *args):
        teams.append(threads)
        return chains_in_team(threads, *args)

    monkeypatch.setattr(_omp, "chains_in_team", spy)
    calls = compiled_calls(monkeypatch)
    lam, pi = _chain_spectrum(a, valid)
    assert teams == [2] and calls == []  # not the pool: the team
    torch.set_num_threads(1)
    one = _chain_spectrum(a, valid)
    assert teams == [2] and calls == [5]  # one thread: one call, here
    assert torch.equal(lam, one[0]) and torch.equal(pi, one[1])


def test_the_chains_split_over_a_pool_without_torchs_openmp(monkeypatch, two_threads):
    """Two torch threads and no torch libgomp found: the compiled Lanczos runs on two
    runs of the chains at once on a pool's threads (``_in_threads``); the numbers are
    those of one thread, bit for bit."""
    a, valid = five_chains()
    monkeypatch.setattr(_omp, "chains_in_team", lambda *args: False)
    torch.set_num_threads(1)
    one = _chain_spectrum(a, valid)
    torch.set_num_threads(2)
    calls = compiled_calls(monkeypatch)
    lam, pi = _chain_spectrum(a, valid)
    assert sorted(calls) == [2, 3]  # 5 chains: runs of 3 and 2, one to a thread
    assert torch.equal(lam, one[0]) and torch.equal(pi, one[1])


# The fixed rounds of a GPU (_lanczos_rounds), run here on the CPU


def causal_stack(n: int, heads: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``S`` ``(heads, n, n)`` and their top vectors of random causal chains."""
    pairs = [symmetrised(a) for a in causal_attention(n, np.random.default_rng(seed), heads)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


@pytest.mark.parametrize(("dtype", "tol"), PRECISIONS)
def test_rounds_certify_fewer_matrices_each_round_and_equal_dense(monkeypatch, dtype, tol):
    """Short rounds: each matrix goes on until its round certifies it, the rest taking
    more steps (the Ritz checks see fewer matrices each round); every value is dense
    ``eigvalsh``'s, and ``s`` is left as it was."""
    n = LANCZOS_FROM + 10
    s, top = causal_stack(n, 12, seed=4)
    s, top = s.to(dtype), top.to(dtype)
    before = s.clone()
    sizes = []
    extremes = attention._ritz_extremes
    monkeypatch.setattr(
        attention, "_ritz_extremes", lambda a, b, **k: sizes.append(a.shape) or extremes(a, b, **k)
    )
    got = _lanczos_rounds(s, top, torch.ones((12, n), dtype=dtype), rounds=(6, 12, 24, 48))
    assert sizes[0] == (12, 6)
    assert [shape[1] for shape in sizes] == [6, 12, 24, 48, n - 1][: len(sizes)]
    counts = [shape[0] for shape in sizes]
    assert counts == sorted(counts, reverse=True) and counts[-1] < 12  # some done early
    values = torch.linalg.eigvalsh(s.double())
    expected = torch.maximum(values[:, 0].abs(), values[:, -2].abs())
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=tol)
    assert torch.equal(s, before)


@pytest.mark.parametrize(("dtype", "tol"), PRECISIONS)
def test_rounds_replayed_from_fixed_tensors_equal_the_rounds_as_they_are(monkeypatch, dtype, tol):
    """``_ROUNDS_GRAPHED`` (off by default; a CUDA graph on a GPU, the same steps on fixed
    tensors here): a round's matrices padded to the graph's count, a later call with
    other matrices reusing it (what an earlier call left in the padding changes nothing),
    the least recently used graph dropped past ``_ROUND_GRAPHS_KEPT``."""
    assert attention._ROUNDS_GRAPHED is False
    monkeypatch.setattr(attention, "_ROUND_GRAPH_STEP", 8)
    monkeypatch.setattr(attention, "_ROUND_GRAPHS", {})
    monkeypatch.setattr(attention, "_ROUNDS_SEEN", {})
    monkeypatch.setattr(attention, "_ROUND_GRAPH_AFTER", 1)  # made the first time
    n = LANCZOS_FROM + 10
    rounds = (6, 12, 24)
    inputs = []
    for seed, heads in ((7, 5), (8, 3)):
        s, top = causal_stack(n, heads, seed=seed)
        inputs.append((s.to(dtype), top.to(dtype), torch.ones((heads, n), dtype=dtype)))
    plain = [_lanczos_rounds(*x, rounds=rounds) for x in inputs]
    monkeypatch.setattr(attention, "_ROUNDS_GRAPHED", True)
    steps = attention._round_steps
    calls = []

    def counted(s, *args):
        calls.append(s.shape[0])
        return steps(s, *args)

    monkeypatch.setattr(attention, "_round_steps", counted)
    for x, expected in zip(inputs, plain, strict=True):
        got = _lanczos_rounds(*x, rounds=rounds)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=tol / 100)
    # every round ran on the graphs' 8 matrices, the second call on the first's graphs
    assert calls and set(calls) == {8}
    kept = attention._ROUND_GRAPHS
    assert {key[1:5] for key in kept} >= {(8, n, 0, 6)}
    assert len(kept) == len({key for key in kept})
    first = len(calls)
    _lanczos_rounds(*inputs[0], rounds=rounds)
    assert len(kept) == len({key[1:5] for key in kept})  # no graph made twice
    assert len(calls) - first <= len(kept)
    monkeypatch.setattr(attention, "_ROUND_GRAPHS_KEPT", 1)
    got = _lanczos_rounds(*inputs[1], rounds=(5,))  # new graphs: the others dropped
    assert len(kept) == 1 and next(iter(kept))[1:5] == (8, n, 5, n - 1)
    np.testing.assert_allclose(got.numpy(), plain[1].numpy(), rtol=0, atol=tol)
    # by default a round's graph is made the second time it is asked for: a width seen
    # once (prompts of many lengths) costs no capture
    monkeypatch.setattr(attention, "_ROUND_GRAPH_AFTER", 2)
    cpu = torch.device("cpu")
    assert attention._round_graph(5, n, 0, 7, dtype, cpu) is None
    made = attention._round_graph(5, n, 0, 7, dtype, cpu)
    assert made is not None and attention._round_graph(3, n, 0, 7, dtype, cpu) is made
    # too wide a matrix, or too many bytes: the steps as they are
    monkeypatch.setattr(attention, "_ROUND_GRAPH_AFTER", 1)
    monkeypatch.setattr(attention, "_ROUND_GRAPH_WIDTH", n - 1)
    assert attention._round_graph(5, n, 0, 6, dtype, cpu) is None
    monkeypatch.setattr(attention, "_ROUND_GRAPH_WIDTH", n)
    per_graph = 8 * (n * n + 8 * n + 12) * torch.empty((), dtype=dtype).element_size()
    monkeypatch.setattr(attention, "_ROUND_GRAPH_BYTES", per_graph - 1)
    assert attention._round_graph(5, n, 0, 6, dtype, cpu) is None
    monkeypatch.setattr(attention, "_ROUND_GRAPH_BYTES", per_graph)
    assert attention._round_graph(5, n, 0, 6, dtype, cpu) is not None


def test_rounds_end_on_the_whole_space_and_fall_back_to_dense_only_there(monkeypatch):
    """With a tolerance no round meets, every matrix goes on to ``m - 1`` steps: the
    whole space, where the Krylov space is spent (a breakdown certifies it) and the
    Ritz values are the eigenvalues. Only what that last round does not certify is
    solved by dense ``eigvalsh`` (forced here by residuals that never fall)."""
    n = 50
    s, top = causal_stack(n, 5, seed=5)
    ones = torch.ones((5, n), dtype=torch.float64)
    values = torch.linalg.eigvalsh(s)
    expected = torch.maximum(values[:, 0].abs(), values[:, -2].abs())
    solved, sizes = [], []
    eigvalsh = torch.linalg.eigvalsh
    monkeypatch.setattr(
        torch.linalg, "eigvalsh", lambda x: solved.append(x.shape[0]) or eigvalsh(x)
    )
    extremes = attention._ritz_extremes
    monkeypatch.setattr(
        attention, "_ritz_extremes", lambda a, b, **k: sizes.append(a.shape) or extremes(a, b, **k)
    )
    got = _lanczos_rounds(s, top, ones, rounds=(10,), tol=1e-300)
    assert sizes == [(5, 10), (5, n - 1)] and solved == []
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-12)

    def never(a, b, **k):
        value, residual = extremes(a, b, **k)
        return value, np.full_like(residual, np.inf)

    monkeypatch.setattr(attention, "_ritz_extremes", never)
    got = _lanczos_rounds(s, top, ones, rounds=(10,))
    assert solved == [5]
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-12)


def test_chain_spectrum_by_rounds_equals_the_adaptive_schedule(monkeypatch):
    """:func:`_chain_spectrum` takes the rounds on the devices of ``FIXED_ON`` (a GPU);
    forced onto the CPU they give the adaptive schedule's values on padded chains."""
    monkeypatch.setattr(attention, "_compiled", lambda: None)
    rng = np.random.default_rng(6)
    width = LANCZOS_FROM + 24
    chains = [causal_attention(n, rng)[0] for n in (width, width - 9, 70, 3)]
    a, valid = padded(chains, width)
    adaptive, pi = _chain_spectrum(a.clone(), valid)
    calls = []
    rounds = attention._lanczos_rounds
    monkeypatch.setattr(
        attention, "_lanczos_rounds", lambda *x, **k: calls.append(1) or rounds(*x, **k)
    )
    monkeypatch.setattr(attention, "FIXED_ON", ("cpu",))
    fixed, pi_fixed = _chain_spectrum(a.clone(), valid)
    assert calls == [1]
    np.testing.assert_allclose(fixed.numpy(), adaptive.numpy(), rtol=0, atol=TOL)
    assert torch.equal(pi_fixed, pi)


def lanczos_tridiagonals(spectra: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``alpha``, ``beta`` ``(rows, k)`` of ``k`` Lanczos steps (full
    reorthogonalisation, float64) on ``diag(spectrum)`` for each row of ``spectra``."""
    rng = np.random.default_rng(seed)
    alphas, betas = [], []
    for spectrum in spectra:
        q = rng.normal(size=spectrum.size)
        basis = [q / np.linalg.norm(q)]
        alpha, beta = [], []
        for _ in range(k):
            w = spectrum * basis[-1]
            alpha.append(basis[-1] @ w)
            for _twice in range(2):
                w = w - np.stack(basis).T @ (np.stack(basis) @ w)
            beta.append(np.linalg.norm(w))
            basis.append(w / beta[-1])
        alphas.append(alpha)
        betas.append(beta)
    return np.array(alphas), np.array(betas)


def test_a_float32_check_keeps_close_ends_batched(monkeypatch):
    """Ends 1e-4 apart: the float64 threshold (:data:`_RITZ_GAP`) sends them to dstemr;
    a float32 Lanczos's (:data:`_RITZ_GAP_FLOAT32`) keeps them in the batch, with dstemr's
    values and bounds (a decision at 1e-5 needs far less)."""
    rng = np.random.default_rng(11)
    spectra = rng.uniform(-0.5, 0.5, size=(6, 120))
    spectra[:, 0], spectra[:, 1] = 0.9, 0.9 - 1e-4  # a close pair at the top
    alpha, beta = (torch.from_numpy(x) for x in lanczos_tridiagonals(spectra, 40, seed=12))
    expected = attention._ritz_dstemr(alpha, beta)
    strict, redone = batched_and_redone(alpha, beta, True, monkeypatch)
    assert redone == 6
    gap = attention._RITZ_GAP_FLOAT32
    loose, redone = batched_and_redone(alpha, beta, True, monkeypatch, gap=gap)
    assert redone == 0
    np.testing.assert_allclose(loose[0], expected[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(loose[1], expected[1], rtol=1e-6, atol=1e-300)


def test_a_round_near_the_whole_space_is_skipped(monkeypatch):
    """64 tokens: a round at 48 of 63 steps would check nearly everything twice; the
    matrices go straight on to the whole space, one check."""
    s, top = causal_stack(64, 4, seed=13)
    sizes = []
    extremes = attention._ritz_extremes
    monkeypatch.setattr(
        attention, "_ritz_extremes", lambda a, b, **k: sizes.append(a.shape) or extremes(a, b, **k)
    )
    got = _lanczos_rounds(s, top, torch.ones((4, 64), dtype=torch.float64), rounds=(48, 96))
    assert sizes == [(4, 63)]
    values = torch.linalg.eigvalsh(s)
    expected = torch.maximum(values[:, 0].abs(), values[:, -2].abs())
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-12)


def test_device_ints_are_int64_and_kept_per_device():
    """On a device other than the CPU the same values give the same tensor back (no
    second copy from the host), int64 even when empty; on the CPU a new tensor."""
    meta = torch.device("meta")
    first = attention.device_ints([3, 1, 2], meta)
    assert first is attention.device_ints((3, 1, 2), meta)
    assert first.dtype == torch.long and first.shape == (3,)
    assert attention.device_ints([], meta).dtype == torch.long
    on_cpu = attention.device_ints([3, 1, 2], "cpu")
    assert on_cpu is not attention.device_ints([3, 1, 2], "cpu")
    assert on_cpu.tolist() == [3, 1, 2] and on_cpu.dtype == torch.long
