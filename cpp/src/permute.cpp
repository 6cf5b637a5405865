// SPDX-License-Identifier: Apache-2.0
#include <feedline/permute.hpp>

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace feedline {
namespace {

constexpr int kRounds = 6;  // even: the half widths return to their start
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

using RoundKeys = std::array<std::uint64_t, kRounds>;

RoundKeys round_keys(std::uint64_t key) noexcept {
  RoundKeys rk{};
  for (int i = 0; i < kRounds; ++i)
    rk[i] = mix64(key + static_cast<std::uint64_t>(i + 1) * kGolden);
  return rk;
}

/// Bit length of n-1 as float64's exponent gives it (exact below 2^53), at least 2.
std::uint64_t domain_bits(std::int64_t n) noexcept {
  int e = 0;
  std::frexp(static_cast<double>(n > 1 ? n - 1 : 0), &e);
  return static_cast<std::uint64_t>(e < 2 ? 2 : e);
}

std::uint64_t feistel(std::uint64_t x, std::uint64_t wl, std::uint64_t wr, const RoundKeys& rk,
                      bool inverse) noexcept {
  const auto mask = [](std::uint64_t w) { return (std::uint64_t{1} << w) - 1; };
  std::uint64_t L = x >> wr, R = x & mask(wr);
  if (!inverse) {
    for (int i = 0; i < kRounds; ++i) {
      const std::uint64_t F = mix64(R ^ rk[i]) & mask(wl);
      const std::uint64_t nl = R;
      R = L ^ F;
      L = nl;
      std::swap(wl, wr);
    }
  } else {
    for (int i = kRounds - 1; i >= 0; --i) {
      std::swap(wl, wr);  // the widths as they were before this forward round
      const std::uint64_t old_r = L;
      const std::uint64_t old_l = R ^ (mix64(old_r ^ rk[i]) & mask(wl));
      L = old_l;
      R = old_r;
    }
  }
  return (L << wr) | R;
}

}  // namespace

void permute(const std::int64_t* x, std::size_t count, const std::int64_t* n, std::size_t n_len,
             const std::uint64_t* key, std::size_t key_len, bool inverse, std::int64_t* out) {
  if (count == 0) return;
  if ((n_len != 1 && n_len != count) || (key_len != 1 && key_len != count)) {
    throw std::invalid_argument("permute: n and key must hold 1 value or one per position");
  }
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t d = n[n_len == 1 ? 0 : i];
    if (x[i] < 0 || x[i] >= d) {
      throw std::out_of_range("position " + std::to_string(x[i]) +
                              " outside the permutation's domain [0, " + std::to_string(d) + ")");
    }
  }
  std::int64_t last_n = -1;
  std::uint64_t last_key = 0, wl = 0, wr = 0;
  RoundKeys rk{};
  bool have = false;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t d = n[n_len == 1 ? 0 : i];
    const std::uint64_t k = key[key_len == 1 ? 0 : i];
    if (!have || d != last_n) {
      const std::uint64_t bits = domain_bits(d);
      wl = bits >> 1;
      wr = bits - wl;
      last_n = d;
    }
    if (!have || k != last_key) {
      rk = round_keys(k);
      last_key = k;
    }
    have = true;
    std::uint64_t y = feistel(static_cast<std::uint64_t>(x[i]), wl, wr, rk, inverse);
    while (y >= static_cast<std::uint64_t>(d)) y = feistel(y, wl, wr, rk, inverse);  // cycle walk
    out[i] = static_cast<std::int64_t>(y);
  }
}

}  // namespace feedline
