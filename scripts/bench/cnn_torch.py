"""PyTorch reference for scripts/bench/cnn.lua: train_cnn.lua's ResNet (a 3x3 stem conv, three basic
blocks with batch norm, 16/32/64 wide, 1x1 strided shortcuts, global average pooling, a linear
layer) on random 28x28 one-channel images, float32, SGD with Nesterov momentum, one training step
timed. Prints one line: `torch_ms <median> <min>`. Usage: python3 cnn_torch.py batch width steps [amp]
with amp `bf16` for the forward and backward under torch.autocast("cpu", bfloat16)."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_step_timer import report, set_threads

BATCH, WIDTH, STEPS = (int(a) for a in sys.argv[1:4])
AMP = len(sys.argv) > 4 and sys.argv[4] == "bf16"
torch.manual_seed(0)
set_threads()


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class ResNet(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(w, w, 1), BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 4 * w, 2))
        self.pool = nn.AvgPool2d(7)
        self.fc = nn.Linear(4 * w, 10)

    def forward(self, x):
        h = self.pool(self.layers(self.stem(x)))
        return self.fc(h.flatten(1))


model = ResNet(WIDTH)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))


def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AMP):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


report(step, STEPS)
