import functools

import pytest

from sbm_pyg import sampling
from sbm_pyg.sampling import fastrg_compiled
from tests.sampling.cases import BACKENDS


@pytest.fixture(params=BACKENDS, ids=lambda p: p[0] if isinstance(p, tuple) else None)
def sample(request, monkeypatch):
    """fastrg on the backend under test."""
    name, threshold = request.param
    if threshold is not None:
        monkeypatch.setattr(fastrg_compiled, "DENSE_ROW_THRESHOLD", threshold)
    return functools.partial(sampling.fastrg, backend=name)
