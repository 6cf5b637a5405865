# SPDX-License-Identifier: Apache-2.0
"""The package's face: one version (pyproject.toml's, read back from the installed
distribution) and every error class exported at the top."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

import pytest

import feedline
from feedline import _core, errors


def test_version_is_the_distributions():
    assert feedline.__version__ == importlib.metadata.version("feedline")


def test_version_is_pyprojects():
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.exists():  # pragma: no cover - tests run outside the source tree
        pytest.skip("no pyproject.toml beside the tests")
    with pyproject.open("rb") as f:
        assert feedline.__version__ == tomllib.load(f)["project"]["version"]


def test_native_core_has_the_same_version():
    assert _core.__version__ == feedline.__version__


def test_every_error_is_exported_at_the_top():
    missing = [n for n in errors.__all__ if n not in feedline.__all__]
    assert missing == []
    assert all(getattr(feedline, n) is getattr(errors, n) for n in errors.__all__)
