// SPDX-License-Identifier: Apache-2.0
// Bindings of codecs.hpp: CRC32C, the TFRecord scanner and the Datum parser/decoder.
// Arguments are converted (and their sizes checked, so C++ never writes out of bounds),
// the GIL is released around the native call, results are converted back.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <feedline/codecs.hpp>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {

using Bytes = CArray<const std::uint8_t>;
using I64In = CArray<const std::int64_t>;
using I64Out = CArray<std::int64_t>;
using U8Out1 = CArray<std::uint8_t>;
using U8Out2 = CArray<std::uint8_t, 2>;
using Fault = std::optional<std::tuple<std::int64_t, std::uint64_t, std::string>>;

nb::tuple scan(const std::string& path, std::size_t buffer_bytes, bool verify_data) {
  TFRecordIndex idx;
  {
    ReleaseGil release;
    idx = scan_tfrecord(path, TFRecordScanOptions{buffer_bytes, verify_data});
  }
  const auto reads = idx.reads;
  const auto bytes_read = idx.bytes_read;
  return nb::make_tuple(to_numpy(std::move(idx.offsets)), to_numpy(std::move(idx.lengths)), reads,
                        bytes_read);
}

Fault decode_batch(const Bytes& raw, const I64In& lengths, const U8Out2& out, const I64Out& labels,
                   const U8Out1& encoded, const I64Out& encoded_offsets,
                   const I64Out& encoded_lengths, std::int64_t channels, std::int64_t height,
                   std::int64_t width, bool floats) {
  const std::size_t count = lengths.shape(0);
  if (labels.shape(0) != count || encoded.shape(0) != count || encoded_offsets.shape(0) != count ||
      encoded_lengths.shape(0) != count || out.shape(0) != count)
    throw std::invalid_argument(
        "decode_datum_batch: every per-sample array needs one row per record");
  if (channels < 0 || height < 0 || width < 0)
    throw std::invalid_argument("decode_datum_batch: negative shape");
  const auto row = static_cast<std::size_t>(channels * height * width) * (floats ? 4u : 1u);
  if (out.shape(1) != row)
    throw std::invalid_argument("decode_datum_batch: out rows must hold C*H*W values");
  DatumBatchSpec spec;
  spec.channels = channels;
  spec.height = height;
  spec.width = width;
  spec.payload = floats ? DatumPayload::floats : DatumPayload::bytes;
  spec.out = out.data();
  spec.labels = labels.data();
  spec.encoded = encoded.data();
  spec.encoded_offsets = encoded_offsets.data();
  spec.encoded_lengths = encoded_lengths.data();
  std::optional<DatumFault> fault;
  {
    ReleaseGil release;
    fault = decode_datum_batch(raw.data(), raw.shape(0), lengths.data(), count, spec);
  }
  if (!fault) return std::nullopt;
  return std::make_tuple(fault->sample, fault->offset, fault->reason);
}

}  // namespace

void register_codecs(nb::module_& m) {
  m.def(
      "crc32c",
      [](const Bytes& data, std::uint32_t crc) { return crc32c(data.data(), data.shape(0), crc); },
      nb::arg("data"), nb::arg("crc") = 0, nb::call_guard<ReleaseGil>(),
      "CRC32C (Castagnoli) of a uint8 buffer, extending *crc*.");
  m.def(
      "masked_crc32c", [](const Bytes& data) { return masked_crc32c(data.data(), data.shape(0)); },
      nb::arg("data"), nb::call_guard<ReleaseGil>(), "TFRecord's masked CRC32C of a uint8 buffer.");
  m.def("mask_crc32c", &mask_crc32c, nb::arg("crc"), "Mask a CRC the way TFRecord does.");
  m.def("crc32c_hardware", &detail::crc32c_hardware, "True when CRC32C uses SSE4.2.");
  m.def("scan_tfrecord", &scan, nb::arg("path"), nb::arg("buffer_bytes") = std::size_t{8} << 20,
        nb::arg("verify_data") = true,
        "Scan a TFRecord file: (payload offsets, payload lengths, preads, bytes read).");

  nb::class_<DatumInfo>(m, "_DatumInfo")
      .def_ro("channels", &DatumInfo::channels)
      .def_ro("height", &DatumInfo::height)
      .def_ro("width", &DatumInfo::width)
      .def_ro("label", &DatumInfo::label)
      .def_ro("encoded", &DatumInfo::encoded)
      .def_ro("data_offset", &DatumInfo::data_offset)
      .def_ro("data_size", &DatumInfo::data_size)
      .def_ro("float_count", &DatumInfo::float_count);
  m.def(
      "parse_datum",
      [](const Bytes& rec, const std::string& name) {
        return parse_datum(rec.data(), rec.shape(0), name);
      },
      nb::arg("record"), nb::arg("name") = "<record>", nb::call_guard<ReleaseGil>(),
      "Parse and validate one Caffe Datum; raises CorruptDataError(name, offset, reason).");
  m.def("decode_datum_batch", &decode_batch, nb::arg("raw"), nb::arg("lengths"), nb::arg("out"),
        nb::arg("labels"), nb::arg("encoded"), nb::arg("encoded_offsets"),
        nb::arg("encoded_lengths"), nb::arg("channels"), nb::arg("height"), nb::arg("width"),
        nb::arg("floats") = false,
        "Decode concatenated Datums into out (b, C*H*W bytes); None or (sample, offset, reason).");
}

}  // namespace feedline::py
