// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: gzip-compressed TFRecord files. The one-pass scan that builds the
// restart points (from memory with CRCs on, and through the pread scanner with its
// smallest buffer and CRCs off), then random access: every segment that holds records is
// inflated from its restart point (member start, or pending bits + 32 KiB window) and
// every record is checked against its TFRecord CRC. Any input must scan or raise
// CorruptData; a file the scan accepted must be readable through every restart point.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <feedline/codecs.hpp>
#include <feedline/errors.hpp>
#include <feedline/unpack.hpp>

#include "fuzz_file.hpp"

namespace {

using feedline::GzipTFRecordIndex;
using feedline::kGzipWindow;

constexpr std::uint64_t kReadBudget = std::uint64_t{64} << 20;  // bytes inflated per input

// The index is self-consistent and every extent lies inside the file.
void check(const GzipTFRecordIndex& idx, std::size_t size) {
  const std::size_t nseg = idx.start.size();
  if (idx.end.size() != nseg || idx.out.size() != nseg || idx.bits.size() != nseg ||
      idx.window.size() != nseg)
    __builtin_trap();
  if (idx.windows.size() % kGzipWindow != 0) __builtin_trap();
  const std::size_t nwin = idx.windows.size() / kGzipWindow;
  std::size_t with_window = 0;
  for (std::size_t s = 0; s < nseg; ++s) {
    if (idx.start[s] < 0 || idx.start[s] > idx.end[s] ||
        static_cast<std::uint64_t>(idx.end[s]) > size || idx.out[s] < 0)
      __builtin_trap();
    if (idx.bits[s] < -1 || idx.bits[s] > 7) __builtin_trap();
    if ((idx.bits[s] == -1) != (idx.window[s] == -1)) __builtin_trap();
    if (idx.window[s] >= 0) {
      if (static_cast<std::size_t>(idx.window[s]) != with_window) __builtin_trap();
      ++with_window;
    }
    if (static_cast<std::uint64_t>(idx.out[s]) > idx.stream_bytes) __builtin_trap();
  }
  if (with_window != nwin) __builtin_trap();
  const std::size_t n = idx.segment.size();
  if (idx.at.size() != n || idx.length.size() != n) __builtin_trap();
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t s = idx.segment[i];
    if (s < 0 || static_cast<std::size_t>(s) >= nseg) __builtin_trap();
    if (i > 0 && s < idx.segment[i - 1]) __builtin_trap();
    if (idx.at[i] < 0 || idx.length[i] < 0 ||
        static_cast<std::uint64_t>(idx.at[i]) + static_cast<std::uint64_t>(idx.length[i]) + 4 >
            static_cast<std::uint64_t>(idx.out[static_cast<std::size_t>(s)]))
      __builtin_trap();
  }
  if (nseg && idx.members == 0) __builtin_trap();
}

// Read every record through its segment, as the Loader does: the segment must inflate
// (the scan inflated the same bytes) and, when the scan checked the payload CRCs, every
// record must match its CRC again.
void read_records(const GzipTFRecordIndex& idx, const std::uint8_t* data, bool crcs) {
  std::uint64_t budget = kReadBudget;
  bool truncated_once = false;
  for (std::size_t i = 0; i < idx.segment.size();) {
    const auto s = static_cast<std::size_t>(idx.segment[i]);
    std::size_t j = i;
    while (j < idx.segment.size() && static_cast<std::size_t>(idx.segment[j]) == s) ++j;
    const auto out_size = static_cast<std::size_t>(idx.out[s]);
    if (out_size > budget) return;
    budget -= out_size;
    const std::uint8_t* in = data + idx.start[s];
    const auto in_size = static_cast<std::size_t>(idx.end[s] - idx.start[s]);
    const std::uint8_t* window =
        idx.window[s] >= 0 ? idx.windows.data() + idx.window[s] * kGzipWindow : nullptr;
    // exact-size copies, so ASan sees a read or write past either
    const std::unique_ptr<std::uint8_t[]> seg(new std::uint8_t[in_size]);
    if (in_size) std::memcpy(seg.get(), in, in_size);
    const std::unique_ptr<std::uint8_t[]> out(new std::uint8_t[out_size]);
    const auto err =
        feedline::inflate_segment(seg.get(), in_size, idx.bits[s], window, out.get(), out_size);
    if (err) __builtin_trap();  // a segment the scan read could not be read again
    if (crcs && feedline::check_tfrecord_crcs(out.get(), out_size, idx.at.data() + i,
                                              idx.length.data() + i, j - i) != -1)
      __builtin_trap();  // bytes through the restart point differ from the scan's
    if (!truncated_once && in_size > 1 && out_size > 0) {  // the same segment cut short
      truncated_once = true;
      (void)feedline::inflate_segment(seg.get(), in_size / 2, idx.bits[s], window, out.get(),
                                      out_size);
    }
    i = j;
  }
}

bool same_records(const GzipTFRecordIndex& a, const GzipTFRecordIndex& b) {
  return a.segment == b.segment && a.at == b.at && a.length == b.length && a.start == b.start &&
         a.bits == b.bits && a.out == b.out && a.windows == b.windows && a.members == b.members &&
         a.stream_bytes == b.stream_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  GzipTFRecordIndex mem;
  bool scanned = false;
  try {
    mem = feedline::scan_gzip_tfrecord_bytes(data, size, "fuzz", 0, true);  // 64 KiB spacing
    check(mem, size);
    scanned = true;
  } catch (const feedline::CorruptData&) {
  }
  // The pread scanner with a 4 KiB buffer (refills inside members and member headers),
  // payload CRCs off: accepts at least what the checked scan accepted, with the same
  // records and restart points.
  static feedline::fuzz::MemFile file;
  const std::string& path = file.set(data, size);
  try {
    const GzipTFRecordIndex pread = feedline::scan_gzip_tfrecord(path, 0, 4096, false);
    check(pread, size);
    if (scanned && !same_records(mem, pread)) __builtin_trap();
    if (!scanned) read_records(pread, data, false);
  } catch (const feedline::CorruptData&) {
    if (scanned) __builtin_trap();
  }
  if (scanned) read_records(mem, data, true);
  // The bytes after a 10-byte gzip header as raw deflate from a restart point with
  // arbitrary pending bits and an empty window.
  if (size > 10) {
    static const std::vector<std::uint8_t> zeros(kGzipWindow, 0);
    std::vector<std::uint8_t> out(4096);
    (void)feedline::inflate_segment(data + 10, size - 10, data[size - 1] & 7, zeros.data(),
                                    out.data(), out.size());
  }
  return 0;
}
