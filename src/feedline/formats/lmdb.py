# SPDX-License-Identifier: Apache-2.0
"""LMDB datasets (``data.mdb``), indexed by a native parser of LMDB's on-disk B+tree.

The indexer (``feedline._core.lmdb_index``) reads the two meta pages, keeps the newest
valid one, and walks the main tree breadth-first, one level at a time: each level's
pages are read in page-number order with coalesced ``pread`` calls of adjacent pages,
and only branch and leaf pages are read — an overflow value's position follows from its
leaf node, so for large records the indexer reads a few percent of the file. The
trade-off is holding one tree level's page list in memory to sort and coalesce reads.
Every field is bounds-checked and cross-checked (key order against parent separators,
exact node tiling, meta counts, and no page owned twice by the tree, an overflow run or
the free lists); damage raises :class:`~feedline.errors.CorruptDataError`, named
sub-databases and DUPSORT raise :class:`~feedline.errors.UnsupportedFormatError`.

:class:`LmdbFile` is the page-level view the run-time seeking strategies use: the meta,
one validated page by number, and a cursor walk to the *i*-th record that reports the
pages a liblmdb cursor would have touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..errors import CorruptDataError, DatasetNotFoundError, UnsupportedFormatError
from ..index import Index, Keys
from .base import Decoder, Format, RawDecoder, register

__all__ = [
    "Cursor",
    "LmdbFile",
    "LmdbFormat",
    "Page",
    "Seek",
    "data_file",
    "index_lmdb",
]

_STAT_FIELDS = (
    "page_size", "txnid", "last_pgno", "meta_page", "file_bytes", "entries", "depth",
    "branch_pages", "leaf_pages", "overflow_pages", "overflow_records", "payload_bytes",
    "key_bytes", "free_tree_pages", "free_pages", "unaccounted_pages", "pages_checked",
    "overflow_verified", "bytes_read", "read_ops",
)  # fmt: skip

_PAGE_KINDS = {1: "branch", 2: "leaf", 4: "overflow", 8: "meta"}


def data_file(path: str | os.PathLike[str]) -> str:
    """The LMDB data file for *path*: ``path/data.mdb`` for a directory, else *path*.

    Raises
    ------
    UnsupportedFormatError
        When a directory holds no ``data.mdb``.
    DatasetNotFoundError
        When *path* does not exist (a ``FileNotFoundError``).
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        f = os.path.join(p, "data.mdb")
        if not os.path.isfile(f):
            raise UnsupportedFormatError(p, "directory holds no data.mdb (not an LMDB environment)")
        return os.path.abspath(f)
    if not os.path.exists(p):
        raise DatasetNotFoundError(p, "no such LMDB")
    return os.path.abspath(p)


def index_lmdb(
    path: str | os.PathLike[str],
    *,
    verify_overflow: bool = False,
    check_pages: bool = True,
    max_read_bytes: int = 8 << 20,
) -> Index:
    """Index the main database of an LMDB with explicit reads.

    Parameters
    ----------
    path : str or path
        An LMDB directory or its ``data.mdb``.
    verify_overflow : bool
        Also read each overflow run's header page (one small read per large record).
        Done automatically when the meta's overflow count shows runs longer than their
        values need.
    check_pages : bool
        Walk the free-page tree too and reject any page used twice (default True).
    max_read_bytes : int
        Largest coalesced read of adjacent tree pages.

    Returns
    -------
    Index
        One file (``file_ids`` all 0), records in key order, ``keys`` set and ``meta``
        holding the layout statistics (see :func:`layout_stats`).

    Raises
    ------
    CorruptDataError, UnsupportedFormatError, StorageError
    """
    f = data_file(path)
    opts = _core._LmdbIndexOptions()  # type: ignore[attr-defined]  # _core.pyi: stubgen omits _names
    opts.verify_overflow = bool(verify_overflow)
    opts.check_pages = bool(check_pages)
    opts.max_read_bytes = int(max_read_bytes)
    native = _core.lmdb_index(f, opts)
    offsets = np.asarray(native.offsets)
    return Index(
        files=[f],
        file_ids=np.zeros(len(offsets), dtype=np.int32),
        offsets=offsets,
        lengths=np.asarray(native.lengths),
        keys=Keys(np.asarray(native.key_blob), np.asarray(native.key_starts)),
        meta=layout_stats(native.stats),
    )


def layout_stats(stats: Any) -> dict[str, Any]:
    """The native stats as a JSON-ready dict, plus ``payload_fraction`` and ``read_fraction``.

    ``bytes_read``/``read_ops`` are what building the index read; the rest describes the
    file: page size, tree depth, branch/leaf/overflow page counts, entries, last txnid,
    free and unaccounted pages.
    """
    d: dict[str, Any] = {k: getattr(stats, k) for k in _STAT_FIELDS}
    d["pages_checked"] = bool(d["pages_checked"])
    d["overflow_verified"] = bool(d["overflow_verified"])
    size = max(1, int(d["file_bytes"]))
    d["payload_fraction"] = d["payload_bytes"] / size
    d["read_fraction"] = d["bytes_read"] / size
    return d


@register
class LmdbFormat(Format):
    """An LMDB environment: a directory with ``data.mdb``, or the ``data.mdb`` itself.

    Options: ``verify_overflow`` and ``check_pages`` (see :func:`index_lmdb`).
    """

    name = "lmdb"
    extensions = (".mdb",)
    options = ("verify_overflow", "check_pages")

    @classmethod
    def sniff(cls, path: str) -> bool:
        p = os.fspath(path)
        if os.path.isdir(p):
            return os.path.isfile(os.path.join(p, "data.mdb"))
        return p.lower().endswith(".mdb")

    def resolve(self, path):
        if isinstance(path, list | tuple):
            if len(path) != 1:
                raise UnsupportedFormatError(
                    str(path), "an LMDB dataset is one environment (directory or data.mdb)"
                )
            path = path[0]
        f = data_file(path)
        return os.path.dirname(f), [f]

    def build_index(self, progress: bool = False) -> Index:
        return index_lmdb(
            self.files[0],
            verify_overflow=bool(self.opts.get("verify_overflow", False)),
            check_pages=bool(self.opts.get("check_pages", True)),
        )

    def make_decoder(self, index: Index) -> Decoder:
        """Caffe ``Datum`` records when :mod:`feedline.formats.datum` exists, else raw."""
        try:
            from .datum import DatumDecoder
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.datum":
                raise
            return RawDecoder(index)
        return DatumDecoder(index)

    def detect_decode(self, index: Index) -> str | None:
        """None when the first records are Caffe ``Datum`` (the decoder applies), else why
        the records are delivered as raw bytes (pickled, msgpack, JPEG ... values)."""
        try:
            from .datum import _read_record
        except ModuleNotFoundError as e:  # pragma: no cover - datum is part of feedline
            if e.name != f"{__package__}.datum":
                raise
            return "records delivered as raw bytes (no Datum decoder)"
        for i in range(min(DETECT_RECORDS, len(index))):
            rec = _read_record(index, i)
            why = _not_datum(rec)
            if why is not None:
                return (
                    f"record {i} is not a Caffe Datum ({why}): delivering raw bytes "
                    "(decode=False); pass decode=True to force Datum decoding"
                )
        return None

    def describe(self, index: Index) -> dict[str, Any]:
        keep = (
            "page_size", "depth", "entries", "branch_pages", "leaf_pages", "overflow_pages",
            "overflow_records", "free_pages", "unaccounted_pages", "txnid", "file_bytes",
            "payload_fraction",
        )  # fmt: skip
        return {k: index.meta[k] for k in keep if k in index.meta}


#: records checked by :meth:`LmdbFormat.detect_decode`
DETECT_RECORDS = 8


def _not_datum(rec: bytes) -> str | None:
    """None when *rec* is a plausible Caffe Datum, else why not."""
    from ..errors import CorruptDataError
    from .datum import parse_datum

    try:
        d = parse_datum(rec)
    except CorruptDataError as e:
        return e.reason
    if d.encoded:
        return None if d.data_size > 0 else "an encoded Datum without image bytes"
    pixels = int(d.channels) * int(d.height) * int(d.width)
    if pixels <= 0:
        return "no channels/height/width"
    if pixels not in (int(d.data_size), int(d.float_count)):
        return f"{d.data_size} data bytes for a {d.channels}x{d.height}x{d.width} image"
    return None


# ----------------------------------------------------------------------- page level


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position in the main tree: (page, slot) from the root down to a leaf."""

    pages: tuple[int, ...]
    slots: tuple[int, ...]
    record: int

    @property
    def leaf(self) -> int:
        """The leaf page under the cursor."""
        return self.pages[-1]

    @property
    def slot(self) -> int:
        """The slot in that leaf."""
        return self.slots[-1]


@dataclass(frozen=True, slots=True)
class Seek:
    """Result of a cursor walk: where it ended, what it read, the record there."""

    cursor: Cursor
    pages_touched: np.ndarray
    value_offset: int
    value_length: int
    key: bytes


@dataclass(frozen=True, slots=True)
class Page:
    """A validated page.

    ``kind`` is ``"branch"``, ``"leaf"``, ``"overflow"`` or ``"meta"``. Branch pages
    give ``children``; leaf pages give ``value_offsets``/``value_lengths`` (absolute in
    the file) and ``node_flags`` (1 = value in overflow pages). ``keys[0]`` of a branch
    page is ignored by LMDB (usually empty). ``raw`` is the whole page.
    """

    pgno: int
    kind: str
    flags: int
    lower: int
    upper: int
    nkeys: int
    overflow_pages: int
    keys: list[bytes]
    children: np.ndarray
    value_offsets: np.ndarray
    value_lengths: np.ndarray
    node_flags: np.ndarray
    raw: bytes


class LmdbFile:
    """Page-level access to an LMDB data file with explicit ``pread`` (no mmap).

    Parameters
    ----------
    path : str or path
        An LMDB directory or its ``data.mdb``.

    Notes
    -----
    Not thread-safe (it counts bytes read): use one per thread. ``meta`` is the newest
    valid meta page as a dict (``page_size``, ``txnid``, ``last_pgno``, ``meta_page``,
    ``main_db`` and ``free_db`` with ``root``, ``depth``, ``entries``, page counts).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = data_file(path)
        self._impl = _core._LmdbFile(self.path)  # type: ignore[attr-defined]  # _core.pyi: stubgen omits _names
        m = self._impl.meta
        db = lambda d: {  # noqa: E731
            k: getattr(d, k)
            for k in (
                "flags",
                "depth",
                "branch_pages",
                "leaf_pages",
                "overflow_pages",
                "entries",
                "root",
            )
        }
        self.meta: dict[str, Any] = {
            k: getattr(m, k)
            for k in ("page_size", "version", "txnid", "last_pgno", "map_size", "meta_page",
                      "other_meta_valid", "file_bytes")
        }  # fmt: skip
        self.meta["main_db"] = db(m.main_db)
        self.meta["free_db"] = db(m.free_db)

    def __len__(self) -> int:
        return int(self.meta["main_db"]["entries"])

    @property
    def bytes_read(self) -> int:
        """Bytes read from the file through this object."""
        return int(self._impl.bytes_read)

    @property
    def read_ops(self) -> int:
        """``pread`` calls made through this object."""
        return int(self._impl.read_ops)

    def read_page(self, pgno: int) -> Page:
        """Read and validate page *pgno* (one page-sized read).

        Raises
        ------
        CorruptDataError
            Out of range, truncated, or inconsistent header/nodes.
        """
        p = self._impl.read_page(int(pgno))
        raw = p.bytes
        nodes = p.nodes
        return Page(
            pgno=int(p.pgno),
            kind=_PAGE_KINDS[p.kind],
            flags=int(p.flags),
            lower=int(p.lower),
            upper=int(p.upper),
            nkeys=len(nodes),
            overflow_pages=int(p.overflow_pages),
            keys=[raw[n.key_pos : n.key_pos + n.key_size] for n in nodes],
            children=np.array([n.child for n in nodes], dtype=np.uint64) if p.kind == 1 else np.zeros(0, np.uint64),
            value_offsets=np.array([n.value_offset for n in nodes], dtype=np.int64) if p.kind == 2 else np.zeros(0, np.int64),
            value_lengths=np.array([n.value_length for n in nodes], dtype=np.int64) if p.kind == 2 else np.zeros(0, np.int64),
            node_flags=np.array([n.flags for n in nodes], dtype=np.uint16),
            raw=raw,
        )  # fmt: skip

    def seek(self, i: int) -> Seek:
        """Walk from the root to record *i* the way a liblmdb cursor stepping from the
        first record would (leftmost path, then leaf after leaf).

        Raises
        ------
        IndexError
            When *i* is not a record number.
        CorruptDataError
            When the tree is inconsistent on the way.
        """
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range for {len(self)} records")
        return self._wrap(self._impl.seek(i))

    def advance(self, cursor: Cursor, n: int) -> Seek:
        """Move *cursor* forward by *n* records, re-reading its path first (a cursor
        handed to another process starts from its own pages)."""
        if n < 0:
            raise ValueError("advance only moves forward")
        if cursor.record + n >= len(self):
            raise IndexError(f"record {cursor.record + n} out of range for {len(self)} records")
        c = _core._LmdbCursor()  # type: ignore[attr-defined]  # _core.pyi: stubgen omits _names
        c.pages = list(cursor.pages)
        c.slots = list(cursor.slots)
        c.record = int(cursor.record)
        return self._wrap(self._impl.advance(c, int(n)))

    @staticmethod
    def _wrap(r: Any) -> Seek:
        c = r.cursor
        return Seek(
            cursor=Cursor(
                tuple(int(x) for x in c.pages), tuple(int(x) for x in c.slots), int(c.record)
            ),
            pages_touched=np.asarray(r.pages_touched, dtype=np.uint64),
            value_offset=int(r.value_offset),
            value_length=int(r.value_length),
            key=bytes(r.key),
        )

    def close(self) -> None:
        """Close the file descriptor."""
        self._impl = None

    def __enter__(self) -> LmdbFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_mappable(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check that an LMDB data file holds every page its meta page counts; return the meta.

    liblmdb (and py-lmdb) map the file and touch pages up to the meta's last page: on a
    truncated file that is a ``SIGBUS`` no Python code can catch. Call this before
    handing a file to liblmdb (and again before each batch read through its map).

    Raises
    ------
    CorruptDataError
        No valid meta page, or the file is shorter than ``(last_pgno + 1) * page_size``
        (names the file, its size as the offset, and both sizes).
    """
    with LmdbFile(path) as lf:
        meta = lf.meta
        file = lf.path
    need_bytes(file, meta)
    return meta


def need_bytes(file: str, meta: dict[str, Any], size: int | None = None) -> None:
    """Raise CorruptDataError when *file* (of *size* bytes, stat'ed when None) is shorter
    than the pages *meta* (from :class:`LmdbFile`) counts."""
    size = os.path.getsize(file) if size is None else size
    need = (int(meta["last_pgno"]) + 1) * int(meta["page_size"])
    if size < need:
        raise CorruptDataError(
            file,
            size,
            f"truncated: {size} bytes, but meta page {meta['meta_page']} (txn {meta['txnid']}) "
            f"counts pages 0..{meta['last_pgno']} of {meta['page_size']} bytes = {need} bytes; "
            "liblmdb would fault (SIGBUS) reading past the end",
        )
