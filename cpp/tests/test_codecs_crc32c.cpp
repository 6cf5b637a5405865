// SPDX-License-Identifier: Apache-2.0
// CRC32C against published vectors (RFC 3720 B.4, the "123456789" check value) and the
// agreement of the portable and SSE4.2 implementations on every length and alignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <feedline/codecs.hpp>
#include <random>
#include <string>
#include <vector>

using feedline::crc32c;

namespace {
std::uint32_t of(const std::vector<std::uint8_t>& v) { return crc32c(v.data(), v.size()); }
}  // namespace

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(feedline::detail::crc32c_portable(s.data(), s.size(), 0), 0xE3069283u);
  EXPECT_EQ(feedline::detail::crc32c_sse42(s.data(), s.size(), 0), 0xE3069283u);
}

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<std::uint8_t> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<std::uint8_t>(i);
    dec[i] = static_cast<std::uint8_t>(31 - i);
  }
  EXPECT_EQ(of(zeros), 0x8A9136AAu);
  EXPECT_EQ(of(ones), 0x62A8AB43u);
  EXPECT_EQ(of(inc), 0x46DD794Eu);
  EXPECT_EQ(of(dec), 0x113FDB5Cu);
}

TEST(Crc32c, EmptyIsIdentity) {
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc32c(nullptr, 0, 0x1234u), 0x1234u);
}

TEST(Crc32c, ImplementationsAgreeAndExtend) {
  std::mt19937 rng(7);
  std::vector<std::uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
  for (std::size_t off = 0; off < 8; ++off) {
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 63u, 64u, 1000u, 4096u}) {
      const auto* p = buf.data() + off;
      const auto sw = feedline::detail::crc32c_portable(p, n, 0);
      EXPECT_EQ(feedline::detail::crc32c_sse42(p, n, 0), sw) << off << " " << n;
      EXPECT_EQ(crc32c(p, n), sw);
      for (std::size_t cut : {std::size_t{0}, n / 3, n}) {
        EXPECT_EQ(crc32c(p + cut, n - cut, crc32c(p, cut)), sw);
      }
    }
  }
}

TEST(Crc32c, MaskRoundTrip) {
  for (std::uint32_t v : {0u, 1u, 0xE3069283u, 0xffffffffu, 0xa282ead8u}) {
    EXPECT_EQ(feedline::unmask_crc32c(feedline::mask_crc32c(v)), v);
  }
  // TFRecord's masked CRC of the 8-byte little-endian length 0 (an empty record).
  const std::uint8_t zero[8] = {};
  EXPECT_EQ(feedline::masked_crc32c(zero, 8),
            feedline::mask_crc32c(feedline::detail::crc32c_portable(zero, 8, 0)));
}
