// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the Caffe Datum protobuf parser and the batch decoder. The first two
// bytes choose the expected shape; the rest is split into up to four records.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::int64_t c = 1 + (data[0] & 3), hw = 1 + (data[1] & 7);
  data += 2;
  size -= 2;
  std::vector<float> floats(64);
  try {
    const feedline::DatumInfo d =
        feedline::parse_datum(data, size, "fuzz", floats.data(), floats.size());
    if (d.data_offset + d.data_size > size || d.float_count > floats.size()) __builtin_trap();
  } catch (const feedline::CorruptData&) {
  }
  // The same bytes as a batch: records split at fixed fractions.
  std::vector<std::int64_t> lengths;
  const std::size_t parts = size < 4 ? 1 : 4;
  std::size_t used = 0;
  for (std::size_t k = 0; k < parts; ++k) {
    const std::size_t len = k + 1 == parts ? size - used : size / parts;
    lengths.push_back(static_cast<std::int64_t>(len));
    used += len;
  }
  const std::size_t count = lengths.size();
  const std::size_t row = static_cast<std::size_t>(c * hw * hw);
  for (int payload = 0; payload < 2; ++payload) {
    std::vector<std::uint8_t> out(count * row * (payload ? sizeof(float) : 1));
    std::vector<std::int64_t> labels(count), eoff(count), elen(count);
    std::vector<std::uint8_t> enc(count);
    feedline::DatumBatchSpec spec;
    spec.channels = c;
    spec.height = hw;
    spec.width = hw;
    spec.payload = payload ? feedline::DatumPayload::floats : feedline::DatumPayload::bytes;
    spec.out = out.data();
    spec.labels = labels.data();
    if (payload == 0) {
      spec.encoded = enc.data();
      spec.encoded_offsets = eoff.data();
      spec.encoded_lengths = elen.data();
    }
    const auto fault = feedline::decode_datum_batch(data, size, lengths.data(), count, spec);
    if (!fault && payload == 0) {
      for (std::size_t i = 0; i < count; ++i)
        if (enc[i] &&
            (eoff[i] < 0 || elen[i] < 0 || static_cast<std::size_t>(eoff[i] + elen[i]) > size))
          __builtin_trap();
    }
  }
  return 0;
}
