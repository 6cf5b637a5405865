# SPDX-License-Identifier: Apache-2.0
"""Synthetic samples with learnable structure, generated in vectorised batches.

Every sample has a *canonical id* j in [0, N); its content is a pure function of
(seed, j), never of where it is written. Class-sorted datasets write j = 0, 1, ...;
``--shuffle`` writes a seeded permutation of the same samples, so a shuffled dataset is
the sorted one reordered, byte for byte. Per-sample parameters (shifts, contrast,
phases, regression targets) come from a counter-based hash of (seed, stream, j)
(SplitMix64), and per-sample noise is a window of a seeded Gaussian bank at a hashed
offset: both are vectorised over a batch of arbitrary ids, which a sequential RNG is
not. The trade-off: the noise of two samples is correlated when their windows overlap,
which no model can exploit to learn the labels.

- Images (CIFAR/ImageNet-like): class c owns a smooth periodic template (a random
  8x8 grid per channel, smoothly interpolated); a sample is its template plus a
  per-sample smooth variation, translated, scaled in contrast, shifted in brightness,
  plus pixel noise. Labels are balanced: class(j) = j·classes // N.
- CosmoFlow-like cubes: 4 targets in (-1, 1) set the amplitude, spatial frequency,
  mean and channel gradient of a separable 3-D wave field (uint16 counts).
- Neuron-Inverter-like traces: 19 targets mix fixed smooth basis traces through a tanh.
  Regression sets are "sorted" by their first target (stratified, ascending), the
  analogue of class order.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_NOISE_SPAN = 1 << 22  # distinct window offsets in a noise bank

# hash streams: one per kind of per-sample parameter
S_ORDER, S_IMAGE, S_NOISE, S_VARIATION, S_TARGETS, S_PHASE = range(1, 7)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of uint64 values (wrapping arithmetic, vectorised)."""
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash_u64(seed: int, stream: int, ids: np.ndarray, k: int) -> np.ndarray:
    """``(len(ids), k)`` uint64 hashes, a pure function of (seed, stream, id, column)."""
    key = mix64(np.array([(int(seed) & 0xFFFFFFFFFFFFFFFF) ^ (stream << 56)], dtype=np.uint64))
    ids = np.asarray(ids, dtype=np.uint64).reshape(-1, 1)
    cols = np.arange(k, dtype=np.uint64).reshape(1, -1)
    return mix64(key ^ mix64(ids * np.uint64(k) + cols))


def uniform(seed: int, stream: int, ids: np.ndarray, k: int) -> np.ndarray:
    """``(len(ids), k)`` float64 uniforms in [0, 1) from :func:`hash_u64`."""
    return (hash_u64(seed, stream, ids, k) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def positions(n: int, seed: int, shuffle: bool) -> np.ndarray:
    """Canonical sample id written at each position: identity, or a seeded permutation."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([int(seed), S_ORDER]).permutation(n).astype(np.int64)


def class_of(ids: np.ndarray, n: int, classes: int) -> np.ndarray:
    """Balanced class-sorted labels: class(j) = j·classes // n."""
    return (np.asarray(ids, dtype=np.int64) * classes // n).astype(np.int64)


def sorted_target(seed: int, ids: np.ndarray, n: int) -> np.ndarray:
    """A target in (-1, 1) that ascends with the canonical id (stratified uniform)."""
    u = uniform(seed, S_TARGETS, ids, 1)[:, 0]
    return -1.0 + 2.0 * (np.asarray(ids, dtype=np.float64) + u) / n


class NoiseBank:
    """Standard normal float32 noise; sample j gets a window at a hashed offset."""

    def __init__(
        self,
        seed: int,
        size: int,
        scale: float = 1.0,
        span: int = _NOISE_SPAN,
        stream: int = S_NOISE,
    ) -> None:
        self.seed = int(seed)
        self.size = int(size)
        self.span = int(span)
        rng = np.random.default_rng([self.seed, stream])
        self._buf = rng.standard_normal(self.size + self.span, dtype=np.float32)
        if scale != 1.0:
            self._buf *= np.float32(scale)
        self._view = np.lib.stride_tricks.sliding_window_view(self._buf, self.size)

    def windows(self, ids: np.ndarray, stream: int = S_NOISE) -> np.ndarray:
        """``(len(ids), size)`` noise, one window per id."""
        off = hash_u64(self.seed, stream, ids, 1)[:, 0] % np.uint64(self.span)
        return self._view[off.astype(np.int64)]


def _periodic_interp(n_out: int, grid: int, shift: np.ndarray) -> np.ndarray:
    """``(b, n_out, grid)`` weights that sample a periodic grid at shifted output points.

    Smoothstep-weighted linear interpolation between the two nearest grid points, so
    templates have no visible grid edges; *shift* (one per batch row, in output points)
    translates with wrap-around.
    """
    pos = (np.arange(n_out, dtype=np.float32)[None, :] + 0.5 + shift[:, None]) * (
        grid / n_out
    ) - 0.5
    i0 = np.floor(pos)
    f = (pos - i0).astype(np.float32)
    f = f * f * (3.0 - 2.0 * f)
    i0 = i0.astype(np.int64) % grid
    eye = np.eye(grid, dtype=np.float32)
    return eye[i0] * (1.0 - f)[..., None] + eye[(i0 + 1) % grid] * f[..., None]


def _upsample(grid: np.ndarray, axis: int, n_out: int) -> np.ndarray:
    """Resample periodic *grid* along *axis* to *n_out* points (same weights for all rows).

    Two gathers and a blend: no BLAS, whose threads, under oversubscription, made
    thousands of small per-sample products ten times slower than this.
    """
    g = grid.shape[axis]
    pos = (np.arange(n_out, dtype=np.float32) + 0.5) * (g / n_out) - 0.5
    i0 = np.floor(pos)
    f = pos - i0
    f = (f * f * (3.0 - 2.0 * f)).astype(np.float32)
    i0 = i0.astype(np.int64) % g
    shape = [1] * grid.ndim
    shape[axis] = n_out
    lo = np.take(grid, i0, axis=axis)
    hi = np.take(grid, (i0 + 1) % g, axis=axis)
    hi -= lo
    hi *= f.reshape(shape)
    hi += lo
    return hi


class ImageSynth:
    """Class-structured uint8 images of shape (C, H, W).

    Parameters
    ----------
    shape : (int, int, int)
        Channels, height, width.
    classes : int
        Number of classes (templates).
    seed : int
        Everything derives from it.
    """

    GRID = 8

    def __init__(self, shape: tuple[int, int, int], classes: int, seed: int) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.classes = int(classes)
        self.seed = int(seed)
        c = self.shape[0]
        rng = np.random.default_rng([self.seed, S_IMAGE])
        self.templates = rng.standard_normal(
            (self.classes, c, self.GRID, self.GRID), dtype=np.float32
        )
        self.noise = NoiseBank(self.seed, int(np.prod(self.shape)), scale=10.0)
        self.variation = NoiseBank(self.seed, c * self.GRID**2, span=1 << 16, stream=S_VARIATION)

    @property
    def nbytes(self) -> int:
        """Bytes of one sample."""
        return int(np.prod(self.shape))

    def batch(self, ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """``(b, C, H, W)`` uint8 images of canonical *ids* with class *labels*."""
        c, h, w = self.shape
        g = self.GRID
        ids = np.asarray(ids, dtype=np.int64)
        u = uniform(self.seed, S_IMAGE, ids, 4).astype(np.float32)
        dy = (u[:, 0] - 0.5) * (h / 4.0)  # up to ±1/8 of the image
        dx = (u[:, 1] - 0.5) * (w / 4.0)
        contrast = 0.7 + 0.6 * u[:, 2]
        bright = 40.0 * (u[:, 3] - 0.5)
        var = self.variation.windows(ids, S_VARIATION)[:, : c * g * g].reshape(-1, c, g, g)
        coarse = self.templates[np.asarray(labels, dtype=np.int64)] + 0.5 * var
        # contrast and brightness are affine, and interpolation weights sum to one:
        # apply them to the 8x8 grid, not to the full-size image
        coarse *= (45.0 * contrast)[:, None, None, None]
        coarse += (128.0 + bright)[:, None, None, None]
        # translate on the 8x8 grid (shift in grid cells), then upsample with shared weights
        sy = _periodic_interp(g, g, dy * (g / h))  # (b, g, g)
        sx = _periodic_interp(g, g, dx * (g / w))
        coarse = np.einsum("bij,bcjk,blk->bcil", sy, coarse, sx)
        img = _upsample(_upsample(coarse, 2, h), 3, w)  # (b, C, H, W)
        img += self.noise.windows(ids).reshape(img.shape)
        np.clip(img, 0, 255, out=img)
        return img.astype(np.uint8)


class CosmoSynth:
    """CosmoFlow-like uint16 cubes ``(side, side, side, channels)`` with 4 targets.

    Targets in (-1, 1): t0 amplitude of the wave field (sorted ascending by canonical
    id), t1 its spatial frequency (1-4 periods per side), t2 the mean count, t3 a gain
    gradient across channels. Regressing them from the cube is learnable.
    """

    TARGETS = 4

    def __init__(self, side: int, channels: int, seed: int, n: int) -> None:
        self.side = int(side)
        self.channels = int(channels)
        self.seed = int(seed)
        self.n = int(n)
        self.shape = (self.side,) * 3 + (self.channels,)
        self.noise = NoiseBank(self.seed, int(np.prod(self.shape)), scale=800.0)

    @property
    def nbytes(self) -> int:
        """Bytes of one sample."""
        return int(np.prod(self.shape)) * 2

    def targets(self, ids: np.ndarray) -> np.ndarray:
        """``(b, 4)`` float32 targets of canonical *ids*."""
        u = uniform(self.seed, S_TARGETS + 16, ids, self.TARGETS)
        t = 2.0 * u - 1.0
        t[:, 0] = sorted_target(self.seed, ids, self.n)
        return t.astype(np.float32)

    def batch(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(data (b, s, s, s, C) uint16, targets (b, 4) float32)``."""
        ids = np.asarray(ids, dtype=np.int64)
        t = self.targets(ids)
        s = self.side
        phase = (2 * np.pi * uniform(self.seed, S_PHASE, ids, 3)).astype(np.float32)
        k = (1.0 + 1.5 * (t[:, 1] + 1.0)).astype(np.float32)  # periods per side
        x = np.arange(s, dtype=np.float32) * np.float32(2 * np.pi / s)
        wave = [np.cos(k[:, None] * x[None, :] + phase[:, i : i + 1]) for i in range(3)]
        field = wave[0][:, :, None, None] * wave[1][:, None, :, None] * wave[2][:, None, None, :]
        amp = 6000.0 * (1.0 + 0.5 * t[:, 0])
        mean = 20000.0 + 6000.0 * t[:, 2]
        ramp = np.linspace(-1.0, 1.0, self.channels, dtype=np.float32)
        gain = 1.0 + 0.25 * t[:, 3:4] * ramp[None, :]  # (b, C)
        out = (amp[:, None, None, None] * field)[..., None] * gain[:, None, None, None, :]
        out += mean[:, None, None, None, None]
        out += self.noise.windows(ids).reshape(out.shape)
        np.clip(out, 0, 65535, out=out)
        return out.astype(np.uint16), t


class NeuronSynth:
    """Neuron-Inverter-like float32 traces ``(length, channels)`` with many targets.

    A trace is ``tanh(targets @ basis)`` plus noise, where the basis holds one smooth
    random trace (a few sinusoids) per target and channel, fixed by the seed.
    """

    def __init__(self, length: int, channels: int, targets: int, seed: int, n: int) -> None:
        self.length = int(length)
        self.channels = int(channels)
        self.n_targets = int(targets)
        self.seed = int(seed)
        self.n = int(n)
        self.shape = (self.length, self.channels)
        rng = np.random.default_rng([self.seed, S_PHASE])
        t = np.linspace(0.0, 1.0, self.length, endpoint=False)[None, :, None, None]
        freq = rng.uniform(1.0, 24.0, size=(self.n_targets, 1, self.channels, 3))
        ph = rng.uniform(0.0, 2 * np.pi, size=(self.n_targets, 1, self.channels, 3))
        basis = np.cos(2 * np.pi * freq * t + ph).sum(axis=-1)  # (T, length, C)
        basis *= 1.5 / np.sqrt(3.0 * self.n_targets)
        self.basis = basis.reshape(self.n_targets, -1).astype(np.float32)
        self.noise = NoiseBank(self.seed, self.length * self.channels, scale=0.05)

    @property
    def nbytes(self) -> int:
        """Bytes of one sample."""
        return self.length * self.channels * 4

    def targets(self, ids: np.ndarray) -> np.ndarray:
        """``(b, targets)`` float32 targets in (-1, 1) of canonical *ids*."""
        t = 2.0 * uniform(self.seed, S_TARGETS + 32, ids, self.n_targets) - 1.0
        t[:, 0] = sorted_target(self.seed, ids, self.n)
        return t.astype(np.float32)

    def batch(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(data (b, length, C) float32, targets (b, T) float32)``."""
        ids = np.asarray(ids, dtype=np.int64)
        t = self.targets(ids)
        x = np.tanh(t @ self.basis)
        x += self.noise.windows(ids)
        return x.reshape(len(ids), *self.shape).astype(np.float32, copy=False), t
