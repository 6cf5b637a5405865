// SPDX-License-Identifier: Apache-2.0
#include <feedline/detail/errno_text.hpp>
#include <feedline/detail/io_posix.hpp>
#include <feedline/errors.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define FEEDLINE_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FEEDLINE_SANITIZED 1
#endif
#if defined(__x86_64__) && !defined(FEEDLINE_SANITIZED)
#include <emmintrin.h>
#define FEEDLINE_STREAM_COPY 1
#endif

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

void copy_out(void* dest, const void* src, std::size_t n) noexcept {
#ifdef FEEDLINE_STREAM_COPY
  if (n >= kStreamCopyBytes) {
    auto* d = static_cast<unsigned char*>(dest);
    const auto* s = static_cast<const unsigned char*>(src);
    // memcpy up to a cache-line aligned destination, stream whole 64-byte lines, memcpy
    // the tail
    const std::size_t head = (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    const std::size_t body = n / 64 * 64;
    for (std::size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();  // the stores are weakly ordered: visible before the read completes
    std::memcpy(d + body, s + body, n - body);
    return;
  }
#endif
  std::memcpy(dest, src, n);
}

}  // namespace feedline::detail
