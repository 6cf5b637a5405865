// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <feedline/doorbell.hpp>
#include <thread>

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

TEST(Doorbell, ReturnsAtOnceWhenAlreadyChanged) {
  alignas(4) std::uint32_t word = 5;
  EXPECT_TRUE(feedline::doorbell_wait(&word, 4, 10.0));
}

TEST(Doorbell, TimesOut) {
  alignas(4) std::uint32_t word = 0;
  const auto t0 = Clock::now();
  EXPECT_FALSE(feedline::doorbell_wait(&word, 0, 0.05));
  EXPECT_GE(since(t0), 0.045);
  EXPECT_LT(since(t0), 2.0);
  EXPECT_FALSE(feedline::doorbell_wait(&word, 0, 0.0));
  EXPECT_FALSE(feedline::doorbell_wait(&word, 0, -1.0));
}

TEST(Doorbell, RingWakesAThreadWaiter) {
  alignas(4) std::uint32_t word = 0;
  std::atomic<bool> woke{false};
  std::thread waiter([&] { woke = feedline::doorbell_wait(&word, 0, 30.0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = Clock::now();
  EXPECT_EQ(feedline::doorbell_ring(&word), 1U);
  waiter.join();
  EXPECT_TRUE(woke.load());
  EXPECT_LT(since(t0), 5.0);  // woken by the ring, not by the 30 s timeout
}

TEST(Doorbell, RingWakesAnotherProcess) {
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* word = static_cast<std::uint32_t*>(mem);
  *word = 7;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const auto t0 = Clock::now();
    const bool rung = feedline::doorbell_wait(word, 7, 30.0);
    _exit(rung && since(t0) < 20.0 ? 0 : 1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  feedline::doorbell_ring(word);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(*word, 8U);
  munmap(mem, 4096);
}

TEST(Doorbell, ManyRingsManyWaiters) {
  alignas(4) std::uint32_t word = 0;
  constexpr int kRings = 2000;
  std::atomic<int> done{0};
  std::thread waiters[3];
  for (auto& t : waiters) {
    t = std::thread([&] {
      std::uint32_t seen = 0;
      while (seen < kRings) {
        feedline::doorbell_wait(&word, seen, 5.0);
        seen = std::atomic_ref<std::uint32_t>(word).load();
      }
      done.fetch_add(1);
    });
  }
  for (int i = 0; i < kRings; ++i) feedline::doorbell_ring(&word);
  for (auto& t : waiters) t.join();
  EXPECT_EQ(done.load(), 3);
  EXPECT_EQ(word, static_cast<std::uint32_t>(kRings));
}
