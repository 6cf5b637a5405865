// SPDX-License-Identifier: Apache-2.0
// gzip-compressed TFRecord: a one-pass scan that inflates the file with zlib (Z_BLOCK, so
// it sees deflate block boundaries), parses and CRC-checks the TFRecord frames of the
// decompressed stream and places restart points (zlib's zran technique: compressed
// position, pending bits and the 32 KiB window), and the inflate of one segment from its
// restart point. zlib rather than libdeflate here: restarting mid-stream needs a preset
// dictionary and streaming, which libdeflate does not offer.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <feedline/codecs.hpp>
#include <feedline/detail/bytes.hpp>
#include <feedline/detail/errno_text.hpp>
#include <feedline/errors.hpp>
#include <feedline/unpack.hpp>
#include <functional>

namespace feedline {
namespace {

constexpr std::size_t kOut = std::size_t{256} * 1024;  // output buffer: >= 2 windows
constexpr std::uint64_t kMaxStep = 1u << 30;

using detail::hex;
using detail::load_u32;
using detail::load_u64;

struct Inflater {
  z_stream s{};
  bool live = false;
  explicit Inflater(int window_bits) {
    if (inflateInit2(&s, window_bits) != Z_OK) throw std::bad_alloc();
    live = true;
  }
  ~Inflater() {
    if (live) inflateEnd(&s);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
};

// Reads the compressed file sequentially: fill(buf, n) returns bytes read (0 at the end).
using Fill = std::function<std::size_t(std::uint8_t*, std::size_t, std::uint64_t)>;

// Incremental TFRecord frame parser over the decompressed stream.
class Frames {
 public:
  Frames(GzipTFRecordIndex& idx, const std::string& name, bool verify)
      : idx_(idx), name_(name), verify_(verify) {}

  // Feed output bytes [p, p+n) at stream position pos; `consumed` is the compressed
  // position after the inflate call that produced them (for the segment's end).
  void feed(const std::uint8_t* p, std::size_t n, std::uint64_t pos, std::uint64_t consumed,
            std::uint64_t seg_out_start) {
    while (n) {
      if (state_ == 0) {  // header
        const std::size_t take = std::min<std::size_t>(n, 12 - fill_);
        std::memcpy(hdr_ + fill_, p, take);
        fill_ += take, p += take, n -= take, pos += take;
        if (fill_ < 12) continue;
        const std::uint64_t length = load_u64(hdr_);
        const std::uint32_t stored = load_u32(hdr_ + 8);
        const std::uint32_t actual = masked_crc32c(hdr_, 8);
        if (stored != actual)
          throw CorruptData(name_, consumed,
                            "length CRC mismatch in record " + std::to_string(idx_.at.size()) +
                                " at byte " + std::to_string(pos - 12) +
                                " of the decompressed stream (stored " + hex(stored) +
                                ", computed " + hex(actual) +
                                "): corrupt data or not a TFRecord inside the gzip");
        idx_.segment.push_back(static_cast<std::int32_t>(idx_.start.size() - 1));
        idx_.at.push_back(static_cast<std::int64_t>(pos - seg_out_start));
        idx_.length.push_back(static_cast<std::int64_t>(length));
        left_ = length;
        crc_ = 0;
        fill_ = 0;
        state_ = 1;
        payload_start_ = pos;
        if (left_ == 0) finish_payload(pos, consumed);
      } else if (state_ == 1) {  // payload
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(n, left_));
        if (verify_) crc_ = crc32c(p, take, crc_);
        p += take, n -= take, pos += take, left_ -= take;
        if (left_ == 0) finish_payload(pos, consumed);
      } else {  // footer
        const std::size_t take = std::min<std::size_t>(n, 4 - fill_);
        std::memcpy(hdr_ + fill_, p, take);
        fill_ += take, p += take, n -= take, pos += take;
        if (fill_ < 4) continue;
        const std::uint32_t stored = load_u32(hdr_);
        if (verify_ && stored != mask_crc32c(crc_))
          throw CorruptData(name_, consumed,
                            "data CRC mismatch in record " + std::to_string(idx_.at.size() - 1) +
                                " of " + std::to_string(idx_.length.back()) + " bytes at byte " +
                                std::to_string(payload_start_) +
                                " of the decompressed stream (stored " + hex(stored) +
                                ", computed " + hex(mask_crc32c(crc_)) + ")");
        finish_record(pos, consumed);
        fill_ = 0;
        state_ = 0;
      }
    }
  }

  bool between_records() const { return state_ == 0 && fill_ == 0; }

 private:
  void finish_payload(std::uint64_t, std::uint64_t) {
    fill_ = 0;
    state_ = 2;
  }

  // The record's segment must deliver its payload and the 4-byte CRC after it, so that
  // reads can verify every record they unpack.
  void finish_record(std::uint64_t pos, std::uint64_t consumed) {
    const std::size_t seg = static_cast<std::size_t>(idx_.segment.back());
    const auto need = static_cast<std::int64_t>(pos) - seg_out_[seg];
    idx_.out[seg] = std::max(idx_.out[seg], need);
    idx_.end[seg] = std::max(idx_.end[seg], static_cast<std::int64_t>(consumed));
  }

 public:
  std::vector<std::int64_t> seg_out_;  // stream position of each segment's restart

 private:
  GzipTFRecordIndex& idx_;
  const std::string& name_;
  bool verify_;
  int state_ = 0;
  std::size_t fill_ = 0;
  std::uint8_t hdr_[12]{};
  std::uint64_t left_ = 0;
  std::uint32_t crc_ = 0;
  std::uint64_t payload_start_ = 0;
};

GzipTFRecordIndex scan(const Fill& fill, std::uint64_t size, const std::string& name,
                       std::size_t spacing, std::size_t buffer_bytes, bool verify) {
  GzipTFRecordIndex idx;
  Frames frames(idx, name, verify);
  spacing = std::max<std::size_t>(spacing, 2 * kGzipWindow);
  std::vector<std::uint8_t> in(std::max<std::size_t>(buffer_bytes, 4096));
  std::vector<std::uint8_t> out(kOut);
  std::uint64_t in_base = 0;  // file offset of in[0]
  std::size_t in_len = 0;
  std::uint64_t stream = 0;   // decompressed bytes so far
  std::size_t have = 0;       // bytes of the current member's recent output in `out`
  std::uint64_t seg_out = 0;  // stream position of the current segment's restart
  Inflater z(31);             // gzip wrapper
  auto new_segment = [&](std::uint64_t start, int bits, const std::uint8_t* window) {
    idx.start.push_back(static_cast<std::int64_t>(start));
    idx.end.push_back(static_cast<std::int64_t>(start));
    idx.out.push_back(0);
    idx.bits.push_back(bits);
    if (window) {
      idx.window.push_back(static_cast<std::int32_t>(idx.windows.size() / kGzipWindow));
      idx.windows.insert(idx.windows.end(), window, window + kGzipWindow);
    } else {
      idx.window.push_back(-1);
    }
    frames.seg_out_.push_back(static_cast<std::int64_t>(stream));
    seg_out = stream;
  };
  auto refill = [&]() {
    in_base += in_len;
    in_len = fill(in.data(), in.size(), in_base);
    z.s.next_in = in.data();
    z.s.avail_in = static_cast<uInt>(in_len);
  };
  auto consumed = [&]() { return in_base + static_cast<std::uint64_t>(z.s.next_in - in.data()); };
  if (size == 0) return idx;
  refill();
  if (in_len < 2 || in[0] != 0x1f || in[1] != 0x8b)
    throw CorruptData(name, 0, "not a gzip file (no 1f 8b magic)");
  idx.members = 1;
  new_segment(0, -1, nullptr);
  for (;;) {
    if (z.s.avail_in == 0) {
      refill();
      if (in_len == 0)
        throw CorruptData(name, in_base,
                          "gzip stream truncated: member " + std::to_string(idx.members - 1) +
                              " ends early after " + std::to_string(stream) +
                              " decompressed bytes");
    }
    if (have == out.size()) {  // keep the last window of history
      std::memmove(out.data(), out.data() + have - kGzipWindow, kGzipWindow);
      have = kGzipWindow;
    }
    z.s.next_out = out.data() + have;
    z.s.avail_out = static_cast<uInt>(out.size() - have);
    const int ret = inflate(&z.s, Z_BLOCK);
    const std::size_t produced = out.size() - have - z.s.avail_out;
    const bool starved = ret == Z_BUF_ERROR && (produced || z.s.avail_in == 0);
    if (ret != Z_OK && ret != Z_STREAM_END && !starved)
      throw CorruptData(name, consumed(),
                        std::string("invalid gzip data in member ") +
                            std::to_string(idx.members - 1) + ": " +
                            (z.s.msg ? z.s.msg : ("zlib error " + std::to_string(ret)).c_str()));
    frames.feed(out.data() + have, produced, stream, consumed(), seg_out);
    have += produced;
    stream += produced;
    if (ret == Z_STREAM_END) {
      // another member, or the end of the file
      if (z.s.avail_in == 0) refill();
      if (in_len == 0 && z.s.avail_in == 0) break;
      const std::uint64_t at = consumed();
      // a member header needs its first two bytes in the buffer
      if (z.s.avail_in < 2) {
        const std::size_t keep = z.s.avail_in;
        std::memmove(in.data(), z.s.next_in, keep);
        in_base = at;
        in_len = keep + fill(in.data() + keep, in.size() - keep, at + keep);
        z.s.next_in = in.data();
        z.s.avail_in = static_cast<uInt>(in_len);
      }
      if (z.s.avail_in < 2 || z.s.next_in[0] != 0x1f || z.s.next_in[1] != 0x8b)
        throw CorruptData(name, at,
                          "trailing bytes after gzip member " + std::to_string(idx.members - 1) +
                              " are not gzip");
      if (inflateReset(&z.s) != Z_OK) throw CorruptData(name, at, "zlib inflateReset failed");
      ++idx.members;
      have = 0;
      new_segment(at, -1, nullptr);
      continue;
    }
    // at a deflate block boundary that is not the member's last block: maybe restart here
    if ((z.s.data_type & 128) && !(z.s.data_type & 64) && stream - seg_out >= spacing) {
      std::uint8_t window[kGzipWindow] = {};
      const std::size_t hist = std::min(have, kGzipWindow);
      std::memcpy(window + kGzipWindow - hist, out.data() + have - hist, hist);
      const int bits = z.s.data_type & 7;
      new_segment(consumed() - (bits ? 1 : 0), bits, window);
    }
  }
  if (!frames.between_records())
    throw CorruptData(name, size,
                      "decompressed stream ends inside record " +
                          std::to_string(idx.at.size() - (idx.at.empty() ? 0 : 1)) +
                          ": truncated TFRecord");
  idx.stream_bytes = stream;
  return idx;
}

}  // namespace

GzipTFRecordIndex scan_gzip_tfrecord(const std::string& path, std::size_t spacing,
                                     std::size_t buffer_bytes, bool verify_data) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw StorageFailure(path, 0, errno, std::string("open: ") + detail::errno_text(errno));
  struct Closer {
    explicit Closer(int f) : fd(f) {}
    ~Closer() { ::close(fd); }
    Closer(const Closer&) = delete;
    Closer& operator=(const Closer&) = delete;
    int fd;
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw StorageFailure(path, 0, errno, std::string("fstat: ") + detail::errno_text(errno));
  std::uint64_t reads = 0, bytes = 0;
  Fill fill = [&](std::uint8_t* buf, std::size_t n, std::uint64_t at) -> std::size_t {
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(at + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw StorageFailure(path, at + got, errno,
                             std::string("pread: ") + detail::errno_text(errno));
      }
      ++reads;
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
      bytes += static_cast<std::uint64_t>(r);
    }
    return got;
  };
  GzipTFRecordIndex idx =
      scan(fill, static_cast<std::uint64_t>(st.st_size), path, spacing, buffer_bytes, verify_data);
  idx.reads = reads;
  idx.bytes_read = bytes;
  return idx;
}

GzipTFRecordIndex scan_gzip_tfrecord_bytes(const std::uint8_t* data, std::size_t size,
                                           const std::string& name, std::size_t spacing,
                                           bool verify_data) {
  Fill fill = [&](std::uint8_t* buf, std::size_t n, std::uint64_t at) -> std::size_t {
    if (at >= size) return 0;
    const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(n, size - at));
    std::memcpy(buf, data + at, take);
    return take;
  };
  return scan(fill, size, name, spacing, 1 << 16, verify_data);
}

std::optional<std::string> inflate_segment(const std::uint8_t* in, std::size_t in_size, int bits,
                                           const std::uint8_t* window, std::uint8_t* out,
                                           std::size_t out_size) {
  if (bits < -1 || bits > 7) return "invalid restart point (" + std::to_string(bits) + " bits)";
  if (bits >= 0 && window == nullptr) return "restart point without its window";
  bool raw = bits >= 0;  // from a restart point inside a member: raw deflate, no gzip wrapper
  Inflater z(raw ? -15 : 31);
  std::size_t ip = 0;
  if (bits > 0) {
    if (in_size < 1) return "segment of 0 bytes";
    if (inflatePrime(&z.s, bits, in[0] >> (8 - bits)) != Z_OK) return "zlib inflatePrime failed";
    ip = 1;
  }
  if (bits >= 0 && inflateSetDictionary(&z.s, window, static_cast<uInt>(kGzipWindow)) != Z_OK)
    return "zlib inflateSetDictionary failed";
  std::size_t op = 0;
  while (op < out_size) {
    const std::size_t in_step =
        static_cast<std::size_t>(std::min<std::uint64_t>(in_size - ip, kMaxStep));
    const std::size_t out_step =
        static_cast<std::size_t>(std::min<std::uint64_t>(out_size - op, kMaxStep));
    z.s.next_in = const_cast<Bytef*>(in + ip);
    z.s.avail_in = static_cast<uInt>(in_step);
    z.s.next_out = out + op;
    z.s.avail_out = static_cast<uInt>(out_step);
    const int ret = inflate(&z.s, Z_NO_FLUSH);
    const std::size_t used = in_step - z.s.avail_in;
    const std::size_t made = out_step - z.s.avail_out;
    ip += used;
    op += made;
    if (ret == Z_STREAM_END) {
      if (op >= out_size) break;
      // the member ended: the next one starts after its 8-byte trailer (CRC-32, size).
      // zlib reads and checks the trailer itself when it inflated the member from its
      // header; raw inflate (from a restart point inside the member) stops before it, so
      // skip it here, unchecked (the records' own CRCs are checked after unpacking).
      if (raw) {
        if (in_size - ip < 8)
          return "segment ends inside a gzip member trailer after " + std::to_string(op) + " of " +
                 std::to_string(out_size) + " bytes (truncated)";
        ip += 8;
        raw = false;
      }
      if (inflateReset2(&z.s, 31) != Z_OK) return "zlib inflateReset2 failed";
      if (ip >= in_size)
        return "segment ends after " + std::to_string(op) + " of " + std::to_string(out_size) +
               " bytes (truncated)";
      continue;
    }
    if (ret == Z_OK || (ret == Z_BUF_ERROR && (used || made))) {
      if (!used && !made && ip >= in_size)
        return "segment ends after " + std::to_string(op) + " of " + std::to_string(out_size) +
               " bytes (truncated)";
      continue;
    }
    if (ret == Z_BUF_ERROR)
      return "compressed data ends after " + std::to_string(op) + " of " +
             std::to_string(out_size) + " bytes (truncated segment)";
    return std::string("invalid deflate data at byte ") + std::to_string(ip) +
           " of the segment: " + (z.s.msg ? z.s.msg : "zlib error " + std::to_string(ret));
  }
  return std::nullopt;
}

std::int64_t check_tfrecord_crcs(const std::uint8_t* buf, std::size_t buf_size,
                                 const std::int64_t* src, const std::int64_t* size,
                                 std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    if (src[i] < 0 || size[i] < 0) return static_cast<std::int64_t>(i);
    const auto a = static_cast<std::uint64_t>(src[i]), n = static_cast<std::uint64_t>(size[i]);
    if (a > buf_size || n > buf_size - a || buf_size - a - n < 4)
      return static_cast<std::int64_t>(i);
    if (load_u32(buf + a + n) != masked_crc32c(buf + a, static_cast<std::size_t>(n)))
      return static_cast<std::int64_t>(i);
  }
  return -1;
}

}  // namespace feedline
