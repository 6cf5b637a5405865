# SPDX-License-Identifier: Apache-2.0
"""The package's shape (docs/architecture.md): the library a training job imports
carries no tool, and the tools live beside it."""

from __future__ import annotations

import subprocess
import sys

TOOLS = ("feedline_tools", "feedline.bench", "feedline.demo", "feedline.make")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_import_feedline_loads_no_tool():
    mods = _modules_after(
        "import feedline\nfrom feedline import Loader, open_dataset\nimport feedline.deepio"
    )
    assert "feedline.loader" in mods  # the probe sees what it imports
    loaded = sorted(m for m in mods if m.startswith(TOOLS))
    assert loaded == [], loaded
    # nor the tools' heavy dependencies
    assert not {"matplotlib", "jsonschema"} & mods


def test_tools_are_reached_through_the_feedline_command():
    from feedline.cli import COMMANDS

    for cmd in ("bench", "demo", "make", "emulate"):
        assert COMMANDS[cmd].startswith("feedline_tools."), cmd
    out = subprocess.run(
        [sys.executable, "-m", "feedline", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for cmd in ("bench", "demo", "make", "emulate", "plan", "inspect"):
        assert f"    {cmd} " in out, out


def test_mpi_and_launchers_live_in_dist():
    """Only dist/ imports mpi4py or reads launcher/scheduler variables."""
    import re
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "src" / "feedline"
    pat = re.compile(r"mpi4py|SLURM_|OMPI_|PMI_|PMIX_")
    hits = [
        f"{p.relative_to(pkg)}:{i}"
        for p in pkg.rglob("*.py")
        if "dist" not in p.relative_to(pkg).parts[:1]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pat.search(line)
    ]
    assert hits == []


def test_no_module_is_over_800_lines():
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    big = {
        str(p.relative_to(src)): n
        for p in src.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 800
    }
    assert big == {}
