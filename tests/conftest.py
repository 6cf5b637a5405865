# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. ``--full`` selects the full tier (tests marked ``full``); without it
those tests are deselected, not skipped, so a default run never counts them."""

from __future__ import annotations

import os
import signal
import tempfile

# A shell starts a background job (`dev/test &`) with SIGINT ignored, and every process
# the suite starts would inherit that: the Ctrl-C tests would then fail. A handler set
# here becomes the default action in the children the suite execs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
