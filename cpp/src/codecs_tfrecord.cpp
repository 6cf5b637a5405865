// SPDX-License-Identifier: Apache-2.0
// TFRecord frame scanner. The file is read front to back in large sequential preads
// (default 8 MiB) into one buffer; frames are parsed from the buffer, and payloads larger
// than the buffer are checksummed piece by piece, so memory stays bounded by the buffer
// whatever the record sizes. Trade-off: verifying payload CRCs reads every byte of the
// file once; verify_data=false reads only what the buffer window happens to cover.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <feedline/codecs.hpp>
#include <feedline/detail/bytes.hpp>
#include <feedline/detail/errno_text.hpp>
#include <feedline/errors.hpp>

namespace feedline {
namespace {

constexpr std::uint64_t kHeader = 12;  // u64 length + u32 masked crc of the length
constexpr std::uint64_t kFooter = 4;   // u32 masked crc of the payload

using detail::hex;
using detail::load_u32;
using detail::load_u64;

// Byte source the scanner reads from: a window [start, start+len) of the file.
class Source {
 public:
  Source() = default;
  virtual ~Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  Source(Source&&) = delete;
  Source& operator=(Source&&) = delete;
  // Make [pos, pos+n) available and return a pointer to it. n <= capacity().
  virtual const std::uint8_t* window(std::uint64_t pos, std::size_t n) = 0;
  virtual std::size_t capacity() const = 0;
  std::uint64_t size = 0;
  std::uint64_t reads = 0;
  std::uint64_t bytes_read = 0;
};

class MemorySource final : public Source {
 public:
  MemorySource(const std::uint8_t* data, std::size_t n) : data_(data) { size = n; }
  const std::uint8_t* window(std::uint64_t pos, std::size_t) override { return data_ + pos; }
  std::size_t capacity() const override { return static_cast<std::size_t>(size); }

 private:
  const std::uint8_t* data_;
};

class FileSource final : public Source {
 public:
  FileSource(const std::string& path, std::size_t buffer_bytes) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw StorageFailure(path, 0, errno, std::string("open: ") + detail::errno_text(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      int err = errno;
      ::close(fd_);
      throw StorageFailure(path, 0, err, std::string("fstat: ") + detail::errno_text(err));
    }
    size = static_cast<std::uint64_t>(st.st_size);
    buf_.resize(std::max<std::size_t>(buffer_bytes, 4096));
  }
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  std::size_t capacity() const override { return buf_.size(); }

  const std::uint8_t* window(std::uint64_t pos, std::size_t n) override {
    if (pos >= start_ && pos + n <= start_ + len_) return buf_.data() + (pos - start_);
    // Keep the bytes of the window we already hold, read only what follows them.
    std::size_t keep = 0;
    if (pos >= start_ && pos < start_ + len_) {
      keep = static_cast<std::size_t>(start_ + len_ - pos);
      std::memmove(buf_.data(), buf_.data() + (pos - start_), keep);
    }
    start_ = pos;
    len_ = keep;
    const std::uint64_t want = std::min<std::uint64_t>(buf_.size(), size - pos);
    while (len_ < want) {
      const std::uint64_t at = start_ + len_;
      ssize_t got = ::pread(fd_, buf_.data() + len_, static_cast<std::size_t>(want - len_),
                            static_cast<off_t>(at));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw StorageFailure(path_, at, errno, std::string("pread: ") + detail::errno_text(errno));
      }
      ++reads;
      bytes_read += static_cast<std::uint64_t>(got);
      if (got == 0)
        throw CorruptData(
            path_, at, "file shrank while being scanned (was " + std::to_string(size) + " bytes)");
      len_ += static_cast<std::size_t>(got);
    }
    return buf_.data();
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<std::uint8_t> buf_;
  std::uint64_t start_ = 0;
  std::size_t len_ = 0;
};

TFRecordIndex scan(Source& src, const std::string& name, bool verify_data) {
  TFRecordIndex idx;
  const std::uint64_t size = src.size;
  const std::size_t cap = src.capacity();
  std::uint64_t pos = 0;
  while (pos < size) {
    if (size - pos < kHeader)
      throw CorruptData(name, pos,
                        "truncated record header: " + std::to_string(size - pos) +
                            " bytes left, a header has 12 (record " +
                            std::to_string(idx.offsets.size()) + ")");
    const std::uint8_t* h = src.window(pos, kHeader);
    const std::uint64_t length = load_u64(h);
    const std::uint32_t stored = load_u32(h + 8);
    const std::uint32_t actual = masked_crc32c(h, 8);
    if (stored != actual)
      throw CorruptData(name, pos,
                        "length CRC mismatch in record " + std::to_string(idx.offsets.size()) +
                            " (stored " + hex(stored) + ", computed " + hex(actual) +
                            "): corrupt length field or not a TFRecord file");
    const std::uint64_t payload = pos + kHeader;
    if (length > size - payload || size - payload - length < kFooter)
      throw CorruptData(name, pos,
                        "record " + std::to_string(idx.offsets.size()) + " of " +
                            std::to_string(length) + " bytes extends beyond the end of the file (" +
                            std::to_string(size) + " bytes): truncated file");
    if (verify_data) {
      std::uint32_t crc = 0;
      std::uint64_t done = 0;
      while (done < length) {
        const std::size_t step =
            static_cast<std::size_t>(std::min<std::uint64_t>(cap, length - done));
        crc = crc32c(src.window(payload + done, step), step, crc);
        done += step;
      }
      const std::uint32_t stored_data = load_u32(src.window(payload + length, kFooter));
      if (stored_data != mask_crc32c(crc))
        throw CorruptData(name, payload,
                          "data CRC mismatch in record " + std::to_string(idx.offsets.size()) +
                              " of " + std::to_string(length) + " bytes (stored " +
                              hex(stored_data) + ", computed " + hex(mask_crc32c(crc)) + ")");
    }
    idx.offsets.push_back(static_cast<std::int64_t>(payload));
    idx.lengths.push_back(static_cast<std::int64_t>(length));
    pos = payload + length + kFooter;
  }
  idx.reads = src.reads;
  idx.bytes_read = src.bytes_read;
  return idx;
}

}  // namespace

TFRecordIndex scan_tfrecord(const std::string& path, const TFRecordScanOptions& options) {
  FileSource src(path, options.buffer_bytes);
  return scan(src, path, options.verify_data);
}

TFRecordIndex scan_tfrecord_bytes(const std::uint8_t* data, std::size_t size,
                                  const std::string& name, bool verify_data) {
  MemorySource src(data, size);
  return scan(src, name, verify_data);
}

}  // namespace feedline
