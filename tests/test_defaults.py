# SPDX-License-Identifier: Apache-2.0
"""feedline.defaults: the one reader of FEEDLINE_* variables, with set() and a context
manager (docs/loader.md, "Defaults")."""

from __future__ import annotations

import pathlib
import re

import pytest

from feedline import defaults
from feedline.errors import ConfigError

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"


def test_set_overrides_the_environment_and_the_block_restores_it(monkeypatch):
    monkeypatch.setenv("FEEDLINE_IO_THREADS", "6")
    assert defaults.get("io_threads") == 6
    assert defaults.origin("io_threads") == "environment"
    with defaults.set(io_threads=8, memory_cap="1GiB"):
        assert defaults.get("io_threads") == 8
        assert defaults.get("memory_cap") == 1 << 30
        assert defaults.origin("io_threads") == "set"
        with defaults.set({"io_threads": "3"}):
            assert defaults.get("io_threads") == 3
        assert defaults.get("io_threads") == 8
    assert defaults.get("io_threads") == 6
    monkeypatch.delenv("FEEDLINE_IO_THREADS")
    assert defaults.origin("io_threads") == "default"
    assert defaults.get("io_threads") == defaults.KNOBS["io_threads"].default


def test_set_without_a_block_lasts_until_reset():
    try:
        defaults.set(prefetch_depth=3)
        assert defaults.get("prefetch_depth") == 3
    finally:
        defaults.reset()
    assert defaults.origin("prefetch_depth") == "default"


@pytest.mark.parametrize(
    ("knob", "value"),
    [("io_threads", 1.5), ("io_threads", "many"), ("io_threads", True), ("memory_cap", "lots")],
)
def test_bad_values_are_config_errors_naming_the_knob(knob, value):
    with pytest.raises(ConfigError, match=knob):
        defaults.set(**{knob: value})
    assert defaults.origin(knob) == "default"


def test_unknown_knob_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"known:.*io_threads"):
        defaults.get("io_thread")
    with pytest.raises(ConfigError, match="unknown"):
        defaults.set(io_thread=2)


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FEEDLINE_POLL_SLEEP_US", "soon")
    with pytest.raises(ConfigError, match="FEEDLINE_POLL_SLEEP_US"):
        defaults.get("poll_sleep_us")


def test_only_defaults_reads_feedline_variables():
    """Every FEEDLINE_* variable is read through defaults.get (children's environments
    may still be written elsewhere)."""
    reads = re.compile(r"(environ\.get|getenv|environ\[)\(?\s*[\"']FEEDLINE_")
    offenders = [
        f"{p.relative_to(SRC)}:{i}"
        for p in SRC.rglob("*.py")
        if p.name != "defaults.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert offenders == []


def test_every_knob_is_documented_in_the_loader_page():
    doc = (SRC.parent / "docs" / "loader.md").read_text()
    missing = [n for n in defaults.KNOBS if f"FEEDLINE_{n.upper()}" not in doc]
    assert missing == []
