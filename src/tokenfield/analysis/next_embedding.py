"""Does the end of the depth-wise trajectory approach the next token's embedding?

The source material writes ``z^(L)_t ~ e_{t+1}``. Per layer ``l`` and every
position ``t`` that has a next token, the raw state ``x_l[t]`` is compared with
the input embedding ``e_{t+1}`` of token ``t + 1`` and with the embeddings of
``R`` random vocabulary tokens (the same draw for every position):

- ``cosine``: ``cos(x_l[t], e_{t+1})``, and the mean cosine to the random tokens;
- ``rank``: ``1 +`` the number of random tokens closer in cosine than the true
  next token (1 = closer than all ``R``), and the same by Euclidean distance;
- ``z``: ``(cos_true - mean cos_random) / std cos_random``.

With tied embeddings (the unembedding is the input embedding) a state that
predicts token ``v`` has, after the final norm, a large inner product with
``e_v``, so the last layer's agreement is largely the model's prediction being
right; the layer at which the rank falls is then a logit-lens curve more than an
independent geometric fact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenfield.errors import UserError

__all__ = ["NextEmbedding", "next_embedding_curve"]


def _unit(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


@dataclass(frozen=True)
class NextEmbedding:
    """Per-layer curves, each ``(T,)`` (means or medians over every position of every prompt)."""

    cosine: np.ndarray
    cosine_random: np.ndarray
    distance: np.ndarray
    distance_random: np.ndarray
    median_rank_cosine: np.ndarray
    median_rank_distance: np.ndarray
    top1_cosine: np.ndarray
    z: np.ndarray
    n_random: int
    n_positions: int

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            out[name] = value.tolist() if isinstance(value, np.ndarray) else value
        return out


def next_embedding_curve(
    states: Sequence[np.ndarray],
    next_ids: Sequence[np.ndarray],
    embeddings: dict[int, np.ndarray] | Any,
    random_ids: np.ndarray,
) -> NextEmbedding:
    """The curves over prompts.

    Args:
        states: per prompt, ``(T, n, d)`` raw residual states.
        next_ids: per prompt, ``(n - 1,)`` the id of token ``t + 1`` for ``t < n - 1``.
        embeddings: ``embeddings(ids) -> (k, d)`` input embeddings (a callable), or a
            mapping from id to ``(d,)``.
        random_ids: ``(R,)`` the random tokens (a token equal to the true next
            token is left out of that position's comparison).

    Returns:
        A ``NextEmbedding``: per-layer ``(T,)`` curves of the cosine and
        distance to the next token's embedding beside random tokens', their
        ranks and ``z`` scores.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> embeddings = rng.normal(size=(10, 3))      # a 10-token vocabulary
        >>> states = rng.normal(size=(4, 8, 3))        # one prompt: 4 layers, 8 tokens
        >>> curve = tf.next_embedding_curve([states], [np.arange(7)],
        ...                                 lambda ids: embeddings[ids], np.arange(7, 10))
        >>> curve.cosine.shape, curve.n_positions, curve.n_random
        ((4,), 7, 3)
    """
    if not states:
        raise UserError("no prompts to compare with the next token")
    embed = (
        embeddings if callable(embeddings) else lambda ids: np.stack([embeddings[i] for i in ids])
    )
    random_ids = np.asarray(random_ids)
    rand = np.asarray(embed(random_ids), dtype=np.float64)  # (R, d)
    rand_unit = _unit(rand)

    cos_t, cos_r, dist_t, dist_r, rank_c, rank_d, zs = ([] for _ in range(7))
    for x, ids in zip(states, next_ids, strict=True):
        ids = np.asarray(ids)
        m = ids.size
        if m == 0:
            continue
        target = np.asarray(embed(ids), dtype=np.float64)  # (m, d)
        same = ids[:, None] == random_ids[None, :]  # (m, R) the true token drawn at random
        q = np.asarray(x[:, :m], dtype=np.float64)  # (T, m, d)
        qu = _unit(q)
        c_true = np.einsum("tmd,md->tm", qu, _unit(target))  # (T, m)
        c_rand = np.einsum("tmd,rd->tmr", qu, rand_unit)  # (T, m, R)
        d_true = np.linalg.norm(q - target[None], axis=-1)  # (T, m)
        d_rand = np.sqrt(
            np.clip(
                (q**2).sum(-1)[..., None]
                - 2 * np.einsum("tmd,rd->tmr", q, rand)
                + (rand**2).sum(-1)[None, None, :],
                0.0,
                None,
            )
        )  # (T, m, R)
        valid = ~same[None]  # (1, m, R)
        rank_c.append(1 + ((c_rand > c_true[..., None]) & valid).sum(-1))
        rank_d.append(1 + ((d_rand < d_true[..., None]) & valid).sum(-1))
        masked = np.where(valid, c_rand, np.nan)
        mean_r = np.nanmean(masked, axis=-1)
        std_r = np.nanstd(masked, axis=-1)
        zs.append((c_true - mean_r) / np.where(std_r > 0, std_r, np.nan))
        cos_t.append(c_true)
        cos_r.append(mean_r)
        dist_t.append(d_true)
        dist_r.append(np.nanmean(np.where(valid, d_rand, np.nan), axis=-1))
    if not cos_t:
        raise UserError("no prompt has a next token", "give prompts of two or more tokens")

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts, axis=1)  # (T, positions)

    ranks_c, ranks_d = cat(rank_c), cat(rank_d)
    return NextEmbedding(
        cosine=cat(cos_t).mean(1),
        cosine_random=cat(cos_r).mean(1),
        distance=cat(dist_t).mean(1),
        distance_random=cat(dist_r).mean(1),
        median_rank_cosine=np.median(ranks_c, axis=1),
        median_rank_distance=np.median(ranks_d, axis=1),
        top1_cosine=(ranks_c == 1).mean(1),
        z=np.nanmean(cat(zs), axis=1),
        n_random=int(random_ids.size),
        n_positions=int(ranks_c.shape[1]),
    )
