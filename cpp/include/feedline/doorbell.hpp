// SPDX-License-Identifier: Apache-2.0
/** @file doorbell.hpp
 *  @brief Waiting for a word of shared memory to change, across processes.
 *
 *  A *doorbell* is a 32-bit word in memory that several processes map (an MPI shared
 *  window, a MAP_SHARED mapping). Publishers change the state they share, then ring the
 *  bell (the word is incremented, every waiter woken); a waiter reads the bell, checks
 *  the state, and when it must wait, waits for the bell to differ from what it read, so
 *  a ring between its check and its wait is never missed. On Linux the wait is a futex
 *  (no CPU while waiting, woken within microseconds of a ring); elsewhere it sleeps in
 *  short slices and re-reads the word.
 */
#pragma once
#include <cstdint>

namespace feedline {

/// @brief Wait until `*word != expected` or `timeout_s` seconds have passed.
/// @return true when the word differs on return (rung), false on a timeout. Spurious
///   wake-ups and signals are handled by re-checking the word; the wait never exceeds
///   the timeout by more than the scheduler's delay. `word` must be 4-byte aligned.
bool doorbell_wait(std::uint32_t* word, std::uint32_t expected, double timeout_s) noexcept;

/// @brief Increment `*word` atomically and wake every process and thread waiting on it.
/// @return the new value.
std::uint32_t doorbell_ring(std::uint32_t* word) noexcept;

}  // namespace feedline
