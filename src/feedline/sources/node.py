# SPDX-License-Identifier: Apache-2.0
"""``node``: k readers per node fill a node shared-memory window; every rank copies out.

LMDBIO's LMM pattern without mmap: the plan (``feedline.plan.reads``) gives each of a
node's k reader ranks one coalesced read operation per window of w steps covering the
node's samples. The readers read into one half of a double-buffered window allocated
with ``Win.Allocate_shared`` (``World.node_array``, once per Loader); every rank of the
node then copies its own sub-batch out, in delivery order. Fewer, larger reads per node
and a single copy per sample.

*Plans are made once per node.* The first reader plans each window (``window_ops``: which
extents every reader reads and where each sample lands) one window ahead, while the
node's reads are in flight, and publishes the plan in the window's table (one per half)
when it submits the window's reads, for the node's other ranks, who only select their
own samples from it. No rank computes the node's whole epoch up front, planning costs
one rank's CPU per node instead of every rank's, and the disk does not wait for a plan
(the plan of a window of 32k samples takes 10-20 ms: planned at submission, it left
the disk idle that long twice per epoch, 7-15% of the epoch on local disk).

*Protocol* (no collective per window). A small control block at the start of the
window holds, per rank of the node, one int64 word ``pos`` = (pass, windows released)
and, per reader, ``ready`` = (pass, windows complete) and ``fail`` = (pass, failed
window) with the pickled exception next to it. Passes are numbered per rank (every
``start``); a rank entering window r publishes "released r-1"; a reader reads window
r+1 into the half of window r-1 once every rank of the node has released r-1 (or left
the pass), and publishes "complete" after its read; a rank waits (polling, with
``MPI_Win_sync`` barriers) until every reader has completed its window. So:

- an I/O error on a reader is published with its window and raised, typed, on every
  rank of the node when it reaches that window (in step order, never a hang);
- a rank that leaves a pass early (``break``, an exception, ``close``) publishes that it
  released everything: the others go on. A *reader* that leaves keeps reading its share
  for the others on a background thread until every rank of the node has finished or
  left that pass; when its Loader is closed it waits for them while they make
  progress, and gives up after ``STALL_S`` seconds without progress of any rank of the
  node, publishing :class:`NodePeerLeft` as the failure of the windows it did not read;
  a rank waiting for a reader that closed its Loader raises :class:`NodePeerLeft`;
- a rank whose pass does not match (another epoch or step at the same pass number:
  the node's ranks iterated different numbers of passes) raises
  :class:`NodeOutOfStepError` instead of delivering another pass's data. A rank's pass
  key is compared only while its ``pos`` says it is *in* that pass (not departed): a rank
  writes its next pass's key before it publishes that it entered it, so a departed
  rank's key may already be the next pass's;
- a pass reads nothing into the halves until every reader of the node has published
  ``clear`` for it (its reads of older passes, on serving threads, are over) or closed:
  the next pass reuses the halves with another layout, and a late read of the old one
  would overwrite part of the new one's data.

The window is allocated at the first pass (collective: every rank of the node must
start iterating once) and freed at ``close`` when every rank of the node closes within
``CLOSE_GRACE_S`` of the others (``MPI_Win_free`` is collective); otherwise it is left
allocated until the process exits, so that a rank that closes early, or fails and
exits, never waits for peers that may not come. All ranks of a node should still
iterate the same epochs and steps, as data-parallel training does.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from typing import Any

import numpy as np

from .. import _core, defaults
from ..dist import ops as mpi
from ..dist.alarm import WaitBound
from ..dist.world import FreeVote
from ..errors import FeedlineError
from ..pipeline.reader import ExtentReader, ReadList, direct_align, gather
from .base import RawBatch, Source, SourceContext, SourceStopped, register_source
from .node_plan import (
    _OP_HEAD,
    _pack_ops,
    _plan_key,
    _unpack_ops,
    _window_bytes,
    window_layout,
)

#: seconds a closing reader keeps serving peers that make no progress before it gives up
STALL_S = 10.0
#: seconds a closing rank waits for the node's other ranks to close (collective free)
CLOSE_GRACE_S = 5.0

_PASS_STRIDE = 1 << 32  # pos/ready/fail words: pass * _PASS_STRIDE + count
_DEPARTED = _PASS_STRIDE - 1  # count meaning "released every window of the pass"
_CLOSED = (1 << 62) - 1  # pos of a rank whose Loader is closed
_ERR_BYTES = 8192  # per reader: length + pickled failure
_HEAD = 8  # words before the per-rank words (word 0: close counter; word 1: doorbell)
_W_BELL = 1  # rung (feedline._core.doorbell_ring) after every published control word
#: longest doorbell wait before a waiting rank checks its peers and its wait bound again
BELL_SLICE_S = 0.05
#: longest wait of a reader on its own read in flight before it looks at the node again
#: (its completion rings no bell; the node's releases, which let it read on, do)
READ_SLICE_S = 0.002


class NodePeerLeft(FeedlineError):
    """A rank of this node left (closed its Loader, gave up) while this rank needed it."""

    def __init__(self, rank: int, node: int, detail: str) -> None:
        self.rank, self.node, self.detail = int(rank), int(node), detail
        super().__init__(f"rank {self.rank} of node {self.node} left the node's pass: {detail}")

    def __reduce__(self):
        return (type(self), (self.rank, self.node, self.detail))


class NodeOutOfStepError(FeedlineError):
    """The ranks of a node iterate different passes (epochs/steps) of the node source."""


def _enc(gen: int, count: int) -> int:
    """A control word: pass number *gen* and a count within it (windows released,
    complete or planned), ordered so that later passes compare greater."""
    return gen * _PASS_STRIDE + count


class _Pass:
    """One pass (``start`` .. ``stop``/``finish``) of this rank."""

    def __init__(self, gen: int, plan, steps: list, unit: int, key: int, after: list) -> None:
        self.gen, self.plan, self.steps, self.unit, self.key = gen, plan, steps, unit, key
        self.ops: dict[int, list] = {}  # window -> every reader's ReadOp (planned or shared)
        self.after = after  # serving threads of older passes: read nothing before they end
        self.futures: dict[int, Any] = {}
        self.next_submit = 0
        self.published = 0
        self.failed: BaseException | None = None
        self.win = -1
        self.cur: dict | None = None
        self.cleared = False  # this reader published that its older passes are over
        self.clear = False  # every reader of the node did: this pass may use the halves


class NodeWindowSource(Source):
    """k readers per node read into a node window (two halves); ranks copy out."""

    name = "node"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        if ctx.world is None:
            raise ValueError("the node source needs an MPI World (feedline.dist)")
        self.world = ctx.world
        self._reader: ExtentReader | None = None
        self._shm: Any = None
        self._half = 0
        self._align: tuple[int, Any] = (0, None)  # (direct-I/O block, file sizes)
        self._gen = 0
        self._pass: _Pass | None = None
        self._serving: list[tuple[threading.Thread, threading.Event]] = []
        self._stop_evt = threading.Event()
        self._stats = {"window_bytes": 0, "node_syncs": 0, "read_windows": 0}
        self._pause = defaults.get("poll_sleep_us") * 1e-6

    # -------------------------------------------------------------- layout
    def _layout(self, n: int, k: int, half: int, tab: int) -> None:
        self._n, self._k, self._tab = n, k, tab
        self._w_pos = _HEAD
        self._w_steps = _HEAD + n
        self._w_key = _HEAD + 2 * n
        self._w_ready = _HEAD + 3 * n
        self._w_fail = _HEAD + 3 * n + k
        self._w_rkey = _HEAD + 3 * n + 2 * k  # the pass key of each reader's last flag
        self._w_planned = _HEAD + 3 * n + 3 * k  # (pass, windows planned by the first reader)
        # per reader: (pass, 0) once no read of its older passes can land (serving threads ended)
        self._w_clear = _HEAD + 3 * n + 3 * k + 1
        words = _HEAD + 3 * n + 4 * k + 1
        self._err0 = -(-words * 8 // 64) * 64
        self._tab0 = -(-(self._err0 + k * _ERR_BYTES) // 64) * 64
        ctrl = self._tab0 + 2 * tab
        self._data0 = -(-ctrl // 4096) * 4096
        self._total = self._data0 + 2 * max(half, 1)

    def _allocate(self, half: int, tab: int) -> None:
        self._layout(self._n, self._k, half, tab)
        shm = self.world.node_array(self._total, np.uint8, owner=0)
        shm.lock_all()
        # MPI does not zero it: with one rank per node MPICH's window is private memory, and a
        # new Loader's got the last one's control words, taken by a same-numbered pass as its own
        if self.world.node_rank == 0:
            shm.array[: self._data0] = 0  # control words, failures, plan tables
        shm.sync()
        self.world.node_barrier()  # nobody publishes before the words are zero
        shm.sync()
        self._shm = shm
        self._half = max(half, 1)
        self._ctl = shm.array[: self._err0].view(np.int64)
        self._bell = shm.array[8 * _W_BELL : 8 * _W_BELL + 4].view(np.uint32)
        self._tabs = shm.array[self._tab0 : self._tab0 + 2 * tab].reshape(2, tab)
        data = shm.array[self._data0 : self._data0 + 2 * self._half]
        self._halves = data.reshape(2, self._half)
        self._stats["window_bytes"] = 2 * half

    # ---------------------------------------------------------------- setup
    def start(self, plan, first_step: int) -> None:
        from ..plan.reads import unit_of, windows

        self.stop()
        self._stop_evt.clear()
        rank = self.ctx.rank
        node = plan.world.node_of(rank)
        readers = list(plan.readers_of(node))
        ranks = plan.world.ranks_of(node)
        self._node, self._readers, self._rank_lo = node, readers, ranks.start
        self._me = rank - ranks.start
        self._is_reader = rank in readers
        self._my = readers.index(rank) if self._is_reader else -1
        self._reader_idx = np.array([r - ranks.start for r in readers], dtype=np.int64)
        unit, _ = unit_of(plan, readers[0])
        steps = windows(plan)
        rpn = len(ranks)
        half, tab = _window_bytes(plan, rpn, len(readers))
        key = _plan_key(plan, first_step)
        # every rank: one that plans a window its table could not hold must widen it too
        self._align = direct_align(self.ctx.dataset.files, plan.strategy.read, self._align[1])
        if self._is_reader and self._reader is None:
            self._reader = ExtentReader(  # shared: maybe staged (pipeline.reader.stage_reads)
                self.ctx.dataset.files,
                self.ctx.options.io_threads,  # the Loader's: its ranks' (plan.cost.reader_threads)
                plan.strategy.read,
                timeout_s=self.ctx.options.timeout_s,
                shared=True,
            )
        self._gen += 1
        if self._shm is None:
            self._n, self._k = rpn, len(readers)
            self._allocate(half, tab)  # collective: the node's first pass
        elif half > self._half or tab > self._tab:
            self._regrow(max(half, self._half), max(tab, self._tab), key)
        self._ctl[self._w_key + self._me] = key
        self._publish(self._w_pos + self._me, _enc(self._gen, 0))
        self._serving = [(t, e) for t, e in self._serving if t.is_alive()]
        self._pass = _Pass(self._gen, plan, steps, unit, key, [t for t, _ in self._serving])
        if self._is_reader:
            self._pump(self._pass)

    def _regrow(self, half: int, tab: int, key: int) -> None:
        """A larger window: every rank of the node is in this same ``start`` (same plan)."""
        g = self._gen
        self._ctl[self._w_key + self._me] = key
        self._publish(self._w_pos + self._me, _enc(g, 0))
        while True:
            pos = self._pos_all()
            self._check_closed(pos, "the node window must grow (a collective)")
            self._check_keys(g, key)
            if (pos >= _enc(g, 0)).all():
                break
            time.sleep(self._pause)
        for t, _ in self._serving:
            t.join()
        self._serving = []
        self._shm.free()  # collective over the node, every rank is here
        self._allocate(half, tab)

    # ------------------------------------------------------------ control words
    def _publish(self, word: int, value: int) -> None:
        self._shm.sync()  # what this rank wrote or read before is ordered before the flag
        self._ctl[word] = value
        self._ring()

    def _ring(self) -> None:
        """Wake the node's ranks waiting for a control word to change (``_wait``)."""
        _core.doorbell_ring(self._bell, 0)

    def _wait(self, this_pass: _Pass, bell: int) -> None:
        """Wait for the node's control words to change since the doorbell read *bell*.

        A rank waits on the doorbell (a futex: no CPU, woken by the next publication)
        for at most ``BELL_SLICE_S``, so that it still checks its peers and its wait
        bound; a reader with a read of its own in flight waits on that read instead, in
        ``READ_SLICE_S`` slices (a completed read rings nothing until it publishes it).
        """
        if self._is_reader and this_pass.published in this_pass.futures:
            wait = getattr(this_pass.futures[this_pass.published], "wait", None)
            if wait is not None:
                wait(READ_SLICE_S)
            else:
                time.sleep(self._pause)
            return
        _core.doorbell_wait(self._bell, 0, bell, BELL_SLICE_S)

    def _pos_all(self) -> np.ndarray:
        return self._ctl[self._w_pos : self._w_pos + self._n].copy()

    def _check_closed(self, pos: np.ndarray, why: str) -> None:
        closed = np.flatnonzero(pos == _CLOSED)
        if len(closed):
            r = int(closed[0]) + self._rank_lo
            raise NodePeerLeft(r, self._node, f"it closed its Loader; {why}")

    def _check_keys(self, gen: int, key: int) -> None:
        """Ranks in the same pass number must run the same plan (else: out of step).

        A rank's key word is rewritten at its next ``start`` while its pos word still
        says it *departed* this pass (the key is written before the new pos is
        published): a departed rank is skipped, and a key counts only if the rank's pos
        word, read before and after it, shows the same pass, not departed.
        """
        lo, hi = _enc(gen, 0), _enc(gen, _DEPARTED)
        for i in range(self._n):
            p = int(self._ctl[self._w_pos + i])
            if lo <= p < hi:
                self._shm.sync()
                k = int(self._ctl[self._w_key + i])
                self._shm.sync()
                if int(self._ctl[self._w_pos + i]) == p and k != key:
                    raise NodeOutOfStepError(
                        f"rank {i + self._rank_lo} of node {self._node} runs another pass "
                        f"(epoch/step) than rank {self.ctx.rank} at the same pass number: the "
                        "ranks of a node must iterate the same epochs and steps"
                    )

    # ------------------------------------------------------------ window plans
    def _plan_window(self, this_pass: _Pass, r: int) -> list:
        """The first reader plans window *r* (or takes the plan it made ahead,
        :meth:`_plan_ahead`) and publishes it in table ``r % 2``."""
        ops = self._planned(this_pass, r)
        words = self._tabs[r % 2].view(np.int64)
        n = _pack_ops(ops, words[3:])
        words[0], words[1], words[2] = n, this_pass.key, r  # n < 0: too large, the others plan it
        self._publish(self._w_planned, _enc(this_pass.gen, r + 1))
        return ops

    def _shared_ops(self, this_pass: _Pass, r: int) -> list:
        """Window *r*'s plan: this rank's own, or the first reader's from the table."""
        ops = this_pass.ops.get(r)
        if ops is not None:
            return ops
        self._shm.sync()
        words = self._tabs[r % 2].view(np.int64)
        n, key, win = (int(x) for x in words[:3])
        if key != this_pass.key or win != r:
            raise NodeOutOfStepError(
                f"the plan of window {r} in node {self._node}'s table belongs to another pass "
                f"(epoch/step) than rank {self.ctx.rank}'s: the ranks of a node must iterate "
                "the same epochs and steps"
            )
        if n < 0:  # pragma: no cover - see _plan_window
            ops = self._window_ops(this_pass, r)
        else:
            ops = _unpack_ops(words[3 : 3 + n], r, this_pass.steps[r])
        this_pass.ops[r] = ops
        return ops

    def _window_ops(self, this_pass: _Pass, r: int) -> list:
        """Window *r*'s read operations, widened to whole direct-I/O blocks when reads
        are ``odirect`` and they still fit a half (``plan.reads.align_op``: each read
        lands in place, no bounce copy). Pure: every rank of the node gets the same."""
        from ..plan.reads import align_op, window_ops

        p = this_pass
        ops = window_ops(p.plan, p.unit, self._readers, r, p.steps[r], cap=self._half)
        block, sizes = self._align
        if not block:
            return ops
        wide = [align_op(o, block, sizes) for o in ops]
        # fit a half, and the table (a file's tail is an extent: twice the extents at worst)
        words = sum(_OP_HEAD + 3 * len(o.lengths) + 5 * len(o.ids) for o in wide)
        fits = words <= self._tab // 8 - 3
        return wide if fits and sum(o.buffer_bytes for o in wide) <= self._half else ops

    # ------------------------------------------------------------- reader duty
    def _read_window(self, this_pass: _Pass, r: int):
        op = this_pass.ops[r][self._my]
        base = sum(o.buffer_bytes for o in this_pass.ops[r][: self._my])
        view = self._halves[r % 2, base : base + op.buffer_bytes]
        assert self._reader is not None
        self._stats["read_windows"] += 1
        reads = ReadList(op.file_ids, op.offsets, op.lengths, op.placement())
        return self._reader.submit(reads, view)

    def _pump(self, this_pass: _Pass) -> None:
        """Publish this reader's finished reads; start those the node has room for."""
        if this_pass.failed is not None:
            return
        while (
            this_pass.published in this_pass.futures
            and this_pass.futures[this_pass.published].done()
        ):
            f = this_pass.futures.pop(this_pass.published)
            try:
                f.result()
            except BaseException as e:
                self._fail(this_pass, this_pass.published, e)
                return
            this_pass.published += 1
            self._ctl[self._w_rkey + self._my] = this_pass.key
            self._publish(self._w_ready + self._my, _enc(this_pass.gen, this_pass.published))
        self._submit(this_pass)
        self._plan_ahead(this_pass)  # also when the next half is not free yet

    def _submit(self, this_pass: _Pass) -> None:
        """Start the reads of the windows the node has room for (two at most)."""
        n = len(this_pass.steps)
        while this_pass.next_submit < n and this_pass.next_submit - this_pass.published < 2:
            if not this_pass.clear and not self._clear(this_pass):
                return  # an older pass's reads may still land in the halves
            w = this_pass.next_submit
            pos = self._pos_all()
            if (pos < _enc(this_pass.gen, max(w - 1, 0))).any():
                return  # some rank still reads the half of window w-2 (or an older pass)
            if (pos >= _enc(this_pass.gen, _DEPARTED)).all():
                return  # nobody needs it
            if self._my > 0 and self._ctl[self._w_planned] < _enc(this_pass.gen, w + 1):
                return  # the first reader has not planned it yet
            self._shm.sync()
            try:
                if self._my == 0:
                    self._plan_window(this_pass, w)
                else:
                    self._shared_ops(this_pass, w)
                this_pass.futures[w] = self._read_window(this_pass, w)
            except BaseException as e:
                self._fail(this_pass, w, e)
                return
            this_pass.next_submit += 1

    def _plan_ahead(self, this_pass: _Pass) -> None:
        """The first reader plans the next window to read while the node's reads are in
        flight, so that submitting it, once its half is free, does not wait for the plan
        (10-20 ms per window of 32k samples: the disk would idle meanwhile). The plan is
        published with the submission (its table may still hold the plan of a window
        being read)."""
        w = this_pass.next_submit
        if self._my == 0 and this_pass.failed is None and w < len(this_pass.steps):
            self._planned(this_pass, w)

    def _planned(self, this_pass: _Pass, r: int) -> list:
        """Window *r*'s plan, made once per pass (:meth:`_window_ops`)."""
        ops = this_pass.ops.get(r)
        if ops is None:
            ops = this_pass.ops[r] = self._window_ops(this_pass, r)
        return ops

    def _clear(self, this_pass: _Pass) -> bool:
        """Whether no read of an older pass, by any reader of the node, can still land in
        the halves (so this pass may read into them).

        A reader that left a pass keeps reading it on a serving thread; the pass it
        starts next waits for that thread (``after``), and so must the node's other
        readers: their next pass reuses the same halves with another layout, and a late
        read of the old pass would overwrite part of the new one's data. Each reader
        publishes ``clear`` = (pass, 0) once its serving threads have ended; a pass reads
        nothing until every reader of the node has published it for this pass or a later
        one (later: its serving threads ended too), or has closed its Loader (``close``
        ends them before it publishes that).
        """
        if not this_pass.cleared:
            if any(t.is_alive() for t in this_pass.after):
                return False
            self._publish(self._w_clear + self._my, _enc(this_pass.gen, 0))
            this_pass.cleared = True
        self._shm.sync()
        clear = self._ctl[self._w_clear : self._w_clear + self._k]
        closed = self._pos_all()[self._reader_idx] == _CLOSED
        if not ((clear >= _enc(this_pass.gen, 0)) | closed).all():
            return False
        this_pass.clear = True
        return True

    def _fail(self, this_pass: _Pass, window: int, exc: BaseException) -> None:
        """Publish this reader's failure at *window* (the node's ranks raise it there)."""
        from ..dist.world import _Failure

        this_pass.failed = exc
        blob = pickle.dumps(_Failure(exc, self.ctx.rank))
        if len(blob) > _ERR_BYTES - 8:
            f = _Failure(exc, self.ctx.rank)
            f.exc = None
            blob = pickle.dumps(f)[: _ERR_BYTES - 8]
        at = self._err0 + self._my * _ERR_BYTES
        arr = self._shm.array
        arr[at : at + 8].view(np.int64)[0] = len(blob)
        arr[at + 8 : at + 8 + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        self._publish(self._w_fail + self._my, _enc(this_pass.gen, window + 1))

    def _failure_of(self, j: int) -> BaseException:
        at = self._err0 + j * _ERR_BYTES
        arr = self._shm.array
        n = int(arr[at : at + 8].view(np.int64)[0])
        try:
            f = pickle.loads(arr[at + 8 : at + 8 + n].tobytes())
            f.raise_()
        except BaseException as e:  # the reader's exception, or why it could not be read
            return e
        return FeedlineError(f"reader {self._readers[j]} failed")  # pragma: no cover

    def _drain(self, this_pass: _Pass) -> None:
        for f in this_pass.futures.values():
            with contextlib.suppress(BaseException):
                f.result()  # never free or reuse memory the engine still writes

    def _serve(self, this_pass: _Pass, cancel: threading.Event) -> None:
        """A reader that left the pass *this_pass* keeps reading it for the node's other ranks."""
        try:
            while (
                not cancel.is_set()
                and this_pass.failed is None
                and this_pass.published < len(this_pass.steps)
            ):
                self._pump(this_pass)
                pos = self._pos_all()
                pos[self._me] = _CLOSED
                if (pos >= _enc(this_pass.gen, _DEPARTED)).all():
                    return
                time.sleep(self._pause)
        except BaseException as e:  # pragma: no cover - published for the peers
            with contextlib.suppress(BaseException):
                self._fail(this_pass, this_pass.published, e)
        finally:
            self._drain(this_pass)
            if (
                cancel.is_set()
                and this_pass.failed is None
                and this_pass.published < len(this_pass.steps)
            ):
                self._pump(this_pass)  # what finished while draining is still good
                if this_pass.failed is None:
                    self._fail(
                        this_pass,
                        this_pass.published,
                        NodePeerLeft(
                            self.ctx.rank,
                            self._node,
                            f"its Loader was closed and no rank of the node made progress "
                            f"for {STALL_S:g} s; it did not read step {this_pass.steps[this_pass.published].start}"
                            " and later (every rank of a node must iterate the same steps)",
                        ),
                    )

    # -------------------------------------------------------------- consumer
    def _enter(self, this_pass: _Pass, r: int) -> None:
        """Release window r-1 and wait until every reader completed window r."""
        g = this_pass.gen
        self._publish(self._w_pos + self._me, _enc(g, r))
        need = _enc(g, r + 1)
        ready = slice(self._w_ready, self._w_ready + self._k)
        fail = slice(self._w_fail, self._w_fail + self._k)
        bound = WaitBound(self.world, f"the readers of node {self._node} (window {r})")
        while True:
            bell = int(self._bell[0])  # before the words: a change after it rings
            if self._is_reader:
                self._pump(this_pass)
            pos = self._pos_all()  # before the flags: a reader closes after its last flag
            self._shm.sync()
            rd = self._ctl[ready].copy()
            fl = self._ctl[fail].copy()
            bad = np.flatnonzero((fl > _enc(g, 0)) & (fl <= need))
            if len(bad):
                self._shm.sync()
                raise self._failure_of(int(bad[0]))
            if (rd >= need).all():
                self._shm.sync()
                keys = self._ctl[self._w_rkey : self._w_rkey + self._k]
                if (keys != this_pass.key).any():
                    j = int(np.flatnonzero(keys != this_pass.key)[0])
                    raise NodeOutOfStepError(
                        f"reader rank {self._readers[j]} of node {self._node} read another pass "
                        f"(epoch/step) than rank {self.ctx.rank} at the same pass number: the "
                        "ranks of a node must iterate the same epochs and steps"
                    )
                break
            for j in np.flatnonzero(rd < need).tolist():
                if pos[self._reader_idx[j]] == _CLOSED:
                    raise NodePeerLeft(
                        self._readers[j],
                        self._node,
                        f"it closed its Loader before reading step {this_pass.steps[r].start}, which "
                        f"rank {self.ctx.rank} needs (every rank of a node must iterate the "
                        "same steps)",
                    )
            self._check_keys(g, this_pass.key)  # ranks in this pass number must run this plan
            if self._stop_evt.is_set():
                raise SourceStopped()
            bound.check()  # a failed or dead peer anywhere, or past the wait's bound
            self._wait(this_pass, bell)
        self._shm.sync()  # the readers' data is visible after their flags
        self._stats["node_syncs"] += 1
        ops = self._shared_ops(this_pass, r)
        this_pass.cur = window_layout(
            this_pass.plan, ops, this_pass.steps[r], self.ctx.rank, self._rank_lo
        )
        for old in [w for w in this_pass.ops if w < r - 1]:
            del this_pass.ops[old]
        this_pass.win = r

    def get(self, step: int) -> RawBatch:
        this_pass = self._pass
        if this_pass is None:
            raise SourceStopped()
        while this_pass.win < 0 or step >= this_pass.steps[this_pass.win].stop:
            self._enter(this_pass, this_pass.win + 1)
        if self._is_reader:
            self._pump(this_pass)
        self._ctl[self._w_steps + self._me] += 1  # progress, for a closing reader
        cur = this_pass.cur
        assert cur is not None
        i = step - cur["steps"].start
        a, b = int(cur["bounds"][i]), int(cur["bounds"][i + 1])
        if a == b:
            return RawBatch.empty()
        data = gather(self._halves[this_pass.win % 2], cur["src"][a:b], cur["size"][a:b])
        return RawBatch(cur["ids"][a:b], data, cur["size"][a:b])

    # ------------------------------------------------------------- lifecycle
    def request_stop(self) -> None:
        self._stop_evt.set()  # a wait sees it within BELL_SLICE_S

    def stop(self) -> None:
        this_pass, self._pass = self._pass, None
        if this_pass is None or self._shm is None:
            return
        self._publish(self._w_pos + self._me, _enc(this_pass.gen, _DEPARTED))
        if not self._is_reader:
            return
        pos = self._pos_all()
        pos[self._me] = _CLOSED
        if (
            this_pass.failed is None
            and this_pass.published < len(this_pass.steps)
            and (pos < _enc(this_pass.gen, _DEPARTED)).any()
        ):
            cancel = threading.Event()
            t = threading.Thread(
                target=self._serve,
                args=(this_pass, cancel),
                name=f"feedline-r{self.ctx.rank}-node-serve",
                daemon=True,
            )
            self._serving.append((t, cancel))
            t.start()
        else:
            self._drain(this_pass)

    def _progress(self) -> int:
        c = self._ctl
        return int(c[self._w_steps : self._w_steps + self._n].sum()) + int(
            (self._pos_all() % _PASS_STRIDE).sum()
        )

    def _finish_serving(self) -> None:
        """Wait for the passes this reader still serves while the node makes progress."""
        last, t_last = self._progress(), time.monotonic()
        for t, cancel in self._serving:
            while t.is_alive():
                t.join(0.05)
                now = self._progress()
                if now != last:
                    last, t_last = now, time.monotonic()
                elif time.monotonic() - t_last > STALL_S:
                    cancel.set()
                    t.join()
        self._serving = []

    def _release_window(self) -> None:
        """Free the window if every rank of the node closes within the grace period."""
        shm, self._shm = self._shm, None
        self._publish_closed(shm)
        vote = FreeVote(lambda c, v: shm.compare_and_swap(0, c, v), self._n)  # word 0
        if vote.decide(CLOSE_GRACE_S, self._pause):
            shm.free()  # collective: every rank of the node is here or on its way
        else:
            shm.abandon()  # the others will abandon it too

    def _publish_closed(self, shm) -> None:
        shm.sync()
        self._ctl[self._w_pos + self._me] = _CLOSED
        shm.sync()
        self._ring()

    def memory_bytes(self, plan) -> int:
        # two halves and tables of a window of the node's samples, and the readers' staging
        # buffers; per rank, since the Loader multiplies by the ranks of a node
        rpn = max(1, self.ctx.ranks_per_node)
        readers = plan.strategy.readers_per_node or 1
        half, tab = _window_bytes(plan, rpn, readers)
        stage = ExtentReader.stage_bytes(self.ctx.dataset.files, plan.strategy.read)
        return (2 * (half + tab) + readers * self.ctx.options.io_threads * stage) // rpn

    def stats(self) -> dict[str, Any]:
        st = (
            self._reader.stats()
            if self._reader is not None
            else {"storage_bytes": 0, "storage_ops": 0, "io_s": 0.0}
        )
        st.update(self._stats, reader=bool(getattr(self, "_is_reader", False)))
        st["buffer_bytes"] = self._stats["window_bytes"]
        return st

    def close(self) -> None:
        try:
            self.stop()
            if self._shm is not None and not mpi.finalized():
                self._finish_serving()
                self._release_window()
        finally:
            for t, cancel in self._serving:  # MPI is gone: nothing left to serve
                cancel.set()
                t.join()
            self._serving = []
            if self._reader is not None:
                self._reader.close()
                self._reader = None


register_source(NodeWindowSource)
