# SPDX-License-Identifier: Apache-2.0
"""feedline index / inspect on generated datasets, checked against liblmdb and h5py,
and generated datasets read back through open_dataset (the formats' indexers/decoders)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import feedline
from feedline.cli import main
from feedline_tools.generate import MANIFEST, read_manifest
from feedline_tools.make import generate

lmdb = pytest.importorskip("lmdb")
h5py = pytest.importorskip("h5py")

SMALL = {
    "cifar10-large": {"samples": 120, "commit_every": 50},
    "imagenet": {"samples": 6, "classes": 3, "image_size": 64},
    "cosmoflow": {"samples": 6, "cube": 8, "files": 2},
    "neuron-inverter": {"samples": 40, "files": 2},
    "cifar10-bin": {"samples": 50},
    "tfrecord": {"samples": 30, "files": 2},
    "npy": {"samples": 25},
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    base = tmp_path_factory.mktemp("made")
    return {name: generate(name, base / name, seed=5, **kw) for name, kw in SMALL.items()}


def _inspect_json(capsys, *argv):
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", list(SMALL))
def test_inspect_reports_generated_dataset(made, capsys, name):
    path = made[name]
    man = read_manifest(path)
    info = _inspect_json(capsys, path)
    assert info["format"] == man["format"]
    assert info["samples"] == SMALL[name]["samples"]
    assert info["files"] == len([f for f in man["files"] if f != "labels.npy"])
    assert info["record_bytes_min"] == man["record_bytes_min"]
    assert info["record_bytes_max"] == man["record_bytes_max"]
    assert 0 < info["payload_fraction"] <= 1
    assert info["payload_bytes"] <= info["file_bytes"]
    assert info["made_by"]["generator"] == name and info["made_by"]["seed"] == 5
    assert info["sidecar"] and os.path.exists(info["sidecar"])
    assert main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert f"samples    {SMALL[name]['samples']:,}" in text
    assert "% of the file bytes" in text


def test_lmdb_layout_matches_liblmdb(made, capsys):
    path = made["cifar10-large"]
    info = _inspect_json(capsys, path)
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        st, ei = env.stat(), env.info()
    finally:
        env.close()
    assert info["depth"] == st["depth"]
    assert info["branch_pages"] == st["branch_pages"]
    assert info["leaf_pages"] == st["leaf_pages"]
    assert info["overflow_pages"] == st["overflow_pages"]
    assert info["entries"] == st["entries"] == 120
    assert info["txnid"] == ei["last_txnid"] == 3  # 120 records, a commit every 50
    main(["inspect", path])
    text = capsys.readouterr().out
    assert "B+tree levels" in text and "overflow" in text and "commit_every     50" in text


def test_hdf5_layout_is_contiguous(made, capsys):
    info = _inspect_json(capsys, made["cosmoflow"])
    assert info["layout"] == "contiguous" and info["sample_shape"] == [8, 8, 8, 12]
    assert info["dataset"] == "x" and info["labels"] == "y"


def test_generated_data_reads_back_through_open_dataset(made):
    ds = feedline.open_dataset(made["cifar10-large"])
    x, y = ds[7]
    assert x.shape == (3, 32, 32) and x.dtype == np.uint8 and y == 7 * 10 // 120
    env = lmdb.open(made["cifar10-large"], readonly=True, lock=False)
    try:
        with env.begin() as txn:
            assert ds.read(7) == txn.get(b"00000007")
    finally:
        env.close()
    ds.close()
    with feedline.open_dataset(made["cosmoflow"]) as ds:
        x, y = ds[5]
        with h5py.File(os.path.join(made["cosmoflow"], "cosmo-0001.h5"), "r") as f:
            assert np.array_equal(x, f["x"][2]) and np.array_equal(y, f["y"][2])
    man = read_manifest(made["npy"])
    with feedline.open_dataset(made["npy"], **man["open_options"]) as ds:
        x, y = ds[24]
        assert x.shape == (3, 32, 32) and int(y) == 24 * 10 // 25
    man = read_manifest(made["cifar10-bin"])
    with feedline.open_dataset(made["cifar10-bin"], format="records", **man["open_options"]) as ds:
        assert len(ds) == 50 and int(ds.index.labels[49]) == 9


def test_index_writes_a_sidecar_that_later_opens_load(made, capsys):
    path = made["tfrecord"]
    for f in os.listdir(path):
        if f.endswith(".fidx"):
            os.unlink(os.path.join(path, f))
    assert main(["index", path]) == 0
    out = capsys.readouterr().out
    assert "indexed 30 samples of tfrecord in 2 file(s)" in out
    side = out.split("sidecar: ")[1].split(" (")[0]
    assert os.path.exists(side)
    ds = feedline.open_dataset(path)
    assert len(ds) == 30 and ds.sidecar_path == side  # loaded, not rebuilt


def test_open_options_on_the_command_line(made, capsys, tmp_path):
    # without the manifest, fixed-length records need their options named
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in os.listdir(made["cifar10-bin"]):
        if f.endswith(".bin"):
            os.link(os.path.join(made["cifar10-bin"], f), bare / f)
    assert not (bare / MANIFEST).exists()
    assert main(["inspect", str(bare), "--format", "records"]) == 1
    assert "record_bytes" in capsys.readouterr().err
    info = _inspect_json(
        capsys,
        str(bare),
        "--format",
        "records",
        "--record-bytes",
        "3073",
        "--label-bytes",
        "1",
        "--no-sidecar",
    )
    assert info["samples"] == 50 and info["sidecar"] is None and "made_by" not in info
    assert not [f for f in os.listdir(bare) if f.endswith(".fidx")]
    h5 = os.path.join(made["neuron-inverter"], "cell-0000.h5")
    info = _inspect_json(capsys, h5, "--dataset", "x", "--labels", "y")
    assert info["samples"] == 20 and info["sample_shape"] == [1600, 3]


def test_inspect_runs_as_a_program(made):
    r = subprocess.run(
        [sys.executable, "-m", "feedline", "inspect", made["npy"]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "format     npy" in r.stdout


def test_missing_path_is_an_error_not_a_crash(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 1
    assert "nope" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "nope.h5")]) == 1
    assert "nope.h5" in capsys.readouterr().err


def test_compressed_payload_says_stored_and_unpacked(tmp_path, capsys):
    """On compressed data the payload line is the stored (compressed) bytes, and says so
    next to the unpacked size; the layout line explains a chunked HDF5 layout."""
    ni = generate("neuron-inverter", str(tmp_path / "ni"), samples=20, files=2,
                  compression="gzip-shuffle", chunk_samples=5, progress=False)  # fmt: skip
    assert main(["inspect", ni]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("payload"))
    assert "stored compressed" in line and "once unpacked" in line
    assert "384.0 KB of records once unpacked" in line  # 20 x 1600 x 3 x 4 B
    layout = next(
        ln for ln in out.splitlines() if ln.strip().startswith("layout ") and "chunked" in ln
    )
    assert "read through their chunks" in layout
