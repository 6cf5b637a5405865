// SPDX-License-Identifier: Apache-2.0
// feedline-fuse: the storage emulator daemon. Mounts MNT with node0 ... node{M-1} as
// views of SRC whose reads cost what the modelled parallel file system would charge.
// Runs in the foreground; prints "ready PID" on stdout once the mount serves requests;
// unmounts on SIGINT/SIGTERM/SIGHUP or when unmounted from outside.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fs.hpp"

namespace fe = feedline::emulator;

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitUnavailable = 69;  // sysexits EX_UNAVAILABLE: no /dev/fuse, mount refused

const char* kUsage =
    "usage: feedline-fuse [options] SRC MNT\n"
    "Mount MNT/node0 ... MNT/node{N-1} as read-only views of directory SRC whose reads\n"
    "cost what a small parallel file system would charge (see docs/emulator.md).\n"
    "  --nodes N                emulated nodes (1)\n"
    "  --latency-us X           per-request latency (300)\n"
    "  --node-mbps X            bandwidth of each node's link, 1 MB = 1e6 B (1000)\n"
    "  --aggregate-mbps X       bandwidth shared by all nodes (2000)\n"
    "  --server-mbps X          media bandwidth of each storage server (800)\n"
    "  --servers N              storage servers (4)\n"
    "  --stripe-count N         servers a file is striped over, 0 = all (0)\n"
    "  --stripe-kib N           stripe size (1024)\n"
    "  --seek-us X              penalty of a non-sequential chunk at a server (1000)\n"
    "  --server-concurrency N   requests a server serves at once (4)\n"
    "  --burst-kib N            token-bucket depth of node and aggregate links (0)\n"
    "  --readahead-kib N        client read-ahead of each view, 0 = kernel default (1024)\n"
    "  --max-request-kib N      largest read request, <= 1024 (1024)\n"
    "  --log-requests N         requests kept in the log, 0 = totals only (65536)\n"
    "  --max-threads N          FUSE worker threads (128)\n"
    "  --path-us X              kernel path reader<->daemon inside the latency, < 0 = measure "
    "(-1)\n"
    "  --exit-with-parent       unmount and exit when the parent process ends\n"
    "  --debug                  libfuse debug output on stderr\n"
    "  -o OPT                   extra FUSE mount option\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "feedline-fuse: %s\n%s", msg.c_str(), kUsage);
  std::exit(kExitUsage);
}

double parse_double(const std::string& name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0) usage_error("--" + name + ": not a number: " + v);
  return x;
}

long long parse_int(const std::string& name, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) usage_error("--" + name + ": not an integer: " + v);
  if (x < lo || x > hi)
    usage_error("--" + name + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "]");
  return x;
}

struct Parsed {
  fe::Options opts;
  std::vector<std::string> fuse_opts;
  bool exit_with_parent = false;
};

Parsed parse(int argc, char** argv) {
  Parsed p;
  fe::Options& o = p.opts;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--debug") {
      o.debug = true;
      continue;
    }
    if (a == "--exit-with-parent") {
      p.exit_with_parent = true;
      continue;
    }
    if (a == "-o") {
      if (i + 1 >= argc) usage_error("-o needs a value");
      p.fuse_opts.push_back(argv[++i]);
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) usage_error("--" + name + " needs a value");
      value = argv[++i];
    }
    auto& m = o.model;
    if (name == "nodes") o.nodes = static_cast<int>(parse_int(name, value, 1, 4096));
    else if (name == "latency-us") m.latency_us = parse_double(name, value);
    else if (name == "node-mbps") m.node_mbps = parse_double(name, value);
    else if (name == "aggregate-mbps") m.aggregate_mbps = parse_double(name, value);
    else if (name == "server-mbps") m.server_mbps = parse_double(name, value);
    else if (name == "servers") m.servers = static_cast<int>(parse_int(name, value, 1, 4096));
    else if (name == "stripe-count")
      m.stripe_count = static_cast<int>(parse_int(name, value, 0, 4096));
    else if (name == "stripe-kib")
      m.stripe_bytes = static_cast<std::uint64_t>(parse_int(name, value, 4, 1 << 20)) * 1024;
    else if (name == "seek-us") m.seek_us = parse_double(name, value);
    else if (name == "server-concurrency")
      m.server_concurrency = static_cast<int>(parse_int(name, value, 1, 4096));
    else if (name == "burst-kib")
      m.burst_bytes = static_cast<std::uint64_t>(parse_int(name, value, 0, 1 << 24)) * 1024;
    else if (name == "readahead-kib")
      o.readahead_kib = static_cast<std::uint32_t>(parse_int(name, value, 0, 1 << 20));
    else if (name == "max-request-kib")
      o.max_request_kib = static_cast<std::uint32_t>(parse_int(name, value, 4, 1024));
    else if (name == "log-requests")
      o.log_requests = static_cast<std::size_t>(parse_int(name, value, 0, 1LL << 26));
    else if (name == "max-threads")
      o.max_threads = static_cast<int>(parse_int(name, value, 2, 4096));
    else if (name == "path-us") o.path_us = parse_double(name, value);
    else usage_error("unknown option --" + name);
  }
  if (positional.size() != 2) usage_error("expected SRC and MNT");
  // Absolute paths: the stats report them, and the daemon must not depend on its cwd.
  for (std::size_t i = 0; i < 2; ++i) {
    char* abs = realpath(positional[i].c_str(), nullptr);
    if (!abs) usage_error(positional[i] + ": " + std::strerror(errno));
    (i == 0 ? o.src : o.mountpoint) = abs;
    std::free(abs);
  }
  if (std::string msg = fe::validate(o.model); !msg.empty()) usage_error(msg);
  return p;
}

// Median round trip of a read of @p size bytes from the control file, which answers
// with no data: the kernel path between a reader and the daemon (pinning the reader's
// pages, waking a worker, waking the reader) that every request pays outside the
// daemon. Measured once, after the mount answers.
double measure_round_trip(const std::string& mountpoint, std::size_t size) {
  const int fd = open((mountpoint + "/" + fe::kControlName).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::vector<char> buf(size, 1);  // touched: page faults are not part of the path
  std::vector<double> samples;
  for (int i = 0; i < 140; ++i) {
    timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (pread(fd, buf.data(), size, 0) < 0) break;
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (i >= 20)
      samples.push_back(static_cast<double>(b.tv_sec - a.tv_sec) +
                        1e-9 * static_cast<double>(b.tv_nsec - a.tv_nsec));
  }
  close(fd);
  if (samples.empty()) return 0;
  auto mid = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
  std::nth_element(samples.begin(), mid, samples.end());
  return *mid;
}

// Raise the read-ahead of the mount's backing device info (the kernel caps FUSE's
// max_readahead at the bdi default of 128 KiB); return the value in effect, or -1.
int configure_readahead(const std::string& mountpoint, std::uint32_t want_kib) {
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0) return -1;
  char path[128];
  std::snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major(st.st_dev),
                minor(st.st_dev));
  if (want_kib > 0) {
    if (FILE* f = std::fopen(path, "w")) {
      std::fprintf(f, "%u\n", want_kib);
      if (std::fclose(f) != 0)
        std::fprintf(stderr, "feedline-fuse: warning: cannot set %s: %s\n", path,
                     std::strerror(errno));
    } else {
      std::fprintf(stderr, "feedline-fuse: warning: cannot set %s: %s\n", path,
                   std::strerror(errno));
    }
  }
  int kib = -1;
  if (FILE* f = std::fopen(path, "r")) {
    if (std::fscanf(f, "%d", &kib) != 1) kib = -1;
    std::fclose(f);
  }
  return kib;
}

}  // namespace

int main(int argc, char** argv) {
  Parsed p = parse(argc, argv);
  if (access("/dev/fuse", R_OK | W_OK) != 0) {
    std::fprintf(stderr, "feedline-fuse: /dev/fuse is not usable (%s); the emulator needs FUSE\n",
                 std::strerror(errno));
    return kExitUnavailable;
  }
  signal(SIGPIPE, SIG_IGN);
  // The daemon sleeps nearly all the time and its wake-ups are the modelled deadlines:
  // on a busy machine a higher priority (when allowed) keeps them punctual at almost no
  // CPU cost to others. Threads created later inherit it.
  errno = 0;
  if (setpriority(PRIO_PROCESS, 0, -10) != 0 && errno != EACCES && errno != EPERM)
    std::fprintf(stderr, "feedline-fuse: warning: setpriority: %s\n", std::strerror(errno));

  std::unique_ptr<fe::Filesystem> fs;
  try {
    fs = std::make_unique<fe::Filesystem>(p.opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feedline-fuse: %s\n", e.what());
    return 1;
  }
  const fe::Options& o = fs->options();

  std::vector<std::string> args = {argv[0]};
  std::string mount_opts = "fsname=feedline:" + o.src + ",subtype=feedline";
  if (geteuid() == 0) mount_opts += ",allow_other";  // MPI ranks may run as other users
  args.insert(args.end(), {"-o", mount_opts});
  for (const auto& opt : p.fuse_opts) args.insert(args.end(), {"-o", opt});
  if (o.debug) args.push_back("-d");
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(cargs.size()), cargs.data());

  fuse_session* se =
      fuse_session_new(&fargs, &fe::Filesystem::operations(), sizeof(fuse_lowlevel_ops), fs.get());
  fuse_opt_free_args(&fargs);  // the session keeps what it needs
  if (!se) {
    std::fprintf(stderr, "feedline-fuse: cannot create the FUSE session\n");
    return 1;
  }
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    return 1;
  }
  if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    std::fprintf(stderr, "feedline-fuse: cannot mount %s\n", o.mountpoint.c_str());
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return kExitUnavailable;
  }
  fs->set_session(se);

  // Configure and announce from a helper: stat() of the mount needs the loop running.
  // Then, with --exit-with-parent, watch the parent: a test or bench that dies without
  // stopping its emulator must not leave a mount behind. (Not PR_SET_PDEATHSIG: that
  // fires when the parent *thread* ends, which a Python worker thread may well do.)
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool loop_done = false;
  const pid_t parent = getppid();
  std::thread helper([&fs, &o, &p, &stop_mu, &stop_cv, &loop_done, parent] {
    fs->set_effective_readahead(configure_readahead(o.mountpoint, o.readahead_kib));
    // Never more than half the modelled latency: the model's latency stays meaningful.
    const double cap = 0.5 * o.model.latency_us * 1e-6;
    if (o.path_us >= 0) {
      fs->set_path(o.path_us * 1e-6, 0.0, cap);
    } else {
      const std::size_t big = std::size_t{o.max_request_kib} * 1024;
      const double fixed = measure_round_trip(o.mountpoint, 1);
      const double large = measure_round_trip(o.mountpoint, big);
      fs->set_path(fixed, std::max(0.0, (large - fixed) / static_cast<double>(big - 1)), cap);
    }
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    if (!p.exit_with_parent) return;
    std::unique_lock lock(stop_mu);
    while (!stop_cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return loop_done; })) {
      if (getppid() != parent) {
        kill(getpid(), SIGTERM);  // the same clean path as an outside SIGTERM
        return;
      }
    }
  });

  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, static_cast<unsigned>(o.max_threads));
  fuse_loop_cfg_set_idle_threads(cfg, 16);
  const int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);

  {
    std::lock_guard lock(stop_mu);
    loop_done = true;
  }
  stop_cv.notify_all();
  helper.join();
  fuse_remove_signal_handlers(se);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  // The loop returns 0, -errno, or the number of the signal that ended it.
  const bool clean = rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP;
  if (!clean) std::fprintf(stderr, "feedline-fuse: session loop failed (%d)\n", rc);
  return clean ? 0 : 1;
}
