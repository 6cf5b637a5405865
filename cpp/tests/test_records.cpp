// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <feedline/records.hpp>

#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace {
std::vector<std::uint8_t> iota_bytes(std::size_t n) {
  std::vector<std::uint8_t> v(n);
  std::iota(v.begin(), v.end(), std::uint8_t{0});
  return v;
}
}  // namespace

TEST(CopyRecords, GathersInOrderWhenNoPlacesAreGiven) {
  auto src = iota_bytes(64);
  std::vector<std::int64_t> from{40, 3, 10}, len{2, 3, 0};
  std::vector<std::uint8_t> out(5, 0xFF);
  feedline::copy_records(src.data(), src.size(), from.data(), len.data(), 3, out.data(), out.size(),
                         nullptr);
  EXPECT_EQ(out, (std::vector<std::uint8_t>{40, 41, 3, 4, 5}));
}

TEST(CopyRecords, ScattersToTheGivenPlaces) {
  auto src = iota_bytes(16);
  std::vector<std::int64_t> from{0, 8}, len{2, 2}, dest{4, 0};
  std::vector<std::uint8_t> out(6, 0xFF);
  feedline::copy_records(src.data(), src.size(), from.data(), len.data(), 2, out.data(), out.size(),
                         dest.data());
  EXPECT_EQ(out, (std::vector<std::uint8_t>{8, 9, 0xFF, 0xFF, 0, 1}));
}

TEST(CopyRecords, RefusesAnyExtentOutsideEitherBufferBeforeCopying) {
  auto src = iota_bytes(16);
  std::vector<std::uint8_t> out(8, 0xFF);
  const auto big = std::numeric_limits<std::int64_t>::max();
  struct Case {
    std::int64_t from, len, dest;
  };
  for (Case c : {Case{15, 2, 0}, Case{-1, 1, 0}, Case{0, -1, 0}, Case{big, 1, 0}, Case{1, big, 0},
                 Case{0, 4, 5}, Case{0, 1, -3}, Case{0, 1, big}}) {
    std::vector<std::int64_t> from{0, c.from}, len{1, c.len}, dest{0, c.dest};
    EXPECT_THROW(feedline::copy_records(src.data(), src.size(), from.data(), len.data(), 2,
                                        out.data(), out.size(), dest.data()),
                 std::out_of_range)
        << c.from << " " << c.len << " " << c.dest;
    EXPECT_EQ(out[0], 0xFF) << "record 0 was copied before record 1 was checked";
  }
  // packed: the second record would end past the output
  std::vector<std::int64_t> from{0, 0}, len{4, 5};
  EXPECT_THROW(feedline::copy_records(src.data(), src.size(), from.data(), len.data(), 2,
                                      out.data(), out.size(), nullptr),
               std::out_of_range);
}
