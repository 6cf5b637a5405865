#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "feedline native core: LMDB page parser, codecs, I/O engine.";
  feedline::py::register_errors(m);
  feedline::py::register_lmdb(m);
  feedline::py::register_codecs(m);
  feedline::py::register_io(m);
}
