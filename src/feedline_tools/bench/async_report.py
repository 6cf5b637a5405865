# SPDX-License-Identifier: Apache-2.0
"""``feedline bench async``'s report: the summary against async-db, the markdown tables
(the paper's Tables II-V and the buffer sweep) and the plots."""

from __future__ import annotations

import os
from typing import Any

from feedline_tools.bench import report


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """async-db's exposed I/O as % of its epoch, and how many times less it is than the
    others' (their exposed I/O / async-db's) and how much shorter its epoch is."""
    by = {r["name"]: r for r in rows}
    db = by.get("async-db")
    if db is None or db["exposed_io_s"] is None:
        return {}
    out: dict[str, Any] = {"async_db_exposed_pct": db["exposed_pct"], "vs": {}}
    if db.get("stall_s") is not None and db["total_s"]:
        # the part of the exposed time that is reads not hidden by compute
        out["async_db_stall_pct"] = 100 * db["stall_s"] / db["total_s"]
    for r in rows:
        if r["name"] == "async-db" or r["exposed_io_s"] is None:
            continue
        out["vs"][r["name"]] = {
            "exposed_ratio": r["exposed_io_s"] / db["exposed_io_s"] if db["exposed_io_s"] else None,
            "epoch_ratio": r["total_s"] / db["total_s"] if db["total_s"] else None,
        }
    return out


# ----------------------------------------------------------------------- output


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(result: dict[str, Any]) -> str:
    """Tables II-V (per dataset: exposed I/O / compute / other / total per epoch) and
    the buffer sweeps."""
    parts = ["## feedline bench async\n"]
    for name, e in result["datasets"].items():
        sh = e["shape"]
        parts.append(
            f"### {name}: {sh['samples']} samples x {e['record_bytes'] / 1e3:.1f} KB, "
            f"{e['ranks']} ranks, global batch {sh['batch_size']}, {e['steps']} steps, "
            f"buffer {sh['buffer']} samples, compute "
            + (
                "a small model's training step"
                if e.get("compute") == "model"
                else f"{e['compute_ms']:.2f} ms/step"
            )
            + f" (limit {_f(e['limit_MBps'], '.0f')} MB/s)\n"
        )
        if "calibration" in e:
            parts.append(
                f"async read time per step without compute: "
                f"{e['calibration']['read_ms_per_step']:.2f} ms\n"
            )
        epochs = e.get("epochs", 1)
        parts.append(
            f"Seconds per epoch, averaged over {epochs} epoch(s) (the page cache emptied "
            "every 100 ms after the first, so no epoch reads from memory); '1st wait' is the "
            "first step's wait of epoch 1 (cold start) and of later epochs (mean); "
            "'exposed %, later' is the share of the epochs after the first spent waiting in "
            "next() (the largest over the ranks; set_epoch and iter() not counted, as in "
            "the exposed I/O), what every epoch of a long run would see.\n"
            if epochs > 1
            else "Seconds of one epoch from cold cache.\n"
        )
        parts.append(
            "| I/O strategy | what it is | shuffles? | exposed I/O s | 1st wait, epoch 1 | 1st wait, later | stalls s "
            "| median wait ms | compute s asked (actual) | start-up s | other s | epoch s "
            "| exposed % | exposed %, later | read ops | MB/s | RL | digest |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        )
        for r in e["rows"]:
            if r["error"]:
                parts.append(
                    f"| {r['name']} | {report.describe_run(r['name'])} | "
                    f"{report.shuffle_cell(r)} | error: {r['error']} |||||||"
                )
                continue
            parts.append(
                f"| {r['name']} | {report.describe_run(r['name'])} | {report.shuffle_cell(r)} "
                f"| {_f(r['exposed_io_s'])} | {_f(r['first_wait_s'])} | "
                f"{_f(r.get('later_first_wait_s'))} | {_f(r['stall_s'])} | "
                f"{_f(r['median_wait_ms'])} | "
                f"{_f(r['compute_s'])} ({_f(r['compute_actual_s'])}) | {_f(r['startup_s'])} | "
                f"{_f(r['other_s'])} | {_f(r['total_s'])} | {_f(r['exposed_pct'], '.1f')} | "
                f"{_f(r.get('later_exposed_pct'), '.1f')} | "
                f"{r['storage_ops']} | {_f(r['MBps'], '.0f')} | {_f(r['rl'], '.2f')} | "
                f"{(r['digest'] or '-')[:12]} |"
            )
        s = e.get("summary") or {}
        if s:
            vs = ", ".join(
                f"{k} {_f(v['exposed_ratio'], '.1f')}x exposed / {_f(v['epoch_ratio'], '.2f')}x "
                "epoch"
                for k, v in s["vs"].items()
            )
            parts.append(
                f"\nasync-db exposed I/O = {_f(s['async_db_exposed_pct'], '.2f')}% of its "
                f"epoch (stalls beyond the median wait: {_f(s.get('async_db_stall_pct'), '.2f')}%)"
                f"; others vs async-db: {vs}\n"
            )
        if e.get("sweep"):
            parts.append(
                "buffer sweep (async-db):\n\n| buffer samples | buffer MiB | exposed I/O s "
                "| of which 1st step | stalls s | median wait ms | epoch s | exposed % | read ops "
                "| RL |\n|---|---|---|---|---|---|---|---|---|---|"
            )
            for r in e["sweep"]:
                parts.append(
                    f"| {r['buffer_samples']} | {r['buffer_MiB']:.2f} | {_f(r['exposed_io_s'])} "
                    f"| {_f(r['first_wait_s'])} | {_f(r['stall_s'])} | {_f(r['median_wait_ms'])} "
                    f"| {_f(r['total_s'])} | "
                    f"{_f(r['exposed_pct'], '.1f')} | {r['storage_ops']} | {_f(r['rl'], '.2f')} |"
                )
            parts.append("")
    return "\n".join(parts) + "\n"


def plot(result: dict[str, Any], out_dir: str) -> list[str]:
    """``async-breakdown.png`` (stacked exposed/compute/other per strategy, one panel
    per dataset) and ``async-buffer-sweep.png`` (exposed I/O vs buffer MiB)."""
    plt = report._pyplot()
    made = []
    names = [n for n, e in result["datasets"].items() if e.get("rows")]
    if names:
        fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.8), squeeze=False)
        for ax, name in zip(axes[0], names, strict=True):
            rows = [r for r in result["datasets"][name]["rows"] if r["total_s"] is not None]
            x = range(len(rows))
            bottom = [0.0] * len(rows)
            for key, label in (
                ("exposed_io_s", "exposed I/O"),
                ("compute_actual_s", "compute (slept)"),
                ("startup_s", "start-up"),
                ("other_s", "other"),
            ):
                vals = [r[key] or 0.0 for r in rows]
                ax.bar(x, vals, 0.7, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            ax.set_xticks(list(x), [r["name"] for r in rows], rotation=30, ha="right")
            ax.set_ylabel("seconds per epoch (slowest rank)")
            ax.set_title(name)
            ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(out_dir, "async-breakdown.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    sweeps = [(n, e["sweep"]) for n, e in result["datasets"].items() if e.get("sweep")]
    if sweeps:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for name, rows in sweeps:
            pts = [(r["buffer_MiB"], r["exposed_io_s"]) for r in rows if r["exposed_io_s"]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("I/O buffer per rank (MiB)")
        ax.set_ylabel("exposed I/O per epoch (s)")
        ax.set_title("async-db: exposed I/O vs buffer size")
        ax.legend()
        fig.tight_layout()
        p = os.path.join(out_dir, "async-buffer-sweep.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    return made
