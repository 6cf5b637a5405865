// SPDX-License-Identifier: Apache-2.0
// The engine: submissions are cut into tasks at submit time; threads claim tasks in FIFO
// order under one mutex (a task is at least a few hundred KiB of reads, so the lock is
// cold) and report counters into the submission and the engine with atomics.
#include <feedline/detail/io_files.hpp>
#include <feedline/detail/io_posix.hpp>
#include <feedline/errors.hpp>
#include <feedline/io_engine.hpp>

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace feedline {

namespace {
using Clock = std::chrono::steady_clock;

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

std::uint64_t elapsed_ns(Clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

std::size_t round_down(std::size_t x, std::size_t a) { return x / a * a; }
std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// Counters shared by a submission and the engine, added to by many threads.
struct Counters {
  std::atomic<std::uint64_t> bytes{0}, storage_bytes{0}, bounced_bytes{0}, ops{0}, extents{0},
      tasks{0}, retries{0}, minor_faults{0}, major_faults{0}, busy_ns{0};

  void fill(IoStats& s) const {
    s.bytes = bytes.load(std::memory_order_relaxed);
    s.storage_bytes = storage_bytes.load(std::memory_order_relaxed);
    s.bounced_bytes = bounced_bytes.load(std::memory_order_relaxed);
    s.ops = ops.load(std::memory_order_relaxed);
    s.extents = extents.load(std::memory_order_relaxed);
    s.tasks = tasks.load(std::memory_order_relaxed);
    s.retries = retries.load(std::memory_order_relaxed);
    s.minor_faults = minor_faults.load(std::memory_order_relaxed);
    s.major_faults = major_faults.load(std::memory_order_relaxed);
    s.busy_s = seconds(busy_ns.load(std::memory_order_relaxed));
  }
};

/// What one task did, added to both counters when it ends.
struct TaskTally {
  std::uint64_t bytes = 0, storage_bytes = 0, bounced_bytes = 0, extents = 0, minor = 0, major = 0,
                busy_ns = 0;
};

void add(Counters& c, const TaskTally& t, const detail::ReadContext& rc, bool count_retries) {
  c.bytes.fetch_add(t.bytes, std::memory_order_relaxed);
  c.storage_bytes.fetch_add(t.storage_bytes, std::memory_order_relaxed);
  c.bounced_bytes.fetch_add(t.bounced_bytes, std::memory_order_relaxed);
  c.ops.fetch_add(rc.ops, std::memory_order_relaxed);
  c.extents.fetch_add(t.extents, std::memory_order_relaxed);
  c.tasks.fetch_add(1, std::memory_order_relaxed);
  if (count_retries) c.retries.fetch_add(rc.retries, std::memory_order_relaxed);
  c.minor_faults.fetch_add(t.minor, std::memory_order_relaxed);
  c.major_faults.fetch_add(t.major, std::memory_order_relaxed);
  c.busy_ns.fetch_add(t.busy_ns, std::memory_order_relaxed);
}

/// Largest read through a thread's bounce buffer (an unaligned O_DIRECT extent is read
/// in pieces of this size): the buffer, and so each engine thread's memory, stays under it.
constexpr std::size_t kBounceBytes = std::size_t{1} << 20;

/// A transparent huge page: a staging buffer (IoOptions::stage) is aligned to it and
/// advised to use them, so that one read into it is one device request.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

/// Largest read through a thread's staging buffer: two huge pages, so that a tile of
/// 2 MiB widened by a block at either end is still one read.
constexpr std::size_t kStageBytes = 2 * kHugePage;

/// An aligned scratch buffer that remembers which bytes of which file it holds.
class Bounce {
 public:
  Bounce() = default;
  Bounce(const Bounce&) = delete;
  Bounce& operator=(const Bounce&) = delete;
  ~Bounce() { std::free(data_); }

  /// @p huge: on whole huge pages (a staging buffer), else on @p align.
  unsigned char* reserve(std::size_t bytes, std::size_t align, bool huge = false) {
    align = std::max<std::size_t>(align, huge ? kHugePage : 4096);
    if (bytes > capacity_ || align > align_) {
      std::free(data_);
      align_ = std::max(align, align_);  // the size must be a multiple of the alignment
      capacity_ = round_up(std::max(bytes, capacity_), align_);
      data_ = static_cast<unsigned char*>(std::aligned_alloc(align_, capacity_));
      if (data_ == nullptr) {
        capacity_ = 0;
        throw std::bad_alloc();
      }
      if (huge) (void)::madvise(data_, capacity_, MADV_HUGEPAGE);  // advice: may be refused
    }
    forget();
    return data_;
  }
  void hold(std::int32_t file, std::int64_t lo, std::int64_t hi) {
    file_ = file, lo_ = lo, hi_ = hi;
  }
  void forget() { file_ = -1; }
  /// Bytes [offset, offset + length) of @p file if held, else null.
  const unsigned char* find(std::int32_t file, std::int64_t offset, std::int64_t length) const {
    if (file != file_ || offset < lo_ || offset + length > hi_) return nullptr;
    return data_ + (offset - lo_);
  }

 private:
  unsigned char* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t align_ = 0;
  std::int32_t file_ = -1;
  std::int64_t lo_ = 0, hi_ = 0;
};

struct RusageNow {
  std::uint64_t minor = 0, major = 0;
  RusageNow() {
    struct rusage ru {};
    if (::getrusage(RUSAGE_THREAD, &ru) == 0) {
      minor = static_cast<std::uint64_t>(ru.ru_minflt);
      major = static_cast<std::uint64_t>(ru.ru_majflt);
    }
  }
};

// The end of the file for an error message: fstat's size when it explains the short
// read, otherwise where the read stopped (the file changed under us).
std::int64_t end_of_file(int fd, std::int64_t stopped) {
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_size <= stopped) return st.st_size;
  return stopped;
}

[[noreturn]] void throw_past_eof(const std::string& path, std::int64_t offset, std::int64_t length,
                                 std::int64_t eof) {
  throw CorruptData(path, static_cast<std::uint64_t>(eof),
                    "the file ends at byte " + std::to_string(eof) + ", inside the extent of " +
                        std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                        " (the index promised bytes the file does not have)");
}

}  // namespace

namespace detail {

/// One read of at most chunk_bytes: a whole small extent or a chunk of a large one.
struct Piece {
  std::int32_t file;
  std::int64_t offset;
  std::int64_t length;
  unsigned char* dest;
  bool first;  ///< the first piece of its extent (counts the extent)
};

struct Submission {
  std::vector<Piece> pieces;
  std::vector<std::size_t> task_begin;  ///< task t = pieces [task_begin[t], task_begin[t+1])
  std::size_t next_task = 0;            ///< guarded by the engine's queue mutex
  std::atomic<std::size_t> remaining{0};
  std::atomic<bool> failed{false};
  Counters counters;
  Clock::time_point start = Clock::now();

  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  IoStats result;
  std::exception_ptr error;

  [[nodiscard]] std::size_t num_tasks() const { return task_begin.size() - 1; }

  void fail(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!error) error = std::move(e);
    failed.store(true, std::memory_order_release);
  }
};

struct EngineState {
  IoOptions options;
  FileTable files;
  Counters counters;

  std::mutex queue_mutex;
  std::condition_variable queue_cv;
  std::deque<std::shared_ptr<Submission>> queue;
  bool stopping = false;
  std::vector<std::thread> threads;

  std::mutex close_mutex;
  std::atomic<bool> closed{false};

  mutable std::mutex wall_mutex;  ///< guards the in-flight wall clock below
  std::size_t inflight = 0;
  Clock::time_point busy_since{};
  std::uint64_t wall_ns = 0;
  std::uint64_t submissions = 0;

  EngineState(std::vector<std::string> paths, const IoOptions& opts)
      : options(opts), files(std::move(paths), opts.alignment) {
    files.set_random_access(opts.method == IoMethod::pread_random);
  }

  void worker();
  void run_task(Submission& s, std::size_t task, Bounce& bounce);
  void read_piece(const Piece& p, Bounce& bounce, ReadContext& rc, TaskTally& tally);
  void read_direct(const Piece& p, Bounce& bounce, ReadContext& rc, TaskTally& tally);
  void read_buffered(const Piece& p, ReadContext& rc, TaskTally& tally);
  void finish(Submission& s);
  void started();
};

void EngineState::worker() {
  // Named so that a thread list (/proc/<pid>/task/*/comm, gdb, top -H) tells the
  // engine's threads apart from the interpreter's and other libraries'.
  ::pthread_setname_np(::pthread_self(), "feedline-io");
  Bounce bounce;
  for (;;) {
    std::shared_ptr<Submission> s;
    std::size_t task = 0;
    {
      std::unique_lock lock(queue_mutex);
      queue_cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping, and close() cancelled what was queued
      s = queue.front();
      task = s->next_task++;
      if (s->next_task == s->num_tasks()) queue.pop_front();
    }
    run_task(*s, task, bounce);
    if (s->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(*s);
  }
}

void EngineState::run_task(Submission& s, std::size_t task, Bounce& bounce) {
  if (s.failed.load(std::memory_order_acquire)) return;  // an earlier task failed: drain
  const auto t0 = Clock::now();
  const RusageNow r0;
  ReadContext rc;
  rc.max_retries = options.max_retries;
  rc.backoff = options.retry_backoff;
  rc.live_retries = &counters.retries;
  TaskTally tally;
  bounce.forget();  // the file may have changed since an earlier submission
  try {
    for (std::size_t i = s.task_begin[task]; i < s.task_begin[task + 1]; ++i) {
      if (s.failed.load(std::memory_order_relaxed)) break;
      read_piece(s.pieces[i], bounce, rc, tally);
    }
  } catch (...) {
    s.fail(std::current_exception());
  }
  const RusageNow r1;
  tally.minor = r1.minor - r0.minor;
  tally.major = r1.major - r0.major;
  tally.busy_ns = elapsed_ns(t0);
  add(s.counters, tally, rc, true);
  add(counters, tally, rc, false);  // the engine counted retries live
}

void EngineState::read_piece(const Piece& p, Bounce& bounce, ReadContext& rc, TaskTally& tally) {
  rc.path = &files.path(p.file);
  switch (options.method) {
    case IoMethod::pread:
    case IoMethod::pread_random: read_buffered(p, rc, tally); break;
    case IoMethod::odirect: read_direct(p, bounce, rc, tally); break;
    case IoMethod::mmap: {
      const FileTable::Mapping m = files.mapping(p.file);
      const auto size = static_cast<std::int64_t>(m.size);
      if (p.offset + p.length > size) {
        throw_past_eof(*rc.path, p.offset, p.length, size);
      }
      std::memcpy(p.dest, m.base + p.offset, static_cast<std::size_t>(p.length));
      tally.storage_bytes += static_cast<std::uint64_t>(p.length);
      break;
    }
  }
  tally.bytes += static_cast<std::uint64_t>(p.length);
  if (p.first) ++tally.extents;
}

void EngineState::read_buffered(const Piece& p, ReadContext& rc, TaskTally& tally) {
  const int fd = files.buffered_fd(p.file);
  const auto want = static_cast<std::size_t>(p.length);
  const std::size_t got = pread_full(fd, p.dest, want, p.offset, rc);
  tally.storage_bytes += want;
  if (got < want) {
    throw_past_eof(*rc.path, p.offset, p.length,
                   end_of_file(fd, p.offset + static_cast<std::int64_t>(got)));
  }
}

void EngineState::read_direct(const Piece& p, Bounce& bounce, ReadContext& rc, TaskTally& tally) {
  // Small extents of one file often share alignment blocks: take them from the bounce
  // buffer when the previous read already brought them in.
  if (const unsigned char* held = bounce.find(p.file, p.offset, p.length)) {
    std::memcpy(p.dest, held, static_cast<std::size_t>(p.length));
    tally.bounced_bytes += static_cast<std::uint64_t>(p.length);
    return;
  }
  const FileTable::Direct d = files.direct(p.file);
  if (d.fd < 0) {
    read_buffered(p, rc, tally);
    return;
  }
  const auto off = static_cast<std::size_t>(p.offset);
  const auto len = static_cast<std::size_t>(p.length);
  try {
    const bool aligned = off % d.offset_align == 0 && len % d.offset_align == 0 &&
                         reinterpret_cast<std::uintptr_t>(p.dest) % d.mem_align == 0;
    if (aligned && !options.stage) {  // straight into the destination: no copy
      const std::size_t got = pread_full(d.fd, p.dest, len, p.offset, rc, d.offset_align);
      tally.storage_bytes += len;
      files.confirm_direct(p.file);
      if (got < len) {
        throw_past_eof(*rc.path, p.offset, p.length,
                       end_of_file(d.fd, p.offset + static_cast<std::int64_t>(got)));
      }
      return;
    }
    // The aligned cover of the extent, through the bounce buffer in pieces of at most
    // kBounceBytes, or kStageBytes when staging (the buffer's size bounds each thread's
    // memory, whatever the extent).
    const std::size_t lo = round_down(off, d.offset_align);
    const std::size_t hi = round_up(off + len, d.offset_align);
    const std::size_t most = options.stage ? kStageBytes : kBounceBytes;
    const std::size_t step = std::max(round_down(most, d.offset_align), d.offset_align);
    for (std::size_t pos = lo; pos < hi; pos += step) {
      const std::size_t n = std::min(step, hi - pos);
      unsigned char* buf = bounce.reserve(n, d.mem_align, options.stage);
      const std::size_t got =
          pread_full(d.fd, buf, n, static_cast<std::int64_t>(pos), rc, d.offset_align);
      tally.storage_bytes += n;
      files.confirm_direct(p.file);
      bounce.hold(p.file, static_cast<std::int64_t>(pos), static_cast<std::int64_t>(pos + got));
      const std::size_t a = std::max(pos, off), b = std::min(pos + got, off + len);
      if (b > a) {
        copy_out(p.dest + (a - off), buf + (a - pos), b - a);
        tally.bounced_bytes += b - a;
      }
      if (got < n) {
        if (pos + got < off + len) {
          throw_past_eof(*rc.path, p.offset, p.length,
                         end_of_file(d.fd, static_cast<std::int64_t>(pos + got)));
        }
        break;
      }
    }
  } catch (const DirectRefused&) {
    // EINVAL after a direct read of this file succeeded is a real error (a bug in the
    // alignment), not a file system that refuses O_DIRECT.
    if (files.direct_confirmed(p.file)) {
      throw StorageFailure(*rc.path, off, EINVAL, "pread(O_DIRECT): Invalid argument");
    }
    files.refuse_direct(p.file);
    bounce.forget();
    read_buffered(p, rc, tally);
  }
}

void EngineState::started() {
  std::lock_guard lock(wall_mutex);
  if (inflight++ == 0) busy_since = Clock::now();
}

void EngineState::finish(Submission& s) {
  IoStats r;
  s.counters.fill(r);
  r.submissions = 1;
  r.wall_s = seconds(elapsed_ns(s.start));
  {
    // The engine's totals first, so that a caller who saw the future done also sees
    // the submission in stats().
    std::lock_guard lock(wall_mutex);
    ++submissions;
    if (--inflight == 0) wall_ns += elapsed_ns(busy_since);
  }
  std::lock_guard lock(s.mutex);
  s.result = r;
  s.finished = true;
  s.cv.notify_all();
}

}  // namespace detail

IoMethod parse_io_method(std::string_view name) {
  if (name == "pread") return IoMethod::pread;
  if (name == "odirect") return IoMethod::odirect;
  if (name == "mmap") return IoMethod::mmap;
  if (name == "pread-random") return IoMethod::pread_random;
  throw std::invalid_argument("unknown I/O method '" + std::string(name) +
                              "' (expected pread, odirect, mmap or pread-random)");
}

const char* to_string(IoMethod method) noexcept {
  switch (method) {
    case IoMethod::pread: return "pread";
    case IoMethod::odirect: return "odirect";
    case IoMethod::mmap: return "mmap";
    case IoMethod::pread_random: return "pread-random";
  }
  return "?";
}

const char* to_string(FileMode mode) noexcept {
  switch (mode) {
    case FileMode::unopened: return "unopened";
    case FileMode::buffered: return "buffered";
    case FileMode::direct: return "direct";
    case FileMode::fallback: return "fallback";
    case FileMode::mapped: return "mapped";
  }
  return "?";
}

bool IoFuture::done() const {
  if (!state_) return false;
  std::lock_guard lock(state_->mutex);
  return state_->finished;
}

bool IoFuture::wait_for(std::chrono::nanoseconds timeout) const {
  if (!state_) throw std::invalid_argument("wait on an empty IoFuture");
  std::unique_lock lock(state_->mutex);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->finished; });
}

void IoFuture::wait() const {
  if (!state_) throw std::invalid_argument("wait on an empty IoFuture");
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->finished; });
}

IoStats IoFuture::get() const {
  wait();
  std::lock_guard lock(state_->mutex);
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->result;
}

IoEngine::IoEngine(std::vector<std::string> paths, IoOptions options) {
  if (options.threads == 0) throw std::invalid_argument("IoEngine needs at least one thread");
  if (options.chunk_bytes < 4096) throw std::invalid_argument("chunk_bytes must be >= 4096");
  if ((options.alignment & (options.alignment - 1)) != 0) {
    throw std::invalid_argument("alignment must be 0 or a power of two");
  }
  state_ = std::make_shared<detail::EngineState>(std::move(paths), options);
  try {
    state_->threads.reserve(options.threads);
    for (unsigned i = 0; i < options.threads; ++i) {
      // each thread co-owns the state: an abandoned (detached) thread outlives the engine
      state_->threads.emplace_back([s = state_] { s->worker(); });
    }
  } catch (...) {
    close();
    throw;
  }
}

IoEngine::~IoEngine() { close(); }

IoFuture IoEngine::submit(std::span<const Extent> extents, void* buffer, std::size_t buffer_size,
                          std::span<const std::int64_t> dest_offsets) {
  if (state_->closed.load(std::memory_order_acquire)) {
    throw std::invalid_argument("submit on a closed I/O engine");
  }
  if (!dest_offsets.empty() && dest_offsets.size() != extents.size()) {
    throw std::invalid_argument("dest_offsets has " + std::to_string(dest_offsets.size()) +
                                " entries for " + std::to_string(extents.size()) + " extents");
  }
  if (buffer == nullptr && buffer_size > 0) {
    throw std::invalid_argument("a null buffer cannot hold " + std::to_string(buffer_size) +
                                " bytes");
  }
  auto s = std::make_shared<detail::Submission>();
  const auto chunk = static_cast<std::int64_t>(state_->options.chunk_bytes);
  auto* base = static_cast<unsigned char*>(buffer);
  const auto cap = static_cast<std::uint64_t>(buffer_size);
  std::uint64_t packed = 0;
  std::uint64_t total = 0;
  std::size_t zero_length = 0;
  s->pieces.reserve(extents.size());
  for (std::size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    (void)state_->files.path(e.file_id);  // range check: std::out_of_range
    if (e.offset < 0 || e.length < 0 ||
        e.offset > std::numeric_limits<std::int64_t>::max() - e.length) {
      throw std::invalid_argument("extent " + std::to_string(i) +
                                  " has a negative or overflowing offset or length");
    }
    const auto len = static_cast<std::uint64_t>(e.length);
    std::uint64_t dest = packed;
    if (!dest_offsets.empty()) {
      if (dest_offsets[i] < 0) throw std::invalid_argument("negative destination offset");
      dest = static_cast<std::uint64_t>(dest_offsets[i]);
    }
    if (dest > cap || len > cap - dest) {
      throw std::invalid_argument("extent " + std::to_string(i) + " (" + std::to_string(len) +
                                  " bytes at buffer offset " + std::to_string(dest) +
                                  ") overflows the " + std::to_string(cap) + "-byte buffer");
    }
    packed = dest + len;
    total += len;
    if (len == 0) {
      ++zero_length;
      continue;
    }
    for (std::int64_t at = 0; at < e.length; at += chunk) {
      s->pieces.push_back(detail::Piece{e.file_id, e.offset + at, std::min(chunk, e.length - at),
                                        base + dest + static_cast<std::uint64_t>(at), at == 0});
    }
  }
  // Group pieces into tasks of about total/threads bytes (at most one chunk), so a
  // submission of small extents still spreads over every thread.
  const std::uint64_t threads = state_->options.threads;
  const std::uint64_t target =
      std::clamp<std::uint64_t>((total + threads - 1) / threads, 1, state_->options.chunk_bytes);
  s->task_begin.push_back(0);
  std::uint64_t run = 0;
  for (std::size_t i = 0; i < s->pieces.size(); ++i) {
    const auto len = static_cast<std::uint64_t>(s->pieces[i].length);
    if (run > 0 && run + len > target) {
      s->task_begin.push_back(i);
      run = 0;
    }
    run += len;
  }
  if (!s->pieces.empty()) s->task_begin.push_back(s->pieces.size());
  s->counters.extents.store(zero_length, std::memory_order_relaxed);
  state_->counters.extents.fetch_add(zero_length, std::memory_order_relaxed);
  s->remaining.store(s->num_tasks(), std::memory_order_relaxed);

  state_->started();
  if (s->num_tasks() == 0) {
    state_->finish(*s);
    return IoFuture(std::move(s));
  }
  {
    std::lock_guard lock(state_->queue_mutex);
    if (state_->stopping) {
      // close() won the race after our check above; it will not see this submission.
      s->remaining.store(0);
      s->fail(std::make_exception_ptr(std::invalid_argument("submit on a closed I/O engine")));
      state_->finish(*s);
      return IoFuture(std::move(s));
    }
    state_->queue.push_back(s);
  }
  if (s->num_tasks() == 1) {
    state_->queue_cv.notify_one();
  } else {
    state_->queue_cv.notify_all();
  }
  return IoFuture(std::move(s));
}

IoStats IoEngine::read(std::span<const Extent> extents, void* buffer, std::size_t buffer_size,
                       std::span<const std::int64_t> dest_offsets) {
  return submit(extents, buffer, buffer_size, dest_offsets).get();
}

IoStats IoEngine::stats() const {
  IoStats r;
  state_->counters.fill(r);
  std::lock_guard lock(state_->wall_mutex);
  r.submissions = state_->submissions;
  std::uint64_t wall = state_->wall_ns;
  if (state_->inflight > 0) wall += elapsed_ns(state_->busy_since);
  r.wall_s = seconds(wall);
  return r;
}

const IoOptions& IoEngine::options() const noexcept { return state_->options; }

std::size_t IoEngine::num_files() const noexcept { return state_->files.size(); }

const std::string& IoEngine::path(std::int32_t file_id) const {
  return state_->files.path(file_id);
}

FileMode IoEngine::file_mode(std::int32_t file_id) const { return state_->files.mode(file_id); }

void IoEngine::evict() const {
  for (std::size_t i = 0; i < state_->files.size(); ++i) {
    evict_page_cache(state_->files.path(static_cast<std::int32_t>(i)));
  }
}

void IoEngine::close() noexcept { stop(true); }

void IoEngine::abandon() noexcept { stop(false); }

void IoEngine::stop(bool join) noexcept {
  if (!state_) return;
  std::lock_guard close_lock(state_->close_mutex);
  if (state_->closed.exchange(true)) return;
  std::vector<std::pair<std::shared_ptr<detail::Submission>, std::size_t>> cancelled;
  {
    std::lock_guard lock(state_->queue_mutex);
    state_->stopping = true;
    for (auto& s : state_->queue) {
      const std::size_t unclaimed = s->num_tasks() - s->next_task;
      s->next_task = s->num_tasks();
      s->fail(std::make_exception_ptr(
          std::runtime_error("the I/O engine was closed before this read ran")));
      cancelled.emplace_back(s, unclaimed);
    }
    state_->queue.clear();
  }
  state_->queue_cv.notify_all();
  for (auto& t : state_->threads) {
    if (!t.joinable()) continue;
    if (join) {
      t.join();
    } else {
      t.detach();
    }
  }
  for (auto& [s, unclaimed] : cancelled) {
    if (s->remaining.fetch_sub(unclaimed, std::memory_order_acq_rel) == unclaimed)
      state_->finish(*s);
  }
  if (join) state_->files.close_all();  // else when the last detached thread drops the state
}

bool IoEngine::closed() const noexcept { return state_->closed.load(std::memory_order_acquire); }

}  // namespace feedline
