// SPDX-License-Identifier: Apache-2.0
// The keyed permutation: a bijection of [0, n) with its inverse, the reference values of
// the numpy expression it replaced (tests/perm_oracle.py), and its argument checks.
#include <gtest/gtest.h>

#include <feedline/permute.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace {

std::int64_t one(std::int64_t x, std::int64_t n, std::uint64_t key, bool inverse) {
  std::int64_t out = -1;
  feedline::permute(&x, 1, &n, 1, &key, 1, inverse, &out);
  return out;
}

}  // namespace

TEST(Permute, IsABijectionUndoneByItsInverse) {
  for (const std::int64_t n : {1, 2, 3, 5, 64, 1000, 4097}) {
    std::vector<std::int64_t> x(static_cast<std::size_t>(n)), y(x.size()), z(x.size());
    std::iota(x.begin(), x.end(), 0);
    const std::uint64_t key = 0x1234567ULL * static_cast<std::uint64_t>(n);
    feedline::permute(x.data(), x.size(), &n, 1, &key, 1, false, y.data());
    feedline::permute(y.data(), y.size(), &n, 1, &key, 1, true, z.data());
    EXPECT_EQ(z, x) << n;
    std::sort(y.begin(), y.end());
    EXPECT_EQ(y, x) << n;
  }
}

TEST(Permute, GivesTheReferenceValues) {
  struct Case {
    std::int64_t x, n;
    std::uint64_t key;
    std::int64_t forward, inverse;
  };
  const Case cases[] = {
      {0, 1, 0x0ULL, 0, 0},
      {3, 10, 0x3039ULL, 3, 3},
      {999, 1000, 0xDEADBEEFCAFEBABEULL, 339, 37},
      {123456789, 10000000000, 0x7ULL, 6902181847, 313067519},
      {5, 6, 0xFFFFFFFFFFFFFFFFULL, 3, 3},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(one(c.x, c.n, c.key, false), c.forward) << c.x << " of " << c.n;
    EXPECT_EQ(one(c.x, c.n, c.key, true), c.inverse) << c.x << " of " << c.n;
  }
}

TEST(Permute, PerPositionDomainsAndKeys) {
  const std::vector<std::int64_t> x{0, 1, 2, 3}, n{4, 8, 16, 1000};
  const std::vector<std::uint64_t> key{1, 2, 3, 4};
  std::vector<std::int64_t> out(4);
  feedline::permute(x.data(), 4, n.data(), 4, key.data(), 4, false, out.data());
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i], one(x[i], n[i], key[i], false));
    EXPECT_GE(out[i], 0);
    EXPECT_LT(out[i], n[i]);
  }
}

TEST(Permute, RefusesPositionsOutsideTheDomainAndMismatchedLengths) {
  const std::int64_t n = 5;
  const std::uint64_t key = 1;
  std::int64_t out = 0;
  for (const std::int64_t x : {std::int64_t{-1}, std::int64_t{5}}) {
    EXPECT_THROW(feedline::permute(&x, 1, &n, 1, &key, 1, false, &out), std::out_of_range);
  }
  const std::vector<std::int64_t> xs{0, 1, 2}, ns{5, 5};
  std::vector<std::int64_t> outs(3);
  EXPECT_THROW(feedline::permute(xs.data(), 3, ns.data(), 2, &key, 1, false, outs.data()),
               std::invalid_argument);
  EXPECT_THROW(feedline::permute(xs.data(), 3, &n, 1, &key, 0, false, outs.data()),
               std::invalid_argument);
  feedline::permute(xs.data(), 0, &n, 1, &key, 1, false, outs.data());  // nothing to do
}
