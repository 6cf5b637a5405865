# SPDX-License-Identifier: Apache-2.0
"""DatumDecoder: Caffe Datum records (raw, float_data, encoded PNG/JPEG) into batches.

Records are written with a few lines of protobuf wire code local to this file (an
independent oracle of the native parser), concatenated into a file, and described by
an Index, exactly as the LMDB indexer describes values inside data.mdb.
"""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
from PIL import Image

from feedline.errors import ConfigError, CorruptDataError
from feedline.formats.datum import DatumDecoder, decode_image, parse_datum
from feedline.index import Index


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    return _varint(num << 3 | wire) + payload


def datum(c=0, h=0, w=0, data=b"", label=0, floats=None, encoded=None, packed=False, extra=b""):
    out = b""
    for num, v in ((1, c), (2, h), (3, w)):
        if v:
            out += _field(num, 0, _varint(v))
    if data or floats is None:
        out += _field(4, 2, _varint(len(data)) + bytes(data))
    out += extra
    out += _field(5, 0, _varint(label))
    if floats is not None:
        f = np.asarray(floats, dtype="<f4")
        if packed:
            out += _field(6, 2, _varint(4 * f.size) + f.tobytes())
        else:
            out += b"".join(_field(6, 5, struct.pack("<f", x)) for x in f)
    if encoded is not None:
        out += _field(7, 0, _varint(int(encoded)))
    return out


def index_of(tmp_path, records, name="datums.bin", gap=3):
    """Write *records* to one file (with junk between them) and index them."""
    path = tmp_path / name
    offsets, blob = [], bytearray()
    for r in records:
        blob += b"\xee" * gap
        offsets.append(len(blob))
        blob += r
    path.write_bytes(bytes(blob))
    n = len(records)
    return Index(
        files=[str(path)],
        file_ids=np.zeros(n, np.int32),
        offsets=np.array(offsets, np.int64),
        lengths=np.array([len(r) for r in records], np.int64),
    )


def batch(records, ids=None):
    ids = np.arange(len(records)) if ids is None else np.asarray(ids)
    raw = np.frombuffer(b"".join(records[i] for i in ids), np.uint8)
    return raw, np.array([len(records[i]) for i in ids], np.int64), ids


def png(arr_hwc: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr_hwc).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def raw_set(tmp_path):
    rng = np.random.default_rng(0)
    px = rng.integers(0, 256, (9, 3, 4, 5), dtype=np.uint8)
    labels = np.array([0, 1, -1, 2**31 - 1, -(2**31), 5, 6, 7, 8])
    recs = [datum(3, 4, 5, px[i].tobytes(), int(labels[i]), encoded=False) for i in range(9)]
    return index_of(tmp_path, recs), recs, px, labels


def test_raw_batch(raw_set):
    idx, recs, px, labels = raw_set
    dec = DatumDecoder(idx)
    assert dec.sample_shape == (3, 4, 5) and dec.dtype == np.uint8
    raw, lengths, ids = batch(recs, [4, 0, 8, 2, 3])
    data, lab = dec.decode(raw, lengths, ids)
    np.testing.assert_array_equal(data, px[ids])
    np.testing.assert_array_equal(lab, labels[ids])
    assert lab.dtype == np.int64
    out = np.zeros((5, 3, 4, 5), np.uint8)
    got, _ = dec.decode(raw, lengths, ids, out=out)
    assert got is out
    np.testing.assert_array_equal(out, px[ids])
    # a non-contiguous out is filled too
    big = np.zeros((5, 3, 4, 10), np.uint8)
    got, _ = dec.decode(raw, lengths, ids, out=big[..., ::2])
    np.testing.assert_array_equal(big[..., ::2], px[ids])


def test_empty_batch_and_empty_index(raw_set, tmp_path):
    idx, _recs, _px, _ = raw_set
    data, lab = DatumDecoder(idx).decode(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0))
    assert data.shape == (0, 3, 4, 5) and lab.shape == (0,)
    empty = Index(files=[], file_ids=[], offsets=[], lengths=[])
    with pytest.raises(ConfigError):
        DatumDecoder(empty).decode(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0))
    assert DatumDecoder(empty, (1, 2, 2)).sample_shape == (1, 2, 2)


def test_float_data_packed_and_unpacked(tmp_path):
    rng = np.random.default_rng(1)
    vals = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    recs = [datum(2, 3, 3, floats=vals[i].ravel(), label=i, packed=i % 2 == 0) for i in range(4)]
    dec = DatumDecoder(index_of(tmp_path, recs))
    assert dec.dtype == np.float32 and dec.sample_shape == (2, 3, 3)
    data, lab = dec.decode(*batch(recs))
    np.testing.assert_array_equal(data, vals)
    np.testing.assert_array_equal(lab, np.arange(4))


def test_unknown_fields_are_skipped(tmp_path):
    rec = datum(
        1,
        2,
        2,
        b"\1\2\3\4",
        3,
        extra=_field(15, 2, _varint(2) + b"zz") + _field(16, 0, _varint(99)),
    )
    dec = DatumDecoder(index_of(tmp_path, [rec]))
    data, lab = dec.decode(*batch([rec]))
    np.testing.assert_array_equal(data.ravel(), [1, 2, 3, 4])
    assert lab[0] == 3


def test_encoded_png_rgb_bgr_and_grey(tmp_path):
    rng = np.random.default_rng(2)
    imgs = rng.integers(0, 256, (3, 6, 7, 3), dtype=np.uint8)  # H, W, C
    recs = [datum(data=png(imgs[i]), label=10 + i, encoded=True) for i in range(3)]
    idx = index_of(tmp_path, recs)
    dec = DatumDecoder(idx)
    assert dec.sample_shape == (3, 6, 7)
    data, lab = dec.decode(*batch(recs))
    np.testing.assert_array_equal(data, imgs.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(lab, [10, 11, 12])
    bgr, _ = DatumDecoder(idx, order="bgr").decode(*batch(recs))
    np.testing.assert_array_equal(bgr, imgs[..., ::-1].transpose(0, 3, 1, 2))
    grey = rng.integers(0, 256, (2, 5, 4), dtype=np.uint8)
    grecs = [datum(data=png(grey[i]), label=i, encoded=True) for i in range(2)]
    gdata, _ = DatumDecoder(index_of(tmp_path, grecs, "g.bin")).decode(*batch(grecs))
    np.testing.assert_array_equal(gdata, grey[:, None])


def test_encoded_jpeg_mixed_with_raw(tmp_path):
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:8, 0:8]
    img = np.stack([yy * 30, xx * 30, (yy + xx) * 15], axis=-1).astype(np.uint8)  # smooth
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    raw_px = rng.integers(0, 256, (3, 8, 8), dtype=np.uint8)
    recs = [datum(data=buf.getvalue(), label=1, encoded=True), datum(3, 8, 8, raw_px.tobytes(), 2)]
    dec = DatumDecoder(index_of(tmp_path, recs))
    data, lab = dec.decode(*batch(recs))
    np.testing.assert_array_equal(data[1], raw_px)
    # JPEG is lossy: close to the image, not equal
    assert np.abs(data[0].astype(int) - img.transpose(2, 0, 1)).mean() < 10
    np.testing.assert_array_equal(lab, [1, 2])


def test_shape_mismatch_names_file_sample_and_offset(tmp_path):
    recs = [datum(1, 2, 2, b"abcd", 0)] * 3 + [datum(1, 2, 3, b"abcdef", 0)]
    idx = index_of(tmp_path, recs)
    dec = DatumDecoder(idx)
    with pytest.raises(CorruptDataError, match=r"sample 3: shape \(1, 2, 3\)") as e:
        dec.decode(*batch(recs))
    assert e.value.path == idx.files[0]
    assert e.value.offset == idx.offsets[3]
    assert os.path.exists(e.value.path)


def test_data_size_must_match_shape(tmp_path):
    recs = [datum(1, 2, 2, b"abcd", 0), datum(1, 2, 2, b"abc", 0)]
    idx = index_of(tmp_path, recs)
    with pytest.raises(
        CorruptDataError, match=r"sample 1: .*data has 3 bytes, expected C\*H\*W = 4"
    ):
        DatumDecoder(idx).decode(*batch(recs))


def test_truncated_record_offset_within_file(tmp_path):
    good = datum(1, 2, 2, b"abcd", 7)
    recs = [good, b"\x08\x01\x22\x50abc"]  # data field claims 80 bytes it does not have
    idx = index_of(tmp_path, recs)
    with pytest.raises(CorruptDataError, match="sample 1: Datum: data length 80 exceeds") as e:
        DatumDecoder(idx).decode(*batch(recs))
    assert idx.offsets[1] <= e.value.offset < idx.offsets[1] + idx.lengths[1]


def test_bad_encoded_image(tmp_path):
    img = np.zeros((4, 4, 3), np.uint8)
    recs = [datum(data=png(img), encoded=True), datum(data=b"\x89PNG not really", encoded=True)]
    idx = index_of(tmp_path, recs)
    with pytest.raises(CorruptDataError, match="sample 1: cannot decode") as e:
        DatumDecoder(idx).decode(*batch(recs))
    assert e.value.offset > idx.offsets[1]
    recs2 = [recs[0], datum(data=png(np.zeros((5, 4, 3), np.uint8)), encoded=True)]
    with pytest.raises(CorruptDataError, match="differs from the batch"):
        DatumDecoder(index_of(tmp_path, recs2, "b2.bin")).decode(*batch(recs2))
    with pytest.raises(CorruptDataError, match="sample 0: cannot decode"):
        DatumDecoder(index_of(tmp_path, [recs[1]], "b3.bin"))


def test_first_record_corrupt(tmp_path):
    idx = index_of(tmp_path, [b"\x0a\x05abc"])
    with pytest.raises(CorruptDataError, match="sample 0") as e:
        DatumDecoder(idx)
    assert e.value.offset == idx.offsets[0]


@pytest.mark.timeout(120)
def test_garbage_never_crashes(tmp_path):
    rng = np.random.default_rng(4)
    good = datum(1, 2, 2, b"abcd", 1)
    idx = index_of(tmp_path, [good])
    dec = DatumDecoder(idx)
    outcomes = {"ok": 0, "corrupt": 0}
    for _ in range(3000):
        n = int(rng.integers(0, 40))
        g = bytearray(rng.bytes(n) if rng.random() < 0.5 else good[: min(n, len(good))])
        if g and rng.random() < 0.5:
            g[int(rng.integers(0, len(g)))] ^= 1 << int(rng.integers(0, 8))
        recs = [good, bytes(g)]
        try:
            data, _ = dec.decode(
                *batch(recs),
            )
            assert data.shape == (2, 1, 2, 2)
            outcomes["ok"] += 1
        except CorruptDataError as e:
            assert "batch position 1" in e.reason  # id 1 is not in the index
            outcomes["corrupt"] += 1
    assert outcomes["corrupt"] > 2000


def test_parse_datum_and_decode_image_helpers():
    d = parse_datum(datum(3, 2, 1, b"abcdef", -7, encoded=False))
    assert (d.channels, d.height, d.width, d.label, d.encoded, d.data_size) == (
        3,
        2,
        1,
        -7,
        False,
        6,
    )
    with pytest.raises(CorruptDataError, match=r"label .* outside int32"):
        parse_datum(_field(5, 0, _varint(1 << 40)), "x")
    img = decode_image(png(np.full((2, 3, 3), 9, np.uint8)), channels=1)
    assert img.shape == (1, 2, 3) and (img == 9).all()
    with pytest.raises(ValueError):
        decode_image(b"nope")
    with pytest.raises(ConfigError):
        DatumDecoder(Index(files=[], file_ids=[], offsets=[], lengths=[]), order="xyz")


def test_agrees_with_feedline_encoder(tmp_path):
    dw = pytest.importorskip("feedline.formats.datum_write")
    rng = np.random.default_rng(5)
    px = rng.integers(0, 256, (4, 3, 2, 2), dtype=np.uint8)
    recs = [dw.encode_datum(3, 2, 2, px[i], label=i - 2) for i in range(4)]
    for i in range(4):  # byte-identical to this file's independent encoder
        assert recs[i] == datum(3, 2, 2, px[i].tobytes(), i - 2, encoded=False)
    data, lab = DatumDecoder(index_of(tmp_path, recs)).decode(*batch(recs))
    np.testing.assert_array_equal(data, px)
    np.testing.assert_array_equal(lab, np.arange(4) - 2)
