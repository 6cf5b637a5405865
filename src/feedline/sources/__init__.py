# SPDX-License-Identifier: Apache-2.0
"""Loader sources that reproduce papers' readers (LMDBIO, MPI-Caffe); importing registers them."""
