// SPDX-License-Identifier: Apache-2.0
// feedline._core doorbells: doorbell_wait, doorbell_ring on a word of a numpy array that
// several processes map (docs/io-engine.md, "Doorbells").
#include <feedline/doorbell.hpp>

#include <nanobind/ndarray.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {

using Words = CArray<std::uint32_t>;

std::uint32_t* word_at(Words& words, std::int64_t index) {
  if (index < 0 || static_cast<std::uint64_t>(index) >= words.shape(0)) {
    throw std::out_of_range("doorbell index " + std::to_string(index) + " outside an array of " +
                            std::to_string(words.shape(0)) + " words");
  }
  return words.data() + index;
}

}  // namespace

void register_sync(nb::module_& m) {
  m.def(
      "doorbell_wait",
      [](Words words, std::int64_t index, std::uint32_t expected, double timeout_s) {
        std::uint32_t* w = word_at(words, index);
        ReleaseGil unlocked;
        return doorbell_wait(w, expected, timeout_s);
      },
      nb::arg("words"), nb::arg("index"), nb::arg("expected"), nb::arg("timeout_s"),
      "Wait (GIL released) until words[index] != expected or timeout_s passed; True when "
      "it changed. words: a uint32 array in memory shared between processes.");
  m.def(
      "doorbell_ring",
      [](Words words, std::int64_t index) { return doorbell_ring(word_at(words, index)); },
      nb::arg("words"), nb::arg("index"),
      "Increment words[index] atomically and wake every waiter; the new value.");
}

}  // namespace feedline::py
