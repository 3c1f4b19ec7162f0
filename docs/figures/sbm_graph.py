"""The picture at the top of README: one head's SBM on a ragged batch of two
sequences (memberships, the edge probabilities p_ij and one graph fastRG
samples from them), for both parametrizations of the block matrix.

    python docs/figures/sbm_graph.py   # writes docs/figures/sbm-graph.png
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from sbm_pyg.sampling import expected_adjacency, fastrg  # noqa: E402

OUT = Path(__file__).with_name("sbm-graph.png")


def head(parametrization: str, tokens: torch.Tensor, k: int):
    # Each token value in its own cluster, the block's diagonal high: the
    # repeated-token task's right graph, which links equal tokens.
    onehot = torch.nn.functional.one_hot(tokens, k).float()[:, None]
    logits = torch.eye(k) * 8.0 - 4.0
    if parametrization == "paper":
        # sigmoid memberships, the block a softmax over all k^2 entries:
        # the k diagonal blocks share one unit of mass (at most 1/k each)
        return 0.02 + 0.96 * onehot, torch.softmax(logits.flatten(), 0).view(1, k, k)
    # memberships on the simplex, each block entry in (0, 1) on its own
    memb = 0.9 * onehot + 0.1 / k
    return memb / memb.sum(-1, keepdim=True), torch.sigmoid(logits)[None]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    k, lengths = 6, [30, 18]
    tokens = torch.randint(0, k, (sum(lengths),), generator=gen)
    ptr = torch.tensor([0, lengths[0], sum(lengths)])
    seq = torch.repeat_interleave(torch.arange(2), torch.tensor(lengths))
    fig, axes = plt.subplots(2, 3, figsize=(10, 6.6))
    for row, name in zip(axes, ("paper", "mmsb")):
        memb, block = head(name, tokens, k)
        p = expected_adjacency(memb, block, memb, ptr_q=ptr, ptr_k=ptr,
                               mode="exact")[0]
        graph = fastrg(memb, block, memb, ptr_q=ptr, ptr_k=ptr, mode="exact",
                       generator=gen)
        adj = torch.zeros_like(p)
        i, j = graph.edge_index
        adj[i, j] = 1.0
        row[0].imshow(memb[:, 0], aspect="auto", cmap="Greys", vmin=0, vmax=1)
        row[0].set(title=f"{name}: memberships", xlabel="cluster",
                   ylabel="token")
        im = row[1].imshow(p, cmap="viridis", vmin=0, vmax=1)
        equal = (tokens[:, None] == tokens) & (seq[:, None] == seq)
        row[1].set(title=f"p_ij: {p[equal].mean():.2f} equal tokens, "
                         f"{p[~equal & (seq[:, None] == seq)].mean():.3f} other",
                   xlabel="key")
        fig.colorbar(im, ax=row[1], fraction=0.046)
        row[2].imshow(adj, cmap="Greys", vmin=0, vmax=1)
        row[2].set(title=f"sampled graph: {graph.num_edges} edges", xlabel="key")
    fig.suptitle("One SBM head on a batch of two sequences (30 and 18 tokens, "
                 "6 token values)")
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(OUT)


if __name__ == "__main__":
    main()
