# SPDX-License-Identifier: Apache-2.0
"""Start, attach to, query and stop the ``feedline-fuse`` daemon.

The daemon runs in the foreground as a child process and prints ``ready PID`` once the
mount answers; everything else (stats, resets, cache drops) goes through control files
in the mount, so any process — an MPI rank, a bench worker, ``feedline emulate down`` —
can reach a running emulator from its mount point alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from feedline import defaults
from feedline.errors import ConfigError, FeedlineError
from feedline_tools.emulate.params import EmulatorParams

BINARY_NAME = "feedline-fuse"
STATS_FILE = ".feedline-stats"
REQUESTS_FILE = ".feedline-requests"
CONTROL_FILE = ".feedline-control"
FSTYPE = "fuse.feedline"
EXIT_UNAVAILABLE = 69  # the daemon's exit code when FUSE is unusable (sysexits EX_UNAVAILABLE)


class EmulatorUnavailable(FeedlineError):
    """The storage emulator cannot run here: no usable ``/dev/fuse``, no
    ``feedline-fuse`` binary (libfuse3 was missing at build time), or the kernel
    refused the mount."""


def find_binary() -> str | None:
    """Path of the ``feedline-fuse`` executable, or None.

    Looked up in ``$FEEDLINE_FUSE_BIN``, then ``feedline_tools/bin/`` where the build
    installs it (beside the installed native module's package, which is also where an
    editable install puts it), then beside this package, then PATH.
    """
    env = defaults.get("fuse_bin")
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    candidates = []
    spec = importlib.util.find_spec("feedline._core")
    if spec is not None and spec.origin:
        site = Path(spec.origin).parent.parent
        candidates.append(site / "feedline_tools" / "bin" / BINARY_NAME)
        # a worktree whose native module is a symlink to an installed build
        candidates.append(
            Path(spec.origin).resolve().parent.parent / "feedline_tools" / "bin" / BINARY_NAME
        )
    candidates.append(Path(__file__).resolve().parent.parent / "bin" / BINARY_NAME)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which(BINARY_NAME)


def check_available() -> str:
    """Return the binary's path, or raise EmulatorUnavailable saying what is missing."""
    if not os.path.exists("/dev/fuse"):
        raise EmulatorUnavailable(
            "/dev/fuse does not exist: the storage emulator needs FUSE (load the fuse "
            "kernel module, or run the container with --device /dev/fuse)"
        )
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise EmulatorUnavailable(
            "/dev/fuse is not readable and writable by this user: the storage emulator "
            "needs FUSE access"
        )
    binary = find_binary()
    if binary is None:
        where = defaults.get("fuse_bin")
        raise EmulatorUnavailable(
            f"FEEDLINE_FUSE_BIN={where} is not an executable file"
            if where
            else f"the {BINARY_NAME} binary was not built: install libfuse3-dev and "
            "pkg-config, then rebuild feedline (dev/build or pip install -e .)"
        )
    return binary


def mounts() -> dict[str, str]:
    """Mount point -> file system type, from ``/proc/self/mounts``."""
    out = {}
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    out[parts[1].replace("\\040", " ")] = parts[2]
    except OSError:
        pass
    return out


def is_mounted(mnt: str | os.PathLike[str]) -> bool:
    """Whether a feedline emulator is mounted at *mnt*."""
    return mounts().get(os.path.realpath(mnt)) == FSTYPE


def mount_root(path: str | os.PathLike[str]) -> str | None:
    """The emulator mount point that holds *path*, or None."""
    real = os.path.realpath(path)
    best = None
    for mnt, fstype in mounts().items():
        if fstype != FSTYPE:
            continue
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and (
            best is None or len(mnt) > len(best)
        ):
            best = mnt
    return best


def log_path_for(mnt: str | os.PathLike[str]) -> str:
    """Where the daemon serving *mnt* logs: one file per mount point, found again by
    ``down`` from the mount point alone and removed when the emulator stops."""
    digest = hashlib.sha256(os.path.realpath(mnt).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"feedline-fuse-{digest}.log")


def _emulator_root(path: str | os.PathLike[str]) -> str:
    """The mount point of the emulator mount holding *path*; ConfigError when none does."""
    root = mount_root(path)
    if root is None:
        raise ConfigError(f"{os.fspath(path)} is not on a feedline emulator mount")
    return root


def _force_unmount(mnt: str) -> None:
    """Lazily detach *mnt* (after the daemon died, the mount only answers ENOTCONN)."""
    for cmd in (["fusermount3", "-u", "-z", mnt], ["umount", "-l", mnt]):
        if shutil.which(cmd[0]):
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            if not is_mounted(mnt):
                return


def unmount(path: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Stop the emulator whose mount holds *path*; a mount whose daemon died (it only
    answers "transport endpoint is not connected") is detached lazily.

    Raises
    ------
    ConfigError
        *path* is not on an emulator mount.
    """
    root = _emulator_root(path)
    try:
        emu = Emulator.attach(root)
    except (OSError, ValueError, KeyError):
        _force_unmount(root)
        with contextlib.suppress(OSError):
            os.unlink(log_path_for(root))
        return
    emu.stop(timeout=timeout)


class Emulator:
    """A running storage emulator: ``MNT/node0`` ... ``MNT/node{M-1}`` are views of *src*.

    Use as a context manager (mounts on entry, unmounts on exit), or call
    :meth:`start` / :meth:`stop`. :meth:`attach` gives a handle on one that is already
    mounted (by ``feedline emulate up`` or another process).

    Parameters
    ----------
    src : path
        Directory whose contents every node view shows (read-only).
    mnt : path
        Mount point; created if missing, must be empty.
    nodes : int
        Emulated nodes M.
    params : EmulatorParams, optional
        The modelled storage; keyword *overrides* replace single fields, e.g.
        ``Emulator(src, mnt, nodes=2, latency_us=100)``.
    detach : bool
        Run the daemon in its own session so that it outlives this process (the CLI's
        ``up``); a detached daemon is stopped with ``feedline emulate down``. Otherwise
        the daemon unmounts and exits by itself when this process ends, even if it
        ends without :meth:`stop`.
    timeout : float
        Seconds to wait for the mount to come up or go away.

    Raises
    ------
    EmulatorUnavailable
        No ``/dev/fuse``, no binary, or the mount was refused.
    ConfigError
        Bad parameters, *src* not a directory, *mnt* busy.
    """

    def __init__(
        self,
        src: str | os.PathLike[str],
        mnt: str | os.PathLike[str],
        nodes: int = 1,
        params: EmulatorParams | None = None,
        *,
        detach: bool = False,
        timeout: float = 10.0,
        **overrides: Any,
    ) -> None:
        if int(nodes) < 1:
            raise ConfigError(f"nodes must be >= 1, got {nodes}")
        self.src = os.path.realpath(src)
        self.mountpoint = os.path.realpath(mnt)
        self.nodes = int(nodes)
        base = params or EmulatorParams()
        self.params = base.replace(**overrides) if overrides else base
        self.detach = detach
        self.timeout = float(timeout)
        self.pid: int | None = None
        self.log_path: str | None = None
        self._child: int | None = None  # pid of a daemon we spawned and must reap
        self._status: int | None = None

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def attach(cls, path: str | os.PathLike[str]) -> Emulator:
        """A handle on the running emulator whose mount holds *path*.

        Raises
        ------
        ConfigError
            *path* is not inside an emulator mount.
        """
        root = _emulator_root(path)
        with open(os.path.join(root, STATS_FILE)) as f:
            info = json.load(f)
        known = set(EmulatorParams.names())
        params = EmulatorParams().replace(
            **{k: v for k, v in info.get("params", {}).items() if k in known}
        )
        emu = cls(info["src"], root, nodes=int(info["nodes"]), params=params)
        emu.pid = int(info["pid"])
        emu.log_path = log_path_for(root)
        return emu

    def start(self) -> Emulator:
        """Mount and wait until the views answer; returns self."""
        if self.running:
            return self
        binary = check_available()
        if not os.path.isdir(self.src):
            raise ConfigError(f"emulator source {self.src} is not a directory")
        if is_mounted(self.mountpoint) or os.path.ismount(self.mountpoint):
            raise ConfigError(
                f"{self.mountpoint} is already a mount point "
                f"(feedline emulate down {self.mountpoint} unmounts an emulator)"
            )
        os.makedirs(self.mountpoint, exist_ok=True)
        if os.listdir(self.mountpoint):
            raise ConfigError(f"mount point {self.mountpoint} is not empty")
        if os.path.realpath(self.mountpoint).startswith(self.src.rstrip("/") + "/"):
            raise ConfigError("the mount point must not lie inside the source directory")

        self.log_path = log_path_for(self.mountpoint)
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        argv = [binary, *self.params.argv(), "--nodes", str(self.nodes)]
        if not self.detach:  # a process that dies without stop() leaves no mount behind
            argv.append("--exit-with-parent")
        argv += [self.src, self.mountpoint]
        rfd, wfd = os.pipe()
        try:
            # posix_spawn, not subprocess: a detached daemon outlives us, and nothing must
            # be left behind that expects to reap it.
            self._child = os.posix_spawn(
                binary,
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, wfd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                ],
                setsid=self.detach,
            )
        finally:
            os.close(wfd)
            os.close(log_fd)
        self.pid = self._child
        try:
            self.pid = self._wait_ready(rfd)
        except BaseException:
            self._kill()
            self.pid = None
            with contextlib.suppress(OSError):  # its tail is in the exception's message
                os.unlink(self.log_path)
            raise
        finally:
            os.close(rfd)
        return self

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:].strip()
        except OSError:
            return ""

    def _wait_ready(self, rfd: int) -> int:
        deadline = time.monotonic() + self.timeout
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(rfd, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise EmulatorUnavailable(
                        f"the emulator did not come up at {self.mountpoint} within "
                        f"{self.timeout:g} s. {self._log_tail()}".strip()
                    )
                chunk = os.read(rfd, 256)
                if not chunk:
                    break
                line += chunk
        if not line.startswith(b"ready "):
            code = self.wait(self.timeout)
            msg = self._log_tail() or f"{BINARY_NAME} exited with status {code}"
            if code == 2:
                raise ConfigError(msg)
            raise EmulatorUnavailable(msg)
        return int(line.split()[1])

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for a daemon this object started to exit; its exit status, or None if it
        is still running after *timeout* seconds (or was not started here)."""
        if self._child is None:
            return self._status
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                pid, status = os.waitpid(self._child, os.WNOHANG)
            except ChildProcessError:
                pid, status = self._child, 0
            if pid:
                self._child = None
                self._status = os.waitstatus_to_exitcode(status)
                return self._status
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(0.005)

    def _kill(self) -> None:
        if self._child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._child, signal.SIGKILL)
            self.wait()
        if is_mounted(self.mountpoint):
            _force_unmount(self.mountpoint)

    def _pid_alive(self) -> bool:
        if self._child is not None:
            return self.wait(0) is None
        if self.pid is None or self._status is not None:
            return False
        with contextlib.suppress(ChildProcessError):  # reap it if it happens to be ours
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # a zombie of a process that is not our child still answers kill(0)
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def stop(self, timeout: float | None = None) -> None:
        """Unmount and wait for the daemon to exit (SIGTERM, then SIGKILL and a lazy
        unmount if it does not). Safe to call twice."""
        timeout = self.timeout if timeout is None else timeout
        if self.pid is not None and self._pid_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)  # the daemon unmounts (lazily if busy)
            end = time.monotonic() + timeout
            while self._pid_alive() and time.monotonic() < end:
                time.sleep(0.01)
            if self._pid_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.wait(timeout)
        if is_mounted(self.mountpoint):
            _force_unmount(self.mountpoint)
        with contextlib.suppress(OSError):
            os.unlink(log_path_for(self.mountpoint))
        self.pid = None

    close = stop

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_child", None) is not None and not self.detach:
            with contextlib.suppress(Exception):
                self.stop(timeout=2.0)

    @property
    def running(self) -> bool:
        """Whether the emulator is mounted and its daemon alive."""
        return self.pid is not None and self._pid_alive() and is_mounted(self.mountpoint)

    # -- views and control -------------------------------------------------------------

    def node_path(self, node: int) -> Path:
        """The view of the source for emulated node *node*."""
        if not 0 <= node < self.nodes:
            raise ConfigError(f"node {node} out of range [0, {self.nodes})")
        return Path(self.mountpoint) / f"node{node}"

    @property
    def node_template(self) -> str:
        """``MNT/node{node}``: a path template for ``open_dataset`` and the bench."""
        return os.path.join(self.mountpoint, "node{node}")

    def _control(self, command: str) -> None:
        fd = os.open(os.path.join(self.mountpoint, CONTROL_FILE), os.O_WRONLY)
        try:
            os.write(fd, (command + "\n").encode())
        finally:
            os.close(fd)

    def stats(self) -> dict[str, Any]:
        """The emulator's accounting since the last reset.

        Top-level numbers are the totals over all nodes (``requests``, ``bytes``,
        ``seeks``, ``direct_requests``, ``modelled_s``, ``service_s``, ``overrun_s``,
        ``max_overrun_s``, ``underpaid``); ``per_node`` holds the same per node, and
        ``params``, ``nodes``, ``pid``, ``src``, ``mountpoint`` describe the emulator.
        """
        with open(os.path.join(self.mountpoint, STATS_FILE)) as f:
            info = json.load(f)
        total = info.pop("total")
        return {**total, **info}

    def requests(self) -> list[dict[str, Any]]:
        """The logged requests (the most recent ``log_requests``) in arrival order: node,
        file (relative to the source), offset, size, arrival_s, modelled_s, service_s,
        seeks, direct."""
        with open(os.path.join(self.mountpoint, REQUESTS_FILE)) as f:
            return [json.loads(line) for line in f if line.strip()]

    def reset_stats(self) -> None:
        """Zero the accounting (totals and request log)."""
        self._control("reset")

    def reset_model(self) -> None:
        """Idle every modelled queue and forget stream positions (next requests seek)."""
        self._control("reset-model")

    def drop_caches(self, node: int | None = None) -> None:
        """Invalidate the kernel page cache of every node view (or of *node* only), so
        the next reads are cold and pay the model again. Pages that a process still has
        mapped stay: close liblmdb environments and memmaps first."""
        self._control("drop" if node is None else f"drop {int(node)}")

    FAULTS = ("eio", "estale", "enoent", "eintr", "short", "stall")

    def fault(
        self,
        kind: str,
        match: str = "*",
        *,
        count: int = 0,
        skip: int = 0,
        seconds: float = 0.0,
    ) -> None:
        """Inject a fault into reads of files whose path (relative to the source)
        contains *match* (``"*"``: every file), on every node view: after *skip* such
        reads pass, the next *count* (0: all, a persistent fault) reply ``EIO``,
        ``ESTALE``, ``ENOENT``, ``EINTR`` (*kind* ``eio``, ...), return half of their
        bytes (``short``), or wait *seconds* (``stall``, default 45 s) before being
        served. Opens are not affected (ESTALE/ENOENT hit reads after a good open)."""
        if kind not in self.FAULTS:
            raise ConfigError(f"unknown fault {kind!r}; known: {', '.join(self.FAULTS)}")
        if not match or any(c.isspace() for c in match):
            raise ConfigError(f"fault match must be a non-empty word, not {match!r}")
        cmd = f"fault {kind} {match} count={int(count)} skip={int(skip)}"
        if seconds:
            cmd += f" seconds={float(seconds)}"
        self._control(cmd)

    def clear_faults(self) -> None:
        """Remove every injected fault and end the stalls in progress."""
        self._control("fault clear")

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Emulator({self.src!r} -> {self.mountpoint!r}, nodes={self.nodes}, {state})"
