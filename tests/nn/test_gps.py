from typing import NamedTuple

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINConv

import sbm_pyg.nn._sbm_attention as attention_module
from sbm_pyg.nn import SBMGPSConv
from sbm_pyg.sampling import SampledGraph
from tests.helpers import pin_crossover, seeded

C = 8


def ring(n: int, seed: int) -> Data:
    i = torch.arange(n)
    edge_index = torch.stack([torch.cat([i, (i + 1) % n]),
                              torch.cat([(i + 1) % n, i])])
    x = torch.randn(n, C, generator=seeded(seed))
    return Data(x=x, edge_index=edge_index)


def make_layer(**kwargs) -> SBMGPSConv:
    torch.manual_seed(0)
    local = GINConv(torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(),
                                        torch.nn.Linear(C, C)))
    kwargs.setdefault("attn_kwargs", dict(num_clusters=4))
    return SBMGPSConv(C, local, heads=2, **kwargs)


def batch_of(sizes=(5, 7, 4)):
    return next(iter(DataLoader([ring(n, s) for s, n in enumerate(sizes)],
                                batch_size=len(sizes))))


def record_graphs(layer):
    graphs = []
    layer.attn.register_graph_hook(lambda _, graph: graphs.append(graph))
    return graphs


def restrict(graph: SampledGraph, start: int, stop: int) -> SampledGraph:
    """The edges of nodes [start, stop) renumbered as a one-sequence graph."""
    j, i = graph.edge_index
    keep = (i >= start) & (i < stop)
    n, H = stop - start, graph.num_heads
    key = (graph.head[keep] * n + i[keep] - start) * n + j[keep] - start
    ptr = torch.tensor([0, n])
    return SampledGraph.from_keys(key, H, n, n, ptr_q=ptr, ptr_k=ptr)


@pytest.mark.parametrize("include_input_edges", [False, True])
def test_output_shape_and_repr(include_input_edges):
    layer = make_layer(include_input_edges=include_input_edges)
    data = batch_of()
    out = layer(data.x, data.edge_index, data.batch)
    assert out.shape == (16, C)
    assert torch.isfinite(out).all()
    assert layer.sampled_density.shape == (2,)
    assert layer.expected_density.shape == (2,)
    assert repr(layer).startswith("SBMGPSConv(8, conv=GINConv(")
    assert repr(layer).endswith(
        f"heads=2, num_clusters=4, include_input_edges={include_input_edges})")


def test_no_attention_edge_crosses_graphs():
    layer = make_layer()
    graphs = record_graphs(layer)
    data = batch_of((30, 40, 25))
    layer(data.x, data.edge_index, data.batch,
          generator=seeded(0))
    (graph,) = graphs
    j, i = graph.edge_index
    assert graph.num_edges > 100
    assert torch.equal(data.batch[i], data.batch[j])
    # Every graph does get edges: the check is not vacuous.
    assert set(data.batch[i].tolist()) == {0, 1, 2}


class Replayed(NamedTuple):
    # A planned graph (sbm_pyg.sampling.fastrg.PlannedGraph) that draws a
    # given one.
    graph: SampledGraph
    checks: tuple = ()
    scalars: tuple = ()
    seed: None = None

    def finish(self, values):
        return self.graph


@pytest.mark.parametrize("include_input_edges", [False, True])
def test_batched_equals_per_graph(include_input_edges, monkeypatch):
    # The sampler's graphs are replayed: the sparse kernels at any density.
    pin_crossover(monkeypatch, float("inf"))
    layer = make_layer(include_input_edges=include_input_edges).eval()
    data = batch_of()
    graphs = record_graphs(layer)
    batched = layer(data.x, data.edge_index, data.batch,
                    generator=seeded(0))
    (graph,) = graphs
    sampled = iter([restrict(graph, int(a), int(b))
                    for a, b in zip(data.ptr[:-1], data.ptr[1:])])
    # Each graph alone, given the edges the batched forward sampled for it.
    monkeypatch.setattr(attention_module, "plan_fastrg",
                        lambda *args, **kw: Replayed(next(sampled)))
    for g, item in enumerate(data.to_data_list()):
        alone = layer(item.x, item.edge_index)
        assert torch.allclose(batched[data.batch == g], alone, atol=1e-6)


def test_include_input_edges_contains_every_edge():
    layer = make_layer(include_input_edges=True,
                       attn_kwargs=dict(num_clusters=4, exploration=0.0))
    with torch.no_grad():  # a nearly empty SBM: the input edges must remain
        layer.attn.sbm.clusters.mul_(0).add_(-10.0)
    graphs = record_graphs(layer)
    data = batch_of((30, 40, 25))
    layer(data.x, data.edge_index, data.batch)
    (graph,) = graphs
    j, i = graph.edge_index
    got = set(zip(graph.head.tolist(), i.tolist(), j.tolist()))
    want = {(h, int(dst), int(src)) for h in range(2)
            for src, dst in data.edge_index.t()}
    assert want <= got
    assert graph.num_edges == len(got)  # no duplicates


def test_training_step_on_a_dataloader_batch():
    layer = make_layer(attn_kwargs=dict(num_clusters=4, dropout=0.1),
                       dropout=0.1)
    head = torch.nn.Linear(C, 1)
    params = list(layer.parameters()) + list(head.parameters())
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    loader = DataLoader([ring(n, s) for s, n in enumerate((6, 9, 5, 8))],
                        batch_size=4)
    for data in loader:
        out = layer(data.x, data.edge_index, data.batch)
        loss = head(out).pow(2).mean() + 0.1 * layer.expected_density.mean()
        optimizer.zero_grad()
        loss.backward()
        grads = [p.grad for p in params]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        # The SBM is trained: by the STE and by the density penalty.
        assert layer.attn.sbm.clusters.grad.abs().sum() > 0
        optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, params))


def test_without_local_conv_and_norm():
    layer = SBMGPSConv(C, None, heads=4, norm=None,
                       attn_kwargs=dict(num_clusters=2))
    data = batch_of()
    assert layer(data.x, data.edge_index, data.batch).shape == (16, C)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(0.5)
    layer.reset_parameters()
    after = layer.state_dict()
    # Every parameter is drawn again (none left at the filled value) ...
    assert all(not torch.all(p == 0.5) for p in layer.parameters())
    # ... from the same initializers: same shapes, same scale.
    for name, value in before.items():
        assert after[name].shape == value.shape
        if value.is_floating_point() and value.numel() > 8:
            assert 0.5 < float(after[name].std() / value.std().clamp(min=1e-12)) < 2.0, name


def test_bad_arguments():
    with pytest.raises(ValueError, match="heads"):
        SBMGPSConv(C, None, heads=3)
    with pytest.raises(ValueError, match="channels"):
        SBMGPSConv(0, None)
    layer = make_layer()
    data = batch_of()
    with pytest.raises(ValueError, match="x must have 8 channels"):
        layer(data.x[:, :4], data.edge_index, data.batch)
    layer = SBMGPSConv(C, None, heads=2, include_input_edges=True,
                       attn_kwargs=dict(num_clusters=4))
    with pytest.raises(TypeError, match="include_edges must be a LongTensor"):
        layer(data.x, data.edge_index.float(), data.batch)


@pytest.mark.filterwarnings("ignore:Converting sparse tensor to CSR")
@pytest.mark.parametrize("structure", ["edge_index", "sparse_csr", "sparse_coo"])
def test_include_input_edges_from_adj_t(structure):
    # The local conv and the included edges read the same graph whether it
    # comes as edge_index or as a torch.sparse adj_t (rows are targets).
    layer = make_layer(include_input_edges=True)
    data = batch_of()
    n = data.num_nodes
    adj_t = torch.sparse_coo_tensor(data.edge_index.flip(0),
                                    torch.ones(data.num_edges), (n, n),
                                    check_invariants=True)
    given = {"edge_index": data.edge_index, "sparse_coo": adj_t,
             "sparse_csr": adj_t.to_sparse_csr()}[structure]
    graphs = record_graphs(layer)
    out = layer(data.x, given, data.batch, generator=seeded(0))
    ref = layer(data.x, data.edge_index, data.batch, generator=seeded(0))
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.equal(graphs[0].edge_index, graphs[1].edge_index)


@pytest.mark.slow
def test_torch_compile_matches_eager():
    layer = make_layer(include_input_edges=True).eval()
    data = batch_of()
    args = (data.x, data.edge_index, data.batch)
    eager = layer(*args, generator=seeded(0))
    compiled = torch.compile(layer)(*args, generator=seeded(0))
    assert torch.allclose(compiled, eager, atol=1e-5)


def test_attn_kwargs_typo_names_the_attention():
    # A misspelt key used to reach MessagePassing.__init__, whose error
    # blamed the wrong class.
    with pytest.raises(TypeError, match="'num_cluster': did you mean 'num_clusters'"):
        SBMGPSConv(8, None, heads=2, attn_kwargs={"num_cluster": 8})
    layer = SBMGPSConv(8, None, heads=2, attn_kwargs={"num_clusters": 3,
                                                      "aggr": "add"})
    assert layer.attn.num_clusters == 3


def test_kwargs_without_a_local_conv_are_refused():
    layer = SBMGPSConv(8, None, heads=2, attn_kwargs={"num_clusters": 3})
    x, edge_index = torch.randn(6, 8), torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(TypeError, match="conv=None"):
        layer(x, edge_index, return_attention_weights=True)


# ---------------------------------------------------------------------------
# Edge features carried through the layers, and GPSConv's twin for
# edge-updating convs.

from torch_geometric.nn import GPSConv  # noqa: E402

from sbm_pyg.nn import EdgeGPSConv, GatedGCNConv  # noqa: E402


def _two_graphs(C=8, seed=0):
    g = seeded(seed)
    edge_index = torch.tensor([[0, 1, 2, 1, 3, 4, 5], [1, 0, 1, 2, 4, 5, 3]])
    x = torch.randn(6, C, generator=g)
    e = torch.randn(edge_index.size(1), C, generator=g)
    return x, edge_index, e, torch.tensor([0, 0, 0, 3, 3, 3]) // 3


@pytest.mark.parametrize("layer", ["sbm", "multihead", "performer", "bigbird", None])
def test_an_edge_updating_conv_carries_edge_features(layer):
    x, ei, e, batch = _two_graphs()
    conv = GatedGCNConv(8)
    if layer == "sbm":
        gps = SBMGPSConv(8, conv, heads=2, attn_kwargs=dict(num_clusters=4))
    elif layer == "bigbird":
        gps = EdgeGPSConv(8, conv, heads=2, attn_type=layer,
                          attn_kwargs=dict(density=0.5))
    else:
        # .to(): PyG's PerformerAttention draws its projection on the CPU
        # whatever the default device (as a user's model is, it is moved).
        gps = EdgeGPSConv(8, conv, heads=2, attn_type=layer).to(x.device)
    out, e_out = gps(x, ei, batch, edge_attr=e, generator=seeded(1),
                     return_edge_attr=True)
    assert out.shape == x.shape and e_out.shape == e.shape
    # Without asking, the node features alone (GPSConv's return type).
    alone = gps(x, ei, batch, edge_attr=e, generator=seeded(1))
    assert isinstance(alone, torch.Tensor)
    torch.testing.assert_close(alone, out)
    # The edge features are the local conv's own update, unchanged by the
    # layer (GraphGPS's GatedGCN does its residual and dropout itself).
    gps.eval()
    conv.eval()
    _, e_out = gps(x, ei, batch, edge_attr=e, generator=seeded(1),
                   return_edge_attr=True)
    torch.testing.assert_close(e_out, conv(x, ei, e)[1])
    # A second layer takes them.
    out2 = gps(out.detach(), ei, batch, edge_attr=e_out.detach(), generator=seeded(2))
    assert out2.shape == x.shape


@pytest.mark.parametrize("attn_type", ["multihead", "performer"])
def test_dense_twin_attends_within_each_graph_only(attn_type):
    torch.manual_seed(0)
    x, ei, e, batch = _two_graphs()
    gps = EdgeGPSConv(8, GatedGCNConv(8), heads=2, attn_type=attn_type,
                      norm=None).to(x.device).eval()
    out = gps(x, ei, batch, edge_attr=e)
    x2 = x.clone()
    x2[3:] = torch.randn(3, 8)  # the second graph changes
    out2 = gps(x2, ei, batch, edge_attr=e)
    torch.testing.assert_close(out[:3], out2[:3])
    # The batch equals each graph alone.
    alone = gps(x[:3], ei[:, :4], torch.zeros(3, dtype=torch.long),
                edge_attr=e[:4])
    torch.testing.assert_close(out[:3], alone, rtol=1e-5, atol=1e-6)


class _GINWithEdges(GINConv):
    # GIN plus its residual, returning the edge features it was given: an
    # "edge-updating" conv whose node output is what GPSConv computes from
    # a plain GINConv (GPSConv adds the residual itself).
    def forward(self, x, edge_index, edge_attr):
        return super().forward(x, edge_index) + x, edge_attr


def _gin_mlp(C):
    return torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(),
                               torch.nn.Linear(C, C))


@pytest.mark.parametrize("attn_type", ["multihead", "performer"])
@pytest.mark.parametrize("training", [False, True])
def test_edge_twin_is_pygs_gpsconv(attn_type, training):
    # The twin differs from GPSConv only where the conv updates edges: PyG's
    # layer's state dict loads into it key for key, and the outputs agree
    # (batch norm in training uses the batch's statistics in both).
    torch.manual_seed(0)
    x, ei, e, batch = _two_graphs()
    kwargs = dict(heads=2, attn_type=attn_type, attn_kwargs=dict(dropout=0.0))
    pyg = GPSConv(8, GINConv(_gin_mlp(8)), **kwargs).to(x.device)
    ours = EdgeGPSConv(8, _GINWithEdges(_gin_mlp(8)), **kwargs).to(x.device)
    ours.load_state_dict(pyg.state_dict())  # strict: every key matches
    assert sorted(ours.state_dict()) == sorted(pyg.state_dict())
    pyg.train(training)
    ours.train(training)
    want = pyg(x, ei, batch)
    got, e_out = ours(x, ei, batch, edge_attr=e, return_edge_attr=True)
    torch.testing.assert_close(got, want)
    assert e_out is e
    before = [p.clone() for p in ours.attn.parameters()]
    ours.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, ours.attn.parameters()))
    assert repr(ours).replace("EdgeGPSConv", "") == repr(pyg).replace(
        "GPSConv", "").replace("GINConv", "_GINWithEdges")


def test_bigbird_attends_its_pattern_within_each_graph():
    # Graphs of 5 and 3 nodes (the second padded in the dense batch): the
    # attention branch is BigBirdAttention on each graph's nodes in order,
    # its random keys drawn from the same generator state.
    torch.manual_seed(0)
    g = seeded(3)
    x = torch.randn(8, 8, generator=g)
    ei = torch.tensor([[0, 1, 2, 3, 5, 6], [1, 2, 3, 4, 6, 7]])
    e = torch.randn(ei.size(1), 8, generator=g)
    batch = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    gps = EdgeGPSConv(8, GatedGCNConv(8), heads=2, attn_type="bigbird",
                      attn_kwargs=dict(density=0.4), norm=None).eval()
    branch = gps._attend(x, ei, batch, seeded(1), None)
    dense = torch.zeros(2, 5, 8)
    dense[0], dense[1, :3] = x[:5], x[5:]
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    want = gps.attn(dense, mask=mask, generator=seeded(1))[mask]
    torch.testing.assert_close(branch, want)
    # The second graph's nodes never reach the first graph's.
    x2 = x.clone()
    x2[5:] = torch.randn(3, 8, generator=g)
    out, out2 = (gps(h, ei, batch, edge_attr=e, generator=seeded(1)) for h in (x, x2))
    torch.testing.assert_close(out[:5], out2[:5])
    assert not torch.allclose(out[5:], out2[5:])
    before = [p.clone() for p in gps.attn.parameters()]
    gps.reset_parameters()
    assert all(not torch.equal(a, b) for a, b in zip(before, gps.attn.parameters()))
    assert "attn_type=bigbird" in repr(gps)


def test_edge_twin_bad_arguments():
    with pytest.raises(ValueError, match="attn_type"):
        EdgeGPSConv(8, GatedGCNConv(8), attn_type="longformer")
    with pytest.raises(ValueError, match="density"):
        EdgeGPSConv(8, GatedGCNConv(8), attn_type="bigbird")
    with pytest.raises(ValueError, match="conv.*GPSConv"):
        EdgeGPSConv(8, None)
    with pytest.raises(ValueError, match="heads"):
        EdgeGPSConv(8, GatedGCNConv(8), heads=3)
    with pytest.raises(ValueError, match="attn_kwargs"):
        EdgeGPSConv(8, GatedGCNConv(8), attn_type=None, attn_kwargs={"dropout": 0.1})
    gps = EdgeGPSConv(8, GatedGCNConv(8), heads=2, attn_type=None)
    assert "attn_type=None" in repr(gps) and gps.norm2 is None
    # A conv that returns node features only belongs in PyG's GPSConv.
    x, ei, _, batch = _two_graphs()
    plain = EdgeGPSConv(8, GINConv(_gin_mlp(8)), heads=2)
    with pytest.raises(TypeError, match="GINConv.*torch_geometric.nn.GPSConv"):
        plain(x, ei, batch)


@pytest.mark.parametrize("swap", [False, True])
def test_drops_into_pygs_own_gps_usage(swap):
    # PyG's examples/graph_gps.py model, GPSConv swapped for SBMGPSConv
    # (attn_type is GPSConv's: the global attention is SBM's here): the
    # same calls, a Tensor from every layer, a trained step.
    from torch.nn import ReLU, Sequential
    from torch_geometric.nn import GINEConv, GPSConv, global_add_pool
    torch.manual_seed(0)
    C = 16

    def layer():
        mlp = Sequential(torch.nn.Linear(C, C), ReLU(), torch.nn.Linear(C, C))
        if swap:
            return SBMGPSConv(C, GINEConv(mlp), heads=4,
                              attn_kwargs={"dropout": 0.5, "num_clusters": 4})
        return GPSConv(C, GINEConv(mlp), heads=4, attn_type="multihead",
                       attn_kwargs={"dropout": 0.5})

    convs = torch.nn.ModuleList([layer() for _ in range(2)])
    x, ei, _, batch = _two_graphs(C)
    edge_attr = torch.randn(ei.size(1), C, generator=seeded(3))
    opt = torch.optim.Adam(convs.parameters(), lr=1e-2)
    for _ in range(2):
        h = x
        for conv in convs:
            h = conv(h, ei, batch, edge_attr=edge_attr)
            assert isinstance(h, torch.Tensor) and h.shape == x.shape
        loss = global_add_pool(h, batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


def test_init_density_through_attn_kwargs():
    from sbm_pyg.models import SBMTransformer
    from sbm_pyg.nn import SBMMultiheadAttention
    gps = SBMGPSConv(16, None, heads=2, attn_kwargs=dict(init_density=0.02))
    attn = SBMMultiheadAttention(16, 2, init_density=0.02)
    model = SBMTransformer(10, 8, channels=16, heads=2, init_density=0.02)
    for conv in (gps.attn, attn.conv, model.blocks[0].attention.conv):
        assert conv.sbm.density == 0.02 and conv.exploration == pytest.approx(0.002)
