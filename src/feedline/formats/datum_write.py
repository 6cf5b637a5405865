# SPDX-License-Identifier: Apache-2.0
"""Encode Caffe ``Datum`` records exactly as Caffe serialises them.

Caffe's ``Datum`` (proto2)::

    optional int32 channels = 1;   optional int32 height = 2;   optional int32 width = 3;
    optional bytes data = 4;       optional int32 label = 5;
    repeated float float_data = 6; optional bool encoded = 7 [default = false];

Protobuf writes the fields that are *set*, in field-number order. Which fields Caffe
sets depends on the tool, and this encoder mirrors it so generated LMDBs have the record
sizes and bytes of real ones:

- ``convert_imageset`` (raw pixels, ``CVMatToDatum``): 1, 2, 3, 4, 5 and ``encoded=0``
  (7 is explicitly set to false, so it *is* written) -> ``encode_datum(c, h, w, data, label)``.
- ``convert_imageset --encoded`` (``ReadFileToDatum``): only 4, 5 and ``encoded=1``;
  channels/height/width are never set -> ``encode_datum(0, 0, 0, jpeg, label, encoded=True)``.
- ``convert_cifar_data``: 1-5, no field 7 -> ``encoded=None``.

``float_data`` is a proto2 ``repeated float`` without ``[packed=true]``, so Caffe writes
one tag + 4 bytes per value; ``packed=True`` writes the packed form (which every protobuf
parser also accepts). Labels are int32: negative ones are sign-extended to 64 bits and
take 10 varint bytes, as protobuf requires.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1

# Wire types: 0 varint, 2 length-delimited, 5 fixed32.
_TAG_CHANNELS = b"\x08"  # 1 << 3 | 0
_TAG_HEIGHT = b"\x10"  # 2 << 3 | 0
_TAG_WIDTH = b"\x18"  # 3 << 3 | 0
_TAG_DATA = b"\x22"  # 4 << 3 | 2
_TAG_LABEL = b"\x28"  # 5 << 3 | 0
_TAG_FLOAT = b"\x35"  # 6 << 3 | 5 (one value)
_TAG_FLOAT_PACKED = b"\x32"  # 6 << 3 | 2
_TAG_ENCODED = b"\x38"  # 7 << 3 | 0


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int below 2**64."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def int32_varint(value: int) -> bytes:
    """Varint of an int32 field: negatives are sign-extended to 64 bits (10 bytes)."""
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{value} does not fit in int32")
    return varint(value & 0xFFFFFFFFFFFFFFFF if value < 0 else value)


def _dim(name: str, value: int) -> int:
    value = int(value)
    if not 0 <= value <= _INT32_MAX:
        raise ValueError(f"Datum {name} must be in [0, 2**31), got {value}")
    return value


def encode_datum(
    channels: int,
    height: int,
    width: int,
    data: bytes | bytearray | memoryview | np.ndarray = b"",
    label: int = 0,
    float_data: Sequence[float] | np.ndarray | None = None,
    encoded: bool | None = False,
    *,
    packed: bool = False,
) -> bytes:
    """Serialise one Caffe ``Datum``.

    Parameters
    ----------
    channels, height, width : int
        Written when non-zero (Caffe leaves them unset in encoded Datums: pass 0).
    data : bytes-like or uint8 ndarray
        Pixels in CxHxW order, or the encoded image when *encoded*. Written when
        non-empty, or when there is no *float_data* (an image Datum always has data).
    label : int
        int32 class label; always written, as Caffe always sets it.
    float_data : sequence of float, optional
        Written as ``repeated float`` (field 6), as float32.
    encoded : bool or None
        Field 7. ``False`` (Caffe's ``convert_imageset`` default) writes ``encoded: 0``;
        ``None`` leaves the field out (``convert_cifar_data``).
    packed : bool
        Write *float_data* packed (one length-delimited field) instead of Caffe's
        one-tag-per-value form.

    Returns
    -------
    bytes

    Raises
    ------
    ValueError
        When a field is out of range, or unencoded pixel data does not hold
        channelsxheightxwidth bytes.
    """
    channels = _dim("channels", channels)
    height = _dim("height", height)
    width = _dim("width", width)
    payload = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    n_pixels = channels * height * width
    if not encoded and payload and n_pixels and len(payload) != n_pixels:
        raise ValueError(
            f"Datum data has {len(payload)} bytes but channels*height*width = {n_pixels}"
        )
    floats = None if float_data is None else np.asarray(float_data, dtype="<f4").ravel()
    if floats is not None and n_pixels and floats.size not in (0, n_pixels):
        raise ValueError(
            f"Datum float_data has {floats.size} values but channels*height*width = {n_pixels}"
        )
    parts: list[bytes] = []
    if channels:
        parts += [_TAG_CHANNELS, varint(channels)]
    if height:
        parts += [_TAG_HEIGHT, varint(height)]
    if width:
        parts += [_TAG_WIDTH, varint(width)]
    if payload or floats is None:
        parts += [_TAG_DATA, varint(len(payload)), payload]
    parts += [_TAG_LABEL, int32_varint(int(label))]
    if floats is not None and floats.size:
        if packed:
            parts += [_TAG_FLOAT_PACKED, varint(4 * floats.size), floats.tobytes()]
        else:
            # one tag per value: interleave the tag byte with each 4-byte float
            rec = np.empty((floats.size, 5), dtype=np.uint8)
            rec[:, 0] = _TAG_FLOAT[0]
            rec[:, 1:] = floats.view(np.uint8).reshape(-1, 4)
            parts.append(rec.tobytes())
    if encoded is not None:
        parts += [_TAG_ENCODED, b"\x01" if encoded else b"\x00"]
    return b"".join(parts)


def datum_prefix(channels: int, height: int, width: int) -> bytes:
    """The bytes before the pixels of a raw ``convert_imageset`` Datum.

    ``datum_prefix(c, h, w) + pixels + label_suffix(label)`` equals
    ``encode_datum(c, h, w, pixels, label)``; generators use it to build many
    same-shape records without re-encoding the header.
    """
    head = b""
    for tag, name, value in (
        (_TAG_CHANNELS, "channels", channels),
        (_TAG_HEIGHT, "height", height),
        (_TAG_WIDTH, "width", width),
    ):
        if _dim(name, value):
            head += tag + varint(int(value))
    return head + _TAG_DATA + varint(int(channels) * int(height) * int(width))


def label_suffix(label: int, encoded: bool | None = False) -> bytes:
    """The bytes after the pixels of a raw Datum: label and (optionally) ``encoded``."""
    tail = _TAG_LABEL + int32_varint(int(label))
    if encoded is not None:
        tail += _TAG_ENCODED + (b"\x01" if encoded else b"\x00")
    return tail


__all__ = ["datum_prefix", "encode_datum", "int32_varint", "label_suffix", "varint"]
