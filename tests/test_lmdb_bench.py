# SPDX-License-Identifier: Apache-2.0
"""Smoke test of ``feedline bench index`` at a tiny size: it runs, writes its JSON, the
liblmdb cursor finds the same index, and the parser reads a small part of the file."""

from __future__ import annotations

import json

from feedline.cli import main


def test_index_bench_quick(tmp_path, capsys):
    out = tmp_path / "index.json"
    work = tmp_path / "work"
    rc = main(["bench", "index", "--quick", "--workdir", str(work), "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "index"
    names = {r["name"] for r in doc["runs"]}
    for shape in ("cifar10-large", "imagenet"):
        for cache in ("cold", "warm"):
            assert f"feedline:{shape}:{cache}" in names
            assert f"liblmdb:{shape}:{cache}" in names
    for r in doc["runs"]:
        assert r["records"] > 0 and r["time_s"] > 0
        assert r["matches_feedline"] is True
        if r["peer"] == "feedline":
            assert r["read_fraction"] < 0.05
            assert r["layout"]["depth"] >= 1
    assert "| feedline:cifar10-large:cold |" in capsys.readouterr().out
    assert (work / "cifar10-large-3000" / "data.mdb").exists()  # --workdir is kept
