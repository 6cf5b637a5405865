# SPDX-License-Identifier: Apache-2.0
"""DeepIO's randomization level (RL, DeepIO §III-C, eqs. 1-5) and simple order diagnostics.

An order is scored by the probability P(i) with which the element at position i was
chosen by the process that made it, against a full shuffle, where the i-th element is
one of the N - i remaining, Q(i) = 1 / (N - i) (eq. 4). The paper's RL (eq. 5) is

    RL = H / H_fully,   H = -sum_i Q(i) log2 P(i),   H_fully = -sum_i Q(i) log2 Q(i),

i.e. the cross-entropy of eq. 1 taken with the full shuffle's weights Q. A constant order
has P = 1 and RL = 0; a full shuffle has RL = 1. This reading of eqs. 1-5 reproduces the
paper's checkpoints with ~7,660 training images (85% of Caltech-101): R = 0.5 -> 98.54%,
R = 0.25 -> 96.96% (§III-C), and constant groups of 4 / 16 / 256 images -> 72.4% /
48.8% / 15.8% (Fig. 7 reports 73% / 49% / 16%); see ``docs/planner.md``. The cost is
O(N) vectorised work for a model, so :func:`chunk_for_rl` caches its answers.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import ConfigError

_BLOCK = 1 << 20
#: Models are evaluated on at most this many samples: at a fixed group size their RL
#: changes slowly with N (and grows with it), so larger datasets get a slightly
#: pessimistic value in O(2**20) time instead of O(N).
MODEL_SAMPLES = 1 << 20


#: samples per group of the chunk assignment when neither ``chunk`` nor an RL floor
#: says otherwise (assign_chunk.py)
DEFAULT_CHUNK = 64
#: samples per unit of the memory assignment (assign_memory.py, the DeepIO store)
DEFAULT_UNIT = 64


def chunk_size(n: int, strategy) -> int:
    """The group size in samples: ``strategy.chunk``, or when 0 the largest power of two up
    to DEFAULT_CHUNK whose RL reaches ``strategy.rl_floor`` (:func:`feedline.plan.rl.chunk_for_rl`)."""
    g = strategy.chunk
    if not g:
        g = (
            chunk_for_rl(max(n, 1), strategy.rl_floor, max_chunk=DEFAULT_CHUNK)
            if strategy.rl_floor > 0
            else DEFAULT_CHUNK
        )
    return max(1, min(g, max(n, 1)))


#: rounds of R < 1 hold at least this many units when the unit is not given: a small
#: dataset gets smaller units, so that R is what a round holds
MIN_ROUND_UNITS_DEFAULT = 2


def memory_unit(n: int, fraction: float, chunk: int = 0) -> int:
    """Samples per unit of ``memory(R)`` over *n* samples: *chunk* when given, else
    :data:`DEFAULT_UNIT`, made smaller when R < 1 and the dataset is too small for
    :data:`MIN_ROUND_UNITS_DEFAULT` units in each of its ceil(1/R) rounds, or for R of
    its units to be fewer than all of them (32 samples at R = 0.25 made one unit of 64:
    one round, R = 1 in effect). Units of one sample are the floor: a dataset smaller
    than that need still rounds R to whole samples."""
    g = int(chunk)
    if not g:
        g = DEFAULT_UNIT
        if fraction < 1.0:
            rounds = math.ceil(1.0 / fraction - 1e-9)
            # enough units that every round holds a few, and that R of them (rounded) is
            # fewer than all (R = 0.9 over 4 units would round to one round of all 4)
            need = max(MIN_ROUND_UNITS_DEFAULT * rounds, math.ceil(1.0 / (1.0 - fraction)) + 1)
            g = min(g, max(1, n // need))
    return max(1, min(g, max(n, 1)))


def unit_size(n: int, strategy) -> int:
    """Samples per unit of the memory assignment (:func:`memory_unit` of the strategy's
    ``chunk`` and ``memory_fraction``)."""
    return memory_unit(n, strategy.memory_fraction, strategy.chunk)


def _q_entropy(n: int, logp) -> float:
    """-sum_i Q(i) log2 P(i) for i < n, with ``logp(i)`` = log2 P(i), in blocks."""
    total = 0.0
    for a in range(0, n, _BLOCK):
        i = np.arange(a, min(a + _BLOCK, n), dtype=np.float64)
        total -= float((logp(i) / (n - i)).sum())
    return total


@lru_cache(maxsize=256)
def _h_fully(n: int) -> float:
    return _q_entropy(n, lambda i: -np.log2(n - i))


@lru_cache(maxsize=1024)
def rl_grouped(n: int, group: int, *, local_shuffle: bool = False, exact: bool = False) -> float:
    """RL of groups of *group* consecutive samples shuffled as units (Fig. 7's model).

    With ``local_shuffle`` the samples inside each group are also shuffled (the
    asynchronous-I/O paper's chunk shuffle): P(i) = 1/(G - k) · 1/(g - u) for position u of
    the k-th group; without it P(i) = 1/(G - k). Evaluated on ``min(n, MODEL_SAMPLES)``
    samples unless *exact*.
    """
    if n <= 1:
        return 1.0
    if not exact:
        n = min(n, MODEL_SAMPLES)
    g = max(1, min(int(group), n))
    G = -(-n // g)

    def logp(i):
        k = i // g
        lp = -np.log2(G - k)
        if local_shuffle:
            size = np.where(k == G - 1, n - (G - 1) * g, g)
            lp = lp - np.log2(size - (i - k * g))
        return lp

    return _q_entropy(n, logp) / _h_fully(n)


#: a ramped load's first round holds 1/RAMP_FIRST of a round's units ...
RAMP_FIRST = 4
#: ... (at least RAMP_MIN_UNITS, and the first global batch), and each next round
#: RAMP_GROWTH times the one before, until rounds are full: the first batch waits for a
#: small round, and a load that never idles keeps ahead of a consumer whose compute is
#: c times the read only while the growth is at most c (~1.2 in ``bench async``'s
#: regime; 1.25 fell behind at every round: docs/deepio.md, "Why 1.1")
RAMP_MIN_UNITS = 16
RAMP_GROWTH = 1.1


def ramp_floor(batch: int, unit: int) -> int:
    """Units a ramped first round holds at least so that the first step (*batch*
    samples) needs it alone: its units, one more for a short one."""
    return -(-max(int(batch), 1) // max(int(unit), 1)) + 1


def round_cuts(units: int, per_round: int, ramp: int = 0) -> np.ndarray:
    """The first unit of every round, and *units* last: rounds of *per_round* units
    (the last may be short), or with *ramp* > 0 (a progressive store's first epoch)
    growing from a first round of ``max(RAMP_MIN_UNITS, per_round / RAMP_FIRST, ramp)``
    units by RAMP_GROWTH per round up to *per_round* (:func:`ramp_floor` gives *ramp*)."""
    units, p = max(int(units), 0), max(int(per_round), 1)
    sizes: list[int] = []
    if ramp and p < units:
        a = max(RAMP_MIN_UNITS, -(-p // RAMP_FIRST), int(ramp))
        done = 0
        while a < p and done + a < units:
            sizes.append(a)
            done += a
            a = max(a + 1, int(a * RAMP_GROWTH))
    head = np.cumsum([0, *sizes], dtype=np.int64)
    rest = np.arange(int(head[-1]), units, p, dtype=np.int64)
    return np.unique(np.concatenate([head, rest, np.array([units], dtype=np.int64)]))


@lru_cache(maxsize=1024)
def rl_memory(
    n: int,
    fraction: float,
    *,
    unit: int = 1,
    exact: bool = False,
    ranks: int = 1,
    ramp: int = 0,
) -> float:
    """RL of DeepIO's hybrid pipeline (eq. 4): rounds of a fraction R of the files in memory.

    *unit* samples form a file; each round loads N_c = R·N_f files chosen without
    replacement and fully shuffles the N_mem = N_c·unit samples in memory. Evaluated on
    ``min(n, MODEL_SAMPLES)`` samples unless *exact*.

    *ranks* > 1 models the opportunistic mode (``store="opportunistic"``): each of P
    ranks draws its positions of a round from its own N_mem/P samples, so the element at
    round position u is one of the N_mem/P - u//P its rank has left (a rank-stratified
    shuffle: lower RL than the ordered mode's 1/(N_mem - u)).

    *ramp*: the rounds of :func:`round_cuts` with that *ramp* (a progressive store's
    first epoch): the first rounds are smaller.
    """
    if not 0 < fraction <= 1:
        raise ConfigError(f"fraction must be in (0, 1], got {fraction}")
    if n <= 1:
        return 1.0
    if not exact:
        n = min(n, MODEL_SAMPLES)
    unit = max(1, min(int(unit), n))
    Nf = -(-n // unit)
    Nc = max(1, round(fraction * Nf))
    cuts = round_cuts(Nf, Nc, ramp)  # in files; in samples below (the last file short)
    at = np.minimum(cuts * unit, n).astype(np.float64)

    P = max(1, int(ranks))

    def logp(i):
        r = np.searchsorted(at, i, side="right") - 1
        in_round = at[r + 1] - at[r]
        u = i - at[r]
        left = in_round - u if P == 1 else np.maximum(np.ceil(in_round / P) - u // P, 1)
        chosen, before = cuts[r + 1] - cuts[r], cuts[r]
        return np.log2(chosen / (Nf - before)) - np.log2(left)

    return _q_entropy(n, logp) / _h_fully(n)


def rl_of_strategy(
    n: int, strategy, *, tile: int | None = None, ranks: int = 1, ramp: int = 0
) -> float:
    """RL of an assignment's sampling process (what the planner's orders realise).

    *tile*: for ``chunk`` with ``chunk_bytes``, the samples of the plan's unit of local
    shuffling (a sub-tile, ``TiledColumnStream.tile``); without it the model uses the
    per-column group of :func:`~feedline.plan.assign_chunk.chunk_size` (a strategy
    alone knows neither the batch nor the record lengths that size the tiles).
    *ramp*: ``memory``'s rounds ramp up (a progressive store's first epoch,
    :func:`round_cuts`).
    """
    from .strategy import get_strategy

    s = get_strategy(strategy)
    a = s.assignment
    if a == "global":
        return 1.0
    if a in ("strided", "skip", "contiguous"):
        return 0.0 if n > 1 else 1.0
    if a == "chunk":
        return rl_grouped(n, tile or chunk_size(n, s), local_shuffle=True)
    if a == "memory":
        P = ranks if s.store == "opportunistic" else 1
        return rl_memory(n, s.memory_fraction, unit=unit_size(n, s), ranks=P, ramp=ramp)
    if a == "window":
        # each window of *tile* samples (the plan's mean window) is shuffled completely;
        # modelled as contiguous groups shuffled locally, a lower bound (a window holds
        # tiles from random places)
        return rl_grouped(n, tile or n, local_shuffle=True)
    raise ConfigError(f"no RL model for assignment {a!r}")  # pragma: no cover


def rl_of_sequence(ids) -> float:
    """RL of one observed order: maximal runs of consecutive ids count as constant groups.

    A run ``i, i+1, i+2, ...`` is what a constant-order group looks like (Fig. 7), so the
    sequence is scored as its runs shuffled as units. Exact for the identity (0) and for
    group shuffles without local shuffle; a full shuffle scores just under 1 (chance
    adjacencies).
    """
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    if n <= 1:
        return 1.0
    new = np.ones(n, dtype=bool)
    new[1:] = np.diff(ids) != 1
    run = np.cumsum(new) - 1  # run index of each position
    G = int(run[-1]) + 1
    run_f = run.astype(np.float64)
    total = 0.0
    for a in range(0, n, _BLOCK):
        i = np.arange(a, min(a + _BLOCK, n), dtype=np.float64)
        total += float((np.log2(G - run_f[a : a + len(i)]) / (n - i)).sum())
    return total / _h_fully(n)


def randomization_level(x: Any = None, n: int | None = None, **kw: Any) -> float:
    """DeepIO's randomization level of a plan, a strategy or an id sequence.

    Parameters
    ----------
    x : Plan, Strategy, str or array of int
        A :class:`~feedline.plan.Plan` (its assignment over its N samples), a Strategy or
        preset name (with *n*), or an observed order of ids.
    n : int, optional
        Number of samples, for a strategy.
    **kw
        Knob overrides for a strategy (``chunk=``, ``memory_fraction=``...).

    Returns
    -------
    float in [0, 1]
        1 for a full shuffle, 0 for a constant order.
    """
    from .plan import Plan
    from .strategy import Strategy

    if isinstance(x, Plan):
        if x.strategy.assignment == "window" and hasattr(x._stream, "bounds"):
            from .assign_window import weighted_window_steps

            st = x._stream
            per_unit = np.diff(st.starts)
            wl = st.per_step * weighted_window_steps(st.w, x.num_steps)
            mean_w = float(np.minimum(wl, np.maximum(per_unit, 1)).mean()) if len(wl) else 1.0
            return rl_of_strategy(x.n, x.strategy, tile=max(1, round(mean_w)))
        from .assign_memory import epoch_ramp, epoch_strategy  # a progressive epoch 0

        s = epoch_strategy(x.strategy, x.epoch)
        ramp = epoch_ramp(x.strategy, x.epoch, x.n, x.batch_size)
        return rl_of_strategy(
            x.n, s, tile=getattr(x._stream, "tile", None), ranks=x.world.size, ramp=ramp
        )
    if isinstance(x, (Strategy, str)):
        if n is None:
            raise ConfigError("randomization_level(strategy) needs n (the number of samples)")
        from .strategy import get_strategy

        return rl_of_strategy(int(n), get_strategy(x, **kw))
    if x is None:
        raise ConfigError("randomization_level needs a plan, a strategy or an id sequence")
    return rl_of_sequence(x)


@lru_cache(maxsize=256)
def chunk_for_rl(n: int, rl_floor: float, *, max_chunk: int = 64) -> int:
    """The largest power-of-two chunk <= *max_chunk* whose chunk shuffle has RL >= *rl_floor*.

    Under eq. 4 a chunk shuffle's RL is U-shaped in the chunk size (a single group,
    shuffled locally, is a full shuffle), so the search walks down from *max_chunk*;
    *max_chunk* is what bounds memory and read size. Returns 1 (a full shuffle) when no
    chunk reaches the floor.
    """
    if n <= 1 or rl_floor <= 0:
        return max(1, min(max_chunk, n))
    g = 1 << (max(1, min(max_chunk, n)).bit_length() - 1)
    while g > 1:
        if rl_grouped(n, g, local_shuffle=True) >= rl_floor:
            return g
        g //= 2
    return 1


# ----------------------------------------------------------------- diagnostics


def mean_displacement(ids) -> float:
    """Mean |position - id| over N/3 (its expectation under a full shuffle): 0 = identity."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    if n <= 1:
        return 0.0
    d = np.abs(ids - np.arange(n, dtype=np.int64)).mean()
    return float(d / ((n * n - 1) / (3.0 * n)))


def batch_cooccurrence(order_a, order_b, batch_size: int) -> float:
    """How much more often than chance two samples share a batch in both orders.

    For every pair of samples in the same batch of *order_a*, the fraction also sharing
    a batch of *order_b*, divided by its value under independent shuffles,
    (B - 1) / (N - 1). ≈1: batches are freshly mixed; ≫1: batch compositions repeat
    across epochs (e.g. constant groups).
    """
    a = np.asarray(order_a, dtype=np.int64)
    b = np.asarray(order_b, dtype=np.int64)
    n = len(a)
    if n != len(b) or n < 2:
        raise ConfigError("orders must be permutations of the same samples (N >= 2)")
    ba = np.empty(n, dtype=np.int64)
    bb = np.empty(n, dtype=np.int64)
    ba[a] = np.arange(n) // batch_size
    bb[b] = np.arange(n) // batch_size
    _, cell = np.unique(ba * (n // batch_size + 1) + bb, return_counts=True)
    _, size_a = np.unique(ba, return_counts=True)
    both = float((cell * (cell - 1) // 2).sum())
    pairs = float((size_a * (size_a - 1) // 2).sum())
    if pairs == 0:
        return 0.0
    expected = (batch_size - 1) / (n - 1)
    return (both / pairs) / expected


def disk_order_correlation(ids) -> float:
    """Spearman rank correlation between delivery position and sample id (ids are in the
    order of the disk): 1 = file order, ~0 = no drift through the file (a full shuffle
    gives ~ +-1/sqrt(N))."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    if n < 2:
        return 0.0
    r = np.empty(n, dtype=np.float64)
    r[np.argsort(ids, kind="stable")] = np.arange(n, dtype=np.float64)
    pos = np.arange(n, dtype=np.float64)
    r -= r.mean()
    pos -= pos.mean()
    return float((r @ pos) / np.sqrt((r @ r) * (pos @ pos)))


def classes_per_batch(ids, labels, batch_size: int) -> float:
    """Mean number of distinct labels in consecutive batches of *batch_size* of *ids*
    (on class-sorted data: how well a batch mixes the classes)."""
    ids = np.asarray(ids, dtype=np.int64)
    labels = np.asarray(labels)
    if len(ids) == 0:
        return 0.0
    counts = [
        len(np.unique(labels[ids[a : a + batch_size]])) for a in range(0, len(ids), batch_size)
    ]
    return float(np.mean(counts))
