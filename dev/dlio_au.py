#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Accelerator utilization (AU) of DLIO's workloads: DLIO's own loader vs feedline.

    dev/dlio_au.py [--ranks 2] [--root /tmp/dlio] [--epochs 2] [--only unet3d,resnet50]

For each workload: generate its data once (scaled down to fit one machine; cached under
ROOT/data), then for each loader drop the data's pages from the cache and run
``mpiexec -n RANKS dlio_benchmark workload=...`` with DLIO's own loader (pytorch where
DLIO supports the format, tensorflow for TFRecord, which DLIO 2.0 refuses to read with
pytorch) and with ``feedline.dlio.Loader``. The AU is DLIO's own
``train_au_mean_percentage`` from its ``summary.json``; the table goes to stdout and
ROOT/au.md. Needs ``dlio_benchmark`` (see docs/dlio.md for installing it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

#: name -> (DLIO workload config, DLIO's loader for the baseline, MLPerf pass level %,
#: scaled-down overrides)
WORKLOADS = {
    "unet3d": (
        "unet3d_a100",
        "pytorch",
        90,
        [
            "++workload.dataset.num_files_train=84",
            "++workload.dataset.record_length=4194304",
            "++workload.dataset.record_length_stdev=0",
            "++workload.dataset.record_length_resize=4194304",
        ],
    ),
    "resnet50": (
        "resnet50_a100",
        "tensorflow",
        90,
        [
            "++workload.dataset.num_files_train=16",
            "++workload.dataset.num_samples_per_file=256",
            "++workload.reader.computation_threads=2",
        ],
    ),
    "cosmoflow": (
        "cosmoflow_a100",
        "tensorflow",
        70,
        [
            "++workload.dataset.num_files_train=64",
        ],
    ),
    "cosmoflow-hdf5": (
        "cosmoflow_a100",
        "pytorch",
        70,
        [
            "++workload.dataset.num_files_train=64",
            "++workload.dataset.format=hdf5",
            # DLIO's HDF5 generator draws generation_buffer_size (default 2 GB) of random data
            # per 2.8 MB file: ~1 file a minute here
            "++workload.dataset.generation_buffer_size=8388608",
            # feedline's hdf5 format wants one row shape across files (docs/dlio.md)
            "++workload.dataset.record_length_stdev=0",
            "++workload.framework=pytorch",
            "++workload.reader.data_loader=pytorch",
        ],
    ),
}


def _mpiexec() -> str:
    beside = os.path.join(os.path.dirname(os.path.realpath(sys.executable)), "mpiexec")
    return os.environ.get("FEEDLINE_MPIEXEC") or (
        beside if os.path.exists(beside) else shutil.which("mpiexec") or "mpiexec"
    )


def _dlio() -> str:
    return shutil.which("dlio_benchmark") or os.path.join(
        os.path.dirname(sys.executable), "dlio_benchmark"
    )


def run_dlio(args: list[str], ranks: int, log: str) -> int:
    cmd = [_mpiexec(), "-n", str(ranks), _dlio(), *args] if ranks > 1 else [_dlio(), *args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if shutil.which("tfrecord2idx") is None:  # DALI's; ours is in dev/
        env["PATH"] = os.path.dirname(os.path.abspath(__file__)) + os.pathsep + env["PATH"]
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode


def evict(folder: str) -> None:
    from feedline_tools.bench.limit import evict as _evict

    _evict([os.path.join(d, f) for d, _, names in os.walk(folder) for f in names])


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--root", default="/tmp/dlio")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--read-threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated workloads")
    a = ap.parse_args()
    names = a.only.split(",") if a.only else list(WORKLOADS)
    os.makedirs(a.root, exist_ok=True)
    rows = []
    for name in names:
        cfg, base_loader, level, over = WORKLOADS[name]
        data = os.path.join(a.root, "data", name)
        common = [
            f"workload={cfg}",
            f"++workload.dataset.data_folder={data}",
            "++workload.workflow.checkpoint=False",
            *over,
        ]
        if not os.path.exists(os.path.join(data, ".complete")):
            rc = run_dlio(
                [
                    *common,
                    "++workload.workflow.generate_data=True",
                    "++workload.workflow.train=False",
                    f"++hydra.run.dir={a.root}/out/{name}-gen",
                ],
                1,
                os.path.join(a.root, f"{name}-gen.log"),
            )
            if rc:
                rows.append({"workload": name, "error": f"generation failed (exit {rc})"})
                continue
            open(os.path.join(data, ".complete"), "w").close()
        train = [
            *common,
            "++workload.workflow.generate_data=False",
            "++workload.workflow.train=True",
            f"++workload.train.epochs={a.epochs}",
            f"++workload.reader.read_threads={a.read_threads}",
        ]
        row = {"workload": name, "baseline": base_loader, "level": level}
        for who, extra in (
            ("dlio", []),
            (
                "feedline",
                [
                    "++workload.reader.data_loader_classname=feedline.dlio.Loader",
                    "++workload.reader.data_loader_sampler=iterative",
                ],
            ),
        ):
            out = os.path.join(a.root, "out", f"{name}-{who}")
            shutil.rmtree(out, ignore_errors=True)
            evict(data)
            t0 = time.time()
            rc = run_dlio(
                [*train, *extra, f"++hydra.run.dir={out}"],
                a.ranks,
                os.path.join(a.root, f"{name}-{who}.log"),
            )
            row[f"{who}_s"] = time.time() - t0
            try:
                with open(os.path.join(out, "summary.json")) as f:
                    m = json.load(f)["metric"]
                row[f"{who}_au"] = m["train_au_mean_percentage"]
                row[f"{who}_sps"] = m["train_throughput_mean_samples_per_second"]
                row[f"{who}_mbps"] = m.get("train_io_mean_MB_per_second")
            except (OSError, KeyError, ValueError):
                row[f"{who}_error"] = f"exit {rc}, no summary (see {name}-{who}.log)"
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = [
        f"AU at {a.ranks} processes, {a.epochs} epochs, cold cache; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "",
        "| workload | DLIO loader | AU DLIO % | AU feedline % | MLPerf pass | samples/s DLIO "
        "| samples/s feedline | MB/s DLIO | MB/s feedline |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def f(r, k, spec=".1f"):
        v = r.get(k)
        return r.get(k.rsplit("_", 1)[0] + "_error", "-") if v is None else format(v, spec)

    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['error']} | | | | | | | |")
            continue
        ok = " / ".join(
            ("pass" if r.get(f"{w}_au", 0) >= r["level"] else "fail") for w in ("dlio", "feedline")
        )
        lines.append(
            f"| {r['workload']} | {r['baseline']} | {f(r, 'dlio_au')} | {f(r, 'feedline_au')} "
            f"| >= {r['level']}%: {ok} | {f(r, 'dlio_sps')} | {f(r, 'feedline_sps')} "
            f"| {f(r, 'dlio_mbps', '.0f')} | {f(r, 'feedline_mbps', '.0f')} |"
        )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.root, "au.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
