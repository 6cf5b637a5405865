# SPDX-License-Identifier: Apache-2.0
"""Saved loader states found by fuzzing (tests/fuzz_py.py state): well-sealed states whose
fields name an impossible world, or a world change after the state's own step, were
accepted by ``load_state_dict`` and failed only at the next step (``ConfigError`` from
the planner, a raw ``IndexError`` from the source). They are refused up front."""

from __future__ import annotations

import numpy as np
import pytest

import feedline
from feedline.errors import StateError
from feedline.pipeline import state as fstate


@pytest.fixture
def loader(tmp_path):
    p = tmp_path / "d.bin"
    p.write_bytes(np.arange(40 * 16, dtype=np.uint8).tobytes())
    ds = feedline.open_dataset(str(p), format="records", record_bytes=16, sidecar=False)
    with feedline.Loader(ds, 4, preset="tf", decode=False) as ld:
        yield ld


def _resealed(ld, **fields):
    body = {k: v for k, v in ld.state_dict().items() if k not in ("checksum", "kind", "version")}
    return fstate.seal({**body, **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {"chain": [[0, 0, 0]], "world_size": 0, "nodes": 0},  # fuzz crash-ab8f6b26
        {"nodes": 2},  # more nodes than ranks
        {"chain": [[2, 1, 0], [1, 1, 4]], "step": 0},  # world change after the step
        {"seed": -1},
        {"batch_size": 0},
        {"n": -5},
    ],
)
def test_impossible_sealed_state_is_refused(loader, fields):
    with pytest.raises(StateError):
        loader.load_state_dict(_resealed(loader, **fields))
    # the loader is still usable from the start
    assert sum(len(b.ids) for b in loader) == 40


def test_valid_resealed_state_still_resumes(loader):
    it = iter(loader)
    next(it)
    st = loader.state_dict()
    loader.load_state_dict(_resealed(loader, **{k: st[k] for k in ("step", "chain")}))
    assert sum(len(b.ids) for b in loader) == 36
