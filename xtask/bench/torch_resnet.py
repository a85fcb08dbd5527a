"""A ResNet-style network's training step in PyTorch eager, for `xtask gpu-cuda`.

Usage: torch_resnet.py float32|mixed_float16 BATCH STEPS. Prints `samples_per_s X`: the
same network as `resnet_style` in xtask/src/gpu_cuda.rs (conv 3x3/32 + BN + ReLU, two
residual blocks at 32 channels, a stride-2 conv to 64, two blocks at 64, global average
pooling, Dense 10; Adam 1e-3, sparse cross-entropy on logits) on synthetic 32x32x3 data;
mixed_float16 is autocast float16 with a gradient scaler. PyTorch's defaults otherwise
(TF32 convolutions on, cuDNN's heuristics).
"""
import sys
import time

import torch
from torch import nn

mode, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if not torch.cuda.is_available():
    sys.exit("no CUDA device")


def conv_bn(cin, cout, stride=1):
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2d(cout)]


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(*conv_bn(c, c), nn.ReLU(), *conv_bn(c, c))

    def forward(self, x):
        return torch.relu(self.body(x) + x)


net = nn.Sequential(
    *conv_bn(3, 32), nn.ReLU(), Block(32), Block(32),
    *conv_bn(32, 64, 2), nn.ReLU(), Block(64), Block(64),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
).cuda()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
scaler = torch.amp.GradScaler("cuda", enabled=mode == "mixed_float16")
x = torch.rand(batch, 3, 32, 32, device="cuda")
y = torch.randint(0, 10, (batch,), device="cuda")


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=mode == "mixed_float16"):
        loss = loss_fn(net(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


for _ in range(5):
    step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
print("samples_per_s", batch * steps / (time.perf_counter() - t))
