// SPDX-License-Identifier: Apache-2.0
// Caffe Datum parser: a hand-written protobuf wire-format reader for one small message.
// Decoding in bulk without libprotobuf avoids one message object per sample and lets a
// batch land directly in the caller's array; the cost is that every field is validated
// here (the wire format is hostile input once a file is corrupt).
#include <cstring>
#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>
#include <limits>

namespace feedline {
namespace {

// Dimensions above this are not images; refusing them keeps C*H*W far from overflow.
constexpr std::uint64_t kMaxDim = std::uint64_t{1} << 24;
constexpr std::uint64_t kMaxElems = std::uint64_t{1} << 40;

enum Wire : int {
  kVarint = 0,
  kFixed64 = 1,
  kLen = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5
};

struct Reader {
  const std::uint8_t* p = nullptr;
  std::size_t n = 0;
  std::size_t pos = 0;
  const std::string& name;

  [[noreturn]] void fail(std::size_t at, const std::string& why) const {
    throw CorruptData(name, at, "Datum: " + why);
  }

  std::uint64_t varint(const char* what) {
    const std::size_t start = pos;
    std::uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos >= n) fail(start, std::string("truncated varint (") + what + ")");
      const std::uint8_t b = p[pos++];
      if (shift == 63 && (b & 0x7e))
        fail(start, std::string("varint overflows 64 bits (") + what + ")");
      v |= std::uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
    fail(start, std::string("varint longer than 10 bytes (") + what + ")");
  }

  // Bounds-checked length of a length-delimited field; leaves pos at its first byte.
  std::uint64_t length(const char* what) {
    const std::size_t start = pos;
    const std::uint64_t len = varint(what);
    if (len > n - pos)
      fail(start, std::string(what) + " length " + std::to_string(len) + " exceeds the " +
                      std::to_string(n - pos) + " bytes left in the record");
    return len;
  }

  void skip(std::size_t bytes, const char* what) {
    if (bytes > n - pos) fail(pos, std::string("truncated ") + what);
    pos += bytes;
  }
};

const char* wire_name(int w) {
  switch (w) {
    case kVarint: return "varint";
    case kFixed64: return "fixed64";
    case kLen: return "length-delimited";
    case kStartGroup: return "start-group";
    case kEndGroup: return "end-group";
    case kFixed32: return "fixed32";
    default: return "invalid";
  }
}

float load_float(const std::uint8_t* p) {
  std::uint32_t u = std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                    std::uint32_t{p[3]} << 24;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

DatumInfo parse_datum(const std::uint8_t* rec, std::size_t n, const std::string& name,
                      float* floats, std::size_t float_capacity) {
  Reader r{rec, n, 0, name};
  DatumInfo d;
  auto put_float = [&](std::size_t at, const std::uint8_t* src) {
    if (floats) {
      if (d.float_count >= float_capacity)
        r.fail(at, "more float_data values than the expected " + std::to_string(float_capacity));
      floats[d.float_count] = load_float(src);
    }
    ++d.float_count;
  };
  auto expect = [&](std::size_t at, int field, int wire, int want) {
    if (wire != want)
      r.fail(at, "field " + std::to_string(field) + " has wire type " + wire_name(wire) +
                     ", expected " + wire_name(want));
  };
  auto dim = [&](std::size_t at, const char* what) -> std::int64_t {
    const std::uint64_t v = r.varint(what);
    if (v > kMaxDim)
      r.fail(at, std::string(what) + " = " + std::to_string(static_cast<std::int64_t>(v)) +
                     " is negative or implausibly large");
    return static_cast<std::int64_t>(v);
  };

  while (r.pos < n) {
    const std::size_t at = r.pos;
    const std::uint64_t tag = r.varint("field tag");
    const std::uint64_t field = tag >> 3;
    const int wire = static_cast<int>(tag & 7u);
    if (field == 0 || field > 536870911u)
      r.fail(at, "invalid field number " + std::to_string(field));
    switch (field) {
      case 1:
        expect(at, 1, wire, kVarint);
        d.channels = dim(at, "channels");
        continue;
      case 2:
        expect(at, 2, wire, kVarint);
        d.height = dim(at, "height");
        continue;
      case 3:
        expect(at, 3, wire, kVarint);
        d.width = dim(at, "width");
        continue;
      case 4: {
        expect(at, 4, wire, kLen);
        const std::uint64_t len = r.length("data");
        d.data_offset = r.pos;
        d.data_size = len;
        r.pos += static_cast<std::size_t>(len);
        continue;
      }
      case 5: {
        expect(at, 5, wire, kVarint);
        const auto v = static_cast<std::int64_t>(r.varint("label"));
        if (v < std::numeric_limits<std::int32_t>::min() ||
            v > std::numeric_limits<std::int32_t>::max())
          r.fail(at, "label " + std::to_string(v) + " is outside int32");
        d.label = v;
        continue;
      }
      case 6:
        if (wire == kFixed32) {
          r.skip(4, "float_data value");
          put_float(r.pos - 4, rec + r.pos - 4);
        } else if (wire == kLen) {
          const std::uint64_t len = r.length("packed float_data");
          if (len % 4)
            r.fail(at,
                   "packed float_data of " + std::to_string(len) + " bytes is not a multiple of 4");
          for (std::uint64_t k = 0; k < len; k += 4) put_float(r.pos + k, rec + r.pos + k);
          r.pos += static_cast<std::size_t>(len);
        } else {
          r.fail(at, std::string("field 6 (float_data) has wire type ") + wire_name(wire));
        }
        continue;
      case 7: {
        expect(at, 7, wire, kVarint);
        const std::uint64_t v = r.varint("encoded");
        if (v > 1) r.fail(at, "encoded = " + std::to_string(v) + " is not a bool");
        d.encoded = v != 0;
        continue;
      }
      default: break;
    }
    // Unknown field: skip by wire type (forward compatible with newer caffe.proto).
    switch (wire) {
      case kVarint: r.varint("unknown field"); break;
      case kFixed64: r.skip(8, "fixed64 field"); break;
      case kFixed32: r.skip(4, "fixed32 field"); break;
      case kLen: r.pos += static_cast<std::size_t>(r.length("unknown field")); break;
      default:
        r.fail(at,
               "field " + std::to_string(field) + " uses unsupported wire type " + wire_name(wire));
    }
  }
  return d;
}

std::optional<DatumFault> decode_datum_batch(const std::uint8_t* raw, std::size_t raw_size,
                                             const std::int64_t* lengths, std::size_t count,
                                             const DatumBatchSpec& spec) {
  const std::string name = "<batch>";
  if (spec.channels < 0 || spec.height < 0 || spec.width < 0)
    return DatumFault{0, 0, "negative expected shape"};
  const std::uint64_t elems = static_cast<std::uint64_t>(spec.channels) *
                              static_cast<std::uint64_t>(spec.height) *
                              static_cast<std::uint64_t>(spec.width);
  if (spec.channels > static_cast<std::int64_t>(kMaxDim) ||
      spec.height > static_cast<std::int64_t>(kMaxDim) ||
      spec.width > static_cast<std::int64_t>(kMaxDim) || elems > kMaxElems)
    return DatumFault{0, 0, "expected shape is implausibly large"};
  const bool want_floats = spec.payload == DatumPayload::floats;
  const std::size_t row_bytes = static_cast<std::size_t>(elems) * (want_floats ? 4 : 1);
  auto shape_str = [](std::int64_t c, std::int64_t h, std::int64_t w) {
    return "(" + std::to_string(c) + ", " + std::to_string(h) + ", " + std::to_string(w) + ")";
  };
  std::uint64_t pos = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const auto sample = static_cast<std::int64_t>(i);
    if (lengths[i] < 0) return DatumFault{sample, 0, "negative record length"};
    const auto len = static_cast<std::uint64_t>(lengths[i]);
    if (len > raw_size - pos)
      return DatumFault{sample, 0, "record lengths exceed the batch buffer"};
    const std::uint8_t* rec = raw + pos;
    auto* row = static_cast<std::uint8_t*>(spec.out) + i * row_bytes;
    try {
      DatumInfo d = parse_datum(rec, static_cast<std::size_t>(len), name,
                                want_floats ? reinterpret_cast<float*>(row) : nullptr,
                                want_floats ? static_cast<std::size_t>(elems) : 0);
      if (spec.labels) spec.labels[i] = d.label;
      if (d.encoded) {
        if (!spec.encoded)
          return DatumFault{sample, 0,
                            "encoded (compressed image) Datum where raw pixels were expected"};
        spec.encoded[i] = 1;
        spec.encoded_offsets[i] = static_cast<std::int64_t>(pos + d.data_offset);
        spec.encoded_lengths[i] = static_cast<std::int64_t>(d.data_size);
        if (d.data_size == 0) return DatumFault{sample, 0, "encoded Datum without image bytes"};
        pos += len;
        continue;
      }
      if (spec.encoded) spec.encoded[i] = 0;
      if (d.channels != spec.channels || d.height != spec.height || d.width != spec.width)
        return DatumFault{sample, 0,
                          "shape " + shape_str(d.channels, d.height, d.width) +
                              " differs from the batch's " +
                              shape_str(spec.channels, spec.height, spec.width)};
      if (want_floats) {
        if (d.float_count != elems)
          return DatumFault{sample, d.data_offset,
                            "float_data has " + std::to_string(d.float_count) +
                                " values, expected C*H*W = " + std::to_string(elems)};
      } else {
        if (d.data_size != elems)
          return DatumFault{
              sample, d.data_offset,
              "data has " + std::to_string(d.data_size) +
                  " bytes, expected C*H*W = " + std::to_string(elems) +
                  (d.data_size == 0 && d.float_count ? " (the Datum holds float_data)" : "")};
        if (elems) std::memcpy(row, rec + d.data_offset, static_cast<std::size_t>(elems));
      }
    } catch (const CorruptData& e) {
      return DatumFault{sample, e.offset, e.reason};
    }
    pos += len;
  }
  return std::nullopt;
}

}  // namespace feedline
