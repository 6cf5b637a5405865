# SPDX-License-Identifier: Apache-2.0
"""The FUSE storage emulator: node views, page caches, the cost model, accounting,
control files, start/stop, and its refusal when it cannot run.

These mount real FUSE file systems (``feedline-fuse``); they run where /dev/fuse is
usable and the binary was built, and are skipped otherwise. Files and modelled costs are
small so the default tier stays fast.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import statistics
import time

import numpy as np
import pytest

from feedline.cli import main as cli_main
from feedline.errors import ConfigError
from feedline_tools.emulate import Emulator, EmulatorParams, EmulatorUnavailable, check_available
from feedline_tools.emulate.mount import EXIT_UNAVAILABLE, is_mounted, log_path_for

KiB = 1024
MiB = 1 << 20


def _fuse_ok() -> str | None:
    try:
        check_available()
    except EmulatorUnavailable as e:
        return str(e)
    return None


_why_not = _fuse_ok()
needs_fuse = pytest.mark.skipif(_why_not is not None, reason=f"emulator unavailable: {_why_not}")
fuse = [pytest.mark.fuse, needs_fuse]

# Small modelled costs: tests are about behaviour, not about waiting.
FAST = EmulatorParams(
    latency_us=150,
    node_mbps=2000,
    aggregate_mbps=4000,
    server_mbps=2000,
    seek_us=300,
    log_requests=100000,
)


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    rng = np.random.default_rng(7)
    (d / "a.bin").write_bytes(rng.integers(0, 256, 3 * MiB + 1234, dtype=np.uint8).tobytes())
    (d / "sub").mkdir()
    (d / "sub" / "small.txt").write_text("hello emulator\n")
    return d


@pytest.fixture
def emu(src, tmp_path):
    with Emulator(src, tmp_path / "mnt", nodes=3, params=FAST) as e:
        yield e


def _read_all(path, bufsize=256 * KiB) -> bytes:
    with open(path, "rb", buffering=0) as f:
        chunks = []
        while chunk := f.read(bufsize):
            chunks.append(chunk)
    return b"".join(chunks)


def _requests_of(emu, node=None):
    return [r for r in emu.requests() if node is None or r["node"] == node]


# -- views, bytes, read-only ------------------------------------------------------------


@pytest.mark.fuse
@needs_fuse
def test_views_list_and_read_the_source(emu, src):
    root = os.listdir(emu.mountpoint)
    assert {"node0", "node1", "node2"} <= set(root)
    for i in range(3):
        view = emu.node_path(i)
        assert sorted(os.listdir(view)) == sorted(os.listdir(src))
        assert _read_all(view / "a.bin") == (src / "a.bin").read_bytes()
        assert (view / "sub" / "small.txt").read_text() == "hello emulator\n"
        assert os.stat(view / "a.bin").st_size == os.stat(src / "a.bin").st_size
    # distinct inodes per node view: that is what separates the page caches
    inos = {os.stat(emu.node_path(i) / "a.bin").st_ino for i in range(3)}
    assert len(inos) == 3
    with pytest.raises(ConfigError):
        emu.node_path(3)


@pytest.mark.fuse
@needs_fuse
def test_views_are_read_only(emu, src):
    view = emu.node_path(0)
    for attempt in (
        lambda: os.open(view / "new.bin", os.O_WRONLY | os.O_CREAT, 0o644),
        lambda: os.open(view / "a.bin", os.O_RDWR),
        lambda: os.mkdir(view / "d"),
        lambda: os.unlink(view / "a.bin"),
        lambda: os.rename(view / "a.bin", view / "b.bin"),
    ):
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS
    assert (src / "a.bin").exists() and not (src / "new.bin").exists()


# -- page caches ------------------------------------------------------------------------


@pytest.mark.fuse
@needs_fuse
def test_node_views_have_separate_page_caches(emu, src):
    expect = (src / "a.bin").read_bytes()
    emu.reset_stats()
    assert _read_all(emu.node_path(0) / "a.bin") == expect
    first = emu.stats()
    assert first["per_node"][0]["requests"] > 0
    assert first["per_node"][0]["bytes"] >= len(expect)

    # the same node again: served from its page cache, no request reaches the storage
    assert _read_all(emu.node_path(0) / "a.bin") == expect
    again = emu.stats()
    assert again["per_node"][0]["requests"] == first["per_node"][0]["requests"]

    # another node: its own cold cache, so its own requests
    assert _read_all(emu.node_path(1) / "a.bin") == expect
    other = emu.stats()
    assert other["per_node"][1]["requests"] > 0
    assert other["per_node"][1]["bytes"] >= len(expect)
    assert other["per_node"][0]["requests"] == first["per_node"][0]["requests"]
    assert {r["node"] for r in emu.requests()} == {0, 1}


@pytest.mark.fuse
@needs_fuse
def test_two_opens_on_one_node_share_its_cache(emu, src):
    path = emu.node_path(2) / "a.bin"
    emu.reset_stats()
    with open(path, "rb") as held:  # stays open while a second open reads
        assert held.read() == (src / "a.bin").read_bytes()
        n = emu.stats()["requests"]
        assert n > 0
        with open(path, "rb") as second:
            assert second.read() == (src / "a.bin").read_bytes()
        assert emu.stats()["requests"] == n
    # and after every open was closed (keep_cache)
    assert _read_all(path) == (src / "a.bin").read_bytes()
    assert emu.stats()["requests"] == n


@pytest.mark.fuse
@needs_fuse
def test_drop_caches_makes_reads_cold_per_node(emu, src):
    for node in (0, 1):
        _read_all(emu.node_path(node) / "a.bin")
    emu.reset_stats()
    emu.drop_caches(1)
    _read_all(emu.node_path(0) / "a.bin")
    assert emu.stats()["per_node"][0]["requests"] == 0  # node 0 untouched
    _read_all(emu.node_path(1) / "a.bin")
    assert emu.stats()["per_node"][1]["requests"] > 0
    emu.drop_caches()
    emu.reset_stats()
    _read_all(emu.node_path(0) / "a.bin")
    assert emu.stats()["per_node"][0]["requests"] > 0


# -- cost model and accounting -----------------------------------------------------------


def _expected_costs(
    p: EmulatorParams, file_size: int, block: int, first_server_seen=()
) -> list[float]:
    """Independent re-derivation of the model for one synchronous sequential reader on
    an idle system: every request finds idle queues, so its cost is latency plus the
    slowest of its chunks at their servers and its bytes on the node and aggregate
    links; a chunk seeks on the first visit of its server for this file."""
    stripe = p.stripe_kib * KiB
    count = p.stripe_count or p.servers
    seen = set(first_server_seen)
    costs = []
    for off in range(0, file_size, block):
        n = min(block, file_size - off)
        slowest = 0.0
        pos = off
        while pos < off + n:
            k = pos // stripe
            end = min(off + n, (k + 1) * stripe)
            server = k % count  # relative to the file's first server
            seek = 0.0 if server in seen else p.seek_us * 1e-6
            seen.add(server)
            slowest = max(slowest, seek + (end - pos) / (p.server_mbps * 1e6))
            pos = end
        links = max(n / (p.node_mbps * 1e6), n / (p.aggregate_mbps * 1e6))
        costs.append(p.latency_us * 1e-6 + max(slowest, links))
    return costs


@pytest.mark.fuse
@needs_fuse
def test_every_request_pays_its_modelled_cost(src, tmp_path):
    # 64 KiB stripes over 4 servers, 256 KiB direct reads: each request spans all four
    # servers in parallel; the server (not the link) is the bottleneck.
    params = EmulatorParams(
        latency_us=1000,
        node_mbps=1500,
        aggregate_mbps=3000,
        server_mbps=300,
        servers=4,
        stripe_kib=64,
        seek_us=500,
        server_concurrency=2,
    )
    size = (src / "a.bin").stat().st_size
    block = 256 * KiB
    with Emulator(src, tmp_path / "mnt", nodes=2, params=params) as emu:
        for node in (0, 1):
            emu.reset_stats()
            emu.reset_model()  # idle queues and no stream positions: the derivation's premise
            buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
            fd = os.open(emu.node_path(node) / "a.bin", os.O_RDONLY | os.O_DIRECT)
            got = bytearray()
            t0 = time.perf_counter()
            try:
                for off in range(0, size, block):
                    n = os.preadv(fd, [buf], off)
                    got += buf[:n]
            finally:
                os.close(fd)
            wall = time.perf_counter() - t0
            assert bytes(got) == (src / "a.bin").read_bytes()

            reqs = _requests_of(emu)
            assert all(r["node"] == node and r["direct"] for r in reqs)
            assert [r["offset"] for r in reqs] == list(range(0, size, block))
            expect = _expected_costs(params, size, block)
            for r, want in zip(reqs, expect, strict=True):
                assert r["modelled_s"] == pytest.approx(want, rel=1e-6, abs=1e-8)
                # paid: the reply completed no earlier than the modelled deadline (the
                # daemon starts the reply's copy early by a conservative estimate of its
                # duration; allow timer granularity)
                assert r["service_s"] >= r["modelled_s"] - 50e-6
            stats = emu.stats()
            assert stats["requests"] == len(reqs)
            assert stats["bytes"] == size
            assert stats["seeks"] == params.servers  # one per server, then sequential
            assert stats["direct_requests"] == len(reqs)
            assert stats["per_node"][node]["requests"] == len(reqs)
            # wall time follows the model: never faster, and not much slower (a wide
            # tolerance, for a shared 2-core machine)
            modelled = sum(expect)
            assert wall >= 0.95 * modelled
            assert wall <= 3.0 * modelled + 0.1


@pytest.mark.fuse
@needs_fuse
def test_random_reads_seek_and_servers_queue(src, tmp_path):
    params = EmulatorParams(
        latency_us=100,
        node_mbps=4000,
        aggregate_mbps=8000,
        server_mbps=4000,
        servers=1,
        stripe_kib=1024,
        seek_us=2000,
        server_concurrency=1,
    )
    with Emulator(src, tmp_path / "mnt", nodes=1, params=params) as emu:
        buf = mmap.mmap(-1, 4 * KiB)
        fd = os.open(emu.node_path(0) / "a.bin", os.O_RDONLY | os.O_DIRECT)
        try:
            emu.reset_stats()
            for off in (2 * MiB, 0, 1 * MiB, 12 * KiB):  # never continuing the previous one
                os.preadv(fd, [buf], off)
            assert emu.stats()["seeks"] == 4
            assert all(r["modelled_s"] >= 2000e-6 for r in emu.requests())
            emu.reset_stats()
            for off in range(100 * KiB, 116 * KiB, 4 * KiB):  # sequential after the first
                os.preadv(fd, [buf], off)
            assert emu.stats()["seeks"] == 1
        finally:
            os.close(fd)
        # two threads on one server with concurrency 1: the second request queues
        emu.reset_stats()
        emu.reset_model()
        import threading

        def read_at(off):
            b = mmap.mmap(-1, 64 * KiB)
            f = os.open(emu.node_path(0) / "a.bin", os.O_RDONLY | os.O_DIRECT)
            try:
                os.preadv(f, [b], off)
            finally:
                os.close(f)

        threads = [threading.Thread(target=read_at, args=(o,)) for o in (0, 2 * MiB)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reqs = sorted(emu.requests(), key=lambda r: r["arrival_s"])
        assert len(reqs) == 2
        # the later arrival waited for the first to leave the server (unless the two
        # arrived so far apart that the first was already done)
        a, b = reqs
        if b["arrival_s"] < a["arrival_s"] + a["modelled_s"] - params.latency_us * 1e-6:
            assert b["modelled_s"] > a["modelled_s"]


@pytest.mark.fuse
@needs_fuse
def test_nodes_share_the_aggregate_link(src, tmp_path):
    import threading

    # links, not servers, are the bottleneck: 150 MB/s per node and for all nodes together
    params = EmulatorParams(
        latency_us=50,
        node_mbps=150,
        aggregate_mbps=150,
        server_mbps=10000,
        seek_us=0,
        server_concurrency=64,
    )
    size = (src / "a.bin").stat().st_size
    block = 256 * KiB

    start = threading.Barrier(2)

    def reader(node, barrier=None):
        b = mmap.mmap(-1, block)
        if barrier is not None:
            barrier.wait()
        fd = os.open(emu.node_path(node) / "a.bin", os.O_RDONLY | os.O_DIRECT)
        try:
            for off in range(0, size, block):
                os.preadv(fd, [b], off)
        finally:
            os.close(fd)

    with Emulator(src, tmp_path / "mnt", nodes=2, params=params) as emu:
        reader(0)  # alone: one node's link
        alone = emu.requests()
        emu.reset_stats()
        emu.reset_model()
        threads = [threading.Thread(target=reader, args=(n, start)) for n in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        both = emu.requests()

    def span(rs):
        return max(r["arrival_s"] + r["modelled_s"] for r in rs) - min(r["arrival_s"] for r in rs)

    def mean_cost(rs):
        return statistics.mean(r["modelled_s"] for r in rs)

    rate = params.aggregate_mbps * 1e6
    assert span(alone) >= 0.95 * size / rate
    # two nodes together move twice the bytes through the same aggregate bucket, so
    # their requests queue there: each costs about twice as much as alone
    assert sum(r["size"] for r in both) == 2 * size
    assert {r["node"] for r in both} == {0, 1}
    assert span(both) >= 0.95 * 2 * size / rate
    assert mean_cost(both) >= 1.3 * mean_cost(alone)


@pytest.mark.fuse
@needs_fuse
def test_stats_reset_and_request_log(emu, src):
    _read_all(emu.node_path(0) / "a.bin")
    s = emu.stats()
    assert s["requests"] > 0 and s["bytes"] > 0 and s["modelled_s"] > 0
    assert s["service_s"] >= s["modelled_s"] * 0.9
    assert s["nodes"] == 3 and s["params"]["latency_us"] == FAST.latency_us
    assert s["requests_logged"] == s["requests"] and s["requests_dropped"] == 0
    assert {r["file"] for r in emu.requests()} == {"a.bin"}
    emu.reset_stats()
    s = emu.stats()
    assert s["requests"] == 0 and s["bytes"] == 0 and s["per_node"][0]["requests"] == 0
    assert emu.requests() == []
    # unknown commands are refused, not ignored
    with pytest.raises(OSError) as info:
        emu._control("frobnicate")
    assert info.value.errno == errno.EINVAL


# -- real readers: mmap (liblmdb, numpy), h5py --------------------------------------------


@pytest.mark.fuse
@needs_fuse
def test_liblmdb_numpy_memmap_and_h5py_read_through_views(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    h5py = pytest.importorskip("h5py")
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    items = {
        b"%06d" % i: rng.integers(0, 256, 3000 + i % 97, dtype=np.uint8).tobytes()
        for i in range(300)
    }
    env = lmdb.open(str(src / "db"), map_size=64 * MiB)
    with env.begin(write=True) as txn:
        for k, v in items.items():
            txn.put(k, v)
    env.close()
    arr = rng.standard_normal((64, 32, 16)).astype(np.float32)
    with h5py.File(src / "x.h5", "w") as f:
        f.create_dataset("x", data=arr)
        f.create_dataset("y", data=np.arange(64))
    np.save(src / "m.npy", arr)

    with Emulator(src, tmp_path / "mnt", nodes=2, params=FAST) as emu:
        for node in (0, 1):
            view = emu.node_path(node)
            env = lmdb.open(str(view / "db"), readonly=True, lock=False)  # mmap reads
            try:
                with env.begin() as txn:
                    got = {bytes(k): bytes(v) for k, v in txn.cursor()}
            finally:
                env.close()
            assert got == items
            with h5py.File(view / "x.h5", "r") as f:
                np.testing.assert_array_equal(f["x"][:], arr)
                np.testing.assert_array_equal(f["y"][:], np.arange(64))
            mm = np.load(view / "m.npy", mmap_mode="r")
            np.testing.assert_array_equal(mm, arr)
            del mm
        per_node = emu.stats()["per_node"]
        assert per_node[0]["requests"] > 0 and per_node[1]["requests"] > 0
        assert {r["file"] for r in emu.requests()} >= {"db/data.mdb", "x.h5", "m.npy"}


@pytest.mark.fuse
@needs_fuse
def test_open_dataset_through_a_view_keeps_its_sidecar_elsewhere(tmp_path, monkeypatch):
    from feedline import open_dataset

    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    arr = np.arange(500 * 12, dtype=np.float32).reshape(500, 12)
    np.save(src / "x.npy", arr)
    with Emulator(src, tmp_path / "mnt", nodes=2, params=FAST) as emu:
        template = emu.node_template  # "MNT/node{node}", as FEEDLINE_NODES jobs use it
        ds = open_dataset(os.path.join(template.replace("{node}", "1"), "x.npy"))
        assert len(ds) == 500
        for i in (0, 7, 499):
            assert ds.read(i) == arr[i].tobytes()
        per_node = emu.stats()["per_node"]
        assert per_node[1]["requests"] > 0 and per_node[0]["requests"] == 0
    assert sorted(os.listdir(src)) == ["x.npy"]  # nothing written into the source


# -- start, stop, attach, CLI -------------------------------------------------------------


@pytest.mark.fuse
@needs_fuse
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(src, tmp_path, sig):
    emu = Emulator(src, tmp_path / "mnt", nodes=1, params=FAST).start()
    assert is_mounted(emu.mountpoint)
    os.kill(emu.pid, sig)
    assert emu.wait(timeout=10) == 0  # a clean exit, not a crash
    assert not is_mounted(emu.mountpoint)
    emu.stop()  # idempotent
    assert os.listdir(emu.mountpoint) == []


@pytest.mark.fuse
@needs_fuse
def test_daemon_exits_when_its_owner_dies_without_stopping_it(src, tmp_path):
    import subprocess
    import sys

    mnt = tmp_path / "mnt"
    code = (
        "import os, sys\n"
        "from feedline_tools.emulate import Emulator\n"
        f"e = Emulator({str(src)!r}, {str(mnt)!r}, nodes=1).start()\n"
        "print(e.pid, flush=True)\n"
        "os._exit(0)  # no stop(), no atexit\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while is_mounted(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_mounted(mnt)
    while time.monotonic() < deadline:  # gone (reaped by init, or a zombie at most)
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the daemon outlived its owner")
    os.unlink(log_path_for(mnt))  # an owner that dies leaves only its log


@pytest.mark.fuse
@needs_fuse
def test_down_detaches_the_mount_of_a_dead_daemon(src, tmp_path):
    emu = Emulator(src, tmp_path / "mnt", nodes=1, params=FAST).start()
    os.kill(emu.pid, signal.SIGKILL)
    assert emu.wait(timeout=10) == -signal.SIGKILL
    assert is_mounted(emu.mountpoint)  # a dead mount: ENOTCONN for everyone
    with pytest.raises(OSError):
        os.listdir(emu.mountpoint)
    assert cli_main(["emulate", "down", emu.mountpoint]) == 0
    assert not is_mounted(emu.mountpoint)
    emu.stop()


@pytest.mark.fuse
@needs_fuse
def test_stop_with_a_file_open_does_not_hang(src, tmp_path):
    emu = Emulator(src, tmp_path / "mnt", nodes=2, params=FAST).start()
    with open(emu.node_path(1) / "a.bin", "rb") as f:
        f.read(1000)
        t0 = time.monotonic()
        emu.stop(timeout=10)  # the daemon detaches the busy mount
        assert time.monotonic() - t0 < 10
        assert not is_mounted(emu.mountpoint)
    # a new emulator can mount at the same place
    with Emulator(src, tmp_path / "mnt", nodes=1, params=FAST) as again:
        assert _read_all(again.node_path(0) / "sub" / "small.txt") == b"hello emulator\n"


@pytest.mark.fuse
@needs_fuse
def test_cli_up_stats_drop_down(src, tmp_path, capsys):
    mnt = tmp_path / "mnt"
    cfg = tmp_path / "emu.toml"
    cfg.write_text("[emulator]\nlatency_us = 120\nseek-us = 250\nservers = 2\n")
    rc = cli_main(
        [
            "emulate",
            "up",
            str(src),
            str(mnt),
            "--nodes",
            "2",
            "--config",
            str(cfg),
            "--latency-us",
            "90",
        ]
    )
    assert rc == 0
    try:
        assert is_mounted(mnt)
        emu = Emulator.attach(mnt / "node1")
        assert emu.mountpoint == str(mnt) and emu.nodes == 2
        assert emu.params.latency_us == 90  # command line beats the config file
        assert emu.params.seek_us == 250 and emu.params.servers == 2
        _read_all(mnt / "node1" / "a.bin")
        capsys.readouterr()
        assert cli_main(["emulate", "stats", str(mnt)]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["per_node"][1]["requests"] > 0
        assert cli_main(["emulate", "drop", str(mnt), "--node", "1"]) == 0
        assert cli_main(["emulate", "reset", str(mnt)]) == 0
        assert Emulator.attach(mnt).stats()["requests"] == 0
    finally:
        rc = cli_main(["emulate", "down", str(mnt)])
    assert rc == 0
    assert not is_mounted(mnt)


@pytest.mark.fuse
@needs_fuse
def test_refuses_busy_or_bad_mount_points(src, tmp_path, emu):
    with pytest.raises(ConfigError):
        Emulator(src, emu.mountpoint, nodes=1).start()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ConfigError):
        Emulator(src, busy, nodes=1).start()
    with pytest.raises(ConfigError):
        Emulator(tmp_path / "missing", tmp_path / "m2", nodes=1).start()


# -- parameters and refusal (no FUSE needed) ----------------------------------------------


def test_params_validation_and_config_files(tmp_path):
    p = EmulatorParams()
    assert p.replace(latency_us=50).latency_us == 50.0
    with pytest.raises(ConfigError):
        p.replace(latency_us=-1)
    with pytest.raises(ConfigError):
        p.replace(no_such_knob=1)
    with pytest.raises(ConfigError):
        p.replace(servers=2.5)
    with pytest.raises(ConfigError):
        EmulatorParams(max_request_kib=4096)
    j = tmp_path / "e.json"
    j.write_text(json.dumps({"node-mbps": 500, "stripe_kib": 512, "nodes": 4}))
    q = EmulatorParams.from_file(j)
    assert (q.node_mbps, q.stripe_kib) == (500.0, 512)
    bad = tmp_path / "bad.toml"
    bad.write_text("latency_us = [")
    with pytest.raises(ConfigError):
        EmulatorParams.from_file(bad)
    argv = q.argv()
    assert argv[argv.index("--node-mbps") + 1] == "500.0"
    assert argv[argv.index("--stripe-kib") + 1] == "512"


def test_refuses_politely_without_the_binary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEEDLINE_FUSE_BIN", str(tmp_path / "no-such-binary"))
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(EmulatorUnavailable):
        Emulator(src, tmp_path / "mnt").start()
    rc = cli_main(["emulate", "up", str(src), str(tmp_path / "mnt")])
    assert rc == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "unavailable" in err and "FEEDLINE_FUSE_BIN" in err
    assert not is_mounted(tmp_path / "mnt")


def test_binary_refuses_bad_arguments(tmp_path):
    import subprocess

    from feedline_tools.emulate import find_binary

    binary = find_binary()
    if binary is None:
        pytest.skip("feedline-fuse not built")
    (tmp_path / "m").mkdir()
    r = subprocess.run(
        [binary, "--servers", "0", str(tmp_path), str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "servers" in r.stderr
    r = subprocess.run(
        [binary, "--bogus", "1", str(tmp_path), str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "unknown option" in r.stderr


# -- overhead at 1 GB/s (full tier: prints the figures) ------------------------------------


@pytest.mark.full
@pytest.mark.fuse
@needs_fuse
def test_overhead_at_1GBps_is_small(tmp_path, capsys):
    """Daemon overhead (service - modelled) for one synchronous reader doing 1 MiB
    direct reads at the default model; the reader's overhead is printed."""
    from feedline_tools.emulate.measure import measure_overhead

    results = measure_overhead(size=128 << 20, repeats=3, workdir=str(tmp_path))
    best = min(results, key=lambda r: r.client)
    with capsys.disabled():
        print(
            f"\nemulator overhead at 1 GB/s, 1 MiB direct reads: daemon median "
            f"{best.daemon_median:.1%}, reader {best.client:.1%} ({best.mbps:.0f} MB/s)"
        )
    assert all(r.requests == 128 for r in results)
    assert best.daemon_median < 0.10
    assert best.client > -0.02  # never faster than the model
