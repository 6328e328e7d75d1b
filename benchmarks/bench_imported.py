"""A user's own PyTorch network, read with ``from_torch``, trained by sparknet vs by PyTorch.

The networks are ordinary ``nn.Module`` classes with their own ``forward()``, as a PyTorch
user writes them; ``from_torch`` traces each into a sparknet model with the same weights:

1. ``resnet``: a CIFAR-style ResNet on 32x32x3 images, batch 64: a 3x3 stem, a basic block
   at 16 channels, then two blocks that halve the image and double the channels (with a
   ``downsample`` projection, as torchvision's), global average pooling, a linear head.
2. ``llama``: a LLaMA-style block on sequences of 32 steps of 64 features, batch 64:
   RMSNorm, self-attention (4 heads) added back, RMSNorm, a SwiGLU feed-forward (hidden 172)
   added back, the mean over the steps, a linear head.

Training samples/s of each library (one thread, float32, RMSprop lr 1e-3, softmax
cross-entropy; PyTorch 2.x fp32 eager, as the user runs it), in interleaved rounds in the same
process, each contender's best round in samples per CPU second, and the sparknet / PyTorch
ratio.

    python benchmarks/bench_imported.py [--seconds 8] [--rounds 4] [--quick]
"""
from __future__ import annotations

from bench_norm import SparknetStep, TorchStep, make_batches, run_settings, timed_rounds
from threadpoolctl import threadpool_limits


def torch_nets():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c_in: int, c: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.downsample = None
            if stride != 1 or c_in != c:
                self.downsample = nn.Sequential(nn.Conv2d(c_in, c, 1, stride=stride, bias=False),
                                                nn.BatchNorm2d(c))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.bn = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.layers = nn.Sequential(Block(16, 16), Block(16, 32, 2), Block(32, 64, 2))
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = self.layers(F.relu(self.bn(self.stem(x))))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class Llama(nn.Module):
        def __init__(self, d: int = 64, hidden: int = 172) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
            self.attn = nn.MultiheadAttention(d, 4, bias=False, batch_first=True)
            self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
            self.w2, self.head = nn.Linear(hidden, d, bias=False), nn.Linear(d, 10)

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            h = self.norm2(x)
            x = x + self.w2(F.silu(self.w1(h)) * self.w3(h))
            return self.head(x.mean(dim=1))

    return {"resnet": (ResNet(), (3, 32, 32), (32, 32, 3), 64),
            "llama": (Llama(), (32, 64), (32, 64), 64)}


def run(name: str, seconds: float, rounds: int) -> dict[str, float]:
    import torch

    from sparknet.interop import from_torch

    torch.manual_seed(0)
    net, torch_shape, shape, batch = torch_nets()[name]
    # the head's softmax: sparknet fuses it with the cross-entropy, as CrossEntropyLoss does
    model = from_torch(torch.nn.Sequential(net, torch.nn.Softmax(dim=1)).eval(), torch_shape)
    X, y = make_batches(shape, batch)
    steps = [SparknetStep("sparknet", model, X, y), TorchStep("torch", net, X, y)]
    return timed_rounds(steps, batch, seconds, rounds)


def main(argv=None) -> None:
    seconds, rounds = run_settings(__doc__, argv)
    print("\nImported with from_torch: training samples/s (1 thread, float32)")
    print(f"  {'net':8s} {'sparknet':>10s} {'torch':>10s} {'ratio':>7s}")
    with threadpool_limits(1):
        for name in ("resnet", "llama"):
            res = run(name, seconds, rounds)
            print(f"  {name:8s} {res['sparknet']:10,.0f} {res['torch']:10,.0f} "
                  f"{res['sparknet'] / res['torch']:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
