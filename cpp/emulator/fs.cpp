// SPDX-License-Identifier: Apache-2.0
// FUSE low-level operations of the emulator.
//
// Reads are served by pread from the source into a per-thread buffer, then the worker
// sleeps until the request's modelled deadline (clock_nanosleep, absolute) and replies:
// wall time follows the model without burning CPU, and every request pays at least its
// modelled cost. Node views have distinct inode numbers and every open sets keep_cache,
// so the kernel keeps one page cache per (node, file), shared by opens on that node.
#include "fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace feedline::emulator {

namespace {

constexpr double kAttrTimeout = 1.0;  // the source is static; short enough to see new sidecars
constexpr std::size_t kAlign = 4096;  // read buffers are page-aligned

Filesystem& fs_of(fuse_req_t req) { return *static_cast<Filesystem*>(fuse_req_userdata(req)); }

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

struct Handle {
  int fd = -1;  // source file, or -1 for a text snapshot
  int node = 0;
  std::uint32_t file = 0;
  std::uint64_t hash = 0;
  std::uint64_t size = 0;
  bool direct = false;
  std::string rel;   // path relative to the source (fault matching)
  std::string text;  // snapshot of a control file
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (fd >= 0) close(fd);
  }
};

namespace {

struct DirHandle {
  struct Entry {
    std::string name;
    fuse_ino_t ino;
    mode_t type;
  };
  std::vector<Entry> entries;
};

// A per-thread read buffer, page-aligned and grown on demand (never shrunk: a worker
// serves requests of similar sizes).
struct Buffer {
  char* data = nullptr;
  std::size_t size = 0;
  ~Buffer() { std::free(data); }
  char* get(std::size_t n) {
    n = (n + kAlign - 1) / kAlign * kAlign;
    if (n > size) {
      std::free(data);
      data = static_cast<char*>(std::aligned_alloc(kAlign, n));
      size = data ? n : 0;
    }
    return data;
  }
};

int parse_node_name(const char* name, int nodes) {
  if (std::strncmp(name, "node", 4) != 0) return -1;
  const char* d = name + 4;
  if (!*d || (d[0] == '0' && d[1]) || std::strlen(d) > 6) return -1;
  int n = 0;
  for (; *d; ++d) {
    if (*d < '0' || *d > '9') return -1;
    n = n * 10 + (*d - '0');
  }
  return n < nodes ? n : -1;
}

std::string join(const std::string& dir, const char* name) {
  return dir.empty() ? std::string(name) : dir + "/" + name;
}

const char* rel_or_dot(const std::string& rel) { return rel.empty() ? "." : rel.c_str(); }

bool is_node_root(const Filesystem& fs, fuse_ino_t ino) {
  return ino >= kFirstNodeIno && ino < kFirstNodeIno + static_cast<fuse_ino_t>(fs.options().nodes);
}

bool is_text(fuse_ino_t ino) { return ino == kStatsIno || ino == kRequestsIno; }

void synthetic_attr(const Filesystem& fs, fuse_ino_t ino, struct stat& st) {
  st = {};
  st.st_ino = ino;
  st.st_uid = getuid();
  st.st_gid = getgid();
  st.st_blksize = static_cast<blksize_t>(fs.options().max_request_kib) * 1024;
  st.st_mtim = st.st_ctim = st.st_atim = fs.started();
  if (ino == kRootIno) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2 + static_cast<nlink_t>(fs.options().nodes);
  } else {
    st.st_mode = S_IFREG | (ino == kControlIno ? 0644 : 0444);
    st.st_nlink = 1;  // size 0: the content is produced at open, read with direct I/O
  }
}

// Attributes of @p ino; 0 or an errno.
int attr_of(Filesystem& fs, fuse_ino_t ino, struct stat& st) {
  if (ino == kRootIno || is_text(ino) || ino == kControlIno) {
    synthetic_attr(fs, ino, st);
    return 0;
  }
  Filesystem::Inode in;
  if (!fs.inode(ino, in)) return ENOENT;
  const int rc = in.rel.empty() ? fstat(fs.src_fd(), &st)
                                : fstatat(fs.src_fd(), in.rel.c_str(), &st, AT_SYMLINK_NOFOLLOW);
  if (rc != 0) return errno;
  st.st_ino = ino;
  st.st_mode &= ~static_cast<mode_t>(S_IWUSR | S_IWGRP | S_IWOTH);  // a read-only view
  return 0;
}

// Read up to @p size bytes at @p off, retrying short reads; bytes read or -errno.
ssize_t read_fully(int fd, char* buf, std::size_t size, off_t off) {
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = pread(fd, buf + got, size - got, off + static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(got);
}

void sleep_until(const timespec& t) {
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, nullptr) == EINTR) {
  }
}

// ---- operations -------------------------------------------------------------------

void op_init(void* userdata, fuse_conn_info* conn) {
  auto& fs = *static_cast<Filesystem*>(userdata);
  const unsigned max_req = fs.options().max_request_kib * 1024u;
  // libfuse derives the kernel's max_pages (largest request) from max_write, and the
  // kernel caps read requests at max_pages: set it although nothing is ever written.
  conn->max_write = max_req;
  if (fs.options().readahead_kib > 0) conn->max_readahead = fs.options().readahead_kib * 1024u;
  // Many readers sleep on deadlines at once; let the kernel keep many requests queued.
  conn->max_background = 128;
  conn->congestion_threshold = 96;
  conn->want |= FUSE_CAP_ASYNC_READ;
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE |
                                       FUSE_CAP_SPLICE_MOVE | FUSE_CAP_WRITEBACK_CACHE);
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& fs = fs_of(req);
  fuse_entry_param e{};
  e.attr_timeout = e.entry_timeout = kAttrTimeout;
  if (parent == kRootIno) {
    fuse_ino_t ino = 0;
    if (std::strcmp(name, kStatsName) == 0) ino = kStatsIno;
    else if (std::strcmp(name, kRequestsName) == 0) ino = kRequestsIno;
    else if (std::strcmp(name, kControlName) == 0) ino = kControlIno;
    else if (int n = parse_node_name(name, fs.options().nodes); n >= 0)
      ino = kFirstNodeIno + static_cast<fuse_ino_t>(n);
    if (!ino) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if (int err = attr_of(fs, ino, e.attr)) {
      fuse_reply_err(req, err);
      return;
    }
    e.ino = ino;
    fuse_reply_entry(req, &e);
    return;
  }
  Filesystem::Inode dir;
  if (!fs.inode(parent, dir) || dir.node < 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) {
    fuse_reply_err(req, ENOENT);  // the kernel resolves these itself; never leave SRC
    return;
  }
  const std::string rel = join(dir.rel, name);
  if (fstatat(fs.src_fd(), rel.c_str(), &e.attr, AT_SYMLINK_NOFOLLOW) != 0) {
    fuse_reply_err(req, errno);
    return;
  }
  e.ino = fs.intern(dir.node, rel, e.attr.st_ino);
  e.attr.st_ino = e.ino;
  e.attr.st_mode &= ~static_cast<mode_t>(S_IWUSR | S_IWGRP | S_IWOTH);
  if (fuse_reply_entry(req, &e) != 0) fs.forget(e.ino, 1);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, std::uint64_t nlookup) {
  fs_of(req).forget(ino, nlookup);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, std::size_t count, fuse_forget_data* forgets) {
  auto& fs = fs_of(req);
  for (std::size_t i = 0; i < count; ++i) fs.forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  if (int err = attr_of(fs_of(req), ino, st)) {
    fuse_reply_err(req, err);
    return;
  }
  fuse_reply_attr(req, &st, kAttrTimeout);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat*, int, fuse_file_info*) {
  if (ino != kControlIno) {  // open(O_TRUNC) of the control file arrives as a setattr
    fuse_reply_err(req, EROFS);
    return;
  }
  struct stat st;
  synthetic_attr(fs_of(req), ino, st);
  fuse_reply_attr(req, &st, kAttrTimeout);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  auto& fs = fs_of(req);
  Filesystem::Inode in;
  if (!fs.inode(ino, in) || in.rel.empty()) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  char buf[4096];
  const ssize_t n = readlinkat(fs.src_fd(), in.rel.c_str(), buf, sizeof buf - 1);
  if (n < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  buf[n] = '\0';
  fuse_reply_readlink(req, buf);
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& fs = fs_of(req);
  auto h = std::make_unique<DirHandle>();
  h->entries.push_back({".", ino, S_IFDIR});
  h->entries.push_back({"..", kRootIno, S_IFDIR});
  if (ino == kRootIno) {
    for (int i = 0; i < fs.options().nodes; ++i)
      h->entries.push_back(
          {"node" + std::to_string(i), kFirstNodeIno + static_cast<fuse_ino_t>(i), S_IFDIR});
    h->entries.push_back({kStatsName, kStatsIno, S_IFREG});
    h->entries.push_back({kRequestsName, kRequestsIno, S_IFREG});
    h->entries.push_back({kControlName, kControlIno, S_IFREG});
  } else {
    Filesystem::Inode in;
    if (!fs.inode(ino, in) || in.node < 0) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    const int fd = openat(fs.src_fd(), rel_or_dot(in.rel), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      fuse_reply_err(req, errno);
      return;
    }
    DIR* d = fdopendir(fd);
    if (!d) {
      const int err = errno;
      close(fd);
      fuse_reply_err(req, err);
      return;
    }
    while (dirent* de = readdir(d)) {
      if (std::strcmp(de->d_name, ".") == 0 || std::strcmp(de->d_name, "..") == 0) continue;
      // d_ino only has to be non-zero (some libcs skip 0); lookup assigns the real one.
      h->entries.push_back(
          {de->d_name, de->d_ino ? de->d_ino : 1, static_cast<mode_t>(DTTOIF(de->d_type))});
    }
    closedir(d);
  }
  fi->fh = reinterpret_cast<std::uint64_t>(h.get());
  if (fuse_reply_open(req, fi) == 0) h.release();
}

void op_readdir(fuse_req_t req, fuse_ino_t, std::size_t size, off_t off, fuse_file_info* fi) {
  auto* h = reinterpret_cast<DirHandle*>(fi->fh);
  std::vector<char> buf(size);
  std::size_t pos = 0;
  for (std::size_t i = static_cast<std::size_t>(std::max<off_t>(off, 0)); i < h->entries.size();
       ++i) {
    struct stat st {};
    st.st_ino = h->entries[i].ino;
    st.st_mode = h->entries[i].type;
    const std::size_t n =
        fuse_add_direntry(req, buf.data() + pos, size - pos, h->entries[i].name.c_str(), &st,
                          static_cast<off_t>(i + 1));
    if (n > size - pos) break;
    pos += n;
  }
  fuse_reply_buf(req, buf.data(), pos);
}

void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  delete reinterpret_cast<DirHandle*>(fi->fh);
  fuse_reply_err(req, 0);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& fs = fs_of(req);
  const int acc = fi->flags & O_ACCMODE;
  if (ino == kControlIno) {
    fi->direct_io = 1;
    fi->fh = 0;
    fuse_reply_open(req, fi);
    return;
  }
  if (acc != O_RDONLY || (fi->flags & O_TRUNC)) {
    fuse_reply_err(req, EROFS);
    return;
  }
  if (is_text(ino)) {
    // A snapshot taken at open: a reader sees one consistent document however it reads.
    const double give_up = fs.now() + 0.2;  // bounded: a stuck reply must not hang stats
    while (fs.replying.load() > 0 && fs.now() < give_up) {
      const timespec pause{0, 20000};
      nanosleep(&pause, nullptr);
    }
    auto h = std::make_shared<Handle>();
    h->text = ino == kStatsIno ? fs.stats_json() : fs.accounting.requests_jsonl();
    fi->direct_io = 1;  // size is reported as 0; direct I/O reads past it
    fi->fh = fs.add_handle(std::move(h));
    if (fuse_reply_open(req, fi) != 0) fs.drop_handle(fi->fh);
    return;
  }
  Filesystem::Inode in;
  if (!fs.inode(ino, in) || in.node < 0) {
    fuse_reply_err(req, ino == kRootIno ? EISDIR : ENOENT);
    return;
  }
  auto h = std::make_shared<Handle>();
  h->fd = openat(fs.src_fd(), rel_or_dot(in.rel), O_RDONLY | O_CLOEXEC);
  if (h->fd < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  struct stat st;
  if (fstat(h->fd, &st) != 0) {
    fuse_reply_err(req, errno);
    return;
  }
  h->size = static_cast<std::uint64_t>(st.st_size);
  h->node = in.node;
  h->file = fs.accounting.intern(in.rel);
  h->hash = fnv1a(in.rel);
  h->rel = in.rel;
  h->direct = (fi->flags & O_DIRECT) != 0;
  // An O_DIRECT open bypasses this node's page cache: every read becomes a request of
  // the application's size. The source is still read through the host's page cache like
  // every other request, so direct and buffered opens see the same modelled storage.
  if (h->direct) fi->direct_io = 1;
  fi->keep_cache = 1;  // also on O_DIRECT opens: they must not wipe the node's cache
  fi->noflush = 1;
  fi->fh = fs.add_handle(std::move(h));
  if (fuse_reply_open(req, fi) != 0) fs.drop_handle(fi->fh);
}

void op_read(fuse_req_t req, fuse_ino_t ino, std::size_t size, off_t off, fuse_file_info* fi) {
  auto& fs = fs_of(req);
  if (ino == kControlIno) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  const std::shared_ptr<Handle> h = fs.handle(fi->fh);
  if (!h) {
    fuse_reply_err(req, EBADF);
    return;
  }
  if (is_text(ino)) {
    const auto uoff = static_cast<std::size_t>(std::max<off_t>(off, 0));
    if (uoff >= h->text.size()) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    fuse_reply_buf(req, h->text.data() + uoff, std::min(size, h->text.size() - uoff));
    return;
  }
  thread_local Buffer buffer;
  thread_local bool slack_set = false;
  if (!slack_set) {  // the default 50 us timer slack would overshoot every deadline
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    slack_set = true;
  }
  const FaultAction fault = fs.fault_for(h->rel);
  if (fault.stall_s > 0) fs.stall(fault.stall_s);
  if (fault.err != 0) {
    fuse_reply_err(req, fault.err);
    return;
  }
  const double arrival = fs.now();
  const auto uoff = static_cast<std::uint64_t>(std::max<off_t>(off, 0));
  const std::uint64_t length = uoff >= h->size ? 0 : std::min<std::uint64_t>(size, h->size - uoff);
  const Charge charge = fs.model.charge(h->node, h->file, h->hash, uoff, length, arrival);

  char* buf = buffer.get(std::max<std::size_t>(size, 1));
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  ssize_t n = read_fully(h->fd, buf, size, off);
  if (n < 0) {
    fuse_reply_err(req, static_cast<int>(-n));
    return;
  }
  if (fault.shorten && n > 1) n /= 2;  // a short read: half of what was there
  RequestRecord r;
  r.arrival = arrival;
  r.modelled = charge.cost;
  r.offset = uoff;
  r.size = static_cast<std::uint32_t>(n);
  r.file = h->file;
  r.node = static_cast<std::uint16_t>(h->node);
  r.seeks = static_cast<std::uint16_t>(std::min<std::uint32_t>(charge.seeks, 65535));
  r.direct = h->direct;
  // The client has the data when the reply's copy completes: start it that much early.
  // The kernel path to and from the reader is part of the modelled latency: reply that
  // much earlier too, and count it in the service time (what the client sees).
  const double path = fs.path(size);
  sleep_until(
      fs.to_timespec(charge.deadline - path - fs.copy_cost.predict(static_cast<std::size_t>(n))));
  const double released = fs.now();
  fs.replying.fetch_add(1);
  fuse_reply_buf(req, buf, static_cast<std::size_t>(n));
  const double replied = fs.now();
  fs.copy_cost.record(static_cast<std::size_t>(n), replied - released);
  r.service = replied - arrival + path;
  fs.accounting.record(r);
  fs.replying.fetch_sub(1);
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* data, std::size_t size, off_t,
              fuse_file_info*) {
  if (ino != kControlIno) {
    fuse_reply_err(req, EROFS);
    return;
  }
  auto& fs = fs_of(req);
  std::string text(data, size);
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (line.empty()) continue;
    if (int err = fs.control(line)) {
      fuse_reply_err(req, err);
      return;
    }
  }
  fuse_reply_write(req, size);
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino != kControlIno) fs_of(req).drop_handle(fi->fh);
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs sv;
  if (fstatvfs(fs_of(req).src_fd(), &sv) != 0) {
    fuse_reply_err(req, errno);
    return;
  }
  fuse_reply_statfs(req, &sv);
}

void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  fuse_reply_err(req, (mask & W_OK) && ino != kControlIno ? EROFS : 0);
}

void erofs_entry(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) {
  fuse_reply_err(req, EROFS);
}
void erofs_mkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) { fuse_reply_err(req, EROFS); }
void erofs_name(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void erofs_symlink(fuse_req_t req, const char*, fuse_ino_t, const char*) {
  fuse_reply_err(req, EROFS);
}
void erofs_rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned) {
  fuse_reply_err(req, EROFS);
}
void erofs_link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void erofs_create(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) {
  fuse_reply_err(req, EROFS);
}
void erofs_setxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, std::size_t, int) {
  fuse_reply_err(req, EROFS);
}

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = op_lookup;
  ops.forget = op_forget;
  ops.forget_multi = op_forget_multi;
  ops.getattr = op_getattr;
  ops.setattr = op_setattr;
  ops.readlink = op_readlink;
  ops.opendir = op_opendir;
  ops.readdir = op_readdir;
  ops.releasedir = op_releasedir;
  ops.open = op_open;
  ops.read = op_read;
  ops.write = op_write;
  ops.release = op_release;
  ops.statfs = op_statfs;
  ops.access = op_access;
  ops.mknod = erofs_entry;
  ops.mkdir = erofs_mkdir;
  ops.unlink = erofs_name;
  ops.rmdir = erofs_name;
  ops.symlink = erofs_symlink;
  ops.rename = erofs_rename;
  ops.link = erofs_link;
  ops.create = erofs_create;
  ops.setxattr = erofs_setxattr;
  ops.removexattr = erofs_name;
  return ops;
}

}  // namespace

// ---- handles -----------------------------------------------------------------------

std::uint64_t Filesystem::add_handle(std::shared_ptr<Handle> h) {
  std::lock_guard lock(handles_mu_);
  const std::uint64_t id = next_handle_++;
  handles_.emplace(id, std::move(h));
  return id;
}

std::shared_ptr<Handle> Filesystem::handle(std::uint64_t id) {
  std::lock_guard lock(handles_mu_);
  auto it = handles_.find(id);
  return it == handles_.end() ? nullptr : it->second;
}

void Filesystem::drop_handle(std::uint64_t id) {
  std::shared_ptr<Handle> last;  // closed outside the lock
  std::lock_guard lock(handles_mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) return;
  last = std::move(it->second);
  handles_.erase(it);
}

// ---- CopyCost ---------------------------------------------------------------------

void CopyCost::record(std::size_t bytes, double seconds) {
  if (bytes < kMinBytes) return;
  std::lock_guard lock(mu_);
  per_byte_[count_++ % kWindow] = seconds / static_cast<double>(bytes);
}

double CopyCost::predict(std::size_t bytes) const {
  std::lock_guard lock(mu_);
  if (count_ < kMinSamples) return 0;
  const std::size_t n = std::min(count_, kWindow);
  const double best = *std::min_element(per_byte_, per_byte_ + n);
  return best * static_cast<double>(bytes);
}

// ---- Filesystem -------------------------------------------------------------------

Filesystem::Filesystem(Options opts)
    : model(opts.model, opts.nodes), accounting(opts.nodes, opts.log_requests),
      opts_(std::move(opts)), next_ino_(kFirstNodeIno + static_cast<fuse_ino_t>(opts_.nodes)) {
  src_fd_ = open(opts_.src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (src_fd_ < 0)
    throw std::runtime_error("cannot open source directory " + opts_.src + ": " +
                             std::strerror(errno));
  clock_gettime(CLOCK_MONOTONIC, &t0_);
  clock_gettime(CLOCK_REALTIME, &started_);
}

Filesystem::~Filesystem() {
  if (src_fd_ >= 0) close(src_fd_);
}

const fuse_lowlevel_ops& Filesystem::operations() {
  static const fuse_lowlevel_ops ops = make_ops();
  return ops;
}

double Filesystem::now() const {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec - t0_.tv_sec) +
         1e-9 * static_cast<double>(t.tv_nsec - t0_.tv_nsec);
}

timespec Filesystem::to_timespec(double t) const {
  const double whole = static_cast<double>(static_cast<long long>(t));
  timespec out;
  out.tv_sec = t0_.tv_sec + static_cast<time_t>(whole);
  long long ns = t0_.tv_nsec + static_cast<long long>((t - whole) * 1e9);
  if (ns >= 1000000000LL) {
    out.tv_sec += 1;
    ns -= 1000000000LL;
  }
  out.tv_nsec = static_cast<long>(ns);
  return out;
}

bool Filesystem::inode(fuse_ino_t ino, Inode& out) {
  if (is_node_root(*this, ino)) {
    out = Inode{static_cast<int>(ino - kFirstNodeIno), "", 0, 0};
    return true;
  }
  std::lock_guard lock(inodes_mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return false;
  out = it->second;
  return true;
}

namespace {
std::string inode_key(int node, const std::string& rel, ino_t src_ino) {
  // The source inode is part of the key: a file replaced by rename gets a new inode
  // here too, so the kernel drops the old pages instead of serving them.
  return std::to_string(node) + '\0' + rel + '\0' + std::to_string(src_ino);
}
}  // namespace

fuse_ino_t Filesystem::intern(int node, const std::string& rel, ino_t src_ino) {
  const std::string key = inode_key(node, rel, src_ino);
  std::lock_guard lock(inodes_mu_);
  auto [it, added] = by_key_.try_emplace(key, next_ino_);
  if (added) {
    inodes_[next_ino_] = Inode{node, rel, src_ino, 0};
    ++next_ino_;
  }
  ++inodes_[it->second].nlookup;
  return it->second;
}

void Filesystem::forget(fuse_ino_t ino, std::uint64_t n) {
  std::lock_guard lock(inodes_mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return;  // fixed entries are never forgotten
  it->second.nlookup -= std::min(n, it->second.nlookup);
  if (it->second.nlookup == 0) {
    by_key_.erase(inode_key(it->second.node, it->second.rel, it->second.src_ino));
    inodes_.erase(it);
  }
}

int Filesystem::drop_caches(int node) {
  if (node >= opts_.nodes) return EINVAL;
  std::vector<fuse_ino_t> inos;
  {
    std::lock_guard lock(inodes_mu_);
    for (const auto& [ino, in] : inodes_)
      if (node < 0 || in.node == node) inos.push_back(ino);
  }
  // Inodes the kernel already forgot have no cache; -ENOENT for them is expected.
  for (fuse_ino_t ino : inos) fuse_lowlevel_notify_inval_inode(session_, ino, 0, 0);
  return 0;
}

// fault KIND MATCH [count=N] [skip=K] [seconds=S] | fault clear  (docs/emulator.md)
int Filesystem::add_fault(const std::string& line) {
  std::vector<std::string> w;
  for (std::size_t i = 0; i < line.size();) {
    const std::size_t j = std::min(line.find(' ', i), line.size());
    if (j > i) w.push_back(line.substr(i, j - i));
    i = j + 1;
  }
  if (w.size() == 2 && w[1] == "clear") {
    {
      std::lock_guard lock(faults_mu_);
      faults_.clear();
      ++stall_epoch_;
    }
    stall_cv_.notify_all();
    return 0;
  }
  if (w.size() < 3) return EINVAL;
  Fault f;
  f.kind = w[1];
  f.match = w[2] == "*" ? "" : w[2];
  static const char* kinds[] = {"eio", "estale", "enoent", "eintr", "short", "stall"};
  if (std::find(std::begin(kinds), std::end(kinds), f.kind) == std::end(kinds)) return EINVAL;
  for (std::size_t i = 3; i < w.size(); ++i) {
    const std::size_t eq = w[i].find('=');
    if (eq == std::string::npos) return EINVAL;
    const std::string key = w[i].substr(0, eq), val = w[i].substr(eq + 1);
    char* end = nullptr;
    const double x = std::strtod(val.c_str(), &end);
    if (val.empty() || *end != '\0' || x < 0 || x > 1e9) return EINVAL;
    if (key == "count") f.count = static_cast<long>(x);
    else if (key == "skip") f.skip = static_cast<long>(x);
    else if (key == "seconds") f.seconds = x;
    else return EINVAL;
  }
  std::lock_guard lock(faults_mu_);
  faults_.push_back(f);
  return 0;
}

FaultAction Filesystem::fault_for(const std::string& rel) {
  FaultAction a;
  std::lock_guard lock(faults_mu_);
  for (Fault& f : faults_) {
    if (!f.match.empty() && rel.find(f.match) == std::string::npos) continue;
    if (f.seen++ < f.skip) continue;
    if (f.count > 0 && f.fired >= f.count) continue;
    ++f.fired;
    ++faults_fired_;
    if (f.kind == "eio") a.err = EIO;
    else if (f.kind == "estale") a.err = ESTALE;
    else if (f.kind == "enoent") a.err = ENOENT;
    else if (f.kind == "eintr") a.err = EINTR;
    else if (f.kind == "short") a.shorten = true;
    else if (f.kind == "stall") a.stall_s = f.seconds > 0 ? f.seconds : 45.0;
    return a;
  }
  return a;
}

void Filesystem::stall(double seconds) {
  std::unique_lock lock(faults_mu_);
  const std::uint64_t epoch = stall_epoch_;
  stall_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                     [&] { return stall_epoch_ != epoch; });
}

int Filesystem::control(const std::string& line) {
  if (line.rfind("fault ", 0) == 0) return add_fault(line);
  if (line == "reset") {
    accounting.reset();
    return 0;
  }
  if (line == "reset-model") {
    model.reset();
    return 0;
  }
  if (line == "drop") return drop_caches(-1);
  if (line.rfind("drop ", 0) == 0) {
    char* end = nullptr;
    const long n = std::strtol(line.c_str() + 5, &end, 10);
    if (end == line.c_str() + 5 || *end != '\0' || n < 0) return EINVAL;
    return drop_caches(static_cast<int>(std::min<long>(n, 1 << 20)));
  }
  return EINVAL;
}

std::string Filesystem::stats_json() {
  const ModelParams& p = model.params();
  char params[1024];
  std::snprintf(params, sizeof params,
                "{\"latency_us\": %.3f, \"node_mbps\": %.3f, \"aggregate_mbps\": %.3f, "
                "\"server_mbps\": %.3f, \"servers\": %d, \"stripe_count\": %d, "
                "\"stripe_kib\": %llu, \"seek_us\": %.3f, \"server_concurrency\": %d, "
                "\"burst_kib\": %llu, \"readahead_kib\": %u, \"max_request_kib\": %u, "
                "\"log_requests\": %zu, \"max_threads\": %d, \"path_us\": %.3f}",
                p.latency_us, p.node_mbps, p.aggregate_mbps, p.server_mbps, p.servers,
                p.stripe_count, static_cast<unsigned long long>(p.stripe_bytes / 1024), p.seek_us,
                p.server_concurrency, static_cast<unsigned long long>(p.burst_bytes / 1024),
                opts_.readahead_kib, opts_.max_request_kib, opts_.log_requests, opts_.max_threads,
                opts_.path_us);
  std::string out =
      "{\"version\": 1, \"pid\": " + std::to_string(getpid()) +
      ", \"src\": " + json_string(opts_.src) +
      ", \"mountpoint\": " + json_string(opts_.mountpoint) +
      ", \"nodes\": " + std::to_string(opts_.nodes) + ", \"uptime_s\": " + std::to_string(now()) +
      ", \"effective_readahead_kib\": " + std::to_string(effective_readahead_kib_) +
      ", \"reply_copy_us_per_mib\": " + std::to_string(copy_cost.predict(1u << 20) * 1e6) +
      ", \"path_us\": " + std::to_string(path(0) * 1e6) +
      ", \"path_us_per_mib\": " + std::to_string((path(1u << 20) - path(0)) * 1e6) +
      ", \"faults_fired\": " + std::to_string(faults_fired()) + ", \"params\": " + params + ", " +
      accounting.totals_json() + "}\n";
  return out;
}

}  // namespace feedline::emulator
