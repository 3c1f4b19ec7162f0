"""Device placement: the library puts every tensor it makes on its inputs'
device and draws with generators of that device.

With torch's default device set to ``meta``, a tensor that library code
creates without naming its device lands on ``meta`` and the first operation
mixing it with the inputs fails. So these tests find, on any machine, the
code that would leave tensors on the CPU while the inputs are on a GPU. The
inputs, modules and generators are made on the test device, before the
default device is switched.
"""
import pytest
import torch

from sbm_pyg.models import SBMTransformer
from sbm_pyg.nn import SBMConv, SBMGPSConv, SBMMultiheadAttention
from sbm_pyg.nn.functional import edge_probability, sparse_attention
from sbm_pyg.ops import BACKENDS, WITH_EXTENSION, triton_runs
from sbm_pyg.sampling import bernoulli, expected_adjacency, fastrg
from tests.helpers import seeded


def memberships(device, Nq=7, Nk=7, H=2, k=3):
    g = seeded(0)
    q = torch.rand(Nq, H, k, generator=g, device=device)
    k_memb = torch.rand(Nk, H, k, generator=g, device=device)
    b = torch.rand(H, k, k, generator=g, device=device) * 0.5
    return q, b, k_memb


def skip_where_it_cannot_run(backend, device):
    if backend == "cpp" and (device.type != "cpu" or not WITH_EXTENSION):
        pytest.skip("the C++ kernels are built for CPU tensors")
    if backend == "triton" and not triton_runs(device):
        pytest.skip("triton not installed")


def ragged_ptr(device):
    ptr = torch.tensor([0, 3, 7], device=device)
    return ptr, ptr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_sampler_makes_nothing_on_the_default_device(device, backend, mode):
    skip_where_it_cannot_run(backend, device)
    q, b, k = memberships(device)
    ptr_q, ptr_k = ragged_ptr(device)
    include = torch.tensor([[0, 1, 5], [0, 2, 4]], device=device)
    gen = seeded(1)
    with torch.device("meta"):
        graph = fastrg(q, b, k, ptr_q=ptr_q, ptr_k=ptr_k, mode=mode,
                       exploration=0.1, self_loops=True, include_edges=include,
                       max_edges=10**6, generator=gen, backend=backend)
        rowptr, col = graph.rowptr, graph.csr.col
        colptr, row_t = graph.colptr, graph.csr.row_t()
        tensors = [graph.edge_index, graph.head, graph.perm, rowptr, col,
                   colptr, row_t, graph.csr.row(), graph.ptr_q, graph.ptr_k]
        reference = bernoulli(q, b, k, ptr_q=ptr_q, ptr_k=ptr_k, mode=mode,
                              generator=gen)
        tensors += [reference.edge_index, expected_adjacency(q, b, k)]
    assert graph.num_edges > 0
    assert all(t.device == device for t in tensors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_makes_nothing_on_the_default_device(device, backend):
    skip_where_it_cannot_run(backend, device)
    q, b, k = memberships(device)
    graph = fastrg(q, b, k, exploration=0.5, generator=seeded(2))
    g = seeded(3)
    query, key, value = (torch.randn(7, 2, 4, generator=g, device=device,
                                     requires_grad=True) for _ in range(3))
    memb = (q.requires_grad_(), b.requires_grad_(), k.requires_grad_())
    dropout_gen = seeded(4)
    with torch.device("meta"):
        prob = edge_probability(*memb, graph)
        out, alpha = sparse_attention(query, key, value, graph, prob,
                                      dropout=0.2 * (backend == "torch"),
                                      training=True, generator=dropout_gen,
                                      return_attention_weights=True,
                                      backend=backend)
        (out.sum() + alpha.sum()).backward()
    assert out.device == alpha.device == device
    for t in (query, key, value, *memb):
        assert t.grad is not None and t.grad.device == device


def test_layers_make_nothing_on_the_default_device(device):
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=4, exploration=0.1,
                   self_loops=True).to(device)
    mha = SBMMultiheadAttention(8, 2, 4, 4, exploration=0.1).to(device)
    gps = SBMGPSConv(8, None, heads=2, norm="layer_norm",
                     attn_kwargs=dict(num_clusters=4)).to(device)
    model = SBMTransformer(num_tokens=10, max_len=6, channels=8, heads=2,
                           num_clusters=4, token_classes=3).to(device)
    g = seeded(5)
    x = torch.randn(9, 8, generator=g, device=device)
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1], device=device)
    include = torch.tensor([[0, 4], [1, 5]], device=device)
    edge_index = torch.tensor([[0, 1, 4], [1, 0, 5]], device=device)
    seq = torch.randn(2, 5, 8, generator=g, device=device)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], device=device).bool()
    tokens = torch.randint(1, 10, (2, 5), generator=g, device=device)
    with torch.device("meta"):
        outs = [conv(x, batch, include_edges=include, generator=g),
                mha(seq, mask=mask, generator=g),
                gps(x, edge_index, batch, generator=g)]
        result = model(tokens, mask, generator=g)
        outs += [result.token_logits, result.seq_logits]
        sum(o.sum() for o in outs).add(result.density_loss).backward()
    assert all(o.device == device for o in outs)
    for module in (conv, mha, gps, model):
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        assert grads and all(grad.device == device for grad in grads)


def test_generator_on_another_device_is_refused(device):
    # Meta tensors stand in for a second device on machines with one.
    other = "meta" if device.type != "meta" else "cpu"
    q, b, k = (t.to(other) for t in memberships(device))
    with pytest.raises(ValueError, match=f"generator is on {device.type}"):
        fastrg(q, b, k, generator=seeded(0))
    with pytest.raises(ValueError, match=f"generator is on {device.type}"):
        x = torch.zeros(7, 2, 4, device=other)
        sparse_attention(x, x, x, fastrg(*memberships(device)).to(other),
                         dropout=0.1, training=True, generator=seeded(0))
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        fastrg(*memberships(device), generator=0)


def test_cuda_memory_guard_counts_the_allocator_cache(monkeypatch):
    # Blocks that the caching allocator reserved but no tensor uses can be
    # allocated again: 1 GiB free on the driver + (10 - 4) GiB cached.
    from sbm_pyg.validation import available_memory
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda device=None: (1 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved",
                        lambda device=None: 10 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated",
                        lambda device=None: 4 << 30)
    assert available_memory(torch.device("cuda")) == 7 << 30
