// SPDX-License-Identifier: Apache-2.0
// feedline._core I/O engine: _IOEngine, _IOFuture, _IOStats, evict_page_cache,
// resident_bytes. Arguments become C++ types, the GIL is released, C++ does the rest.
#include <feedline/io_engine.hpp>

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {

using Ids = CArray<const std::int32_t>;
using I64 = CArray<const std::int64_t>;
using Bytes = CArray<std::uint8_t>;
using Release = nb::call_guard<ReleaseGil>;

std::vector<Extent> to_extents(const Ids& file_ids, const I64& offsets, const I64& lengths) {
  const std::size_t n = file_ids.shape(0);
  if (offsets.shape(0) != n || lengths.shape(0) != n) {
    throw std::invalid_argument("file_ids, offsets and lengths must have equal lengths");
  }
  std::vector<Extent> out(n);
  const std::int32_t* f = file_ids.data();
  const std::int64_t* o = offsets.data();
  const std::int64_t* l = lengths.data();
  for (std::size_t i = 0; i < n; ++i) out[i] = Extent{f[i], o[i], l[i]};
  return out;
}

std::span<const std::int64_t> to_span(const std::optional<I64>& a) {
  if (!a) return {};
  return {a->data(), a->shape(0)};
}

IoFuture submit(IoEngine& e, const Ids& file_ids, const I64& offsets, const I64& lengths,
                void* buffer, std::size_t size, const std::optional<I64>& dest) {
  const std::vector<Extent> extents = to_extents(file_ids, offsets, lengths);
  return e.submit(extents, buffer, size, to_span(dest));
}

}  // namespace

void register_io(nb::module_& m) {
  nb::class_<IoStats>(m, "_IOStats", "Counters of a submission or of an engine (see IOStats).")
      .def_ro("bytes", &IoStats::bytes)
      .def_ro("storage_bytes", &IoStats::storage_bytes)
      .def_ro("bounced_bytes", &IoStats::bounced_bytes)
      .def_ro("ops", &IoStats::ops)
      .def_ro("extents", &IoStats::extents)
      .def_ro("tasks", &IoStats::tasks)
      .def_ro("retries", &IoStats::retries)
      .def_ro("minor_faults", &IoStats::minor_faults)
      .def_ro("major_faults", &IoStats::major_faults)
      .def_ro("submissions", &IoStats::submissions)
      .def_ro("busy_s", &IoStats::busy_s)
      .def_ro("wall_s", &IoStats::wall_s);

  nb::class_<IoFuture>(m, "_IOFuture", "Completion handle of one submission.")
      .def("done", &IoFuture::done)
      .def(
          "wait",
          [](const IoFuture& f, double timeout_s) {
            return f.wait_for(std::chrono::nanoseconds(static_cast<std::int64_t>(timeout_s * 1e9)));
          },
          nb::arg("timeout_s"), Release())
      .def("result", &IoFuture::get, Release());

  nb::class_<IoEngine>(m, "_IOEngine", "Native pool of I/O threads (see feedline.io.IOEngine).")
      .def(
          "__init__",
          [](IoEngine* self, std::vector<std::string> paths, unsigned threads,
             const std::string& method, std::size_t chunk_bytes, std::size_t alignment,
             unsigned max_retries, std::int64_t retry_backoff_us, bool stage) {
            IoOptions o;
            o.threads = threads;
            o.method = parse_io_method(method);
            o.chunk_bytes = chunk_bytes;
            o.alignment = alignment;
            o.max_retries = max_retries;
            o.retry_backoff = std::chrono::microseconds(retry_backoff_us);
            o.stage = stage;
            new (self) IoEngine(std::move(paths), o);
          },
          nb::arg("paths"), nb::arg("threads"), nb::arg("method"), nb::arg("chunk_bytes"),
          nb::arg("alignment"), nb::arg("max_retries"), nb::arg("retry_backoff_us"),
          nb::arg("stage") = false)
      .def(
          "submit",
          [](IoEngine& e, const Ids& f, const I64& o, const I64& l, const Bytes& buffer,
             const std::optional<I64>& dest) {
            return submit(e, f, o, l, buffer.data(), buffer.shape(0), dest);
          },
          nb::arg("file_ids"), nb::arg("offsets"), nb::arg("lengths"), nb::arg("buffer"),
          nb::arg("dest_offsets").none(), Release())
      .def(
          "submit_raw",
          [](IoEngine& e, const Ids& f, const I64& o, const I64& l, std::uintptr_t address,
             std::size_t size, const std::optional<I64>& dest) {
            // The address of a caller's buffer (ctypes/torch data_ptr) is an integer by API.
            // NOLINTNEXTLINE(performance-no-int-to-ptr)
            return submit(e, f, o, l, reinterpret_cast<void*>(address), size, dest);
          },
          nb::arg("file_ids"), nb::arg("offsets"), nb::arg("lengths"), nb::arg("address"),
          nb::arg("size"), nb::arg("dest_offsets").none(), Release())
      .def("stats", &IoEngine::stats)
      .def("file_mode",
           [](const IoEngine& e, std::int32_t i) { return std::string(to_string(e.file_mode(i))); })
      .def("path", &IoEngine::path)
      .def_prop_ro("num_files", &IoEngine::num_files)
      .def_prop_ro("method",
                   [](const IoEngine& e) { return std::string(to_string(e.options().method)); })
      .def_prop_ro("threads", [](const IoEngine& e) { return e.options().threads; })
      .def_prop_ro("chunk_bytes", [](const IoEngine& e) { return e.options().chunk_bytes; })
      .def_prop_ro("closed", &IoEngine::closed)
      .def("evict", &IoEngine::evict, Release())
      .def("close", &IoEngine::close, Release())
      .def("abandon", &IoEngine::abandon, Release());

  m.def("evict_page_cache", &evict_page_cache, nb::arg("path"), Release(),
        "Drop the cached pages of a file (posix_fadvise DONTNEED after fdatasync).");
  m.def("resident_bytes", &resident_bytes, nb::arg("path"), Release(),
        "Bytes of a file resident in the page cache (mincore).");
}

}  // namespace feedline::py
