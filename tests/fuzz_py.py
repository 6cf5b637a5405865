#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""atheris (libFuzzer for Python) targets of feedline's Python parsers of untrusted bytes.

    python tests/fuzz_py.py TARGET [libFuzzer options] [CORPUS_DIR...]

Targets: ``npy`` (the .npy header parser), ``sidecar`` (index sidecars; the harness also
re-seals the CRC of each input so the column parser is reached), ``state`` (saved loader
states, raw and re-sealed, through ``Loader.load_state_dict`` and one step), ``hdf5``
(HDF5 files built from fuzzed parameters, whole or truncated, through the HDF5 format's
validation and one read), ``records`` (fixed-length records with fuzzed options and
bytes). Every input must either succeed or raise a feedline error (``FeedlineError``);
anything else is a finding. ``dev/fuzz`` runs these with seeds from dev/fuzz_seeds.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["feedline"]):
    import numpy as np

    import feedline
    from feedline import index as fidx
    from feedline.errors import FeedlineError
    from feedline.formats.npy import read_npy_header
    from feedline.pipeline import state as fstate

WORK = tempfile.mkdtemp(prefix="feedline-atheris-")
_MEMFD = os.memfd_create("feedline-atheris")
_MEMPATH = f"/proc/self/fd/{_MEMFD}"


def _memfile(data: bytes) -> str:
    os.ftruncate(_MEMFD, 0)
    os.pwrite(_MEMFD, data, 0)
    return _MEMPATH


# ------------------------------------------------------------------------------- npy
def npy(data: bytes) -> None:
    path = _memfile(data)
    try:
        h = read_npy_header(path)
    except FeedlineError:
        return
    assert h.data_offset >= 10 and h.data_offset <= len(data) + (1 << 20)
    assert all(int(s) >= 0 for s in h.shape)
    assert not h.dtype.hasobject


# --------------------------------------------------------------------------- sidecar
_SC_DIR = os.path.join(WORK, "sidecar")
os.makedirs(_SC_DIR, exist_ok=True)
_SC_DATA = os.path.join(_SC_DIR, "a.bin")
with open(_SC_DATA, "wb") as _f:
    _f.write(bytes(range(256)) * 4)
_SC_PATH = os.path.join(_SC_DIR, "s.fidx")


def sidecar(data: bytes) -> None:
    for reseal in (False, True):
        raw = bytearray(data)
        if reseal and len(raw) >= fidx._HEAD.size:  # reach the column parser
            struct.pack_into("<I", raw, 12, fidx._crc32c(bytes(raw[fidx._HEAD.size :])))
        with open(_SC_PATH, "wb") as f:
            f.write(raw)
        key = "k"
        with contextlib.suppress(FeedlineError, AttributeError):
            key = str(fidx.read_sidecar_header(_SC_PATH)[0].get("key"))
        try:
            ix = fidx.load_sidecar(_SC_PATH, root=_SC_DIR, files=[_SC_DATA], key=key, check=False)
        except FeedlineError:
            continue
        # accepted: the columns are consistent and bounded by the file
        n = len(ix)
        assert len(ix.file_ids) == len(ix.lengths) == n
        with contextlib.suppress(FeedlineError):
            ix.validate_against_sizes([1024])


# ----------------------------------------------------------------------------- state
_ST_DIR = os.path.join(WORK, "state")
os.makedirs(_ST_DIR, exist_ok=True)
with open(os.path.join(_ST_DIR, "d.bin"), "wb") as _f:
    _f.write(np.arange(40 * 16, dtype=np.uint8).tobytes())
_LOADER = None


def _loader():
    global _LOADER
    if _LOADER is None:
        ds = feedline.open_dataset(
            os.path.join(_ST_DIR, "d.bin"), format="records", record_bytes=16, sidecar=False
        )
        _LOADER = feedline.Loader(ds, 4, preset="tf", decode=False)
    return _LOADER


def state(data: bytes) -> None:
    ld = _loader()
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        body = None
    candidates: list = [data.decode("utf-8", "replace")]
    if isinstance(body, dict):
        base = ld.state_dict()
        merged = {**base, **{k: v for k, v in body.items() if k != "checksum"}}
        merged = {k: v for k, v in merged.items() if k not in ("checksum", "kind", "version")}
        with contextlib.suppress(FeedlineError, TypeError, ValueError):
            candidates.append(fstate.seal(merged))  # a well-formed seal around fuzzed fields
    for cand in candidates:
        try:
            ld.load_state_dict(cand)
        except FeedlineError:
            continue
        # accepted: the next step must deliver valid ids of this dataset
        for b in ld:
            assert ((b.ids >= 0) & (b.ids < 40)).all()
            break
        ld.set_epoch(0)


# ------------------------------------------------------------------------------ hdf5
_H5 = os.path.join(WORK, "f.h5")


def hdf5(data: bytes) -> None:
    import h5py

    fdp = atheris.FuzzedDataProvider(data)
    n = fdp.ConsumeIntInRange(0, 40)
    row = tuple(fdp.ConsumeIntInRange(0, 5) for _ in range(fdp.ConsumeIntInRange(0, 2)))
    dtype = fdp.PickValueInList(["u1", "<f4", ">i8", "<f2", "S3", "?", "<c8", "<i4"])
    layout = fdp.PickValueInList(["contiguous", "chunked", "compact", "gzip"])
    with_labels = fdp.ConsumeIntInRange(0, 3)
    name = fdp.PickValueInList(["data", "x", "images", "grp/data"])
    try:
        with h5py.File(_H5, "w") as f:
            kw: dict = {}
            if layout == "chunked" and n and all(row):
                kw["chunks"] = (max(1, n // 3), *row)
            elif layout == "gzip" and n and all(row):
                kw["compression"] = "gzip"
            elif layout == "compact":
                kw["dtype"] = dtype
            arr = np.zeros((n, *row), dtype=dtype)
            if layout == "compact" and arr.nbytes < 60000:
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.COMPACT)
                sid = h5py.h5s.create_simple(arr.shape or (0,))
                h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(arr.dtype), sid, dcpl=dcpl)
            else:
                f.create_dataset(name, data=arr, **{k: v for k, v in kw.items() if k != "dtype"})
            if with_labels == 1:
                f.create_dataset("labels", data=np.arange(n))
            elif with_labels == 2:
                f.create_dataset("label", data=np.arange(max(0, n - 1)))
            elif with_labels == 3:
                f.create_dataset("y", data=np.zeros((n, 2)))
    except (ValueError, TypeError, OSError):
        return
    size = os.path.getsize(_H5)
    cut = fdp.ConsumeIntInRange(0, size)
    if fdp.ConsumeBool():
        os.truncate(_H5, cut)
    try:
        ds = feedline.open_dataset(_H5, format="hdf5", sidecar=False)
        k = len(ds)
        if k:
            ds.read(k - 1)
        ds.close()
    except FeedlineError:
        pass


# --------------------------------------------------------------------------- records
_RC = os.path.join(WORK, "r.bin")


def records(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    opts = {
        "record_bytes": fdp.ConsumeIntInRange(-2, 64),
        "label_bytes": fdp.ConsumeIntInRange(-1, 5),
        "header_bytes": fdp.ConsumeIntInRange(-1, 32),
    }
    if fdp.ConsumeBool():
        opts["label_byte"] = fdp.ConsumeIntInRange(-1, 6)
    body = fdp.ConsumeBytes(4096)
    with open(_RC, "wb") as f:
        f.write(body)
    try:
        ds = feedline.open_dataset(_RC, format="records", sidecar=False, **opts)
        n = len(ds)
        if n:
            ids = np.arange(min(n, 8))
            raw, lengths = ds.read_many(ids)
            ds.decode(raw, lengths, ids)
        ds.close()
    except FeedlineError:
        pass


TARGETS = {"npy": npy, "sidecar": sidecar, "state": state, "hdf5": hdf5, "records": records}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(__doc__)
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
