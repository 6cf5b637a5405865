# SPDX-License-Identifier: Apache-2.0
"""Quick coverage-guided fuzzing of every parser of untrusted bytes (``dev/fuzz``, a few
seconds per target): the six libFuzzer targets of the native core under ASan + UBSan
and the five atheris targets of the Python parsers. Skips only when clang's libFuzzer is
absent (``dev/setup --test`` installs it). The full run (10 M executions per C++ target)
is ``nice -n 19 dev/fuzz --full``; its figures are in docs/reliability.md."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPP = (
    "fuzz_lmdb_index",
    "fuzz_lmdb_pages",
    "fuzz_tfrecord",
    "fuzz_datum",
    "fuzz_unpack_chunk",
    "fuzz_gzip_tfrecord",
)
PY = ("py_npy", "py_sidecar", "py_state", "py_hdf5", "py_records")


def _libfuzzer() -> bool:
    cxx = shutil.which(os.environ.get("CXX", "clang++"))
    if cxx is None or "clang" not in os.path.basename(os.path.realpath(cxx)) + cxx:
        return False
    probe = subprocess.run(
        [cxx, "-fsanitize=fuzzer", "-x", "c++", "-", "-o", os.devnull],
        input="extern \"C\" int LLVMFuzzerTestOneInput(const char*, unsigned long){return 0;}",
        capture_output=True, text=True,
    )  # fmt: skip
    return probe.returncode == 0


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    if not _libfuzzer():
        pytest.skip("clang with libFuzzer not installed (dev/setup --test installs it)")
    return str(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("targets", [CPP, PY], ids=["cpp", "python"])
def test_quick_fuzz_finds_nothing(fuzz_dir, targets):
    env = dict(os.environ, FEEDLINE_FUZZ_DIR=os.path.join(ROOT, "build", "fuzz"))
    env.setdefault("CXX", "clang++")
    proc = subprocess.run(
        [os.path.join(ROOT, "dev", "fuzz"), "--seconds", "3", *targets],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    rows = [line.split() for line in proc.stdout.splitlines()[1:] if line.strip()]
    assert [r[0] for r in rows] == list(targets)
    for name, execs, _secs, crashes in rows:
        assert int(execs) > 0, f"{name} ran no inputs"
        assert crashes == "0", name
