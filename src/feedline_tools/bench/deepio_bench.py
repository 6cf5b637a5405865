# SPDX-License-Identifier: Apache-2.0
"""``feedline bench deepio``: DeepIO's evaluation (Figs. 9, 10, 13, Table I, RL) here.

* **Fig. 9** — aggregate read bandwidth vs element size (1 KB ... 1 MB) at ``--ranks``
  ranks on ``--nodes`` emulated nodes: ``seq`` (every rank reads its contiguous share
  of the file sequentially in 8 MiB reads through its node's view, cold: the paper's
  BeeGFS-Seq), ``ordered`` and ``opportunistic`` (the ``deepio-*`` store: one epoch to
  load it cold, then one epoch of shuffled batches served from the job's memory, the
  bandwidth reported; remote gets and bytes per epoch with it).
* **Fig. 10** — the same at 256 KB for 1, 2, 4, 8 ranks (nodes = min(ranks, --nodes)).
* **Fig. 13** — total time of ``--epochs`` epochs (default 3; the first cold) with a
  sleep of 100, 50, 10, 5 ms per step standing in for training, for R = 0 (every batch
  read from storage when asked for), 0.25, 0.5 (rounds loaded while the previous one is
  served; every epoch reloads) and 1 (all loaded before the first batch, once).
* **Table I** — one process: :func:`feedline.deepio.batch` (native engine) vs a PyTorch
  ``DataLoader`` (2 workers) of per-sample reads, 3 KB and 256 KB elements, on tmpfs and
  on disk (page cache emptied first).
* **RL** — DeepIO's randomization level for each R, ordered and opportunistic, against
  the paper's worked values (§III-C: 98.54% at R = 0.5, 96.96% at R = 0.25).

The data are files of random fixed-size records under a temporary directory (``--path``
keeps them), mounted through the storage emulator (``feedline emulate``: one view per
node, default parameters; ``--no-emulator`` reads the local files). Writes
``deepio.json``, ``deepio.md`` and ``deepio-fig9/10/13.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from feedline.units import count_at_least as at_least
from feedline_tools.bench.harness import _size, mpiexec_command, size_label
from feedline_tools.bench.readers import generate

SIZES = "1K,4K,64K,256K,1M"
QUICK_SIZES = "1K,64K"
RANKS = (1, 2, 4, 8)
PIPE_R = (0.0, 0.25, 0.5, 1.0)
ITER_MS = (100.0, 50.0, 10.0, 5.0)
PAPER_RL = {1.0: 1.0, 0.5: 0.9854, 0.25: 0.9696}
#: ~85% of Caltech-101's 9,144 images, the paper's RL example (it does not give its exact
#: split; bench shuffle and docs/planner.md use the same N)
CALTECH_TRAIN = 7664


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("deepio")
    g.add_argument(
        "--ranks",
        type=at_least(1),
        default=None,
        help="ranks for Figs. 9, 13 (default 8; 2 with --quick)",
    )
    g.add_argument(
        "--nodes",
        type=at_least(0),
        default=None,
        help="emulated nodes (default 4; 2 with --quick; 0: real nodes from COMM_TYPE_SHARED)",
    )
    g.add_argument("--sizes", default=None, help=f"element sizes of Fig. 9 (default {SIZES})")
    g.add_argument(
        "--total",
        type=_size,
        default=None,
        help="bytes per Fig. 9/10 dataset (default 128M; 4M --quick)",
    )
    g.add_argument(
        "--pipe-total",
        type=_size,
        default=None,
        help="bytes of the Fig. 13 dataset (default 512M; 8M --quick)",
    )
    g.add_argument(
        "--epochs",
        type=at_least(1),
        default=None,
        help="epochs per Fig. 13 run (default 3; 2 --quick)",
    )
    g.add_argument("--path", default=None, help="keep the generated data in this directory")
    g.add_argument(
        "--no-emulator", action="store_true", help="read the local files (no node views)"
    )
    g.add_argument("--quick", action="store_true", help="tiny sizes (smoke test, CI)")
    g.add_argument("--out", default="bench-out", help="directory for deepio.json/.md/.png")
    g.add_argument("--json", default=None, help="also write the document here")
    g.add_argument("--no-plots", action="store_true")


def _launch(cfg: dict[str, Any], ranks: int, nodes: int, work: str) -> dict[str, Any]:
    """Run the worker on *ranks* ranks (mpiexec) or in one process; its result."""
    fd, cpath = tempfile.mkstemp(suffix=".json", dir=work)
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    opath = cpath + ".out"
    env = dict(os.environ, OMP_NUM_THREADS="1", FEEDLINE_NODES=str(nodes if ranks > 1 else 0))
    cmd = [sys.executable, "-m", "feedline_tools.bench.deepio_worker", cpath, opath]
    if ranks > 1:
        cmd = [mpiexec_command(), "-n", str(ranks), *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0 or not os.path.exists(opath):
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}): {p.stderr[-2000:]}")
    with open(opath) as f:
        return json.load(f)


def _bw_rows(res: dict[str, Any], L: int, ranks: int, nodes: int) -> list[dict[str, Any]]:
    rows = []
    for mode, r in res.items():
        row = {"element": L, "ranks": ranks, "nodes": nodes, "mode": mode, "bytes": r["bytes"]}
        row["MBps"] = r["bytes"] / r["s"] / 1e6 if r["s"] > 0 else None
        if mode != "seq":
            row["cold_MBps"] = r["e0"]["bytes"] / r["cold_s"] / 1e6
            for k in ("rma_gets", "rma_bytes", "rma_wait_s", "node_bytes", "local_bytes"):
                row[k] = r["e1"][k]
        rows.append(row)
    return rows


def _table1(
    sizes: list[int], total: int, places: list[tuple[str, str]], repeats: int
) -> list[dict]:
    """The batch API vs a PyTorch DataLoader of per-sample reads, one process (medians
    of *repeats* cold runs)."""
    from feedline import deepio
    from feedline.dataset import open_dataset
    from feedline.io import evict
    from feedline_tools.bench.runners import SampleReads, sample_loader

    rows = []
    # torch's import and first DataLoader are the process's, not the API's: paid here,
    # untimed, so that the first timed row does not carry them (each loader's own worker
    # start-up stays in its time, as in an epoch)
    from torch.utils.data import DataLoader

    for _ in DataLoader(list(range(4)), batch_size=2, num_workers=2):  # type: ignore[arg-type]
        pass
    for place, root in places:
        for L in sizes:
            d = tempfile.mkdtemp(prefix="feedline-deepio-t1-", dir=root)
            try:
                path = generate(os.path.join(d, "r.bin"), total, L)
                ds = open_dataset(path, format="records", record_bytes=L)
                B = max(8, (4 << 20) // L)
                order = np.random.default_rng(0).permutation(len(ds))
                speeds: dict[str, list[float]] = {"deepio.batch": [], "torch DataLoader": []}
                for _rep in range(repeats):  # interleaved: other load falls on both alike
                    for api in speeds:
                        evict([path])
                        t0 = time.perf_counter()
                        got = 0
                        if api == "deepio.batch":
                            for mb in deepio.batch(order, B, dataset=ds, backend="native"):
                                got += mb.data.nbytes
                        else:
                            sr = SampleReads(ds.index)
                            steps = [order[i : i + B].tolist() for i in range(0, len(order), B)]
                            dl = sample_loader(sr, steps, workers=2, prefetch=2)
                            for _ids, lens, _raw in dl:
                                got += int(lens.sum())
                            sr.close()
                        speeds[api].append(got / (time.perf_counter() - t0) / 1e6)
                for api, v in speeds.items():
                    rows.append(
                        {"storage": place, "element": L, "api": api, "MBps": float(np.median(v))}
                    )
            finally:
                shutil.rmtree(d, ignore_errors=True)
    return rows


def _mbps(x: float | None) -> str:
    """MB/s for a table: whole numbers, two significant digits below 10 (not 0)."""
    return "—" if x is None else (f"{x:.0f}" if x >= 10 else f"{x:.2g}")


def _rl_rows(ranks: int) -> list[dict[str, Any]]:
    from feedline.plan.rl import rl_memory

    rows = []
    for R in (1.0, 0.5, 0.25):
        rows.append(
            {
                "R": R,
                "paper": PAPER_RL[R],
                "ordered": rl_memory(CALTECH_TRAIN, R),
                f"opportunistic_{ranks}": rl_memory(CALTECH_TRAIN, R, ranks=ranks),
            }
        )
    return rows


def _checks(doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's criteria, computed from the measurements (reported, not enforced)."""
    fig9 = doc["fig9"]
    out: dict[str, Any] = {}

    def bw(L, mode):
        return next((r["MBps"] for r in fig9 if r["element"] == L and r["mode"] == mode), None)

    for L in sorted({r["element"] for r in fig9}):
        seq, o, p = bw(L, "seq"), bw(L, "ordered"), bw(L, "opportunistic")
        if seq and o and p:
            out[f"in-memory ordered, opportunistic / seq cold at {size_label(L)}"] = [
                round(o / seq, 2),
                round(p / seq, 2),
            ]
    small = min(r["element"] for r in fig9)
    o, p = bw(small, "ordered"), bw(small, "opportunistic")
    if o and p:
        out[f"opportunistic / ordered at {size_label(small)}"] = p / o
        g = {r["mode"]: r["rma_gets"] for r in fig9 if r["element"] == small and r["mode"] != "seq"}
        out[f"remote gets per epoch at {size_label(small)} (ordered, opportunistic)"] = [
            g.get("ordered"),
            g.get("opportunistic"),
        ]
    for r in doc["table1"]:
        if r["api"] == "deepio.batch":
            dl = next(
                x["MBps"]
                for x in doc["table1"]
                if x["api"] != r["api"]
                and x["storage"] == r["storage"]
                and x["element"] == r["element"]
            )
            out[f"batch API / DataLoader, {size_label(r['element'])} on {r['storage']}"] = (
                r["MBps"] / dl
            )
    return out


def markdown(doc: dict[str, Any]) -> str:
    c = doc["config"]
    lines = [
        f"# feedline bench deepio — {c['ranks']} ranks on {c['nodes']} emulated nodes, "
        f"storage: {c['storage']}",
        "",
        "| column | what it does | shuffles? |",
        "|---|---|---|",
        "| seq (FS, cold) | every rank reads its contiguous part of the file from storage | no |",
        "| ordered (memory) | DeepIO ordered mode: the dataset in the job's memory, each "
        "batch drawn from a global permutation (one-sided gets from other ranks) "
        "| yes (RL table below) |",
        "| opportunistic (memory) | DeepIO opportunistic mode: each rank serves a seeded "
        "permutation of what its own memory holds first (no remote gets) "
        "| yes, locally (RL table below) |",
        "| deepio.batch / torch DataLoader (Table I) | the portable batch API vs per-sample "
        "loading of the same index array | as the index array (seeded shuffle) |",
        "",
        "## Fig. 9: aggregate read bandwidth vs element size (MB/s)",
        "",
        "| element | seq (FS, cold) | ordered (memory) | opportunistic (memory) | ordered load (cold) "
        "| remote gets/epoch ordered | opportunistic | remote MB/epoch ordered | opportunistic |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def pick(rows, **kw):
        return next((r for r in rows if all(r.get(k) == v for k, v in kw.items())), {})

    def f(x, spec=".0f"):
        return "—" if x is None else format(x, spec)

    for L in c["sizes"]:
        s, o, p = (
            pick(doc["fig9"], element=L, mode=m) for m in ("seq", "ordered", "opportunistic")
        )
        lines.append(
            f"| {size_label(L)} | {f(s.get('MBps'))} | {f(o.get('MBps'))} | {f(p.get('MBps'))} | "
            f"{f(o.get('cold_MBps'))} | {f(o.get('rma_gets'))} | {f(p.get('rma_gets'))} | "
            f"{f((o.get('rma_bytes') or 0) / 1e6, '.1f')} | {f((p.get('rma_bytes') or 0) / 1e6, '.1f')} |"
        )
    lines += ["", "## Fig. 10: aggregate read bandwidth vs ranks, 256 KB elements (MB/s)", ""]
    lines += [
        "| ranks | nodes | seq (FS, cold) | ordered | opportunistic |",
        "|---|---|---|---|---|",
    ]
    for P in c["fig10_ranks"]:
        s, o, p = (pick(doc["fig10"], ranks=P, mode=m) for m in ("seq", "ordered", "opportunistic"))
        lines.append(
            f"| {P} | {s.get('nodes', '—')} | {f(s.get('MBps'))} | {f(o.get('MBps'))} | {f(p.get('MBps'))} |"
        )
    lines += [
        "",
        f"## Fig. 13: total time of {c['epochs']} epochs (the first cold) with input pipelining, s",
        "",
    ]
    lines += ["| R | " + " | ".join(f"{ms:g} ms/step" for ms in c["iter_ms"]) + " |"]
    lines += ["|---|" + "---|" * len(c["iter_ms"])]
    for R in c["pipe_R"]:
        cells = [f(pick(doc["fig13"], R=R, iter_ms=ms).get("s"), ".2f") for ms in c["iter_ms"]]
        lines.append(f"| {R:g} | " + " | ".join(cells) + " |")
    lines += ["", "## Table I: loading speed, one process (MB/s)", ""]
    lines += ["| storage | element | deepio.batch | torch DataLoader |", "|---|---|---|---|"]
    for place in c["table1_storage"]:
        for L in c["table1_sizes"]:
            a = pick(doc["table1"], storage=place, element=L, api="deepio.batch").get("MBps")
            b = pick(doc["table1"], storage=place, element=L, api="torch DataLoader").get("MBps")
            lines.append(f"| {place} | {size_label(L)} | {_mbps(a)} | {_mbps(b)} |")
    key = next(k for k in doc["rl"][0] if k.startswith("opportunistic"))
    lines += ["", f"## RL (N = {CALTECH_TRAIN:,} ≈ 85% of Caltech-101, the paper's example)", ""]
    lines += ["| R | paper | ordered | " + key.replace("_", ", ") + " ranks |", "|---|---|---|---|"]
    for r in doc["rl"]:
        lines.append(f"| {r['R']:g} | {r['paper']:.2%} | {r['ordered']:.2%} | {r[key]:.2%} |")
    lines += ["", "## Checks", ""]
    for k, v in doc["checks"].items():
        lines.append(f"- {k}: {v if isinstance(v, list) else format(v, '.2f')}")
    return "\n".join(lines) + "\n"


def plots(doc: dict[str, Any], out: str) -> list[str]:
    from feedline_tools.bench.report import _pyplot

    plt = _pyplot()
    made = []
    c = doc["config"]
    for name, rows, xkey, xlabel, xs in (
        ("fig9", doc["fig9"], "element", "element size (bytes)", c["sizes"]),
        ("fig10", doc["fig10"], "ranks", "ranks", c["fig10_ranks"]),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode in ("seq", "ordered", "opportunistic"):
            ys = [
                next((r["MBps"] for r in rows if r[xkey] == x and r["mode"] == mode), None)
                for x in xs
            ]
            ax.plot(xs, [np.nan if y is None else y for y in ys], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("aggregate MB/s")
        ax.legend()
        ax.set_title(f"DeepIO {name}: {c['storage']}")
        p = os.path.join(out, f"deepio-{name}.png")
        fig.savefig(p, dpi=100, bbox_inches="tight")
        plt.close(fig)
        made.append(p)
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(c["pipe_R"])
    for i, R in enumerate(c["pipe_R"]):
        ys = [
            next((r["s"] for r in doc["fig13"] if r["R"] == R and r["iter_ms"] == ms), 0)
            for ms in c["iter_ms"]
        ]
        ax.bar(np.arange(len(c["iter_ms"])) + i * width, ys, width, label=f"R={R:g}")
    ax.set_xticks(
        np.arange(len(c["iter_ms"])) + 0.4 - width / 2, [f"{m:g} ms" for m in c["iter_ms"]]
    )
    ax.set_ylabel("total time (s)")
    ax.legend()
    p = os.path.join(out, "deepio-fig13.png")
    fig.savefig(p, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [*made, p]


def run(args: argparse.Namespace) -> int:
    q = args.quick
    P = args.ranks or (2 if q else 8)  # --ranks is >= 1 when given
    # --nodes 0: real nodes from COMM_TYPE_SHARED (docs/deepio.md), not the default
    M = min((2 if q else 4) if args.nodes is None else args.nodes, P)
    sizes = [_size(s) for s in (args.sizes or (QUICK_SIZES if q else SIZES)).split(",")]
    total = args.total or ((4 << 20) if q else (128 << 20))
    pipe_total = args.pipe_total or ((8 << 20) if q else (512 << 20))
    fig10_ranks = [r for r in RANKS if r <= P]
    iter_ms = (5.0,) if q else ITER_MS
    epochs = args.epochs or (2 if q else 3)
    t1_sizes, t1_total = [3072, 256 << 10], (2 << 20) if q else (64 << 20)
    data = args.path or tempfile.mkdtemp(prefix="feedline-deepio-")
    work = tempfile.mkdtemp(prefix="feedline-deepio-work-")
    os.makedirs(data, exist_ok=True)
    L256 = 256 << 10
    files = {L: f"fig9-{L}.bin" for L in {*sizes, L256}}
    for L, name in files.items():
        if not os.path.exists(os.path.join(data, name)):
            generate(os.path.join(data, name), total, L)
    if not os.path.exists(os.path.join(data, "fig13.bin")):
        generate(os.path.join(data, "fig13.bin"), pipe_total, L256)
    emu, root, storage = None, data, "local files (no emulator)"
    if not args.no_emulator:
        from feedline.errors import FeedlineError
        from feedline_tools.emulate import Emulator, EmulatorUnavailable

        mnt = tempfile.mkdtemp(prefix="feedline-deepio-mnt-")
        try:
            emu = Emulator(data, mnt, nodes=max(M, 1)).start()
            root = emu.node_template
            pr = emu.params
            storage = (
                f"storage emulator ({pr.latency_us:g} µs/request, {pr.node_mbps:g} MB/s per node, "
                f"{pr.aggregate_mbps:g} MB/s aggregate)"
            )
        except (EmulatorUnavailable, FeedlineError) as e:
            print(
                f"storage emulator unavailable ({str(e).splitlines()[0]}): local files", flush=True
            )
    doc: dict[str, Any] = {"scenario": "deepio", "fig9": [], "fig10": [], "fig13": [], "table1": []}
    try:

        def cfg(**kw):
            base = {"emulator": emu.mountpoint if emu else None}
            return {**base, **kw}

        for L in sizes:
            batch = max(8 * P, (8 << 20) // L)
            res = _launch(
                cfg(
                    task="bw",
                    path=os.path.join(root, files[L]),
                    record_bytes=L,
                    batch=batch,
                    modes=["seq", "ordered", "opportunistic"],
                ),
                P,
                M,
                work,
            )
            doc["fig9"] += _bw_rows(res, L, P, M)
            print(f"fig9 {size_label(L)}: done", flush=True)
        for r in fig10_ranks:
            m = min(M, r)
            res = _launch(
                cfg(
                    task="bw",
                    path=os.path.join(root, files[L256]),
                    record_bytes=L256,
                    batch=max(8 * r, 32),
                    modes=["seq", "ordered", "opportunistic"],
                ),
                r,
                m,
                work,
            )
            doc["fig10"] += _bw_rows(res, L256, r, m)
        for R in PIPE_R:
            for ms in iter_ms:
                res = _launch(
                    cfg(
                        task="pipe",
                        path=os.path.join(root, "fig13.bin"),
                        record_bytes=L256,
                        batch=8 * P,
                        R=R,
                        iter_ms=ms,
                        epochs=epochs,
                    ),
                    P,
                    M,
                    work,
                )
                doc["fig13"].append({"R": R, "iter_ms": ms, **res})
        print("fig13: done", flush=True)
    finally:
        if emu is not None:
            emu.stop()
            shutil.rmtree(emu.mountpoint, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        if args.path is None:
            shutil.rmtree(data, ignore_errors=True)
    places = [("tmpfs", "/dev/shm"), ("disk", tempfile.gettempdir())]
    places = [(n, d) for n, d in places if os.path.isdir(d)]
    doc["table1"] = _table1(t1_sizes, t1_total, places, 1 if q else 3)
    doc["rl"] = _rl_rows(P)
    doc["config"] = {
        "ranks": P,
        "nodes": M,
        "sizes": sizes,
        "total": total,
        "pipe_total": pipe_total,
        "fig10_ranks": fig10_ranks,
        "pipe_R": list(PIPE_R),
        "iter_ms": list(iter_ms),
        "epochs": epochs,
        "table1_sizes": t1_sizes,
        "table1_total": t1_total,
        "table1_storage": [n for n, _ in places],
        "storage": storage,
        "quick": q,
    }
    doc["checks"] = _checks(doc)
    text = markdown(doc)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "deepio.md"), "w") as f:
        f.write(text)
    for p in filter(None, [os.path.join(args.out, "deepio.json"), args.json]):
        with open(p, "w") as f:
            json.dump(doc, f, indent=1)
    if not args.no_plots:
        plots(doc, args.out)
    return 0
