// The extension module sbm_pyg._C: the fastRG sampler through pybind11 (its
// Python side, sbm_pyg/sampling/_compiled.py, checks sizes between its two
// passes), and the fused attention as torch operators, sbm_pyg::*, whose
// autograd and fake kernels are registered from Python
// (sbm_pyg/ops/fused_attention.py).
#include <torch/extension.h>
#include <torch/library.h>

#include "attention/attention.h"
#include "sampler/fastrg.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "sbm_pyg compiled kernels (CPU)";
  m.def("fastrg_plan", &sbm_pyg::fastrg_plan, "fastRG pass 1: row degrees");
  m.def("fastrg_sample", &sbm_pyg::fastrg_sample, "fastRG pass 2: the graph");
}

// The CPU kernels of the fused attention. The operators' schemas, their
// CUDA (Triton) kernels, autograd formula and fake kernels are defined once
// in Python (sbm_pyg/ops/fused_attention.py).
TORCH_LIBRARY_IMPL(sbm_pyg, CPU, m) {
  m.impl("sparse_attention", &sbm_pyg::sparse_attention);
  m.impl("sparse_attention_backward", &sbm_pyg::sparse_attention_backward);
}
