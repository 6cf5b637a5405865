# SPDX-License-Identifier: Apache-2.0
"""DeepIO randomization level: calibration against the paper and basic properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import feedline
from feedline.errors import ConfigError
from feedline.plan import epoch_order, get_strategy, make_plan
from feedline.plan.rl import (
    batch_cooccurrence,
    chunk_for_rl,
    mean_displacement,
    randomization_level,
    rl_grouped,
    rl_memory,
)

CALTECH_TRAIN = 7664  # ~85% of Caltech-101's 9,144 images (the paper's split)


def test_reproduces_deepio_section_3c():
    # §III-C: R = 0.5 -> 98.54 %, R = 0.25 -> 96.96 % (one image per "file")
    assert rl_memory(CALTECH_TRAIN, 0.5) == pytest.approx(0.9854, abs=5e-5)
    assert rl_memory(CALTECH_TRAIN, 0.25) == pytest.approx(0.9696, abs=5e-5)
    assert rl_memory(CALTECH_TRAIN, 1.0) == pytest.approx(1.0)


def test_reproduces_deepio_fig7_within_a_point():
    # Fig. 7: groups of 4 / 16 / 256 images in constant order -> 73 % / 49 % / 16 %
    for g, paper in ((4, 0.73), (16, 0.49), (256, 0.16)):
        assert rl_grouped(CALTECH_TRAIN, g) == pytest.approx(paper, abs=0.01)
    assert rl_grouped(CALTECH_TRAIN, 1) == pytest.approx(1.0)
    assert rl_grouped(CALTECH_TRAIN, CALTECH_TRAIN) == pytest.approx(0.0, abs=1e-12)


def test_rl_of_plans_strategies_and_sequences():
    n = 3000
    assert feedline.randomization_level is randomization_level
    assert randomization_level(make_plan(n, 4, "strided", batch_size=64)) == 0.0
    assert randomization_level(make_plan(n, 4, "tf", batch_size=64)) == 1.0
    assert randomization_level(
        "deepio-ordered", n=n, memory_fraction=0.25, chunk=1
    ) == pytest.approx(rl_memory(n, 0.25))
    chunked = randomization_level("async", n=n, chunk=16)
    assert 0.5 < chunked < 1.0
    # an observed order: the identity is constant, a shuffle nearly 1, constant groups match the model
    assert randomization_level(np.arange(n)) == 0.0
    assert randomization_level(epoch_order(n, "global", seed=3)) > 0.99
    groups = epoch_order(n // 16, "global", seed=3)
    seq = (groups[:, None] * 16 + np.arange(16)).ravel()
    assert randomization_level(seq) == pytest.approx(rl_grouped(len(seq), 16), abs=0.02)
    with pytest.raises(ConfigError):
        randomization_level("tf")


def test_rl_decreases_with_group_size_and_memory():
    vals = [rl_grouped(20000, g) for g in (1, 2, 8, 64, 512)]
    assert all(a > b for a, b in itertools.pairwise(vals))
    mem = [rl_memory(20000, r) for r in (1.0, 0.5, 0.25, 0.1)]
    assert all(a > b for a, b in itertools.pairwise(mem))


def test_chunk_for_rl_meets_the_floor():
    for n in (5000, 200_000):
        for floor in (0.85, 0.9, 0.95):
            g = chunk_for_rl(n, floor)
            assert g == 1 or rl_grouped(n, g, local_shuffle=True) >= floor
            assert g & (g - 1) == 0 and g <= 64
    s = get_strategy("feedline")
    plan = make_plan(50_000, 8, s, batch_size=256)
    assert randomization_level(plan) >= s.rl_floor


def test_diagnostics():
    n = 5000
    a = epoch_order(n, "global", seed=1, epoch=0)
    b = epoch_order(n, "global", seed=1, epoch=1)
    assert mean_displacement(np.arange(n)) == 0.0
    assert mean_displacement(a) == pytest.approx(1.0, abs=0.05)
    assert batch_cooccurrence(a, b, 50) == pytest.approx(1.0, abs=0.3)
    assert batch_cooccurrence(a, a, 50) == pytest.approx((n - 1) / 49)
    # strided batches repeat exactly every epoch
    assert batch_cooccurrence(np.arange(n), np.arange(n), 50) > 50
