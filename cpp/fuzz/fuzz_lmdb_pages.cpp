// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: page-level LMDB access (meta selection, read_page on every page
// number the meta allows, cursor walks to the first, a middle and the last record).
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <feedline/errors.hpp>
#include <feedline/lmdb.hpp>

#include "fuzz_file.hpp"

namespace L = feedline::lmdb;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static feedline::fuzz::MemFile file;
  const std::string& path = file.set(data, size);
  try {
    L::LmdbFile f(path);
    const L::Meta& m = f.meta();
    const std::uint64_t last = m.last_pgno < 16 ? m.last_pgno : 16;
    for (std::uint64_t pg = 0; pg <= last + 1; ++pg) {
      try {
        const L::Page p = f.read_page(pg);
        for (const L::Node& n : p.nodes) {
          if (static_cast<std::uint64_t>(n.key_pos) + n.key_size > p.bytes.size()) __builtin_trap();
          if (p.kind == L::PageKind::leaf && n.overflow_pgno == 0 &&
              n.value_offset + n.value_length > size)
            __builtin_trap();
        }
      } catch (const feedline::CorruptData&) {
      }
    }
    const std::uint64_t n = m.main_db.entries;
    for (std::uint64_t i : {std::uint64_t{0}, n ? n - 1 : 0, n}) {
      try {
        const L::SeekResult r = f.seek(i);
        if (r.value_offset + r.value_length > size) __builtin_trap();
        try {
          (void)f.advance(r.cursor, 1);
        } catch (const feedline::CorruptData&) {
        }
      } catch (const feedline::CorruptData&) {
      } catch (const std::out_of_range&) {
      }
    }
  } catch (const feedline::CorruptData&) {
  } catch (const feedline::Unsupported&) {
  }
  return 0;
}
