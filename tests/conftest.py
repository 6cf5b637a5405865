# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. ``--full`` selects the full tier (tests marked ``full``); without it
those tests are deselected, not skipped, so a default run never counts them."""

from __future__ import annotations

import os
import tempfile

# Saved storage profiles (`feedline probe`) and sidecars of read-only datasets live in the
# cache dir: the suite uses its own, so what a user probed on this machine cannot change
# which plan a test's Loader chooses (mpiexec children inherit the variable).
os.environ.setdefault("FEEDLINE_CACHE_DIR", tempfile.mkdtemp(prefix="feedline-test-cache-"))


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="run the full tier as well")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("full") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
