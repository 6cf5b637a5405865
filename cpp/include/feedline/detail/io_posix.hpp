// SPDX-License-Identifier: Apache-2.0
/**
 * @file io_posix.hpp
 * @brief Private: the one read loop every engine method uses (short reads continued,
 *        EINTR/EAGAIN retried, transient errors retried with back-off).
 */
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace feedline::detail {

/// @brief Retry policy and the counters a read loop adds to.
struct ReadContext {
  const std::string* path = nullptr;                   ///< for error messages
  unsigned max_retries = 3;                            ///< transient errors retried this often
  std::chrono::microseconds backoff{1000};             ///< first back-off, doubled per retry
  std::atomic<std::uint64_t>* live_retries = nullptr;  ///< engine counter (may be null)
  std::uint64_t ops = 0;                               ///< read system calls issued
  std::uint64_t retries = 0;                           ///< transient errors retried
};

/// @brief Thrown by pread_full() when an `O_DIRECT` read fails with EINVAL.
struct DirectRefused : std::runtime_error {
  DirectRefused() : std::runtime_error("O_DIRECT read refused (EINVAL)") {}
};

/// @brief True for errno values worth retrying after a pause (EIO, ETIMEDOUT, ...).
bool is_transient(int err) noexcept;

/**
 * @brief Read up to @p length bytes at @p offset of @p fd into @p dest.
 *
 * Continues short reads until @p length bytes or end of file. With @p direct_align
 * != 0 (an `O_DIRECT` descriptor) a read returning a count that is not a multiple of
 * it marks the end of the file (continuing at an unaligned offset would be refused),
 * and EINVAL throws DirectRefused instead of StorageFailure.
 * @return bytes read; less than @p length only at end of file
 * @throws StorageFailure on a persistent error (after retries), naming path and offset
 */
std::size_t pread_full(int fd, void* dest, std::size_t length, std::int64_t offset,
                       ReadContext& ctx, std::size_t direct_align = 0);

/**
 * @brief Copy @p n bytes out of a bounce or staging buffer into a read's destination.
 *
 * Copies of kStreamCopyBytes and more use non-temporal stores on x86-64: the
 * destination (a window the consumer reads later, often shared memory) is not read for
 * ownership first and does not evict the cache, which makes the copy about a third
 * cheaper on the machines measured (docs/io-engine.md, "Staging"). Smaller copies, other
 * architectures and sanitizer builds (whose checks see memcpy, not intrinsics) use
 * memcpy. The stores are fenced before returning.
 */
void copy_out(void* dest, const void* src, std::size_t n) noexcept;

/// @brief The size from which copy_out() streams.
inline constexpr std::size_t kStreamCopyBytes = std::size_t{256} << 10;

}  // namespace feedline::detail
