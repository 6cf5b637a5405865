# SPDX-License-Identifier: Apache-2.0
"""feedline.dlio: importable without DLIO, and DLIO's file lists become feedline datasets."""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import pytest

import feedline
import feedline.dlio as fdlio
from feedline.errors import ConfigError
from feedline_tools.generate import run as generate

HAVE_DLIO = importlib.util.find_spec("dlio_benchmark") is not None


def test_dataset_for_npz_files(tmp_path):
    files = []
    for i in range(5):
        p = tmp_path / f"img_{i}_of_5.npz"
        np.savez(p, x=np.full((3, 3), i, np.uint8))
        files.append(str(p))
    (tmp_path / "img_0_of_5.npz.idx").write_text("not listed by DLIO, not read")
    with fdlio.dataset_for(files[::-1], "npz") as ds:
        assert ds.index.files == sorted(files)
        loader = feedline.Loader(ds, 2, decode=False, drop_last=True)
        ids = [i for b in loader for i in b.ids.tolist()]
        loader.close()
    assert len(ids) == 4 and len(set(ids)) == 4  # drop_last, as DLIO's own loader


def test_dataset_for_tfrecord(tmp_path):
    generate("tfrecord", str(tmp_path / "tf"), samples=40, files=2, show_progress=False)
    files = sorted(str(p) for p in (tmp_path / "tf").glob("*.tfrecord"))
    with fdlio.dataset_for(files, "tfrecord") as ds:
        assert len(ds.index.offsets) == 40


def test_unsupported_format_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="DLIO format 'parquet' is not supported"):
        fdlio.dataset_for([str(tmp_path / "x")], "parquet")


@pytest.mark.skipif(HAVE_DLIO, reason="DLIO installed: the class builds")
def test_loader_needs_dlio_only_when_used():
    with pytest.raises(ModuleNotFoundError, match="dlio_benchmark"):
        fdlio.Loader  # noqa: B018


@pytest.mark.skipif(not HAVE_DLIO, reason="needs dlio_benchmark")
def test_loader_is_what_dlio_discovers():
    from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader

    found = [o for n, o in inspect.getmembers(fdlio) if n == "Loader"]
    assert found and issubclass(found[0], BaseDataLoader)
