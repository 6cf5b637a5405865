# SPDX-License-Identifier: Apache-2.0
"""The native I/O engine through its Python wrapper, on real files (ext4 under tmp_path,
tmpfs /dev/shm, procfs): bytes, errors, fallback, GIL release, lifetime, statistics."""

from __future__ import annotations

import errno
import gc
import mmap
import os
import threading
import time
import weakref

import numpy as np
import pytest

from feedline import ConfigError, CorruptDataError, StorageError
from feedline.io import (
    METHODS,
    IOEngine,
    IOStats,
    RawBuffer,
    aligned_empty,
    bench_read,
    evict,
    resident_bytes,
)

UNMAPPED = 4096  # an address of /proc/self/mem that is never mapped: reading it is EIO


def make_files(root, sizes, seed=0):
    rng = np.random.default_rng(seed)
    paths, contents = [], []
    for i, size in enumerate(sizes):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        p = root / f"f{i}.bin"
        p.write_bytes(data)
        paths.append(str(p))
        contents.append(data)
    return paths, contents


def random_extents(sizes, n, seed, max_len=50_000):
    """Unaligned extents (some empty, some spanning chunks) placed in shuffled, gapped slots."""
    rng = np.random.default_rng(seed)
    fid = rng.integers(0, len(sizes), n)
    size = np.asarray(sizes)[fid]
    ln = np.minimum(rng.integers(1, max_len, n), size)
    ln[rng.random(n) < 0.1] = 0
    off = (rng.random(n) * (size - ln + 1)).astype(np.int64)
    order = rng.permutation(n)
    dest = np.zeros(n, np.int64)
    at = 0
    for i in order:
        at += int(rng.integers(0, 3))
        dest[i] = at
        at += int(ln[i])
    return fid, off, ln.astype(np.int64), dest, at + 5


def check(buf, contents, fid, off, ln, dest):
    raw = memoryview(buf).cast("B")
    for i in range(len(fid)):
        want = contents[fid[i]][off[i] : off[i] + ln[i]]
        assert bytes(raw[dest[i] : dest[i] + ln[i]]) == want, f"extent {i}"


@pytest.fixture
def files(tmp_path):
    sizes = [300_001, 65_536, 4_097, 1]
    paths, contents = make_files(tmp_path, sizes)
    return sizes, paths, contents


@pytest.mark.parametrize("method", METHODS)
def test_random_extents_give_the_files_bytes(files, method):
    sizes, paths, contents = files
    fid, off, ln, dest, nbytes = random_extents(sizes, 300, seed=1)
    with IOEngine(paths, threads=3, method=method, chunk_bytes=16384) as eng:
        buf = np.full(nbytes, 0xEE, np.uint8)
        st = eng.read((fid, off, ln), buf, dest)
        check(buf, contents, fid, off, ln, dest)
        assert st.bytes == int(ln.sum())
        assert st.extents == len(fid)
        assert st.storage_bytes >= st.bytes
        assert st.tasks > 3 and st.submissions == 1
        assert (st.ops == 0) if method == "mmap" else (st.ops >= st.tasks)
        assert st.wall_s > 0 and st.busy_s > 0
        assert eng.stats().bytes == st.bytes


@pytest.mark.parametrize("method", METHODS)
def test_every_buffer_kind(files, method):
    sizes, paths, contents = files
    fid, off, ln, _, _ = random_extents(sizes, 40, seed=2, max_len=3000)
    total = int(ln.sum())
    extents = np.stack([fid, off, ln], axis=1)  # the (n, 3) form
    expected = b"".join(contents[f][o : o + n] for f, o, n in zip(fid, off, ln, strict=True))
    with IOEngine(paths, threads=2, method=method) as eng:
        arr = np.zeros(total, np.uint8)
        eng.read(extents, arr)
        assert arr.tobytes() == expected

        floats = np.zeros((total + 3) // 4, np.float32)  # any dtype: bytes land raw
        eng.read(extents, floats)
        assert floats.tobytes()[:total] == expected

        ba = bytearray(total)
        eng.read(extents, ba)
        assert bytes(ba) == expected

        anon = mmap.mmap(-1, max(total, 1))  # like MPI window memory
        eng.read(extents, anon)
        assert anon[:total] == expected
        anon.close()

        target = aligned_empty(total)
        eng.read(extents, RawBuffer(target.ctypes.data, target.nbytes, owner=target))
        assert target.tobytes() == expected


@pytest.mark.parametrize("method", METHODS)
def test_extent_past_end_of_file_is_corrupt_data(tmp_path, method):
    paths, _ = make_files(tmp_path, [10_000])
    with IOEngine(paths, threads=2, method=method) as eng:
        for off, ln in ((9_000, 2_000), (20_000, 10)):
            with pytest.raises(CorruptDataError) as ei:
                eng.read(([0], [off], [ln]), np.zeros(ln, np.uint8))
            assert ei.value.path == paths[0]
            assert ei.value.offset == 10_000
            assert str(off) in ei.value.reason


@pytest.mark.parametrize("method", METHODS)
def test_missing_file_is_storage_error(tmp_path, method):
    path = str(tmp_path / "absent.bin")
    with IOEngine([path], threads=1, method=method) as eng, pytest.raises(StorageError) as ei:
        eng.read(([0], [0], [10]), np.zeros(10, np.uint8))
    e = ei.value
    assert (e.path, e.err, e.errno, e.filename) == (path, errno.ENOENT, errno.ENOENT, path)
    assert isinstance(e, OSError)


def test_persistent_eio_is_retried_then_storage_error():
    with IOEngine(
        ["/proc/self/mem"], threads=1, method="pread", retries=2, retry_backoff_s=1e-4
    ) as eng:
        with pytest.raises(StorageError) as ei:
            eng.read(([0], [UNMAPPED], [64]), np.zeros(64, np.uint8))
        assert (ei.value.path, ei.value.offset, ei.value.err) == (
            "/proc/self/mem",
            UNMAPPED,
            errno.EIO,
        )
        assert "/proc/self/mem" in str(ei.value)
        st = eng.stats()
        assert (st.retries, st.ops) == (2, 3)


def test_gil_is_released_while_waiting():
    """A Python thread keeps running while the caller is blocked in the engine."""
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        c0 = count[0]
        time.sleep(0.2)  # releases the GIL: the spinner's rate when it has it
        rate = (count[0] - c0) / 0.2
        # A read that keeps failing with EIO: 4 retries, 50 + 100 + 200 + 400 ms apart.
        with IOEngine(["/proc/self/mem"], threads=1, retries=4, retry_backoff_s=0.05) as eng:
            fut = eng.submit(([0], [UNMAPPED], [64]), np.zeros(64, np.uint8))
            c1 = count[0]
            assert fut._impl.wait(0.3) is False  # one native call, 0.3 s long
            during = count[0] - c1
            assert not fut.done()
            with pytest.raises(StorageError):
                fut.result(timeout=10)
    finally:
        stop.set()
        t.join()
    # Holding the GIL for 0.3 s would let the spinner run at most a switch interval (5 ms).
    assert during > 0.1 * rate * 0.3, (during, rate)


def test_result_timeout_and_wait():
    with IOEngine(["/proc/self/mem"], threads=1, retries=3, retry_backoff_s=0.1) as eng:
        fut = eng.submit(([0], [UNMAPPED], [8]), np.zeros(8, np.uint8))
        with pytest.raises(TimeoutError):
            fut.result(timeout=0.02)
        assert fut.wait(10)
        with pytest.raises(StorageError):
            fut.result()


def test_fallback_when_open_refuses_direct():
    """procfs refuses O_DIRECT at open (EINVAL); the engine reads it buffered."""
    try:
        os.close(os.open("/proc/version", os.O_RDONLY | os.O_DIRECT))
        pytest.skip("this kernel accepts O_DIRECT on procfs")
    except OSError as e:
        assert e.errno == errno.EINVAL
    with open("/proc/version", "rb") as f:
        expected = f.read()
    with IOEngine(["/proc/version"], threads=2, method="odirect") as eng:
        buf = np.zeros(len(expected), np.uint8)
        eng.read(([0], [0], [len(expected)]), buf)
        assert buf.tobytes() == expected
        assert eng.file_mode(0) == "fallback"


def _direct_open_ok(path):
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise


def test_tmpfs_direct_or_fallback_gives_identical_bytes():
    """/dev/shm (tmpfs) refused O_DIRECT before Linux 6.6 and accepts it since: either
    way the bytes are those of a buffered read, and file_mode says which path ran."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    data = np.random.default_rng(5).integers(0, 256, 200_003, dtype=np.uint8).tobytes()
    fd, path = -1, f"/dev/shm/feedline-test-io-{os.getpid()}"
    try:
        with open(path, "wb") as f:
            f.write(data)
        fid, off, ln, dest, nbytes = random_extents([len(data)], 100, seed=3, max_len=20_000)
        with IOEngine([path], threads=2, method="odirect", chunk_bytes=8192) as eng:
            buf = np.zeros(nbytes, np.uint8)
            eng.read((fid, off, ln), buf, dest)
            check(buf, [data], fid, off, ln, dest)
            assert eng.file_mode(0) == ("direct" if _direct_open_ok(path) else "fallback")
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)


def _direct_needs_alignment(path):
    """True when an unaligned O_DIRECT read of *path* is refused (ext4, xfs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    page = mmap.mmap(-1, 8192)
    try:
        os.preadv(fd, [memoryview(page)[:100]], 1)
        return False
    except OSError as e:
        return e.errno == errno.EINVAL
    finally:
        os.close(fd)
        page.close()


def test_fallback_when_first_direct_read_is_refused(tmp_path):
    paths, contents = make_files(tmp_path, [100_000], seed=4)
    fid, off, ln, dest, nbytes = random_extents([100_000], 50, seed=4, max_len=30_000)
    with IOEngine(paths, threads=2, method="odirect", alignment=1) as eng:
        buf = np.zeros(nbytes, np.uint8)
        eng.read((fid, off, ln), buf, dest)
        check(buf, contents, fid, off, ln, dest)
        if _direct_needs_alignment(paths[0]):
            assert eng.file_mode(0) == "fallback"


@pytest.mark.parametrize("method", ["pread", "odirect"])
def test_many_python_threads_submit_concurrently(files, method):
    sizes, paths, contents = files
    errors = []
    payload = []
    with IOEngine(paths, threads=3, method=method, chunk_bytes=8192) as eng:

        def caller(c):
            try:
                work = [
                    random_extents(sizes, 30, seed=100 * c + k, max_len=20_000) for k in range(10)
                ]
                bufs = [np.zeros(w[4], np.uint8) for w in work]
                futs = [eng.submit(w[:3], b, w[3]) for w, b in zip(work, bufs, strict=True)]
                for w, b, f in zip(work, bufs, futs, strict=True):
                    payload.append(f.result().bytes)
                    check(b, contents, *w[:4])
            except Exception as e:  # reported below, in the main thread
                errors.append(e)

        threads = [threading.Thread(target=caller, args=(c,)) for c in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        st = eng.stats()
        assert st.submissions == 60
        assert st.bytes == sum(payload)


def test_large_extent_is_split_over_threads(tmp_path):
    paths, contents = make_files(tmp_path, [1 << 20])
    with IOEngine(paths, threads=4, method="pread", chunk_bytes=64 << 10) as eng:
        buf = np.zeros(1 << 20, np.uint8)
        st = eng.read(([0], [0], [1 << 20]), buf)
    assert (st.tasks, st.extents) == (16, 1)
    assert buf.tobytes() == contents[0]


def test_close_cancels_queued_reads_and_is_final(tmp_path):
    paths, _ = make_files(tmp_path, [1 << 20])
    eng = IOEngine(paths, threads=1, method="pread", chunk_bytes=4096)
    bufs = [np.zeros(1 << 20, np.uint8) for _ in range(30)]
    futs = [eng.submit(([0], [0], [1 << 20]), b) for b in bufs]
    eng.close()
    eng.close()
    assert eng.closed
    outcomes = []
    for f in futs:
        assert f.done()
        try:
            outcomes.append(f.result().bytes == 1 << 20)
        except RuntimeError:
            outcomes.append("cancelled")
    assert "cancelled" in outcomes
    assert all(o is True or o == "cancelled" for o in outcomes)
    with pytest.raises(ValueError):
        eng.submit(([0], [0], [10]), bufs[0])


def test_buffer_stays_alive_while_its_read_is_in_flight():
    with IOEngine(["/proc/self/mem"], threads=1, retries=3, retry_backoff_s=0.03) as eng:
        buf = np.zeros(64, np.uint8)
        ref = weakref.ref(buf)
        fut = eng.submit(([0], [UNMAPPED], [64]), buf)
        impl = fut._impl
        del buf, fut
        gc.collect()
        assert ref() is not None  # the engine holds it: a thread may still write into it
        assert impl.wait(10)
        eng.submit(([0], [0], [0]), np.zeros(0, np.uint8))  # prunes finished reads
        gc.collect()
        assert ref() is None


def test_rejects_bad_arguments(tmp_path):
    paths, _ = make_files(tmp_path, [100])
    with pytest.raises(ConfigError):
        IOEngine(paths, method="aio")
    with pytest.raises(ConfigError):
        IOEngine(paths, threads=0)
    with pytest.raises(ConfigError):
        IOEngine(paths, chunk_bytes=100)
    with pytest.raises(ConfigError):
        IOEngine(paths, alignment=3000)
    with pytest.raises(TypeError):
        IOEngine(paths[0])
    with IOEngine(paths, threads=1) as eng:
        buf = np.zeros(50, np.uint8)
        with pytest.raises(IndexError):
            eng.submit(([1], [0], [10]), buf)
        with pytest.raises(ValueError):
            eng.submit(([0], [0], [60]), buf)  # overflows the buffer
        with pytest.raises(ValueError):
            eng.submit(([0], [-1], [10]), buf)
        with pytest.raises(ValueError):
            eng.submit(([0], [0], [10]), buf, [45])
        with pytest.raises(ValueError):
            eng.submit(([0], [0], [10]), b"read-only bytes")
        with pytest.raises(ValueError):
            eng.submit(([0], [0], [10]), buf[::2])  # not contiguous
        with pytest.raises(ValueError):
            eng.submit(np.zeros((2, 2), np.int64), buf)
        with pytest.raises(TypeError):
            eng.submit(([0.5], [0], [10]), buf)
        assert eng.stats().submissions == 0
        assert eng.submit(([], [], []), np.zeros(0, np.uint8)).done()


def test_defaults_come_from_the_environment(tmp_path, monkeypatch):
    paths, _ = make_files(tmp_path, [100])
    monkeypatch.setenv("FEEDLINE_IO_METHOD", "mmap")
    monkeypatch.setenv("FEEDLINE_IO_THREADS", "3")
    monkeypatch.setenv("FEEDLINE_IO_CHUNK_MIB", "2")
    with IOEngine(paths) as eng:
        assert (eng.method, eng.threads, eng.chunk_bytes) == ("mmap", 3, 2 << 20)
        eng.read(([0], [0], [100]), np.zeros(100, np.uint8))
        assert eng.file_mode(0) == "mapped"


def test_stats_add_up_and_convert(files):
    sizes, paths, _ = files
    with IOEngine(paths, threads=2) as eng:
        parts = []
        for seed in range(3):
            fid, off, ln, dest, n = random_extents(sizes, 20, seed=seed)
            parts.append(eng.read((fid, off, ln), np.zeros(n, np.uint8), dest))
        total = eng.stats()
    summed = parts[0] + parts[1] + parts[2]
    for name in ("bytes", "storage_bytes", "ops", "extents", "tasks", "submissions"):
        assert getattr(total, name) == getattr(summed, name), name
    assert isinstance(total, IOStats)
    assert total.as_dict()["bytes"] == total.bytes
    assert dict(vars(total))["ops"] == total.ops
    assert total.MBps > 0


def test_evict_drops_a_files_pages(tmp_path):
    paths, _ = make_files(tmp_path, [1 << 20])
    with IOEngine(paths, threads=1) as eng:
        eng.read(([0], [0], [1 << 20]), np.zeros(1 << 20, np.uint8))
    assert resident_bytes(paths[0]) > 0
    evict(paths)
    left = resident_bytes(paths[0])
    if left:
        pytest.skip(f"this file system keeps evicted pages ({left} bytes)")
    with pytest.raises(StorageError):
        evict(str(tmp_path / "absent"))


@pytest.mark.parametrize("method", METHODS)
def test_bench_read_smoke(tmp_path, method):
    paths, _ = make_files(tmp_path, [(1 << 20) + 123])
    r = bench_read(paths[0], 64 << 10, method, threads=2)
    assert r.bytes == (1 << 20) + 123
    assert r.seconds > 0 and r.MBps > 0 and r.MiBps > 0
    assert r.ops >= (0 if method == "mmap" else 17)
    assert r.mode in {"direct", "fallback", "buffered", "mapped"}
    assert (
        bench_read(paths[0], 64 << 10, method, max_bytes=100_000, evict_first=False).bytes
        == 100_000
    )
    # from an offset (rounded down to 4096): up to the end of the file, or max_bytes
    tail = bench_read(paths[0], 64 << 10, method, offset=(1 << 20) + 5, evict_first=False)
    assert tail.bytes == 123  # from 1 MiB: the file's last 123 bytes
    assert bench_read(paths[0], 64 << 10, method, offset=8192, max_bytes=4096).bytes == 4096
    assert bench_read(paths[0], 64 << 10, method, offset=1 << 30).bytes == 0
    with pytest.raises(ConfigError):
        bench_read(paths[0], 64 << 10, method, offset=-1)


@pytest.mark.full
@pytest.mark.parametrize("method", METHODS)
def test_cold_large_read_matches(tmp_path, method):
    """64 MiB of random extents from a cold 256 MiB file."""
    size = 256 << 20
    path = tmp_path / "big.bin"
    rng = np.random.default_rng(9)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    data.tofile(path)
    fid, off, ln, dest, nbytes = random_extents([size], 2000, seed=9, max_len=64 << 10)
    evict([path])
    with IOEngine([str(path)], threads=4, method=method) as eng:
        buf = np.zeros(nbytes, np.uint8)
        eng.read((fid, off, ln), buf, dest)
    for i in range(len(fid)):
        assert np.array_equal(buf[dest[i] : dest[i] + ln[i]], data[off[i] : off[i] + ln[i]])


def test_limit_comparison_cli_smoke(tmp_path, capsys):
    from feedline_tools.io_bench import main, parse_size

    assert parse_size("8M") == 8 << 20 and parse_size("64KiB") == 64 << 10
    paths, _ = make_files(tmp_path, [256 << 10])
    assert main([paths[0], "--blocks", "64K", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "feedline odirect, 1 thread(s) @ 64 KiB" in out
    assert "MB/s" in out


def test_unaligned_direct_reads_bounce_in_bounded_pieces(tmp_path):
    """An extent not aligned for O_DIRECT goes through the thread's bounce buffer in
    pieces of at most 1 MiB (the buffer was as large as the extent, up to the 8 MiB
    chunk: 32 MiB for 4 threads, outside any memory estimate), with the same bytes; an
    aligned extent into an aligned destination is read in place."""
    data = np.random.default_rng(3).integers(0, 256, 9 << 20, dtype=np.uint8)
    path = tmp_path / "f.bin"
    data[: (9 << 20) - 1234].tofile(path)  # ends inside a block
    n = (9 << 20) - 1234
    extents = [(0, 777, (5 << 20) + 3), (0, 6 << 20, n - (6 << 20))]  # the second to EOF
    total = sum(e[2] for e in extents)
    buf = np.zeros(total, dtype=np.uint8)
    with IOEngine([str(path)], threads=2, method="odirect", chunk_bytes=8 << 20) as eng:
        st = eng.read(np.array(extents, dtype=np.int64), buf)
        if eng.file_mode(0) != "direct":  # known once the file was opened
            pytest.skip("this file system refuses O_DIRECT")
    want = np.concatenate([data[o : o + ln] for _, o, ln in extents])
    np.testing.assert_array_equal(buf, want)
    assert st.bounced_bytes == total and st.bytes == total
    a = aligned_empty(2 << 20)  # an aligned destination
    with IOEngine([str(path)], threads=1, method="odirect") as eng:
        st = eng.read(np.array([(0, 1 << 20, 2 << 20)], dtype=np.int64), a)
    np.testing.assert_array_equal(a, data[1 << 20 : 3 << 20])
    assert st.bounced_bytes == 0


def test_staged_direct_reads_give_the_same_bytes_into_shared_memory(tmp_path, files):
    """``stage=True`` reads every O_DIRECT extent through the thread's huge-page staging
    buffer (at most 4 MiB per read) and copies it into the destination, here a /dev/shm
    mapping like a node window: the same bytes as in-place reads, every byte counted as
    copied, and a 2 MiB block-aligned extent is still one read."""
    sizes, paths, contents = files
    fid, off, ln, dest, nbytes = random_extents(sizes, 300, seed=7)
    big = np.random.default_rng(5).integers(0, 256, (9 << 20) + 4096, dtype=np.uint8)
    (tmp_path / "big.bin").write_bytes(big.tobytes())
    fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes + (16 << 20))
        shm = mmap.mmap(fd, nbytes + (16 << 20))
    finally:
        os.close(fd)
    window = np.frombuffer(shm, np.uint8)
    with IOEngine(paths, threads=3, method="odirect", chunk_bytes=16384, stage=True) as eng:
        st = eng.read((fid, off, ln), window[:nbytes], dest)
        direct = eng.file_mode(0) == "direct"  # known once the file was opened
    check(window[:nbytes], contents, fid, off, ln, dest)
    if not direct:
        del window
        shm.close()
        pytest.skip("this file system refuses O_DIRECT")
    assert st.bounced_bytes == st.bytes == int(ln.sum())
    extents = np.array([(0, 1 << 20, 2 << 20), (0, 4096, (9 << 20) - 777)], np.int64)
    with IOEngine([str(tmp_path / "big.bin")], threads=1, method="odirect", stage=True) as eng:
        one = eng.read(extents[:1], window[: 2 << 20])
        np.testing.assert_array_equal(window[: 2 << 20], big[1 << 20 : 3 << 20])
        st = eng.read(extents[1:], window[4096 : 4096 + (9 << 20) - 777])
    np.testing.assert_array_equal(
        window[4096 : 4096 + (9 << 20) - 777], big[4096 : 4096 + (9 << 20) - 777]
    )
    assert one.ops == 1 and one.bounced_bytes == 2 << 20
    assert st.ops == 3  # an 8 MiB chunk in two staged reads of 4 MiB, then the rest
    del window
    shm.close()


@pytest.mark.parametrize("stage", [False, True])
def test_large_copies_out_of_the_bounce_buffer_at_any_alignment(tmp_path, stage):
    """The copy out of a bounce or staging buffer streams copies of 256 KiB and more
    (non-temporal stores on x86-64): every byte lands where it belongs whatever the
    alignment of the file offset, the destination and the length (head, whole lines,
    tail), next to small copies and without touching the bytes around."""
    rng = np.random.default_rng(11)
    data = rng.integers(0, 256, (12 << 20) + 999, dtype=np.uint8)
    (tmp_path / "f.bin").write_bytes(data.tobytes())
    cases = [  # (file offset, length, destination offset)
        (12345, (3 << 20) + 333, 7),
        (4096, (1 << 20), 4096 + 9),
        (1, (256 << 10) - 1, 1 << 22),
        (5000, (256 << 10) + 63, (5 << 20) + 3),
        (9 << 20, (3 << 20) + 999, 9 << 20),
    ]
    window = np.full(13 << 20, 0xA5, np.uint8)
    with IOEngine([str(tmp_path / "f.bin")], threads=2, method="odirect", stage=stage) as eng:
        for off, ln, at in cases:
            window[:] = 0xA5
            eng.read(np.array([(0, off, ln)], np.int64), window[at : at + ln])
            np.testing.assert_array_equal(window[at : at + ln], data[off : off + ln])
            assert (window[:at] == 0xA5).all() and (window[at + ln :] == 0xA5).all()


def test_io_stage_knob_decides_which_node_reads_are_staged(tmp_path, monkeypatch):
    """``io_stage`` (FEEDLINE_IO_STAGE): ``on``/``off`` force it for odirect reads into
    shared memory, ``auto`` stages only files on a local block-device file system, never
    buffered reads nor private destinations; another value is a ConfigError."""
    from feedline import defaults
    from feedline.pipeline import reader
    from feedline.plan.cost import fs_type

    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 8192)
    files = [str(f)]
    with defaults.set(io_stage="on"):
        assert reader.stage_reads(files, "odirect")
        assert not reader.stage_reads(files, "pread")
        r = reader.ExtentReader(files, 1, "odirect", shared=True)
        assert r.staged and r.stats()["engine"] == "native-odirect-staged"
        r.close()
        r = reader.ExtentReader(files, 1, "odirect")
        assert not r.staged
        r.close()
    with defaults.set(io_stage="off"):
        assert not reader.stage_reads(files, "odirect")
    with defaults.set(io_stage="auto"):
        local = fs_type(str(tmp_path)) in ("ext4", "xfs", "btrfs")
        huge_anon = reader._thp_mode("enabled") not in ("never", "")
        want = local and huge_anon and not reader._shm_on_huge_pages()
        assert reader.stage_reads(files, "odirect") == want
        shm = "/dev/shm/feedline-stage-probe"
        assert not reader.stage_reads([shm], "odirect")  # tmpfs: not a block device
    monkeypatch.setenv("FEEDLINE_IO_STAGE", "sometimes")
    with pytest.raises(ConfigError, match="io_stage"):
        reader.stage_reads(files, "odirect")


def test_result_is_kept_once_done_and_errors_raise_every_time(tmp_path):
    """A window's reads are asked for at every step: the statistics are converted once;
    a failed read raises at every call, never a stale success."""
    paths, contents = make_files(tmp_path, [10_000])
    with IOEngine(paths, threads=1) as eng:
        buf = np.zeros(100, np.uint8)
        fut = eng.submit(([0], [5], [100]), buf)
        first = fut.result(timeout=10)
        assert fut.result() is first and first.bytes == 100
        assert buf.tobytes() == contents[0][5:105]
        bad = eng.submit(([0], [9_950], [100]), np.zeros(100, np.uint8))
        for _ in range(2):
            with pytest.raises(CorruptDataError):
                bad.result(timeout=10)
