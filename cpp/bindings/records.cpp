// SPDX-License-Identifier: Apache-2.0
// feedline._core.copy_records: records.hpp over numpy arrays (the GIL released for
// large copies).
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <feedline/records.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {
using U8In = CArray<const std::uint8_t>;
using U8Out = CArray<std::uint8_t>;
using I64In = CArray<const std::int64_t>;
constexpr std::size_t kReleaseAt = 64 << 10;  // bytes from which the GIL is released
}  // namespace

void register_records(nb::module_& m) {
  m.def(
      "copy_records",
      [](const U8In& src, const I64In& src_offsets, const I64In& lengths, const U8Out& out,
         std::optional<I64In> dest) {
        const std::size_t n = lengths.shape(0);
        if (src_offsets.shape(0) != n || (dest && dest->shape(0) != n))
          throw std::invalid_argument("copy_records: offsets, lengths and places differ in length");
        std::size_t total = 0;
        for (std::size_t i = 0; i < n; ++i)
          total += lengths.data()[i] > 0 ? static_cast<std::size_t>(lengths.data()[i]) : 0;
        std::optional<ReleaseGil> unlocked;
        if (total >= kReleaseAt) unlocked.emplace();
        copy_records(src.data(), src.shape(0), src_offsets.data(), lengths.data(), n, out.data(),
                     out.shape(0), dest ? dest->data() : nullptr);
      },
      nb::arg("src"), nb::arg("src_offsets"), nb::arg("lengths"), nb::arg("out").noconvert(),
      nb::arg("dest") = nb::none(),
      "out[dest[i]:dest[i]+lengths[i]] = src[src_offsets[i]:...+lengths[i]] (dest None: "
      "the records packed in order from 0), one memcpy each; IndexError naming the first "
      "record outside either buffer, before anything is copied.");
}

}  // namespace feedline::py
