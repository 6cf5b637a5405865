// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the breadth-first LMDB indexer (meta pages, branch/leaf pages, node
// pointers, overflow runs, the free-page tree) on arbitrary file contents. Any input must
// either index or raise a typed error; ASan/UBSan report everything else.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <feedline/errors.hpp>
#include <feedline/lmdb.hpp>

#include "fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static feedline::fuzz::MemFile file;
  const std::string& path = file.set(data, size);
  for (int variant = 0; variant < 2; ++variant) {
    feedline::lmdb::IndexOptions opt;
    opt.max_read_bytes = variant ? 4096 : 1 << 20;
    opt.verify_overflow = variant == 1;
    opt.check_pages = variant == 0;
    try {
      const auto idx = feedline::lmdb::index_lmdb(path, opt);
      // Every reported extent lies inside the file and keys are consistent.
      if (idx.offsets.size() != idx.lengths.size()) __builtin_trap();
      if (idx.key_starts.size() != idx.offsets.size() + 1) __builtin_trap();
      for (std::size_t i = 0; i < idx.offsets.size(); ++i) {
        if (idx.offsets[i] < 0 || idx.lengths[i] < 0 ||
            static_cast<std::uint64_t>(idx.offsets[i] + idx.lengths[i]) > size)
          __builtin_trap();
      }
      if (idx.key_starts.back() != static_cast<std::int64_t>(idx.key_blob.size())) __builtin_trap();
    } catch (const feedline::CorruptData&) {
    } catch (const feedline::Unsupported&) {
    }
  }
  return 0;
}
