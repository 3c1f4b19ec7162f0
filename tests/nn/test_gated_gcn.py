import pytest
import torch

from sbm_pyg.nn import GatedGCNConv
from tests.helpers import seeded


def _reference(conv, x, edge_index, edge_attr):
    # The layer written edge by edge (batch norm in training mode: the
    # batch's own statistics, biased variance).
    C = conv.channels
    W, b = conv.lin_node.weight, conv.lin_node.bias
    A, B, D, E = (x @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C] for i in range(4))
    Ce = edge_attr @ conv.lin_edge.weight.T + conv.lin_edge.bias
    e_hat = torch.stack([D[j] + E[i] + Ce[n]
                         for n, (i, j) in enumerate(edge_index.T.tolist())])
    num = torch.zeros_like(x)
    den = torch.zeros_like(x)
    for n, (i, j) in enumerate(edge_index.T.tolist()):
        s = torch.sigmoid(e_hat[n])
        num[j] += s * B[i]
        den[j] += s
    h = A + num / (den + 1e-6)

    def bn(t, norm):
        t = (t - t.mean(0)) / torch.sqrt(t.var(0, unbiased=False) + 1e-5)
        return t * norm.weight + norm.bias

    return (x + torch.relu(bn(h, conv.bn_node)),
            edge_attr + torch.relu(bn(e_hat, conv.bn_edge)))


def test_matches_the_layer_written_edge_by_edge():
    g = seeded(0)
    conv = GatedGCNConv(4).double()
    for p in conv.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=torch.float64)
    # Node 3 has no incoming edge: its message is 0 / (0 + eps).
    edge_index = torch.tensor([[0, 1, 2, 1, 3], [1, 0, 1, 2, 2]])
    x = torch.randn(4, 4, generator=g, dtype=torch.float64)
    e = torch.randn(5, 4, generator=g, dtype=torch.float64)
    out, e_out = conv(x, edge_index, e)
    ref, e_ref = _reference(conv, x, edge_index, e)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(e_out, e_ref)


def test_options_and_gradients():
    conv = GatedGCNConv(8, dropout=0.5, residual=False, batch_norm=False)
    assert conv.bn_node is None and repr(conv) == "GatedGCNConv(8, dropout=0.5)"
    x = torch.randn(5, 8, requires_grad=True)
    e = torch.randn(4, 8, requires_grad=True)
    conv.eval()
    out, e_out = conv(x, torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]), e)
    assert (out >= 0).all() and (e_out >= 0).all()  # ReLU, no residual
    (out.sum() + e_out.sum()).backward()
    assert x.grad.abs().sum() > 0 and e.grad.abs().sum() > 0


def test_bad_input_names_the_argument():
    conv = GatedGCNConv(4)
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="channels"):
        GatedGCNConv(0)
    with pytest.raises(ValueError, match="dropout"):
        GatedGCNConv(4, dropout=1.0)
    with pytest.raises(ValueError, match="channels"):
        conv(torch.randn(2, 3), ei, torch.randn(2, 4))
    with pytest.raises(ValueError, match="edge_attr"):
        conv(torch.randn(2, 4), ei, torch.randn(3, 4))
