// SPDX-License-Identifier: Apache-2.0
/**
 * @file lmdb.hpp
 * @brief A native reader of LMDB's on-disk B+tree (liblmdb 0.9 data format, 64-bit,
 *        little endian) that uses explicit pread only: no mmap, no liblmdb.
 *
 * Two entry points:
 *  - index_lmdb() walks the main database breadth-first, one tree level at a time,
 *    reading each level's pages in page-number order with coalesced reads of adjacent
 *    pages, and returns every record's value extent and key in key order. Overflow
 *    data is never read: its position follows from the leaf node.
 *  - LmdbFile gives page-level access for run-time seeking strategies: the meta
 *    information, one validated page by number, and a cursor walk to the i-th record
 *    that reports the pages it touched (what liblmdb's cursor would fault in).
 *
 * Everything read from the file is bounds-checked. A file that contradicts the
 * format raises feedline::CorruptData(path, offset, reason); named sub-databases,
 * DUPSORT, 32-bit or big-endian files raise feedline::Unsupported; I/O failures raise
 * feedline::StorageFailure.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace feedline::lmdb {

/// @brief "No page" (an empty database's root).
inline constexpr std::uint64_t kInvalidPage = ~std::uint64_t{0};

/// @brief One of the two databases described by a meta page (MDB_db).
struct DbInfo {
  std::uint16_t flags = 0;  ///< MDB_INTEGERKEY, MDB_REVERSEKEY, ...
  std::uint16_t depth = 0;  ///< tree depth (0 when empty)
  std::uint64_t branch_pages = 0;
  std::uint64_t leaf_pages = 0;
  std::uint64_t overflow_pages = 0;
  std::uint64_t entries = 0;
  std::uint64_t root = kInvalidPage;  ///< root page number, kInvalidPage when empty
};

/// @brief The meta page that was selected (the valid one with the larger txnid).
struct Meta {
  std::uint32_t page_size = 0;    ///< mm_psize
  std::uint32_t version = 0;      ///< mm_version (1 for liblmdb 0.9)
  std::uint64_t txnid = 0;        ///< last committed transaction
  std::uint64_t last_pgno = 0;    ///< mm_last_pg
  std::uint64_t map_size = 0;     ///< mm_mapsize (informational)
  int meta_page = 0;              ///< which meta page (0 or 1) was used
  bool other_meta_valid = false;  ///< whether the other meta page was valid too
  std::uint64_t file_bytes = 0;   ///< size of the file when opened
  DbInfo free_db;                 ///< the free-page database (FREE_DBI)
  DbInfo main_db;                 ///< the main database (MAIN_DBI)
};

/// @brief Page kinds that can be read through LmdbFile::read_page.
enum class PageKind : std::uint8_t { branch = 1, leaf = 2, overflow = 4, meta = 8 };

/// @brief One node (slot) of a branch or leaf page.
struct Node {
  std::uint16_t flags = 0;    ///< leaf: 0 or F_BIGDATA (1); branch: 0
  std::uint32_t key_pos = 0;  ///< key's byte position inside Page::bytes
  std::uint32_t key_size = 0;
  std::uint64_t child = 0;          ///< branch: child page number
  std::uint64_t value_offset = 0;   ///< leaf: absolute file offset of the value
  std::uint64_t value_length = 0;   ///< leaf: value length in bytes
  std::uint64_t overflow_pgno = 0;  ///< leaf with F_BIGDATA: first overflow page, else 0
};

/// @brief A page whose header (and, for branch/leaf pages, every node) was validated.
struct Page {
  std::uint64_t pgno = 0;
  PageKind kind = PageKind::leaf;
  std::uint16_t flags = 0;
  std::uint16_t lower = 0;           ///< branch/leaf: end of the slot array
  std::uint16_t upper = 0;           ///< branch/leaf: start of the node area
  std::uint32_t overflow_pages = 0;  ///< overflow: pages in the run
  std::vector<Node> nodes;           ///< branch/leaf: in slot (= key) order
  std::vector<std::uint8_t> bytes;   ///< the raw page (page_size bytes)
};

/// @brief A position in the main tree: the path of (page, slot) from the root to a leaf.
struct Cursor {
  std::vector<std::uint64_t> pages;  ///< root ... leaf
  std::vector<std::uint32_t> slots;  ///< slot taken in each page of `pages`
  std::uint64_t record = 0;          ///< ordinal of the record the cursor points at
};

/// @brief Result of a cursor walk.
struct SeekResult {
  Cursor cursor;
  std::vector<std::uint64_t> pages_touched;  ///< in the order the walk read them
  std::uint64_t value_offset = 0;            ///< of the record under the cursor
  std::uint64_t value_length = 0;
  std::string key;
};

/// @brief Knobs of index_lmdb().
struct IndexOptions {
  /// Largest single read when coalescing adjacent tree pages (bytes).
  std::uint64_t max_read_bytes = 8u << 20;
  /// Read each overflow run's header page to check its flags, number and length.
  /// Also switched on automatically when the leaves' overflow page counts do not
  /// add up to the meta's (liblmdb can leave a run longer than its value needs).
  bool verify_overflow = false;
  /// Walk the free-page database too and check that no page is used twice (by the
  /// main tree, an overflow run, the free tree or a free list). Catches pointers
  /// redirected by damage into free or foreign pages; costs the free tree's pages.
  bool check_pages = true;
};

/// @brief Layout statistics gathered by index_lmdb().
struct IndexStats {
  std::uint32_t page_size = 0;
  std::uint64_t txnid = 0;
  std::uint64_t last_pgno = 0;
  int meta_page = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t entries = 0;
  std::uint32_t depth = 0;
  std::uint64_t branch_pages = 0;
  std::uint64_t leaf_pages = 0;
  std::uint64_t overflow_pages = 0;
  std::uint64_t overflow_records = 0;   ///< records whose value lives in overflow pages
  std::uint64_t payload_bytes = 0;      ///< sum of value lengths
  std::uint64_t key_bytes = 0;          ///< sum of key lengths
  std::uint64_t free_tree_pages = 0;    ///< pages of the free-page database
  std::uint64_t free_pages = 0;         ///< pages listed as free
  std::uint64_t unaccounted_pages = 0;  ///< pages up to last_pgno owned by nobody (leaks)
  bool pages_checked = false;           ///< whether the page-ownership check ran
  bool overflow_verified = false;       ///< whether overflow headers were read
  std::uint64_t bytes_read = 0;         ///< bytes this walk read from the file
  std::uint64_t read_ops = 0;           ///< pread calls
};

/// @brief Every record of the main database, in key order.
struct Index {
  std::vector<std::int64_t> offsets;     ///< absolute file offset of each value
  std::vector<std::int64_t> lengths;     ///< value length
  std::vector<std::uint8_t> key_blob;    ///< all keys, concatenated
  std::vector<std::int64_t> key_starts;  ///< N+1 positions into key_blob
  IndexStats stats;
};

/**
 * @brief Index the main database of an LMDB data file.
 * @param path the data file (``data.mdb``), not the directory
 * @param options read and verification knobs
 * @return offsets, lengths and keys of every record in key order, plus layout stats
 * @throws CorruptData, Unsupported, StorageFailure
 *
 * Thread-safe (each call opens its own descriptor). Reads only meta, branch and leaf
 * pages (plus, with check_pages, the free tree); never overflow data.
 */
Index index_lmdb(const std::string& path, const IndexOptions& options = {});

/**
 * @brief Page-level access to an LMDB data file with explicit pread.
 *
 * Opening reads and validates both meta pages. One object is not thread-safe (it
 * counts bytes read); use one per thread. The descriptor is closed on destruction.
 */
class LmdbFile {
 public:
  /// @brief Open @p path and select the newest valid meta page.
  /// @throws CorruptData, Unsupported, StorageFailure
  explicit LmdbFile(const std::string& path);
  ~LmdbFile();
  LmdbFile(LmdbFile&&) noexcept;
  LmdbFile& operator=(LmdbFile&&) noexcept;
  LmdbFile(const LmdbFile&) = delete;
  LmdbFile& operator=(const LmdbFile&) = delete;

  /// @brief The selected meta page.
  [[nodiscard]] const Meta& meta() const noexcept;
  /// @brief The file's path.
  [[nodiscard]] const std::string& path() const noexcept;

  /**
   * @brief Read page @p pgno and validate it.
   * @return the page; branch/leaf pages with their nodes, overflow pages with the run
   *         length, meta pages (0, 1) with the header only
   * @throws CorruptData when the page is out of range, truncated or inconsistent
   */
  Page read_page(std::uint64_t pgno);

  /**
   * @brief Walk from the root to record @p i, as a liblmdb cursor stepping from the
   *        first record would: down the leftmost path, then leaf after leaf.
   * @throws CorruptData when i >= entries or the tree is inconsistent
   */
  SeekResult seek(std::uint64_t i);

  /**
   * @brief Move @p from forward by @p n records (0 re-reads the cursor's leaf).
   * @throws CorruptData when the move runs past the last record
   */
  SeekResult advance(const Cursor& from, std::uint64_t n);

  /// @brief Bytes read from the file by this object so far.
  [[nodiscard]] std::uint64_t bytes_read() const noexcept;
  /// @brief pread calls made by this object so far.
  [[nodiscard]] std::uint64_t read_ops() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace feedline::lmdb
