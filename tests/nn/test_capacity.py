"""capacity="auto": the layer sizes its static calls from the calls before
(one read on the first call, none of the call's own values after), an
overflow warns and grows the next capacity, training and evaluation keep
their own, and a compiled layer stays one graph."""
import copy

import pytest
import torch
import torch._dynamo.utils

from benchmarks.launches import count_reads
from sbm_pyg.nn import SBMConv
from sbm_pyg.nn.capacity import AutoCapacity
from sbm_pyg.sampling import round_capacity
from tests.helpers import seeded


def auto_layer(**kwargs):
    torch.manual_seed(0)
    return SBMConv(16, 8, heads=2, num_clusters=4, capacity="auto", **kwargs).train()


def test_the_first_call_sizes_by_its_expected_draws_and_later_calls_by_the_one_before():
    conv = auto_layer()
    x = torch.randn(96, 16, generator=seeded(1))
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([30, 26, 40]))

    def step():
        out = conv(x, batch, batch_size=3)
        (out.sum() + conv.expected_density.sum()).backward()

    step()
    first = round_capacity(float(conv.expected_draws))
    assert conv.last_backends["sampler"] == "static" and not bool(conv.overflow)
    # A later call reads only the host copy of the call before's values,
    # and nothing where update_capacity read it already.
    assert count_reads(step) == {"nn/capacity.py:refresh": 1}
    assert conv.update_capacity() == first  # the same input, the same need
    assert count_reads(step) == {}
    assert conv.update_capacity() == first


def test_an_overflow_warns_and_the_next_call_fits():
    conv = auto_layer()
    conv(torch.randn(20, 16, generator=seeded(1)))  # sized for 20 rows
    small = conv.update_capacity()
    conv(torch.randn(200, 16, generator=seeded(2)))  # 100 times the pairs
    assert bool(conv.overflow) and float(conv.expected_draws) > small
    need = round_capacity(float(conv.expected_draws))
    with pytest.warns(RuntimeWarning, match=f"overflowed its capacity \\({small}\\)"):
        grown = conv.update_capacity()
    assert grown == max(need, 2 * small) and conv._keepers[True].overflows == 1
    conv(torch.randn(200, 16, generator=seeded(3)))
    assert not bool(conv.overflow)


def test_training_and_evaluation_keep_their_own_capacities():
    # Exploration (training only) adds a share of every pair to the draws.
    conv = auto_layer(exploration=0.2, eval_seed=0)
    x = torch.randn(64, 16, generator=seeded(1))
    conv(x)
    train_draws = float(conv.expected_draws)
    conv.eval()
    with torch.no_grad():
        conv(x)
    assert float(conv.expected_draws) < train_draws
    assert conv.update_capacity() == round_capacity(float(conv.expected_draws))
    conv.train()
    assert conv.update_capacity() == round_capacity(train_draws)


def test_kept_capacity_reads_and_changes_nothing():
    conv = auto_layer(exploration=0.2)
    assert conv.kept_capacity() is None and conv.kept_capacity(training=False) is None
    x = torch.randn(64, 16, generator=seeded(1))
    conv(x)
    first = conv.kept_capacity()
    assert first == round_capacity(float(conv.expected_draws))
    assert conv.kept_capacity(training=False) is None
    # Three times the rows: the copy of this call's draws stays unread.
    conv(torch.randn(192, 16, generator=seeded(2)))
    assert count_reads(conv.kept_capacity) == {}
    assert conv.kept_capacity() == first and conv._keepers[True].overflows == 0
    with pytest.warns(RuntimeWarning, match="overflowed"):
        assert conv.update_capacity() > first  # update_capacity reads it
    assert conv.kept_capacity() == conv.update_capacity()
    with pytest.raises(ValueError, match="kept_capacity needs capacity='auto'"):
        SBMConv(16, 8, capacity=64).kept_capacity()


def test_the_capacity_grows_at_once_and_shrinks_only_when_halved():
    keeper = AutoCapacity()
    assert keeper.refresh() is None
    assert keeper.capacity_for(lambda: torch.tensor(1000.0)) == 1536
    for draws, capacity in [(1100.0, 1536), (1300.0, 1792), (700.0, 1792),
                            (600.0, 896), (3000.0, 3584)]:
        keeper.record(torch.tensor(draws), torch.tensor(False))
        assert keeper.capacity_for(lambda: torch.tensor(-1.0)) == capacity
    # An overflow at least doubles the capacity, whatever the mean says; the
    # same call's tensors recorded twice count once.
    draws, flag = torch.tensor(1000.0), torch.tensor(True)
    keeper.record(draws, flag)
    keeper.record(draws, flag)
    with pytest.warns(RuntimeWarning, match="overflowed its capacity \\(3584\\)"):
        assert keeper.refresh() == 2 * 3584
    assert keeper.overflows == 1 and keeper.refresh() == 2 * 3584


def test_a_copy_not_landed_keeps_the_capacity_and_is_read_later():
    # An accelerator's copy is read once its event has completed, never
    # waited for (an event stand-in here: the CPU has none).
    class Event:
        done = False

        def query(self):
            return self.done

    keeper = AutoCapacity()
    keeper.capacity_for(lambda: torch.tensor(1000.0))
    event = Event()
    keeper._copies.append((torch.tensor([5000.0, 0.0], dtype=torch.float64), event))
    keeper.record(torch.tensor(9000.0), torch.tensor(False))  # behind it
    assert keeper.refresh() == 1536 and len(keeper._copies) == 2
    event.done = True
    assert keeper.refresh() == round_capacity(9000.0) and not keeper._copies


def test_a_copied_layer_keeps_its_capacity():
    conv = auto_layer()
    with torch.no_grad():  # a training call's densities keep their graph
        conv(torch.randn(40, 16, generator=seeded(1)))
    twin = copy.deepcopy(conv)
    assert twin.update_capacity() == conv.update_capacity() is not None


def test_a_compiled_auto_layer_is_one_graph_over_steps():
    conv = auto_layer()
    x = torch.randn(64, 16, generator=seeded(1))
    conv(x).sum().backward()  # eager: the first call's read
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(conv, fullgraph=True, dynamic=False, backend="aot_eager")
    capacities = []
    for _ in range(4):
        compiled(x).sum().backward()
        capacities.append(conv.update_capacity())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"]
    assert len(set(capacities)) == 1 and not bool(conv.overflow)


def test_bad_input_on_the_first_call_is_named_before_the_sums_run():
    conv = auto_layer()
    x = torch.randn(20, 16, generator=seeded(1))
    with pytest.raises(ValueError, match="ptr_q"):
        conv(x, ptr=torch.tensor([0, 12, 9, 20]))
    x[3, 0] = float("nan")
    with pytest.raises(ValueError, match="memberships are not finite"):
        conv(x)
    assert conv.update_capacity() is None  # nothing sized yet


def test_bad_auto_uses_are_refused_by_name():
    with pytest.raises(ValueError, match="capacity.*'big'"):
        SBMConv(16, 8, capacity="big")
    with pytest.raises(ValueError, match="update_capacity needs capacity='auto'"):
        SBMConv(16, 8, capacity=256).update_capacity()


def test_max_edges_bounds_the_kept_capacity_and_expected_draws_above_it_raise():
    keeper = AutoCapacity()
    keeper.limit = 1000
    assert round_capacity(900.0) > 1000
    assert keeper.capacity_for(lambda: torch.tensor(900.0)) == 1000
    keeper.record(torch.tensor(950.0), torch.tensor(True))  # overflowed at the bound
    with pytest.warns(RuntimeWarning, match=r"capacity is 1000 \(max_edges\)"):
        assert keeper.refresh() == 1000
    keeper.record(torch.tensor(1001.0), torch.tensor(False))
    with pytest.raises(ValueError, match="max_edges=1000: a call's expected draws"):
        keeper.refresh()
    keeper.limit = 300  # lowered below the kept capacity: it follows
    keeper.record(torch.tensor(100.0), torch.tensor(False))
    assert keeper.refresh() == round_capacity(100.0) <= 300


def test_a_layer_with_max_edges_runs_static_within_it_and_names_it_above():
    x = torch.randn(40, 16, generator=seeded(1))
    free = auto_layer()
    out = free(x, generator=seeded(2))
    need = free.update_capacity()
    bounded = auto_layer(max_edges=need)  # the same parameters (seeded)
    assert torch.equal(bounded(x, generator=seeded(2)), out)
    assert bounded.last_backends["sampler"] == "static"
    assert bounded.update_capacity() == need
    expected = float(free.expected_draws)
    with pytest.raises(ValueError, match="max_edges=.*expected draws"):
        auto_layer(max_edges=int(expected) - 1)(x)
