"""Shared fixtures. ``--full`` selects the full tier (tests marked ``full``); without it
those tests are deselected, not skipped, so a default run never counts them."""

from __future__ import annotations


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
