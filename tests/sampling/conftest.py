import functools

import pytest

from sbm_pyg import sampling
from sbm_pyg.sampling import fastrg_op
from tests.sampling.cases import BACKENDS, INTERPRETED


@pytest.fixture(params=BACKENDS, ids=lambda p: p[0] if isinstance(p, tuple) else None)
def sample(request, monkeypatch):
    """fastrg on the backend under test."""
    name, threshold = request.param
    if (name == "triton" and INTERPRETED
            and request.node.get_closest_marker("many_draws")):
        pytest.skip("too many rows for Triton's interpreter; compared with "
                    "the C++ kernel edge by edge in test_backends")
    if threshold is not None:
        monkeypatch.setattr(fastrg_op, "DENSE_ROW_THRESHOLD", threshold)
    return functools.partial(sampling.fastrg, backend=name)
