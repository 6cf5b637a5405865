// SPDX-License-Identifier: Apache-2.0
// Page-cache helpers for cold-cache measurements: evict a file, count its cached bytes.
#include <feedline/detail/errno_text.hpp>
#include <feedline/errors.hpp>
#include <feedline/io_engine.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace feedline {
namespace {

class Fd {
 public:
  explicit Fd(const std::string& path) {
    do {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) fail(path, "open");
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const { return fd_; }

  [[noreturn]] static void fail(const std::string& path, const char* call, int err = errno) {
    throw StorageFailure(path, 0, err, std::string(call) + ": " + detail::errno_text(err));
  }

 private:
  int fd_ = -1;
};

}  // namespace

void evict_page_cache(const std::string& path) {
  const Fd fd(path);
  // Dirty pages cannot be dropped: write them back first. Read-only and some network
  // file systems refuse fdatasync; they have nothing dirty from us anyway.
  (void)::fdatasync(fd.get());
  const int err = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (err != 0) Fd::fail(path, "posix_fadvise(DONTNEED)", err);
}

std::uint64_t resident_bytes(const std::string& path) {
  const Fd fd(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) Fd::fail(path, "fstat");
  if (st.st_size == 0) return 0;
  const auto size = static_cast<std::size_t>(st.st_size);
  // Mapping does not fault pages in; mincore only reports what the cache holds.
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) Fd::fail(path, "mmap");
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  const int rc = ::mincore(p, size, vec.data());
  const int err = errno;
  ::munmap(p, size);
  if (rc != 0) Fd::fail(path, "mincore", err);
  std::uint64_t pages = 0;
  for (unsigned char v : vec) pages += v & 1u;
  const std::uint64_t bytes = pages * page;
  return bytes < size ? bytes : size;
}

}  // namespace feedline
