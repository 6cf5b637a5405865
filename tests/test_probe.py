# SPDX-License-Identifier: Apache-2.0
"""``feedline probe``: a measured storage profile, saved per file system and used by the
planner; an emulator mount reports its own profile."""

from __future__ import annotations

import json
import os

import pytest

from feedline.cli import main
from feedline.errors import ConfigError
from feedline.io import probe
from feedline.plan.cost import StorageProfile, get_profile
from feedline_tools.emulate import Emulator, EmulatorParams, EmulatorUnavailable, check_available


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(d))
    return d


def test_probe_measures_saves_and_the_planner_uses_it(tmp_path, cache, capsys):
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "p.json"
    assert main(["probe", str(data), "--seconds", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "saved for this file system" in text
    doc = json.loads(out.read_text())
    m = doc["measured"]
    # every block size of the sweep was timed (small ones are fast), each a real rate
    assert set(m["stream_bw_by_block"]) <= {str(b) for b in probe.BLOCKS}
    assert str(4096) in m["stream_bw_by_block"] and all(
        v > 0 for v in m["stream_bw_by_block"].values()
    )
    assert m["aggregate_bw_by_streams"] and doc["latency_s"] > 0
    # the 256 MiB scratch file is too small for every measurement to read fresh bytes:
    # the last streams re-read (if the time budget let the sweep get that far)
    assert 0 <= m["reread_bytes"] < probe.SCRATCH_BYTES * 4
    if "16" in m["aggregate_bw_by_streams"]:
        assert m["reread_bytes"] > 0
    assert m["seconds"] < 4 * 3  # bounded (the budget is checked between stages)
    assert not [p for p in os.listdir(data) if p.startswith(".feedline-probe-")]  # scratch gone
    prof = get_profile(None, str(data))
    assert prof.name == "probed" and prof.source.startswith("feedline probe")
    assert prof.latency_s == pytest.approx(doc["latency_s"])
    # an explicit profile still wins over the saved one
    assert get_profile("parallel", str(data)).name == "parallel"


def test_each_measurement_reads_a_region_no_other_read():
    """The probe never times bytes it read itself (a host's cache would answer): the
    regions follow each other, 4 MiB aligned, until the file is used up; then they
    start again from the beginning and count as read twice."""
    MiB = 1 << 20
    f = probe._Fresh(64 * MiB)
    spans = [(f.take(n), n) for n in (MiB, 5 * MiB, 16 * MiB)]
    assert [o for o, _ in spans] == [0, 4 * MiB, 12 * MiB]
    assert f.reread == 0
    # 28 + 40 > 64: wraps; of the 40 MiB, the first 28 were read before
    assert f.take(40 * MiB) == 0 and f.reread == 28 * MiB
    assert f.take(100 * MiB) == 0 and f.reread == (28 + 40) * MiB  # clipped to the file


def test_probe_no_save_and_errors(tmp_path, cache, capsys):
    data = tmp_path / "d"
    data.mkdir()
    capsys.readouterr()
    assert main(["probe", str(data), "--seconds", "2", "--no-save", "--json", "-"]) == 0
    io = capsys.readouterr()
    assert json.loads(io.out)["name"] == "probed"  # --json -: the JSON alone on stdout
    assert "probed profile of" in io.err and not os.path.exists("-")
    assert not cache.exists() or not list(cache.rglob("*.json"))
    assert get_profile(None, str(data)).name != "probed"
    assert main(["probe", str(tmp_path / "missing")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        probe.measure(str(tmp_path / "missing"), 1)


def test_damaged_saved_profile_is_ignored(tmp_path, cache):
    data = tmp_path / "d"
    data.mkdir()
    probe.save_profile(str(data), {"name": "probed"})  # lacks the required fields
    assert get_profile(None, str(data)).name in ("local", "memory", "parallel")


def _emulator_ok() -> bool:
    try:
        check_available()
    except EmulatorUnavailable:
        return False
    return os.geteuid() == 0


@pytest.mark.fuse
@pytest.mark.skipif(not _emulator_ok(), reason="storage emulator unavailable")
def test_emulator_mount_reports_its_own_profile(tmp_path, cache, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(b"x" * 4096)
    params = EmulatorParams(latency_us=700, node_mbps=900, aggregate_mbps=1500, servers=3)
    with Emulator(src, tmp_path / "mnt", nodes=2, params=params) as emu:
        path = os.path.join(emu.node_template.replace("{node}", "1"), "f.bin")
        prof = get_profile(None, path)
        assert isinstance(prof, StorageProfile) and prof.name == "emulator"
        assert prof.latency_s == pytest.approx(700e-6)
        assert prof.node_bw == pytest.approx(900e6)
        assert prof.aggregate_bw == pytest.approx(1500e6)
        assert prof.shared_cache == "view"
        assert main(["probe", path, "--seconds", "1"]) == 0
        assert "emulator profile" in capsys.readouterr().out
    # the profile is kept per mount; a new mount at the same place has its own
    params = EmulatorParams(latency_us=250, node_mbps=400)
    with Emulator(src, tmp_path / "mnt", nodes=2, params=params) as emu:
        path = os.path.join(emu.node_template.replace("{node}", "0"), "f.bin")
        prof = get_profile(None, path)
        assert prof.latency_s == pytest.approx(250e-6) and prof.node_bw == pytest.approx(400e6)
