// SPDX-License-Identifier: Apache-2.0
#include <feedline/detail/errno_text.hpp>
#include <feedline/detail/io_files.hpp>
#include <feedline/errors.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace feedline::detail {
namespace {

int open_retrying(const std::string& path, int flags) {
  for (;;) {
    const int fd = ::open(path.c_str(), flags | O_RDONLY | O_CLOEXEC);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

[[noreturn]] void throw_errno(const std::string& path, int err, const char* call) {
  throw StorageFailure(path, 0, err, std::string(call) + ": " + detail::errno_text(err));
}

// The alignment O_DIRECT needs, as the file system reports it (Linux >= 6.1); zero
// means "not reported" or, with the mask bit set, "direct I/O unsupported here".
struct DioAlign {
  bool reported = false;
  std::size_t offset = 0;
  std::size_t mem = 0;
};

DioAlign query_dio_align(int fd) {
  DioAlign out;
#if defined(STATX_DIOALIGN)
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    out.reported = true;
    out.offset = sx.stx_dio_offset_align;
    out.mem = sx.stx_dio_mem_align;
  }
#else
  (void)fd;
#endif
  return out;
}

}  // namespace

FileTable::FileTable(std::vector<std::string> paths, std::size_t alignment_override)
    : paths_(std::move(paths)), alignment_override_(alignment_override),
      slots_(std::make_unique<Slot[]>(paths_.size())) {}

FileTable::~FileTable() { close_all(); }

std::size_t FileTable::check(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= paths_.size()) {
    throw std::out_of_range("file_id " + std::to_string(id) + " outside the file table (" +
                            std::to_string(paths_.size()) + " files)");
  }
  return static_cast<std::size_t>(id);
}

int FileTable::buffered_fd(std::int32_t id) {
  Slot& s = slots_[check(id)];
  int fd = s.fd.load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  std::lock_guard lock(s.mutex);
  fd = s.fd.load(std::memory_order_relaxed);
  if (fd >= 0) return fd;
  fd = open_retrying(paths_[id], 0);
  if (fd < 0) throw_errno(paths_[id], errno, "open");
  if (random_access_) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // advice only
  s.fd.store(fd, std::memory_order_release);
  return fd;
}

FileTable::Direct FileTable::direct(std::int32_t id) {
  Slot& s = slots_[check(id)];
  Direct d;
  if (s.direct_state.load(std::memory_order_acquire) == kRefused) return d;
  int fd = s.dfd.load(std::memory_order_acquire);
  if (fd < 0) {
    std::lock_guard lock(s.mutex);
    if (s.direct_state.load(std::memory_order_relaxed) == kRefused) return d;
    fd = s.dfd.load(std::memory_order_relaxed);
    if (fd < 0) {
      fd = open_retrying(paths_[id], O_DIRECT);
      if (fd < 0) {
        const int err = errno;
        if (err != EINVAL) throw_errno(paths_[id], err, "open(O_DIRECT)");
        s.direct_state.store(kRefused, std::memory_order_release);
        return d;
      }
      const DioAlign dio = query_dio_align(fd);
      if (dio.reported && dio.offset == 0) {  // the file system says: no direct I/O here
        ::close(fd);
        s.direct_state.store(kRefused, std::memory_order_release);
        return d;
      }
      if (alignment_override_ != 0) {
        s.offset_align = s.mem_align = alignment_override_;
      } else if (dio.reported) {
        s.offset_align = dio.offset;
        s.mem_align = dio.mem != 0 ? dio.mem : dio.offset;
      }
      s.dfd.store(fd, std::memory_order_release);
    }
  }
  d.fd = fd;
  d.offset_align = s.offset_align;
  d.mem_align = s.mem_align;
  return d;
}

void FileTable::refuse_direct(std::int32_t id) noexcept {
  slots_[static_cast<std::size_t>(id)].direct_state.store(kRefused, std::memory_order_release);
}

void FileTable::confirm_direct(std::int32_t id) noexcept {
  int expected = kUnknown;
  slots_[static_cast<std::size_t>(id)].direct_state.compare_exchange_strong(
      expected, kConfirmed, std::memory_order_acq_rel);
}

bool FileTable::direct_confirmed(std::int32_t id) const noexcept {
  return slots_[static_cast<std::size_t>(id)].direct_state.load(std::memory_order_acquire) ==
         kConfirmed;
}

FileTable::Mapping FileTable::mapping(std::int32_t id) {
  Slot& s = slots_[check(id)];
  if (!s.mapped.load(std::memory_order_acquire)) {
    const int fd = buffered_fd(id);
    std::lock_guard lock(s.mutex);
    if (!s.mapped.load(std::memory_order_relaxed)) {
      struct stat st {};
      if (::fstat(fd, &st) != 0) throw_errno(paths_[id], errno, "fstat");
      const auto size = static_cast<std::size_t>(st.st_size);
      if (size > 0) {
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) throw_errno(paths_[id], errno, "mmap");
        s.map_base = static_cast<const unsigned char*>(p);
      }
      s.map_size = size;
      s.mapped.store(true, std::memory_order_release);
    }
  }
  return Mapping{s.map_base, s.map_size};
}

FileMode FileTable::mode(std::int32_t id) const {
  const Slot& s = slots_[check(id)];
  if (s.mapped.load(std::memory_order_acquire)) return FileMode::mapped;
  if (s.direct_state.load(std::memory_order_acquire) == kRefused) return FileMode::fallback;
  if (s.dfd.load(std::memory_order_acquire) >= 0) return FileMode::direct;
  if (s.fd.load(std::memory_order_acquire) >= 0) return FileMode::buffered;
  return FileMode::unopened;
}

void FileTable::close_all() noexcept {
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    Slot& s = slots_[i];
    std::lock_guard lock(s.mutex);
    if (s.map_base != nullptr) {
      ::munmap(const_cast<unsigned char*>(s.map_base), s.map_size);
      s.map_base = nullptr;
    }
    s.map_size = 0;
    s.mapped.store(false, std::memory_order_release);
    if (const int fd = s.dfd.exchange(-1); fd >= 0) ::close(fd);
    if (const int fd = s.fd.exchange(-1); fd >= 0) ::close(fd);
  }
}

}  // namespace feedline::detail
