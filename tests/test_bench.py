# SPDX-License-Identifier: Apache-2.0
"""The benchmark harness: digest, assignment, peers, limit, report and the CLI (one rank).

MPI launches are in test_bench_mpi.py."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

from feedline.errors import ConfigError
from feedline.plan import FlatRecords
from feedline.plan.layout import even_split
from feedline_tools.bench import limit, report
from feedline_tools.bench.digest import DeliveryRecorder, digest_of, gather_digest
from feedline_tools.bench.harness import RunSpec, add_common_arguments, exit_code, run_scenario
from feedline_tools.bench.readers import generate
from feedline_tools.bench.runners import (
    DatasetSpec,
    RunContext,
    Source,
    assignment,
    make_runner,
    records_index,
)
from feedline_tools.bench.worker import execute

REC = 96


def _expected_digest(path: str, record: int, batch: int, ranks: int, kind: str = "contiguous"):
    """Digest computed straight from the file bytes and the assignment definition."""
    with open(path, "rb") as f:
        data = f.read()
    n = len(data) // record
    deliveries = []
    for r in range(ranks):
        steps = []
        # the records (not just n): feedline's tiles are sized by the record length
        for s, ids in enumerate(assignment(kind, FlatRecords(n, record), batch, r, ranks)):
            raw = b"".join(data[i * record : (i + 1) * record] for i in ids)
            steps.append((s, ids, [record] * len(ids), raw))
        deliveries.append(steps)
    return digest_of(deliveries)


@pytest.fixture
def records(tmp_path):
    """A file of 1000 random records of 96 bytes (not a multiple of the batch)."""
    return generate(str(tmp_path / "data" / "r.bin"), 1000 * REC, REC, seed=3)


def _config(path, runs, *, batch=64, repeats=1, **kw):
    cfg = {
        "scenario": "t",
        "dataset": DatasetSpec(path, "records", {"record_bytes": REC}).to_json(),
        "runs": [{"name": n, "runner": r, "options": o, "params": {}} for n, r, o in runs],
        "batch_size": batch,
        "steps": None,
        "compute_ms": 0,
        "repeats": repeats,
        "limit": {"enabled": True, "block": 1 << 16},
        "digest": True,
    }
    cfg.update(kw)
    return cfg


# --------------------------------------------------------------------- digest


def test_digest_matches_the_definition_byte_by_byte():
    rng = np.random.default_rng(0)
    raws = [rng.integers(0, 256, 10, dtype=np.uint8).tobytes() for _ in range(3)]
    deliveries = [[(0, [5, 9], [4, 6], raws[0]), (1, [], [], b"")], [(0, [1], [10], raws[1])]]
    h = hashlib.sha256()
    h.update(struct.pack("<IQ", 0, 0))
    h.update(struct.pack("<QQ", 5, 4) + raws[0][:4] + struct.pack("<QQ", 9, 6) + raws[0][4:])
    h.update(struct.pack("<IQ", 0, 1))
    h.update(struct.pack("<IQ", 1, 0) + struct.pack("<QQ", 1, 10) + raws[1])
    assert digest_of(deliveries) == h.hexdigest()


@pytest.mark.parametrize("spill", [1 << 30, 50])
def test_recorder_stream_equals_direct_digest(spill):
    rng = np.random.default_rng(1)
    steps = []
    for s in range(5):
        lens = rng.integers(0, 40, 7)
        steps.append(
            (
                s,
                rng.integers(0, 10**9, 7),
                lens,
                rng.integers(0, 256, int(lens.sum()), dtype=np.uint8),
            )
        )
    rec = DeliveryRecorder(0, spill_bytes=spill)
    for s, ids, lens, raw in steps:
        rec.add(s, ids, lens, raw)
    assert rec.samples == 35 and rec.payload_bytes == sum(int(x[2].sum()) for x in steps)
    assert rec.seconds > 0
    assert gather_digest(rec, None) == digest_of([steps])
    rec.close()


def test_digest_changes_with_any_delivered_fact():
    base = [[(0, [1, 2], [2, 2], b"abcd")]]
    d0 = digest_of(base)
    assert digest_of([[(0, [1, 2], [2, 2], b"abce")]]) != d0  # bytes
    assert digest_of([[(0, [2, 1], [2, 2], b"abcd")]]) != d0  # ids
    assert digest_of([[(1, [1, 2], [2, 2], b"abcd")]]) != d0  # step
    assert digest_of([[(0, [1, 2], [1, 3], b"abcd")]]) != d0  # lengths
    assert digest_of([[], [(0, [1, 2], [2, 2], b"abcd")]]) != d0  # rank
    with pytest.raises(ValueError):
        digest_of([[(0, [1, 2], [2, 3], b"abcd")]])


# ----------------------------------------------------------------- assignment


@pytest.mark.parametrize("kind", ["contiguous", "strided"])
@pytest.mark.parametrize(
    ("n", "batch", "ranks"), [(1000, 64, 1), (1000, 64, 3), (7, 4, 5), (64, 64, 2)]
)
def test_assignment_is_exactly_once_with_equal_steps(kind, n, batch, ranks):
    per_rank = [assignment(kind, n, batch, r, ranks) for r in range(ranks)]
    steps = {len(s) for s in per_rank}
    assert steps == {-(-n // batch)}
    ids = np.concatenate([np.concatenate(s) for s in per_rank])
    assert np.array_equal(np.sort(ids), np.arange(n))
    for s in range(len(per_rank[0])):
        sizes = [len(per_rank[r][s]) for r in range(ranks)]
        if kind == "strided":
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_split_and_share_partition():
    for m, p in [(10, 3), (3, 5), (0, 2)]:
        parts = [even_split(m, p, i) for i in range(p)]
        assert parts[0][0] == 0 and parts[-1][1] == m
        assert all(parts[i][1] == parts[i + 1][0] for i in range(p - 1))
    for total, p in [(10_000, 3), (4096 * 5 + 7, 4), (100, 8)]:
        shares = [limit.share(total, r, p) for r in range(p)]
        assert sum(b - a for a, b in shares) == total
        assert all(a % 4096 == 0 for a, _ in shares)


# ---------------------------------------------------------------------- peers


def _deliver(path, runner, options, ranks=1, batch=64, kind="contiguous"):
    """Run *runner* for each rank in turn (no MPI) and return the digest."""
    recs = []
    for r in range(ranks):
        src = Source(DatasetSpec(path, "records", {"record_bytes": REC}))
        ctx = RunContext(
            rank=r,
            size=ranks,
            nodes=1,
            node=0,
            comm=None,
            source=src,
            batch_size=batch,
            assignment=kind,
        )
        run = make_runner(runner, options)
        run.prepare(ctx)
        rec = DeliveryRecorder(r)
        out = run.run(ctx, rec)
        run.close()
        assert out.storage_bytes >= rec.payload_bytes or runner == "torch"
        recs.append(b"".join(rec.chunks()))
    return hashlib.sha256(b"".join(recs)).hexdigest()


@pytest.mark.parametrize(
    ("runner", "options"),
    [
        ("seq", {"block": 4096}),
        ("seq", {"block": 1000}),
        ("seq", {}),
        ("pread", {}),
        ("mmap", {"block": 4096}),
        ("mmap", {"block": 100}),
        ("torch", {"workers": 0}),
    ],
)
@pytest.mark.parametrize("ranks", [1, 3])
def test_peers_deliver_the_file_exactly(records, runner, options, ranks):
    assert _deliver(records, runner, options, ranks) == _expected_digest(records, REC, 64, ranks)


@pytest.mark.parametrize("runner", ["pread", "mmap", "seq"])
def test_shuffled_orders_are_delivered_exactly(records, runner):
    got = _deliver(records, runner, {}, 2, kind="global")
    assert got == _expected_digest(records, REC, 64, 2, "global")
    assert got != _expected_digest(records, REC, 64, 2, "contiguous")
    ids = assignment("global", 1000, 64, 0, 2)
    assert not np.array_equal(np.concatenate(ids), np.sort(np.concatenate(ids)))


def test_strided_assignment_is_delivered_and_differs(records):
    strided = _deliver(records, "seq", {"block": 4096}, 2, kind="strided")
    assert strided == _expected_digest(records, REC, 64, 2, "strided")
    assert strided != _expected_digest(records, REC, 64, 2, "contiguous")


def test_digest_differs_when_the_data_differs(records, tmp_path):
    before = _deliver(records, "pread", {})
    with open(records, "r+b") as f:
        f.seek(500 * REC + 7)
        b = f.read(1)
        f.seek(500 * REC + 7)
        f.write(bytes([b[0] ^ 1]))
    assert _deliver(records, "pread", {}) != before


def test_torch_dataloader_with_worker_processes(records):
    pytest.importorskip("torch")
    assert _deliver(records, "torch", {"workers": 1}) == _expected_digest(records, REC, 64, 1)


@pytest.mark.parametrize("kind", ["contiguous", "skip"])
def test_lmdb_cursor_peer_walks_and_delivers_values(tmp_path, kind):
    lmdb = pytest.importorskip("lmdb")
    path = str(tmp_path / "db")
    rng = np.random.default_rng(5)
    values = [
        rng.integers(0, 256, int(rng.integers(10, 300)), dtype=np.uint8).tobytes()
        for _ in range(200)
    ]
    with lmdb.open(path, map_size=1 << 24) as env, env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(b"%08d" % i, v)
    src = Source(DatasetSpec(path, "lmdb"))
    deliveries = []
    seeks = []
    for r in range(2):
        ctx = RunContext(
            rank=r, size=2, nodes=1, node=0, comm=None, source=src, batch_size=32, assignment=kind
        )
        run = make_runner("lmdb")
        run.prepare(ctx)
        rec = DeliveryRecorder(r)
        out = run.run(ctx, rec)
        run.close()
        seeks.append(out.seek_s)
        deliveries.append(b"".join(rec.chunks()))
    expected = []
    for r in range(2):
        steps = assignment(kind, 200, 32, r, 2)
        expected.append(
            [
                (s, ids, [len(values[i]) for i in ids], b"".join(values[i] for i in ids))
                for s, ids in enumerate(steps)
            ]
        )
    assert hashlib.sha256(b"".join(deliveries)).hexdigest() == digest_of(expected)
    if kind == "contiguous":
        assert seeks[0] < seeks[1]  # rank 1 walks past rank 0's 100 records first
    assert any(f.endswith("data.mdb") for f in src.files)


def test_lmdb_index_peers_agree_with_liblmdb(tmp_path):
    """pread through feedline's LMDB index delivers what liblmdb's cursor delivers."""
    lmdb = pytest.importorskip("lmdb")
    pytest.importorskip("feedline.formats.lmdb")
    path = str(tmp_path / "db")
    rng = np.random.default_rng(6)
    with lmdb.open(path, map_size=1 << 26) as env, env.begin(write=True) as txn:
        for i in range(300):
            txn.put(b"%08d" % i, rng.integers(0, 256, 3000 + i % 7, dtype=np.uint8).tobytes())
    digests = set()
    for runner in ("lmdb", "pread", "mmap"):
        recs = []
        for r in range(2):
            src = Source(DatasetSpec(path, "lmdb"))
            ctx = RunContext(rank=r, size=2, nodes=1, node=0, comm=None, source=src, batch_size=40)
            run = make_runner(runner)
            run.prepare(ctx)
            rec = DeliveryRecorder(r)
            run.run(ctx, rec)
            run.close()
            src.close()
            recs.append(b"".join(rec.chunks()))
        digests.add(hashlib.sha256(b"".join(recs)).hexdigest())
    assert len(digests) == 1


def test_unknown_runner_and_bad_options_are_config_errors():
    with pytest.raises(ConfigError):
        make_runner("nope")
    with pytest.raises(ConfigError):
        make_runner("seq", {"blok": 4})
    with pytest.raises(ConfigError):
        make_runner("seq:arg")


def test_records_index_layout(tmp_path):
    p = tmp_path / "h.bin"
    p.write_bytes(b"H" * 16 + bytes(range(100)) * 3 + b"x")
    idx = records_index([str(p)], record_bytes=100, header_bytes=16)
    assert len(idx) == 3 and idx.offsets.tolist() == [16, 116, 216]


# ---------------------------------------------------------------------- limit


@pytest.mark.parametrize("direct", [True, False])
def test_limit_reads_every_byte_once_across_ranks(records, direct):
    size = os.path.getsize(records)
    parts = [
        limit.read_share([records, records], r, 3, block=8192, direct=direct) for r in range(3)
    ]
    assert sum(p.bytes for p in parts) == 2 * size
    assert all(p.method == ("odirect" if direct else "buffered") for p in parts)


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_evict_leaves_no_page_cached(records):
    def resident():
        out = subprocess.run(
            ["fincore", "-nb", "-o", "RES", records], capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[0])

    with open(records, "rb") as f:
        f.read()
    assert resident() > 0
    assert limit.evict([records]) == 1
    assert resident() == 0


# ---------------------------------------------------------- worker and report


def test_document_schema_and_figures(records):
    jsonschema = pytest.importorskip("jsonschema")
    cfg = _config(
        records,
        [("pread", "pread", {}), ("seq", "seq", {"block": 1 << 15})],
        repeats=2,
        baseline="pread",
        compute_ms=1,
    )
    doc = execute(cfg)
    jsonschema.validate(doc, report.SCHEMA)
    report.validate(doc)
    json.dumps(doc, allow_nan=False)
    assert doc["limit_MBps"] > 0 and doc["limit"]["method"] == "odirect"
    digests = {r["digest"] for r in doc["runs"]}
    assert digests == {_expected_digest(records, REC, 64, 1)}
    for r in doc["runs"]:
        assert r["payload_bytes"] == 1000 * REC and r["ranks"] == 1 and r["nodes"] == 1
        assert len(r["times_s"]) == 2 and r["digests_agree"]
        assert r["MBps"] == pytest.approx(r["payload_bytes"] / r["time_s"] / 1e6)
        assert r["fraction_of_limit"] == pytest.approx(r["MBps"] / doc["limit_MBps"])
        # 16 steps of 1 ms emulated compute are inside the time, not in the exposed I/O
        assert r["time_s"] > 0.016 > r["exposed_io_s"] > 0
        assert r["stats"]["storage_bytes"][0] >= r["payload_bytes"]
        assert r["stats"]["peak_rss_bytes"][0] > 1 << 20
    base, seq = doc["runs"]
    assert base["ratio_to_baseline"] == 1.0
    assert seq["ratio_to_baseline"] == pytest.approx(seq["MBps"] / base["MBps"])
    assert base["stats"]["storage_ops"][0] == 1000  # one pread per sample
    assert seq["stats"]["storage_ops"][0] == -(-1000 * REC // (1 << 15))
    table = report.markdown_table(doc)
    assert table.count("\n| ") == 3 and base["digest"][:12] in table


def test_loader_presets_deliver_what_peers_with_their_order_deliver(records):
    pytest.importorskip("feedline.loader")
    pairs = [("contiguous", "seq"), ("lmdb", "seq"), ("tf", "pread"), ("feedline", "pread")]
    runs = []
    for preset, peer in pairs:
        runs.append({"name": f"loader:{preset}", "runner": f"loader:{preset}"})
        runs.append({"name": f"{peer}:{preset}", "runner": peer, "assignment": preset})
    cfg = _config(records, [], limit={"enabled": False})
    cfg["runs"] = runs
    doc = execute(cfg)
    by = {r["name"]: r for r in doc["runs"]}
    for preset, peer in pairs:
        lo, pe = by[f"loader:{preset}"], by[f"{peer}:{preset}"]
        assert lo["error"] is None, lo["error"]
        assert lo["digest"] == pe["digest"] == _expected_digest(records, REC, 64, 1, preset)
        assert lo["payload_bytes"] == 1000 * REC
        assert lo["stats"]["storage_bytes"][0] >= 1000 * REC  # from loader.stats()
        assert lo["stats"]["extra"][0]["preset"] == preset
    assert by["loader:tf"]["digest"] != by["loader:contiguous"]["digest"]
    if by["loader:tf"]["rl"] is not None:  # the planner's RL is available
        assert by["loader:tf"]["rl"] == by["pread:tf"]["rl"] > 0.9
        assert by["loader:contiguous"]["rl"] == by["seq:contiguous"]["rl"] < 0.1


def test_failing_run_is_reported_not_fatal(records):
    doc = execute(_config(records, [("ok", "pread", {}), ("bad", "seq", {"block": 0})]))
    ok, bad = doc["runs"]
    assert ok["error"] is None and ok["digest"] is not None
    assert "block" in bad["error"] and bad["time_s"] is None and bad["digest"] is None
    assert exit_code(doc) == 1
    report.validate(doc)


def test_plots_only_what_the_data_supports(records, tmp_path):
    doc = execute(
        _config(
            records,
            [
                ("mmap-4K", "mmap", {"block": 4096}),
                ("pread-4K", "seq", {"block": 4096}),
                ("mmap-64K", "mmap", {"block": 65536}),
                ("pread-64K", "seq", {"block": 65536}),
            ],
        )
    )
    for r in doc["runs"]:
        method, bs = r["name"].split("-")
        r["params"] = {"method": method, "block_bytes": 4096 if bs == "4K" else 65536}
    made = report.write_plots(doc, str(tmp_path / "plots"))
    names = sorted(os.path.basename(p) for p in made)
    assert names == sorted(
        f"t-{k}.png" for k in ("time", "breakdown", "ctx_switches", "exposed_io", "block_size")
    )
    for p in made:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for r in doc["runs"]:
        r["rl"] = None
    assert report.plot_rl(doc, str(tmp_path / "rl.png")) is None
    doc["runs"][0]["rl"] = 0.5
    assert report.plot_rl(doc, str(tmp_path / "rl.png"))
    for r in doc["runs"]:
        r["params"] = {}
    assert report.plot_block_size(doc, str(tmp_path / "bs.png")) is None


def _args(tmp_path, *argv):
    p = argparse.ArgumentParser()
    add_common_arguments(p)
    return p.parse_args(["--out", str(tmp_path / "out"), *argv])


def test_run_scenario_in_process_writes_artefacts(records, tmp_path, capsys):
    args = _args(
        tmp_path, "--quick", "--plots", "--json", str(tmp_path / "r.json"), "--baseline", "b"
    )
    runs = [RunSpec("a", "pread"), RunSpec("b", "mmap", {"block": 8192}, {"method": "mmap"})]
    doc = run_scenario(
        "mini",
        runs,
        lambda: DatasetSpec(records, "records", {"record_bytes": REC}),
        args,
        batch_size=100,
    )
    assert doc["baseline"] == "b" and doc["runs"][1]["ratio_to_baseline"] == 1.0
    assert doc["runs"][0]["digest"] == _expected_digest(records, REC, 100, 1)
    with open(tmp_path / "r.json") as f:
        on_disk = json.load(f)
    assert on_disk["runs"][0]["digest"] == doc["runs"][0]["digest"]
    out = sorted(os.listdir(tmp_path / "out"))
    assert "mini.md" in out and "mini-time.png" in out
    assert re.search(r"\| a \| - \| (no|-) \| 1 \| 1 \|", capsys.readouterr().out)
    with pytest.raises(ConfigError):
        run_scenario(
            "mini", runs, DatasetSpec(records), _args(tmp_path, "--baseline", "zz"), batch_size=4
        )
    with pytest.raises(ConfigError):  # more nodes than ranks
        run_scenario(
            "mini", runs, DatasetSpec(records), _args(tmp_path, "--nodes", "2"), batch_size=4
        )


def test_cli_readers_quick_one_rank(tmp_path):
    from feedline.cli import main

    j = tmp_path / "readers.json"
    rc = main(
        [
            "bench",
            "readers",
            "--quick",
            "--plots",
            "--out",
            str(tmp_path / "o"),
            "--json",
            str(j),
            "--path",
            str(tmp_path / "d" / "r.bin"),
        ]
    )
    assert rc == 0
    with open(j) as f:
        doc = json.load(f)
    assert [r["name"] for r in doc["runs"]] == [
        "mmap-4K",
        "pread-4K",
        "mmap-64K",
        "pread-64K",
        "per-sample",
    ]
    assert len({r["digest"] for r in doc["runs"]}) == 1
    assert doc["runs"][0]["digest"] == _expected_digest(
        str(tmp_path / "d" / "r.bin"), 3072, 1024, 1
    )
    assert os.path.exists(tmp_path / "o" / "readers-block_size.png")
