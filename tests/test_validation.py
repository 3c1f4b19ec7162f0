"""validation: deferred checks resolved with scalars in one host read."""
import pytest
import torch

from sbm_pyg.validation import nonnegative_finite, sync


def test_sync_reads_every_dtype_exactly():
    # An integer beyond float32's 24-bit mantissa beside a float32 scalar
    # and a flag: one concatenation must not round it to float32.
    big = torch.tensor(2**40 + 1)
    values = sync([(torch.tensor(False), "never")], big,
                  torch.tensor(0.1, dtype=torch.float32),
                  torch.tensor(True), torch.tensor(2.5, dtype=torch.float64),
                  torch.tensor([7], dtype=torch.int32))
    assert values == [2**40 + 1, float(torch.tensor(0.1)), 1.0, 2.5, 7.0]
    assert sync([]) == []


def test_sync_raises_the_first_failing_check():
    bad = nonnegative_finite("q_memb", torch.tensor([1.0, float("nan")]))
    good = nonnegative_finite("k_memb", torch.ones(2))
    other = (torch.tensor(True), "second")
    with pytest.raises(ValueError, match="q_memb must be finite"):
        sync([good, bad, other], torch.tensor(3))
    with pytest.raises(ValueError, match="^second$"):
        sync([good, other])


@pytest.mark.parametrize("value,ok", [
    (0.0, True), (3.5, True), (float("nan"), False), (float("inf"), False),
    (float("-inf"), False), (-1e-30, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_nonnegative_finite_flags_nan_inf_and_negatives(value, ok, dtype):
    x = torch.tensor([1.0, value, 2.0], dtype=dtype)
    bad, message = nonnegative_finite("block", x)
    assert bool(bad) == (not ok) and message.startswith("block must be finite")
