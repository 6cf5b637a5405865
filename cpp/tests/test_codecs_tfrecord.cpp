// SPDX-License-Identifier: Apache-2.0
// TFRecord scanning: well-formed files (in memory and on disk, with buffers smaller than
// the records), and hostile inputs: every truncation, every flipped bit, absurd lengths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void frame(std::vector<std::uint8_t>& out, const std::vector<std::uint8_t>& payload) {
  const std::size_t at = out.size();
  put_u64(out, payload.size());
  put_u32(out, feedline::masked_crc32c(out.data() + at, 8));
  out.insert(out.end(), payload.begin(), payload.end());
  put_u32(out, feedline::masked_crc32c(payload.data(), payload.size()));
}

struct Sample {
  std::vector<std::uint8_t> file;
  std::vector<std::vector<std::uint8_t>> payloads;
};

Sample make(std::size_t n, std::size_t max_len, unsigned seed) {
  std::mt19937 rng(seed);
  Sample s;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::uint8_t> p(rng() % (max_len + 1));
    for (auto& b : p) b = static_cast<std::uint8_t>(rng());
    frame(s.file, p);
    s.payloads.push_back(std::move(p));
  }
  return s;
}

void check(const Sample& s, const feedline::TFRecordIndex& idx) {
  ASSERT_EQ(idx.offsets.size(), s.payloads.size());
  for (std::size_t i = 0; i < s.payloads.size(); ++i) {
    ASSERT_EQ(static_cast<std::size_t>(idx.lengths[i]), s.payloads[i].size());
    EXPECT_TRUE(
        std::equal(s.payloads[i].begin(), s.payloads[i].end(), s.file.begin() + idx.offsets[i]));
  }
}

std::string write_temp(const std::vector<std::uint8_t>& bytes) {
  char name[] = "/tmp/feedline-tfr-XXXXXX";
  int fd = ::mkstemp(name);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return name;
}

}  // namespace

TEST(TFRecord, ScansMemory) {
  Sample s = make(50, 300, 1);
  check(s, feedline::scan_tfrecord_bytes(s.file.data(), s.file.size(), "mem"));
  EXPECT_TRUE(feedline::scan_tfrecord_bytes(nullptr, 0, "empty").offsets.empty());
}

TEST(TFRecord, ScansFileWithSmallBuffer) {
  Sample s = make(40, 20000, 2);  // records larger than the 4 KiB buffer
  const std::string path = write_temp(s.file);
  for (std::size_t buf : {std::size_t{4096}, std::size_t{8} << 20}) {
    auto idx = feedline::scan_tfrecord(path, {buf, true});
    check(s, idx);
    EXPECT_GE(idx.bytes_read, s.file.size());
    auto quick = feedline::scan_tfrecord(path, {buf, false});
    EXPECT_EQ(quick.offsets, idx.offsets);
  }
  std::remove(path.c_str());
}

TEST(TFRecord, MissingFileIsStorageFailure) {
  EXPECT_THROW(feedline::scan_tfrecord("/nonexistent/feedline.tfrecord"), feedline::StorageFailure);
}

TEST(TFRecord, EveryTruncationIsCorrupt) {
  Sample s = make(6, 40, 3);
  std::vector<std::size_t> ends{0};
  for (std::size_t i = 0; i < s.payloads.size(); ++i)
    ends.push_back(ends.back() + 16 + s.payloads[i].size());
  for (std::size_t cut = 0; cut < s.file.size(); ++cut) {
    const bool boundary = std::find(ends.begin(), ends.end(), cut) != ends.end();
    if (boundary) {
      EXPECT_NO_THROW(feedline::scan_tfrecord_bytes(s.file.data(), cut, "t"));
    } else {
      try {
        feedline::scan_tfrecord_bytes(s.file.data(), cut, "t");
        ADD_FAILURE() << "no error at cut " << cut;
      } catch (const feedline::CorruptData& e) {
        EXPECT_EQ(e.path, "t");
        EXPECT_LE(e.offset, cut);
      }
    }
  }
}

TEST(TFRecord, EveryFlippedBitIsDetected) {
  Sample s = make(4, 30, 4);
  for (std::size_t byte = 0; byte < s.file.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = s.file;
      bad[byte] ^= static_cast<std::uint8_t>(1u << bit);
      EXPECT_THROW(feedline::scan_tfrecord_bytes(bad.data(), bad.size(), "f"),
                   feedline::CorruptData)
          << byte << ":" << bit;
    }
  }
}

TEST(TFRecord, HugeLengthWithValidCrcIsCorruptNotAllocation) {
  std::vector<std::uint8_t> f;
  put_u64(f, ~std::uint64_t{0} - 3);
  put_u32(f, feedline::masked_crc32c(f.data(), 8));
  f.resize(64, 0);
  try {
    feedline::scan_tfrecord_bytes(f.data(), f.size(), "h");
    FAIL();
  } catch (const feedline::CorruptData& e) {
    EXPECT_EQ(e.offset, 0u);
    EXPECT_NE(e.reason.find("beyond the end"), std::string::npos);
  }
}

TEST(TFRecord, DataCrcErrorNamesThePayload) {
  Sample s = make(3, 30, 5);
  const std::size_t second = 16 + s.payloads[0].size();
  if (s.payloads[1].empty()) GTEST_SKIP();
  auto bad = s.file;
  bad[second + 12] ^= 0x40;
  try {
    feedline::scan_tfrecord_bytes(bad.data(), bad.size(), "d");
    FAIL();
  } catch (const feedline::CorruptData& e) {
    EXPECT_EQ(e.offset, second + 12);
    EXPECT_NE(e.reason.find("data CRC"), std::string::npos);
  }
  EXPECT_NO_THROW(feedline::scan_tfrecord_bytes(bad.data(), bad.size(), "d", false));
}
