# SPDX-License-Identifier: Apache-2.0
"""World: ranks, nodes and the few MPI operations feedline needs — the only MPI code.

mpi4py is imported lazily, only when a communicator is given or the launcher started
several processes (:func:`feedline.dist.launch.detect`: ``mpiexec``, ``srun``); otherwise
a single-process World stands in. Nodes come from
``Split_type(COMM_TYPE_SHARED)`` or are emulated (``FEEDLINE_NODES=M`` or ``nodes=M``:
node = rank·M // P). Every wait polls a nonblocking request with short sleeps
(``FEEDLINE_POLL_SLEEP_US``) instead of blocking in MPICH, which busy-polls and would
steal the CPU from I/O threads when ranks outnumber cores; the price is up to one sleep
interval of extra latency per wait.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _core, defaults
from ..errors import ConfigError, FeedlineError
from ..plan.world import WorldSpec
from .alarm import Alarm, pid_alive
from .alarm import register as register_alarm
from .launch import detect, job_comm, launcher_comm
from .shm import _DIRECT_LOOP, _shared_parts, copy_few

_TOKEN_TAG = 0x7EED


def launched_by_mpi() -> bool:
    """True when an MPI launcher or srun started several processes of this job (or did
    not say how many): :attr:`feedline.dist.launch.Launch.mpi_world` of
    :func:`~feedline.dist.launch.detect`."""
    return detect().mpi_world


def _mpi():
    from mpi4py import MPI

    return MPI


class _Failure:
    """An exception carried between ranks (the original when it pickles)."""

    def __init__(self, exc: BaseException, rank: int) -> None:
        self.rank = rank
        try:
            pickle.dumps(exc)
            self.exc: BaseException | None = exc
        except Exception:
            self.exc = None
        self.text = f"{type(exc).__name__}: {exc}"

    def raise_(self) -> None:
        if self.exc is not None:
            raise self.exc
        raise FeedlineError(f"rank {self.rank} failed: {self.text}")


class NodeArray:
    """A numpy array in a node shared-memory window (or private memory without MPI).

    Attributes
    ----------
    array : numpy.ndarray
        The same memory on every rank of the node. Synchronise writers and readers with
        :meth:`World.node_barrier`, or with flags in the array itself: :meth:`lock_all`
        once, then :meth:`sync` (a memory barrier, ``MPI_Win_sync``) after writing data
        and before publishing a flag, and after reading a flag before reading data;
        :meth:`compare_and_swap` is an atomic operation on one int64 word.
    """

    def __init__(self, array: np.ndarray, win: Any = None, owner: int = 0) -> None:
        self.array = array
        self._win = win
        self._owner = owner
        self._locked = False
        self._disp = array.dtype.itemsize  # the window's displacement unit

    def lock_all(self) -> None:
        """Open a passive-target epoch on every rank (needed by :meth:`sync` and atomics)."""
        if self._win is not None and not self._locked:
            self._win.Lock_all(_mpi().MODE_NOCHECK)
            self._locked = True

    def sync(self) -> None:
        """Memory barrier between this rank's and the node's loads and stores."""
        if self._win is not None and self._locked:
            self._win.Sync()

    def compare_and_swap(self, byte_offset: int, compare: int, value: int) -> int:
        """Atomically: if the int64 at *byte_offset* equals *compare*, store *value*.

        Returns the previous value. Needs :meth:`lock_all` first.
        """
        if self._win is None:
            old = int(self.array.view(np.uint8)[byte_offset : byte_offset + 8].view(np.int64)[0])
            if old == compare:
                self.array.view(np.uint8)[byte_offset : byte_offset + 8].view(np.int64)[0] = value
            return old
        o = np.array([value], dtype=np.int64)
        c = np.array([compare], dtype=np.int64)
        r = np.zeros(1, dtype=np.int64)
        self._win.Compare_and_swap(o, c, r, self._owner, byte_offset // self._disp)
        self._win.Flush(self._owner)
        return int(r[0])

    def free(self) -> None:
        """Release the window (collective over the node)."""
        if self._win is not None:
            self.array = np.zeros(0, dtype=self.array.dtype)
            if self._locked:
                self._win.Unlock_all()
                self._locked = False
            self._win.Free()
            self._win = None

    def abandon(self) -> None:
        """Drop this rank's handle without the collective free (the memory stays
        allocated until the process exits): for when the node's other ranks will not
        free the window with this one."""
        self.array = np.zeros(0, dtype=self.array.dtype)
        self._win = None

    def __enter__(self) -> NodeArray:
        return self

    def __exit__(self, *exc) -> None:
        self.free()


#: Requests abandoned because a peer died, and the buffers they write: kept until exit.
PENDING: list[Any] = []


class PeerWatch:
    """Whether the ranks of a communicator are still alive, without their help.

    Built collectively (every rank's host name and pid); :meth:`dead` then needs no
    communication: a peer on this host whose process is gone (or a zombie) is dead. A
    peer on another host cannot be checked this way (MPI has no portable liveness test
    without ULFM): :meth:`dead` reports it only after *timeout_s* of waiting (0: never),
    counted by the caller from the start of its wait.
    """

    def __init__(self, world: World, comm: Any, interval_s: float = 0.5) -> None:
        import socket

        me = (socket.gethostname(), os.getpid())
        self._peers = world.allgather(me, comm=comm)
        self._host = me[0]
        self._me = comm.Get_rank()
        self._every = interval_s
        self._next = 0.0
        self.gone: list[int] = []

    def describe(self, rank: int) -> str:
        host, pid = self._peers[rank]
        return f"rank {rank} (pid {pid} on {host})"

    def dead(self) -> list[int]:
        """Ranks of this host found dead (checked at most every *interval_s*)."""
        now = time.monotonic()
        if now < self._next:
            return self.gone
        self._next = now + self._every
        self.gone = [
            r
            for r, (host, pid) in enumerate(self._peers)
            if r != self._me and host == self._host and not pid_alive(pid)
        ]
        return self.gone


class RmaArray:
    """This rank's part of a job-wide store that every rank reads one-sidedly (passive
    target): DeepIO's storage buffer.

    ``array`` is this rank's local memory, allocated by MPI (``Win.Allocate``: MPI may
    place it where its one-sided path is fastest — shared memory for ranks of the same
    host, memory registered with the NIC across hosts — so a get needs no help from the
    target's CPU; ``Win.Create`` over memory of our own would make MPICH serve every
    get by active messages the *target* must progress). :meth:`get` copies byte ranges
    of any rank's part into a local buffer: this rank's own by a plain copy; a rank of
    the same host whose part MPI placed in shared memory (*shared*, from
    ``MPI_Win_shared_query``) by loads from that memory on this rank's CPU — what MPI's
    own shared-memory ``MPI_Get`` does, without building and walking two datatypes per
    get; every other rank's by one ``MPI_Rget`` per rank (its records described by
    indexed datatypes). Without MPI it is a private array. Synchronisation is the
    caller's: write your part, :meth:`sync`, then tell the others (a collective); stop
    reading before telling a writer it may overwrite.
    """

    def __init__(
        self,
        array: np.ndarray,
        win: Any = None,
        rank: int = 0,
        *,
        node_of: Sequence[int] | None = None,
        vote: FreeVote | None = None,
        shared: Sequence[np.ndarray | None] | None = None,
    ) -> None:
        self.array = array
        self._vote = vote
        self._win = win
        self._rank = rank
        self._node = np.asarray(node_of if node_of is not None else [0], dtype=np.int64)
        #: per rank: its part as an array this process loads from directly, or None
        self._shared: list[np.ndarray | None] = list(shared) if shared is not None else []
        if win is not None:
            win.Lock_all(_mpi().MODE_NOCHECK)

    @property
    def shared_ranks(self) -> int:
        """How many other ranks' parts this rank reads directly (shared memory)."""
        return sum(1 for r, a in enumerate(self._shared) if a is not None and r != self._rank)

    def sync(self) -> None:
        """Memory barrier: this rank's stores become visible to its peers, and theirs
        (announced by a collective) to this rank."""
        if self._win is not None:
            self._win.Sync()

    def get(
        self,
        owners: np.ndarray,
        disps: np.ndarray,
        lengths: np.ndarray,
        out: np.ndarray,
        dest: np.ndarray,
        poll: Callable[[], None] | None = None,
    ) -> tuple[int, int, int, int]:
        """Copy ``lengths[i]`` bytes at ``disps[i]`` of rank ``owners[i]``'s part into
        ``out[dest[i]:]``. Returns (bytes from other ranks of this rank's node, bytes
        from other nodes, gets, of which served from shared memory): one get per other
        rank holding some of the records. A rank whose part is in shared memory is read
        directly (one native memcpy per record, ``_core.copy_records``). Every other
        get is one request-based ``MPI_Rget``, its scattered records described by two
        indexed datatypes (a batch of many elements per call). The requests are polled,
        calling *poll* between tests (it may raise, e.g. when a peer died: the gets then
        stay pending, and *out* with them, until exit — see :data:`PENDING`); after
        direct reads *poll* is called once, so a dead peer is still noticed (its memory
        stays mapped: what was read is what it held).
        """
        owners = np.asarray(owners)
        lengths = np.asarray(lengths, dtype=np.int64)
        disps = np.asarray(disps, dtype=np.int64)
        dest = np.asarray(dest, dtype=np.int64)
        if self._win is not None and len(owners) <= _DIRECT_LOOP:  # a batch of a few
            few = copy_few(
                self.array, self._shared, self._rank, self._node, owners, disps, lengths, out, dest
            )
            if few is not None:
                if few[2] and poll is not None:
                    poll()
                return few[0], few[1], few[2], few[2]
        order = np.argsort(owners, kind="stable")
        cuts = np.flatnonzero(np.diff(owners[order])) + 1
        types: list[Any] = []
        reqs: list[Any] = []
        node_bytes = remote = direct = 0
        done = False
        try:
            for sel in np.split(order, cuts):
                if len(sel) == 0:
                    continue
                o = int(owners[sel[0]])
                ln = lengths[sel]
                if o == self._rank or self._win is None:
                    _core.copy_records(self.array, disps[sel], ln, out, dest[sel])
                    continue
                keep = ln > 0
                sel, ln = sel[keep], ln[keep]
                if len(sel) == 0:
                    continue
                if self._node[o] == self._node[self._rank]:
                    node_bytes += int(ln.sum())
                else:
                    remote += int(ln.sum())
                src = self._shared[o] if o < len(self._shared) else None
                if src is not None:
                    _core.copy_records(src, disps[sel], ln, out, dest[sel])
                    direct += 1
                    continue
                MPI = _mpi()
                L = int(ln[0])
                if bool((ln == L).all()):  # one block length: cheaper to build and walk
                    tt = MPI.BYTE.Create_hindexed_block(L, disps[sel].tolist()).Commit()
                    ot = MPI.BYTE.Create_hindexed_block(L, dest[sel].tolist()).Commit()
                else:
                    blocks = ln.astype(np.int32).tolist()
                    tt = MPI.BYTE.Create_hindexed(blocks, disps[sel].tolist()).Commit()
                    ot = MPI.BYTE.Create_hindexed(blocks, dest[sel].tolist()).Commit()
                types += [tt, ot]
                reqs.append(self._win.Rget([out, 1, ot], o, (0, 1, tt)))
            if reqs:
                MPI = _mpi()
                # back off from 10 µs to the poll interval
                top = defaults.get("poll_sleep_us") * 1e-6
                pause = min(1e-5, top)
                while not MPI.Request.Testall(reqs):
                    if poll is not None:
                        poll()
                    time.sleep(pause)
                    pause = min(pause * 2, top)
            elif direct and poll is not None:
                poll()
            done = True
        finally:
            if not done and reqs:  # abandoned: the memory must outlive the pending gets
                PENDING.append((reqs, out))
            for t in types:
                t.Free()  # freeing a datatype in use is allowed: MPI frees it after the get
        return node_bytes, remote, len(reqs) + direct, direct

    def free(self) -> None:
        """Release the window (collective over the store's communicator)."""
        if self._win is not None:
            self.array = np.zeros(0, dtype=np.uint8)
            self._win.Unlock_all()
            self._win.Free()
            self._win = None
        if self._vote is not None:
            self._vote.free()
            self._vote = None

    def abandon(self) -> None:
        """Drop the handles without the collective free (kept until the process exits)."""
        self.array = np.zeros(0, dtype=np.uint8)
        self._win = self._vote = None

    def release(self, grace_s: float, pause: float = 1e-3, *, give_up: bool = False) -> bool:
        """Free the windows if every rank releases within *grace_s* of the first (see
        :class:`FreeVote`), else keep them until exit; True when freed. ``give_up``
        votes for keeping them at once (for a rank that leaves while others need it)."""
        if self._win is None:
            return True
        if _mpi().Is_finalized():
            self.abandon()
            return False
        if self._vote is None or self._vote.decide(grace_s, pause, give_up=give_up):
            self.free()
            return True
        self.abandon()
        return False


class FreeVote:
    """Whether the ranks of a communicator free a collective object together or keep it.

    Freeing a window is collective: a rank that frees while another never will hangs.
    Each rank counts itself in on one shared int64 by compare-and-swap (*cas*: a word of
    node shared memory, or one held by rank 0 — :meth:`on_rank0`); when the count
    reaches *size* everyone frees. A rank that has waited *grace_s* swaps the count for
    ``LEAK`` instead, atomically, so the ranks see one outcome: every rank that saw
    *size* frees, every other one (those waiting, and late ones) keeps the object until
    exit.
    """

    LEAK = -1

    def __init__(self, cas: Callable[[int, int], int], size: int, win: Any = None) -> None:
        self._cas, self._size, self._win = cas, size, win

    @classmethod
    def on_rank0(cls, world: World, comm: Any) -> FreeVote:
        """A vote whose count is an int64 in a window on rank 0 of *comm* (collective)."""
        MPI = _mpi()
        me = comm.Get_rank()
        win = MPI.Win.Allocate(8 if me == 0 else 0, 8, comm=comm)
        if me == 0:
            np.frombuffer(win.tomemory(), dtype=np.int64)[0] = 0
        world.barrier(comm)  # nobody votes before rank 0 zeroed the count
        win.Lock_all(MPI.MODE_NOCHECK)

        def cas(compare: int, value: int) -> int:
            o = np.array([value], dtype=np.int64)
            c = np.array([compare], dtype=np.int64)
            r = np.zeros(1, dtype=np.int64)
            win.Compare_and_swap(o, c, r, 0, 0)
            win.Flush(0)
            return int(r[0])

        return cls(cas, comm.Get_size(), win)

    def decide(self, grace_s: float, pause: float = 1e-3, *, give_up: bool = False) -> bool:
        """Vote; True means every rank frees (call the collective free now). ``give_up``
        votes "keep" at once."""
        while True:  # count this rank in, unless someone gave up
            c = self._cas(-2, -2)  # -2 never occurs: an atomic read
            if c == self.LEAK:
                return False
            if self._cas(c, self.LEAK if give_up else c + 1) == c:
                if give_up:
                    return False
                break
        deadline = time.monotonic() + grace_s
        while True:
            c = self._cas(-2, -2)
            if c == self._size:
                return True
            if c == self.LEAK:
                return False
            if time.monotonic() > deadline and self._cas(c, self.LEAK) == c:
                return False
            time.sleep(max(pause, 1e-3))

    def free(self) -> None:
        """Free the count's window, if it has one (collective; after a vote that said free)."""
        if self._win is not None:
            self._win.Unlock_all()
            self._win.Free()
            self._win = None


class Token:
    """The staggering token of one reader (LMDBIO §4.6), from a plan's ``StaggerInfo``.

    ``with token: read()`` waits for the token (except for the first group in the first
    round), then passes it on with a nonblocking send. :meth:`close` completes the
    pending sends and drains the token that wraps around after the last round.
    """

    def __init__(self, world: World, info) -> None:
        self.world, self.info = world, info
        self.rounds = 0
        self._sends: list[Any] = []
        self._buf = np.zeros(1, dtype=np.int64)
        #: an Event that interrupts a wait for the token (the source's stop request)
        self.stop: Any = None

    def acquire(self) -> None:
        i = self.info
        if not i.enabled or (i.starts and self.rounds == 0):
            return
        req = self.world._tcomm.Irecv(self._buf, source=i.recv_from, tag=_TOKEN_TAG + i.label)
        self.world.wait(req, stop=self.stop, what=f"the staggering token from rank {i.recv_from}")

    def release(self) -> None:
        i = self.info
        self.rounds += 1
        if not i.enabled:
            return
        msg = np.array([self.rounds], dtype=np.int64)
        self._sends.append(
            (self.world._tcomm.Isend(msg, dest=i.send_to, tag=_TOKEN_TAG + i.label), msg)
        )

    def __enter__(self) -> Token:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def close(self) -> None:
        """Finish the ring: the first group receives the token sent after the last round."""
        i = self.info
        if i.enabled and i.starts and self.rounds > 0:
            req = self.world._tcomm.Irecv(self._buf, source=i.recv_from, tag=_TOKEN_TAG + i.label)
            self.world.wait(req, stop=self.stop, what=f"the last token from rank {i.recv_from}")
        for req, _ in self._sends:
            self.world.wait(req, stop=self.stop, what=f"rank {i.send_to} taking the token")
        self._sends.clear()


def _busier(host: tuple[int, int]) -> tuple[float, int, int]:
    """Order of hosts ``(ranks, cores)`` by load: ranks per core, then ranks, then cores."""
    return (host[0] / max(host[1], 1), host[0], -host[1])


def _affinity() -> set[int]:
    """The cores this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return set(range(os.cpu_count() or 1))


class World:
    """The job: ranks, nodes, node/leader communicators and polite waiting.

    Build it with :meth:`from_comm`. Attributes: ``comm`` (None when single-process),
    ``rank``, ``size``, ``node``, ``nodes``, ``node_rank``, ``node_size``, ``node_comm``,
    ``leader_comm`` (None on non-leaders), ``emulated``, ``spec`` (a
    :class:`~feedline.plan.world.WorldSpec`), ``host_ranks`` and ``host_cores`` (the
    busiest host's ranks and cores, the same on every rank: the cost model's ``cpu``
    term).
    """

    def __init__(
        self,
        comm: Any,
        *,
        nodes: int,
        node_comm: Any,
        leader_comm: Any,
        emulated: bool,
    ) -> None:
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.spec = WorldSpec(self.size, nodes)
        self.nodes = nodes
        self.node = self.spec.node_of(self.rank)
        self.node_comm = node_comm
        self.node_rank = node_comm.Get_rank() if node_comm is not None else 0
        self.node_size = node_comm.Get_size() if node_comm is not None else 1
        self.leader_comm = leader_comm
        self.emulated = emulated
        #: ranks of this job on a host (a shared-memory domain, whatever nodes are
        #: emulated) and the cores they may run on, of the job's busiest host (every rank
        #: sees the same): the cost model's ``cpu`` term
        self.host_ranks, self.host_cores = 1, len(_affinity())
        # tokens travel on their own communicator so their tags never meet the user's
        self._token_comm: Any = comm.Dup() if comm is not None else None
        #: the failure channel every wait polls (:mod:`feedline.dist.alarm`); None
        #: unless built with ``alarm=True`` on more than one rank
        self.alarm: Alarm | None = None
        #: bound of every wait for peers (0: ``FEEDLINE_PEER_TIMEOUT_S``)
        self.timeout_s = 0.0

    # -------------------------------------------------------------- building
    @classmethod
    def from_comm(cls, comm: Any = None, nodes: int | None = None, *, alarm: bool = False) -> World:
        """The World of *comm* (default: COMM_WORLD under an MPI launcher, else one process).

        Parameters
        ----------
        comm : mpi4py communicator, optional
        nodes : int, optional
            Emulate this many nodes of contiguous ranks (node = rank·M // P); default
            ``FEEDLINE_NODES``, and 0 means real nodes from ``COMM_TYPE_SHARED``.
        alarm : bool
            Build the failure channel (:class:`~feedline.dist.alarm.Alarm`) that every
            wait polls, and watch it at exit (the Loader's worlds).
        """
        if comm is None:
            comm = job_comm(
                "feedline needs MPI to split the data; launch with mpiexec/srun "
                "(pip install mpi4py mpich)"
            )
        if comm is None:
            return cls(None, nodes=1, node_comm=None, leader_comm=None, emulated=False)
        MPI = _mpi()
        P, rank = comm.Get_size(), comm.Get_rank()
        M = int(nodes if nodes is not None else defaults.get("nodes"))
        shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        # startup only: the host's ranks and the union of the cores they may run on
        host = (shared.Get_size(), len(set().union(*shared.allgather(_affinity()))))
        if M > 0:
            if M > P:
                raise ConfigError(f"cannot emulate {M} nodes with {P} ranks (nodes <= ranks)")
            node = rank * M // P
            # an emulated node's window must also be physically shared: split the real node
            node_comm = shared.Split(color=node, key=rank)
            shared.Free()
            emulated = True
        else:
            node_comm = shared
            # startup only: short blocking collectives are fine here
            first = comm.allgather(shared.allreduce(rank, op=MPI.MIN))
            M = len(set(first))
            spec = WorldSpec(P, M)
            # the planner assumes nodes are contiguous, equal-as-possible runs of ranks
            blocks = [{first[r] for r in spec.ranks_of(node)} for node in range(M)]
            if any(len(b) != 1 for b in blocks):
                raise ConfigError(
                    "ranks are not placed in contiguous, equal blocks per node; launch with "
                    "block placement (e.g. mpiexec -ppn / srun --distribution=block) or set "
                    "FEEDLINE_NODES to emulate nodes"
                )
            emulated = False
        MPI_UNDEFINED = MPI.UNDEFINED
        leader_comm = comm.Split(color=0 if node_comm.Get_rank() == 0 else MPI_UNDEFINED, key=rank)
        if leader_comm == MPI.COMM_NULL:
            leader_comm = None
        world = cls(comm, nodes=M, node_comm=node_comm, leader_comm=leader_comm, emulated=emulated)
        # the busiest host (it sets the epoch), the same on every rank: the plan's input
        world.host_ranks, world.host_cores = max(comm.allgather(host), key=_busier)
        if alarm and P > 1:
            world.alarm = Alarm(comm)
            register_alarm(world.alarm)
        return world

    @property
    def _tcomm(self) -> Any:
        return self._token_comm

    def close(self) -> None:
        """Free the communicators this World created (the alarm stays until exit if a
        failure went through it)."""
        if self.alarm is not None:
            self.alarm.close()
        for name in ("node_comm", "leader_comm", "_token_comm"):
            c = getattr(self, name)
            if c is not None:
                c.Free()
                setattr(self, name, None)

    # --------------------------------------------------------------- waiting
    def wait(self, request: Any, *, stop: Any = None, what: str = "a peer") -> Any:
        """Complete a nonblocking MPI request by polling it with short sleeps.

        With an alarm the wait is bounded (``timeout_s``) and raises
        :class:`~feedline.errors.PeerFailedError` as soon as a peer fails or dies; *stop*
        (an Event) interrupts it (:class:`~feedline.dist.alarm.Interrupted`).
        """
        if self.alarm is not None:
            return self.alarm.wait(request, timeout_s=self.timeout_s, stop=stop, what=what)
        pause = defaults.get("poll_sleep_us") * 1e-6
        while True:
            done, status = request.test()
            if done:
                return status
            time.sleep(pause)

    def _wait_all(self, requests: Sequence[Any]) -> None:
        for r in requests:
            self.wait(r)

    def barrier(self, comm: Any = None) -> None:
        """A barrier that sleeps between polls (``Ibarrier``)."""
        comm = comm if comm is not None else self.comm
        if comm is None or comm.Get_size() == 1:
            return
        self.wait(comm.Ibarrier(), what="the other ranks' barrier")

    def node_barrier(self) -> None:
        """:meth:`barrier` over the node."""
        self.barrier(self.node_comm)

    def bcast(self, obj: Any = None, root: int = 0, comm: Any = None, *, stop: Any = None) -> Any:
        """Broadcast a picklable object from *root* (``Ibcast`` polled)."""
        comm = comm if comm is not None else self.comm
        if comm is None or comm.Get_size() == 1:
            return obj
        me = comm.Get_rank()
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if me == root else b""
        n = np.array([len(data)], dtype=np.int64)
        what = f"rank {root}'s broadcast"
        self.wait(comm.Ibcast(n, root=root), stop=stop, what=what)
        buf = (
            np.frombuffer(data, dtype=np.uint8).copy()
            if me == root
            else np.empty(int(n[0]), np.uint8)
        )
        if n[0]:
            self.wait(comm.Ibcast(buf, root=root), stop=stop, what=what)
        return obj if me == root else pickle.loads(buf.tobytes())

    def allgather(self, obj: Any, comm: Any = None, *, stop: Any = None) -> list[Any]:
        """Gather a picklable object from every rank to every rank (polled)."""
        comm = comm if comm is not None else self.comm
        if comm is None or comm.Get_size() == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        counts = np.zeros(comm.Get_size(), dtype=np.int64)
        what = "the other ranks' allgather"
        self.wait(
            comm.Iallgather(np.array([data.size], dtype=np.int64), counts), stop=stop, what=what
        )
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        out = np.empty(int(counts.sum()), dtype=np.uint8)
        self.wait(
            comm.Iallgatherv(data, [out, (counts, displs), _mpi().BYTE]), stop=stop, what=what
        )
        return [pickle.loads(out[d : d + c].tobytes()) for d, c in zip(displs, counts, strict=True)]

    def bcast_seed(self, seed: int | None = None) -> int:
        """Rank 0's seed on every rank (a fresh random one when *seed* is None)."""
        if self.rank == 0 and seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        return int(self.bcast(seed))

    def check(self, failure: BaseException | None) -> None:
        """Collective: raise on every rank if any rank failed (the first failure)."""
        fails = self.allgather(_Failure(failure, self.rank) if failure is not None else None)
        for f in fails:
            if f is not None:
                f.raise_()

    # ------------------------------------------------------------- structure
    @property
    def is_leader(self) -> bool:
        """True on the first rank of each node."""
        return self.node_rank == 0

    def readers(self, k: int) -> list[int]:
        """Reader ranks of this node when *k* readers per node are elected (0: all)."""
        return WorldSpec(self.size, self.nodes, k).readers_of(self.node)

    def is_reader(self, k: int) -> bool:
        """True when this rank is one of its node's *k* readers."""
        return self.rank in self.readers(k)

    def expand_path(self, path):
        """Replace ``{node}`` in a path (or each path of a list) by this rank's node index."""
        if isinstance(path, (list, tuple)):
            return type(path)(self.expand_path(p) for p in path)
        return os.fspath(path).replace("{node}", str(self.node))

    # ---------------------------------------------------------- shared memory
    def node_array(self, shape, dtype=np.uint8, *, owner: int = 0) -> NodeArray:
        """Allocate a node shared-memory array (``Win.Allocate_shared``), collective on the node.

        Node rank *owner* allocates the memory; every rank gets a numpy view of it.
        Without MPI this is a private array (zeroed). Under MPI the memory is *not*
        zeroed: with one rank per node MPICH allocates it privately and may return a
        freed window's memory with its old contents; zero what must start at zero
        (the owner, then :meth:`node_barrier`).
        """
        dtype = np.dtype(dtype)
        shape = tuple(np.atleast_1d(shape).tolist())
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.node_comm is None:
            return NodeArray(np.zeros(shape, dtype=dtype))
        MPI = _mpi()
        mine = nbytes if self.node_rank == owner else 0
        win = MPI.Win.Allocate_shared(max(mine, 0), dtype.itemsize, comm=self.node_comm)
        buf, _ = win.Shared_query(owner)
        arr = np.frombuffer(buf, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
        return NodeArray(arr, win, owner)

    def rma_array(self, nbytes: int, comm: Any = None) -> RmaArray:
        """Allocate *nbytes* on every rank for a job-wide store, collective over *comm*
        (default: the World's; its ranks must be the World's ranks in order):
        ``Win.Allocate``, read one-sidedly by every rank. Without MPI this is a private
        array."""
        comm = comm if comm is not None else self.comm
        nbytes = int(nbytes)
        if comm is None:
            return RmaArray(np.zeros(nbytes, dtype=np.uint8))
        MPI = _mpi()
        me = comm.Get_rank()
        win = MPI.Win.Allocate(max(nbytes, 1), 1, comm=comm)
        arr = np.frombuffer(win.tomemory(), dtype=np.uint8)[:nbytes]
        nodes = [self.spec.node_of(r) for r in range(comm.Get_size())]
        vote = FreeVote.on_rank0(self, comm)
        shared = _shared_parts(win, comm, nbytes) if defaults.get("store_shared_memory") else None
        return RmaArray(arr, win, me, node_of=nodes, vote=vote, shared=shared)

    # ----------------------------------------------------------------- tokens
    def token(self, info) -> Token:
        """A staggering token for this reader from ``plan.stagger(rank)`` (not collective)."""
        return Token(self, info)

    # ------------------------------------------------------------------ index
    def share_index(self, build_fn: Callable[[], Any]) -> Any:
        """Build or load a dataset index once per node and share it.

        Rank 0 runs *build_fn* first (building and writing the sidecar, or loading it);
        then the other node leaders run it (normally just loading the sidecar); then the
        other ranks of each node load the same sidecar, mapped, or — when the leader
        could not write one — receive the index over the node communicator. Any error
        is raised on every rank (no hang).
        """
        if self.comm is None or self.size == 1:
            return build_fn()
        index, failure = None, None
        if self.rank == 0:
            index, failure = _try(build_fn)
        self.check(failure)
        failure = None
        if self.is_leader and self.rank != 0:
            index, failure = _try(build_fn)
        self.check(failure)
        owner = getattr(build_fn, "__self__", None)
        sidecar = getattr(owner, "sidecar_path", None) if self.is_leader else None
        sidecar = self.bcast(
            sidecar if sidecar and os.path.exists(sidecar) else None, comm=self.node_comm
        )
        failure = None
        if sidecar is not None:
            if not self.is_leader:
                index, failure = _try(build_fn)
        else:
            try:
                index = self.bcast(index, comm=self.node_comm)
            except Exception as e:  # pragma: no cover - pickling an index should not fail
                failure = e
            if owner is not None and not self.is_leader and index is not None:
                owner.sidecar_path = None
        self.check(failure)
        return index


def _try(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as e:
        return None, e
