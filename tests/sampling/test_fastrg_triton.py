"""The Triton sampler's own passes (the graph it samples is compared with
the C++ kernel's in test_fastrg_op and test_backends): the key tables, the
draw buffer's slots and the host syncs of a call."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sbm_pyg.ops import triton_runs
from sbm_pyg.sampling import fastrg_triton
from sbm_pyg.sampling.key_masses import key_masses
from tests.markers import needs_triton

pytestmark = [needs_triton, pytest.mark.skipif(
    not triton_runs(torch.device("cpu")),
    reason="the kernels run on CPU tensors under TRITON_INTERPRET=1")]


def test_weight_bits_keep_a_table_below_2_to_61():
    assert fastrg_triton.weight_bits(1) == 60
    assert fastrg_triton.weight_bits(5) == 58
    assert fastrg_triton.weight_bits(2**20) == 40


def test_key_tables():
    # Two heads, two clusters, sequences of 3, 0 and 2 keys: each key's
    # weight is floor(z 2^M / max) of its (sequence, head, cluster), the
    # sums run over the batch (a sequence's entries count from the entry
    # before it), and bucket b of a table of n keys starts at or before the
    # first key whose cumulative weight exceeds floor(b T / n), the
    # smallest target of its draws, by less than a 2^-30 of the total (a
    # float64 bound with a margin; the key a draw takes is exact all the
    # same).
    Z = torch.tensor([[[0.5, 0.0], [1.0, 2.0]],
                      [[0.25, 0.0], [0.5, 2.0]],
                      [[1.0, 0.0], [0.125, 1.0]],
                      [[3.0, 1.0], [1.0, 1.0]],
                      [[1.5, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    ptr = torch.tensor([0, 3, 3, 5])
    max_z = key_masses(Z, ptr)[1]
    table, guide = fastrg_triton.key_tables(Z, max_z, ptr, 2, 2)
    M = fastrg_triton.weight_bits(5)
    assert M == 58
    one = 2**M
    # Head 0, cluster 0 (row 0): max 1.0 in the first sequence, 3.0 in the
    # last; head 0, cluster 1: nothing in the first, max 1.0 in the last.
    w00 = [one // 2, one // 4, one, one, one // 2]
    w01 = [0, 0, 0, one, 0]
    w10 = [one, one // 2, one // 8, one, 0]
    w11 = [one, one, one // 2, one, one]
    for row, w in enumerate([w00, w01, w10, w11]):
        assert table[row].tolist() == [sum(w[:j + 1]) for j in range(5)]
    # Local sums: [w0, w0+w1, ...] per sequence; buckets by exact integers.
    checked = 0
    for row, w in enumerate([w00, w01, w10, w11]):
        for ks, ke in ((0, 3), (3, 5)):
            cum = [sum(w[ks:j + 1]) for j in range(ks, ke)]
            n, total = ke - ks, cum[-1]
            if total == 0:
                continue
            for b in range(n):
                bound = b * total // n
                first = next(j for j, c in enumerate(cum) if c > bound)
                start = int(guide[row, ks + b]) - ks
                assert 0 <= start <= first, (row, ks, b)
                assert cum[start] > bound - (total >> 30), (row, ks, b)
                checked += 1
    assert checked == 17


def test_buffer_slots():
    # Rows: dense over 6 keys, 3 draws, none, 5 draws (past a register
    # sort of 4: a bitmap word after its slots), a row of the empty
    # sequence; one forced key (the self-loop) per row that has keys.
    ptr_q = torch.tensor([0, 4, 5])
    ptr_k = torch.tensor([0, 6, 6])
    degree = torch.tensor([-1, 3, 0, 5, 0])
    inc_ptr = torch.zeros(6, dtype=torch.long)
    slots = fastrg_triton.buffer_slots(degree, ptr_q, ptr_k, 1, inc_ptr, True)
    assert slots.tolist() == [6, 4, 1, 6, 0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fastrg_triton, "SORT_BLOCK", 4)
        slots = fastrg_triton.buffer_slots(degree, ptr_q, ptr_k, 1, inc_ptr,
                                           True)
    assert slots.tolist() == [6, 4, 1, 6 + 1, 0]


class _HostReads(TorchDispatchMode):
    # The operators of a call that read a tensor's value on the host (a
    # sync on a GPU) or size their output by the data.
    SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique",
               "_unique2", "unique_consecutive", "item", "equal"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING or (name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in args[1] if i is not None)):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["poisson", "exact"])
def test_sample_reads_one_value_on_the_host(mode):
    # The draw, merge and graph passes run without a host read but the
    # edge count's: the guard's sync comes before, in the caller.
    from tests.sampling.test_fastrg_op import op_inputs, sample_inputs
    # The kernels themselves, not the operators (a dispatch mode sees an
    # operator's call, not the calls inside it).
    args = op_inputs(mode, exploration=0.02)
    with _HostReads() as reads:
        plan = fastrg_triton.plan(*args)
    assert reads.seen == []
    inputs = sample_inputs(args, plan)
    with _HostReads() as reads:
        graph = fastrg_triton.sample(*inputs)
    assert graph[1].numel() > 20
    assert reads.seen == ["_local_scalar_dense"]


def test_sample_refuses_a_capacity_below_its_slots():
    from tests.sampling.test_fastrg_op import op_inputs, sample_inputs
    args = op_inputs("poisson")
    inputs = sample_inputs(args, fastrg_triton.plan(*args))
    inputs[-1] -= 1
    with pytest.raises(RuntimeError, match="capacity"):
        fastrg_triton.sample(*inputs)
