import pytest
import torch

from benchmarks.launches import count_ops
from sbm_pyg.sampling.checks import as_ptr, check_pointers
from sbm_pyg.validation import sync


def test_a_pointer_made_valid_is_not_checked_again():
    device = torch.get_default_device()
    bad = torch.tensor([0, 7, 3, 6])  # decreasing: made valid, flagged
    ptr_q, ptr_k, checks = check_pointers(bad, bad.clone(), 6, 6, device)
    assert len(checks) == 2
    assert ptr_q.tolist() == [0, 6, 6, 6]  # clamped to 6 rows, non-decreasing
    # The valid pointers it returned pass again with no check and no
    # operator (a layer's sampler re-checking its regime's pointers).
    again = []
    ops = count_ops(lambda: again.append(check_pointers(ptr_q, ptr_k, 6, 6, device)))
    q2, k2, checks2 = again[-1]
    assert q2 is ptr_q and k2 is ptr_k and checks2 == []
    assert ops["ops"] == 0, ops
    # The input's own check still raises where it is synced.
    with pytest.raises(ValueError, match="ptr_q must start at 0"):
        sync(checks)


def test_one_sequence_needs_no_check():
    # No pointers: [0, N] made on the device, valid as made (no check, two
    # operators), one tensor for queries and keys of the same length.
    device = torch.get_default_device()
    made = []
    ops = count_ops(lambda: made.append(check_pointers(None, None, 6, 6, device)))
    ptr_q, ptr_k, checks = made[-1]
    assert ptr_q.tolist() == [0, 6] and ptr_k is ptr_q and checks == []
    assert ops["ops"] - ops["views"] == 2, ops
    ptr_q, ptr_k, checks = check_pointers(None, None, 6, 4, device)
    assert (ptr_q.tolist(), ptr_k.tolist(), checks) == ([0, 6], [0, 4], [])
    # Made valid: passed again unchecked.
    assert check_pointers(ptr_q, ptr_k, 6, 4, device)[2] == []


def test_only_that_tensor_at_its_row_count_and_version_is_trusted():
    device = torch.get_default_device()
    safe, _ = as_ptr("ptr", torch.tensor([0, 2, 5]), 5, device)
    # Another row count, an equal copy, an in-place change: checked again.
    assert len(check_pointers(safe, safe, 6, 6, device)[2]) == 2
    assert len(check_pointers(safe.clone(), safe, 5, 5, device)[2]) == 1
    safe[1] = 9  # in place: its version moves on
    ptr, _, checks = check_pointers(safe, safe, 5, 5, device)
    assert len(checks) == 2 and ptr.tolist() == [0, 5, 5]


@pytest.mark.parametrize("ptr,rows,valid", [
    ([0, 6], 6, True), ([0, 2, 2, 6], 6, True), ([0], 0, True),
    ([0, 0, 0], 0, True),
    ([1, 6], 6, False),  # starts past 0
    ([0, 5], 6, False),  # ends short of the rows
    ([0, 4, 2, 6], 6, False),  # decreases
    ([0, 7, 6], 6, False),  # past the rows, then back
    ([0, -1, 6], 6, False),  # negative
    ([0], 3, False), ([2], 2, False),  # no sequence over rows
])
def test_the_pointer_check_flags_exactly_the_invalid_ones(ptr, rows, valid):
    device = torch.get_default_device()
    safe, (bad, message) = as_ptr("ptr", torch.tensor(ptr), rows, device)
    assert bool(bad) == (not valid), message
    # The valid form: from 0 to the rows, never decreasing; the input itself
    # where that was valid.
    assert safe[0] == (0 if len(ptr) > 1 else rows) and safe[-1] == rows
    assert bool((safe.diff() >= 0).all())
    if valid:
        assert safe.tolist() == ptr
