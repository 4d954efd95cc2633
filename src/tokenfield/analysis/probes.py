"""Linear probes by layer: the attractor reading of a linear head (seed 003).

Seed 003 argues that a linear classification head works because the class is
an attractor: the (time-averaged, "context-pooled") state of a prompt of class
``c`` ends up near the class's basis vector. If so, the prompt's category
should become linearly decodable with depth. Per time, a multinomial logistic
regression is cross-validated on

- ``last``: the last token's state, and
- ``pooled``: the mean over the prompt's tokens (needs ``positions="all"``),

each against a permutation null (the same cross-validation with the labels
shuffled).

Features: each state is put on the unit sphere, then standardised (per
feature, over all prompts: label-free), then rotated onto the span of the
samples (an orthonormal basis from the SVD). The last step changes nothing
for an L2-penalised linear model (the optimal weight lies in the span of the
training samples, and an orthonormal change of basis keeps the penalty), and
makes each fit cost ``O(n^2)`` instead of ``O(n d)``.

Fits: every (time, labelling, fold) problem, the real labels and all the
shuffles, is solved in one batch (:func:`_logistic_batch`, Newton's method with
preconditioned conjugate gradients) to scikit-learn's optimum, tightly: the
tests compare coefficients with ``LogisticRegression(tol=1e-12)``. One
scikit-learn fit per problem at its default tolerance was 2x slower on the demo
run (25 prompts; 1.2x faster at 400: ``benchmarks/probe_fits.py``) and stopped early enough to move a
borderline test prompt.

Cross-validation: stratified ``k``-fold (shuffled, seeded) when every class has
at least ``k`` members, otherwise leave-one-out. The folds are stratified on
*each labelling's own* labels: the real labels get folds balanced on the real
labels, and every shuffle gets folds balanced on that shuffle (the same
function of the labelling, with the same seed). Real and shuffled labellings
are then exchangeable under the null. Folds stratified on the real labels and
reused for the shuffles gave the shuffles unbalanced folds, so they scored
below chance and the null was biased: on noise shaped like seed-categories (25
prompts, 5 classes, 8 layers) the corrected "holds" fired in about a quarter of
the datasets (``tests/unit/test_probes.py`` measures the rate). Leave-one-out
folds do not depend on the labels and are shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.nulls import claim_status, max_null_pvalues
from tokenfield.errors import UserError

__all__ = ["ProbeCurve", "pooled_features", "last_token_features", "probe_accuracy"]

# The most (problem, row, class) entries of one batch of fits (16 MB per float64 array).
BATCH_ENTRIES = 2_000_000


@dataclass(frozen=True)
class ProbeCurve:
    """Cross-validated probe accuracy per time.

    Attributes:
        time: ``(T,)``.
        accuracy: ``(T,)`` cross-validated accuracy.
        null_mean: ``(T,)`` mean accuracy with shuffled labels.
        null_high: ``(T,)`` its 95th percentile.
        p_value: ``(T,)`` ``(1 + #{null >= accuracy}) / (1 + permutations)``.
        p_corrected: ``(T,)`` the same against each shuffle's best accuracy over
            all times: the p-value of a probe layer chosen as the best one
            (:func:`tokenfield.analysis.nulls.max_null_pvalues`).
        chance: the majority-class rate.
        cv: ``"5-fold"`` or ``"leave-one-out"``.
        permutations: shuffles in the null.
        null: ``(permutations, T)`` each shuffle's accuracy at every time (the
            same shuffle in a row); not written by :meth:`to_dict`.
    """

    time: np.ndarray
    accuracy: np.ndarray
    null_mean: np.ndarray
    null_high: np.ndarray
    p_value: np.ndarray
    p_corrected: np.ndarray
    chance: float
    cv: str
    permutations: int
    null: np.ndarray | None = None

    def best(self) -> dict[str, Any]:
        """The time with the best accuracy, its accuracy and both p-values, and
        whether "the category is decodable" holds on the corrected p-value."""
        if not np.isfinite(self.accuracy).any():
            return {"time": None, "accuracy": None, "p": None, "p_corrected": None,
                    "claim": "not supported"}  # fmt: skip
        i = int(np.nanargmax(self.accuracy))
        return {
            "time": self.time[i].item(),
            "accuracy": float(self.accuracy[i]),
            "p": float(self.p_value[i]),
            "p_corrected": float(self.p_corrected[i]),
            "claim": claim_status(float(self.p_corrected[i])),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time.tolist(),
            "accuracy": self.accuracy.tolist(),
            "null_mean": self.null_mean.tolist(),
            "null_high": self.null_high.tolist(),
            "p_value": self.p_value.tolist(),
            "p_corrected": self.p_corrected.tolist(),
            "best": self.best(),
            "chance": self.chance,
            "cv": self.cv,
            "permutations": self.permutations,
        }


def _prepare(x: np.ndarray) -> np.ndarray:
    """Sphere, standardise, rotate onto the sample span: ``(n, d) -> (n, r)``."""
    x = np.asarray(x, dtype=np.float64)
    x = x / np.where((norms := np.linalg.norm(x, axis=1, keepdims=True)) > 0, norms, 1.0)
    scale = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(scale > 1e-12, scale, 1.0)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    keep = s > s[0] * 1e-10 if s.size and s[0] > 0 else np.zeros(0, dtype=bool)
    return u[:, keep] * s[keep]  # = x V: the coordinates in the span


def _folds(
    labels: np.ndarray, folds: int, seed: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    """The cross-validation splits of one labelling: stratified ``folds``-fold on
    ``labels`` when every class has that many members, else leave-one-out."""
    from sklearn.model_selection import LeaveOneOut, StratifiedKFold

    _, counts = np.unique(labels, return_counts=True)
    if counts.min() >= folds:
        splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
        return list(splitter.split(labels, labels)), f"{folds}-fold"
    return list(LeaveOneOut().split(labels)), "leave-one-out"


def _fold_masks(
    labellings: np.ndarray, folds: int, seed: int
) -> tuple[np.ndarray, np.ndarray, str]:
    """Train weights and test rows ``(B, F, n)`` of each labelling's own folds.

    Each labelling (the real one and every shuffle) is split by :func:`_folds`
    on its own labels, so that the real labels and the shuffles are treated
    alike (exchangeable under the null). All labellings have the same class
    sizes, so all get the same kind of cross-validation.
    """
    per_labelling = [_folds(codes, folds, seed) for codes in labellings]
    n = labellings.shape[1]
    nfolds = len(per_labelling[0][0])
    train = np.zeros((len(labellings), nfolds, n))
    test = np.zeros((len(labellings), nfolds, n), dtype=bool)
    for i, (splits, _cv) in enumerate(per_labelling):
        for f, (rows_train, rows_test) in enumerate(splits):
            train[i, f, rows_train], test[i, f, rows_test] = 1.0, True
    return train, test, per_labelling[0][1]


def _cv_correct(z: np.ndarray, codes: np.ndarray, splits, c: float) -> np.ndarray:
    """Test rows predicted right, summed over the folds, per time and labelling.

    Args:
        z: ``(T, n, r)`` features at ``T`` times (zero columns pad a smaller rank:
            their coefficients stay 0).
        codes: ``(B, n)`` class codes (``0..K-1``, sorted like the class names)
            of ``B`` labellings: the real one and the shuffles.
        splits: ``F`` pairs of (train rows, test rows) shared by every
            labelling, or a pair of arrays ``(train, test)``, each ``(B, F, n)``:
            each labelling's own folds (:func:`_fold_masks`).
        c: inverse L2 penalty.

    Returns ``(T, B)`` counts. Each (time, labelling, fold) is the L2-penalised
    logistic regression of scikit-learn's ``LogisticRegression(C=c)``
    (multinomial; the binomial loss when the training rows hold two classes;
    intercepts not penalised; only the classes present in the training rows),
    all ``T x B x F`` of them solved at once by :func:`_logistic_batch`: the
    same optima, reached more tightly than scikit-learn's default tolerance, in
    one batch of array operations instead of ``T x B x F`` separate fits. A fold
    whose training rows hold one class predicts that class.
    """
    n = codes.shape[1]
    if isinstance(splits, tuple) and len(splits) == 2 and np.ndim(splits[0]) == 3:
        train, test = np.asarray(splits[0], dtype=np.float64), np.asarray(splits[1], dtype=bool)
    else:
        train = np.zeros((len(splits), n))
        test = np.zeros((len(splits), n), dtype=bool)
        for f, (rows_train, rows_test) in enumerate(splits):
            train[f, rows_train], test[f, rows_test] = 1.0, True
        train = np.broadcast_to(train, (codes.shape[0], *train.shape))
        test = np.broadcast_to(test, (codes.shape[0], *test.shape))
    z = np.asarray(z, dtype=np.float64)
    w, b, present = _logistic_batch(z, codes, train, c)
    logits = _times(z, w) + b[:, None]
    logits = np.where(present, logits, -np.inf)  # (T, n, B, F, K)
    predicted = logits.argmax(axis=-1)  # ties: the first class, as scikit-learn
    single = present.argmax(axis=-1)  # (B, F): the only class of a one-class fold
    predicted = np.where(present.sum(axis=-1) == 1, single, predicted)
    right = (predicted == codes.T[:, :, None]) & test.transpose(2, 0, 1)[None]  # (T, n, B, F)
    return right.sum(axis=(1, 3))


def _times(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``a`` ``(T, i, j)`` times ``v`` ``(T, j, ...)``: one matrix product per time."""
    return (a @ v.reshape(v.shape[0], v.shape[1], -1)).reshape(a.shape[:2] + v.shape[2:])


def _logistic_batch(
    z: np.ndarray, codes: np.ndarray, train: np.ndarray, c: float, tol: float = 1e-6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """L2-penalised logistic regressions, all at once.

    One problem per time of ``z`` (``(T, n, r)``), labelling ``codes``
    (``(B, n)``) and fold (``train``: ``(F, n)`` 0/1 weights of the training
    rows, the same for every labelling; or ``(B, F, n)``: each labelling's own
    folds). Returns ``(w, b, present)``: coefficients ``(T, r, B, F, K)``,
    intercepts ``(T, B, F, K)`` and the classes with training rows ``(B, F, K)``
    (the others keep ``w = b = 0`` and are never predicted).

    The objective is scikit-learn's: ``C * sum(loss) + |w|^2 / 2`` with
    symmetric multinomial coefficients and unpenalised intercepts; with two
    classes its binomial loss, which is the symmetric two-class multinomial with
    ``C / 2`` (``w[..., 1] - w[..., 0]`` is then its ``coef_``). Newton's method,
    each step solved by conjugate gradients and damped by a backtracking line
    search, until the largest gradient component is ``tol`` times the one at
    zero, or stops falling at the rounding floor. Arrays are laid out as
    ``(time, row or feature, labelling, fold, class)``, so that each product
    with the features is one matrix product per time.
    """
    k = int(codes.max()) + 1
    zt = np.ascontiguousarray(np.swapaxes(z, 1, 2))  # (T, r, n)
    if train.ndim == 2:  # the same folds for every labelling
        train = train[None]
    m = np.asarray(train, dtype=np.float64).transpose(2, 0, 1)[..., None]  # (n, B or 1, F, 1)
    y = np.eye(k)[codes].transpose(1, 0, 2)[:, :, None, :] * m  # (n, B, F, K), training rows
    present = y.sum(axis=0) > 0  # (B, F, K)
    npresent = present.sum(axis=-1)
    cc = np.where(npresent == 2, c / 2, c)  # (B, F)
    cw, cb = cc[None, None, :, :, None], cc[None, :, :, None]
    w = np.zeros((z.shape[0], z.shape[2], *present.shape))
    b = np.zeros((z.shape[0], *present.shape))

    def per_w(v):  # a (T, B, F) value on each coefficient
        return v[:, None, :, :, None]

    def log_probabilities(w, b):
        logits = np.where(present, _times(z, w) + b[:, None], -np.inf)  # (T, n, B, F, K)
        logits -= logits.max(axis=-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))

    def objective(w, b):
        nll = -np.where(y > 0, log_probabilities(w, b), 0.0).sum(axis=(1, -1))
        return cc * nll + 0.5 * (w * w).sum(axis=(1, -1))

    def hessian_times(p, vw, vb):
        u = _times(z, vw) + vb[:, None]
        s = (p * u - p * (p * u).sum(axis=-1, keepdims=True)) * m
        return cw * _times(zt, s) + vw, cb * s.sum(axis=1)

    def dot(aw, ab, bw, bb):
        return (aw * bw).sum(axis=(1, -1)) + (ab * bb).sum(axis=-1)

    live = np.broadcast_to(npresent >= 2, b.shape[:-1]).copy()  # (T, B, F)
    f0 = objective(w, b)
    first = previous = None
    for _newton in range(100):
        p = np.exp(log_probabilities(w, b))
        r = (p - y) * m
        gw, gb = cw * _times(zt, r) + w, cb * r.sum(axis=1)
        gnorm = np.maximum(np.abs(gw).max(axis=(1, -1)), np.abs(gb).max(axis=-1))
        if first is None:
            first = previous = gnorm
        live &= gnorm > tol * first
        live &= ~((gnorm > 0.5 * previous) & (gnorm < 1e-7 * first))  # the rounding floor
        previous = gnorm
        if not live.any():
            break
        # conjugate gradients on H d = -g, to a residual of min(0.01, |g|) |g|,
        # preconditioned by the Hessian's diagonal (the features' columns are
        # orthogonal, with very different scales: the diagonal holds most of it)
        q = p * (1 - p) * m
        mw, mb = cw * _times(zt * zt, q) + 1.0, cb * q.sum(axis=1)
        mb = np.where(mb > 0, mb, 1.0)
        dw, db = np.zeros_like(w), np.zeros_like(b)
        rw, rb = -gw, -gb
        sw, sb = rw / mw, rb / mb
        pw, pb = sw.copy(), sb.copy()
        rz = dot(rw, rb, sw, sb)
        norm2 = dot(rw, rb, rw, rb)
        target = np.minimum(0.01, np.sqrt(norm2)) * norm2
        going = live.copy()
        for _cg in range(w.shape[1] * k + k):
            hw, hb = hessian_times(p, pw, pb)
            curvature = dot(pw, pb, hw, hb)
            going &= curvature > 0
            step = np.where(going, rz / np.where(going, curvature, 1.0), 0.0)
            dw += per_w(step) * pw
            db += step[..., None] * pb
            rw -= per_w(step) * hw
            rb -= step[..., None] * hb
            going &= dot(rw, rb, rw, rb) > target
            if not going.any():
                break
            sw, sb = rw / mw, rb / mb
            rz_new = dot(rw, rb, sw, sb)
            beta = np.where(going, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
            pw, pb = sw + per_w(beta) * pw, sb + beta[..., None] * pb
            rz = rz_new
        # backtracking line search (Armijo), problem by problem
        slope = dot(gw, gb, dw, db)
        alpha = np.where(live, 1.0, 0.0)
        pending = live.copy()
        for _halving in range(30):
            trial = objective(w + per_w(alpha) * dw, b + alpha[..., None] * db)
            # (within rounding of the objective counts as no increase: at the optimum)
            pending &= trial > f0 + 1e-4 * alpha * slope + 1e-13 * np.abs(f0)
            if not pending.any():
                break
            alpha = np.where(pending, alpha / 2, alpha)
        alpha = np.where(pending, 0.0, alpha)  # no decrease left: at the optimum
        live &= ~pending
        w = w + per_w(alpha) * dw
        b = b + alpha[..., None] * db
        f0 = np.where(alpha > 0, trial, f0)
    return w, b, present


def probe_accuracy(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    time: np.ndarray | None = None,
    folds: int = 5,
    permutations: int = 50,
    c: float = 1.0,
    seed: int = 0,
) -> ProbeCurve:
    """Cross-validated accuracy of a logistic-regression probe at every time.

    Args:
        features: ``(T, n, d)`` one feature vector per sample and time.
        labels: ``(n,)`` class of each sample (at least two classes).
        time: ``(T,)`` time coordinate (default ``0..T-1``).
        folds: ``k`` of the stratified k-fold (leave-one-out when a class is
            smaller); every labelling, real or shuffled, is stratified on its own labels.
        permutations: label shuffles for the null (the same shuffles at every time).
        c: inverse L2 penalty of the logistic regression.
        seed: folds and shuffles (each labelling's folds use this seed).

    Returns:
        A ``ProbeCurve``: ``accuracy``, the shuffled-label null
        (``null_mean``, ``null_high``), ``p_value`` and ``p_corrected`` per
        time, and the majority-class ``chance``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> labels = np.repeat([0, 1], 10)
        >>> features = rng.normal(size=(2, 20, 2))
        >>> features[:, labels == 1, 0] += 4.0
        >>> curve = tf.probe_accuracy(features, labels, permutations=5)
        >>> curve.cv, curve.chance, bool((curve.accuracy > curve.null_mean).all())
        ('5-fold', 0.5, True)
    """
    x = np.asarray(features)
    labels = np.asarray(labels)
    if x.ndim != 3 or x.shape[1] != labels.size:
        raise UserError(f"features must be (time, n, d) with n = {labels.size}, got {x.shape}")
    classes, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
    codes = codes.reshape(-1)
    if classes.size < 2:
        raise UserError("probes need at least two categories", "trace a prompt set with categories")
    rng = np.random.default_rng(seed)
    shuffles = [rng.permutation(codes) for _ in range(permutations)]
    labellings = np.stack([codes, *shuffles])  # the real labels, then the shuffles
    # each labelling its own folds (stratified on its own labels): exchangeable
    train, test, cv = _fold_masks(labellings, folds, seed)
    prepared = [_prepare(x[t]) for t in range(x.shape[0])]
    z = np.zeros((x.shape[0], labels.size, max(p.shape[1] for p in prepared)))
    for t, p in enumerate(prepared):
        z[t, :, : p.shape[1]] = p  # zero columns: coefficients that stay 0
    # problems in groups of about BATCH_ENTRIES (row, class) entries per array:
    # several times at once, or (many folds: leave-one-out) part of the labellings
    per_labelling = train.shape[1] * labels.size * classes.size
    labels_at_once = max(1, min(len(labellings), BATCH_ENTRIES // per_labelling))
    times_at_once = max(1, BATCH_ENTRIES // (per_labelling * labels_at_once))
    correct = np.empty((len(z), len(labellings)))  # (T, 1 + permutations)
    for i in range(0, len(z), times_at_once):
        for j in range(0, len(labellings), labels_at_once):
            chunk = slice(j, j + labels_at_once)
            correct[i : i + times_at_once, chunk] = _cv_correct(
                z[i : i + times_at_once], labellings[chunk], (train[chunk], test[chunk]), c
            )
    correct /= labels.size
    accuracy, null_mean, null_high = [], [], []
    nulls = np.full((permutations, x.shape[0]), np.nan)
    for t in range(x.shape[0]):
        score, null = float(correct[t, 0]), correct[t, 1:]
        nulls[:, t] = null
        accuracy.append(score)
        null_mean.append(float(null.mean()) if null.size else float("nan"))
        null_high.append(float(np.quantile(null, 0.95)) if null.size else float("nan"))
    pvalues = max_null_pvalues(np.array(accuracy), nulls)
    return ProbeCurve(
        time=np.arange(x.shape[0]) if time is None else np.asarray(time),
        accuracy=np.array(accuracy),
        null_mean=np.array(null_mean),
        null_high=np.array(null_high),
        p_value=np.nan_to_num(pvalues.p, nan=1.0),
        p_corrected=pvalues.p_corrected,
        chance=float(counts.max() / labels.size),
        cv=cv,
        permutations=permutations,
        null=nulls,
    )


def _per_prompt(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    if "prompt_index" not in ds.coords or "category" not in ds.coords:
        raise UserError("probes need a traced run (prompt_index and category)")
    prompts = np.unique(ds["prompt_index"].values)
    categories = []
    for p in prompts:
        first = int(np.flatnonzero(ds["prompt_index"].values == p)[0])
        categories.append(str(ds["category"].values[first]))
    return prompts, np.array(categories, dtype=object)


def last_token_features(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(time, prompts, d)`` last-token states and ``(prompts,)`` categories."""
    prompts, categories = _per_prompt(ds)
    last = ds["is_last"].values.astype(bool)
    index = ds["prompt_index"].values
    rows = [int(np.flatnonzero(last & (index == p))[0]) for p in prompts]
    states = ds["states"].transpose("time", "particle", "feature").values
    return np.asarray(states[:, rows]), categories


def pooled_features(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(time, prompts, d)`` mean over each prompt's tokens (``positions="all"`` runs)."""
    prompts, categories = _per_prompt(ds)
    index = ds["prompt_index"].values
    states = ds["states"].transpose("time", "particle", "feature").values
    pooled = np.stack([states[:, index == p].mean(axis=1) for p in prompts], axis=1)
    return pooled, categories
