// SPDX-License-Identifier: Apache-2.0
/** @file permute.hpp
 *  @brief Keyed pseudo-random permutations evaluated one position at a time.
 *
 *  The permutation of `[0, n)` with key `k` is a balanced-as-possible Feistel network of
 *  six rounds over `[0, 2^bits)` (bits = the bit length of n-1, at least 2) whose round
 *  function is the SplitMix64 finaliser, restricted to `[0, n)` by cycle walking. It is
 *  the order every plan of feedline is made of (feedline.plan._perm documents the
 *  choice): bit for bit the same on every rank and every machine, whatever evaluates it.
 */
#pragma once
#include <cstddef>
#include <cstdint>

namespace feedline {

/// @brief The SplitMix64 finaliser (wrapping arithmetic).
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

/**
 * @brief out[i] = the permutation of [0, n[i]) keyed by key[i], applied to x[i] (or its
 *        inverse).
 *
 * @p n holds @p n_len values and @p key @p key_len: each either 1 (the same for every
 * position) or @p count.
 * @throws std::out_of_range when a position lies outside its domain (x < 0 or x >= n),
 *         std::invalid_argument when n_len or key_len is neither 1 nor count
 */
void permute(const std::int64_t* x, std::size_t count, const std::int64_t* n, std::size_t n_len,
             const std::uint64_t* key, std::size_t key_len, bool inverse, std::int64_t* out);

}  // namespace feedline
