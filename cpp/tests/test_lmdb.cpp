// SPDX-License-Identifier: Apache-2.0
// LMDB parser tests on byte images crafted here (no liblmdb): parse results for
// several page sizes, meta selection, and every error path of hostile input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <feedline/errors.hpp>
#include <feedline/lmdb.hpp>

namespace L = feedline::lmdb;

namespace {

constexpr std::uint16_t kBranch = 1, kLeaf = 2, kOverflow = 4, kMeta = 8;

template <class T>
void put(std::vector<std::uint8_t>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

struct Rec {
  std::string key;
  std::string value;
  std::uint16_t flags = 0;  // extra node flags to force (F_SUBDATA, F_DUPDATA)
};

// Builds an LMDB 0.9 data file image, 64-bit little-endian layout.
class Image {
 public:
  explicit Image(std::uint32_t psize) : ps(psize), bytes(2 * psize) {}

  std::uint64_t new_pages(std::uint64_t n) {
    const std::uint64_t pg = bytes.size() / ps;
    bytes.resize(bytes.size() + n * ps);
    return pg;
  }
  std::size_t at(std::uint64_t pg) const { return pg * ps; }

  // Returns the leaf's page; values longer than `inline_max` go to overflow pages.
  std::uint64_t leaf(const std::vector<Rec>& recs, std::size_t inline_max = 1000) {
    const std::uint64_t pg = new_pages(1);
    std::vector<std::uint64_t> ov(recs.size(), 0);
    for (std::size_t i = 0; i < recs.size(); ++i) {
      if (recs[i].value.size() > inline_max) {
        const std::uint64_t n = (16 - 1 + recs[i].value.size()) / ps + 1;
        ov[i] = new_pages(n);
        put<std::uint64_t>(bytes, at(ov[i]), ov[i]);
        put<std::uint16_t>(bytes, at(ov[i]) + 10, kOverflow);
        put<std::uint32_t>(bytes, at(ov[i]) + 12, static_cast<std::uint32_t>(n));
        std::memcpy(bytes.data() + at(ov[i]) + 16, recs[i].value.data(), recs[i].value.size());
        overflow_pages += n;
      }
    }
    header(pg, kLeaf);
    std::uint32_t upper = ps;
    for (std::size_t i = 0; i < recs.size(); ++i) {
      const bool big = ov[i] != 0;
      const std::uint32_t dsz = static_cast<std::uint32_t>(recs[i].value.size());
      const std::uint32_t raw = 8 + recs[i].key.size() + (big ? 8 : dsz);
      upper -= (raw + 1) & ~1u;
      const std::size_t n = at(pg) + upper;
      put<std::uint16_t>(bytes, n, dsz & 0xFFFF);
      put<std::uint16_t>(bytes, n + 2, dsz >> 16);
      put<std::uint16_t>(bytes, n + 4, (big ? 1 : 0) | recs[i].flags);
      put<std::uint16_t>(bytes, n + 6, static_cast<std::uint16_t>(recs[i].key.size()));
      std::memcpy(bytes.data() + n + 8, recs[i].key.data(), recs[i].key.size());
      if (big) {
        put<std::uint64_t>(bytes, n + 8 + recs[i].key.size(), ov[i]);
      } else {
        std::memcpy(bytes.data() + n + 8 + recs[i].key.size(), recs[i].value.data(), dsz);
      }
      put<std::uint16_t>(bytes, at(pg) + 16 + 2 * i, static_cast<std::uint16_t>(upper));
    }
    finish(pg, recs.size(), upper);
    ++leaf_pages;
    entries += recs.size();
    return pg;
  }

  // children: (separator key, child page); the first key is conventionally empty.
  std::uint64_t branch(const std::vector<std::pair<std::string, std::uint64_t>>& kids) {
    const std::uint64_t pg = new_pages(1);
    header(pg, kBranch);
    std::uint32_t upper = ps;
    for (std::size_t i = 0; i < kids.size(); ++i) {
      const auto& [key, child] = kids[i];
      upper -= (8 + key.size() + 1) & ~std::size_t{1};
      const std::size_t n = at(pg) + upper;
      put<std::uint16_t>(bytes, n, child & 0xFFFF);
      put<std::uint16_t>(bytes, n + 2, (child >> 16) & 0xFFFF);
      put<std::uint16_t>(bytes, n + 4, (child >> 32) & 0xFFFF);
      put<std::uint16_t>(bytes, n + 6, static_cast<std::uint16_t>(key.size()));
      std::memcpy(bytes.data() + n + 8, key.data(), key.size());
      put<std::uint16_t>(bytes, at(pg) + 16 + 2 * i, static_cast<std::uint16_t>(upper));
    }
    finish(pg, kids.size(), upper);
    ++branch_pages;
    return pg;
  }

  // Writes meta page `which` describing the main tree rooted at `root`.
  void meta(int which, std::uint64_t txnid, std::uint64_t root, std::uint16_t depth,
            std::uint16_t main_flags = 0) {
    const std::size_t b = at(static_cast<std::uint64_t>(which));
    put<std::uint64_t>(bytes, b, static_cast<std::uint64_t>(which));
    put<std::uint16_t>(bytes, b + 10, kMeta);
    const std::size_t m = b + 16;
    put<std::uint32_t>(bytes, m, 0xBEEFC0DE);
    put<std::uint32_t>(bytes, m + 4, 1);
    put<std::uint64_t>(bytes, m + 16, std::uint64_t{1} << 30);
    // free db: md_pad = page size, flags INTEGERKEY, empty
    put<std::uint32_t>(bytes, m + 24, ps);
    put<std::uint16_t>(bytes, m + 24 + 4, 0x08);
    put<std::uint64_t>(bytes, m + 24 + 40, L::kInvalidPage);
    const std::size_t d = m + 24 + 48;
    const bool empty = root == L::kInvalidPage;
    put<std::uint16_t>(bytes, d + 4, main_flags);
    put<std::uint16_t>(bytes, d + 6, depth);
    put<std::uint64_t>(bytes, d + 8, empty ? 0 : branch_pages);
    put<std::uint64_t>(bytes, d + 16, empty ? 0 : leaf_pages);
    put<std::uint64_t>(bytes, d + 24, empty ? 0 : overflow_pages);
    put<std::uint64_t>(bytes, d + 32, empty ? 0 : entries);
    put<std::uint64_t>(bytes, d + 40, root);
    put<std::uint64_t>(bytes, m + 120, bytes.size() / ps - 1);
    put<std::uint64_t>(bytes, m + 128, txnid);
  }
  std::size_t main_field(int which, std::size_t field) const { return at(which) + 16 + 72 + field; }

  std::string write() const {
    char name[] = "/tmp/feedline_lmdb_test_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
    return name;
  }

  std::uint32_t ps;
  std::vector<std::uint8_t> bytes;
  std::uint64_t branch_pages = 0, leaf_pages = 0, overflow_pages = 0, entries = 0;

 private:
  void header(std::uint64_t pg, std::uint16_t flags) {
    put<std::uint64_t>(bytes, at(pg), pg);
    put<std::uint16_t>(bytes, at(pg) + 10, flags);
  }
  void finish(std::uint64_t pg, std::size_t n, std::uint32_t upper) {
    put<std::uint16_t>(bytes, at(pg) + 12, static_cast<std::uint16_t>(16 + 2 * n));
    put<std::uint16_t>(bytes, at(pg) + 14, static_cast<std::uint16_t>(upper));
  }
};

std::string key(int i) {
  char b[16];
  std::snprintf(b, sizeof b, "k%05d", i);
  return b;
}

std::string value(int i, std::size_t n) {
  std::string v(n, '\0');
  for (std::size_t j = 0; j < n; ++j) v[j] = static_cast<char>((i * 131 + j * 7) & 0xFF);
  return v;
}

// A 2-level tree: `leaves` leaves of `per` records, every 5th value large (overflow).
struct Built {
  Image img;
  std::vector<Rec> recs;
  std::vector<std::uint64_t> leaf_pgnos;
  std::uint64_t root = 0;
};

Built build(std::uint32_t ps, int leaves = 3, int per = 4, std::size_t big = 3000) {
  Built b{Image(ps), {}, {}, 0};
  std::vector<std::pair<std::string, std::uint64_t>> kids;
  int i = 0;
  for (int l = 0; l < leaves; ++l) {
    std::vector<Rec> recs;
    for (int r = 0; r < per; ++r, ++i) {
      recs.push_back({key(i), value(i, i % 5 == 4 ? big : static_cast<std::size_t>(1 + i * 3))});
    }
    const std::uint64_t pg = b.img.leaf(recs, ps / 4);
    b.leaf_pgnos.push_back(pg);
    kids.emplace_back(l == 0 ? std::string() : recs.front().key, pg);
    b.recs.insert(b.recs.end(), recs.begin(), recs.end());
  }
  b.root = b.img.branch(kids);
  b.img.meta(0, 1, L::kInvalidPage, 0);
  b.img.meta(1, 2, b.root, 2);
  return b;
}

class TempFile {
 public:
  explicit TempFile(const Image& img) : path(img.write()) {}
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

void expect_index_matches(const Built& b, const L::Index& idx) {
  ASSERT_EQ(idx.offsets.size(), b.recs.size());
  ASSERT_EQ(idx.key_starts.size(), b.recs.size() + 1);
  for (std::size_t i = 0; i < b.recs.size(); ++i) {
    const std::string k(idx.key_blob.begin() + idx.key_starts[i],
                        idx.key_blob.begin() + idx.key_starts[i + 1]);
    EXPECT_EQ(k, b.recs[i].key);
    ASSERT_EQ(static_cast<std::size_t>(idx.lengths[i]), b.recs[i].value.size());
    const std::string v(b.img.bytes.begin() + idx.offsets[i],
                        b.img.bytes.begin() + idx.offsets[i] + idx.lengths[i]);
    EXPECT_EQ(v, b.recs[i].value) << "record " << i;
  }
}

template <class Fn>
void expect_corrupt(const Image& img, Fn&& fn, const char* what) {
  TempFile f(img);
  try {
    fn(f.path);
    ADD_FAILURE() << "no error for " << what;
  } catch (const feedline::CorruptData& e) {
    EXPECT_EQ(e.path, f.path);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": wrong exception type: " << e.what();
  }
}

void expect_corrupt(const Image& img, const char* what) {
  expect_corrupt(
      img, [](const std::string& p) { (void)L::index_lmdb(p); }, what);
}

void expect_unsupported(const Image& img, const char* what) {
  TempFile f(img);
  EXPECT_THROW((void)L::index_lmdb(f.path), feedline::Unsupported) << what;
}

}  // namespace

class LmdbPageSizes : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(LmdbPageSizes, IndexesTwoLevelTree) {
  const std::uint32_t ps = GetParam();
  Built b = build(ps, 4, 5, ps * 2 + 100);
  TempFile f(b.img);
  const L::Index idx = L::index_lmdb(f.path);
  expect_index_matches(b, idx);
  EXPECT_EQ(idx.stats.page_size, ps);
  EXPECT_EQ(idx.stats.depth, 2u);
  EXPECT_EQ(idx.stats.branch_pages, 1u);
  EXPECT_EQ(idx.stats.leaf_pages, 4u);
  EXPECT_EQ(idx.stats.overflow_pages, b.img.overflow_pages);
  EXPECT_EQ(idx.stats.txnid, 2u);
  EXPECT_EQ(idx.stats.meta_page, 1);
  EXPECT_EQ(idx.stats.unaccounted_pages, 0u);
  EXPECT_TRUE(idx.stats.pages_checked);
  EXPECT_EQ(idx.stats.file_bytes, b.img.bytes.size());
  // only meta headers + tree pages were read, never overflow data
  EXPECT_LE(idx.stats.bytes_read, 2 * 152 + 5ull * ps);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, LmdbPageSizes,
                         ::testing::Values(512u, 1024u, 4096u, 8192u, 32768u));

TEST(Lmdb, VerifyOverflowReadsRunHeaders) {
  Built b = build(4096);
  TempFile f(b.img);
  L::IndexOptions o;
  o.verify_overflow = true;
  const L::Index idx = L::index_lmdb(f.path, o);
  expect_index_matches(b, idx);
  EXPECT_TRUE(idx.stats.overflow_verified);
}

TEST(Lmdb, EmptyDatabase) {
  Image img(4096);
  img.meta(0, 0, L::kInvalidPage, 0);
  img.meta(1, 0, L::kInvalidPage, 0);
  TempFile f(img);
  const L::Index idx = L::index_lmdb(f.path);
  EXPECT_TRUE(idx.offsets.empty());
  EXPECT_EQ(idx.key_starts.size(), 1u);
  EXPECT_EQ(idx.stats.depth, 0u);
}

TEST(Lmdb, SingleLeafRoot) {
  Image img(4096);
  const std::uint64_t pg = img.leaf({{"a", "x"}, {"b", ""}, {"c", value(1, 5000)}});
  img.meta(0, 3, pg, 1);
  img.meta(1, 2, L::kInvalidPage, 0);
  TempFile f(img);
  const L::Index idx = L::index_lmdb(f.path);
  ASSERT_EQ(idx.lengths.size(), 3u);
  EXPECT_EQ(idx.lengths[1], 0);
  EXPECT_EQ(idx.lengths[2], 5000);
  EXPECT_EQ(idx.stats.meta_page, 0);  // meta 0 has the larger txnid
}

TEST(Lmdb, PicksValidMetaWhenTheNewestIsDamaged) {
  Built b = build(4096);
  put<std::uint32_t>(b.img.bytes, 4096 + 16, 0x12345678);  // meta 1 magic
  TempFile f(b.img);
  L::LmdbFile file(f.path);
  EXPECT_EQ(file.meta().meta_page, 0);
  EXPECT_FALSE(file.meta().other_meta_valid);
  EXPECT_EQ(file.meta().main_db.root, L::kInvalidPage);  // meta 0 is the older, empty snapshot
}

TEST(Lmdb, MetaOneFoundWithoutMetaZero) {
  Built b = build(8192);
  put<std::uint32_t>(b.img.bytes, 16, 0);  // meta 0 magic gone: meta 1 is searched for
  TempFile f(b.img);
  const L::Index idx = L::index_lmdb(f.path);
  expect_index_matches(b, idx);
  EXPECT_EQ(idx.stats.page_size, 8192u);
}

TEST(Lmdb, IntegerAndReverseKeyOrders) {
  // 8-byte native integers in numeric order are not in byte order.
  std::vector<Rec> recs;
  for (std::uint64_t v : {1ull, 255ull, 256ull, 70000ull}) {
    std::string k(8, '\0');
    std::memcpy(k.data(), &v, 8);
    recs.push_back({k, "v"});
  }
  Image img(4096);
  const std::uint64_t pg = img.leaf(recs);
  img.meta(0, 1, pg, 1, 0x08);
  img.meta(1, 0, L::kInvalidPage, 0);
  {
    TempFile f(img);
    EXPECT_EQ(L::index_lmdb(f.path).offsets.size(), 4u);
  }
  img.meta(0, 1, pg, 1, 0);
  expect_corrupt(img, "integer keys read in byte order");

  Image rev(4096);
  const std::uint64_t rp =
      rev.leaf({{"ba", "1"}, {"ab", "2"}, {"bb", "3"}});  // ordered by last byte
  rev.meta(0, 1, rp, 1, 0x02);
  rev.meta(1, 0, L::kInvalidPage, 0);
  {
    TempFile f(rev);
    EXPECT_EQ(L::index_lmdb(f.path).offsets.size(), 3u);
  }
}

TEST(Lmdb, SeekAndAdvance) {
  Built b = build(1024, 5, 4, 1500);
  TempFile f(b.img);
  L::LmdbFile file(f.path);
  const L::Index idx = L::index_lmdb(f.path);
  for (std::uint64_t i = 0; i < b.recs.size(); ++i) {
    const L::SeekResult s = file.seek(i);
    EXPECT_EQ(s.key, b.recs[i].key);
    EXPECT_EQ(s.value_offset, static_cast<std::uint64_t>(idx.offsets[i]));
    EXPECT_EQ(s.cursor.pages.front(), b.root);
    EXPECT_EQ(s.cursor.pages.back(), b.leaf_pgnos[i / 4]);
    EXPECT_EQ(s.cursor.slots.back(), i % 4);
    // root + every leaf up to and including record i's
    EXPECT_EQ(s.pages_touched.size(), 1 + i / 4 + 1);
  }
  const L::SeekResult s = file.seek(2);
  const L::SeekResult t = file.advance(s.cursor, 13);
  EXPECT_EQ(t.key, b.recs[15].key);
  EXPECT_EQ(t.cursor.record, 15u);
  EXPECT_THROW(file.seek(b.recs.size()), std::out_of_range);
  EXPECT_THROW(file.advance(t.cursor, 100), feedline::CorruptData);
  const L::Page root = file.read_page(b.root);
  EXPECT_EQ(root.kind, L::PageKind::branch);
  EXPECT_EQ(root.nodes.size(), 5u);
  EXPECT_EQ(file.read_page(0).kind, L::PageKind::meta);
  EXPECT_GT(file.bytes_read(), 0u);
}

TEST(LmdbHostile, Truncated) {
  Built b = build(4096);
  for (std::size_t cut : {std::size_t{0}, std::size_t{100}, std::size_t{4096 + 50},
                          std::size_t{8192}, b.img.bytes.size() - 4096, b.img.bytes.size() - 1}) {
    Image t = b.img;
    t.bytes.resize(cut);
    expect_corrupt(t, ("truncated at " + std::to_string(cut)).c_str());
  }
}

TEST(LmdbHostile, PageSizeZeroOrAbsurd) {
  for (std::uint32_t ps : {0u, 3000u, 256u, 1u << 20, 0xFFFFFFFFu}) {
    Built b = build(4096);
    put<std::uint32_t>(b.img.bytes, 16 + 24, ps);
    put<std::uint32_t>(b.img.bytes, 4096 + 16 + 24, ps);
    expect_corrupt(b.img, "absurd page size");
  }
}

TEST(LmdbHostile, BadPageHeaders) {
  Built b = build(4096);
  const std::size_t leaf = b.img.at(b.leaf_pgnos[1]);
  {
    Image t = b.img;  // lower > upper
    put<std::uint16_t>(t.bytes, leaf + 12, 4000);
    put<std::uint16_t>(t.bytes, leaf + 14, 100);
    expect_corrupt(t, "lower > upper");
  }
  {
    Image t = b.img;  // upper beyond the page
    put<std::uint16_t>(t.bytes, leaf + 14, 0xFFFF);
    expect_corrupt(t, "upper beyond page");
  }
  {
    Image t = b.img;  // node offset outside the page
    put<std::uint16_t>(t.bytes, leaf + 16, 4094);
    expect_corrupt(t, "node offset near the end");
  }
  {
    Image t = b.img;  // wrong page number in header
    put<std::uint64_t>(t.bytes, leaf, 77);
    expect_corrupt(t, "page number mismatch");
  }
  {
    Image t = b.img;  // leaf where a branch is expected: flags
    put<std::uint16_t>(t.bytes, leaf + 10, kBranch | kLeaf);
    expect_corrupt(t, "bad flags");
  }
  {
    Image t = b.img;  // inline value size near 2^32
    const std::uint16_t ptr = *reinterpret_cast<const std::uint16_t*>(&t.bytes[leaf + 16]);
    put<std::uint16_t>(t.bytes, leaf + ptr, 0xFFFF);
    put<std::uint16_t>(t.bytes, leaf + ptr + 2, 0xFFFF);
    expect_corrupt(t, "huge inline size");
  }
  {
    Image t = b.img;  // key size beyond the page
    const std::uint16_t ptr = *reinterpret_cast<const std::uint16_t*>(&t.bytes[leaf + 16]);
    put<std::uint16_t>(t.bytes, leaf + ptr + 6, 0xFFFF);
    expect_corrupt(t, "huge key size");
  }
}

TEST(LmdbHostile, BranchPointers) {
  Built b = build(4096);
  const std::size_t root = b.img.at(b.root);
  const std::uint16_t ptr1 = *reinterpret_cast<const std::uint16_t*>(&b.img.bytes[root + 18]);
  auto with_child = [&](std::uint64_t child) {
    Image t = b.img;
    put<std::uint16_t>(t.bytes, root + ptr1, child & 0xFFFF);
    put<std::uint16_t>(t.bytes, root + ptr1 + 2, (child >> 16) & 0xFFFF);
    put<std::uint16_t>(t.bytes, root + ptr1 + 4, (child >> 32) & 0xFFFF);
    return t;
  };
  expect_corrupt(with_child(0xFFFFFFFFFFFFull), "child beyond last page");
  expect_corrupt(with_child(1), "child is a meta page");
  expect_corrupt(with_child(b.leaf_pgnos[0]), "shared child");
  Image cyc = with_child(b.root);
  expect_corrupt(cyc, "cycle to the root");
  expect_corrupt(
      cyc, [](const std::string& p) { L::LmdbFile(p).seek(11); }, "cycle in a seek");
}

TEST(LmdbHostile, OverflowRunsOffTheFile) {
  Built b = build(4096);
  const std::size_t leaf = b.img.at(b.leaf_pgnos[1]);  // record 4 (slot 0) is big
  const std::uint16_t ptr = *reinterpret_cast<const std::uint16_t*>(&b.img.bytes[leaf + 16]);
  const std::uint16_t ks = *reinterpret_cast<const std::uint16_t*>(&b.img.bytes[leaf + ptr + 6]);
  {
    Image t = b.img;  // size ~4 GiB: more pages than the file has
    put<std::uint16_t>(t.bytes, leaf + ptr + 2, 0xFFFF);
    expect_corrupt(t, "overflow size near 2^32");
  }
  {
    Image t = b.img;  // overflow page number near 2^64
    put<std::uint64_t>(t.bytes, leaf + ptr + 8 + ks, ~std::uint64_t{0} - 1);
    expect_corrupt(t, "overflow page near 2^64");
  }
  {
    Image t = b.img;  // overflow pointing at a tree page: used twice
    put<std::uint64_t>(t.bytes, leaf + ptr + 8 + ks, b.leaf_pgnos[0]);
    expect_corrupt(t, "overflow run over a leaf");
  }
  {
    Image t = b.img;  // run header damaged, found with verify_overflow
    const std::uint64_t ov = *reinterpret_cast<const std::uint64_t*>(&t.bytes[leaf + ptr + 8 + ks]);
    put<std::uint16_t>(t.bytes, t.at(ov) + 10, kLeaf);
    expect_corrupt(
        t,
        [](const std::string& p) {
          L::IndexOptions o;
          o.verify_overflow = true;
          (void)L::index_lmdb(p, o);
        },
        "overflow header");
  }
}

TEST(LmdbHostile, MetaFields) {
  {
    Built b = build(4096);  // last page near 2^64
    put<std::uint64_t>(b.img.bytes, 4096 + 16 + 120, ~std::uint64_t{0});
    expect_corrupt(b.img, "last_pg near 2^64");
  }
  {
    Built b = build(4096);
    put<std::uint64_t>(b.img.bytes, b.img.main_field(1, 32), 999);
    expect_corrupt(b.img, "entries mismatch");
  }
  {
    Built b = build(4096);
    put<std::uint16_t>(b.img.bytes, b.img.main_field(1, 6), 3);
    expect_corrupt(b.img, "depth mismatch");
  }
  {
    Built b = build(4096);
    put<std::uint16_t>(b.img.bytes, b.img.main_field(1, 6), 200);
    expect_corrupt(b.img, "depth absurd");
  }
  {
    Built b = build(4096);
    put<std::uint64_t>(b.img.bytes, b.img.main_field(1, 40), 1ull << 40);
    expect_corrupt(b.img, "root beyond last page");
  }
  {
    Built b = build(4096);
    put<std::uint64_t>(b.img.bytes, b.img.main_field(1, 24), 0);
    expect_corrupt(b.img, "overflow count too small");
  }
  {
    Built b = build(4096);
    put<std::uint16_t>(b.img.bytes, b.img.main_field(1, 4), 0x8000);
    expect_corrupt(b.img, "unknown db flags");
  }
  {
    Image img(4096);  // both metas damaged
    img.meta(0, 1, L::kInvalidPage, 0);
    img.meta(1, 1, L::kInvalidPage, 0);
    put<std::uint16_t>(img.bytes, 10, 0);
    put<std::uint16_t>(img.bytes, 4096 + 10, 0);
    expect_corrupt(img, "no valid meta");
  }
}

TEST(LmdbHostile, KeysOutOfOrder) {
  Image img(4096);
  const std::uint64_t a = img.leaf({{"a", "1"}, {"c", "2"}});
  const std::uint64_t c = img.leaf({{"b", "3"}, {"d", "4"}});  // "b" < separator "c"
  const std::uint64_t root = img.branch({{"", a}, {"c", c}});
  img.meta(0, 1, root, 2);
  img.meta(1, 0, L::kInvalidPage, 0);
  expect_corrupt(img, "key below the separator");
  Image dup(4096);
  const std::uint64_t d = dup.leaf({{"a", "1"}, {"a", "2"}});
  dup.meta(0, 1, d, 1);
  dup.meta(1, 0, L::kInvalidPage, 0);
  expect_corrupt(dup, "duplicate key");
}

TEST(LmdbHostile, UnsupportedFeatures) {
  {
    Image img(4096);
    const std::uint64_t pg = img.leaf({{"db", std::string(48, '\0'), 0x02}});  // F_SUBDATA
    img.meta(0, 1, pg, 1);
    img.meta(1, 0, L::kInvalidPage, 0);
    expect_unsupported(img, "named sub-database");
  }
  {
    Image img(4096);
    const std::uint64_t pg = img.leaf({{"k", "vv", 0x04}});  // F_DUPDATA
    img.meta(0, 1, pg, 1);
    img.meta(1, 0, L::kInvalidPage, 0);
    expect_unsupported(img, "F_DUPDATA");
  }
  {
    Built b = build(4096);
    put<std::uint16_t>(b.img.bytes, b.img.main_field(1, 4), 0x04);  // MDB_DUPSORT
    expect_unsupported(b.img, "DUPSORT flag");
  }
  {
    Built b = build(4096);  // a 32-bit file: magic after a 12-byte header
    for (std::size_t m : {std::size_t{0}, std::size_t{4096}}) {
      put<std::uint32_t>(b.img.bytes, m + 12, 0xBEEFC0DE);
      put<std::uint32_t>(b.img.bytes, m + 16, 0);
    }
    expect_unsupported(b.img, "32-bit");
  }
  {
    Built b = build(4096);
    put<std::uint32_t>(b.img.bytes, 16 + 4, 999);
    expect_unsupported(b.img, "MDB_DEVEL version");
  }
}

// ------------------------------------------------------------------------------------------
// LMDB's known crash classes (CVE-2019-16224 ... CVE-2019-16228: liblmdb 0.9.24 crashing on
// crafted .mdb files — out-of-range page numbers, overflow runs, branch nodes and keys,
// node pointers and lower/upper outside the page, a zero page size) as regression inputs.
// Every image must give CorruptData through both entry points: the indexer, and
// page-level access (open, read every page, seek to every record). The libFuzzer targets
// (cpp/fuzz) search the same space at random.
namespace {

void expect_corrupt_everywhere(const Image& img, const char* what, bool run_headers = false) {
  if (run_headers) {  // the indexer reads overflow run headers only when asked to
    expect_corrupt(
        img,
        [](const std::string& p) {
          L::IndexOptions o;
          o.verify_overflow = true;
          (void)L::index_lmdb(p, o);
        },
        what);
  } else {
    expect_corrupt(img, what);
  }
  TempFile f(img);
  int found = 0;
  try {
    L::LmdbFile file(f.path);
    const std::uint64_t last = std::min<std::uint64_t>(file.meta().last_pgno + 1, 256);
    for (std::uint64_t pg = 0; pg <= last; ++pg) {
      try {
        (void)file.read_page(pg);
      } catch (const feedline::CorruptData& e) {
        EXPECT_EQ(e.path, f.path);
        ++found;
      }
    }
    const std::uint64_t n = std::min<std::uint64_t>(file.meta().main_db.entries, 64);
    for (std::uint64_t i = 0; i < n; ++i) {
      try {
        (void)file.seek(i);
      } catch (const feedline::CorruptData&) {
        ++found;
      }
    }
  } catch (const feedline::CorruptData&) {
    ++found;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": page access threw " << e.what();
  }
  EXPECT_GT(found, 0) << what << ": page access found nothing wrong";
}

std::uint16_t slot(const Image& img, std::uint64_t pg, int i) {
  return *reinterpret_cast<const std::uint16_t*>(&img.bytes[img.at(pg) + 16 + 2 * i]);
}

}  // namespace

TEST(LmdbCve, CraftedPageNumbers) {
  Built b = build(4096);
  const std::size_t root = b.img.at(b.root);
  const std::uint16_t p1 = slot(b.img, b.root, 1);
  {
    Image t = b.img;  // root is a meta page
    put<std::uint64_t>(t.bytes, t.main_field(1, 40), 1);
    expect_corrupt_everywhere(t, "root = meta page 1");
  }
  {
    Image t = b.img;  // child one past the last page
    const std::uint64_t past = t.bytes.size() / 4096;
    put<std::uint16_t>(t.bytes, root + p1, past & 0xFFFF);
    put<std::uint16_t>(t.bytes, root + p1 + 2, (past >> 16) & 0xFFFF);
    expect_corrupt_everywhere(t, "child past the last page");
  }
  {
    Image t = b.img;  // a page's own number disagrees with its position
    put<std::uint64_t>(t.bytes, t.at(b.leaf_pgnos[2]), b.leaf_pgnos[0]);
    expect_corrupt_everywhere(t, "leaf claims another page number");
  }
}

TEST(LmdbCve, OverflowPages) {
  Built b = build(4096);
  const std::size_t leaf = b.img.at(b.leaf_pgnos[1]);  // slot 0 holds a big value
  const std::uint16_t ptr = slot(b.img, b.leaf_pgnos[1], 0);
  const std::uint16_t ks = *reinterpret_cast<const std::uint16_t*>(&b.img.bytes[leaf + ptr + 6]);
  const std::uint64_t ov =
      *reinterpret_cast<const std::uint64_t*>(&b.img.bytes[leaf + ptr + 8 + ks]);
  {
    Image t = b.img;  // page number + run length wraps around 2^64
    put<std::uint64_t>(t.bytes, leaf + ptr + 8 + ks, ~std::uint64_t{0} - 1);
    expect_corrupt_everywhere(t, "overflow run wraps 2^64");
  }
  {
    Image t = b.img;  // run header: zero pages
    put<std::uint32_t>(t.bytes, t.at(ov) + 12, 0);
    expect_corrupt_everywhere(t, "overflow run of 0 pages", true);
  }
  {
    Image t = b.img;  // run header: more pages than the file
    put<std::uint32_t>(t.bytes, t.at(ov) + 12, 0xFFFFFFFFu);
    expect_corrupt_everywhere(t, "overflow run beyond the file", true);
  }
}

TEST(LmdbCve, BranchNodesAndKeys) {
  Built b = build(4096);
  const std::size_t root = b.img.at(b.root);
  const std::uint16_t p1 = slot(b.img, b.root, 1);
  {
    Image t = b.img;  // separator key longer than the page
    put<std::uint16_t>(t.bytes, root + p1 + 6, 0xFFFF);
    expect_corrupt_everywhere(t, "branch key size 0xFFFF");
  }
  {
    Image t = b.img;  // a branch with no nodes at all
    put<std::uint16_t>(t.bytes, root + 12, 16);
    expect_corrupt_everywhere(t, "empty branch page");
  }
  {
    Image t = b.img;  // separators out of order: children swapped
    const std::uint16_t p2 = slot(t, b.root, 2);
    put<std::uint16_t>(t.bytes, root + 16 + 2, p2);
    put<std::uint16_t>(t.bytes, root + 16 + 4, p1);
    expect_corrupt_everywhere(t, "branch keys out of order");
  }
  {
    Image t = b.img;  // node pointer into the slot array
    put<std::uint16_t>(t.bytes, root + 16 + 2, 16);
    expect_corrupt_everywhere(t, "branch node inside the slot array");
  }
}

TEST(LmdbCve, NodePointersAndBounds) {
  Built b = build(4096);
  const std::uint64_t lp = b.leaf_pgnos[0];
  const std::size_t leaf = b.img.at(lp);
  {
    Image t = b.img;  // lower below the header (node count underflows)
    put<std::uint16_t>(t.bytes, leaf + 12, 8);
    expect_corrupt_everywhere(t, "lower below the header");
  }
  {
    Image t = b.img;  // odd lower: half a slot
    put<std::uint16_t>(t.bytes, leaf + 12, static_cast<std::uint16_t>(16 + 2 * 4 + 1));
    expect_corrupt_everywhere(t, "odd lower");
  }
  {
    Image t = b.img;  // node whose inline value runs past the page end
    const std::uint16_t p = slot(t, lp, 3);
    put<std::uint16_t>(t.bytes, leaf + p, static_cast<std::uint16_t>(4096 - p));
    expect_corrupt_everywhere(t, "inline value past the page");
  }
  {
    Image t = b.img;  // two slots point at the same node
    put<std::uint16_t>(t.bytes, leaf + 16 + 2, slot(t, lp, 0));
    expect_corrupt_everywhere(t, "aliased slots");
  }
}

TEST(LmdbCve, ZeroPageSize) {
  Built b = build(4096);
  put<std::uint32_t>(b.img.bytes, 16 + 24, 0);
  put<std::uint32_t>(b.img.bytes, 4096 + 16 + 24, 0);
  expect_corrupt(b.img, "page size 0 (divide by zero)");
  TempFile f(b.img);
  EXPECT_THROW(L::LmdbFile file(f.path), feedline::CorruptData);
}
