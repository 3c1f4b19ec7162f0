"""The sampler's row streams in Triton against SplitMix64 written out in
Python: the same words and uniforms at the same counters."""
import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sbm_pyg.ops.triton_streams import bits, stream, uniform  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs the device functions interpreted")
MASK = 2**64 - 1


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _bits(seed, row, purpose, n):
    state = _mix64(seed ^ _mix64((row * 4 + purpose + 0x632BE59BD9B4E019) & MASK))
    return _mix64((state + n * 0x9E3779B97F4A7C15) & MASK)


@triton.jit
def _words(Words, Uniforms, seed: tl.int64, row: tl.int64, PURPOSE: tl.constexpr,
           N: tl.constexpr):
    n = tl.arange(0, N).to(tl.int64) + 1
    state = stream(seed, row, PURPOSE)
    tl.store(Words + n - 1, bits(state, n).to(tl.int64, bitcast=True))
    tl.store(Uniforms + n - 1, uniform(state, n))


@pytest.mark.parametrize("seed,row,purpose", [(0, 0, 0), (2**62 - 1, 12345, 1),
                                              (987654321, 2**40, 0)])
def test_words_and_uniforms_are_splitmix64s(seed, row, purpose):
    N = 8
    words = torch.zeros(N, dtype=torch.int64, device="cpu")
    uniforms = torch.zeros(N, dtype=torch.float64, device="cpu")
    _words[(1,)](words, uniforms, seed, row, PURPOSE=purpose, N=N)
    want = [_bits(seed, row, purpose, n) for n in range(1, N + 1)]
    assert [w & MASK for w in words.tolist()] == want
    assert uniforms.tolist() == [(w >> 11) * 2.0**-53 for w in want]
