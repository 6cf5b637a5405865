# SPDX-License-Identifier: Apache-2.0
"""``feedline bench peers`` at toy size: every row present (peers that are not installed
say so), real deliveries checked for exactly-once and class mixing, and the measures of
what was delivered computed correctly."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from feedline.cli import main
from feedline_tools.bench import peer_loaders as pl
from feedline_tools.bench.peers import delivered, spearman


def _doc(steps_per_rank):
    docs = []
    for steps in steps_per_rank:
        ids = np.concatenate(steps) if steps else np.zeros(0, np.int64)
        docs.append({"_ids": ids, "_offs": np.cumsum([0] + [len(s) for s in steps])})
    return docs


def test_shuffles_cell_judges_what_was_delivered():
    from feedline_tools.bench.peers import shuffles

    assert shuffles({"classes_per_batch": 10.0, "spearman": 0.01}, 10) == "yes"
    assert shuffles({"classes_per_batch": 1.0, "spearman": 0.99}, 10) == "no"
    assert shuffles({"classes_per_batch": 6.4, "spearman": 0.02}, 10) == "partly"
    assert shuffles({"classes_per_batch": None, "spearman": None}, 10) == "-"


def test_delivered_measures():
    n = 40
    # two ranks, class-sorted ids (4 classes of 10): rank 0 takes the first half in order
    d = delivered(
        _doc([[np.arange(0, 10), np.arange(10, 20)], [np.arange(20, 30), np.arange(30, 40)]]),
        n,
        4,
        20,
    )
    assert d["exactly_once"] and d["duplicates"] == 0 and d["missing"] == 0
    assert d["classes_per_batch"] == 2.0  # batch s = rank 0's step s + rank 1's step s
    rng = np.random.default_rng(0)
    perm = rng.permutation(n)
    d = delivered(_doc([[perm[:20], perm[20:]]]), n, 4, 20)
    assert d["exactly_once"] and d["classes_per_batch"] > 3
    assert abs(d["spearman"]) < 0.5 and d["rl"] > 0.9
    # a duplicate and a missing sample (what DistributedSampler's padding would do)
    bad = np.concatenate([np.arange(39), [0]])
    d = delivered(_doc([[bad]]), n, 4, 40)
    assert not d["exactly_once"] and d["duplicates"] == 1 and d["missing"] == 1
    assert d["spearman"] > 0.8 and d["rl"] < 0.5
    assert delivered(_doc([[np.arange(n)]]), n, 4, 40)["rl"] == 0.0
    assert spearman(np.arange(100)) == pytest.approx(1.0)
    assert spearman(np.arange(100)[::-1]) == pytest.approx(-1.0)


def test_peers_quick(tmp_path):
    out = tmp_path / "out"
    loaders = "torch-lmdb-getitems,torch-h5py,feedline,async-db,webdataset"
    rc = main(
        [
            "bench",
            "peers",
            "--quick",
            "--samples",
            "1200",
            "--loaders",
            loaders,
            "--cache",
            str(tmp_path / "cache"),
            "--out",
            str(out),
            "--timeout",
            "300",
        ]
    )
    assert rc == 0
    doc = json.loads((out / "peers.json").read_text())
    rows = {r["loader"]: r for r in doc["rows"]}
    assert list(rows) == loaders.split(",")  # every row, in order, none hidden
    for name in ("torch-lmdb-getitems", "torch-h5py", "feedline", "async-db"):
        r = rows[name]
        assert not r.get("error"), r
        assert r["exactly_once"] and r["delivered"] == 1200, r
        assert r["classes_per_batch"] >= 9, r  # shuffled well past the class-sorted order
        assert r["samples_per_s"] > 0 and r["ttfb_s"] > 0 and r["peak_rss_mb"] > 10
        assert r["read_calls"] > 0
    if importlib.util.find_spec("webdataset") is None:
        assert rows["webdataset"]["error"].startswith("not installed")
    else:
        assert rows["webdataset"].get("exactly_once"), rows["webdataset"]
    md = (out / "peers.md").read_text()
    assert "| webdataset | 1 |" in md and "DistributedSampler" in md
    assert "| loader | P | shuffles? |" in md and "| feedline | 1 | yes |" in md
    # the conversions are cached: a second run finds them
    assert (tmp_path / "cache" / "hdf5" / ".complete").exists()


def test_bad_arguments(tmp_path, capsys):
    assert main(["bench", "peers", "--quick", "--loaders", "nope", "--cache", str(tmp_path)])
    assert "unknown loader(s) ['nope']" in capsys.readouterr().err
    assert main(["bench", "peers", "--quick", "--ranks", "3", "--cache", str(tmp_path)])
    assert "multiple of every rank count" in capsys.readouterr().err


def test_peer_loaders_name_their_package():
    for name, (pkg, what, loop) in pl.LOADERS.items():
        assert callable(loop) and what
        assert pkg in (None, "torch", "streaming", "webdataset", "litdata", "tensorflow"), name
