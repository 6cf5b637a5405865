# SPDX-License-Identifier: Apache-2.0
"""Check the cost model (src/feedline/plan/cost.py) against measured epochs, and fit its
constants (docs/planner.md, "Calibration").

    mpiexec -n 4 python dev/calibrate.py DATASET [--profile P] [--top 6] [--epochs 2]
        [--batch 1024] [--json OUT]
    python dev/calibrate.py DATASET --cpu [--json OUT]     # the cpu term's constants

DATASET may hold ``{node}`` (the node views of ``feedline emulate up``; set
``FEEDLINE_NODES``). For the ``feedline`` preset's candidate plans (the cost model's
choice and its runners-up, per-rank and per-node readers), every candidate runs through
the Loader for ``--epochs`` epochs from a cold cache (files evicted and emulator caches
dropped before each epoch); the script prints the model's estimate term by term next to
the measured epoch, how well the estimate ranks the candidates (Spearman), and the
multipliers of each term that fit the measurements best (least squares, non-negative):
a multiplier of 2 on ``latency`` says this storage's latency is twice the profile's.

``--cpu`` measures the ``cpu`` term's constants instead (``CPU_STEP_S``, ``CPU_COPY_BW``,
``DECODE_RECORD_S`` in src/feedline/plan/cost.py): the dataset is read into the page
cache, then epochs at several batch sizes are timed with reads that cost no storage time
(``profile="memory"``, the store off); the fit ``epoch = steps x step_s + bytes /
copy_bw`` (each epoch less the model's own I/O terms for it) gives the first two, and
the same epochs decoded give the third. Run it with
as many ranks as cores to measure one rank's CPU (``mpiexec -n 2`` or alone).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from feedline import Loader, open_dataset
from feedline.plan.cost import choose, get_profile
from feedline.plan.records import as_records
from feedline.plan.strategy import PRESETS
from feedline.plan.world import WorldSpec
from feedline_tools.bench.limit import drop_caches

TERMS = ("latency", "transfer", "first_window", "serve", "coordination", "cpu")


def candidates(
    ds, world: WorldSpec, batch: int, cap: int, profile, top: int, host=None, epochs=None
):
    # the store's estimate is its mean over the epochs measured (it loads in the first)
    ch = choose(as_records(ds.index), world, batch, cap, profile, host=host, epochs=epochs)
    ok = sorted((c for c in ch.candidates if not c.rejected), key=lambda c: c.cost)
    picked, seen = [ch.best], {(ch.best.unit, ch.best.tile_bytes, ch.best.window_steps)}
    for unit in ("rank", "node"):  # the best of each reader layout, then the cheapest others
        for c in ok:
            if c.unit == unit and (c.unit, c.tile_bytes, c.window_steps) not in seen:
                picked.append(c)
                seen.add((c.unit, c.tile_bytes, c.window_steps))
                break
    for c in ok:
        if len(picked) >= top:
            break
        key = (c.unit, c.tile_bytes, c.window_steps)
        if key not in seen:
            picked.append(c)
            seen.add(key)
    return ch, picked


def measure_cpu(ds, comm, batches=(64, 256, 2048), epochs: int = 3) -> dict:
    """The cpu term's constants from warm epochs (module docstring, ``--cpu``)."""
    from feedline.plan.cost import CPU_COPY_BW, CPU_STEP_S, DECODE_RECORD_S

    def best_epoch(batch: int, decode: bool) -> tuple[float, int, float]:
        """(median epoch less the model's I/O terms, steps, bytes per rank)"""
        with Loader(ds, batch, decode=decode, profile="memory", store="off") as ld:
            io_s = sum(v for k, v in ld.choice.best.terms.items() if k != "cpu")
            times, nbytes, steps = [], 0, 0
            for e in range(epochs + 1):  # the first warms the page cache and the heap
                ld.set_epoch(e)
                comm.Barrier()
                t, nbytes, steps = time.perf_counter(), 0, 0
                for b in ld:
                    nbytes += int(np.asarray(b.lengths).sum())
                    steps += 1
                comm.Barrier()
                if e:
                    times.append(time.perf_counter() - t)
        return float(np.median(times)) - io_s, steps, float(comm.allreduce(nbytes)) / comm.size

    raw = {b: best_epoch(b, False) for b in batches}
    A = np.array([[steps, nb] for _, steps, nb in raw.values()], dtype=float)
    y = np.array([t for t, _, _ in raw.values()])
    (step_s, byte_s), *_ = np.linalg.lstsq(A, y, rcond=None)
    mid = batches[len(batches) // 2]
    dec_t = best_epoch(mid, True)[0]
    records = len(ds) / comm.size
    fit = {
        "CPU_STEP_S": max(float(step_s), 0.0),
        "CPU_COPY_BW": 1.0 / byte_s if byte_s > 0 else float("inf"),
        "DECODE_RECORD_S": max(dec_t - raw[mid][0], 0.0) / records,
    }
    return {
        "ranks": comm.size,
        "epochs_raw_s": {str(b): v[0] for b, v in raw.items()},
        "epoch_decoded_s": {str(mid): dec_t},
        "fit": fit,
        "model": {
            "CPU_STEP_S": CPU_STEP_S,
            "CPU_COPY_BW": CPU_COPY_BW,
            "DECODE_RECORD_S": DECODE_RECORD_S,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cpu", action="store_true", help="measure the cpu term's constants")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    ds = open_dataset(args.dataset, comm=comm)
    if args.cpu:
        doc = measure_cpu(ds, comm)
        if comm.rank == 0:
            for k, v in doc["fit"].items():
                print(f"{k:<16} measured {v:10.3g}   model {doc['model'][k]:10.3g}")
            raw = {k: round(v, 3) for k, v in doc["epochs_raw_s"].items()}
            print("epochs less their I/O terms, s (raw, by batch):", raw)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(doc, f, indent=1)
        return
    probe = Loader(ds, args.batch, decode=False, profile=args.profile)
    world = WorldSpec(probe.world.size, probe.world.nodes)
    host = probe.world.host  # this host's ranks and cores: the cpu term
    cap = probe._read_cap()
    profile = get_profile(args.profile, ds.files[0])
    probe.close()
    ch, picked = candidates(ds, world, args.batch, cap, profile, args.top, host, args.epochs)
    rows = []
    for c in picked:
        if world.nodes == world.size and c.unit == "node":
            continue
        strategy = PRESETS["feedline"].replace(auto=False, **c.knobs)
        source = {"node": "node", "store": "store"}.get(c.unit, "direct")
        times = []
        with Loader(ds, args.batch, preset=strategy, source=source, decode=False) as ld:
            for _ in range(args.epochs):
                if comm.rank == 0:
                    drop_caches(ds.files)
                comm.Barrier()
                t = time.perf_counter()
                for _b in ld:
                    pass
                comm.Barrier()
                times.append(time.perf_counter() - t)
        rows.append(
            {
                "candidate": c.label(),
                "chosen": c is ch.best,
                "estimate_s": c.cost,
                "terms": dict(c.terms),
                "requests": c.requests,
                "measured_s": float(np.mean(times)),  # as the estimate: per epoch, mean
                "times_s": times,
            }
        )
        if comm.rank == 0:
            r = rows[-1]
            print(
                f"{'*' if r['chosen'] else ' '} {r['candidate']:<58} estimate "
                f"{r['estimate_s']:7.3f} s  measured {r['measured_s']:7.3f} s",
                flush=True,
            )
    if comm.rank != 0 or not rows:
        return
    est = np.array([r["estimate_s"] for r in rows])
    meas = np.array([r["measured_s"] for r in rows])
    rank_est = np.argsort(np.argsort(est))
    rank_meas = np.argsort(np.argsort(meas))
    rho = float(np.corrcoef(rank_est, rank_meas)[0, 1]) if len(rows) > 2 else float("nan")
    A = np.array([[r["terms"].get(t, 0.0) for t in TERMS] for r in rows])
    coef, *_ = np.linalg.lstsq(A, meas, rcond=None)
    coef = np.clip(coef, 0.0, None)
    fit = {t: float(x) for t, x in zip(TERMS, coef, strict=True)}
    best_measured = rows[int(np.argmin(meas))]["candidate"]
    doc = {
        "profile": profile.to_dict(),
        "ranks": world.size,
        "nodes": world.nodes,
        "batch": args.batch,
        "rows": rows,
        "spearman_estimate_vs_measured": rho,
        "measured_over_estimate_median": float(np.median(meas / np.maximum(est, 1e-9))),
        "term_multipliers": fit,
        "chosen_is_fastest_measured": bool(rows[int(np.argmin(meas))]["chosen"]),
        "fastest_measured": best_measured,
    }
    print(
        f"profile {profile.name!r}: Spearman(estimate, measured) = {rho:.2f}; measured / "
        f"estimate, median {doc['measured_over_estimate_median']:.2f}; fitted multipliers "
        + ", ".join(f"{k} {v:.2f}" for k, v in fit.items())
        + f"; fastest measured: {best_measured}"
        + (" (the model's choice)" if doc["chosen_is_fastest_measured"] else "")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
