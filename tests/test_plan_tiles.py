# SPDX-License-Identifier: Apache-2.0
"""The column layout's byte-sized tiles (``Strategy.chunk_bytes``, docs/planner.md "Tiles")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.plan import FlatRecords, Strategy, WorldSpec, get_strategy, make_plan
from feedline.plan.assign_chunk import (
    MIN_REGIONS,
    NODE_COLUMNS,
    SUBTILE_COLUMNS,
    ColumnChunkStream,
    TiledColumnStream,
    tile_shape,
)
from feedline.plan.rl import randomization_level, rl_grouped

MiB = 1 << 20

#: the tiled column layout (the feedline preset before the cost model; still a strategy)
TILES = Strategy(
    assignment="chunk",
    chunk_layout="column",
    chunk_bytes=2 * MiB,
    readers_per_node=0,
    locate="index",
    read="odirect",
    coalesce_bytes=8 * MiB,
    coalesce_gap=64 << 10,
    prefetch_depth=2,
    rl_floor=0.9,
)


def _ops(plan):
    return [op for r in plan.readers for op in plan.reads(r)]


def test_feedline_reads_are_megabytes_not_groups():
    # the demo's shape: 20,000 x 3 KB records, B = 1024, 4 ranks on 2 nodes
    rec = FlatRecords(20_000, 3072)
    tiled = make_plan(rec, WorldSpec(4, 2), TILES, 0, 0, 1024)
    per_column = make_plan(rec, WorldSpec(4, 2), get_strategy(TILES, chunk_bytes=0), 0, 0, 1024)
    assert isinstance(tiled._stream, TiledColumnStream)
    assert isinstance(per_column._stream, ColumnChunkStream)
    ops, old = _ops(tiled), _ops(per_column)
    n_reads = sum(op.num_reads for op in ops)
    assert n_reads <= 40  # per-column groups of 4 samples: ~1,400 reads
    assert sum(op.num_reads for op in old) > 20 * n_reads
    # on a flat file little is read for nothing (only the last step's tile shared by the
    # two nodes is read by both; per-column groups read 2.3x the payload through holes)
    assert sum(op.payload for op in ops) == 20_000 * 3072
    assert sum(op.nbytes for op in ops) <= 1.01 * 20_000 * 3072
    assert sum(op.nbytes for op in old) > 2 * 20_000 * 3072
    # nearly every byte comes in reads of one or more whole tiles: 16 tiles per row of
    # 64 columns x 11 steps (2 MiB), the last row 64 x 8 (+ the short last step's own
    # row of 64-sample tiles)
    lens = [ln for op in ops for ln in op.lengths.tolist()]
    big = [ln for ln in lens if ln > 1 * MiB]
    assert min(big) >= 64 * 8 * 3072
    assert sum(big) >= 0.95 * sum(lens)
    assert sum(lens) / n_reads >= 1 * MiB


def test_a_node_reads_its_share_of_a_wide_tile_once():
    # with node aggregation (source="node"): 72 columns per node, blocks of 144 columns:
    # every tile spans two nodes, and each node's columns of it are whole sub-tiles, one
    # run of the file: nothing read twice
    rec = FlatRecords(50_000, 3072)
    agg = get_strategy(TILES, readers_per_node=None)
    tiled = make_plan(rec, WorldSpec(256, 32), agg, 0, 0, 2304)
    per_column = make_plan(
        rec, WorldSpec(256, 32), dataclasses.replace(agg, chunk_bytes=0), 0, 0, 2304
    )
    assert isinstance(tiled._stream, TiledColumnStream) and tiled._stream.m == 144
    ops = _ops(tiled)
    assert sum(op.nbytes for op in ops) == sum(op.payload for op in ops) == 50_000 * 3072
    # per node and row of tiles: ~2 reads of 72 columns x 11 steps (2.4 MB)
    assert sum(op.num_reads for op in ops) <= 4 * 32 * 2
    assert sum(op.num_reads for op in _ops(per_column)) > 20 * sum(op.num_reads for op in ops)


def test_per_rank_reads_of_a_wide_tile_pay_for_holes():
    # the default (every rank reads for itself): 9 columns per rank do not fill whole
    # sub-tiles of 8 columns, so runs joined over 64 KiB gaps read other ranks' bytes too;
    # this is the cost docs/loader.md ("Why feedline reads per rank") weighs against
    # aggregation -- bounded, and still reads of hundreds of KB, not groups
    rec = FlatRecords(50_000, 3072)
    direct = make_plan(rec, WorldSpec(256, 32), TILES, 0, 0, 2304)
    assert direct.readers == list(range(256))
    ops = _ops(direct)
    payload, nbytes = sum(op.payload for op in ops), sum(op.nbytes for op in ops)
    assert payload == 50_000 * 3072
    assert 1.2 * payload < nbytes < 2.0 * payload
    assert nbytes / sum(op.num_reads for op in ops) > 100_000


@pytest.mark.parametrize(
    "n, B, size",
    [(20_000, 1024, 3072), (5_000, 64, 3000), (200_000, 256, 110_000), (50_000, 4096, 600)],
)
def test_tile_shape_meets_bytes_regions_and_rl_floor(n, B, size):
    s = get_strategy(TILES)
    S = -(-n // B)
    g, nb = tile_shape(n, s, B, S, float(size))
    m = -(-B // nb)
    assert 1 <= g <= S and nb == min(MIN_REGIONS, B)
    # bytes: a node's share of a tile (NODE_COLUMNS columns or the whole block) reaches
    # chunk_bytes unless the epoch is too short (g = S)
    assert min(m, NODE_COLUMNS) * g * size >= s.chunk_bytes or g == S
    # RL of the unit of local shuffling, the sub-tile
    sub = min(m, SUBTILE_COLUMNS) * min(g, S)
    assert rl_grouped(n, sub, local_shuffle=True) >= s.rl_floor
    plan = make_plan(FlatRecords(n, size), WorldSpec(8, 2), s, 0, 0, B)
    assert plan._stream.tile == sub
    assert randomization_level(plan) >= s.rl_floor
    # a node's tiles are read once: its columns are whole sub-tiles
    ops = _ops(plan)
    assert sum(op.nbytes for op in ops) <= 1.01 * sum(op.payload for op in ops)


def test_rl_floor_grows_the_tile():
    # 110 KB records: 2 MiB is 20 samples; sub-tiles of 8 columns x 2 steps have an RL
    # under 0.9 at this n, so T doubles until the floor is met
    n, B, size = 20_000, 256, 110_000
    assert rl_grouped(n, 16, local_shuffle=True) < 0.9
    g, nb = tile_shape(n, get_strategy(TILES), B, -(-n // B), float(size))
    sub = min(-(-B // nb), SUBTILE_COLUMNS) * g
    assert sub > 16 and rl_grouped(n, sub, local_shuffle=True) >= 0.9


def test_count_only_plans_keep_per_column_groups():
    plan = make_plan(20_000, WorldSpec(4, 2), TILES, 0, 0, 1024)
    assert isinstance(plan._stream, ColumnChunkStream)


@given(
    n=st.integers(1, 3000),
    B=st.integers(1, 300),
    size=st.integers(1, 200_000),
    P=st.integers(1, 16),
    P2=st.integers(1, 16),
    mode=st.sampled_from(["exact", "drop", "circular"]),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_tiles_are_exactly_once_world_independent_and_resumable(
    n, B, size, P, P2, mode, seed, data
):
    s = get_strategy(TILES, chunk_bytes=data.draw(st.sampled_from([1, 4096, 4 * MiB])))
    s = s.replace(circular=mode == "circular")
    rec = FlatRecords(n, size)
    drop = mode == "drop"
    plan = make_plan(rec, WorldSpec(P, min(P, 2)), s, seed, 1, B, drop)
    order = plan.order()
    if mode == "circular":
        assert sorted(set(order.tolist())) == list(range(n))
    else:
        assert len(set(order.tolist())) == len(order) == (plan.num_steps * B if drop else n)
    other = make_plan(rec, WorldSpec(P2, 1), s, seed, 1, B, drop)
    assert np.array_equal(other.order(), order)
    step = data.draw(st.integers(0, plan.num_steps))
    new = plan.resume(step, WorldSpec(P2, 1))
    rest = [i for t in range(step, new.num_steps) for r in range(P2) for i in new.samples(r, t)]
    assert rest == plan.samples_after(step).tolist()


def test_a_node_reader_has_the_threads_of_the_ranks_it_reads_for():
    """A node reader keeps as many reads in flight as its ranks would reading for
    themselves (4 each), at most 32, never fewer than its own 4; the cost model prices
    node plans with that depth."""
    from feedline.plan.cost import NODE_READER_MAX_THREADS, StorageProfile, reader_threads

    assert reader_threads(4, 1) == 4
    assert reader_threads(4, 4) == 16
    assert reader_threads(4, 36) == NODE_READER_MAX_THREADS == 32
    assert reader_threads(64, 2) == 64  # a user's own larger count stands
    assert reader_threads(4, 0) == 4
    # on storage that loses bandwidth beyond server_streams, the job's readers share them
    collapse = StorageProfile("c", 3e-4, 1e9, 1e9, 2e9, 16, 16)
    assert collapse.contention == "collapse"
    assert reader_threads(4, 8, collapse, readers=2) == 8
    assert reader_threads(4, 8, collapse, readers=4) == 4
    assert reader_threads(4, 8, collapse, readers=64) == 4  # never fewer than its own
    assert reader_threads(4, 8, dataclasses.replace(collapse, contention="queue"), 4) == 32
