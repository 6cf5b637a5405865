# SPDX-License-Identifier: Apache-2.0
"""Exact resume: checkpoint at every step, resume bit-exactly, or at another world size.

Ranks of one job are simulated in one process (``LoaderWorld(rank, size)``): plans are
pure, so this is what each rank computes under MPI; tests/mpi/loader_resume.py repeats
the essentials under real mpiexec.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from loader_common import make_records

from feedline import Loader, StateError, StateMismatchError
from feedline.pipeline.world import LoaderWorld

N, B = 150, 16  # 10 steps, the last partial
PRESETS = ["feedline", "tf", "tf-pre", "async", "async-db"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return make_records(str(tmp_path_factory.mktemp("resume")), n=N, size=20, files=2)


def job(ds, data, P, preset, *, state=None, stop=None, epoch=0):
    """Run all P ranks; returns (per-step global id lists, per-step bytes, states at stop)."""
    steps: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    states = []
    for r in range(P):
        with Loader(ds, B, preset=preset, seed=9, comm=LoaderWorld(r, P), buffer=12) as ld:
            if state is not None:
                ld.load_state_dict(state)
            ld.set_epoch(epoch)
            for b in ld:
                np.testing.assert_array_equal(b.data, data[b.ids])
                steps.setdefault(b.step, {})[r] = (b.ids, b.data)
                if stop is not None and ld.step == stop:
                    states.append(ld.state_dict())
                    break
    order = sorted(steps)
    ids = [np.concatenate([steps[s][r][0] for r in range(P)]) for s in order]
    raw = [np.concatenate([steps[s][r][1] for r in range(P)]).tobytes() for s in order]
    return order, ids, raw, states


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("P", [1, 3])
def test_resume_at_every_step_is_bit_exact(records, preset, P):
    ds, data = records
    order, full_ids, full_raw, _ = job(ds, data, P, preset)
    assert order == list(range(10))
    for k in range(1, 11):
        _, _, _, states = job(ds, data, P, preset, stop=k)
        texts = {json.dumps(s, sort_keys=True) for s in states}
        assert len(texts) == 1, "every rank must hold the same state"
        state = states[0]
        assert len(json.dumps(state)) <= 4096 and state["step"] == k
        rest_order, rest_ids, rest_raw, _ = job(ds, data, P, preset, state=json.loads(texts.pop()))
        assert rest_order == list(range(k, 10))
        assert rest_raw == full_raw[k:]
        assert all(np.array_equal(a, b) for a, b in zip(rest_ids, full_ids[k:], strict=True))


@pytest.mark.parametrize("preset", ["feedline", "tf", "async-db"])
@pytest.mark.parametrize(("P", "Q"), [(1, 4), (3, 2), (4, 1)])
def test_resume_at_another_world_size_delivers_the_rest_once(records, preset, P, Q):
    ds, data = records
    _, full_ids, _, _ = job(ds, data, P, preset)
    for k in (1, 4, 9):
        _, _, _, states = job(ds, data, P, preset, stop=k)
        order, ids, _, _ = job(ds, data, Q, preset, state=states[0])
        assert order == list(range(k, 10))  # same step numbers, equal steps on all ranks
        got = np.concatenate(ids)
        assert sorted(got.tolist()) == sorted(np.concatenate(full_ids[k:]).tolist())
        assert len(got) == len(set(got.tolist()))


@pytest.mark.parametrize("preset", ["tf", "async"])
def test_chained_resumes_across_sizes(records, preset):
    """P=3 -> (step 2) Q=2 -> (step 5) R=4: a state from the middle of a re-cut epoch."""
    ds, data = records
    _, ids_a, _, s1 = job(ds, data, 3, preset, stop=2)
    _, ids_b, _, s2 = job(ds, data, 2, preset, state=s1[0], stop=5)
    assert s2[0]["chain"] == [[3, 1, 0], [2, 1, 2]]
    _, ids_c, _, _ = job(ds, data, 4, preset, state=s2[0])
    got = np.concatenate(ids_a + ids_b + ids_c)
    assert sorted(got.tolist()) == list(range(N))
    # and resuming the same state again (same size) replays the same batches
    _, ids_c2, _, _ = job(ds, data, 4, preset, state=s2[0])
    assert all(np.array_equal(a, b) for a, b in zip(ids_c, ids_c2, strict=True))


def test_state_at_epoch_end_then_next_epoch(records):
    ds, data = records
    _, _, _, states = job(ds, data, 2, "tf", stop=10)
    with Loader(ds, B, preset="tf", seed=9, comm=LoaderWorld(0, 1)) as ld:
        ld.load_state_dict(states[0])
        assert list(ld) == []  # nothing left of epoch 0
        ld.set_epoch(1)
        ids = np.concatenate([b.ids for b in ld])
    _, e1, _, _ = job(ds, data, 1, "tf", epoch=1)
    assert np.array_equal(ids, np.concatenate(e1))


def test_state_mid_iteration_counts_delivered_batches_only(records):
    ds, _ = records
    with Loader(ds, B, preset="feedline", prefetch_depth=4) as ld:
        it = iter(ld)
        next(it)
        next(it)
        assert ld.state_dict()["step"] == 2  # read-ahead batches are not consumed


def test_damaged_or_foreign_state_is_rejected(records, tmp_path):
    ds, data = records
    _, _, _, states = job(ds, data, 1, "tf", stop=3)
    good = states[0]
    ld = Loader(ds, B, preset="tf", seed=9)
    for bad in (
        {**good, "step": 4},  # edited: checksum no longer matches
        {k: v for k, v in good.items() if k != "checksum"},
        {**good, "kind": "other"},
        "not json",
        [1, 2],
    ):
        with pytest.raises(StateError):
            ld.load_state_dict(bad)
    with pytest.raises(StateError, match="global batch"):
        Loader(ds, B + 1, preset="tf", seed=9).load_state_dict(good)
    with pytest.raises(StateMismatchError, match="preset='tf'"):
        Loader(ds, B, preset="async", seed=9).load_state_dict(good)
    with pytest.raises(StateError, match="order"):  # even non-strict: another order
        Loader(ds, B, preset="async", seed=9).load_state_dict(good, strict=False)
    other, _ = make_records(str(tmp_path / "other"), n=N, size=20, files=2)
    with open(other.files[0], "r+b") as f:  # same shape, other bytes
        f.write(b"\xff" * 8)
    with pytest.raises(StateMismatchError, match="another dataset"):
        Loader(other, B, preset="tf", seed=9).load_state_dict(good)
    ld.load_state_dict(json.dumps(good))  # JSON text is accepted too
    assert ld.step == 3
    ld.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_records(str(tmp_path_factory.mktemp("prop")), n=61, size=8, files=2)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.integers(1, 25),
    P=st.integers(1, 4),
    Q=st.integers(1, 4),
    preset=st.sampled_from(PRESETS),
    frac=st.floats(0, 1),
    seed=st.integers(0, 3),
)
def test_property_resume_delivers_the_rest_exactly_once(small, batch, P, Q, preset, frac, seed):
    ds, data = small

    def run(size, state=None, stop=None):
        ids, states = [], []
        for r in range(size):
            with Loader(
                ds, batch, preset=preset, seed=seed, comm=LoaderWorld(r, size), buffer=7
            ) as ld:
                if state is not None:
                    ld.load_state_dict(state)
                for b in ld:
                    np.testing.assert_array_equal(b.data, data[b.ids])
                    ids.append((b.step, r, b.ids.tolist()))
                    if stop is not None and ld.step == stop:
                        states.append(ld.state_dict())
                        break
        return sorted(ids), states

    steps = -(-61 // batch)
    k = int(frac * steps)
    full, _ = run(P)
    if k == 0:
        return
    head, states = run(P, stop=k)
    assert head == [x for x in full if x[0] < k]
    rest, _ = run(Q, state=states[0])
    assert {x[0] for x in rest} <= set(range(k, steps))
    got = sorted(i for _, _, part in rest for i in part)
    assert got == sorted(i for s, _, part in full if s >= k for i in part)
    if Q == P:
        assert rest == [x for x in full if x[0] >= k]
