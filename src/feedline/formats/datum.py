# SPDX-License-Identifier: Apache-2.0
"""Caffe ``Datum`` records (the values of Caffe's LMDB/LevelDB datasets) into arrays.

A Datum is a small protobuf: ``channels``, ``height``, ``width``, ``data`` (raw pixels,
CxHxW uint8), ``label`` (int32), ``float_data`` (repeated float) and ``encoded`` (the
``data`` bytes are a JPEG/PNG). A batch is decoded natively in one call — the wire
format is parsed and validated without a protobuf object per sample and the pixels are
copied straight into the batch array — while encoded Datums, reported back by the
native call, are decoded with Pillow. The batch's shape is fixed (from the first record
of the dataset, or given), so a Datum of another shape is an error, not a ragged batch.
"""

from __future__ import annotations

import io
import os
from typing import Literal

import numpy as np

from .. import _core
from ..errors import ConfigError, CorruptDataError, StorageError
from ..index import Index
from .base import Decoder

ChannelOrder = Literal["rgb", "bgr"]


def parse_datum(record, name: str = "<record>"):
    """Parse one Datum (bytes-like) and return its fields.

    Returns
    -------
    object with ``channels``, ``height``, ``width``, ``label``, ``encoded``,
    ``data_offset``, ``data_size`` and ``float_count``.

    Raises
    ------
    CorruptDataError
        Naming *name* and the byte offset within the record.
    """
    return _core.parse_datum(np.frombuffer(memoryview(record).cast("B"), dtype=np.uint8), name)


def decode_image(buf, channels: int | None = None, order: ChannelOrder = "rgb") -> np.ndarray:
    """Decode JPEG/PNG bytes with Pillow into a ``(C, H, W)`` uint8 array.

    Grey images give C=1, colour images C=3 (RGB, or BGR as OpenCV-based Caffe
    produces); *channels* forces 1 or 3. Raises ValueError on undecodable bytes.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(buf))) as im:
            grey = channels == 1 or (channels is None and im.mode in ("1", "L", "I;16", "I", "F"))
            arr = np.asarray(im.convert("L" if grey else "RGB"), dtype=np.uint8)
    except Exception as e:  # Pillow raises many types on garbage; all mean "not an image"
        raise ValueError(f"cannot decode the encoded image: {type(e).__name__}: {e}") from None
    if arr.ndim == 2:
        return arr[None, :, :]
    if order == "bgr":
        arr = arr[:, :, ::-1]
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def _read_record(index: Index, i: int) -> bytes:
    path = index.files[int(index.file_ids[i])]
    off, n = int(index.offsets[i]), int(index.lengths[i])
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, n, off)
    except OSError as e:
        raise StorageError(path, off, e.errno or 0) from e
    finally:
        os.close(fd)
    if len(data) != n:
        raise CorruptDataError(path, off + len(data), "file shorter than its index")
    return data


class DatumDecoder(Decoder):
    """Decoder of Caffe Datum records: ``(b, C, H, W)`` uint8 (or float32 for
    ``float_data`` Datums) and int64 labels decoded from the records.

    Parameters
    ----------
    index : Index
        The dataset's index; its first record fixes the sample shape when
        *sample_shape* is not given, and errors name the file and offset of a bad sample.
    sample_shape : tuple of int, optional
        ``(C, H, W)`` of every sample.
    order : {"rgb", "bgr"}
        Channel order of decoded *encoded* (JPEG/PNG) Datums. Raw Datums are copied as
        stored (Caffe's ``convert_imageset`` stores BGR); choose ``"bgr"`` to match.
    floats : bool, optional
        Decode ``float_data`` into float32 instead of ``data`` into uint8; inferred from
        the first record when not given.
    """

    def __init__(
        self,
        index: Index,
        sample_shape: tuple[int, int, int] | None = None,
        *,
        order: ChannelOrder = "rgb",
        floats: bool | None = None,
    ) -> None:
        if order not in ("rgb", "bgr"):
            raise ConfigError(f"order must be 'rgb' or 'bgr', not {order!r}")
        self.index = index
        self.order: ChannelOrder = order
        self.floats = bool(floats)
        if sample_shape is None and len(index):
            sample_shape, inferred_floats = self._infer(index)
            if floats is None:
                self.floats = inferred_floats
        if sample_shape is not None:
            if len(sample_shape) != 3 or any(int(s) < 0 for s in sample_shape):
                raise ConfigError(f"sample_shape must be (C, H, W), not {sample_shape!r}")
            self.sample_shape = tuple(int(s) for s in sample_shape)
        self.dtype = np.dtype(np.float32 if self.floats else np.uint8)

    def _infer(self, index: Index) -> tuple[tuple[int, int, int], bool]:
        rec = _read_record(index, 0)
        path, off = index.files[int(index.file_ids[0])], int(index.offsets[0])
        try:
            d = parse_datum(rec, path)
        except CorruptDataError as e:
            raise CorruptDataError(path, off + e.offset, f"sample 0: {e.reason}") from None
        if d.encoded:
            img = rec[d.data_offset : d.data_offset + d.data_size]
            try:
                c, h, w = decode_image(img, None, self.order).shape
            except ValueError as e:
                raise CorruptDataError(path, off + d.data_offset, f"sample 0: {e}") from None
            return (c, h, w), False
        floats = d.data_size == 0 and d.float_count > 0
        return (int(d.channels), int(d.height), int(d.width)), floats

    def _where(self, ids: np.ndarray, k: int, offset: int) -> tuple[str, int, str]:
        idx = self.index
        if 0 <= k < len(ids) and 0 <= int(ids[k]) < len(idx):
            i = int(ids[k])
            return idx.files[int(idx.file_ids[i])], int(idx.offsets[i]) + offset, f"sample {i}"
        return "<batch>", offset, f"batch position {k}"

    def decode(self, raw, lengths, ids, out=None):
        if self.sample_shape is None:
            raise ConfigError("DatumDecoder of an empty dataset needs sample_shape=(C, H, W)")
        c, h, w = self.sample_shape
        b = len(lengths)
        ids = np.asarray(ids, dtype=np.int64)
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        if out is None or not out.flags.c_contiguous or out.dtype != self.dtype:
            target = np.empty((b, c, h, w), dtype=self.dtype)
        else:
            target = out
        flat = target.reshape(b, c * h * w).view(np.uint8)
        labels = np.empty(b, dtype=np.int64)
        encoded = np.zeros(b, dtype=np.uint8)
        eoff = np.zeros(b, dtype=np.int64)
        elen = np.zeros(b, dtype=np.int64)
        fault = _core.decode_datum_batch(
            raw, lengths, flat, labels, encoded, eoff, elen, c, h, w, self.floats
        )
        if fault is not None:
            k, offset, reason = fault
            path, where, who = self._where(ids, k, offset)
            raise CorruptDataError(path, where, f"{who}: {reason}")
        for k in np.flatnonzero(encoded):
            start, n = int(eoff[k]), int(elen[k])
            path, where, who = self._where(ids, int(k), start - int(lengths[:k].sum()))
            if self.floats:
                raise CorruptDataError(path, where, f"{who}: encoded image in a float_data dataset")
            try:
                img = decode_image(raw[start : start + n], c, self.order)
            except ValueError as e:
                raise CorruptDataError(path, where, f"{who}: {e}") from None
            if img.shape != (c, h, w):
                raise CorruptDataError(
                    path,
                    where,
                    f"{who}: decoded image of shape {img.shape} differs from the "
                    f"batch's {(c, h, w)} (resize the images when writing the dataset)",
                )
            target[k] = img
        if out is not None and target is not out:
            out[...] = target
            target = out
        return target, labels
