-- flow.resnet: the small ResNet of scripts/train_cnn.lua (and its benchmark, scripts/bench/cnn.lua):
-- a 3x3 stem conv and three of He et al.'s basic blocks with batch norm, for 28x28 one-channel
-- images (Fashion-MNIST), then global average pooling and a linear layer.
local flow = require "flow"
local nn = flow.nn

local resnet = {}

-- Two 3x3 conv + batch norm, the input added back (through a strided 1x1 conv + batch norm where
-- the shape changes). Convs before batch norm carry no bias: BN's shift would cancel it.
local BasicBlock = nn.class("BasicBlock", nn.Module)
resnet.BasicBlock = BasicBlock
function BasicBlock:__init(cin, cout, stride)
  self.conv1 = nn.Conv2d(cin, cout, 3, { stride = stride, padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(cout)
  self.conv2 = nn.Conv2d(cout, cout, 3, { padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(cout)
  if stride ~= 1 or cin ~= cout then
    self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, { stride = stride, bias = false }), nn.BatchNorm2d(cout))
  end
end
function BasicBlock:forward(x)
  local h = flow.relu(self.bn1(self.conv1(x)))
  h = self.bn2(self.conv2(h))
  return flow.relu(h + (self.down and self.down(x) or x))
end

-- 28x28x1 -> stem (w) -> blocks at 28x28 (w), 14x14 (2w), 7x7 (4w) -> global average -> 10 classes
local ResNet = nn.class("ResNet", nn.Module)
resnet.ResNet = ResNet
function ResNet:__init(w)
  self.stem = nn.Sequential(nn.Conv2d(1, w, 3, { padding = 1, bias = false }), nn.BatchNorm2d(w), nn.ReLU())
  self.layers = nn.Sequential(BasicBlock(w, w, 1), BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 4 * w, 2))
  self.pool = nn.AvgPool2d(7)
  self.fc = nn.Linear(4 * w, 10)
end
function ResNet:forward(x)
  local h = self.pool(self.layers(self.stem(x)))
  return self.fc(flow.reshape(h, { h:shape()[1], -1 }))
end

return resnet
