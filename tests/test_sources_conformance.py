# SPDX-License-Identifier: Apache-2.0
"""Issue 14 item 2: every source, registered by name in one table, passes one conformance
suite (:mod:`feedline.testing`): exactly once per epoch across ranks, the plan's order,
lengths and bytes, resume mid-epoch, close twice and use after close, and a typed error
(never a raw exception or a hang) when storage fails under it.

Parametrised over ``sorted(SOURCES)`` and a user-written source defined here
(:class:`ToySource`), which passes the same checks. Sources that need an MPI world
(``node``; the DeepIO ``store`` at several ranks; the node windows and cursor hand-offs
of ``lmdbio``) run under ``mpiexec -n 2`` (tests/mpi/source_conformance_mpi.py, one
launch for the contract cases but the ``node`` source's, which get one each, one for the
damaged-storage cases); the rest run in this
process, at 1 rank and at 3 ranks simulated in turn. Damaged-storage cases run in a
child process (a mapped LMDB that faults would otherwise kill pytest), each on its own
copy of the data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import lmdb
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from loader_common import write_records

from feedline import ConfigError, Loader, open_dataset
from feedline.plan.strategy import PRESETS
from feedline.sources.base import (
    PRESET_SOURCES,
    SOURCE_MODULES,
    SOURCES,
    RawBatch,
    Source,
    _load,
    source_name_for,
)
from feedline.testing import check_source, check_storage_error

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "mpi", "source_conformance_mpi.py")
B = 16
REC_N, REC_SIZE, DB_N = 150, 24, 120


class ToySource(Source):
    """A user-written source: the plan's records of each step, read one by one with
    ``Dataset.read`` (no threads, no buffers to release)."""

    name = "toy-one-by-one"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._plan = None
        self._reads = 0

    def start(self, plan, first_step: int) -> None:
        self._plan = plan

    def get(self, step: int) -> RawBatch:
        return self._read(self._plan.samples(self.ctx.rank, step))

    def _read(self, ids) -> RawBatch:
        ids = np.asarray(ids, dtype=np.int64)
        recs = [self.ctx.dataset.read(int(i)) for i in ids]
        self._reads += len(recs)
        data = np.frombuffer(b"".join(recs), dtype=np.uint8).copy()
        return RawBatch(ids, data, np.array([len(r) for r in recs], dtype=np.int64))

    def stats(self) -> dict:
        return {"storage_ops": self._reads}

    def close(self) -> None:
        self._plan = None


TOY = f"test_sources_conformance:{ToySource.__name__}"  # importable by the mpiexec script

_load()
NAMES = sorted(SOURCES)


def case(source, preset, data, *, ranks=1, mpi=0, xfail=None, alone=False, **options):
    """One configuration of a source: preset, dataset ("rec": 150 fixed 24-byte records
    over 3 files; "db": an LMDB of 120 records of 1..6000 bytes), ranks simulated in one
    process, or mpi ranks under mpiexec (*alone*: in a launch of its own, so that a case
    that fails on one rank cannot leave its peer waiting in the next case)."""
    ident = f"{source}/{preset}/{data}" + (f"/r{ranks}" if ranks > 1 else "")
    ident += f"/mpi{mpi}" if mpi else ""
    ident += "".join(f"/{k}={v}" for k, v in options.items())
    return {
        "id": ident,
        "source": TOY if source == ToySource.name else source,
        "preset": preset,
        "data": data,
        "ranks": ranks,
        "mpi": mpi,
        "options": options,
        "xfail": xfail,
        "alone": alone,
    }


#: the contract cases of each source (a source without an entry fails test_every_source_has_cases)
CONTRACT = {
    "direct": [
        case("direct", "tf", "db"),
        case("direct", "tf", "rec", ranks=3),
        case("direct", "tf-pre", "db", ranks=3),
        case("direct", "feedline", "rec"),
        case("direct", "feedline", "db", ranks=3),
        case("direct", "tf", "db", mpi=2),
    ],
    "grouped": [
        case("grouped", "async", "rec", buffer=12),
        case("grouped", "async-db", "db", ranks=3, buffer=12),
        case("grouped", "async-db", "rec", ranks=3, buffer=12),
        case("grouped", "async-db", "rec", mpi=2, buffer=12),
    ],
    "store": [
        case("store", "deepio-ordered", "rec"),
        case("store", "deepio-opportunistic", "db"),
        case("store", "deepio-ordered", "db", memory_fraction=0.5),
        case("store", "deepio-ordered", "rec", mpi=2),
        case("store", "deepio-opportunistic", "db", mpi=2, memory_fraction=0.5),
    ],
    "lmdbio": [
        *(case("lmdbio", p, "db") for p in PRESETS if PRESET_SOURCES.get(p) == "lmdbio"),
        case("lmdbio", "lmdb", "rec", ranks=3),
        case("lmdbio", "lmm-dio-prov-coal", "db", ranks=3),
        case("lmdbio", "lmm", "db", mpi=2),
        case("lmdbio", "lmm-dm", "db", mpi=2),
        case("lmdbio", "lmm-dio", "db", mpi=2),
        case("lmdbio", "lmm-dio-prov-coal-stag", "db", mpi=2),
    ],
    # needs an MPI world (test_node_needs_an_mpi_world); each case in its own launch: a
    # rank that raises (NodeOutOfStepError, before the fix of issue 16) moves on to the
    # next case while its peer still waits in this one's node window
    "node": [
        case("node", "feedline", "rec", mpi=2, alone=True),
        case("node", "feedline", "db", mpi=2, alone=True),
        case("node", "feedline", "rec", mpi=2, nodes=2, alone=True),
        case("node", "tf", "db", mpi=2, alone=True),
    ],
    ToySource.name: [
        case(ToySource.name, "tf", "rec"),
        case(ToySource.name, "feedline", "db", ranks=3),
        case(ToySource.name, "tf", "rec", mpi=2),
    ],
}

#: storage damaged after the Loader was built: a typed error on every rank, no hang
DAMAGED = {
    "direct": [
        case("direct", "tf", "rec", damage="truncate"),
        case("direct", "feedline", "db", damage="remove"),
    ],
    "grouped": [
        case("grouped", "async-db", "rec", damage="truncate", buffer=12),
        case("grouped", "async", "db", damage="remove", buffer=12),
    ],
    "store": [
        case("store", "deepio-ordered", "db", damage="truncate"),
        case("store", "deepio-opportunistic", "rec", damage="remove", memory_fraction=0.5),
        case("store", "deepio-ordered", "db", mpi=2, damage="truncate"),
    ],
    "lmdbio": [
        case("lmdbio", "lmdb", "db", damage="truncate"),
        case("lmdbio", "lmm-dm", "db", damage="truncate"),
        case("lmdbio", "lmm-dio-prov-coal", "db", damage="remove"),
        case("lmdbio", "lmdb", "db", damage="remove"),
        case("lmdbio", "lmm-dio", "db", damage="remove"),
        case("lmdbio", "lmm", "db", mpi=2, damage="truncate"),
        case("lmdbio", "lmm-dm", "db", mpi=2, damage="remove"),
    ],
    "node": [
        case("node", "feedline", "rec", mpi=2, damage="truncate"),
        case("node", "feedline", "db", mpi=2, damage="remove"),
    ],
    ToySource.name: [
        case(ToySource.name, "tf", "rec", damage="truncate"),
        case(ToySource.name, "tf", "db", damage="remove"),
        case(ToySource.name, "tf", "rec", mpi=2, damage="remove"),
    ],
}


def params(table: dict, mpi: bool, alone: bool | None = None) -> list:
    """The cases of *table* (*alone*: only those launched alone, or only the others)."""
    out = []
    for name in [*NAMES, ToySource.name]:
        for c in table.get(name, []):
            if bool(c["mpi"]) != mpi or (alone is not None and c["alone"] != alone):
                continue
            marks = [pytest.mark.xfail(strict=True, reason=c["xfail"])] if c["xfail"] else []
            out.append(pytest.param(c, id=c["id"], marks=marks))
    return out


# ------------------------------------------------------------------ data
def write_db(path: str, n: int) -> None:
    """n records of 1..6000 bytes (inline and overflow pages) under 8-byte keys."""
    rng = np.random.default_rng(3)
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(n):
            size = int(rng.integers(1, 6000))
            txn.put(b"%08d" % i, rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    env.close()


REC_OPEN = {"format": "records", "record_bytes": REC_SIZE, "label_bytes": 0, "header_bytes": 0}


def spec(root: str, kind: str) -> dict:
    """What the script needs to open a dataset kind at *root*."""
    if kind == "rec":
        files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".bin"))
        return {"data": files, "open": REC_OPEN}
    return {"data": root, "open": {}}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("conformance")
    write_records(str(root / "rec"), REC_N, REC_SIZE, files=3)
    write_db(str(root / "db"), DB_N)
    return {"rec": str(root / "rec"), "db": str(root / "db")}


@pytest.fixture(scope="module")
def opened(pristine) -> dict:
    return {k: open_dataset(**_open_kw(spec(v, k))) for k, v in pristine.items()}


def _open_kw(s: dict) -> dict:
    return {"path_or_paths": s["data"], "sidecar": False, **s["open"]}


def launch(tmp, name: str, cases: list[dict], pristine: dict, ranks: int) -> dict:
    """Run *cases* with the script (under ``mpiexec -n ranks`` when ranks > 1); damaged
    cases each get their own copy of the data."""
    items = []
    for k, c in enumerate(cases):
        root = pristine[c["data"]]
        if "damage" in c["options"]:
            root = os.path.join(tmp, f"{name}-{k}")
            shutil.copytree(pristine[c["data"]], root)
        opts = {key: v for key, v in c["options"].items() if key != "damage"}
        items.append(
            {
                "id": c["id"],
                "check": "error" if "damage" in c["options"] else "contract",
                "source": c["source"],
                "preset": c["preset"],
                "batch": B,
                "ranks": c["ranks"],
                "options": opts,
                "damage": c["options"].get("damage"),
                **spec(root, c["data"]),
            }
        )
    cases_path, out = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}-out.json")
    with open(cases_path, "w") as f:
        json.dump(items, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "HYDRA"))}
    env.update(FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1")
    env.pop("FEEDLINE_NODES", None)
    cmd = [sys.executable, SCRIPT, out, cases_path]
    if ranks > 1:
        from feedline_tools.bench.harness import mpiexec_command

        cmd = [mpiexec_command(), "-n", str(ranks), *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=HERE)
    # after a rank failed, feedline may end the job with MPI_Abort at exit rather than
    # hang in MPI_Finalize (docs/reliability.md): the results file is what counts
    assert os.path.exists(out), f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    with open(out) as f:
        res = json.load(f)
    assert sorted(res) == sorted(c["id"] for c in cases), proc.stderr[-4000:]
    if not any("damage" in c["options"] for c in cases):
        assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-4000:]}"
    return res


def _all(table: dict, mpi: bool, alone: bool | None = None) -> list[dict]:
    return [p.values[0] for p in params(table, mpi, alone)]


@pytest.fixture(scope="module")
def mpi_contract(pristine, tmp_path_factory) -> dict:
    """The MPI contract cases not launched alone, in one launch."""
    cases = _all(CONTRACT, True, alone=False)
    return launch(str(tmp_path_factory.mktemp("mc")), "contract", cases, pristine, 2)


@pytest.fixture(scope="module")
def damaged_one(pristine, tmp_path_factory) -> dict:
    return launch(str(tmp_path_factory.mktemp("d1")), "damaged", _all(DAMAGED, False), pristine, 1)


@pytest.fixture(scope="module")
def damaged_mpi(pristine, tmp_path_factory) -> dict:
    return launch(str(tmp_path_factory.mktemp("dm")), "damaged", _all(DAMAGED, True), pristine, 2)


def _ok(res: dict) -> None:
    assert res["ok"], res["error"] + "\n" + res.get("trace", "")


# ------------------------------------------------------------------ the table
def test_source_table_names_every_shipped_source():
    shipped = {n: c for n, c in SOURCES.items() if c.__module__.startswith("feedline.")}
    assert sorted(shipped) == sorted(SOURCE_MODULES)
    for name, cls in shipped.items():
        assert cls.name == name
        assert cls.__module__ == SOURCE_MODULES[name], name


def test_every_preset_runs_on_a_registered_source():
    for preset in PRESETS:
        assert source_name_for(preset) in SOURCES, preset
    assert set(PRESET_SOURCES) <= set(PRESETS), "a source registers an unknown preset"
    with pytest.raises(ConfigError, match="unknown source"):
        source_name_for("tf", "no-such-source")


def test_every_source_has_cases():
    assert sorted(CONTRACT) == sorted([*NAMES, ToySource.name])
    assert sorted(DAMAGED) == sorted([*NAMES, ToySource.name])


# ------------------------------------------------------------------ the contract
@pytest.mark.timeout(120)
@pytest.mark.parametrize("c", params(CONTRACT, mpi=False))
def test_contract(c, opened):
    source = ToySource if c["source"] == TOY else c["source"]
    report = check_source(
        source,
        opened[c["data"]],
        batch_size=B,
        preset=c["preset"],
        ranks=c["ranks"],
        **c["options"],
    )
    n = REC_N if c["data"] == "rec" else DB_N
    assert report["samples"] == [n, n] and report["ranks"] == c["ranks"]
    assert report["stats"]["source"] == (ToySource.name if source is ToySource else source)


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("c", params(CONTRACT, mpi=True))
def test_contract_mpi(c, pristine, tmp_path, request):
    if c["alone"]:
        res = launch(str(tmp_path), "contract", [c], pristine, 2)[c["id"]]
    else:
        res = request.getfixturevalue("mpi_contract")[c["id"]]
    _ok(res)
    assert res["report"]["ranks"] == 2
    name = ToySource.name if c["source"] == TOY else c["source"]
    assert res["report"]["stats"]["source"] == name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("c", params(DAMAGED, mpi=False))
def test_damaged_storage_raises_typed(c, damaged_one):
    _ok(damaged_one[c["id"]])


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("c", params(DAMAGED, mpi=True))
def test_damaged_storage_raises_typed_mpi(c, damaged_mpi):
    res = damaged_mpi[c["id"]]
    _ok(res)
    assert len(res["raised"]) == 2


def test_node_needs_an_mpi_world(opened):
    with pytest.raises(ConfigError, match="needs an MPI world"):
        Loader(opened["rec"], B, source="node")
    with pytest.raises(ConfigError, match="needs an MPI world"):
        check_source("node", opened["rec"], batch_size=B)


# ------------------------------------------------------------------ the checks have teeth
class _Repeat(ToySource):
    name = "toy-repeats-step-0"

    def get(self, step):
        return super().get(0 if step == 1 else step)


class _FlipByte(ToySource):
    name = "toy-flips-a-byte"

    def get(self, step):
        raw = super().get(step)
        if step == 2 and len(raw.data):
            raw.data[-1] ^= 0xFF
        return raw


class _ShortLength(ToySource):
    name = "toy-short-length"

    def get(self, step):
        raw = super().get(step)
        if step == 3 and len(raw.ids):
            raw = RawBatch(raw.ids, raw.data[:-1], raw.lengths.copy())
            raw.lengths[-1] -= 1
        return raw


class _Sorted(ToySource):
    name = "toy-sorts-its-batch"

    def get(self, step):
        raw = super().get(step)
        order = np.argsort(raw.ids, kind="stable")
        ends = np.cumsum(raw.lengths)
        recs = [raw.data[e - n : e] for e, n in zip(ends, raw.lengths, strict=True)]
        data = np.concatenate([recs[k] for k in order]) if len(order) else raw.data
        return RawBatch(raw.ids[order], data, raw.lengths[order])


class _ForgetsFirstStep(ToySource):
    """Cuts step s out of ``plan.order()`` at s·B, forgetting that a resumed plan's order
    starts at its first step (right at one rank until a resume)."""

    name = "toy-forgets-first-step"

    def get(self, step):
        return self._read(self._plan.order()[step * B : (step + 1) * B])


class _CloseTwiceFails(ToySource):
    name = "toy-close-twice-fails"

    def close(self):
        if getattr(self, "_closed", False):
            raise RuntimeError("already closed")
        self._closed = True


class _RawOSError(ToySource):
    name = "toy-raw-oserror"

    def get(self, step):
        for i in self._plan.samples(self.ctx.rank, step):
            fid, off, ln = self.ctx.dataset.index.extent(int(i))
            with open(self.ctx.dataset.files[fid], "rb") as f:  # raw FileNotFoundError
                f.seek(off)
                f.read(ln)
        return super().get(step)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("broken", "ranks", "match"),
    [
        (_Repeat, 1, "more than once"),
        (_Repeat, 3, "never delivered"),
        (_FlipByte, 1, "wrong bytes"),
        (_ShortLength, 1, "has length"),
        (_Sorted, 3, "not the plan's"),
        (_ForgetsFirstStep, 1, "after resume"),
        (_CloseTwiceFails, 1, "second Source.close"),
    ],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_check_source_catches_a_broken_source(opened, broken, ranks, match):
    with pytest.raises(AssertionError, match=match):
        check_source(broken, opened["db"], batch_size=B, preset="tf", ranks=ranks)
    assert broken.name not in SOURCES  # registered for the check only


@pytest.mark.timeout(120)
def test_check_storage_error_catches_an_untyped_error(pristine, tmp_path):
    shutil.copytree(pristine["rec"], tmp_path / "rec")
    ds = open_dataset(**_open_kw(spec(str(tmp_path / "rec"), "rec")))
    with pytest.raises(AssertionError, match=r"untyped builtins\.FileNotFoundError"):
        check_storage_error(_RawOSError, ds, batch_size=B, preset="tf", damage="remove")


def test_a_name_taken_by_another_class_is_refused(opened):
    class Impostor(ToySource):
        name = "direct"

    with pytest.raises(ValueError, match=r"taken by feedline\.sources\.direct"):
        check_source(Impostor, opened["rec"], batch_size=B)
    assert SOURCES["direct"].__name__ == "DirectSource"
