"""Loader sources that reproduce papers' readers (LMDBIO, MPI-Caffe); importing registers them."""
