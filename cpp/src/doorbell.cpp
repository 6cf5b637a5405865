// SPDX-License-Identifier: Apache-2.0
#include <feedline/doorbell.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#endif

namespace feedline {
namespace {

using Clock = std::chrono::steady_clock;

// atomic_ref needs a mutable object even to load
std::uint32_t load(std::uint32_t* word) noexcept {  // NOLINT(readability-non-const-parameter)
  return std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire);
}

#if defined(__linux__)
// FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word may be shared between processes.
void futex_wait(std::uint32_t* word, std::uint32_t expected, double seconds) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  // EAGAIN (already changed), EINTR (a signal), ETIMEDOUT: the caller re-reads the word
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::uint32_t* word) noexcept {
  syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
}
#endif

}  // namespace

bool doorbell_wait(std::uint32_t* word, std::uint32_t expected, double timeout_s) noexcept {
  if (!(timeout_s > 0.0)) timeout_s = 0.0;           // negative or NaN: do not wait
  timeout_s = std::min(timeout_s, 365.0 * 86400.0);  // infinite: a year
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  for (;;) {
    if (load(word) != expected) return true;
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0.0) return false;
#if defined(__linux__)
    futex_wait(word, expected, left);
#else
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 50e-6)));
#endif
  }
}

std::uint32_t doorbell_ring(std::uint32_t* word) noexcept {
  const std::uint32_t v =
      std::atomic_ref<std::uint32_t>(*word).fetch_add(1, std::memory_order_acq_rel) + 1;
#if defined(__linux__)
  futex_wake_all(word);
#endif
  return v;
}

}  // namespace feedline
