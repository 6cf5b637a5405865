# SPDX-License-Identifier: Apache-2.0
"""A model of an LMDB file written by Caffe (sequential puts), for ``feedline plan``.

From a synthetic description — N records of v bytes with k-byte keys, 4 KiB pages — it
places every record the way liblmdb's append path does, closely enough to count bytes
and pages: a leaf holds ``floor((page - 16) / (node + 2))`` nodes of ``8 + k + v`` bytes
(even-aligned); a node larger than LMDB's ``nodemax`` (2,038 bytes with 4 KiB pages)
keeps an 8-byte page number and its value goes to ``ceil((16 + v) / page)`` overflow
pages, written before the leaf that points to them; inline nodes fill a leaf from the
end of the page downwards. Branch pages and commit boundaries are ignored (< 2% of the
file; ``tests/test_plan_cli.py`` compares the model with files written by liblmdb). Walking a cursor reads the leaf pages — the
redundant bytes of the seeking presets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .records import UniformRecords

PAGE = 4096
PAGE_HEADER = 16
NODE_HEADER = 8
META_PAGES = 2


def nodemax(page: int = PAGE) -> int:
    """Largest node kept inline in a leaf (liblmdb's ``me_nodemax`` with MDB_MINKEYS=2)."""
    return (((page - PAGE_HEADER) // 2) & -2) - 2


@dataclass(frozen=True)
class LmdbModel(UniformRecords):
    """N records of *size* bytes under *key* -byte keys in an LMDB file of *page* pages."""

    n: int
    size: int
    key: int = 8
    page: int = PAGE

    @property
    def overflow(self) -> bool:
        """True when values live in overflow pages."""
        return NODE_HEADER + self.key + self.size > nodemax(self.page)

    @property
    def node_bytes(self) -> int:
        body = NODE_HEADER + self.key + (8 if self.overflow else self.size)
        return body + (body & 1)

    @property
    def per_leaf(self) -> int:
        """Records per leaf page."""
        return max(1, (self.page - PAGE_HEADER) // (self.node_bytes + 2))

    @property
    def overflow_pages(self) -> int:
        """Overflow pages per record (0 when inline)."""
        return -(-(PAGE_HEADER + self.size) // self.page) if self.overflow else 0

    @property
    def leaf_pages(self) -> int:
        return -(-self.n // self.per_leaf) if self.n else 0

    @property
    def file_bytes(self) -> int:
        return (META_PAGES + self.leaf_pages + self.n * self.overflow_pages) * self.page

    @property
    def walk_bytes(self) -> int:
        """Bytes a cursor reads to pass over every record (the leaf pages)."""
        return self.leaf_pages * self.page

    def extents(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        j, slot = np.divmod(ids, self.per_leaf)
        if self.overflow:
            group = self.per_leaf * self.overflow_pages + 1  # the overflow runs, then the leaf
            page = META_PAGES + j * group + slot * self.overflow_pages
            off = page * self.page + PAGE_HEADER
        else:  # nodes fill a leaf from the end of the page downwards
            end = (META_PAGES + j + 1) * self.page
            off = end - (slot + 1) * self.node_bytes + NODE_HEADER + self.key
        return np.zeros_like(ids), off, np.full_like(ids, self.size)
