# The GNN alone on the 10^4-node LFR graph (seed 0), trained full-batch at
# lr 1e-2 with its batch norms keeping running averages (as before
# sbm_pyg.experiments.large.batch_statistics): accuracy of the same
# weights in training mode (batch statistics) and evaluation mode (running
# averages) every 5 epochs. Run: OMP_NUM_THREADS=1 python diagnose.py
import argparse

import torch
import torch.nn.functional as F

from sbm_pyg.experiments.large import add_large_arguments, large_graph
from sbm_pyg.models import GPSNodeClassifier

parser = argparse.ArgumentParser()
add_large_arguments(parser)
args = parser.parse_args(["--out", "/tmp/x", "--nodes", "10000", "--model", "gnn",
                          "--lr", "1e-2"])
torch.manual_seed(0)
data = large_graph(args, torch.Generator().manual_seed(0))
classes = int(data.y.max()) + 1
# The harness's "gnn" as it built it, batch norms with running averages.
model = GPSNodeClassifier(data.x.size(1), classes, channels=64, num_layers=3, heads=2,
                          attention="none", dropout=0.1, attn_dropout=0.0, pe_channels=0)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
generator = torch.Generator().manual_seed(0)
batch = torch.zeros(data.num_nodes, dtype=torch.long)


def logits():
    return model(data.x, data.edge_index, batch, generator=generator, batch_size=1)


def accuracy(hit, mask):
    return round(float(hit[mask].float().mean()), 3)


for epoch in range(1, 31):
    model.train()
    out = logits()
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if epoch % 5 == 0:
        train_mode = out.argmax(-1) == data.y
        model.eval()
        with torch.no_grad():
            eval_mode = logits().argmax(-1) == data.y
        print(epoch, round(float(loss.detach()), 3),
              "train-mode train/val", accuracy(train_mode, data.train_mask),
              accuracy(train_mode, data.val_mask),
              "eval-mode train/val", accuracy(eval_mode, data.train_mask),
              accuracy(eval_mode, data.val_mask), flush=True)
