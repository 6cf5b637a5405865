# SPDX-License-Identifier: Apache-2.0
"""Run :mod:`feedline.testing`'s source checks, under mpiexec or in one process.

    source_conformance_mpi.py OUT.json CASES.json

CASES.json is a list of cases: ``{"id", "check": "contract"|"error", "source": a source
name or "module:Class" (importable with tests/ on the path), "data": path, "open":
open_dataset options, "preset", "batch", "options": Loader options, "ranks" (contract:
ranks simulated per process), "damage" (error: "truncate"|"remove")}``. Every rank runs
every case in order with the same arguments (the checks gather over the Loader's
communicator); rank 0 writes ``{id: {"ok", "error", "report" | "raised"}}``, where
``raised`` lists the error type each rank's damaged pass raised.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

from feedline import open_dataset
from feedline.dist.launch import detect
from feedline.testing import check_source, check_storage_error


def source_of(spec: str):
    if ":" not in spec:
        return spec
    module, attr = spec.split(":")
    return getattr(importlib.import_module(module), attr)


def run(case: dict, comm) -> dict:
    ds = open_dataset(case["data"], comm=comm, sidecar=False, **case.get("open", {}))
    kw = dict(case.get("options", {}), batch_size=case["batch"], preset=case.get("preset"))
    source = source_of(case["source"])
    if case["check"] == "contract":
        report = check_source(source, ds, ranks=case.get("ranks", 1), **kw)
        report.pop("ids")
        return {"report": report}
    err = check_storage_error(source, ds, damage=case.get("damage", "truncate"), timeout_s=60, **kw)
    name = f"{type(err).__name__}: {err}"
    return {"raised": comm.allgather(name) if comm is not None else [name]}


def main() -> None:
    out, cases_path = sys.argv[1], sys.argv[2]
    comm = None
    if detect().mpi_world:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    with open(cases_path) as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        try:
            res = {"ok": True, **run(case, comm)}
        except Exception as e:
            res = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(),
            }
        results[case["id"]] = res
    if comm is None or comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f, default=str)


if __name__ == "__main__":
    main()
