# SPDX-License-Identifier: Apache-2.0
"""``store``: DeepIO's distributed in-memory store (§III-A, B), for the ``deepio-*`` presets.

The job's memory holds the samples of the current *round* (the ``memory(R)`` assignment:
a random selection of a fraction R of the dataset's units, permuted completely; R = 1 is
one round of everything). Each rank loads a share of every round from storage into its
part of a job-wide window (``Win.Allocate``) — the round's ids sorted and cut into P
equal runs, so a rank's load is a few long reads: neighbouring records are merged across
holes of at most ``coalesce_gap`` bytes (:data:`STORE_GAP` when 0; LMDB's page headers
and page tails), the holes are read into the slot too and the records are served from
where they landed — and then builds every sub-batch by
one-sided ``MPI_Rget`` from whichever rank holds each sample, one per rank and step (a
copy when it holds it itself): DeepIO's RDMA-assisted in-situ shuffle. The window is
``Win.Allocate``'d, so a get needs no help from its target's CPU (shared memory on one
host, registered memory across hosts). Where each sample lies is computed,
not communicated: every rank derives the same partition from the plan.

The window holds ``slots`` rounds (one when the whole dataset is one round; else the
most rounds a step spans, at least two: DeepIO's double buffering of the hybrid
backend-memory pipeline, so the store holds 2R of the dataset when R < 1). With one
round of everything the store is loaded once and kept: later epochs read nothing from
storage. With several rounds, the next round starts loading into the slot of the oldest
as soon as no step needs that one any more, and is waited for at the first step needing
it; two small collectives on the store's own communicator bracket each load (everyone
is done with the round being overwritten; everyone has loaded the new one). Those collectives carry errors: a rank
that cannot load its share makes every rank raise at the same step (the failing rank its
own typed error, the others :class:`StorePeerFailed`).

Each collective also carries a digest of the pass and the transition (pass number,
epoch, seed, first step, round): ranks iterating different passes raise
:class:`StoreOutOfStepError` together instead of serving each other the wrong bytes.

A rank that leaves a pass early (``break``, an exception, ``close()``) still owes the
others its shares of the rounds left in that pass: a background thread
(``feedline-r*-store-serve``) takes part in the remaining transitions — unless every
rank has left, which the first collective tells everyone — and the rank's next pass, or
its ``close()``, waits for it, however long the others take (its memory holds their
samples). Interrupted there (Ctrl-C), it tells the others by one last collective, and
they raise :class:`StorePeerLeft` together at their next round.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from typing import Any

import numpy as np

from .. import defaults
from ..dist import ops as mpi
from ..errors import ConfigError, FeedlineError
from ..pipeline.reader import ExtentReader, coalesce
from .base import RawBatch, Source, SourceContext, SourceStopped, register_source
from .store_errors import (  # noqa: F401 - re-exported: the store's errors live there
    _CODE_NAMES,
    _DEAD,
    _GONE,
    _LEFT,
    _OK,
    _ORPHANS,
    _STORAGE,
    StoreOutOfStepError,
    StorePeerDied,
    StorePeerFailed,
    StorePeerLeft,
    _code_of,
    _RoundLoad,
    flush_orphans,
)
from .store_plan import (  # noqa: F401 - re-exported: the store's layout lives there
    STORE_GAP,
    _Rounds,
    _share,
    gap_of,
    place_shares,
    share_bytes,
    slot_cache,
    slot_sizes,
    store_bytes,
)

CLOSE_GRACE_S = 5.0
READ_AHEAD = 2  # a progressive store's rounds read at once, and loaded past the consumer's
STALL_S = 10.0  # close() says it is waiting for the others after this long
_log = logging.getLogger("feedline.store")

_PASS_KEYS = ("rma_gets", "shm_gets", "rma_bytes", "rma_wait_s", "node_bytes", "local_bytes")


class StoreSource(Source):
    """Samples served from the job's memory by one-sided reads (DeepIO)."""

    name = "store"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        w = ctx.world
        if ctx.size > 1 and w is None:
            raise ConfigError(
                "the DeepIO store (source='store') needs an MPI world: launch with mpiexec/srun"
            )
        self._world = w
        if ctx.size > 1:
            # a rank that leaves a pass serves the others from a thread
            mpi.require_thread_multiple("the DeepIO store (source='store')")
        self._comm = mpi.dup(w.comm) if w is not None and w.comm is not None else None
        self._P = ctx.size
        self._me = ctx.rank
        index = ctx.dataset.index
        self._fid = np.asarray(index.file_ids, dtype=np.int64)
        self._off = np.asarray(index.offsets, dtype=np.int64)
        self._len = np.asarray(index.lengths, dtype=np.int64)
        n = len(self._len)
        self._owner = np.zeros(n, dtype=np.int32)
        self._disp = np.zeros(n, dtype=np.int64)
        self._reader: ExtentReader | None = None
        self._rma: Any = None
        self._slot_at = np.zeros(1, dtype=np.int64)  # each slot's first byte, and the end
        self._nslots = 0
        self._resident: list[Any] = []  # per slot: (pass key, round) or ("all",) or None
        self._rounds: _Rounds | None = None
        self._pass = 0
        self._hi = -1  # highest round loaded in this pass
        self._failed = False  # this pass failed: nothing more is loaded or delivered
        self._stop = threading.Event()
        self._pending: Any = None  # a collective in flight when a get() was stopped
        self._next: _RoundLoad | None = None  # the round being loaded
        # a progressive store's later rounds of the pass, read ahead (round: future)
        self._ahead: dict[int, Any] = {}
        self._ahead_hi = -1  # the highest round of the pass whose read was submitted
        self._pass_first = 0
        self._lead = 0  # the round the consumer's step needs (paces a progressive load)
        # the resident keys owner/disp describe (a round's placement writes only its own
        # ids: the rounds of a progressive store stay placed across passes)
        self._placed: set[Any] = set()
        self._ids: Any = None  # this rank's ids in the pass, and per-step offsets
        self._offs: Any = None
        self._serve: threading.Thread | None = None
        self._gave_up = False  # this rank stopped serving mid-pass: the store is unusable
        self._peer_gone: str | None = None  # another rank did (told by a collective)
        self._lock = threading.Lock()  # get() vs stop() from another thread (inline runs)
        self._kept = False  # a window was kept (not freed) at a vote: keep the comm too
        self._step = 0
        self._done_pass = True
        self._st: dict[str, float] = dict.fromkeys(_PASS_KEYS, 0) | {"rma_wait_s": 0.0}
        self._st |= {"rounds_loaded": 0, "store_bytes": 0, "shares_uncoalesced": 0}
        self._sized = slot_cache(index)  # slot sizes, by plan shape and gap
        self._gap = STORE_GAP
        self._pause = defaults.get("poll_sleep_us") * 1e-6
        self._watch: Any = None  # PeerWatch of the store's communicator
        self._dead: str | None = None  # a peer died: why
        self._pass_st: dict[str, float] = dict.fromkeys(_PASS_KEYS, 0)

    # ---------------------------------------------------------------- sizing
    def _sizing(self, plan, need: bool = False) -> tuple[_Rounds, np.ndarray]:
        """The plan's rounds and each slot's bytes (:func:`slot_sizes`, its *need*)."""
        rounds = _Rounds(plan)
        ix = (self._fid, self._off, self._len)
        return rounds, slot_sizes(*ix, plan, self._P, rounds, self._sized, need=need)

    def _slot(self, slot: int) -> tuple[int, int]:
        """First byte and size of *slot* in this rank's part of the store."""
        a = int(self._slot_at[slot])
        return a, int(self._slot_at[slot + 1]) - a

    def _extents(self, part: np.ndarray, size: int) -> Any:
        """This rank's *part* of a round as merged reads (through holes of at most the
        gap, or record by record when that would not fit the *size* bytes of its slot),
        and where each record lands in the slot (:func:`place_shares` for all shares)."""
        fid, off, ln = self._fid[part], self._off[part], self._len[part]
        c = coalesce(fid, off, ln, gap=self._gap)
        if c.reads.nbytes > size:
            self._st["shares_uncoalesced"] += 1
            c = coalesce(fid, off, ln, gap=0)
        return c

    def memory_bytes(self, plan) -> int:
        # the slots, and the engine's bounce buffers: a share's merged reads start at
        # records' offsets, which O_DIRECT reads through them (4 MiB at 4 threads)
        bounce = ExtentReader.bounce_bytes(plan.strategy.read, self.ctx.options.io_threads)
        return int(self._sizing(plan)[1].sum()) + bounce

    # -------------------------------------------------------------- protocol
    def _key(self, r: int, stage: int) -> int:
        """A 62-bit digest of this rank's pass and transition (equal on every rank in step)."""
        p = self._plan
        h = hashlib.blake2b(digest_size=8)
        what = (self._pass, p.epoch, p.seed, p.first_step, p.num_steps, p.total, r, stage)
        h.update(repr(what).encode())
        return int.from_bytes(h.digest(), "little") >> 2

    def _collective(self, code: int, key: int) -> np.ndarray:
        """Every rank's (code, key) (an ``Iallgather``, polled; stoppable by
        :meth:`request_stop`): a (P, 2) array."""
        if self._comm is None or self._P == 1:
            return np.array([[code, key]], dtype=np.int64)
        self._post(code, key)
        req, out = self._pending
        t0 = time.monotonic()
        while not mpi.done(req):
            if self._stop.is_set():
                raise SourceStopped
            self._poll(t0)
            time.sleep(self._pause)
        self._pending = None
        return out

    def _post(self, code: int, key: int) -> None:
        """Start the next collective (unless one is in flight: it is the next one)."""
        if self._comm is None or self._P == 1 or self._pending is not None:
            return
        out = np.zeros((self._P, 2), dtype=np.int64)
        req = mpi.iallgather(self._comm, np.array([code, key], dtype=np.int64), out)
        self._pending = (req, out)

    def _poll(self, t0: float) -> None:
        """Between tests of a pending request: raise :class:`StorePeerDied` when a peer
        on this host died, or (``store_peer_timeout_s`` > 0) when the wait begun at *t0*
        lasts longer than that."""
        if self._dead is not None:
            raise StorePeerDied(self._dead)
        if self._watch is None:
            return
        gone = self._watch.dead()
        why = None
        if gone:
            who = ", ".join(self._watch.describe(r) for r in gone)
            why = f"{who} of the in-memory store died"
        else:
            limit = float(defaults.get("store_peer_timeout_s"))
            if limit > 0 and time.monotonic() - t0 > limit:
                why = (
                    f"the other ranks of the in-memory store did not answer within "
                    f"{limit:g} s (FEEDLINE_STORE_PEER_TIMEOUT_S)"
                )
        if why is not None:
            self._dead = why
            _DEAD.append(why)
            self._invalidate()
            raise StorePeerDied(why + "; the job cannot go on (feedline aborts it at exit)")

    def _check(self, got: np.ndarray, what: str) -> None:
        """Raise on every rank alike (they all see the same array): a rank gone, a rank
        that failed to load, or ranks in different passes."""
        codes, keys = got[:, 0].tolist(), got[:, 1]
        gone = [r for r, c in enumerate(codes) if c == _GONE]
        if gone:
            self._invalidate()
            # for good: that rank takes part in no later pass
            self._peer_gone = (
                f"rank {gone[0]} stopped serving its shares of the in-memory store before "
                f"{what} (interrupted while closing its Loader)"
            )
            raise StorePeerLeft(self._peer_gone)
        bad = [(r, c) for r, c in enumerate(codes) if c >= _STORAGE]
        if bad:
            self._invalidate()
            r, c = bad[0]
            raise StorePeerFailed(
                f"rank {r} could not load its share of {what} into the in-memory store "
                f"({_CODE_NAMES.get(c, 'an error')} on that rank; see its output)"
            )
        if (keys != keys[0]).any():
            self._invalidate()
            odd = np.flatnonzero(keys != keys[0]).tolist()
            raise StoreOutOfStepError(
                f"ranks {odd} are not in the same pass of the in-memory store as rank 0 at "
                f"{what}: every rank must iterate the same epochs, seeds and steps "
                "(the same set_epoch/load_state_dict calls and as many iter() calls)"
            )

    def _invalidate(self) -> None:
        self._resident = [None] * self._nslots
        self._placed = set()
        self._failed = True
        # nothing more is loaded in this pass: every loop over rounds ends here
        self._hi = self._rounds.last if self._rounds is not None else self._hi

    # Every round is loaded by: C1 (a collective: nobody reads the round its slot holds
    # any more, and is anyone still here?), an asynchronous read of this rank's share,
    # and C2 (a collective: everyone has it, or someone failed). C1 comes as early as
    # the slot is free, C2 when the first step needing the round comes, so the read
    # overlaps the steps in between (DeepIO's hybrid backend-memory pipeline). Every rank
    # runs the same C1(k), C2(k), C1(k+1), ... sequence at the same steps: the decisions
    # depend only on the plan and the step.

    def _may_begin(self, step: int) -> bool:
        """True when round hi+1 may start loading at *step* (its slot is free)."""
        assert self._rounds is not None
        r = self._hi + 1
        return (
            self._next is None
            and r <= self._rounds.last
            and self._paced(r)
            and r - self._nslots < int(self._rounds.step_min[step])
            and self._resident[r % self._nslots] != self._load_key(r)  # kept (progressive)
        )

    def _paced(self, r: int) -> bool:
        """Round *r* may begin before a step needs it: a progressive store's at most
        :data:`READ_AHEAD` past the consumer's (docs/deepio.md, "Loading") and needing
        no C1 (it would block at a step of this rank's own: docs/deepio.md, "Loading")."""
        rounds = self._rounds
        if rounds is None or not rounds.progressive:
            return True
        return r <= self._lead + READ_AHEAD and self._free_slot(r)

    def _load_key(self, r: int) -> Any:
        """What slot r holds once loaded: the whole dataset, a progressive store's round
        (kept across passes), or this pass's round."""
        assert self._rounds is not None
        if self._rounds.whole:
            return ("all",)
        if self._rounds.progressive:
            return ("progressive", self._plan.seed, r)
        return (self._pass, r)

    def _begin(self, r: int) -> None:
        """C1, then submit this rank's share of round *r* (resumable at C1)."""
        st = self._next if self._next is not None and self._next.round == r else None
        if st is None:
            st = self._next = _RoundLoad(r)
        if st.stage == 0:
            # C1 frees a slot the others may still read; a progressive store's rounds
            # each have their own (none is overwritten in a pass): C2 alone suffices,
            # unless the slot holds something else still valid (another seed's round;
            # every rank sees the same residency, so every rank decides the same)
            if self._free_slot(r):
                got = np.array([[_OK, self._key(r, 1)]], dtype=np.int64)
            else:
                got = self._collective(_LEFT if self._departed else _OK, self._key(r, 1))
            if self._comm is not None and bool((got[:, 0] == _LEFT).all()):
                self._next = None
                self._abandon_pass()  # every rank left: nobody needs the rest
                raise SourceStopped
            try:
                self._check(got, f"loading round {r}")
            except FeedlineError:
                self._next = None
                raise
            st.stage = 1  # C1 is done: whatever happens below, C2 comes next
            slot = r % self._nslots
            self._placed.discard(self._resident[slot])  # overwritten from now on
            self._resident[slot] = None
            assert self._rounds is not None
            try:
                st.future = self._ahead.get(r)
                if st.future is None:
                    st.future = self._submit_share(self._rounds.ids(r), slot)
                self._ahead.pop(r, None)  # st.future holds it (drained through _next)
            except BaseException as e:  # C2 tells the others (even of a Ctrl-C here)
                st.code, st.error = _code_of(e), e
                if not isinstance(e, Exception):
                    raise
            self._ahead_hi = max(self._ahead_hi, r)
            self._read_ahead()

    def _c2_code(self, st: _RoundLoad) -> int:
        """What this rank tells the others at a round's C2: its outcome; in a
        progressive store (no C1) also whether it left the pass (its serve thread)."""
        if st.code == _OK and self._departed and self._rounds is not None:
            return _LEFT if self._rounds.progressive else _OK
        return st.code

    def _free_slot(self, r: int) -> bool:
        """A progressive store's round *r* may be read into its slot without C1: the
        slot holds nothing valid (no other rank can still be reading it)."""
        rounds = self._rounds
        return (
            rounds is not None
            and rounds.progressive
            and self._resident[r % self._nslots] in (None, self._load_key(r))
        )

    def _complete(self, r: int) -> None:
        """Round *r* resident on every rank: wait for the share, then C2."""
        assert self._rounds is not None
        slot = r % self._nslots
        key = self._load_key(r)
        if self._next is None and self._resident[slot] == key:
            # R = 1: loaded in an earlier pass and kept
            if key not in self._placed:
                self._place(self._rounds.ids(r), slot)
                self._placed_add(key)
            self._hi = r
            return
        self._begin(r)
        st = self._next
        assert st is not None and st.round == r
        if st.stage == 1:
            self._read_done(st, slot, key)
        got = self._collective(self._c2_code(st), self._key(r, 2))
        self._next = None
        if st.error is not None:
            self._invalidate()
            raise st.error
        if self._comm is not None and self._rounds.progressive and (got[:, 0] == _LEFT).all():
            self._abandon_pass()  # every rank left (told at C2: no C1 here)
            return
        self._check(got, f"round {r}")
        if self._rma is not None:
            self._rma.sync()
        self._place(self._rounds.ids(r), slot)
        self._placed_add(key)
        self._hi = r
        self._st["rounds_loaded"] += 1

    def _read_done(self, st: _RoundLoad, slot: int, key: Any) -> None:
        """Stage 1 -> 2: this rank's share of the round is read (or failed)."""
        fut = st.future
        if fut is not None and self._ids is None and not self._departed and not fut.done():
            # the pass's first wait: its order is worked out while the round is read
            self._ids, self._offs = self._plan.rank_samples(self._me)
        if fut is not None:  # even after an error: the read must not land later
            try:
                fut.result()  # a stop here leaves the future to _drain
            except Exception as e:
                if st.error is None:
                    st.code, st.error = _code_of(e), e
        st.future = None
        self._resident[slot] = None if st.error is not None else key
        if self._rma is not None:
            self._rma.sync()
        st.stage = 2

    def _progress(self) -> None:
        """A progressive store, at every step: move the load along without waiting for
        the consumer to reach a round. A round's C2 is posted as soon as this rank's
        share is read, and completed as soon as every rank has posted it (the next
        round begins then). Every rank still runs the same C2 sequence, and a rank
        drifting a few steps behind no longer holds the others at every round. A C2
        that reports a failure or ranks out of step is left for the round's first step
        to raise, as on every rank."""
        rounds = self._rounds
        if rounds is None or not rounds.progressive or self._failed:
            return
        self._read_ahead()
        while True:
            st = self._next
            if st is None:
                r = self._hi + 1
                if r > rounds.last or not self._paced(r):
                    return
                if self._resident[r % self._nslots] == self._load_key(r):
                    self._complete(r)  # kept from an earlier pass: placed, no collective
                    continue
                self._begin(r)  # submits (or adopts) its read; no C1 (_paced)
                st = self._next
                assert st is not None
            if st.stage == 1:
                if st.future is not None and not st.future.done():
                    return
                self._read_done(st, st.round % self._nslots, self._load_key(st.round))
            if self._comm is not None and self._P > 1:
                self._post(self._c2_code(st), self._key(st.round, 2))
                req, out = self._pending
                if not mpi.done(req):
                    return
                if (out[:, 0] != _OK).any() or (out[:, 1] != out[0, 1]).any():
                    return  # raised at the round's first step (_complete), on every rank
            elif st.code != _OK:
                return
            self._complete(st.round)

    def _read_ahead(self) -> None:
        """A progressive store: :data:`READ_AHEAD` rounds' reads in flight ahead of the
        one loading, into their own slots (none is overwritten in a pass), so the disk
        does not wait for the consumer or the collectives (C2 and errors come as usual).
        The pass's first round reads alone. Best effort: a round not read ahead is
        submitted when it begins."""
        rounds = self._rounds
        if rounds is None or not rounds.progressive or self._failed:
            return
        nxt = self._next
        busy = sum(1 for f in self._ahead.values() if f is not None and not f.done())
        loading = nxt is not None and nxt.stage == 1 and nxt.future is not None
        if loading and not nxt.future.done():  # type: ignore[union-attr]
            if nxt.round == self._pass_first:  # type: ignore[union-attr]
                return  # the pass's first batch waits for this round: the disk is its own
            busy += 1
        while busy < READ_AHEAD and self._ahead_hi < min(rounds.last, self._lead + READ_AHEAD):
            k = self._ahead_hi = self._ahead_hi + 1
            slot = k % self._nslots
            if k <= self._hi or self._resident[slot] == self._load_key(k):
                continue
            if (nxt is not None and nxt.round == k) or not self._free_slot(k):
                continue  # being loaded; or another seed's round, freed by its C1 first
            try:
                self._ahead[k] = self._submit_share(rounds.ids(k), slot)
            except Exception:
                return
            busy += 1

    def _drain(self) -> None:
        """Wait for the share reads in flight (their buffers must not be reused under
        them): the round being loaded's, and the rounds read ahead."""
        st, self._next = self._next, None
        ahead, self._ahead = self._ahead, {}
        futures = [st.future] if st is not None and st.future is not None else []
        for fut in [*futures, *ahead.values()]:
            if fut is not None:
                with contextlib.suppress(Exception):
                    fut.result()

    def _submit_share(self, ids: np.ndarray, slot: int) -> Any:
        """Start reading this rank's share of a round into *slot*; a future or None."""
        mine = _share(ids, self._P, self._me)
        if len(mine) == 0:
            return None
        base, size = self._slot(slot)
        c = self._extents(mine, size)
        if c.reads.nbytes > size:  # pragma: no cover - sized from the index
            raise FeedlineError("store slot overflow: the share outgrew its bound")
        assert self._reader is not None
        return self._reader.submit(c.reads, self._rma.array[base : base + size])

    def _placed_add(self, key: Any) -> None:
        """Record that owner/disp describe round *key*. Rounds of one layout (one pass's,
        a progressive store's of one seed, or the whole) hold disjoint ids; placing a
        round of another layout overwrites theirs, so they are forgotten."""

        def layout(k: Any) -> Any:
            return k[:-1] if len(k) > 1 else k

        self._placed = {k for k in self._placed if layout(k) == layout(key)}
        self._placed.add(key)

    def _place(self, ids: np.ndarray, slot: int) -> None:
        """Where every sample of a round lies: owner rank and displacement in its part
        (what :meth:`_extents` gives each share, for all P shares at once: its cost does
        not grow with P beyond the arrays)."""
        base, size = self._slot(slot)
        owner, src = place_shares(self._fid, self._off, self._len, ids, self._P, self._gap, size)
        self._owner[ids] = owner
        self._disp[ids] = base + src

    # ----------------------------------------------------------------- passes
    @property
    def _departed(self) -> bool:
        return threading.current_thread() is self._serve

    def start(self, plan, first_step: int) -> None:
        self.stop()
        self._wait_serve()
        if self._gave_up:
            raise FeedlineError(
                "this Loader's in-memory store was abandoned (interrupted while serving "
                "the other ranks): create a new Loader on every rank"
            )
        if self._peer_gone is not None:
            raise StorePeerLeft(self._peer_gone + "; create a new Loader on every rank")
        if self._watch is not None:  # a pass may need no collective (R = 1): check here
            self._watch._next = 0.0
            self._poll(time.monotonic())
        self._stop.clear()
        self._pass_st = dict.fromkeys(_PASS_KEYS, 0)
        self._pass_st["rma_wait_s"] = 0.0
        self._drain()  # no read may still land in a window about to be replaced
        self._pending = None
        rounds, least = self._sizing(plan, need=True)
        held = np.diff(self._slot_at)
        if self._rma is None or len(least) > len(held) or (least > held[: len(least)]).any():
            self._allocate(self._sizing(plan)[1])  # regrown: every rank at this pass
        if self._reader is None:
            self._reader = ExtentReader(
                self.ctx.dataset.files, self.ctx.options.io_threads, plan.strategy.read
            )
        self._rounds = rounds
        self._gap = gap_of(plan)
        self._pass += 1
        self._failed = False
        if first_step < plan.num_steps:
            # the first round any step left needs (a wrapped last step needs round 0)
            self._hi = int(rounds.step_min[first_step:].min()) - 1
            self._done_pass = False
        else:
            self._hi, self._done_pass = rounds.last, True
        self._ahead_hi = self._hi
        self._pass_first = self._lead = self._hi + 1  # the round the first batch waits for
        self._step = first_step
        self._ids = self._offs = None
        self._plan = plan

    def _allocate(self, sizes: np.ndarray) -> None:
        if self._rma is not None:
            # every rank regrows at the same pass (the sizes depend on the plan only) and
            # allocates collectively next: a plain collective free, no vote
            rma, self._rma = self._rma, None
            rma.free()
        w = self._world
        total = int(sizes.sum())
        if w is not None and self._comm is not None:
            if self._watch is None:
                from ..dist.world import PeerWatch

                self._watch = PeerWatch(w, self._comm)
            self._rma = w.rma_array(total, comm=self._comm)
        else:
            from ..dist.world import RmaArray

            self._rma = RmaArray(np.zeros(total, dtype=np.uint8))
        self._slot_at = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._nslots = len(sizes)
        self._resident = [None] * self._nslots
        self._placed = set()
        self._st["store_bytes"] = total

    def _ensure(self, step: int) -> None:
        assert self._rounds is not None
        need = self._lead = int(self._rounds.step_max[step])
        while self._hi < need:
            self._complete(self._hi + 1)
        if self._may_begin(step):  # the next round loads while this one is served
            self._begin(self._hi + 1)
        self._progress()

    def get(self, step: int) -> RawBatch:
        with self._lock:
            return self._get(step)

    def _get(self, step: int) -> RawBatch:
        if self._failed:
            raise FeedlineError("the in-memory store failed earlier in this pass")
        self._ensure(step)
        if self._ids is None:  # this rank's whole pass at once: O(N/P), vectorised
            self._ids, self._offs = self._plan.rank_samples(self._me)
        i = step - self._plan.first_step
        ids = self._ids[self._offs[i] : self._offs[i + 1]]
        self._step = step + 1
        if step + 1 >= self._plan.num_steps:
            self._done_pass = True
        if len(ids) == 0:
            return RawBatch.empty()
        lengths = self._len[ids]
        dest = np.zeros(len(ids), dtype=np.int64)
        np.cumsum(lengths[:-1], out=dest[1:])
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
        t0 = time.monotonic()
        node, remote, gets, shm = self._rma.get(
            self._owner[ids], self._disp[ids], lengths, out, dest, lambda: self._poll(t0)
        )
        wait = time.monotonic() - t0 if gets else 0.0
        for st in (self._st, self._pass_st):
            st["rma_gets"] += gets
            st["shm_gets"] += shm
            st["rma_bytes"] += remote
            st["rma_wait_s"] += wait
            st["node_bytes"] += node
            st["local_bytes"] += int(out.size) - remote - node
        return RawBatch(ids, out, lengths)

    def finish(self) -> None:
        self._done_pass = True
        self.stop()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Leave the pass; the rounds it still owes the others are served in background."""
        with self._lock:  # a get() in another thread returns first (request_stop wakes it)
            self._stop_locked()

    def _stop_locked(self) -> None:
        if self._rounds is None or self._done_pass:
            return
        self._done_pass = True
        if self._failed or self._comm is None or self._P == 1:
            self._drain()
            self._pending = None
            return
        if self._hi >= self._rounds.last and self._next is None:
            return
        self._stop.clear()
        self._lead = self._rounds.last  # serving the others: read ahead freely
        self._serve = threading.Thread(
            target=self._serve_rest, name=f"feedline-r{self._me}-store-serve", daemon=True
        )
        self._serve.start()

    def _serve_rest(self) -> None:
        assert self._rounds is not None
        # stopped, or failed: the pass it served is over and the next one reloads (a peer
        # gone is remembered by _check and refuses the next pass)
        with contextlib.suppress(BaseException):
            while self._hi < self._rounds.last:
                self._complete(self._hi + 1)

    def _abandon_pass(self) -> None:
        assert self._rounds is not None
        self._hi = self._rounds.last

    def _wait_serve(self) -> None:
        """Join the serve thread, however long the others take to pass the rounds this
        rank holds (saying so after ``STALL_S``). Interrupted (Ctrl-C), stop serving and
        tell the others (:meth:`_give_up`)."""
        t = self._serve
        if t is None:
            return
        t0, told = time.monotonic(), False
        try:
            while t.is_alive():
                t.join(0.05)
                if not told and time.monotonic() - t0 > STALL_S:
                    told = True
                    assert self._rounds is not None
                    _log.warning(
                        "feedline: rank %d waits until the other ranks pass the rounds of "
                        "the in-memory store it holds (%d of %d rounds left in this pass); "
                        "they need its memory",
                        self._me,
                        max(0, self._rounds.last - self._hi),
                        self._rounds.count,
                    )
        except BaseException:
            self._stop.set()
            t.join()
            self._serve = None
            self._give_up()
            self._drain()
            with contextlib.suppress(Exception):
                self._free_window()  # votes "keep" at once: the peers need not wait
            raise
        self._serve = None

    def _give_up(self) -> None:
        """Leave for good while others may still need this rank: one last collective
        with code GONE makes them raise :class:`StorePeerLeft` together at their next
        transition; the window is kept until exit (reads of it may still be under way)."""
        self._gave_up = True
        self._invalidate()
        if self._comm is None or self._P == 1:
            return
        if mpi.finalized():
            return
        msg = np.array([_GONE, 0], dtype=np.int64)
        out = np.zeros((self._P, 2), dtype=np.int64)
        if self._pending is not None:  # the serve thread's collective, still in flight
            _ORPHANS.append(self._pending)
            self._pending = None
        _ORPHANS.append((mpi.iallgather(self._comm, msg, out), msg, out))

    # ------------------------------------------------------------------ misc
    def stats(self) -> dict[str, Any]:
        st: dict[str, Any] = (
            self._reader.stats()
            if self._reader is not None
            else {"storage_bytes": 0, "storage_ops": 0, "io_s": 0.0}
        )
        st.update(self._st)
        st["buffer_bytes"] = self._st["store_bytes"]
        st["store_pass"] = dict(self._pass_st)  # the current (or last) pass: per epoch
        st["store_mode"] = self._plan.strategy.store if self._rounds is not None else None
        return st

    def _free_window(self) -> None:
        """Free the window with the others (a vote: all within ``CLOSE_GRACE_S``), or
        keep it until exit."""
        rma, self._rma = self._rma, None
        if rma is None:
            return
        if self._dead is None and self._watch is not None:
            self._watch._next = 0.0
            with contextlib.suppress(StorePeerDied):
                self._poll(time.monotonic())  # a peer that died since the last wait
        if self._dead is not None:  # no collective with a dead rank: keep until exit
            rma.abandon()
            self._kept = True
            return
        if self._comm is None or self._P == 1:
            rma.free()
            return
        if not rma.release(CLOSE_GRACE_S, max(self._pause, 1e-3), give_up=self._gave_up):
            self._kept = True

    def close(self) -> None:
        try:
            self.stop()
            self._wait_serve()
            self._drain()
            self._free_window()
            if self._comm is not None and not self._kept and not self._gave_up:
                mpi.free(self._comm)
                self._comm = None
        finally:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


register_source(StoreSource, presets=("deepio-ordered", "deepio-opportunistic"))
