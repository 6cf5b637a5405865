// SPDX-License-Identifier: Apache-2.0
/**
 * @file
 * @brief Private: the message of an errno value, for StorageFailure texts. Same text as
 *        std::strerror, but thread-safe: the I/O engine's threads raise these errors
 *        concurrently, and strerror may write a shared static buffer.
 */
#pragma once

#include <array>
#include <cstring>  // ::strerror_r (POSIX; the GNU variant under _GNU_SOURCE)
#include <string>

namespace feedline::detail {

namespace errno_text_impl {
// glibc with _GNU_SOURCE (g++ and clang++ define it): char* strerror_r, which returns
// the message, in buf or not.
inline std::string message(const char* gnu, const char* /*buf*/, int /*err*/) { return gnu; }
// XSI strerror_r: int, 0 when buf holds the message.
inline std::string message(int xsi, const char* buf, int err) {
  return xsi == 0 ? std::string(buf) : "Unknown error " + std::to_string(err);
}
}  // namespace errno_text_impl

/// @brief What std::strerror(@p err) says, without its shared buffer.
inline std::string errno_text(int err) {
  std::array<char, 256> buf{};
  return errno_text_impl::message(::strerror_r(err, buf.data(), buf.size()), buf.data(), err);
}

}  // namespace feedline::detail
