// SPDX-License-Identifier: Apache-2.0
// The I/O engine against real files: every method returns the files' bytes, errors are
// typed and name the file, the pool survives concurrency and idle destruction.
#include <gtest/gtest.h>

#include <feedline/detail/io_posix.hpp>
#include <feedline/errors.hpp>
#include <feedline/io_engine.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using feedline::Extent;
using feedline::FileMode;
using feedline::IoEngine;
using feedline::IoMethod;
using feedline::IoOptions;

namespace {

class TempFiles {
 public:
  TempFiles() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "feedline_io_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~TempFiles() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  TempFiles(const TempFiles&) = delete;
  TempFiles& operator=(const TempFiles&) = delete;

  /// A file of @p size random bytes; returns its path and remembers its contents.
  std::string make(const std::string& name, std::size_t size, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<unsigned char> bytes(size);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
    contents.push_back(std::move(bytes));
    return path;
  }
  [[nodiscard]] const fs::path& dir() const { return dir_; }
  std::vector<std::vector<unsigned char>> contents;

 private:
  fs::path dir_;
};

/// Random extents over @p sizes (unaligned offsets and lengths, some empty, some
/// spanning several chunks) and a shuffled, gapped placement in one buffer.
struct Workload {
  std::vector<Extent> extents;
  std::vector<std::int64_t> dest;
  std::size_t buffer_bytes = 0;
};

Workload random_workload(const std::vector<std::size_t>& sizes, std::size_t n, std::uint32_t seed,
                         std::size_t max_len) {
  std::mt19937_64 rng(seed);
  Workload w;
  for (std::size_t i = 0; i < n; ++i) {
    const auto f = static_cast<std::int32_t>(rng() % sizes.size());
    const std::size_t size = sizes[static_cast<std::size_t>(f)];
    std::size_t len = rng() % 8 == 0 ? 0 : 1 + rng() % std::min(max_len, size);
    const std::size_t off = rng() % (size - len + 1);
    w.extents.push_back(Extent{f, static_cast<std::int64_t>(off), static_cast<std::int64_t>(len)});
  }
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  w.dest.resize(n);
  std::size_t at = 0;
  for (std::size_t i : order) {
    at += rng() % 3;  // odd gaps: unaligned destinations
    w.dest[i] = static_cast<std::int64_t>(at);
    at += static_cast<std::size_t>(w.extents[i].length);
  }
  w.buffer_bytes = at + 7;
  return w;
}

void expect_bytes(const TempFiles& t, const Workload& w, const std::vector<unsigned char>& buf) {
  for (std::size_t i = 0; i < w.extents.size(); ++i) {
    const Extent& e = w.extents[i];
    const auto& src = t.contents[static_cast<std::size_t>(e.file_id)];
    ASSERT_EQ(0, std::memcmp(buf.data() + w.dest[i], src.data() + e.offset,
                             static_cast<std::size_t>(e.length)))
        << "extent " << i << " file " << e.file_id << " @" << e.offset << " +" << e.length;
  }
}

IoOptions opts(IoMethod m, unsigned threads = 3, std::size_t chunk = 16384) {
  IoOptions o;
  o.method = m;
  o.threads = threads;
  o.chunk_bytes = chunk;
  return o;
}

class EngineMethods : public ::testing::TestWithParam<IoMethod> {};

TEST_P(EngineMethods, RandomExtentsGiveTheFilesBytes) {
  TempFiles t;
  const std::vector<std::size_t> sizes{300'001, 65'536, 4'097, 1};
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    paths.push_back(t.make("f" + std::to_string(i), sizes[i], 7 + i));
  const Workload w = random_workload(sizes, 400, 11, 70'000);
  IoEngine engine(paths, opts(GetParam()));
  std::vector<unsigned char> buf(w.buffer_bytes, 0xEE);
  const auto st = engine.read(w.extents, buf.data(), buf.size(), w.dest);
  expect_bytes(t, w, buf);

  std::uint64_t payload = 0;
  for (const auto& e : w.extents) payload += static_cast<std::uint64_t>(e.length);
  EXPECT_EQ(st.bytes, payload);
  EXPECT_EQ(st.extents, w.extents.size());
  EXPECT_EQ(st.submissions, 1u);
  EXPECT_GT(st.tasks, 3u);
  EXPECT_GE(st.storage_bytes, payload);
  if (GetParam() == IoMethod::mmap) {
    EXPECT_EQ(st.ops, 0u);
  } else {
    EXPECT_GE(st.ops, st.tasks);
  }
  EXPECT_GT(st.wall_s, 0.0);
  EXPECT_GT(st.busy_s, 0.0);
  const auto total = engine.stats();
  EXPECT_EQ(total.bytes, st.bytes);
  EXPECT_EQ(total.submissions, 1u);
}

TEST_P(EngineMethods, PackedWhenNoDestinations) {
  TempFiles t;
  const std::string p = t.make("a", 50'000, 3);
  IoEngine engine({p}, opts(GetParam()));
  std::vector<Extent> ex{{0, 49'000, 1'000}, {0, 1, 4'095}, {0, 0, 0}, {0, 12'345, 20'000}};
  std::vector<unsigned char> buf(25'095);
  engine.read(ex, buf.data(), buf.size());
  std::size_t at = 0;
  for (const auto& e : ex) {
    EXPECT_EQ(0, std::memcmp(buf.data() + at, t.contents[0].data() + e.offset,
                             static_cast<std::size_t>(e.length)));
    at += static_cast<std::size_t>(e.length);
  }
}

TEST_P(EngineMethods, ExtentPastEndOfFileIsCorruptData) {
  TempFiles t;
  const std::string p = t.make("short", 10'000, 5);
  IoEngine engine({p}, opts(GetParam()));
  std::vector<unsigned char> buf(8'192);
  for (const Extent e : {Extent{0, 9'000, 2'000}, Extent{0, 20'000, 10}}) {
    try {
      engine.read({&e, 1}, buf.data(), buf.size());
      FAIL() << "no error for an extent past the end of the file";
    } catch (const feedline::CorruptData& err) {
      EXPECT_EQ(err.path, p);
      EXPECT_EQ(err.offset, 10'000u) << err.what();
      EXPECT_NE(err.reason.find(std::to_string(e.offset)), std::string::npos) << err.reason;
    }
  }
}

TEST_P(EngineMethods, MissingFileIsStorageFailure) {
  TempFiles t;
  const std::string p = (t.dir() / "absent").string();
  IoEngine engine({p}, opts(GetParam()));
  std::vector<unsigned char> buf(100);
  const Extent e{0, 0, 100};
  try {
    engine.read({&e, 1}, buf.data(), buf.size());
    FAIL() << "no error for a missing file";
  } catch (const feedline::StorageFailure& err) {
    EXPECT_EQ(err.path, p);
    EXPECT_EQ(err.err, ENOENT);
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, EngineMethods,
                         ::testing::Values(IoMethod::pread, IoMethod::odirect, IoMethod::mmap,
                                           IoMethod::pread_random),
                         [](const auto& info) {
                           std::string name = feedline::to_string(info.param);
                           for (char& c : name) {
                             if (c == '-') c = '_';  // test names are identifiers
                           }
                           return name;
                         });

TEST(IoEngine, LargeExtentIsSplitIntoChunksOverThreads) {
  TempFiles t;
  const std::string p = t.make("big", 1 << 20, 9);
  IoEngine engine({p}, opts(IoMethod::pread, 4, 64 << 10));
  std::vector<unsigned char> buf(1 << 20);
  const Extent e{0, 0, 1 << 20};
  const auto st = engine.read({&e, 1}, buf.data(), buf.size());
  EXPECT_EQ(st.tasks, 16u);
  EXPECT_EQ(st.extents, 1u);
  EXPECT_EQ(0, std::memcmp(buf.data(), t.contents[0].data(), buf.size()));
}

TEST(IoEngine, DirectReadsRoundOutToTheAlignment) {
  TempFiles t;
  const std::string p = t.make("d", 1 << 16, 4);
  IoOptions o = opts(IoMethod::odirect, 1, 1 << 16);
  o.alignment = 4096;
  IoEngine engine({p}, o);
  std::vector<unsigned char> buf(100);
  const Extent e{0, 4000, 100};  // straddles a 4096 boundary: two blocks
  const auto st = engine.read({&e, 1}, buf.data(), buf.size());
  EXPECT_EQ(0, std::memcmp(buf.data(), t.contents[0].data() + 4000, 100));
  if (engine.file_mode(0) == FileMode::direct) {
    EXPECT_EQ(st.storage_bytes, 8192u);
  } else {
    EXPECT_EQ(engine.file_mode(0), FileMode::fallback);
    EXPECT_EQ(st.storage_bytes, 100u);
  }
}

TEST(IoEngine, StagedDirectReadsCopyEveryByteAndKeepLargeReadsWhole) {
  // stage: every O_DIRECT extent through the thread's huge-page staging buffer, in reads
  // of at most 4 MiB: the same bytes for random unaligned extents, and an aligned 2 MiB
  // extent into an aligned destination is one read, copied.
  TempFiles t;
  const std::vector<std::size_t> sizes{(9u << 20) + 4096, 300001, 4097};
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    paths.push_back(t.make("s" + std::to_string(i), sizes[i], 40 + static_cast<std::uint32_t>(i)));
  }
  IoOptions o = opts(IoMethod::odirect, 3, 8 << 20);
  o.stage = true;
  IoEngine engine(paths, o);
  const Workload w = random_workload(sizes, 200, 17, 3 << 20);
  std::vector<unsigned char> buf(w.buffer_bytes);
  const auto st = engine.read(w.extents, buf.data(), buf.size(), w.dest);
  expect_bytes(t, w, buf);
  if (engine.file_mode(0) != FileMode::direct) GTEST_SKIP() << "no O_DIRECT here";
  std::uint64_t total = 0;
  for (const Extent& e : w.extents) total += static_cast<std::uint64_t>(e.length);
  EXPECT_EQ(st.bounced_bytes, total);
  void* raw = nullptr;
  ASSERT_EQ(0, ::posix_memalign(&raw, 4096, 2 << 20));
  std::unique_ptr<unsigned char, decltype(&std::free)> dst(static_cast<unsigned char*>(raw),
                                                           &std::free);
  const Extent whole{0, 1 << 20, 2 << 20};
  const auto one = engine.read({&whole, 1}, dst.get(), 2 << 20);
  EXPECT_EQ(0, std::memcmp(dst.get(), t.contents[0].data() + (1 << 20), 2 << 20));
  EXPECT_EQ(one.ops, 1u);
  EXPECT_EQ(one.bounced_bytes, 2u << 20);
  const Extent big{0, 4096, 8 << 20};  // one 8 MiB chunk: two staged reads of 4 MiB
  std::vector<unsigned char> out(8 << 20);
  const auto two = engine.read({&big, 1}, out.data(), out.size());
  EXPECT_EQ(0, std::memcmp(out.data(), t.contents[0].data() + 4096, out.size()));
  EXPECT_EQ(two.ops, 2u);
}

TEST(IoEngine, FallsBackWhenOpenRefusesDirect) {
  // procfs refuses O_DIRECT at open (EINVAL): the engine must read it buffered.
  int fd = ::open("/proc/version", O_RDONLY | O_DIRECT);
  if (fd >= 0) {
    ::close(fd);
    GTEST_SKIP() << "this kernel accepts O_DIRECT on procfs";
  }
  ASSERT_EQ(errno, EINVAL);
  std::ifstream in("/proc/version");
  const std::string expected(std::istreambuf_iterator<char>(in), {});
  ASSERT_FALSE(expected.empty());
  IoEngine engine({"/proc/version"}, opts(IoMethod::odirect, 2, 4096));
  std::vector<unsigned char> buf(expected.size());
  const Extent e{0, 0, static_cast<std::int64_t>(expected.size())};
  engine.read({&e, 1}, buf.data(), buf.size());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), expected);
  EXPECT_EQ(engine.file_mode(0), FileMode::fallback);
}

TEST(IoEngine, FallsBackWhenFirstDirectReadIsRefused) {
  // An alignment of 1 makes the first O_DIRECT read unaligned; file systems that check
  // (ext4, xfs: statx reports their alignment) answer EINVAL, and the engine must then
  // read the file buffered, with the same bytes.
  TempFiles t;
  const std::string p = t.make("x", 100'000, 8);
  IoOptions o = opts(IoMethod::odirect, 2, 16384);
  o.alignment = 1;
  IoEngine engine({p}, o);
  const Workload w = random_workload({100'000}, 50, 3, 30'000);
  std::vector<unsigned char> buf(w.buffer_bytes);
  engine.read(w.extents, buf.data(), buf.size(), w.dest);
  expect_bytes(t, w, buf);
  struct statx sx {};
  const bool checks = ::statx(AT_FDCWD, p.c_str(), 0, STATX_DIOALIGN, &sx) == 0 &&
                      (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 1;
  if (checks) EXPECT_EQ(engine.file_mode(0), FileMode::fallback);
}

TEST(IoEngine, PersistentEioIsRetriedThenStorageFailure) {
  // Reading an unmapped address of /proc/self/mem fails with EIO: a real, persistent
  // I/O error. Address 4096 (the second page) is never mapped.
  IoOptions o = opts(IoMethod::pread, 1, 4096);
  o.max_retries = 3;
  o.retry_backoff = std::chrono::microseconds(100);
  IoEngine engine({"/proc/self/mem"}, o);
  std::vector<unsigned char> buf(64);
  const Extent e{0, 4096, 64};
  try {
    engine.read({&e, 1}, buf.data(), buf.size());
    FAIL() << "no error reading unmapped memory";
  } catch (const feedline::StorageFailure& err) {
    EXPECT_EQ(err.path, "/proc/self/mem");
    EXPECT_EQ(err.offset, 4096u);
    EXPECT_EQ(err.err, EIO);
  }
  const auto st = engine.stats();
  EXPECT_EQ(st.retries, 3u);
  EXPECT_EQ(st.ops, 4u);
}

TEST(IoEngine, TransientEioIsRetriedUntilItSucceeds) {
  // The read targets a page of /proc/self/mem that is unmapped (EIO) until the test maps
  // it, which it does only after the engine has retried once.
  IoOptions o = opts(IoMethod::pread, 1, 4096);
  o.max_retries = 12;
  o.retry_backoff = std::chrono::microseconds(2000);
  IoEngine engine({"/proc/self/mem"}, o);  // first: its thread stacks are mapped now
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // The middle page of a freed 64-page hole: unlikely to be reused in the meantime.
  auto* hole = static_cast<unsigned char*>(
      ::mmap(nullptr, 64 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(static_cast<void*>(hole), MAP_FAILED);
  ::munmap(hole, 64 * page);
  void* probe = hole + 32 * page;
  const auto addr = reinterpret_cast<std::uintptr_t>(probe);
  std::vector<unsigned char> buf(128);
  const Extent e{0, static_cast<std::int64_t>(addr), 128};
  auto fut = engine.submit({&e, 1}, buf.data(), buf.size());
  while (engine.stats().retries == 0 && !fut.done())
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  void* p = ::mmap(probe, page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != probe) {
    if (p != MAP_FAILED) ::munmap(p, page);
    fut.wait();
    GTEST_SKIP() << "the probed address was taken by another mapping";
  }
  std::memset(p, 0x5A, page);
  const auto st = fut.get();
  ::munmap(p, page);
  EXPECT_GE(st.retries, 1u);
  EXPECT_EQ(st.bytes, 128u);
  for (unsigned char b : buf) ASSERT_EQ(b, 0x5A);
}

TEST(IoEngine, ManyConcurrentSubmissions) {
  TempFiles t;
  const std::vector<std::size_t> sizes{200'000, 77'777};
  std::vector<std::string> paths{t.make("a", sizes[0], 1), t.make("b", sizes[1], 2)};
  for (IoMethod m : {IoMethod::pread, IoMethod::odirect}) {
    IoEngine engine(paths, opts(m, 3, 8192));
    constexpr int kThreads = 6, kEach = 15;
    std::atomic<std::uint64_t> payload{0};
    std::atomic<int> bad{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < kThreads; ++c) {
      callers.emplace_back([&, c] {
        std::vector<Workload> work;
        std::vector<std::vector<unsigned char>> bufs;
        std::vector<feedline::IoFuture> futs;
        for (int k = 0; k < kEach; ++k) {
          work.push_back(
              random_workload(sizes, 40, static_cast<std::uint32_t>(c * 100 + k), 20'000));
          bufs.emplace_back(work.back().buffer_bytes);
        }
        for (int k = 0; k < kEach; ++k) {
          futs.push_back(
              engine.submit(work[k].extents, bufs[k].data(), bufs[k].size(), work[k].dest));
        }
        for (int k = 0; k < kEach; ++k) {
          payload += futs[k].get().bytes;
          for (std::size_t i = 0; i < work[k].extents.size(); ++i) {
            const Extent& e = work[k].extents[i];
            if (std::memcmp(bufs[k].data() + work[k].dest[i],
                            t.contents[e.file_id].data() + e.offset,
                            static_cast<std::size_t>(e.length)) != 0) {
              ++bad;
            }
          }
        }
      });
    }
    for (auto& c : callers) c.join();
    EXPECT_EQ(bad.load(), 0) << feedline::to_string(m);
    const auto st = engine.stats();
    EXPECT_EQ(st.submissions, static_cast<std::uint64_t>(kThreads * kEach));
    EXPECT_EQ(st.bytes, payload.load());
  }
}

TEST(IoEngine, DestructionWhileIdleAndCloseCancelsQueuedWork) {
  TempFiles t;
  const std::string p = t.make("a", 1 << 20, 6);
  { IoEngine idle({p}, opts(IoMethod::pread, 4)); }  // never used
  {
    IoEngine used({p}, opts(IoMethod::odirect, 2));
    std::vector<unsigned char> buf(1000);
    const Extent e{0, 5, 1000};
    used.read({&e, 1}, buf.data(), buf.size());
  }  // idle again, files open
  std::vector<std::vector<unsigned char>> bufs(40, std::vector<unsigned char>(1 << 20));
  std::vector<feedline::IoFuture> futs;
  {
    IoEngine engine({p}, opts(IoMethod::pread, 1, 4096));
    const Extent e{0, 0, 1 << 20};
    for (auto& b : bufs) futs.push_back(engine.submit({&e, 1}, b.data(), b.size()));
    engine.close();
    EXPECT_TRUE(engine.closed());
    EXPECT_THROW(engine.submit({&e, 1}, bufs[0].data(), bufs[0].size()), std::invalid_argument);
  }
  int completed = 0, cancelled = 0;
  for (auto& f : futs) {
    ASSERT_TRUE(f.done());
    try {
      f.get();
      ++completed;
    } catch (const std::runtime_error&) {
      ++cancelled;
    }
  }
  EXPECT_EQ(completed + cancelled, 40);
  EXPECT_GT(cancelled, 0);
}

// Concurrency stress (run under ThreadSanitizer by dev/test --full): caller threads
// submit, poll (done, wait_for, stats, file_mode) and wait while another thread closes
// or, like a reader whose wait timed out, abandons the engine mid-flight. Some
// submissions fail on several threads at once (EIO from /proc/self/mem, retried). Every
// future ends: right bytes, cancelled, or refused as closed. After close() returns (for
// abandon(), once every future is done) no engine thread touches a buffer: the test then
// reads and overwrites them without other synchronization, so TSan reports a late write.
TEST(IoEngineStress, SubmitPollAndWaitWhileAnotherThreadClosesOrAbandons) {
  TempFiles t;
  const std::vector<std::size_t> sizes{150'000, 40'000, 9'000};
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    paths.push_back(t.make("f" + std::to_string(i), sizes[i], 30 + static_cast<std::uint32_t>(i)));
  paths.push_back("/proc/self/mem");  // file 3: the unmapped page at 4096 fails with EIO
  const std::int32_t kEio = 3;
  constexpr int kCallers = 5, kEach = 12;
  for (IoMethod m : {IoMethod::pread, IoMethod::odirect, IoMethod::mmap, IoMethod::pread_random})
    for (const bool abandon : {false, true}) {
      SCOPED_TRACE(std::string(feedline::to_string(m)) + (abandon ? " abandon" : " close"));
      // Work and buffers are made up front; caller c touches only slot c until it is joined.
      std::vector<std::vector<Workload>> work(kCallers);
      std::vector<std::vector<std::vector<unsigned char>>> bufs(kCallers);
      std::vector<std::vector<feedline::IoFuture>> futs(kCallers);
      for (int c = 0; c < kCallers; ++c)
        for (int k = 0; k < kEach; ++k) {
          Workload w = random_workload(sizes, 30, static_cast<std::uint32_t>(1000 * c + k), 30'000);
          if (k % 5 == 4 && m != IoMethod::mmap) {  // a failing submission: EIO on 4 tasks
            for (int j = 0; j < 4; ++j) {
              w.extents.push_back(Extent{kEio, 4096, 64});
              w.dest.push_back(static_cast<std::int64_t>(w.buffer_bytes));
              w.buffer_bytes += 64;
            }
          }
          bufs[c].emplace_back(w.buffer_bytes);
          work[c].push_back(std::move(w));
        }
      IoOptions o = opts(m, 4, 8192);
      o.max_retries = 2;
      o.retry_backoff = std::chrono::microseconds(50);
      auto engine = std::make_unique<IoEngine>(paths, o);
      std::atomic<int> submitted{0}, refused{0};
      std::vector<std::thread> threads;
      for (int c = 0; c < kCallers; ++c) {
        threads.emplace_back([&, c] {
          for (int k = 0; k < kEach; ++k) {
            try {
              futs[c].push_back(engine->submit(work[c][k].extents, bufs[c][k].data(),
                                               bufs[c][k].size(), work[c][k].dest));
              ++submitted;
            } catch (const std::invalid_argument&) {  // closed: so is every later submit
              ++refused;
              break;
            }
            (void)futs[c].back().done();
            (void)futs[c].back().wait_for(std::chrono::microseconds(k % 3 == 0 ? 0 : 200));
            (void)engine->stats();
            (void)engine->file_mode(static_cast<std::int32_t>(k % 4));
            if (k % 4 == 1) futs[c][static_cast<std::size_t>(k / 2)].wait();
          }
        });
      }
      std::vector<unsigned char> own(sizes[0]);
      feedline::IoFuture own_fut;
      threads.emplace_back([&] {
        while (submitted.load() < kCallers * kEach / 3) std::this_thread::yield();
        if (abandon) {  // the reader's timeout: a short wait, then give up on the engine
          const Extent whole{0, 0, static_cast<std::int64_t>(sizes[0])};
          try {
            own_fut = engine->submit({&whole, 1}, own.data(), own.size());
            (void)own_fut.wait_for(std::chrono::microseconds(100));
          } catch (const std::invalid_argument&) {
          }
          engine->abandon();
        } else {
          engine->close();
        }
      });
      for (auto& th : threads) th.join();
      EXPECT_TRUE(engine->closed());
      // close() returned: no engine thread writes a buffer any more, so they may be read
      // without waiting for a future (TSan reports a write that comes later). After
      // abandon(), only once every future is done.
      std::vector<std::vector<std::vector<unsigned char>>> seen;
      if (!abandon) seen = bufs;
      for (int c = 0; c < kCallers; ++c)
        for (std::size_t k = 0; k < futs[c].size(); ++k)
          ASSERT_TRUE(futs[c][k].wait_for(std::chrono::seconds(30))) << c << " " << k;
      if (own_fut.valid()) ASSERT_TRUE(own_fut.wait_for(std::chrono::seconds(30)));
      if (abandon) seen = bufs;
      int ok = 0, cancelled = 0, closed = 0, failed = 0;
      for (int c = 0; c < kCallers; ++c)
        for (std::size_t k = 0; k < futs[c].size(); ++k) {
          const Workload& w = work[c][k];
          const bool eio = !w.extents.empty() && w.extents.back().file_id == kEio;
          try {
            const auto st = futs[c][k].get();
            ASSERT_FALSE(eio) << "a read of an unmapped page succeeded";
            ++ok;
            EXPECT_EQ(st.extents, w.extents.size());
            expect_bytes(t, w, seen[c][k]);
          } catch (const feedline::StorageFailure& e) {
            ASSERT_TRUE(eio) << e.what();
            EXPECT_EQ(e.err, EIO);
            ++failed;
          } catch (const feedline::CorruptData& e) {
            ADD_FAILURE() << e.what();
          } catch (const std::invalid_argument&) {  // close() won the race inside submit()
            ++closed;
          } catch (const std::runtime_error& e) {  // cancelled by close()/abandon()
            EXPECT_NE(std::string(e.what()).find("closed before"), std::string::npos) << e.what();
            ++cancelled;
          }
        }
      EXPECT_EQ(ok + cancelled + closed + failed, submitted.load());
      EXPECT_GT(ok, 0);
      EXPECT_LE(submitted.load() + refused.load(), kCallers * kEach);
      // and nothing writes them later either
      for (auto& per : bufs)
        for (auto& b : per) std::fill(b.begin(), b.end(), 0);
      std::fill(own.begin(), own.end(), 0);
      engine.reset();  // the destructor after close()/abandon() does nothing more
    }
}

TEST(IoEngineStress, AbandonReturnsWhileAReadIsBlockedAndTheThreadEndsLater) {
  // A FIFO without a writer blocks open() like a hung server. abandon() must return at
  // once, cancel the queued submission, and the detached thread must still end its
  // submission (with an error: pread on a FIFO is ESPIPE) once a writer appears.
  TempFiles t;
  const std::string fifo = (t.dir() / "stuck").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<unsigned char> buf(64), queued(64);
  const Extent e{0, 0, 16};
  feedline::IoFuture blocked, behind;
  {
    IoEngine engine({fifo}, opts(IoMethod::pread, 1, 4096));
    blocked = engine.submit({&e, 1}, buf.data(), buf.size());
    behind = engine.submit({&e, 1}, queued.data(), queued.size());
    EXPECT_FALSE(blocked.wait_for(std::chrono::milliseconds(200)));
    const auto t0 = std::chrono::steady_clock::now();
    engine.abandon();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
    EXPECT_TRUE(engine.closed());
    ASSERT_TRUE(behind.done());  // cancelled
    try {
      behind.get();
      ADD_FAILURE() << "a queued submission ran after abandon()";
    } catch (const std::runtime_error& err) {
      EXPECT_NE(std::string(err.what()).find("closed before"), std::string::npos) << err.what();
    }
  }  // the engine is gone; its thread is still blocked
  EXPECT_FALSE(blocked.done());
  // A writer releases the thread's open() (no write: the reader may be gone by then,
  // and a write to a FIFO without readers raises SIGPIPE).
  const int fd = ::open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ASSERT_TRUE(blocked.wait_for(std::chrono::seconds(10)));
  try {
    blocked.get();  // pread on a FIFO: ESPIPE
  } catch (const feedline::StorageFailure& err) {
    EXPECT_EQ(err.path, fifo);
  }
}

TEST(IoEngine, RejectsBadArguments) {
  TempFiles t;
  const std::string p = t.make("a", 100, 1);
  EXPECT_THROW(IoEngine({p}, opts(IoMethod::pread, 0)), std::invalid_argument);
  EXPECT_THROW(IoEngine({p}, opts(IoMethod::pread, 1, 100)), std::invalid_argument);
  EXPECT_THROW(feedline::parse_io_method("aio"), std::invalid_argument);
  IoEngine engine({p}, opts(IoMethod::pread, 1));
  std::vector<unsigned char> buf(50);
  const Extent far{1, 0, 10};
  EXPECT_THROW(engine.submit({&far, 1}, buf.data(), buf.size()), std::out_of_range);
  const Extent big{0, 0, 60};
  EXPECT_THROW(engine.submit({&big, 1}, buf.data(), buf.size()), std::invalid_argument);
  const Extent neg{0, -1, 10};
  EXPECT_THROW(engine.submit({&neg, 1}, buf.data(), buf.size()), std::invalid_argument);
  const Extent ok{0, 0, 10};
  const std::int64_t dest = 45;
  EXPECT_THROW(engine.submit({&ok, 1}, buf.data(), buf.size(), {&dest, 1}), std::invalid_argument);
  EXPECT_EQ(engine.stats().submissions, 0u);
  EXPECT_TRUE(engine.submit({}, nullptr, 0).done());
}

TEST(PageCache, EvictDropsAFilesPages) {
  TempFiles t;
  const std::string p = t.make("cached", 1 << 20, 12);
  {
    IoEngine engine({p}, opts(IoMethod::pread, 1));
    std::vector<unsigned char> buf(1 << 20);
    const Extent e{0, 0, 1 << 20};
    engine.read({&e, 1}, buf.data(), buf.size());
  }
  EXPECT_THROW(feedline::evict_page_cache((t.dir() / "absent").string()), feedline::StorageFailure);
  ASSERT_GT(feedline::resident_bytes(p), 0u);
  feedline::evict_page_cache(p);
  const std::uint64_t left = feedline::resident_bytes(p);
  // tmpfs keeps its pages (they are the file); disk file systems drop them.
  if (left != 0) {
    GTEST_SKIP() << "this file system keeps evicted pages (" << left << " bytes resident)";
  }
}

}  // namespace

TEST(CopyOut, EveryByteAtAnyAlignmentAndNothingAround) {
  // copy_out streams copies of kStreamCopyBytes and more (non-temporal stores on x86-64
  // release builds; memcpy under the sanitizers): head, whole lines and tail all land.
  const std::size_t big = feedline::detail::kStreamCopyBytes;
  std::vector<unsigned char> src(3 * big + 200);
  std::mt19937 rng(3);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, big - 1, big, big + 63, 2 * big + 5}) {
    for (const std::size_t at :
         {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{64}}) {
      for (const std::size_t from : {std::size_t{0}, std::size_t{3}}) {
        std::vector<unsigned char> dst(n + at + 64, 0xA5);
        feedline::detail::copy_out(dst.data() + at, src.data() + from, n);
        EXPECT_TRUE(std::equal(src.begin() + static_cast<std::ptrdiff_t>(from),
                               src.begin() + static_cast<std::ptrdiff_t>(from + n),
                               dst.begin() + static_cast<std::ptrdiff_t>(at)))
            << "n=" << n << " at=" << at << " from=" << from;
        EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + static_cast<std::ptrdiff_t>(at),
                                [](unsigned char c) { return c == 0xA5; }));
        EXPECT_TRUE(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(at + n), dst.end(),
                                [](unsigned char c) { return c == 0xA5; }));
      }
    }
  }
}
