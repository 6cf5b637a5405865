# SPDX-License-Identifier: Apache-2.0
"""The ``files`` format: a directory with one sample per file (DLIO's .npz / image files)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import feedline
from feedline.errors import ConfigError, CorruptDataError, UnsupportedFormatError
from feedline.formats import detect
from feedline.formats.files import load_npz


def _npz_dir(root, n=12, sub=None):
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        d = os.path.join(root, sub(i)) if sub else root
        os.makedirs(d, exist_ok=True)
        np.savez(os.path.join(d, f"img_{i:03d}.npz"), x=np.full((4, 4 + i % 3), i, np.int32))
    return root


def test_index_is_one_whole_file_per_sample(tmp_path):
    root = _npz_dir(str(tmp_path / "d"))
    (tmp_path / "d" / "notes.txt").write_text("not a sample")
    assert detect(root) == "files"
    with feedline.open_dataset(root) as ds:
        ix = ds.index
        names = sorted(f for f in os.listdir(root) if f.endswith(".npz"))
        assert [os.path.basename(f) for f in ix.files] == names  # .txt left out
        assert list(ix.file_ids) == list(range(12)) and not ix.offsets.any()
        assert list(ix.lengths) == [os.path.getsize(os.path.join(root, f)) for f in names]


def test_loader_delivers_every_file_once_and_npz_decodes(tmp_path):
    root = _npz_dir(str(tmp_path / "d"), n=23)
    with feedline.open_dataset(root) as ds:
        seen = []
        loader = feedline.Loader(ds, 4, decode=False, seed=3)
        for b in loader:
            flat = np.asarray(b.data).reshape(-1)
            pos = np.concatenate([[0], np.cumsum(b.lengths)])
            for k, i in enumerate(b.ids.tolist()):
                a = load_npz(flat[pos[k] : pos[k + 1]])
                assert a.shape == (4, 4 + i % 3) and (a == i).all()
                seen.append(i)
        loader.close()
    assert sorted(seen) == list(range(23))


def test_labels_from_directory_names(tmp_path):
    root = _npz_dir(str(tmp_path / "d"), n=9, sub=lambda i: ["cat", "ant", "dog"][i % 3])
    with feedline.open_dataset(root, format="files", labels="dirname") as ds:
        ix = ds.index
        got = {
            os.path.basename(os.path.dirname(f)): int(lab)
            for f, lab in zip(ix.files, ix.labels, strict=True)
        }
    assert got == {"ant": 0, "cat": 1, "dog": 2}


def test_bad_inputs_are_typed_errors(tmp_path):
    root = _npz_dir(str(tmp_path / "d"), n=3)
    with pytest.raises(ConfigError, match="need 3 labels"):
        np.save(str(tmp_path / "l.npy"), np.arange(5))
        feedline.open_dataset(root, format="files", labels=str(tmp_path / "l.npy")).index  # noqa: B018
    (tmp_path / "d" / "img_999.npz").write_bytes(b"")
    with pytest.raises(CorruptDataError, match=r"img_999\.npz @ byte 0: empty file"):
        feedline.open_dataset(root, format="files", sidecar=False).index  # noqa: B018
    with pytest.raises(CorruptDataError, match=r"x\.npz @ byte 0: not a readable \.npz"):
        load_npz(b"PK\x03\x04garbage", "x.npz")
    (tmp_path / "e").mkdir()
    with pytest.raises(UnsupportedFormatError, match="no files ending in"):
        feedline.open_dataset(str(tmp_path / "e"), format="files")
    with pytest.raises(ConfigError, match="does not take option"):
        feedline.open_dataset(root, format="files", bogus=1)
