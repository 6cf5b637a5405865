// SPDX-License-Identifier: Apache-2.0
// feedline._core.permute: the keyed permutation of permute.hpp over numpy arrays (the GIL
// released for large ones).
#include <nanobind/ndarray.h>

#include <feedline/permute.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {
using I64In = CArray<const std::int64_t>;
using U64In = CArray<const std::uint64_t>;
using I64Out = CArray<std::int64_t>;
constexpr std::size_t kReleaseAt = 4096;  // positions from which the GIL is released
}  // namespace

void register_plan(nb::module_& m) {
  m.def(
      "permute",
      [](const I64In& x, const I64In& n, const U64In& key, bool inverse, const I64Out& out) {
        if (out.shape(0) != x.shape(0))
          throw std::invalid_argument("permute: out and x differ in length");
        const std::size_t count = x.shape(0);
        std::optional<ReleaseGil> unlocked;
        if (count >= kReleaseAt) unlocked.emplace();
        permute(x.data(), count, n.data(), n.shape(0), key.data(), key.shape(0), inverse,
                out.data());
      },
      nb::arg("x"), nb::arg("n"), nb::arg("key"), nb::arg("inverse"), nb::arg("out").noconvert(),
      "out[i] = the keyed permutation of [0, n[i]) applied to x[i] (n, key: 1 value or one "
      "per position); IndexError for a position outside its domain.");
}

}  // namespace feedline::py
