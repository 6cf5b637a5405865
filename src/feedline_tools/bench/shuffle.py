# SPDX-License-Identifier: Apache-2.0
"""``feedline bench shuffle``: how random each plan's order is (DeepIO RL) and what that
does to learning.

1. **RL of each plan** over the training set: global shuffle, the ``feedline`` preset's
   2 MiB tiles (planned over the dataset's index, as the Loader plans), the asynchronous-I/O
   paper's chunk shuffle at several buffer sizes B (groups of B contiguous samples
   shuffled globally, each of the ``--ranks`` ranks owning a share of groups and
   shuffling inside its buffer), no shuffle, and DeepIO's memory(R) rounds — the
   planner's RL model (``feedline.randomization_level``) and the RL of the realised
   epoch-0 order, plus how mixed the classes of a global batch are.
2. **A real CPU training run**: a small CNN (``feedline_tools.bench.models``) on
   ``cifar10-large``-shaped data written *class-sorted*, as datasets converted from
   class folders are, so that an order which keeps neighbours together shows batches of
   one class. Every order trains the same initial model with the same optimizer for
   ``--epochs`` epochs over the same training samples; the held-out split (every
   ``1/--holdout``-th sample, all classes) gives the final accuracy.
3. **Calibration** against DeepIO: RL of constant-order groups of 4/16/256 samples and
   of memory rounds with R = 0.5/0.25 on a Caltech-101-sized training set, next to the
   paper's 73/49/16% (Fig. 7) and 98.54/96.96% (§III-C).

Orders come from the pure planner for the world of ``--ranks`` ranks, exactly the
global sample sequence such a job delivers; samples are decoded once into memory (read
with the feedline Loader) so that training time, not I/O, is what the run costs. The
trade-off: the training is small (a few epochs of a small CNN on synthetic templates),
enough to rank orders by learning quality, not to predict a production model's accuracy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from feedline.errors import ConfigError
from feedline.plan import WorldSpec, get_strategy, make_plan
from feedline.plan import rl as _rl
from feedline.units import count_at_least as at_least
from feedline_tools.bench import report

PAPER_GROUPS = {4: 0.73, 16: 0.49, 256: 0.16}  # DeepIO Fig. 7 (Caltech-101, 85% train)
PAPER_MEMORY = {0.5: 0.9854, 0.25: 0.9696}  # DeepIO §III-C
CALIB_N = (7664, 7772)  # see docs/planner.md: the paper's exact split size is not given


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--samples", type=at_least(1), default=None, help="dataset size (10000; 400 with --quick)"
    )
    parser.add_argument(
        "--epochs", type=at_least(1), default=None, help="training epochs (2; 1 with --quick)"
    )
    parser.add_argument("--batch-size", type=at_least(1), default=128, help="global batch (128)")
    parser.add_argument(
        "--chunks", default=None, metavar="LIST", help="chunk sizes B (default 16,256,2048)"
    )
    parser.add_argument(
        "--memory",
        default=None,
        metavar="LIST",
        help="DeepIO memory fractions R trained (default 0.25, none with --quick; RL rows "
        "also 0.5, 0.1)",
    )
    parser.add_argument(
        "--holdout", type=at_least(1), default=10, help="every k-th sample held out"
    )
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch CPU threads (1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-train", action="store_true", help="RL tables only")
    parser.add_argument("--ranks", type=at_least(1), default=4, metavar="N", help="plan world size")
    parser.add_argument("--nodes", type=at_least(1), default=1, metavar="M", help="plan nodes")
    parser.add_argument("--path", metavar="P", help="dataset (generated there if missing)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the result document here")
    parser.add_argument("--out", default="bench-out", metavar="DIR", help="table, JSON, plot")
    report.add_plot_arguments(parser)


# ------------------------------------------------------------------------ orders


def orders(chunks: list[int], memory: list[float]) -> list[tuple[str, Any]]:
    """(row name, strategy) of every compared order."""
    # the feedline row is its window shuffle: where the dataset fits in memory the preset
    # may run on the DeepIO store instead, whose order is the "memory R=1" shuffle
    feedline = get_strategy("feedline", store="off")
    rows: list[tuple[str, Any]] = [("global", get_strategy("tf")), ("feedline", feedline)]
    rows += [(f"chunk B={b}", get_strategy("async-db", chunk=b)) for b in chunks]
    rows += [(f"memory R={r:g}", get_strategy("deepio-ordered", memory_fraction=r)) for r in memory]
    rows.append(("none", get_strategy("strided")))
    return rows


def epoch_order(source: Any, world: WorldSpec, strategy: Any, seed: int, epoch: int, batch: int):
    """The global sample sequence of one epoch (step s = the next *batch* ids); *source*
    is the dataset's index (the ``feedline`` preset sizes its tiles in bytes) or a count."""
    return make_plan(source, world, strategy, seed, epoch, batch).order()


def class_mix(order: np.ndarray, labels: np.ndarray, batch: int, classes: int) -> float:
    """Mean entropy of the class histogram of a global batch, over log2(classes):
    1 when every batch holds all classes equally, 0 when each holds one class."""
    ent = []
    for a in range(0, len(order), batch):
        c = np.bincount(labels[order[a : a + batch]], minlength=classes)
        p = c[c > 0] / c.sum()
        ent.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(ent)) / np.log2(classes) if ent else 0.0


def calibration(ns: tuple[int, ...] = CALIB_N) -> list[dict[str, Any]]:
    """RL of DeepIO's checkpoints at Caltech-101-sized training sets."""
    rows = []
    for g, paper in PAPER_GROUPS.items():
        rows.append(
            {
                "case": f"constant groups of {g}",
                "paper": paper,
                "feedline": {n: _rl.rl_grouped(n, g, exact=True) for n in ns},
            }
        )
    for r, paper in PAPER_MEMORY.items():
        rows.append(
            {
                "case": f"memory R={r:g}",
                "paper": paper,
                "feedline": {n: _rl.rl_memory(n, r, exact=True) for n in ns},
            }
        )
    return rows


# ---------------------------------------------------------------------- dataset


def load_dataset(path: str) -> tuple[np.ndarray, np.ndarray]:
    """All samples of *path* decoded into memory (uint8 images, int labels), by id."""
    from feedline.dataset import open_dataset
    from feedline.loader import Loader

    ds = open_dataset(path)
    n = len(ds)
    x = y = None
    with Loader(ds, 1024, preset="tf", shuffle=False, decode=True) as loader:
        for b in loader:
            if x is None or y is None:
                x = np.empty((n, *b.data.shape[1:]), dtype=b.data.dtype)
                y = np.empty(n, dtype=np.int64)
            x[b.ids] = b.data
            y[b.ids] = b.labels
    ds.close()
    if x is None or y is None:
        raise ConfigError(f"{path}: empty dataset")
    return x, y


def _index_of(path: str):
    """The dataset's index (record extents), for plans that size their reads in bytes."""
    from feedline.dataset import open_dataset

    ds = open_dataset(path)
    try:
        return ds.index
    finally:
        ds.close()


# --------------------------------------------------------------------- scenario


def run(args: argparse.Namespace) -> int:
    n = args.samples or (400 if args.quick else 10000)
    epochs = args.epochs or (1 if args.quick else 2)
    chunks = [int(c) for c in (args.chunks or ("64" if args.quick else "16,256,2048")).split(",")]
    memory = args.memory if args.memory is not None else ("" if args.quick else "0.25")
    train_mem = [float(r) for r in memory.split(",") if r]
    world = WorldSpec(args.ranks, args.nodes)
    if args.holdout < 2:
        raise ConfigError("--holdout must be >= 2 (every k-th sample is held out)")
    doc: dict[str, Any] = {
        "scenario": "shuffle",
        "samples": n,
        "ranks": world.size,
        "nodes": world.nodes,
        "batch_size": args.batch_size,
        "epochs": epochs,
        "seed": args.seed,
        "calibration": calibration(),
    }
    tmp = None
    path = args.path
    if path is None:
        tmp = tempfile.mkdtemp(prefix="feedline-shuffle-")
        path = os.path.join(tmp, "cifar")
    try:
        if not os.path.exists(os.path.join(path, ".feedline-make.json")):
            from feedline_tools.make import generate

            generate("cifar10-large", path, samples=n, seed=args.seed, force=True, progress=False)
        x, y = load_dataset(path)
        index = _index_of(path)
        if len(y) != n:
            n = doc["samples"] = len(y)
        classes = int(y.max()) + 1
        test = np.zeros(n, dtype=bool)
        test[:: args.holdout] = True  # every k-th sample of a class-sorted set: all classes
        doc["train_samples"] = int((~test).sum())
        doc["test_samples"] = int(test.sum())
        doc["rows"] = []
        trained = set(chunks) | {("m", r) for r in train_mem}
        rl_only = [r for r in (0.5, 0.25, 0.1) if r not in train_mem]
        plans = orders(chunks, train_mem + rl_only)
        for name, strat in plans:
            plan0 = make_plan(index, world, strat, args.seed, 0, args.batch_size)
            order0 = plan0.order()
            row: dict[str, Any] = {
                "order": name,
                "strategy": strat.to_dict(),
                "rl": float(_rl.randomization_level(plan0)),
                "rl_observed": float(_rl.rl_of_sequence(order0)),
                "class_mix": class_mix(order0, y, args.batch_size, classes),
                "classes_per_batch": _rl.classes_per_batch(order0, y, args.batch_size),
                "disk_correlation": _rl.disk_order_correlation(order0),
                "accuracy": None,
                "loss": None,
            }
            is_trained = (
                name in ("global", "feedline", "none")
                or (strat.assignment == "chunk" and strat.chunk in trained)
                or (strat.assignment == "memory" and ("m", strat.memory_fraction) in trained)
            )
            if is_trained and not args.no_train:
                row.update(train(x, y, test, index, world, strat, args, epochs))
            doc["rows"].append(row)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    emit(doc, args)
    return 0


def train(x, y, test, index, world, strat, args, epochs) -> dict[str, Any]:
    """Train the small CNN from the same initial weights in *strat*'s order."""
    import torch

    from feedline_tools.bench.models import accuracy, small_cnn, train_batches

    torch.set_num_threads(max(1, args.threads))
    torch.manual_seed(args.seed)
    model = small_cnn(x.shape[1], int(y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    t0 = time.perf_counter()
    loss = float("nan")
    for e in range(epochs):
        order = epoch_order(index, world, strat, args.seed, e, args.batch_size)

        def batches(order=order):
            for a in range(0, len(order), args.batch_size):
                ids = order[a : a + args.batch_size]
                ids = ids[~test[ids]]
                yield x[ids], y[ids]

        loss, _ = train_batches(model, opt, batches())
    acc = accuracy(model, x[test], y[test])
    return {"accuracy": acc, "loss": loss, "train_s": time.perf_counter() - t0}


# ----------------------------------------------------------------------- output


def _p(x: Any, spec: str = ".1f") -> str:
    return "-" if x is None else format(100 * x, spec) + "%"


def markdown(doc: dict[str, Any]) -> str:
    out = [
        f"## feedline bench shuffle: {doc['samples']:,} cifar10-large-shaped samples "
        f"(class-sorted), {doc['ranks']} ranks, global batch {doc['batch_size']}, "
        f"{doc['epochs']} epoch(s), held out {doc.get('test_samples', 0):,}\n",
        "| order | what it is | shuffles? | RL (model) | RL (observed) | class mix per batch "
        "| classes per batch | corr. with disk order | held-out accuracy | final train loss |\n"
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc.get("rows", []):
        loss = "-" if r["loss"] is None else f"{r['loss']:.3f}"
        out.append(
            f"| {r['order']} | {report.describe_run(r['order'])} | "
            f"{report.shuffle_cell({'name': r['order'], 'rl': r['rl_observed']})} | "
            f"{_p(r['rl'])} | {_p(r['rl_observed'])} | "
            f"{r['class_mix']:.2f} | {r['classes_per_batch']:.2f} | "
            f"{r['disk_correlation']:+.3f} | {_p(r['accuracy'])} | {loss} |"
        )
    cal = doc["calibration"]
    ns = list(cal[0]["feedline"])
    out.append(
        "\n### RL calibration against DeepIO (Caltech-101-sized training sets)\n\n"
        "| case | paper | "
        + " | ".join(f"feedline N={k}" for k in ns)
        + " |\n|---|---|"
        + "---|" * len(ns)
    )
    for c in cal:
        vals = " | ".join(_p(c["feedline"][k], ".2f") for k in ns)
        out.append(f"| {c['case']} | {_p(c['paper'], '.2f')} | {vals} |")
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], path: str) -> str | None:
    """Held-out accuracy against the RL model (left) and against the class mix of a
    batch (right), one marker per order."""
    rows = [r for r in doc.get("rows", []) if r["accuracy"] is not None]
    if not rows:
        return None
    plt = report._pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    markers = "osD^vP*Xh"
    for i, r in enumerate(rows):
        for ax, key in zip(axes, ("rl", "class_mix"), strict=True):
            ax.scatter(
                r[key], r["accuracy"], marker=markers[i % len(markers)], s=50, label=r["order"]
            )
    axes[0].set_xlabel("randomization level (DeepIO RL, planner model)")
    axes[1].set_xlabel("class mix of a global batch (entropy / log2 classes)")
    axes[0].set_ylabel("held-out accuracy")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"shuffle quality vs learning: class-sorted data, {doc['ranks']} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def emit(doc: dict[str, Any], args: argparse.Namespace) -> None:
    text = markdown(doc)
    # JSON keys must be strings
    for c in doc["calibration"]:
        c["feedline"] = {str(k): v for k, v in c["feedline"].items()}
    report.emit_scenario(
        doc, args, "shuffle", text, lambda: plot(doc, os.path.join(args.out, "shuffle.png"))
    )
