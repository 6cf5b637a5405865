# SPDX-License-Identifier: Apache-2.0
"""The first hour of a new user (issue 17): their own data opens as they write it,
decoding is detected, errors say what to do, arguments and saved states are checked."""

from __future__ import annotations

import io
import logging
import pathlib
import pickle

import h5py
import lmdb
import numpy as np
import pytest

from feedline import (
    ConfigError,
    CorruptDataError,
    DatasetNotFoundError,
    FeedlineError,
    Loader,
    StateError,
    StateMismatchError,
    UnsupportedFormatError,
    open_dataset,
)
from feedline.formats.datum_write import encode_datum
from feedline.inspect import inspect_dataset, render
from feedline.plan.strategy import PRESETS
from feedline.units import format_bytes, parse_bytes

N = 40


def _write_lmdb(path: pathlib.Path, values: list[bytes]) -> str:
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(f"{i:08d}".encode(), v)
    env.close()
    return str(path)


def _msgpack_like(i: int) -> bytes:
    # a msgpack map {"x": <bin>, "y": i}: 0x82, fixstr "x", bin8, fixstr "y", uint8
    body = bytes(range(i % 7, i % 7 + 10 + i % 5))
    return b"\x82\xa1x\xc4" + bytes([len(body)]) + body + b"\xa1y\xcc" + bytes([i % 256])


def _jpeg(i: int) -> bytes:
    from PIL import Image

    img = Image.fromarray(np.full((8, 8, 3), i * 5 % 256, dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    return buf.getvalue()


KINDS = {
    "pickle": lambda i: pickle.dumps({"image": np.arange(i % 9 + 3, dtype=np.int16), "y": i}),
    "msgpack": _msgpack_like,
    "jpeg": _jpeg,
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def raw_lmdb(request, tmp_path_factory):
    values = [KINDS[request.param](i) for i in range(N)]
    path = _write_lmdb(tmp_path_factory.mktemp(request.param) / "db", values)
    return path, values


@pytest.fixture(scope="module")
def datum_lmdb(tmp_path_factory):
    rng = np.random.default_rng(3)
    pix = rng.integers(0, 256, size=(N, 3, 4, 4), dtype=np.uint8)
    values = [encode_datum(3, 4, 4, pix[i].tobytes(), label=i % 10) for i in range(N)]
    path = _write_lmdb(tmp_path_factory.mktemp("datum") / "db", values)
    return path, pix


def _delivered(loader) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    with loader:
        for b in loader:
            starts = np.concatenate([[0], np.cumsum(b.lengths)])
            flat = np.asarray(b.data).reshape(-1)
            for k, i in enumerate(b.ids.tolist()):
                assert i not in out, f"sample {i} delivered twice"
                out[i] = flat[starts[k] : starts[k + 1]].tobytes()
    return out


# ------------------------------------------------------------------ 1. open what users have


def test_loader_takes_a_path_a_pathlike_and_a_list(datum_lmdb, tmp_path):
    path, pix = datum_lmdb
    for data in (path, pathlib.Path(path), [path]):
        with Loader(data, batch_size=16, preset="tf") as ld:
            seen = np.zeros(N, dtype=int)
            for b in ld:
                assert b.data.shape[1:] == (3, 4, 4)
                np.testing.assert_array_equal(b.data, pix[b.ids])
                seen[b.ids] += 1
            assert (seen == 1).all()
    # HDF5 options pass through the Loader (dataset= is the HDF5 dataset's name)
    f = tmp_path / "x.h5"
    x = np.arange(N * 6, dtype=np.float32).reshape(N, 6)
    with h5py.File(f, "w") as h:
        h["images"] = x
        h["y"] = np.arange(N, dtype=np.int64)
    with Loader(str(f), batch_size=8, preset="tf", dataset="images", labels="y") as ld:
        b = next(iter(ld))
        np.testing.assert_array_equal(b.data, x[b.ids])
        np.testing.assert_array_equal(b.labels, b.ids)
    # an opened Dataset refuses open_dataset options rather than ignore them
    ds = open_dataset(str(f), dataset="images")
    with pytest.raises(ConfigError, match="open_dataset"):
        Loader(ds, batch_size=8, labels="y")
    with pytest.raises(ConfigError, match="path"):
        Loader(42, batch_size=8)


def test_open_dataset_takes_decode(datum_lmdb):
    path, pix = datum_lmdb
    ds = open_dataset(path, decode=False)
    assert not ds.decodes
    with Loader(ds, batch_size=10, preset="tf") as ld:
        b = next(iter(ld))
        assert b.data.dtype == np.uint8 and b.data.ndim == 2  # raw Datum bytes
    with Loader(ds, batch_size=10, preset="tf", decode=True) as ld:  # the Loader's wins
        b = next(iter(ld))
        np.testing.assert_array_equal(b.data, pix[b.ids])
    with pytest.raises(ConfigError, match="decode"):
        open_dataset(path, decode="yes")


def test_missing_path_is_a_file_not_found_error_naming_it(tmp_path):
    missing = str(tmp_path / "train_lmdb")
    for call in (
        lambda: open_dataset(missing),
        lambda: Loader(missing, batch_size=8),
        lambda: open_dataset(missing + ".h5"),
        lambda: open_dataset(str(tmp_path / "*.h5")),
    ):
        with pytest.raises(DatasetNotFoundError) as e:
            call()
        assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, FeedlineError)
        assert str(tmp_path) in str(e.value)


def test_unknown_format_lists_what_was_tried(tmp_path):
    (tmp_path / "data.bin").write_bytes(b"\0" * 64)
    with pytest.raises(UnsupportedFormatError) as e:
        open_dataset(str(tmp_path / "data.bin"))
    msg = str(e.value)
    for tried in ("data.mdb", ".h5", ".tfrecord", ".npy", "record_bytes"):
        assert tried in msg


# ------------------------------------------------------------------ 2. decoding detected


def test_non_datum_lmdb_gives_raw_bytes_said_once(raw_lmdb, caplog):
    path, values = raw_lmdb
    import feedline.dataset

    feedline.dataset._SAID.discard(path)  # said once per process: forget earlier tests
    with caplog.at_level(logging.WARNING, logger="feedline"):
        ds = open_dataset(path, sidecar=False)
        got = _delivered(Loader(ds, batch_size=7, preset="tf", seed=2))
        _delivered(Loader(ds, batch_size=7, preset="feedline"))
        _delivered(Loader(path, batch_size=7, preset="lmdb", sidecar=False))  # opened again
    assert got == {i: v for i, v in enumerate(values)}
    said = [r for r in caplog.records if "not a Caffe Datum" in r.getMessage()]
    assert len(said) == 1 and path in said[0].getMessage()
    assert "raw bytes" in render(inspect_dataset(ds))
    with pytest.raises(CorruptDataError):  # decode=True forces Datum decoding
        _delivered(Loader(path, batch_size=7, preset="tf", decode=True, sidecar=False))


def test_datum_lmdb_is_still_decoded(datum_lmdb):
    path, _ = datum_lmdb
    ds = open_dataset(path)
    assert ds.decodes and ds.decode_note is None
    assert "decode" not in inspect_dataset(ds)


# --------------------------------------------------- 3. presets while py-lmdb has it open


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_work_while_the_process_has_the_lmdb_open(raw_lmdb, preset):
    path, values = raw_lmdb
    env = lmdb.open(path, readonly=True)  # the user inspects it first
    try:
        with env.begin() as txn:
            assert txn.stat()["entries"] == N
        got = _delivered(Loader(path, batch_size=8, preset=preset))
        assert got == {i: v for i, v in enumerate(values)}
        with env.begin() as txn:  # the user's handle still works
            assert bytes(txn.get(b"00000000")) == values[0]
    finally:
        env.close()


# ---------------------------------------------------------------- 5. arguments and state


@pytest.mark.parametrize("bad", [1.5, 0, -1, "8", True, None])
def test_batch_size_must_be_a_positive_int(datum_lmdb, bad):
    with pytest.raises(ConfigError, match="batch_size"):
        Loader(datum_lmdb[0], batch_size=bad)


def test_batch_size_accepts_numpy_ints(datum_lmdb):
    with Loader(datum_lmdb[0], batch_size=np.int64(8), preset="tf") as ld:
        assert ld.batch_size == 8 and isinstance(ld.batch_size, int)


def test_drop_last_leaving_no_step_is_refused(datum_lmdb):
    with pytest.raises(ConfigError, match="no step"):
        Loader(datum_lmdb[0], batch_size=N + 1, drop_last=True)
    with Loader(datum_lmdb[0], batch_size=N + 1, drop_last=False, preset="tf") as ld:
        assert len(ld) == 1


def test_state_from_another_seed_dataset_or_preset_is_refused(datum_lmdb, raw_lmdb):
    path = datum_lmdb[0]
    with Loader(path, batch_size=8, preset="tf", seed=1) as ld:
        it = iter(ld)
        next(it)
        state = ld.state_dict()
    with pytest.raises(StateMismatchError, match="seed=1"):
        Loader(path, batch_size=8, preset="tf", seed=2).load_state_dict(state)
    assert issubclass(StateMismatchError, StateError)
    with pytest.raises(StateMismatchError, match="preset"):
        Loader(path, batch_size=8, preset="async", seed=1).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="another dataset"):
        Loader(raw_lmdb[0], batch_size=8, preset="tf", seed=1).load_state_dict(state)
    ld = Loader(path, batch_size=8, preset="tf", seed=2)
    ld.load_state_dict(state, strict=False)  # adopted, as asked
    assert (ld.seed, ld.step) == (1, 1)
    ld.close()


@pytest.mark.parametrize(
    ("text", "value"),
    [("64MB", 64_000_000), ("64MiB", 64 << 20), ("2G", 2_000_000_000), ("2.5e9", 2_500_000_000),
     ("4096", 4096), (4096, 4096), ("1 KiB", 1024)],
)  # fmt: skip
def test_memory_cap_units(datum_lmdb, monkeypatch, text, value):
    assert parse_bytes(text) == value
    monkeypatch.setenv("FEEDLINE_MEMORY_CAP", str(text))
    if value >= 1 << 20:
        with Loader(datum_lmdb[0], batch_size=8, preset="tf") as ld:
            assert ld.memory_cap == value
        with Loader(datum_lmdb[0], batch_size=8, preset="tf", memory_cap=text) as ld:
            assert ld.memory_cap == value
    with pytest.raises(ConfigError, match="size"):
        parse_bytes("lots")


def test_memory_cap_message_prints_human_units(datum_lmdb):
    assert format_bytes(1) == "1 B" and format_bytes(64 << 20) == "64.0 MiB"
    for preset in ("tf", "feedline"):
        with pytest.raises(ConfigError) as e:
            Loader(datum_lmdb[0], batch_size=8, preset=preset, memory_cap=1)
        msg = str(e.value)
        assert "1 B" in msg and "bytes" not in msg.replace("bytes per", ""), msg


def test_byte_knobs_take_units_and_counts_must_be_whole(datum_lmdb):
    """``window_bytes="128MiB"`` as a Loader option is a size like ``memory_cap``'s (it was
    a TypeError from a comparison); a count that is not whole is a ConfigError naming
    the knob."""
    with Loader(
        datum_lmdb[0], batch_size=8, preset="tf", window_bytes="1MiB", coalesce_gap="64KiB"
    ) as ld:
        assert ld.strategy.window_bytes == 1 << 20 and ld.strategy.coalesce_gap == 64 << 10
        assert sum(len(b.ids) for b in ld) == len(ld.dataset)
    for bad, match in (({"window_steps": "many"}, "window_steps"), ({"chunk": 2.5}, "chunk")):
        with pytest.raises(ConfigError, match=match):
            Loader(datum_lmdb[0], batch_size=8, preset="tf", **bad)
    with pytest.raises(ConfigError, match="cannot read"):
        Loader(datum_lmdb[0], batch_size=8, preset="tf", window_bytes="12 parsecs")
    for v in (float("nan"), float("inf"), "1e400"):  # JSON reads NaN: a state may hold one
        with pytest.raises(ConfigError, match="not a finite size"):
            Loader(datum_lmdb[0], batch_size=8, preset="tf", window_bytes=v)


# ------------------------------------------------------- 4. frameworks as users call them


def test_torch_variable_length_records_as_list_or_padded(raw_lmdb, monkeypatch):
    torch = pytest.importorskip("torch")
    from feedline.torch import FeedlineDataset

    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    path, values = raw_lmdb
    assert len({len(v) for v in values}) > 1  # variable length
    with FeedlineDataset(path, 8, preset="tf", with_ids=True) as fd:  # ragged="list"
        got = {}
        for x, y, ids in fd:
            assert isinstance(x, list) and len(x) == len(ids) and y is None
            for t, i in zip(x, ids.tolist(), strict=True):
                assert t.dtype == torch.uint8
                got[i] = bytes(t.numpy())
    assert got == dict(enumerate(values))
    with FeedlineDataset(path, 8, preset="tf", ragged="pad", with_ids=True) as fd:
        for x, _, lengths, ids in fd:
            assert x.shape == (len(ids), int(lengths.max()))
            for row, n, i in zip(x, lengths.tolist(), ids.tolist(), strict=True):
                assert bytes(row[:n].numpy()) == values[i] and not row[n:].any()
    with FeedlineDataset(path, 8, preset="tf", ragged="pad", pad_to=4096, as_dict=True) as fd:
        item = next(iter(fd))
        assert set(item) == {"data", "labels", "lengths", "ids"}
        assert item["data"].shape[1] == 4096
    with pytest.raises(ConfigError, match="ragged"):
        FeedlineDataset(path, 8, ragged="flat")


def test_torch_dataloader_that_batches_again_warns(datum_lmdb, monkeypatch):
    torch = pytest.importorskip("torch")
    from feedline.torch import FeedlineDataset

    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with FeedlineDataset(datum_lmdb[0], 8, preset="tf") as fd:
        with pytest.warns(RuntimeWarning, match="batch_size=None"):
            x, _ = next(iter(torch.utils.data.DataLoader(fd)))  # default batch_size=1
        assert x.shape[:2] == (1, 8)  # what the warning is about
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            x, _ = next(iter(torch.utils.data.DataLoader(fd, batch_size=None)))
            assert x.shape[0] == 8


def test_jax_variable_length_records(raw_lmdb):
    jax = pytest.importorskip("jax")
    from feedline.jax import global_batches, host_batches

    path, values = raw_lmdb
    with Loader(path, 8, preset="tf", drop_last=True) as ld, Loader(path, 8, preset="tf") as ref:
        for (samples, _), b in zip(host_batches(ld), ref, strict=False):
            assert [s.tobytes() for s in samples] == [values[i] for i in b.ids]
        ld.set_epoch(1)
        for data, _, lengths in host_batches(ld, ragged="pad"):
            assert data.shape == (8, int(lengths.max()))
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        with pytest.raises(ConfigError, match="with_lengths"):
            next(global_batches(ld, sharding))
        longest = max(len(v) for v in values)
        for data, labels, lengths in global_batches(ld, sharding, with_lengths=True):
            assert data.shape == (8, longest) and labels is None
            rows = np.asarray(data)
            for row, n in zip(rows, np.asarray(lengths).tolist(), strict=True):
                assert bytes(row[:n]) in values and not row[n:].any()


# ------------------------------------------------------------------------ 6. CLI polish


def _cli(*argv: str, **kw):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "feedline", *argv], capture_output=True, text=True, **kw
    )


def test_inspect_names_the_dataset_inside_the_hdf5_file(tmp_path):
    f = tmp_path / "x.h5"
    with h5py.File(f, "w") as h:
        h["images"] = np.zeros((10, 4), np.float32)
    r = _cli("inspect", str(f))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(str(f)) and "/images" in first


def test_closed_pipe_ends_quietly(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "x.h5"
    with h5py.File(f, "w") as h:
        h["images"] = np.zeros((10, 4), np.float32)
    p = subprocess.Popen(
        [sys.executable, "-m", "feedline", "inspect", str(f), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # `| head -0`: the reader is gone before the first write
    with p.stderr:
        err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode == 141


def test_under_mpiexec_only_rank_0_prints_help():
    import shutil
    import sys

    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")
    import subprocess

    r = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, "-m", "feedline", "plan", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("usage:") == 1


def _doc(limit_mbps: float, run_mbps: list[float]):
    from feedline_tools.bench import report

    class World:
        size, nodes = 1, 1

    payload = 10_000_000
    samples = {
        name: [{"ranks": [{"time_s": payload / (m * 1e6), "payload_bytes": payload, "node": 0,
                           "rl": 0.9 if name == "tf" else None}],
                "digest": "d" + name}]
        for name, m in zip(("lmdb", "tf"), run_mbps, strict=True)
    }  # fmt: skip
    limits = [[{"method": "odirect", "seconds": payload / (limit_mbps * 1e6), "bytes": payload}]]
    cfg = {
        "scenario": "t",
        "baseline": "lmdb",
        "runs": [{"name": n, "runner": "x"} for n in samples],
    }
    return report.build_document(cfg, World(), limits, samples)


def test_bench_fractions_never_exceed_the_limit():
    from feedline_tools.bench import report

    doc = _doc(100.0, [50.0, 250.0])  # a --quick run beat the limit run (page cache)
    fracs = [r["fraction_of_limit"] for r in doc["runs"]]
    assert max(fracs) == pytest.approx(1.0) and fracs[0] == pytest.approx(0.2)
    assert doc["limit_MBps"] == pytest.approx(250.0)
    assert doc["limit"]["measured_MBps"] == pytest.approx(100.0)
    assert "raised" in report.markdown_table(doc)
    doc = _doc(100.0, [50.0, 80.0])  # the usual case is left alone
    assert doc["limit_MBps"] == pytest.approx(100.0) and "note" not in doc["limit"]


def test_bench_tables_say_what_each_row_is_and_whether_it_shuffles():
    from feedline_tools.bench import lmdbio, report

    doc = _doc(100.0, [50.0, 80.0])
    table = report.markdown_table(doc)
    assert "| what it is | shuffles? |" in table
    assert f"| lmdb | {report.ROWS['lmdb']} | no |" in table
    assert f"| tf | {report.ROWS['tf']} | yes, RL 0.90 |" in table
    doc["config"] = {"ranks": 1, "nodes": 1, "batch_size": 8}
    lm = lmdbio.summary_table(doc, lmdbio.summarize(doc))
    assert "| what it is | shuffles? |" in lm and f"| lmdb | {report.ROWS['lmdb']} | no |" in lm


def test_plots_and_matplotlib_only_when_asked(tmp_path):
    import argparse
    import sys

    from feedline_tools.bench.harness import add_common_arguments

    p = argparse.ArgumentParser()
    add_common_arguments(p)
    assert p.parse_args([]).no_plots and not p.parse_args(["--plots"]).no_plots
    assert p.parse_args(["--no-plots"]).no_plots
    script = tmp_path / "emit.py"
    script.write_text(
        "import sys, json\n"
        "from feedline_tools.bench import report\n"
        f"doc = json.load(open({str(tmp_path / 'doc.json')!r}))\n"
        f"report.emit(doc, out_dir={str(tmp_path / 'out')!r}, json_path=None, plots=False,"
        " echo=lambda s: None)\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported without plots'\n"
    )
    import json
    import subprocess

    (tmp_path / "doc.json").write_text(json.dumps(_doc(100.0, [50.0, 80.0])))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_plan_cli_takes_memory_cap_with_units(capsys):
    from feedline.cli import main

    argv = ["plan", "--ranks", "4", "--nodes", "1", "--samples", "1000", "--record-bytes", "3000"]
    assert main([*argv, "--preset", "tf", "--memory-cap", "64MiB"]) == 0
    assert "tf" in capsys.readouterr().out


@pytest.fixture(scope="module")
def heavy_tail(tmp_path_factory):
    """A plain LMDB of 2,000 records of about 8 KB (lognormal, sigma 0.6) and one of
    2 MB: the shape of JPEG datasets, ImageNet's included (a few files 100x the mean)."""
    from uneven import write_uneven_lmdb

    path = str(tmp_path_factory.mktemp("fh") / "tail")
    return path, write_uneven_lmdb(path, 2000, 8000, 0.6, seed=3, long={17: 2_000_000})


def test_a_few_long_records_do_not_take_the_memory_cap(heavy_tail):
    """Batches and windows are sized for the longest records they could hold (the sum of
    the k longest lengths), not k times the longest one: with one 2 MB record among 8 KB
    ones, batch 256 and a 64 MB cap, `Loader(path)` used to refuse ("memory cap 1 B per
    node cannot hold two steps of reads"). Every record arrives once, intact."""
    path, lengths = heavy_tail
    cap = 64 << 20
    with Loader(path, 256, memory_cap=cap, decode=False) as ld:
        est = ld.memory_estimate()
        assert est["total"] <= cap
        sub_longest = int(np.sort(lengths)[::-1][:256].sum())
        # read-ahead batches of the 256 longest records each (256 x 2 MB each: 2.5 GB)
        assert sub_longest <= est["batches"] < cap < 256 * lengths.max()
        got = {}
        for b in ld:
            rows = np.split(b.data, np.cumsum(b.lengths)[:-1])
            for i, n, row in zip(b.ids, b.lengths, rows, strict=True):
                got[int(i)] = (int(n), row.tobytes())
    assert sorted(got) == list(range(len(lengths)))
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        for i in (0, 17, 1999):
            assert got[i] == (int(lengths[i]), txn.get(b"%08d" % i))
    env.close()


def test_top_lengths_bounds_any_k_records():
    """``TopLengths(k)``: the sum of the k longest lengths, exact up to TOP_EXACT records
    and at most TOP_BIN_RATIO over beyond; never under. Past n (a circular step repeats
    records) each record once per whole n, then the longest. Threads may ask at once."""
    from concurrent.futures import ThreadPoolExecutor

    from feedline.plan.records import TOP_BIN_RATIO, TOP_EXACT, FlatRecords, TopLengths, top_bytes

    rng = np.random.default_rng(0)
    n = TOP_EXACT + 50_000
    ln = np.clip(rng.lognormal(np.log(100_000), 0.7, n), 1, None).astype(np.int64)
    ln[5] = 30_000_000
    ln[6:9] = [0, 1, 2]  # empty and tiny records
    exact = np.concatenate([[0], np.cumsum(np.sort(ln)[::-1])])
    top = TopLengths(ln)
    with ThreadPoolExecutor(8) as pool:  # the first questions build it, from 8 threads
        assert len(set(pool.map(top, [TOP_EXACT + 10] * 8))) == 1
    for k in [0, 1, 2, 255, 256, TOP_EXACT - 1, TOP_EXACT, TOP_EXACT + 1, n - 7, n]:
        got, want = top(k), int(exact[k])
        assert want <= got <= want * TOP_BIN_RATIO
        if k <= TOP_EXACT:
            assert got == want
    assert top(2 * n + 3) == 2 * int(exact[n]) + int(exact[3])
    # a circular last step of 8 over 5 records repeats 3 of them: the long one may be one
    small = TopLengths(np.array([100, 1, 1, 1, 1]))
    assert small(8) == 104 + 102 >= 107  # step [2 1 3 0 4 2 1 3] of the tf preset: 107 B
    assert FlatRecords(10, 3072).top_bytes(40) == 40 * 3072

    class Plain:  # Records of a user's own, without top_bytes: k times the longest
        n, max_length, mean_length = 3, 7, 5.0

    assert top_bytes(Plain(), 4) == 28
