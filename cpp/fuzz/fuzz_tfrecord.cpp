// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: TFRecord framing (length, masked CRCs, payloads) from memory and,
// with a small buffer, through the pread scanner.
#include <cstddef>
#include <cstdint>

#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>

#include "fuzz_file.hpp"

namespace {
void check(const feedline::TFRecordIndex& idx, std::size_t size) {
  if (idx.offsets.size() != idx.lengths.size()) __builtin_trap();
  for (std::size_t i = 0; i < idx.offsets.size(); ++i) {
    if (idx.offsets[i] < 12 || idx.lengths[i] < 0 ||
        static_cast<std::uint64_t>(idx.offsets[i] + idx.lengths[i]) + 4 > size)
      __builtin_trap();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  for (bool verify : {true, false}) {
    try {
      check(feedline::scan_tfrecord_bytes(data, size, "fuzz", verify), size);
    } catch (const feedline::CorruptData&) {
    }
  }
  static feedline::fuzz::MemFile file;
  const std::string& path = file.set(data, size);
  try {
    feedline::TFRecordScanOptions opt;
    opt.buffer_bytes = 64;
    check(feedline::scan_tfrecord(path, opt), size);
  } catch (const feedline::CorruptData&) {
  }
  return 0;
}
