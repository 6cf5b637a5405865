// SPDX-License-Identifier: Apache-2.0
// Caffe Datum parsing and batch decoding: valid messages in every encoding protobuf
// allows (packed and unpacked floats, negative labels, unknown fields, field order),
// and hostile input: truncations, bad wire types, overlong varints, random garbage.
#include <gtest/gtest.h>

#include <cstring>
#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>
#include <random>
#include <vector>

namespace {

using Bytes = std::vector<std::uint8_t>;

void varint(Bytes& b, std::uint64_t v) {
  while (v >= 0x80) {
    b.push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  b.push_back(static_cast<std::uint8_t>(v));
}
void tag(Bytes& b, int field, int wire) {
  varint(b, static_cast<std::uint64_t>(field) << 3 | wire);
}

Bytes datum(int c, int h, int w, const Bytes& data, std::int32_t label, bool encoded = false) {
  Bytes b;
  tag(b, 1, 0), varint(b, c);
  tag(b, 2, 0), varint(b, h);
  tag(b, 3, 0), varint(b, w);
  tag(b, 4, 2), varint(b, data.size());
  b.insert(b.end(), data.begin(), data.end());
  tag(b, 5, 0), varint(b, static_cast<std::uint64_t>(static_cast<std::int64_t>(label)));
  if (encoded) tag(b, 7, 0), varint(b, 1);
  return b;
}

Bytes pixels(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  Bytes p(n);
  for (auto& x : p) x = static_cast<std::uint8_t>(rng());
  return p;
}

}  // namespace

TEST(Datum, ParsesFields) {
  const Bytes px = pixels(3 * 4 * 5, 1);
  const Bytes rec = datum(3, 4, 5, px, 7);
  auto d = feedline::parse_datum(rec.data(), rec.size(), "r");
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.height, 4);
  EXPECT_EQ(d.width, 5);
  EXPECT_EQ(d.label, 7);
  EXPECT_FALSE(d.encoded);
  ASSERT_EQ(d.data_size, px.size());
  EXPECT_EQ(0, std::memcmp(rec.data() + d.data_offset, px.data(), px.size()));
}

TEST(Datum, NegativeLabelIsTenByteVarint) {
  const Bytes rec = datum(1, 1, 1, {9}, -5);
  auto d = feedline::parse_datum(rec.data(), rec.size(), "r");
  EXPECT_EQ(d.label, -5);
}

TEST(Datum, UnknownFieldsAreSkippedAndOrderIsFree) {
  Bytes rec;
  tag(rec, 5, 0), varint(rec, 2);
  tag(rec, 9, 2), varint(rec, 3), rec.insert(rec.end(), {1, 2, 3});
  tag(rec, 10, 1), rec.insert(rec.end(), 8, 0xab);
  tag(rec, 11, 5), rec.insert(rec.end(), 4, 0xcd);
  tag(rec, 12, 0), varint(rec, 300);
  tag(rec, 4, 2), varint(rec, 2), rec.insert(rec.end(), {4, 5});
  tag(rec, 3, 0), varint(rec, 2);
  tag(rec, 2, 0), varint(rec, 1);
  tag(rec, 1, 0), varint(rec, 1);
  auto d = feedline::parse_datum(rec.data(), rec.size(), "r");
  EXPECT_EQ(d.label, 2);
  EXPECT_EQ(d.width, 2);
  EXPECT_EQ(d.data_size, 2u);
}

TEST(Datum, FloatDataPackedAndUnpacked) {
  const float vals[4] = {1.5f, -2.0f, 3.25f, 0.0f};
  for (bool packed : {false, true}) {
    Bytes rec;
    tag(rec, 1, 0), varint(rec, 1);
    tag(rec, 2, 0), varint(rec, 2);
    tag(rec, 3, 0), varint(rec, 2);
    if (packed) {
      tag(rec, 6, 2), varint(rec, 16);
      const auto* p = reinterpret_cast<const std::uint8_t*>(vals);
      rec.insert(rec.end(), p, p + 16);
    } else {
      for (float v : vals) {
        tag(rec, 6, 5);
        const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
        rec.insert(rec.end(), p, p + 4);
      }
    }
    float out[4] = {};
    auto d = feedline::parse_datum(rec.data(), rec.size(), "f", out, 4);
    EXPECT_EQ(d.float_count, 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], vals[i]);
    float small[3];
    EXPECT_THROW(feedline::parse_datum(rec.data(), rec.size(), "f", small, 3),
                 feedline::CorruptData);
  }
}

TEST(Datum, HostileInputsAreCorruptData) {
  std::vector<Bytes> bad;
  Bytes b;
  tag(b, 4, 2), varint(b, 1000), b.push_back(1);  // length beyond the record
  bad.push_back(b);
  b.clear(), tag(b, 1, 2), varint(b, 0);  // channels with wrong wire type
  bad.push_back(b);
  b.clear(), tag(b, 9, 3);  // group wire type
  bad.push_back(b);
  b.clear(), tag(b, 9, 7);  // invalid wire type
  bad.push_back(b);
  b.clear(), b.push_back(0);  // field number 0
  bad.push_back(b);
  b.clear(), tag(b, 1, 0), b.insert(b.end(), 11, 0xff);  // varint longer than 10 bytes
  bad.push_back(b);
  b.clear(), tag(b, 1, 0), varint(b, ~std::uint64_t{0});  // negative channels
  bad.push_back(b);
  b.clear(), tag(b, 5, 0), varint(b, std::uint64_t{1} << 40);  // label outside int32
  bad.push_back(b);
  b.clear(), tag(b, 7, 0), varint(b, 2);  // bool that is not 0/1
  bad.push_back(b);
  b.clear(), tag(b, 6, 2), varint(b, 3), b.insert(b.end(), {1, 2, 3});  // packed floats % 4
  bad.push_back(b);
  b.clear(), tag(b, 10, 1), b.insert(b.end(), 3, 0);  // truncated fixed64
  bad.push_back(b);
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_THROW(feedline::parse_datum(bad[i].data(), bad[i].size(), "bad"), feedline::CorruptData)
        << i;
  }
}

TEST(Datum, EveryTruncationIsCorrupt) {
  const Bytes rec = datum(2, 3, 3, pixels(18, 2), -1);
  int errors = 0;
  for (std::size_t cut = 0; cut < rec.size(); ++cut) {
    try {
      feedline::parse_datum(rec.data(), cut, "t");
    } catch (const feedline::CorruptData& e) {
      ++errors;
      EXPECT_LE(e.offset, cut);
    }
  }
  // Cutting exactly between fields yields a shorter valid message; all others fail.
  EXPECT_GE(errors, static_cast<int>(rec.size()) - 6);
}

TEST(Datum, RandomGarbageNeverCrashes) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20000; ++trial) {
    Bytes g(rng() % 64);
    for (auto& x : g) x = static_cast<std::uint8_t>(rng());
    float fl[8];
    try {
      feedline::parse_datum(g.data(), g.size(), "g", fl, 8);
    } catch (const feedline::CorruptData&) {
    }
  }
}

TEST(Datum, BatchDecode) {
  const int c = 3, h = 2, w = 2, n = 5;
  Bytes raw;
  std::vector<std::int64_t> lengths;
  std::vector<Bytes> px;
  for (int i = 0; i < n; ++i) {
    px.push_back(pixels(c * h * w, 10 + i));
    Bytes r = datum(c, h, w, px.back(), i - 2);
    lengths.push_back(static_cast<std::int64_t>(r.size()));
    raw.insert(raw.end(), r.begin(), r.end());
  }
  Bytes out(n * c * h * w);
  std::vector<std::int64_t> labels(n), eoff(n), elen(n);
  std::vector<std::uint8_t> enc(n, 9);
  feedline::DatumBatchSpec spec{
      c,          h,           w,          feedline::DatumPayload::bytes, out.data(), labels.data(),
      enc.data(), eoff.data(), elen.data()};
  auto fault = feedline::decode_datum_batch(raw.data(), raw.size(), lengths.data(), n, spec);
  ASSERT_FALSE(fault.has_value()) << fault->reason;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(labels[i], i - 2);
    EXPECT_EQ(enc[i], 0);
    EXPECT_EQ(0, std::memcmp(out.data() + i * c * h * w, px[i].data(), c * h * w));
  }
}

TEST(Datum, BatchFaultsNameTheSample) {
  const int n = 4;
  Bytes raw;
  std::vector<std::int64_t> lengths;
  for (int i = 0; i < n; ++i) {
    Bytes r = i == 2 ? datum(1, 2, 3, pixels(6, 1), 0) : datum(1, 2, 2, pixels(4, 1), 0);
    lengths.push_back(static_cast<std::int64_t>(r.size()));
    raw.insert(raw.end(), r.begin(), r.end());
  }
  Bytes out(n * 4);
  std::vector<std::int64_t> labels(n);
  feedline::DatumBatchSpec spec{1, 2, 2, feedline::DatumPayload::bytes, out.data(), labels.data()};
  auto fault = feedline::decode_datum_batch(raw.data(), raw.size(), lengths.data(), n, spec);
  ASSERT_TRUE(fault.has_value());
  EXPECT_EQ(fault->sample, 2);
  EXPECT_NE(fault->reason.find("shape"), std::string::npos);

  // Lengths that overrun the buffer are a fault, not an overread.
  lengths[3] += 100;
  fault = feedline::decode_datum_batch(raw.data(), raw.size(), lengths.data(), n, spec);
  ASSERT_TRUE(fault.has_value());

  // Encoded Datums are reported to the caller (who decodes the image) or refused.
  Bytes e = datum(0, 0, 0, {0x89, 'P', 'N', 'G'}, 3, true);
  std::int64_t elen_in = static_cast<std::int64_t>(e.size());
  std::uint8_t one[4];
  std::int64_t lab = 0, eo = 0, el = 0;
  std::uint8_t flag = 0;
  feedline::DatumBatchSpec espec{1,     2,   2,  feedline::DatumPayload::bytes, one, &lab,
                                 &flag, &eo, &el};
  ASSERT_FALSE(feedline::decode_datum_batch(e.data(), e.size(), &elen_in, 1, espec).has_value());
  EXPECT_EQ(flag, 1);
  EXPECT_EQ(lab, 3);
  EXPECT_EQ(el, 4);
  EXPECT_EQ(e[eo], 0x89);
  espec.encoded = nullptr;
  EXPECT_TRUE(feedline::decode_datum_batch(e.data(), e.size(), &elen_in, 1, espec).has_value());
}
