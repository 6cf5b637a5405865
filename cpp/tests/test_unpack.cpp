// SPDX-License-Identifier: Apache-2.0
// Compressed spans: HDF5 chunk filters (deflate, shuffle, LZF) and gzip TFRecord scan /
// segment inflate, on well-formed data and on hostile data: every truncation, garbage,
// flipped bits, absurd back-references. Run under ASan + UBSan in dev/test.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>
#include <feedline/unpack.hpp>
#include <random>
#include <vector>

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes zlib_compress(const Bytes& in, int window_bits = 15) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&s, in.size()) + 64);
  s.next_in = const_cast<Bytef*>(in.data());
  s.avail_in = static_cast<uInt>(in.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

Bytes shuffle(const Bytes& in, std::size_t item) {
  Bytes out(in.size());
  const std::size_t n = in.size() / item;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < item; ++j) out[j * n + i] = in[i * item + j];
  for (std::size_t k = n * item; k < in.size(); ++k) out[k] = in[k];
  return out;
}

Bytes smooth(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>((i / 7) % 13 + rng() % 3);
  return b;
}

const int kShuffleDeflate[] = {2, 1};

TEST(Unshuffle, InvertsHdf5ShuffleWithTail) {
  for (std::size_t item : {1u, 2u, 3u, 4u, 8u})
    for (std::size_t size : {0u, 5u, 63u, 64u, 1003u, 4096u, 4099u}) {
      const Bytes x = smooth(size, 1);
      Bytes back(x.size());
      feedline::unshuffle(shuffle(x, item).data(), back.data(), x.size(), item);
      EXPECT_EQ(back, x) << item << " " << size;
    }
}

TEST(UnfilterChunk, ShuffleDeflateRoundTripAndMask) {
  const Bytes x = smooth(64 * 1024, 2);
  const Bytes stored = zlib_compress(shuffle(x, 4));
  Bytes out(x.size()), scratch;
  ASSERT_FALSE(feedline::unfilter_chunk(stored.data(), stored.size(), kShuffleDeflate, 2, 0, 4,
                                        out.data(), out.size(), scratch));
  EXPECT_EQ(out, x);
  // mask bit 1: deflate was skipped (stored only shuffled)
  const Bytes only_shuffled = shuffle(x, 4);
  ASSERT_FALSE(feedline::unfilter_chunk(only_shuffled.data(), only_shuffled.size(), kShuffleDeflate,
                                        2, 0b10, 4, out.data(), out.size(), scratch));
  EXPECT_EQ(out, x);
  // every filter skipped: stored as is, and must have the chunk's size
  ASSERT_FALSE(feedline::unfilter_chunk(x.data(), x.size(), kShuffleDeflate, 2, 0b11, 4, out.data(),
                                        out.size(), scratch));
  EXPECT_EQ(out, x);
  EXPECT_TRUE(feedline::unfilter_chunk(x.data(), x.size() - 1, kShuffleDeflate, 2, 0b11, 4,
                                       out.data(), out.size(), scratch));
}

TEST(UnfilterChunk, EveryTruncationAndGarbageIsAnErrorNotACrash) {
  const Bytes x = smooth(8192, 3);
  const Bytes stored = zlib_compress(shuffle(x, 2));
  Bytes out(x.size()), scratch;
  for (std::size_t cut = 0; cut < stored.size(); ++cut) {
    auto err = feedline::unfilter_chunk(stored.data(), cut, kShuffleDeflate, 2, 0, 2, out.data(),
                                        out.size(), scratch);
    EXPECT_TRUE(err) << "cut " << cut;
  }
  std::mt19937 rng(7);
  for (int k = 0; k < 200; ++k) {
    Bytes junk(1 + rng() % 4000);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    EXPECT_TRUE(feedline::unfilter_chunk(junk.data(), junk.size(), kShuffleDeflate, 2, 0, 2,
                                         out.data(), out.size(), scratch));
  }
  // flipped bits: an error (adler32 or structure), never a crash or silent success
  for (std::size_t i = 0; i < stored.size(); i += 3) {
    Bytes bad = stored;
    bad[i] ^= 0x10;
    auto err = feedline::unfilter_chunk(bad.data(), bad.size(), kShuffleDeflate, 2, 0, 2,
                                        out.data(), out.size(), scratch);
    if (!err) EXPECT_EQ(out, x) << "flip at " << i;
  }
  // a chunk that inflates to the wrong size
  EXPECT_TRUE(feedline::unfilter_chunk(stored.data(), stored.size(), kShuffleDeflate, 2, 0, 2,
                                       out.data(), out.size() - 2, scratch));
  Bytes big(out.size() + 10);
  EXPECT_TRUE(feedline::unfilter_chunk(stored.data(), stored.size(), kShuffleDeflate, 2, 0, 2,
                                       big.data(), big.size(), scratch));
}

TEST(Lzf, LiteralsBackReferencesAndHostileStreams) {
  // "abcabcabcabc": literal "abc" (ctrl 2), then a back-reference of 9 at distance 3
  // (len-2 = 7 -> ctrl (7 << 5) | 0, extra length byte 0, distance-1 = 2)
  const Bytes ok = {2, 'a', 'b', 'c', 7 << 5, 0, 2};
  Bytes out(12);
  ASSERT_FALSE(feedline::lzf_decompress(ok.data(), ok.size(), out.data(), out.size()));
  EXPECT_EQ(std::string(out.begin(), out.end()), "abcabcabcabc");
  EXPECT_TRUE(feedline::lzf_decompress(ok.data(), ok.size(), out.data(), 11));  // too long
  Bytes out13(13);
  EXPECT_TRUE(feedline::lzf_decompress(ok.data(), ok.size(), out13.data(), 13));  // too short
  const Bytes far = {0, 'a', 1 << 5, 5};  // distance 6 before a 1-byte output
  EXPECT_TRUE(feedline::lzf_decompress(far.data(), far.size(), out.data(), 4));
  const Bytes lit = {9, 'a', 'b'};  // literal of 10 with 2 bytes left
  EXPECT_TRUE(feedline::lzf_decompress(lit.data(), lit.size(), out.data(), 10));
  for (std::size_t cut = 0; cut < ok.size(); ++cut)
    EXPECT_TRUE(feedline::lzf_decompress(ok.data(), cut, out.data(), out.size())) << cut;
  std::mt19937 rng(11);
  Bytes o(4096);
  for (int k = 0; k < 500; ++k) {
    Bytes junk(1 + rng() % 300);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    (void)feedline::lzf_decompress(junk.data(), junk.size(), o.data(), o.size());
  }
}

// ------------------------------------------------------------------ gzip TFRecord

void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

struct Stream {
  Bytes plain;                 // TFRecord frames
  std::vector<Bytes> records;  // payloads
};

Stream frames(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  Stream s;
  for (std::size_t i = 0; i < n; ++i) {
    Bytes p = smooth(rng() % 9000, seed + static_cast<unsigned>(i));
    const std::size_t at = s.plain.size();
    put_u64(s.plain, p.size());
    put_u32(s.plain, feedline::masked_crc32c(s.plain.data() + at, 8));
    s.plain.insert(s.plain.end(), p.begin(), p.end());
    put_u32(s.plain, feedline::masked_crc32c(p.data(), p.size()));
    s.records.push_back(std::move(p));
  }
  return s;
}

// Every record, inflated from its segment, equals the original; CRCs verify.
void expect_records(const Bytes& gz, const feedline::GzipTFRecordIndex& idx, const Stream& s) {
  ASSERT_EQ(idx.at.size(), s.records.size());
  for (std::size_t i = 0; i < s.records.size(); ++i) {
    const auto seg = static_cast<std::size_t>(idx.segment[i]);
    const auto a = static_cast<std::size_t>(idx.start[seg]);
    const auto b = static_cast<std::size_t>(idx.end[seg]);
    ASSERT_LE(a, b);
    ASSERT_LE(b, gz.size());
    Bytes out(static_cast<std::size_t>(idx.out[seg]));
    const std::uint8_t* win = idx.window[seg] >= 0
                                  ? idx.windows.data() + idx.window[seg] * feedline::kGzipWindow
                                  : nullptr;
    auto err =
        feedline::inflate_segment(gz.data() + a, b - a, idx.bits[seg], win, out.data(), out.size());
    ASSERT_FALSE(err) << *err;
    const auto at = static_cast<std::size_t>(idx.at[i]);
    ASSERT_LE(at + s.records[i].size() + 4, out.size());
    EXPECT_TRUE(std::equal(s.records[i].begin(), s.records[i].end(), out.begin() + at)) << i;
    const std::int64_t src = idx.at[i], size = idx.length[i];
    EXPECT_EQ(feedline::check_tfrecord_crcs(out.data(), out.size(), &src, &size, 1), -1);
  }
}

TEST(GzipTFRecord, OneMemberWithRestartPoints) {
  const Stream s = frames(200, 1);
  const Bytes gz = zlib_compress(s.plain, 31);
  const auto idx = feedline::scan_gzip_tfrecord_bytes(gz.data(), gz.size(), "mem", 65536, true);
  EXPECT_EQ(idx.members, 1u);
  EXPECT_EQ(idx.stream_bytes, s.plain.size());
  EXPECT_GE(idx.windows.size() / feedline::kGzipWindow, 5u);
  expect_records(gz, idx, s);
}

TEST(GzipTFRecord, ManyMembersRestartAtEachWithoutWindows) {
  const Stream s = frames(60, 2);
  Bytes gz;
  std::size_t pos = 0;
  for (std::size_t m = 0; m < 6; ++m) {  // members of 10 records
    std::size_t end = pos;
    for (std::size_t r = 0; r < 10; ++r) end += 16 + s.records[m * 10 + r].size();
    const Bytes part(s.plain.begin() + static_cast<std::ptrdiff_t>(pos),
                     s.plain.begin() + static_cast<std::ptrdiff_t>(end));
    const Bytes member = zlib_compress(part, 31);
    gz.insert(gz.end(), member.begin(), member.end());
    pos = end;
  }
  const auto idx = feedline::scan_gzip_tfrecord_bytes(gz.data(), gz.size(), "mem", 1 << 20, true);
  EXPECT_EQ(idx.members, 6u);
  EXPECT_TRUE(idx.windows.empty());
  expect_records(gz, idx, s);
}

TEST(GzipTFRecord, RecordAcrossMembersFromARestartPointInsideTheFirst) {
  // The stream is cut in the middle of a record and each part gzipped (`cat a.gz b.gz`):
  // the record that straddles the members belongs to a segment that starts at a restart
  // point inside the first member. Its raw inflate ends at the member's last deflate
  // block and must skip the gzip trailer before the next member's header (it read the
  // trailer as a header: "incorrect header check" on a valid file; found while writing
  // fuzz_gzip_tfrecord, whose reads through restart points check every record).
  const Stream s = frames(80, 21);
  const std::size_t cut = s.plain.size() / 2 + 5;
  const Bytes a = zlib_compress(Bytes(s.plain.begin(), s.plain.begin() + cut), 31);
  Bytes gz = a;
  const Bytes b = zlib_compress(Bytes(s.plain.begin() + cut, s.plain.end()), 31);
  gz.insert(gz.end(), b.begin(), b.end());
  const auto idx = feedline::scan_gzip_tfrecord_bytes(gz.data(), gz.size(), "mem", 65536, true);
  EXPECT_EQ(idx.members, 2u);
  bool straddles = false;  // the case under test: a restart inside member 0 reads into member 1
  for (std::size_t i = 0; i < idx.segment.size(); ++i) {
    const auto seg = static_cast<std::size_t>(idx.segment[i]);
    straddles |= idx.bits[seg] >= 0 && idx.end[seg] > static_cast<std::int64_t>(a.size());
  }
  ASSERT_TRUE(straddles);
  expect_records(gz, idx, s);
  // the trailer itself cut short: an error, not a read past the segment
  for (std::size_t i = 0; i < idx.segment.size(); ++i) {
    const auto seg = static_cast<std::size_t>(idx.segment[i]);
    if (idx.bits[seg] < 0 || idx.end[seg] <= static_cast<std::int64_t>(a.size())) continue;
    const auto start = static_cast<std::size_t>(idx.start[seg]);
    Bytes out(static_cast<std::size_t>(idx.out[seg]));
    const std::uint8_t* win = idx.windows.data() + idx.window[seg] * feedline::kGzipWindow;
    for (std::size_t trailer = 0; trailer < 8; ++trailer) {
      const Bytes part(gz.begin() + static_cast<std::ptrdiff_t>(start),
                       gz.begin() + static_cast<std::ptrdiff_t>(a.size() - 8 + trailer));
      EXPECT_TRUE(feedline::inflate_segment(part.data(), part.size(), idx.bits[seg], win,
                                            out.data(), out.size()))
          << trailer;
    }
    break;
  }
}

TEST(GzipTFRecord, EveryTruncationThrowsCorruptData) {
  const Stream s = frames(12, 3);
  const Bytes gz = zlib_compress(s.plain, 31);
  for (std::size_t cut = 0; cut < gz.size(); cut += (cut < 64 ? 1 : 37)) {
    if (cut == 0) continue;  // an empty file is an empty dataset
    EXPECT_THROW(feedline::scan_gzip_tfrecord_bytes(gz.data(), cut, "cut", 65536, true),
                 feedline::CorruptData)
        << "cut " << cut;
  }
}

TEST(GzipTFRecord, FlippedBitsThrowOrLeaveTheRecordsIntact) {
  const Stream s = frames(8, 4);
  const Bytes gz = zlib_compress(s.plain, 31);
  for (std::size_t i = 0; i < gz.size(); i += 5) {
    Bytes bad = gz;
    bad[i] ^= 0x04;
    try {
      const auto idx =
          feedline::scan_gzip_tfrecord_bytes(bad.data(), bad.size(), "flip", 65536, true);
      expect_records(bad, idx, s);  // e.g. the gzip header's mtime byte
    } catch (const feedline::CorruptData&) {
    }
  }
}

TEST(GzipTFRecord, NotGzipAndTrailingGarbage) {
  const Bytes text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_THROW(feedline::scan_gzip_tfrecord_bytes(text.data(), text.size(), "t", 65536, true),
               feedline::CorruptData);
  const Stream s = frames(3, 5);
  Bytes gz = zlib_compress(s.plain, 31);
  gz.push_back('x');
  EXPECT_THROW(feedline::scan_gzip_tfrecord_bytes(gz.data(), gz.size(), "t", 65536, true),
               feedline::CorruptData);
  const Bytes notrec = zlib_compress(smooth(100, 1), 31);
  EXPECT_THROW(feedline::scan_gzip_tfrecord_bytes(notrec.data(), notrec.size(), "t", 65536, true),
               feedline::CorruptData);
}

TEST(InflateSegment, TruncatedGarbageAndBadArguments) {
  const Stream s = frames(30, 6);
  const Bytes gz = zlib_compress(s.plain, 31);
  Bytes out(s.plain.size());
  ASSERT_FALSE(
      feedline::inflate_segment(gz.data(), gz.size(), -1, nullptr, out.data(), out.size()));
  EXPECT_EQ(out, s.plain);
  for (std::size_t cut = 0; cut < gz.size(); cut += 97)
    EXPECT_TRUE(feedline::inflate_segment(gz.data(), cut, -1, nullptr, out.data(), out.size()));
  Bytes win(feedline::kGzipWindow, 0);
  std::mt19937 rng(9);
  for (int k = 0; k < 100; ++k) {
    Bytes junk(1 + rng() % 2000);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    (void)feedline::inflate_segment(junk.data(), junk.size(), static_cast<int>(rng() % 8),
                                    win.data(), out.data(), out.size());
  }
  EXPECT_TRUE(feedline::inflate_segment(gz.data(), gz.size(), 3, nullptr, out.data(), 10));
  EXPECT_TRUE(feedline::inflate_segment(gz.data(), gz.size(), 9, win.data(), out.data(), 10));
  // the CRC check refuses records that run past the buffer
  const std::int64_t src = static_cast<std::int64_t>(out.size()) - 2, size = 1;
  EXPECT_EQ(feedline::check_tfrecord_crcs(out.data(), out.size(), &src, &size, 1), 0);
}

}  // namespace
