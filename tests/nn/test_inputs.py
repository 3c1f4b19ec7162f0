"""The layer's inputs (sbm_pyg/nn/inputs.py): pointers from a batch vector,
with and without its size."""
import pytest
import torch

from benchmarks.launches import count_reads
from sbm_pyg.nn import SBMConv
from sbm_pyg.nn.inputs import sequence_pointers
from sbm_pyg.sampling.checks import check_pointers
from sbm_pyg.validation import sync
from tests.helpers import seeded

BATCH = torch.tensor([0, 0, 1, 1, 1, 3])  # sequence 2 empty


def test_pointers_from_a_batch_vector_with_and_without_its_size():
    read = sequence_pointers(BATCH, None, 6, 6)
    unread = sequence_pointers(BATCH, None, 6, 6, batch_size=4)
    for ptr in read + unread:
        assert ptr.tolist() == [0, 2, 5, 5, 6]
    # One more (empty) sequence at the end when the size says so.
    assert sequence_pointers(BATCH, None, 6, 6, 5)[0].tolist() == [0, 2, 5, 5, 6, 6]
    reads = count_reads(lambda: sequence_pointers(BATCH, None, 6, 6, 4))
    assert reads == {}
    assert sum(count_reads(lambda: sequence_pointers(BATCH, None, 6, 6)).values()) == 1
    assert sequence_pointers(None, None, 6, 6, batch_size=1) == (None, None)


@pytest.mark.parametrize("batch", [
    torch.tensor([0, 1, 1, 0, 2, 2]),   # not sorted
    torch.tensor([-1, 0, 0, 1, 1, 1]),  # negative
    torch.tensor([0, 0, 1, 1, 2, 2]),   # an entry at batch_size
])
def test_a_bad_batch_vector_fails_its_pointers_check_unread(batch):
    # Nothing read: the pointers' own deferred check fails at the sync.
    ptr, _ = sequence_pointers(batch, None, 6, 6, batch_size=2)
    _, _, checks = check_pointers(ptr, ptr, 6, 6, ptr.device)
    with pytest.raises(ValueError, match="ptr_q must start at 0"):
        sync(checks)
    good, _ = sequence_pointers(torch.tensor([0, 0, 1, 1, 1, 1]), None, 6, 6, 2)
    sync(check_pointers(good, good, 6, 6, good.device)[2])


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch_size=2.0), TypeError, "batch_size must be an int"),
    (dict(batch_size=True), TypeError, "batch_size must be an int"),
    (dict(batch_size=-1), ValueError, "batch_size must be >= 0"),
    (dict(batch_size=2, ptr=torch.tensor([0, 6])), ValueError, "batch_size goes with batch"),
    (dict(batch_size=2, batch=None), ValueError, "batch_size goes with batch"),
])
def test_bad_batch_size(kwargs, error, match):
    args = dict(batch=BATCH, ptr=None, batch_size=None)
    if "ptr" in kwargs:
        args["batch"] = None
    args.update(kwargs)
    with pytest.raises(error, match=match):
        sequence_pointers(args["batch"], args["ptr"], 6, 6, args["batch_size"])


@pytest.mark.parametrize("warmup", [False, True])
@pytest.mark.parametrize("batch", [torch.tensor([0, 1, 1, 0, 2, 2]),
                                   torch.tensor([0, 0, 1, 1, 3, 3])])
def test_the_layer_names_the_batch_vector(warmup, batch):
    # Sampled graphs or the dense warm-up: the pointers' failed check comes
    # back as the batch vector's, with the size it was given.
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3).train()
    conv.attend_all = warmup
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match=r"batch must be sorted .* below batch_size \(3\)"):
        conv(x, batch, batch_size=3, generator=seeded(0))


@pytest.mark.parametrize("warmup", [False, True])
def test_the_layer_with_batch_size_is_the_layer_without(warmup):
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3, dropout=0.1).train()
    conv.attend_all = warmup
    x = torch.randn(6, 8)
    outs = [conv(x, BATCH, batch_size=size, generator=seeded(1)) for size in (None, 4)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_a_bad_pointer_in_the_dense_warmup_is_named():
    # The warm-up reads the padded sizes; the pointers' checks raise there
    # (before, a bad pointer reached to_dense_batch).
    torch.manual_seed(0)
    conv = SBMConv(8, 4, heads=2, num_clusters=3).train()
    conv.attend_all = True
    with pytest.raises(ValueError, match="ptr_q must start at 0"):
        conv(torch.randn(6, 8), ptr=torch.tensor([0, 4, 3, 6]), generator=seeded(0))
