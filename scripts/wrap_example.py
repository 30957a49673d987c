"""A user's own training script, compressed with compbench in three lines.

    horovodrun -np 2 --gloo python scripts/wrap_example.py
    compbench launch -np 2 scripts/wrap_example.py
    compbench launch -np 2 --engine torch scripts/wrap_example.py --engine torch
"""

import argparse

import torch
import torch.nn.functional as F

import compbench
from compbench.data.digits import digits
from compbench.data.loader import ShardedLoader
from compbench.models.resnet20 import resnet20

parser = argparse.ArgumentParser()
parser.add_argument("--engine", default="horovod")
parser.add_argument("--compressor", default="dgc")
parser.add_argument("--ratio", type=float, default=0.01)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
train, test = digits()
model = resnet20(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
# The three lines: wrap, then use the optimizer as before.
optimizer = compbench.wrap_compress_optimizer(model, optimizer, compressor=args.compressor, ratio=args.ratio,
                                              memory="residual", comm="allgather", engine=args.engine)
rank, size = optimizer.engine.rank, optimizer.engine.size
loader = ShardedLoader(train, 32, rank, size, seed=0)
for epoch in range(args.epochs):
    loader.epoch = epoch
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

model.eval()
with torch.no_grad():
    correct = sum((model(x).argmax(1) == y).sum().item()
                  for x, y in ShardedLoader(test, 256, 0, 1, train=False))
if rank == 0:
    print(f"{args.compressor} ratio={args.ratio} on {size} workers ({args.engine}): "
          f"test accuracy {100 * correct / len(test):.2f}%, "
          f"bytes sent last step {optimizer.stats.bytes_sent}")
