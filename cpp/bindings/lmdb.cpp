// SPDX-License-Identifier: Apache-2.0
// Bindings of feedline/lmdb.hpp: convert arguments, release the GIL, call C++.
// Index columns are exposed as numpy views that keep their _LmdbIndex alive.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <feedline/lmdb.hpp>

#include "bindings.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace feedline::py {
namespace {

template <class T>
nb::ndarray<nb::numpy, const T, nb::ndim<1>> view(const std::vector<T>& v) {
  static const T empty{};
  return {v.empty() ? &empty : v.data(), {v.size()}, nb::handle()};
}

}  // namespace

void register_lmdb(nb::module_& m) {
  namespace L = feedline::lmdb;
  using guard = nb::call_guard<ReleaseGil>;

  nb::class_<L::IndexOptions>(m, "_LmdbIndexOptions")
      .def(nb::init<>())
      .def_rw("max_read_bytes", &L::IndexOptions::max_read_bytes)
      .def_rw("verify_overflow", &L::IndexOptions::verify_overflow)
      .def_rw("check_pages", &L::IndexOptions::check_pages);

  nb::class_<L::IndexStats>(m, "_LmdbIndexStats")
      .def_ro("page_size", &L::IndexStats::page_size)
      .def_ro("txnid", &L::IndexStats::txnid)
      .def_ro("last_pgno", &L::IndexStats::last_pgno)
      .def_ro("meta_page", &L::IndexStats::meta_page)
      .def_ro("file_bytes", &L::IndexStats::file_bytes)
      .def_ro("entries", &L::IndexStats::entries)
      .def_ro("depth", &L::IndexStats::depth)
      .def_ro("branch_pages", &L::IndexStats::branch_pages)
      .def_ro("leaf_pages", &L::IndexStats::leaf_pages)
      .def_ro("overflow_pages", &L::IndexStats::overflow_pages)
      .def_ro("overflow_records", &L::IndexStats::overflow_records)
      .def_ro("payload_bytes", &L::IndexStats::payload_bytes)
      .def_ro("key_bytes", &L::IndexStats::key_bytes)
      .def_ro("free_tree_pages", &L::IndexStats::free_tree_pages)
      .def_ro("free_pages", &L::IndexStats::free_pages)
      .def_ro("unaccounted_pages", &L::IndexStats::unaccounted_pages)
      .def_ro("pages_checked", &L::IndexStats::pages_checked)
      .def_ro("overflow_verified", &L::IndexStats::overflow_verified)
      .def_ro("bytes_read", &L::IndexStats::bytes_read)
      .def_ro("read_ops", &L::IndexStats::read_ops);

  nb::class_<L::Index>(m, "_LmdbIndex")
      .def_prop_ro(
          "offsets", [](const L::Index& s) { return view(s.offsets); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "lengths", [](const L::Index& s) { return view(s.lengths); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "key_blob", [](const L::Index& s) { return view(s.key_blob); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "key_starts", [](const L::Index& s) { return view(s.key_starts); },
          nb::rv_policy::reference_internal)
      .def_ro("stats", &L::Index::stats);

  m.def("lmdb_index", &L::index_lmdb, "path"_a, "options"_a, guard(),
        "Index the main database of an LMDB data file (see feedline/lmdb.hpp).");

  nb::class_<L::DbInfo>(m, "_LmdbDbInfo")
      .def_ro("flags", &L::DbInfo::flags)
      .def_ro("depth", &L::DbInfo::depth)
      .def_ro("branch_pages", &L::DbInfo::branch_pages)
      .def_ro("leaf_pages", &L::DbInfo::leaf_pages)
      .def_ro("overflow_pages", &L::DbInfo::overflow_pages)
      .def_ro("entries", &L::DbInfo::entries)
      .def_ro("root", &L::DbInfo::root);

  nb::class_<L::Meta>(m, "_LmdbMeta")
      .def_ro("page_size", &L::Meta::page_size)
      .def_ro("version", &L::Meta::version)
      .def_ro("txnid", &L::Meta::txnid)
      .def_ro("last_pgno", &L::Meta::last_pgno)
      .def_ro("map_size", &L::Meta::map_size)
      .def_ro("meta_page", &L::Meta::meta_page)
      .def_ro("other_meta_valid", &L::Meta::other_meta_valid)
      .def_ro("file_bytes", &L::Meta::file_bytes)
      .def_ro("free_db", &L::Meta::free_db)
      .def_ro("main_db", &L::Meta::main_db);

  nb::class_<L::Node>(m, "_LmdbNode")
      .def_ro("flags", &L::Node::flags)
      .def_ro("key_pos", &L::Node::key_pos)
      .def_ro("key_size", &L::Node::key_size)
      .def_ro("child", &L::Node::child)
      .def_ro("value_offset", &L::Node::value_offset)
      .def_ro("value_length", &L::Node::value_length)
      .def_ro("overflow_pgno", &L::Node::overflow_pgno);

  nb::class_<L::Page>(m, "_LmdbPage")
      .def_ro("pgno", &L::Page::pgno)
      .def_prop_ro("kind", [](const L::Page& p) { return static_cast<int>(p.kind); })
      .def_ro("flags", &L::Page::flags)
      .def_ro("lower", &L::Page::lower)
      .def_ro("upper", &L::Page::upper)
      .def_ro("overflow_pages", &L::Page::overflow_pages)
      .def_ro("nodes", &L::Page::nodes)
      .def_prop_ro("bytes", [](const L::Page& p) {
        return nb::bytes(reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size());
      });

  nb::class_<L::Cursor>(m, "_LmdbCursor")
      .def(nb::init<>())
      .def_rw("pages", &L::Cursor::pages)
      .def_rw("slots", &L::Cursor::slots)
      .def_rw("record", &L::Cursor::record);

  nb::class_<L::SeekResult>(m, "_LmdbSeek")
      .def_ro("cursor", &L::SeekResult::cursor)
      .def_ro("pages_touched", &L::SeekResult::pages_touched)
      .def_ro("value_offset", &L::SeekResult::value_offset)
      .def_ro("value_length", &L::SeekResult::value_length)
      .def_prop_ro("key",
                   [](const L::SeekResult& s) { return nb::bytes(s.key.data(), s.key.size()); });

  nb::class_<L::LmdbFile>(m, "_LmdbFile")
      .def(nb::init<const std::string&>(), "path"_a, guard())
      .def_prop_ro("meta", &L::LmdbFile::meta, nb::rv_policy::copy)
      .def_prop_ro("path", &L::LmdbFile::path)
      .def_prop_ro("bytes_read", &L::LmdbFile::bytes_read)
      .def_prop_ro("read_ops", &L::LmdbFile::read_ops)
      .def("read_page", &L::LmdbFile::read_page, "pgno"_a, guard())
      .def("seek", &L::LmdbFile::seek, "i"_a, guard())
      .def("advance", &L::LmdbFile::advance, "cursor"_a, "n"_a, guard());
}

}  // namespace feedline::py
