# SPDX-License-Identifier: Apache-2.0
"""Small torch models for the science benchmarks (CPU-sized, seconds per epoch).

``SmallCNN`` is two conv/pool blocks and a linear head: enough capacity to learn the
class templates of ``feedline make cifar10-large`` in a few epochs, small enough that
several training runs fit in a benchmark on two cores. The trade-off: it measures how
the *order* of samples affects learning (shuffle quality), not what a production model
reaches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def small_cnn(channels: int = 3, classes: int = 10, width: int = 16) -> Any:
    """A conv(width)-pool-conv(2·width)-pool-linear classifier for (C, H, W) inputs of
    any H, W ≥ 4 (global average pooling before the head)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * width, classes),
    )


def _tensor(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(x.astype(np.float32) * (1 / 127.5) - 1.0)


def train_batches(
    model: Any, opt: Any, batches: Iterable[tuple[np.ndarray, np.ndarray]]
) -> tuple[float, int]:
    """One pass of SGD steps over *batches* of (uint8 images, int labels); returns the
    mean loss and the number of samples seen."""
    import torch
    from torch.nn import functional as F

    model.train()
    total, seen = 0.0, 0
    for x, y in batches:
        if len(y) == 0:
            continue
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(_tensor(x)), torch.from_numpy(y.astype(np.int64)))
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(y)
        seen += len(y)
    return (total / seen if seen else float("nan")), seen


def accuracy(model: Any, x: np.ndarray, y: np.ndarray, batch: int = 512) -> float:
    """Top-1 accuracy of *model* on uint8 images *x* with labels *y*."""
    import torch

    model.eval()
    hits = 0
    with torch.no_grad():
        for a in range(0, len(y), batch):
            pred = model(_tensor(x[a : a + batch])).argmax(1).numpy()
            hits += int((pred == y[a : a + batch]).sum())
    return hits / max(1, len(y))


class StepModel:
    """A real training step on a raw batch, for benchmarks that need CPU compute rather
    than a sleep: the first ``features`` bytes of each sample as floats through a
    two-layer MLP, regressed to the sample's mean, one SGD step (one torch thread, so
    ranks sharing cores compete as training processes do)."""

    def __init__(self, features: int = 4096, hidden: int = 256, seed: int = 0) -> None:
        import torch
        from torch import nn

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.features = features
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=1e-4)

    def step(self, raw: np.ndarray | bytes, lengths: np.ndarray) -> float:
        """One forward/backward/update on the samples cut from *raw* by *lengths*."""
        import torch
        from torch.nn import functional as F

        buf = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, bytes) else raw.reshape(-1)
        n = len(lengths)
        if n == 0:
            return 0.0
        x = np.zeros((n, self.features), dtype=np.float32)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        for i, (a, ln) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            k = min(int(ln), self.features)
            x[i, :k] = buf[a : a + k]
        x *= 1 / 255.0
        xt = torch.from_numpy(x)
        target = xt.mean(1, keepdim=True)
        self.opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.net(xt), target)
        loss.backward()
        self.opt.step()
        return float(loss.detach())
