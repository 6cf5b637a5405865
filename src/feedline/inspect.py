# SPDX-License-Identifier: Apache-2.0
"""``feedline index`` and ``feedline inspect``: build a dataset's index, explain its layout.

``feedline index PATH`` scans the dataset now (the format's indexer: LMDB tree pages,
HDF5 metadata, TFRecord frames, ...) and writes the index sidecar that later opens load
instead of scanning; it prints where the sidecar went and how long the scan took.
``feedline inspect PATH`` prints what feedline sees: format, files, samples, record
sizes, how much of the files is payload, and the format's layout facts (for LMDB the
B+tree depth and its branch, leaf and overflow pages), each with a line saying why it
matters for I/O; ``--json`` prints the same for machines. A dataset written by
``feedline make`` carries a manifest, whose format and open options are used unless
given on the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .dataset import Dataset, open_dataset, read_manifest
from .errors import ConfigError, FeedlineError

# option name -> (flag, type, help): the open_dataset options both commands accept
OPEN_OPTIONS: dict[str, tuple[str, type, str]] = {
    "record_bytes": ("--record-bytes", int, "records: bytes per record, label included"),
    "label_bytes": ("--label-bytes", int, "records: leading label bytes of each record"),
    "header_bytes": ("--header-bytes", int, "records: bytes to skip at the start of each file"),
    "dataset": ("--dataset", str, "HDF5: the data dataset (default: the only/largest)"),
    "labels": ("--labels", str, "HDF5: the labels dataset; npy: the labels .npy file"),
}

# What each layout fact means for reading, shown beside its value.
EXPLAIN: dict[str, str] = {
    "page_size": "bytes per LMDB page: the unit of every tree read",
    "depth": "B+tree levels from root to leaf: pages a cursor seek touches per record",
    "entries": "records in the main database",
    "branch_pages": "interior pages (separator keys and child page numbers)",
    "leaf_pages": "leaf pages (keys, small records inline, pointers to overflow runs)",
    "overflow_pages": "pages of records too large for a leaf, each record one contiguous run",
    "overflow_records": "records stored in overflow runs (contiguous: one read each)",
    "free_pages": "pages on LMDB's free list (left by earlier transactions)",
    "unaccounted_pages": "pages neither in the tree nor free (should be 0)",
    "txnid": "last committed write transaction (= commits for a never-updated database)",
    "crc_verified": "TFRecord length and payload CRC32Cs were checked while indexing",
    "scan_preads": "reads the TFRecord scan needed",
    "scan_bytes": "bytes the index scan read",
    "dataset": "HDF5 dataset holding the samples",
    "labels": "dataset or file holding the labels",
    "layout": "HDF5 storage layout (contiguous: each row one extent, no chunk lookups; "
    "chunked: rows are read through their chunks)",
    "sample_shape": "shape of one decoded sample",
    "dtype": "element type of a decoded sample",
    "dtype_descr": "the .npy header's dtype description (numpy's descr: structured dtypes too)",
    "npy_version": ".npy format version of the first file (1.0, 2.0 or 3.0)",
    "label_byte": "which of the label bytes is the label (None: the label bytes as one number)",
    "record_bytes": "bytes per fixed-length record",
    "label_bytes": "label bytes at the start of each record",
    "header_bytes": "bytes skipped at the start of each file",
    "label_classes": "distinct label values",
    "compressed_spans": "compressed units read and unpacked whole (HDF5 chunks, gzip segments)",
    "unpacked_record_bytes": "bytes of all records once unpacked",
    "compression_ratio": "unpacked record bytes / stored compressed bytes",
    "filters": "HDF5 filters, unpacked natively (libdeflate, byte shuffle, LZF)",
    "chunk_rows": "samples per HDF5 chunk",
    "compression": "records are stored compressed",
    "gzip_members": "gzip members (each one a restart point without history)",
    "restart_points": "places inflating can start: member starts and saved 32 KiB windows",
    "restart_windows": "restart points inside a member (32 KiB of history each, in the index)",
    "restart_bytes": "the restart interval set when indexing (decompressed bytes): at most this much "
    "extra inflate per record",
    "decompressed_bytes": "size of the decompressed TFRecord stream",
}


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def _add_open_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path", nargs="+", metavar="PATH", help="dataset directory, file(s) or glob (quote globs)"
    )
    p.add_argument(
        "--format",
        choices=("lmdb", "hdf5", "tfrecord", "npy", "records"),
        help="dataset format (default: detected; 'records' must be named)",
    )
    g = p.add_argument_group("format options (as open_dataset's keyword arguments)")
    for name, (flag, kind, help_) in OPEN_OPTIONS.items():
        g.add_argument(flag, dest=name, type=kind, default=None, help=help_)


def open_from_args(
    args: argparse.Namespace, *, sidecar: bool = True
) -> tuple[Dataset, dict | None]:
    """Open the dataset named on the command line; also return its make manifest."""
    path: Any = args.path[0] if len(args.path) == 1 else list(args.path)
    manifest = read_manifest(args.path[0]) if len(args.path) == 1 else None
    # for a file, the manifest applies only when it is one of the files it lists
    if (
        manifest is not None
        and not os.path.isdir(args.path[0])
        and os.path.basename(args.path[0]) not in manifest.get("files", [])
    ):
        manifest = None
    fmt = args.format
    options: dict[str, Any] = {}
    if manifest is not None and fmt in (None, manifest.get("format")):
        fmt = manifest.get("format")
        options.update(manifest.get("open_options") or {})
    options.update({k: getattr(args, k) for k in OPEN_OPTIONS if getattr(args, k) is not None})
    try:
        ds = open_dataset(path, format=fmt, sidecar=sidecar, **options)
    except FileNotFoundError as e:  # a user's typo, not a crash: report it like other errors
        if isinstance(e, FeedlineError):
            raise
        raise ConfigError(str(e.args[0] if e.args else e)) from None
    return ds, manifest


# --------------------------------------------------------------------------- index


def run_index(args: argparse.Namespace) -> int:
    ds, _ = open_from_args(args)
    t0 = time.perf_counter()
    idx = ds.build_index()
    scan_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    where = ds.write_sidecar(idx)
    write_s = time.perf_counter() - t1
    print(
        f"indexed {len(idx):,} samples of {ds.format} in {len(ds.files)} file(s) "
        f"in {scan_s:.3f} s (+{write_s:.3f} s to write the sidecar)"
    )
    if where is None:
        print(
            "feedline: warning: no writable place for the sidecar (dataset directory and "
            "FEEDLINE_CACHE_DIR are read-only); opens will scan again",
            file=sys.stderr,
        )
        return 1
    print(f"sidecar: {where} ({_human(os.path.getsize(where))})")
    return 0


# ------------------------------------------------------------------------- inspect


def inspect_dataset(ds: Dataset, manifest: dict | None = None) -> dict[str, Any]:
    """Everything ``feedline inspect`` reports, as a JSON-serialisable dict."""
    t0 = time.perf_counter()
    _ = ds.index
    index_s = time.perf_counter() - t0
    info = ds.describe()
    info["paths"] = [{"path": f, "bytes": os.path.getsize(f)} for f in ds.files]
    info["root"] = ds.root
    info["index_seconds"] = index_s
    info["sidecar"] = ds.sidecar_path
    if manifest is not None:
        info["made_by"] = {
            k: manifest[k]
            for k in (
                "generator",
                "mimics",
                "samples",
                "seed",
                "shuffle",
                "options",
                "record",
                "provenance",
            )
            if k in manifest
        }
    return info


_GENERAL = {"format", "files", "samples", "file_bytes", "payload_bytes", "record_bytes_min",
            "record_bytes_max", "record_bytes_mean", "payload_fraction", "paths", "root",
            "index_seconds", "sidecar", "made_by", "decode"}  # fmt: skip


def render(info: dict[str, Any]) -> str:
    """The human-readable report."""
    out = []
    n_files = info["files"]
    out.append(_title(info))
    out.append(f"  format     {info['format']}, {n_files} file(s), {_human(info['file_bytes'])}")
    out.append(f"  samples    {info['samples']:,}")
    if "record_bytes_min" in info:
        lo, hi, mean = info["record_bytes_min"], info["record_bytes_max"], info["record_bytes_mean"]
        size = f"{lo:,} B each" if lo == hi else f"{lo:,} to {hi:,} B (mean {mean:,.0f})"
        out.append(f"  records    {size}")
    packed = "unpacked_record_bytes" in info  # compressed: the payload is stored bytes
    out.append(
        f"  payload    {_human(info['payload_bytes'])}"
        + (" stored compressed" if packed else "")
        + f" = {100 * info['payload_fraction']:.1f}% of the file bytes (the rest is headers, "
        "tree pages, framing, padding)"
        + (f"; {_human(info['unpacked_record_bytes'])} of records once unpacked" if packed else "")
    )
    if info.get("decode"):
        out.append(f"  decode     {info['decode']}")
    made = info.get("made_by")
    if made:
        sort_key = "class" if "classes" in (made.get("options") or {}) else "target 0"
        order = "shuffled" if made.get("shuffle") else f"sorted by {sort_key}"
        out.append(
            f"  made by    feedline make {made.get('generator')} (seed {made.get('seed')}, "
            f"{order}); mimics {made.get('mimics')}"
        )
        if made.get("record"):
            out.append(f"  record     {made['record']}")
    facts = {k: v for k, v in info.items() if k not in _GENERAL}
    if facts:
        out.append(f"  layout ({info['format']}):")
        width = max(len(k) for k in facts)
        for k, v in facts.items():
            val = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
            why = EXPLAIN.get(k, "")
            out.append(f"    {k:<{width}}  {val:<14} {why}".rstrip())
    prov = (made or {}).get("provenance")
    if prov:
        out.append("  provenance (recorded when the LMDB was written; LMDBIO §4.4):")
        for k in ("commit_every", "commits", "key_format", "insertion_order", "writer"):
            if k in prov:
                out.append(f"    {k:<16} {prov[k]}")
    out.append("  files:")
    shown = info["paths"][:10]
    for p in shown:
        out.append(f"    {os.path.relpath(p['path'], info['root']):<40} {_human(p['bytes']):>10}")
    if len(info["paths"]) > len(shown):
        out.append(f"    ... and {len(info['paths']) - len(shown)} more")
    side = info.get("sidecar")
    out.append(
        f"  index      {info['index_seconds']:.3f} s "
        + (f"(sidecar {side})" if side else "(no sidecar)")
    )
    return "\n".join(out)


def _title(info: dict[str, Any]) -> str:
    """What was inspected: the LMDB directory, the one file (with the HDF5 dataset
    inside it), or the directory of the files."""
    where = info["root"]
    if info["format"] != "lmdb" and info["files"] == 1 and info.get("paths"):
        where = info["paths"][0]["path"]
    inner = info.get("dataset") if info["format"] == "hdf5" else None
    if inner:
        each = "" if info["files"] == 1 else " in each file"
        where += f"  (HDF5 dataset /{str(inner).lstrip('/')}{each})"
    return where


def run_inspect(args: argparse.Namespace) -> int:
    ds, manifest = open_from_args(args, sidecar=not args.no_sidecar)
    with ds:
        info = inspect_dataset(ds, manifest)
    if args.json:
        json.dump(info, sys.stdout, indent=2, sort_keys=True, default=str)
        print()
    else:
        print(render(info))
    return 0


# ----------------------------------------------------------------------------- CLI

_INDEX_EPILOG = """\
examples:
  feedline index /scratch/cifar10_large_lmdb
  feedline index /scratch/cifar10-bin --format records --record-bytes 3073 --label-bytes 1
  feedline index '/scratch/cosmoflow/*.h5' --dataset x --labels y
"""

_INSPECT_EPILOG = """\
examples:
  feedline inspect /scratch/cifar10_large_lmdb
  feedline inspect /scratch/cosmoflow --json > layout.json
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``feedline index`` and ``feedline inspect``."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "index",
        help="build or refresh a dataset's index sidecar",
        description=__doc__,
        epilog=_INDEX_EPILOG,
        formatter_class=fmt,
    )
    _add_open_arguments(p)
    p.set_defaults(func=run_index)
    q = sub.add_parser(
        "inspect",
        help="explain a dataset's layout (format, records, pages)",
        description=__doc__,
        epilog=_INSPECT_EPILOG,
        formatter_class=fmt,
    )
    _add_open_arguments(q)
    q.add_argument("--json", action="store_true", help="print JSON instead of the report")
    q.add_argument(
        "--no-sidecar", action="store_true", help="scan without reading or writing an index sidecar"
    )
    q.set_defaults(func=run_inspect)


__all__ = ["EXPLAIN", "OPEN_OPTIONS", "add_parser", "inspect_dataset", "open_from_args", "render"]
