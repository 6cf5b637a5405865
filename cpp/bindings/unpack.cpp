// SPDX-License-Identifier: Apache-2.0
// Bindings of unpack.hpp: HDF5 chunk unfiltering and gzip TFRecord segments, batch-wise.
// Every array size is checked here so the native code never reads or writes out of
// bounds; the GIL is released around the native work.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <feedline/unpack.hpp>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {

using Bytes = CArray<const std::uint8_t>;
using Bytes2 = CArray<const std::uint8_t, 2>;
using I64In = CArray<const std::int64_t>;
using U8Out = CArray<std::uint8_t>;
using Fault = std::optional<std::tuple<std::int64_t, std::string>>;

// Spans [starts[i], starts[i]+sizes[i]) of raw must lie inside raw; outputs
// [out_starts[i], out_starts[i]+out_sizes[i]) inside out.
void check_spans(std::size_t raw_size, const I64In& starts, const I64In& sizes,
                 std::size_t out_size, const I64In& out_starts, const I64In& out_sizes) {
  const std::size_t n = starts.shape(0);
  if (sizes.shape(0) != n || out_starts.shape(0) != n || out_sizes.shape(0) != n)
    throw std::invalid_argument("unpack: starts, sizes, out_starts, out_sizes differ in length");
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t a = starts.data()[i], b = sizes.data()[i];
    const std::int64_t c = out_starts.data()[i], d = out_sizes.data()[i];
    if (a < 0 || b < 0 || static_cast<std::uint64_t>(a) > raw_size ||
        static_cast<std::uint64_t>(b) > raw_size - static_cast<std::uint64_t>(a))
      throw std::invalid_argument("unpack: a span lies outside raw");
    if (c < 0 || d < 0 || static_cast<std::uint64_t>(c) > out_size ||
        static_cast<std::uint64_t>(d) > out_size - static_cast<std::uint64_t>(c))
      throw std::invalid_argument("unpack: an output lies outside out");
  }
}

Fault unfilter(const Bytes& raw, const I64In& starts, const I64In& sizes, const I64In& masks,
               const I64In& filters, std::size_t itemsize, const U8Out& out,
               const I64In& out_starts, const I64In& out_sizes) {
  check_spans(raw.shape(0), starts, sizes, out.shape(0), out_starts, out_sizes);
  if (masks.shape(0) != starts.shape(0))
    throw std::invalid_argument("unfilter_chunks: one mask per chunk");
  std::vector<int> fl(filters.shape(0));
  for (std::size_t i = 0; i < fl.size(); ++i) {
    fl[i] = static_cast<int>(filters.data()[i]);
    if (!chunk_filter_supported(fl[i]))
      throw std::invalid_argument("unfilter_chunks: unsupported filter " + std::to_string(fl[i]));
  }
  ReleaseGil release;
  std::vector<std::uint8_t> scratch;
  for (std::size_t i = 0; i < starts.shape(0); ++i) {
    auto err = unfilter_chunk(
        raw.data() + starts.data()[i], static_cast<std::size_t>(sizes.data()[i]), fl.data(),
        fl.size(), static_cast<std::uint32_t>(masks.data()[i]), itemsize,
        out.data() + out_starts.data()[i], static_cast<std::size_t>(out_sizes.data()[i]), scratch);
    if (err) return std::make_tuple(static_cast<std::int64_t>(i), *err);
  }
  return std::nullopt;
}

Fault inflate(const Bytes& raw, const I64In& starts, const I64In& sizes, const I64In& bits,
              const I64In& window_ids, const Bytes2& windows, const U8Out& out,
              const I64In& out_starts, const I64In& out_sizes) {
  check_spans(raw.shape(0), starts, sizes, out.shape(0), out_starts, out_sizes);
  const std::size_t n = starts.shape(0);
  if (bits.shape(0) != n || window_ids.shape(0) != n)
    throw std::invalid_argument("inflate_segments: one bits and window id per segment");
  if (windows.shape(0) > 0 && windows.shape(1) != kGzipWindow)
    throw std::invalid_argument("inflate_segments: windows must be (k, 32768)");
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t w = window_ids.data()[i];
    if (w < -1 || (w >= 0 && static_cast<std::size_t>(w) >= windows.shape(0)))
      throw std::invalid_argument("inflate_segments: window id out of range");
  }
  ReleaseGil release;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t w = window_ids.data()[i];
    const std::uint8_t* win =
        w >= 0 ? windows.data() + static_cast<std::size_t>(w) * kGzipWindow : nullptr;
    auto err =
        inflate_segment(raw.data() + starts.data()[i], static_cast<std::size_t>(sizes.data()[i]),
                        static_cast<int>(bits.data()[i]), win, out.data() + out_starts.data()[i],
                        static_cast<std::size_t>(out_sizes.data()[i]));
    if (err) return std::make_tuple(static_cast<std::int64_t>(i), *err);
  }
  return std::nullopt;
}

nb::dict scan_gzip(const std::string& path, std::size_t spacing, std::size_t buffer_bytes,
                   bool verify) {
  GzipTFRecordIndex idx;
  {
    ReleaseGil release;
    idx = scan_gzip_tfrecord(path, spacing, buffer_bytes, verify);
  }
  nb::dict d;
  const std::size_t k = idx.windows.size() / kGzipWindow;
  d["members"] = idx.members;
  d["stream_bytes"] = idx.stream_bytes;
  d["reads"] = idx.reads;
  d["bytes_read"] = idx.bytes_read;
  d["segment"] = to_numpy(std::move(idx.segment));
  d["at"] = to_numpy(std::move(idx.at));
  d["length"] = to_numpy(std::move(idx.length));
  d["start"] = to_numpy(std::move(idx.start));
  d["end"] = to_numpy(std::move(idx.end));
  d["out"] = to_numpy(std::move(idx.out));
  d["bits"] = to_numpy(std::move(idx.bits));
  d["window"] = to_numpy(std::move(idx.window));
  d["windows"] = to_numpy(std::move(idx.windows));
  d["window_count"] = k;
  return d;
}

}  // namespace

void register_unpack(nb::module_& m) {
  m.def("unfilter_chunks", &unfilter, nb::arg("raw"), nb::arg("starts"), nb::arg("sizes"),
        nb::arg("masks"), nb::arg("filters"), nb::arg("itemsize"), nb::arg("out"),
        nb::arg("out_starts"), nb::arg("out_sizes"),
        "Undo HDF5 filters (deflate, shuffle, lzf) on chunks raw[starts:+sizes] into "
        "out[out_starts:+out_sizes]; None or (chunk, reason).");
  m.def("inflate_segments", &inflate, nb::arg("raw"), nb::arg("starts"), nb::arg("sizes"),
        nb::arg("bits"), nb::arg("window_ids"), nb::arg("windows"), nb::arg("out"),
        nb::arg("out_starts"), nb::arg("out_sizes"),
        "Inflate gzip segments from their restart points; None or (segment, reason).");
  m.def("scan_gzip_tfrecord", &scan_gzip, nb::arg("path"),
        nb::arg("spacing") = std::size_t{1} << 20, nb::arg("buffer_bytes") = std::size_t{8} << 20,
        nb::arg("verify_data") = true,
        "Scan a gzip TFRecord file: records (segment, at, length) and restart points.");
  m.def(
      "check_tfrecord_crcs",
      [](const Bytes& buf, const I64In& src, const I64In& size) {
        if (src.shape(0) != size.shape(0))
          throw std::invalid_argument("check_tfrecord_crcs: src and size differ in length");
        return check_tfrecord_crcs(buf.data(), buf.shape(0), src.data(), size.data(), src.shape(0));
      },
      nb::arg("buf"), nb::arg("src"), nb::arg("size"), nb::call_guard<ReleaseGil>(),
      "First record whose TFRecord CRC (the 4 bytes after it in buf) mismatches, else -1.");
  m.def("gzip_window_bytes", []() { return kGzipWindow; });
}

}  // namespace feedline::py
