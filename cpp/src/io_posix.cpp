// SPDX-License-Identifier: Apache-2.0
#include <feedline/detail/errno_text.hpp>
#include <feedline/detail/io_posix.hpp>
#include <feedline/errors.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace feedline::detail {

bool is_transient(int err) noexcept {
  // Errors a parallel or network file system reports for a server that is busy, slow
  // or failing over; a local disk reports EIO for media errors, which retries may also
  // get past (the block layer retries too, but not forever).
  switch (err) {
    case EIO:
    case ETIMEDOUT:
    case EBUSY:
    case EREMOTEIO:
    case ECONNRESET: return true;
    default: return false;
  }
}

namespace {
constexpr int kMaxAgain = 1000;  // EAGAIN pauses of 100 us: give up after ~0.1 s
constexpr std::chrono::microseconds kMaxBackoff{1'000'000};
}  // namespace

std::size_t pread_full(int fd, void* dest, std::size_t length, std::int64_t offset,
                       ReadContext& ctx, std::size_t direct_align) {
  auto* out = static_cast<unsigned char*>(dest);
  std::size_t got = 0;
  unsigned transient = 0;
  int again = 0;
  while (got < length) {
    const std::int64_t at = offset + static_cast<std::int64_t>(got);
    ++ctx.ops;
    const ssize_t n = ::pread(fd, out + got, length - got, static_cast<off_t>(at));
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      if (direct_align != 0 && static_cast<std::size_t>(n) % direct_align != 0) break;
      continue;
    }
    if (n == 0) break;  // end of file
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN && ++again <= kMaxAgain) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    if (err == EINVAL && direct_align != 0) throw DirectRefused();
    if (is_transient(err) && transient < ctx.max_retries) {
      const std::chrono::microseconds pause = std::min<std::chrono::microseconds>(
          ctx.backoff * (1LL << std::min(transient, 20u)), kMaxBackoff);
      ++transient;
      ++ctx.retries;
      if (ctx.live_retries != nullptr) ctx.live_retries->fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(pause);
      continue;
    }
    const std::string path = ctx.path != nullptr ? *ctx.path : std::string("<fd>");
    std::string what = std::string("pread: ") + detail::errno_text(err);
    if (transient > 0) what += " (after " + std::to_string(transient) + " retries)";
    throw StorageFailure(path, static_cast<std::uint64_t>(at), err, what);
  }
  return got;
}

}  // namespace feedline::detail
