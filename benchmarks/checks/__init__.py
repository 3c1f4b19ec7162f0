"""Correctness checks of the kernels and their baselines: the ahead-of-time
Triton compile (spills, parameter types, tensor cores), the version matrix
and the checks a GPU machine runs against the CPU kernels."""
