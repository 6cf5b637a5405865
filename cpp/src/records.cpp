// SPDX-License-Identifier: Apache-2.0
#include <feedline/records.hpp>

#include <cstring>
#include <stdexcept>
#include <string>

namespace feedline {
namespace {
// [at, at + n) lies within [0, size): overflow-free
bool inside(std::int64_t at, std::int64_t n, std::size_t size) noexcept {
  if (at < 0 || n < 0) return false;
  const auto a = static_cast<std::uint64_t>(at);
  const auto b = static_cast<std::uint64_t>(n);
  return a <= size && b <= size - a;
}

[[noreturn]] void bad(std::size_t i, const char* what, std::int64_t at, std::int64_t n,
                      std::size_t size) {
  throw std::out_of_range("record " + std::to_string(i) + ": " + std::to_string(n) + " bytes at " +
                          std::to_string(at) + " fall outside the " + what + " (" +
                          std::to_string(size) + " bytes)");
}
}  // namespace

void copy_records(const std::uint8_t* src, std::size_t src_size, const std::int64_t* from,
                  const std::int64_t* len, std::size_t count, std::uint8_t* out,
                  std::size_t out_size, const std::int64_t* dest) {
  std::int64_t packed = 0;  // the next place when dest is null
  for (std::size_t i = 0; i < count; ++i) {
    if (!inside(from[i], len[i], src_size)) bad(i, "source", from[i], len[i], src_size);
    const std::int64_t at = dest != nullptr ? dest[i] : packed;
    if (!inside(at, len[i], out_size)) bad(i, "output", at, len[i], out_size);
    packed = at + len[i];
  }
  packed = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t at = dest != nullptr ? dest[i] : packed;
    if (len[i] > 0) std::memcpy(out + at, src + from[i], static_cast<std::size_t>(len[i]));
    packed = at + len[i];
  }
}

}  // namespace feedline
