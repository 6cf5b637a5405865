# SPDX-License-Identifier: Apache-2.0
"""Loader state: a few hundred bytes of JSON that resume an epoch exactly.

Plans are pure, so the position in an epoch is fully described by (dataset
fingerprint, strategy, seed, epoch, batch size, steps consumed) plus the world sizes the
epoch ran at: when a job is resumed at another world size, the rest of the epoch is
re-cut for the new world (``Plan.resume``), and a later checkpoint must replay those
re-cuts, so the state keeps the short *chain* of ``[ranks, nodes, step]`` at which the
world changed within the epoch. A SHA-256 checksum over the canonical JSON catches
damage and hand edits; anything that does not match the loader raises StateError.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import StateError, StateMismatchError

KIND = "feedline.loader"
VERSION = 1
MAX_BYTES = 4096
MAX_CHAIN = 64
#: strategy knobs that shape the epoch order; a resumed loader must agree on them
ORDER_KNOBS = (
    "assignment",
    "chunk",
    "chunk_layout",
    "region",
    "memory_fraction",
    "circular",
    "rl_floor",
    "chunk_bytes",
    "window_steps",
)


def _digest(body: dict[str, Any]) -> str:
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def seal(body: dict[str, Any]) -> dict[str, Any]:
    """*body* plus ``kind``, ``version`` and its ``checksum``; checks the 4 KB budget."""
    body = {"kind": KIND, "version": VERSION, **body}
    if len(body.get("chain", ())) > MAX_CHAIN:
        body["chain"] = body["chain"][-MAX_CHAIN:]  # pragma: no cover - absurd resume counts
    out = {**body, "checksum": _digest(body)}
    size = len(json.dumps(out, separators=(",", ":")))
    if size > MAX_BYTES:  # pragma: no cover - guarded by the fields' sizes
        raise StateError(f"loader state of {size} bytes exceeds {MAX_BYTES}")
    return out


def open_state(state: Any) -> dict[str, Any]:
    """Validate a sealed state (a dict, or its JSON text) and return its body."""
    if isinstance(state, str | bytes):
        try:
            state = json.loads(state)
        except ValueError as e:
            raise StateError(f"loader state is not JSON: {e}") from None
    if not isinstance(state, dict):
        raise StateError(f"loader state must be a dict, not {type(state).__name__}")
    if state.get("kind") != KIND:
        raise StateError(f"not a feedline loader state (kind={state.get('kind')!r})")
    if state.get("version") != VERSION:
        raise StateError(
            f"loader state version {state.get('version')!r}; this feedline reads {VERSION}"
        )
    body = {k: v for k, v in state.items() if k != "checksum"}
    if state.get("checksum") != _digest(body):
        raise StateError("loader state is damaged (checksum mismatch)")
    for key, kind in (
        ("epoch", int),
        ("step", int),
        ("seed", int),
        ("batch_size", int),
        ("world_size", int),
        ("nodes", int),
        ("n", int),
        ("dataset", str),
        ("strategy", dict),
        ("chain", list),
        ("drop_last", bool),
        ("preset", str),
    ):
        if not isinstance(body.get(key), kind):
            raise StateError(f"loader state lacks a valid {key!r}")
    for link in body["chain"]:
        if not (
            isinstance(link, list) and len(link) == 3 and all(isinstance(x, int) for x in link)
        ):
            raise StateError(f"loader state has a malformed world chain entry {link!r}")
    if body["step"] < 0 or body["epoch"] < 0 or body["seed"] < 0 or body["n"] < 0:
        raise StateError("loader state has a negative epoch, step, seed or sample count")
    if body["world_size"] < 1 or not 1 <= body["nodes"] <= body["world_size"]:
        raise StateError(
            f"loader state has an impossible world ({body['world_size']} ranks on "
            f"{body['nodes']} nodes)"
        )
    if body["batch_size"] < 1:
        raise StateError(f"loader state has batch size {body['batch_size']}")
    if any(r < 1 or not 1 <= m <= r or not 0 <= s <= body["step"] for r, m, s in body["chain"]):
        raise StateError(
            "loader state's world chain names an impossible world or a step after its own"
        )
    return body


def check_compatible(
    body: dict[str, Any],
    *,
    fingerprint: str,
    n: int,
    batch_size: int,
    drop_last: bool,
    strategy: dict[str, Any],
) -> None:
    """Raise StateMismatchError when *body* belongs to another dataset, StateError when
    to another epoch order (batch size, drop_last, order knobs)."""
    if body["dataset"] != fingerprint or body["n"] != n:
        raise StateMismatchError(
            f"loader state belongs to another dataset (fingerprint {body['dataset']}, "
            f"{body['n']} samples; this one is {fingerprint}, {n} samples)"
        )
    if body["batch_size"] != batch_size:
        raise StateError(
            f"loader state was taken with global batch {body['batch_size']}, this loader uses "
            f"{batch_size}; steps would not line up (the global batch must stay the same)"
        )
    if body["drop_last"] != drop_last:
        raise StateError(f"loader state has drop_last={body['drop_last']}, this loader {drop_last}")
    theirs = body["strategy"]
    diff = [k for k in ORDER_KNOBS if theirs.get(k) != strategy.get(k)]
    if diff:
        raise StateError(
            "loader state was taken with another sample order: "
            + ", ".join(f"{k}={theirs.get(k)!r} (now {strategy.get(k)!r})" for k in diff)
        )
