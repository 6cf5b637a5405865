// SPDX-License-Identifier: Apache-2.0
// LMDB on-disk format: counting pread file, meta selection, page validation and the
// page-level LmdbFile (read a page, cursor walks). The breadth-first indexer is in
// lmdb_index.cpp. Layout learnt from liblmdb 0.9 mdb.c (MDB_page, MDB_node, MDB_meta).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include <feedline/detail/errno_text.hpp>
#include <feedline/detail/lmdb_format.hpp>
#include <feedline/errors.hpp>
#include <feedline/lmdb.hpp>

namespace feedline::lmdb {
namespace detail {

// ------------------------------------------------------------------------ PreadFile

PreadFile::PreadFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    throw StorageFailure(path, 0, err, std::string("open: ") + feedline::detail::errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw StorageFailure(path, 0, err, std::string("fstat: ") + feedline::detail::errno_text(err));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

PreadFile::~PreadFile() {
  if (fd_ >= 0) ::close(fd_);
}

PreadFile::PreadFile(PreadFile&& o) noexcept
    : bytes_read(o.bytes_read), read_ops(o.read_ops), path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}

PreadFile& PreadFile::operator=(PreadFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    bytes_read = o.bytes_read;
    read_ops = o.read_ops;
  }
  return *this;
}

std::uint64_t PreadFile::read(std::uint64_t off, std::uint64_t len, std::uint8_t* out) {
  std::uint64_t done = 0;
  while (done < len) {
    const ssize_t r = ::pread(fd_, out + done, len - done, static_cast<off_t>(off + done));
    ++read_ops;
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw StorageFailure(path_, off + done, err,
                           std::string("pread: ") + feedline::detail::errno_text(err));
    }
    if (r == 0) break;
    done += static_cast<std::uint64_t>(r);
    bytes_read += static_cast<std::uint64_t>(r);
  }
  return done;
}

void PreadFile::read_exact(std::uint64_t off, std::uint64_t len, std::uint8_t* out,
                           const char* what) {
  const std::uint64_t got = read(off, len, out);
  if (got != len) {
    throw CorruptData(path_, off + got,
                      std::string("file ends inside ") + what +
                          " (truncated: " + std::to_string(size_) + " bytes)");
  }
}

// ----------------------------------------------------------------------------- meta

namespace {

struct MetaCandidate {
  bool valid = false;
  bool unsupported = false;
  std::string problem;
  Meta meta;
};

DbInfo parse_db(const std::uint8_t* p) {
  DbInfo d;
  d.flags = load<std::uint16_t>(p + 4);
  d.depth = load<std::uint16_t>(p + 6);
  d.branch_pages = load<std::uint64_t>(p + 8);
  d.leaf_pages = load<std::uint64_t>(p + 16);
  d.overflow_pages = load<std::uint64_t>(p + 24);
  d.entries = load<std::uint64_t>(p + 32);
  d.root = load<std::uint64_t>(p + 40);
  return d;
}

MetaCandidate parse_meta(const std::uint8_t* buf, std::uint64_t expected_pgno) {
  MetaCandidate c;
  const std::uint32_t magic = load<std::uint32_t>(buf + kPageHeader);
  if (magic != kMagic) {
    if (load<std::uint32_t>(buf + kPageHeader32) == kMagic) {
      c.unsupported = true;
      c.problem = "32-bit LMDB file (12-byte page header); feedline reads 64-bit LMDB files";
    } else if (magic == __builtin_bswap32(kMagic) ||
               load<std::uint32_t>(buf + kPageHeader32) == __builtin_bswap32(kMagic)) {
      c.unsupported = true;
      c.problem = "big-endian LMDB file; feedline reads little-endian LMDB files";
    } else {
      c.problem = "bad magic (not an LMDB meta page)";
    }
    return c;
  }
  const std::uint16_t flags = load<std::uint16_t>(buf + 10);
  const std::uint64_t pgno = load<std::uint64_t>(buf);
  if (flags != kMetaPage) {
    c.problem = "page flags are not those of a meta page";
    return c;
  }
  if (pgno != expected_pgno) {
    c.problem = "meta page header carries page number " + std::to_string(pgno);
    return c;
  }
  const std::uint8_t* m = buf + kPageHeader;
  Meta& meta = c.meta;
  meta.version = load<std::uint32_t>(m + 4);
  if (meta.version != kDataVersion) {
    c.unsupported = true;
    c.problem = meta.version == kDevelVersion
                    ? std::string("LMDB development (MDB_DEVEL) data format")
                    : "LMDB data version " + std::to_string(meta.version) +
                          " (feedline reads version 1, liblmdb 0.9)";
    return c;
  }
  meta.map_size = load<std::uint64_t>(m + 16);
  meta.free_db = parse_db(m + 24);
  meta.main_db = parse_db(m + 24 + kDbSize);
  meta.page_size = load<std::uint32_t>(m + 24);  // mm_psize is FREE_DBI's md_pad
  meta.last_pgno = load<std::uint64_t>(m + 120);
  meta.txnid = load<std::uint64_t>(m + 128);
  const std::uint32_t ps = meta.page_size;
  if (ps == 65536) {
    c.unsupported = true;
    c.problem = "page size 65536 (needs LMDB's development format)";
    return c;
  }
  if (ps < kMinPageSize || ps > kMaxPageSize || (ps & (ps - 1)) != 0) {
    c.problem = "page size " + std::to_string(ps) + " is not a power of two in [512, 32768]";
    return c;
  }
  c.valid = true;
  return c;
}

void check_db(const std::string& path, const Meta& m, const DbInfo& d, bool main,
              std::uint64_t field_off) {
  const char* name = main ? "main database" : "free-page database";
  if (d.flags & ~(main ? kKnownDbFlags : 0xFFFF)) {
    throw CorruptData(path, field_off + 4, std::string(name) + " has unknown flags");
  }
  if (main && (d.flags & (kDupSort | kDupFixed | kIntegerDup | kReverseDup))) {
    throw Unsupported(path,
                      "the main database is DUPSORT (sorted duplicates); feedline reads "
                      "one value per key");
  }
  if (d.root == kInvalidPage) {
    if (d.depth != 0 || d.entries != 0 || d.branch_pages != 0 || d.leaf_pages != 0 ||
        d.overflow_pages != 0) {
      throw CorruptData(path, field_off, std::string(name) + " has no root but claims pages");
    }
    return;
  }
  if (d.root < 2 || d.root > m.last_pgno) {
    throw CorruptData(path, field_off + 40,
                      std::string(name) + " root page " + std::to_string(d.root) +
                          " is outside [2, last page " + std::to_string(m.last_pgno) + "]");
  }
  if (d.depth < 1 || d.depth > kMaxDepth) {
    throw CorruptData(
        path, field_off + 6,
        std::string(name) + " depth " + std::to_string(d.depth) + " is not in [1, 32]");
  }
}

}  // namespace

Meta read_meta(PreadFile& file) {
  const std::string& path = file.path();
  if (file.size() < kMetaRead) {
    throw CorruptData(
        path, file.size(),
        "file of " + std::to_string(file.size()) + " bytes is too short to hold an LMDB meta page");
  }
  std::uint8_t buf0[kMetaRead];
  std::uint8_t buf1[kMetaRead];
  file.read_exact(0, kMetaRead, buf0, "meta page 0");
  MetaCandidate c0 = parse_meta(buf0, 0);
  if (c0.unsupported) throw Unsupported(path, c0.problem);

  // Meta page 1 sits one page in; without a valid meta 0 we try every page size.
  std::vector<std::uint32_t> sizes;
  if (c0.valid) {
    sizes.push_back(c0.meta.page_size);
  } else {
    for (std::uint32_t ps = kMinPageSize; ps <= kMaxPageSize; ps *= 2) sizes.push_back(ps);
  }
  MetaCandidate c1;
  c1.problem = "not found";
  for (const std::uint32_t ps : sizes) {
    if (ps + std::uint64_t{kMetaRead} > file.size()) {
      if (c0.valid) c1.problem = "file ends before meta page 1";
      break;
    }
    file.read_exact(ps, kMetaRead, buf1, "meta page 1");
    MetaCandidate c = parse_meta(buf1, 1);
    if (c.unsupported && !c0.valid) throw Unsupported(path, c.problem);
    if (c.valid && c.meta.page_size != ps) {
      c.valid = false;
      c.problem = "page size " + std::to_string(c.meta.page_size) + " contradicts its position";
    }
    if (c.valid || c0.valid) {
      c1 = std::move(c);
      break;
    }
  }
  if (!c0.valid && !c1.valid) {
    throw CorruptData(
        path, 0, "no valid meta page (meta 0: " + c0.problem + "; meta 1: " + c1.problem + ")");
  }
  const bool use1 = c1.valid && (!c0.valid || c1.meta.txnid > c0.meta.txnid);
  Meta m = use1 ? c1.meta : c0.meta;
  m.meta_page = use1 ? 1 : 0;
  m.other_meta_valid = c0.valid && c1.valid;
  m.file_bytes = file.size();
  const std::uint64_t meta_off = use1 ? m.page_size : 0;
  if (file.size() < 2ull * m.page_size) {
    throw CorruptData(path, file.size(), "file is shorter than its two meta pages (truncated)");
  }
  if (m.last_pgno < 1 || m.last_pgno > (std::uint64_t{1} << 62) / m.page_size) {
    throw CorruptData(path, meta_off + kPageHeader + 120,
                      "last page number " + std::to_string(m.last_pgno) + " is implausible");
  }
  check_db(path, m, m.free_db, false, meta_off + kPageHeader + 24);
  check_db(path, m, m.main_db, true, meta_off + kPageHeader + 24 + kDbSize);
  return m;
}

// ------------------------------------------------------------------------ key order

KeyOrder key_order_of(std::uint16_t db_flags) noexcept {
  if (db_flags & kIntegerKey) return KeyOrder::integer;
  if (db_flags & kReverseKey) return KeyOrder::reverse_bytes;
  return KeyOrder::bytes;
}

int compare_keys(KeyOrder order, std::string_view a, std::string_view b) noexcept {
  switch (order) {
    case KeyOrder::integer: {
      if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
      std::uint64_t x = 0;
      std::uint64_t y = 0;
      std::memcpy(&x, a.data(), std::min<std::size_t>(a.size(), 8));
      std::memcpy(&y, b.data(), std::min<std::size_t>(b.size(), 8));
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    case KeyOrder::reverse_bytes: {
      std::size_t i = a.size();
      std::size_t j = b.size();
      while (i > 0 && j > 0) {
        --i;
        --j;
        const auto ca = static_cast<unsigned char>(a[i]);
        const auto cb = static_cast<unsigned char>(b[j]);
        if (ca != cb) return ca < cb ? -1 : 1;
      }
      return i > 0 ? 1 : (j > 0 ? -1 : 0);
    }
    case KeyOrder::bytes:
    default: {
      const std::size_t n = std::min(a.size(), b.size());
      const int c = n ? std::memcmp(a.data(), b.data(), n) : 0;
      if (c != 0) return c;
      return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
    }
  }
}

// ------------------------------------------------------------------------ page parse

std::uint16_t parse_tree_page(const PageContext& ctx, const std::uint8_t* p, std::uint64_t pgno,
                              std::vector<Node>& nodes) {
  const std::string& path = *ctx.path;
  const std::uint32_t psize = ctx.page_size;
  const std::uint64_t off = pgno * psize;
  const std::uint64_t self = load<std::uint64_t>(p);
  if (self != pgno) {
    throw CorruptData(path, off,
                      "page " + std::to_string(pgno) + " says it is page " + std::to_string(self));
  }
  const std::uint16_t flags = load<std::uint16_t>(p + 10);
  if (flags != kBranch && flags != kLeaf) {
    throw CorruptData(path, off + 10,
                      "page " + std::to_string(pgno) + " has flags " + std::to_string(flags) +
                          " where a branch or leaf page is expected");
  }
  const bool leaf = flags == kLeaf;
  const std::uint32_t lower = load<std::uint16_t>(p + 12);
  const std::uint32_t upper = load<std::uint16_t>(p + 14);
  if (lower < kPageHeader || ((lower - kPageHeader) & 1u) || lower > upper || upper > psize ||
      lower == kPageHeader) {
    throw CorruptData(path, off + 12,
                      "page " + std::to_string(pgno) + " has lower " + std::to_string(lower) +
                          " / upper " + std::to_string(upper) + " outside the page or empty");
  }
  const std::uint32_t n = (lower - kPageHeader) / 2;
  const std::size_t first = nodes.size();
  nodes.resize(first + n);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> spans(n);  // (start, padded size)
  std::uint64_t used = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    // i < n < 32768 (lower is a u16): 2 * i cannot overflow, widened or not.
    const std::uint32_t ptr = load<std::uint16_t>(p + kPageHeader + std::size_t{2} * i);
    const std::uint64_t slot_off = off + kPageHeader + std::uint64_t{2} * i;
    if (ptr < upper || (ptr & 1u) || ptr + kNodeHeader > psize) {
      throw CorruptData(path, slot_off,
                        "page " + std::to_string(pgno) + " slot " + std::to_string(i) +
                            " points to " + std::to_string(ptr) + ", outside the node area");
    }
    const std::uint8_t* q = p + ptr;
    const std::uint64_t lo = load<std::uint16_t>(q);
    const std::uint64_t hi = load<std::uint16_t>(q + 2);
    const std::uint16_t nflags = load<std::uint16_t>(q + 4);
    const std::uint32_t ksize = load<std::uint16_t>(q + 6);
    Node& nd = nodes[first + i];
    nd.key_pos = ptr + kNodeHeader;
    nd.key_size = ksize;
    std::uint64_t size = 0;
    if (!leaf) {
      // 64-bit builds keep the child page number's top 16 bits in the flags field.
      nd.child = lo | (hi << 16) | (std::uint64_t{nflags} << 32);
      size = even(kNodeHeader + ksize);
      if (nd.child < 2 || nd.child > ctx.last_pgno) {
        throw CorruptData(path, off + ptr,
                          "branch page " + std::to_string(pgno) + " points to page " +
                              std::to_string(nd.child) + ", outside [2, " +
                              std::to_string(ctx.last_pgno) + "]");
      }
    } else {
      const std::uint64_t dsize = lo | (hi << 16);
      if (!ctx.free_db && (nflags & kSubData)) {
        throw Unsupported(path, "the main database holds named sub-databases (F_SUBDATA at page " +
                                    std::to_string(pgno) + "); open one LMDB database per file");
      }
      if (!ctx.free_db && (nflags & kDupData)) {
        throw Unsupported(path, "the main database holds duplicate values (F_DUPDATA at page " +
                                    std::to_string(pgno) + ")");
      }
      if (nflags & ~kBigData) {
        throw CorruptData(path, off + ptr + 4,
                          "leaf node " + std::to_string(i) + " of page " + std::to_string(pgno) +
                              " has unknown flags " + std::to_string(nflags));
      }
      nd.flags = nflags;
      nd.value_length = dsize;
      if (nflags & kBigData) {
        size = even(kNodeHeader + ksize + 8);
        if (ptr + size <= psize) {
          const std::uint64_t ov = load<std::uint64_t>(q + kNodeHeader + ksize);
          const std::uint64_t pages = overflow_pages_for(dsize, psize);
          if (ov < 2 || ov > ctx.last_pgno || pages > ctx.last_pgno - ov + 1 ||
              (ov + pages) > ctx.file_bytes / psize) {
            throw CorruptData(path, off + ptr + kNodeHeader + ksize,
                              "overflow value of " + std::to_string(dsize) + " bytes at page " +
                                  std::to_string(ov) + " runs off the file (leaf page " +
                                  std::to_string(pgno) + ")");
          }
          nd.overflow_pgno = ov;
          nd.value_offset = ov * psize + kPageHeader;
        }
      } else {
        size = (kNodeHeader + ksize + dsize + 1) & ~std::uint64_t{1};
        nd.value_offset = off + ptr + kNodeHeader + ksize;
      }
    }
    if (ptr + size > psize) {
      throw CorruptData(path, off + ptr,
                        "node " + std::to_string(i) + " of page " + std::to_string(pgno) + " (" +
                            std::to_string(size) + " bytes) extends beyond the page");
    }
    spans[i] = {ptr, static_cast<std::uint32_t>(size)};
    used += size;
  }
  // liblmdb keeps nodes packed from `upper` to the end of the page; exact tiling
  // catches damaged sizes and slot pointers that stay inside the page.
  if (used != psize - upper) {
    throw CorruptData(path, off + 14,
                      "nodes of page " + std::to_string(pgno) + " cover " + std::to_string(used) +
                          " bytes, the node area has " + std::to_string(psize - upper));
  }
  std::sort(spans.begin(), spans.end());
  for (std::uint32_t i = 1; i < n; ++i) {
    if (spans[i - 1].first + spans[i - 1].second > spans[i].first) {
      throw CorruptData(path, off + spans[i].first,
                        "nodes of page " + std::to_string(pgno) + " overlap");
    }
  }
  return flags;
}

}  // namespace detail

// ------------------------------------------------------------------------- LmdbFile

using detail::load;

struct LmdbFile::Impl {
  explicit Impl(const std::string& p) : file(p), meta(detail::read_meta(file)) {
    ctx.path = &file.path();
    ctx.page_size = meta.page_size;
    ctx.last_pgno = meta.last_pgno;
    ctx.file_bytes = meta.file_bytes;
  }
  detail::PreadFile file;
  Meta meta;
  detail::PageContext ctx;
};

// Impl lives on the heap, so ctx.path (a pointer into Impl::file) survives moves.
LmdbFile::LmdbFile(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
LmdbFile::~LmdbFile() = default;
LmdbFile::LmdbFile(LmdbFile&&) noexcept = default;
LmdbFile& LmdbFile::operator=(LmdbFile&&) noexcept = default;

const Meta& LmdbFile::meta() const noexcept { return impl_->meta; }
const std::string& LmdbFile::path() const noexcept { return impl_->file.path(); }
std::uint64_t LmdbFile::bytes_read() const noexcept { return impl_->file.bytes_read; }
std::uint64_t LmdbFile::read_ops() const noexcept { return impl_->file.read_ops; }

Page LmdbFile::read_page(std::uint64_t pgno) {
  const Meta& m = impl_->meta;
  const std::string& path = impl_->file.path();
  if (pgno > m.last_pgno) {
    throw CorruptData(
        path, 0,
        "page " + std::to_string(pgno) + " is beyond the last page " + std::to_string(m.last_pgno));
  }
  Page page;
  page.pgno = pgno;
  page.bytes.resize(m.page_size);
  const std::uint64_t off = pgno * m.page_size;
  impl_->file.read_exact(off, m.page_size, page.bytes.data(),
                         ("page " + std::to_string(pgno)).c_str());
  const std::uint8_t* p = page.bytes.data();
  page.flags = load<std::uint16_t>(p + 10);
  if (pgno < 2) {
    if (page.flags != detail::kMetaPage || load<std::uint64_t>(p) != pgno) {
      throw CorruptData(path, off, "page " + std::to_string(pgno) + " is not a meta page");
    }
    page.kind = PageKind::meta;
    return page;
  }
  if (page.flags == detail::kOverflow) {
    if (load<std::uint64_t>(p) != pgno) {
      throw CorruptData(path, off,
                        "overflow page " + std::to_string(pgno) + " carries page number " +
                            std::to_string(load<std::uint64_t>(p)));
    }
    page.kind = PageKind::overflow;
    page.overflow_pages = load<std::uint32_t>(p + 12);
    if (page.overflow_pages == 0 || page.overflow_pages > m.last_pgno - pgno + 1) {
      throw CorruptData(path, off + 12,
                        "overflow run of " + std::to_string(page.overflow_pages) +
                            " pages at page " + std::to_string(pgno) + " runs past the last page");
    }
    return page;
  }
  page.flags = detail::parse_tree_page(impl_->ctx, p, pgno, page.nodes);
  page.kind = page.flags == detail::kBranch ? PageKind::branch : PageKind::leaf;
  page.lower = load<std::uint16_t>(p + 12);
  page.upper = load<std::uint16_t>(p + 14);
  return page;
}

namespace {

// Reads tree pages along a cursor path and checks each has the kind its level needs.
class PathWalker {
 public:
  PathWalker(LmdbFile& f, SeekResult& r) : f_(f), r_(r), depth_(f.meta().main_db.depth) {}

  Page read(std::uint64_t pgno, std::size_t level) {
    Page p = f_.read_page(pgno);
    r_.pages_touched.push_back(pgno);
    const bool want_leaf = level + 1 == depth_;
    if ((p.kind != PageKind::leaf && p.kind != PageKind::branch) ||
        (p.kind == PageKind::leaf) != want_leaf) {
      throw CorruptData(f_.path(), pgno * f_.meta().page_size,
                        "page " + std::to_string(pgno) + " at tree level " + std::to_string(level) +
                            " is not a " + (want_leaf ? "leaf" : "branch") + " page (meta depth " +
                            std::to_string(depth_) + ")");
    }
    return p;
  }

  // Descend from path[level]'s current slot to the leftmost leaf below it.
  void descend(std::vector<Page>& path, Cursor& c, std::size_t level) {
    while (level + 1 < depth_) {
      const std::uint64_t child = path[level].nodes[c.slots[level]].child;
      path.push_back(read(child, level + 1));
      c.pages.push_back(child);
      c.slots.push_back(0);
      ++level;
    }
  }

 private:
  LmdbFile& f_;
  SeekResult& r_;
  std::size_t depth_;
};

}  // namespace

SeekResult LmdbFile::seek(std::uint64_t i) {
  const DbInfo& db = impl_->meta.main_db;
  if (i >= db.entries) {
    throw std::out_of_range("record " + std::to_string(i) + " out of range for " +
                            std::to_string(db.entries) + " records");
  }
  Cursor start;
  start.pages.push_back(db.root);
  start.slots.push_back(0);
  return advance(start, i);
}

SeekResult LmdbFile::advance(const Cursor& from, std::uint64_t n) {
  const DbInfo& db = impl_->meta.main_db;
  const std::string& path = impl_->file.path();
  if (db.root == kInvalidPage) throw std::out_of_range("the database is empty");
  if (from.pages.empty() || from.pages.size() != from.slots.size() ||
      from.pages.size() > db.depth || from.pages.front() != db.root) {
    throw std::invalid_argument("cursor does not start at the root of this database");
  }
  SeekResult r;
  PathWalker walker(*this, r);
  Cursor c;
  std::vector<Page> path_pages;
  // Re-read the given path and check it is a real path of this tree.
  for (std::size_t k = 0; k < from.pages.size(); ++k) {
    Page p = walker.read(from.pages[k], k);
    if (from.slots[k] >= p.nodes.size()) {
      throw std::invalid_argument("cursor slot beyond the page's nodes");
    }
    if (k + 1 < from.pages.size() && p.nodes[from.slots[k]].child != from.pages[k + 1]) {
      throw std::invalid_argument("cursor path is not a path of this tree");
    }
    path_pages.push_back(std::move(p));
    c.pages.push_back(from.pages[k]);
    c.slots.push_back(from.slots[k]);
  }
  walker.descend(path_pages, c, c.pages.size() - 1);  // partial path: go to its leftmost leaf
  c.record = from.record;

  std::unordered_set<std::uint64_t> leaves{c.pages.back()};
  std::uint64_t remaining = n;
  for (;;) {
    const std::size_t leaf_level = c.pages.size() - 1;
    const std::uint64_t after = path_pages[leaf_level].nodes.size() - 1 - c.slots[leaf_level];
    if (remaining <= after) {
      c.slots[leaf_level] += static_cast<std::uint32_t>(remaining);
      break;
    }
    remaining -= after + 1;
    // Up to the nearest ancestor with a right sibling, then down its leftmost path.
    std::size_t level = leaf_level;
    while (level > 0 && c.slots[level - 1] + 1 >= path_pages[level - 1].nodes.size()) --level;
    if (level == 0) {
      throw CorruptData(path, 0,
                        "walked past the last record before reaching record " +
                            std::to_string(from.record + n) + " (meta says " +
                            std::to_string(db.entries) + " records)");
    }
    --level;
    ++c.slots[level];
    path_pages.resize(level + 1);
    c.pages.resize(level + 1);
    c.slots.resize(level + 1);
    walker.descend(path_pages, c, level);
    if (!leaves.insert(c.pages.back()).second) {
      throw CorruptData(path, c.pages.back() * impl_->meta.page_size,
                        "leaf page " + std::to_string(c.pages.back()) + " reached twice (cycle)");
    }
  }
  c.record = from.record + n;
  const Page& leaf = path_pages.back();
  const Node& nd = leaf.nodes[c.slots.back()];
  r.value_offset = nd.value_offset;
  r.value_length = nd.value_length;
  r.key.assign(reinterpret_cast<const char*>(leaf.bytes.data()) + nd.key_pos, nd.key_size);
  r.cursor = std::move(c);
  return r;
}

}  // namespace feedline::lmdb
