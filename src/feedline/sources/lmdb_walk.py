# SPDX-License-Identifier: Apache-2.0
"""An in-memory LMDB cursor over pages fetched by the caller (LMDBIO-DM and -DIO seeks).

liblmdb can only reach record *i* by walking: down the leftmost path of the B+tree,
then leaf after leaf through the parents. :class:`PageWalker` does the same walk with
feedline's page layout rules (the ones ``feedline._core`` validates: 16-byte page
header, slot array, nodes with 8-byte headers, values inline or in overflow runs), but
it never reads the file itself: a *fetch* callable hands it page bytes, so the pages
can come from a speculative prefetch buffer, from a page cache, or from one ``pread``
each. A :class:`WalkCursor` is (pages, slots, record) — page numbers and slot indices,
not pointers — so it is portable between processes by construction (what LMDBIO-DM
gets from a symmetric mmap). The trade-off: walking in Python costs ~10 µs per leaf
page, negligible next to the reads it replaces, but only whole pages are parsed
(vectorised with numpy), never liblmdb's lazy per-node access.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptDataError

P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
F_BIGDATA = 0x01
PAGE_HEADER = 16
NODE_HEADER = 8
MAX_DEPTH = 32  # liblmdb's CURSOR_STACK


@dataclass(frozen=True, slots=True)
class WalkCursor:
    """A portable cursor: the (page, slot) path from the root to a leaf, and its record."""

    pages: tuple[int, ...]
    slots: tuple[int, ...]
    record: int

    def pack(self) -> np.ndarray:
        """Fixed-size int64 message ``[record, depth, pages..., slots...]`` (for MPI)."""
        out = np.full(2 + 2 * MAX_DEPTH, -1, dtype=np.int64)
        d = len(self.pages)
        out[0], out[1] = self.record, d
        out[2 : 2 + d] = self.pages
        out[2 + MAX_DEPTH : 2 + MAX_DEPTH + d] = self.slots
        return out

    @classmethod
    def unpack(cls, msg: np.ndarray) -> WalkCursor:
        d = int(msg[1])
        if not 0 < d <= MAX_DEPTH:
            raise ValueError(f"bad cursor message (depth {d})")
        pages = tuple(int(x) for x in msg[2 : 2 + d])
        slots = tuple(int(x) for x in msg[2 + MAX_DEPTH : 2 + MAX_DEPTH + d])
        return cls(pages, slots, int(msg[0]))


@dataclass(frozen=True, slots=True)
class ParsedPage:
    """A branch or leaf page: per slot, the child (branch) or the value extent (leaf).

    ``inline`` marks leaf values stored in the page itself; ``overflow`` the first
    overflow page of the others (0 when inline).
    """

    pgno: int
    leaf: bool
    children: np.ndarray
    value_offsets: np.ndarray
    value_lengths: np.ndarray
    overflow: np.ndarray

    @property
    def nkeys(self) -> int:
        return len(self.children) if not self.leaf else len(self.value_offsets)


def parse_page(raw: bytes | np.ndarray, pgno: int, page_size: int, path: str) -> ParsedPage:
    """Parse and bounds-check branch or leaf page *pgno* from its *raw* bytes.

    Raises
    ------
    CorruptDataError
        A header or node that does not fit the page, a page of another kind, or a page
        that names another page number.
    """
    base = pgno * page_size
    b = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    if len(b) < page_size:
        raise CorruptDataError(path, base, f"page {pgno} truncated ({len(b)} bytes)")
    hdr = b[:PAGE_HEADER]
    stored = int(hdr[:8].view("<u8")[0])
    flags = int(hdr[10]) | int(hdr[11]) << 8
    lower = int(hdr[12]) | int(hdr[13]) << 8
    upper = int(hdr[14]) | int(hdr[15]) << 8
    if stored != pgno:
        raise CorruptDataError(path, base, f"page {pgno} says it is page {stored}")
    kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW)
    if kind not in (P_BRANCH, P_LEAF):
        raise CorruptDataError(
            path, base, f"page {pgno}: expected a branch or leaf (flags {flags:#x})"
        )
    if not (PAGE_HEADER <= lower <= upper <= page_size) or (lower - PAGE_HEADER) % 2:
        raise CorruptDataError(path, base + 12, f"page {pgno}: bad lower/upper {lower}/{upper}")
    n = (lower - PAGE_HEADER) // 2
    ptr = b[PAGE_HEADER:lower].view("<u2").astype(np.int64)
    if n and (ptr.min() < upper or ptr.max() + NODE_HEADER > page_size or (ptr % 2).any()):
        raise CorruptDataError(
            path, base + PAGE_HEADER, f"page {pgno}: node pointer out of the node area"
        )
    lo = b[ptr].astype(np.int64) | b[ptr + 1].astype(np.int64) << 8
    hi = b[ptr + 2].astype(np.int64) | b[ptr + 3].astype(np.int64) << 8
    nflags = b[ptr + 4].astype(np.int64) | b[ptr + 5].astype(np.int64) << 8
    ksize = b[ptr + 6].astype(np.int64) | b[ptr + 7].astype(np.int64) << 8
    data = ptr + NODE_HEADER + ksize
    z = np.zeros(0, dtype=np.int64)
    if kind == P_BRANCH:
        if n and (data.max() > page_size):
            raise CorruptDataError(path, base, f"branch page {pgno}: key runs past the page")
        child = lo | hi << 16 | nflags << 32
        return ParsedPage(pgno, False, child, z, z, z)
    dsize = lo | hi << 16
    big = (nflags & F_BIGDATA) != 0
    need = data + np.where(big, 8, dsize)
    if n and need.max() > page_size:
        raise CorruptDataError(path, base, f"leaf page {pgno}: node runs past the page")
    over = np.zeros(n, dtype=np.int64)
    if big.any():
        idx = np.flatnonzero(big)
        starts = data[idx]
        words = np.stack([b[starts + k].astype(np.uint64) << np.uint64(8 * k) for k in range(8)])
        over[idx] = np.bitwise_or.reduce(words, axis=0).astype(np.int64)
        if (over[idx] < 2).any():
            raise CorruptDataError(path, base, f"leaf page {pgno}: overflow page number < 2")
    offs = np.where(big, over * page_size + PAGE_HEADER, base + data)
    return ParsedPage(pgno, True, z, offs, dsize, over)


class PageWalker:
    """Walks the main tree of one LMDB file over pages given by *fetch*.

    Parameters
    ----------
    path : str
        The data file (for error messages).
    root, page_size, entries : int
        From the meta page (``feedline.formats.lmdb.LmdbFile(path).meta``).
    fetch : callable
        ``fetch(pgno) -> bytes`` of one page (page_size bytes).
    cache_branches : bool
        Keep parsed branch pages (a few per thousand leaves) for the walker's life.

    Not thread-safe. ``pages_seen`` lists every page number parsed, in order, since the
    last :meth:`take_seen` (what a liblmdb cursor would have faulted in).
    """

    def __init__(
        self,
        path: str,
        *,
        root: int,
        page_size: int,
        entries: int,
        fetch: Callable[[int], bytes | np.ndarray],
        cache_branches: bool = True,
    ) -> None:
        self.path, self.root, self.page_size, self.entries = (
            path,
            int(root),
            int(page_size),
            int(entries),
        )
        self.fetch = fetch
        self._branches: dict[int, ParsedPage] = {}
        self._cache = cache_branches
        self._leaf: ParsedPage | None = None
        self.pages_seen: list[int] = []

    def page(self, pgno: int) -> ParsedPage:
        """Parsed page *pgno* (branches from the cache when kept)."""
        leaf = self._leaf
        if leaf is not None and leaf.pgno == pgno:
            return leaf
        p = self._branches.get(pgno)
        if p is not None:
            return p
        self.pages_seen.append(int(pgno))
        p = parse_page(self.fetch(int(pgno)), int(pgno), self.page_size, self.path)
        if p.leaf:
            self._leaf = p
        elif self._cache:
            self._branches[int(pgno)] = p
        return p

    def take_seen(self) -> list[int]:
        seen, self.pages_seen = self.pages_seen, []
        return seen

    def _descend(self, pages: list[int], slots: list[int]) -> None:
        """Extend the path down the leftmost children to a leaf."""
        while True:
            if len(pages) > MAX_DEPTH:
                raise CorruptDataError(
                    self.path, pages[-1] * self.page_size, "tree deeper than 32 levels"
                )
            p = self.page(pages[-1])
            if p.leaf:
                if p.nkeys == 0:
                    raise CorruptDataError(
                        self.path, p.pgno * self.page_size, f"empty leaf page {p.pgno}"
                    )
                return
            if p.nkeys == 0:
                raise CorruptDataError(
                    self.path, p.pgno * self.page_size, f"empty branch page {p.pgno}"
                )
            slots.append(0)
            pages.append(int(p.children[0]))

    def first(self) -> WalkCursor:
        """The cursor at record 0 (root to the leftmost leaf)."""
        if self.entries == 0:
            raise IndexError("empty database")
        pages, slots = [self.root], list[int]()
        self._descend(pages, slots)
        return WalkCursor(tuple(pages), (*slots, 0), 0)

    def _next_leaf(self, pages: list[int], slots: list[int]) -> None:
        """Move a path (slots without the leaf's) to the first slot of the next leaf."""
        pages.pop()
        while pages:
            p = self.page(pages[-1])
            if slots[-1] + 1 < p.nkeys:
                slots[-1] += 1
                pages.append(int(p.children[slots[-1]]))
                self._descend(pages, slots)
                return
            pages.pop()
            slots.pop()
        raise CorruptDataError(self.path, 0, "cursor ran past the last leaf before the last record")

    def walk(self, cursor: WalkCursor, n: int, *, collect: bool = True):
        """Advance *cursor* over *n* records; return ``(cursor, offsets, lengths)``.

        With *collect* the value extents of the *n* records passed over are returned
        (absolute file offsets); otherwise two empty arrays (a pure seek).
        """
        if n < 0:
            raise ValueError("walk only moves forward")
        if cursor.record + n > self.entries:
            raise IndexError(f"record {cursor.record + n} beyond the {self.entries} records")
        pages, slots = list(cursor.pages), list(cursor.slots[:-1])
        slot = cursor.slots[-1]
        offs: list[np.ndarray] = []
        lens: list[np.ndarray] = []
        left = n
        while True:
            leaf = self.page(pages[-1])
            if not leaf.leaf:
                raise CorruptDataError(
                    self.path, leaf.pgno * self.page_size, "cursor path does not end at a leaf"
                )
            take = min(left, leaf.nkeys - slot)
            if collect and take > 0:
                offs.append(leaf.value_offsets[slot : slot + take])
                lens.append(leaf.value_lengths[slot : slot + take])
            left -= take
            slot += take
            if slot < leaf.nkeys or (left == 0 and cursor.record + n >= self.entries):
                break
            self._next_leaf(pages, slots)
            slot = 0
            if left == 0:
                break
        z = np.zeros(0, dtype=np.int64)
        out = WalkCursor(tuple(pages), (*slots, slot), cursor.record + n)
        return (
            out,
            np.concatenate(offs) if offs else z,
            np.concatenate(lens) if lens else z,
        )
