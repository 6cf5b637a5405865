// SPDX-License-Identifier: Apache-2.0
/**
 * @file
 * @brief Little-endian field loads and hex formatting shared by the file parsers
 *        (TFRecord framing, gzip TFRecord segments). Callers bounds-check first.
 */
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace feedline::detail {

/// @brief The little-endian u64 at @p p (8 readable bytes).
inline std::uint64_t load_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// @brief The little-endian u32 at @p p (4 readable bytes).
inline std::uint32_t load_u32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

/// @brief "0x%08x" of @p v, for error messages.
inline std::string hex(std::uint32_t v) {
  char buf[16];
  (void)std::snprintf(buf, sizeof buf, "0x%08x", v);  // 10 characters: always fits
  return buf;
}

}  // namespace feedline::detail
