// The extension module sbm_pyg._C: the CPU kernels of the torch operators
// sbm_pyg::* (the fastRG sampler's two passes, the fused sparse attention
// and the dense-regime attention, each with its backward). Their schemas,
// CUDA (Triton) kernels, fake kernels and the attentions' autograd formulas
// are defined once in Python
// (sbm_pyg/sampling/fastrg_op.py, sbm_pyg/ops/fused_attention.py,
// sbm_pyg/ops/dense_attention.py).
#include <torch/extension.h>
#include <torch/library.h>

#include "attention/attention.h"
#include "attention/dense.h"
#include "sampler/fastrg.h"

// Importing sbm_pyg._C loads the library, which registers the kernels below.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "sbm_pyg compiled kernels (CPU), registered as torch.ops.sbm_pyg";
}

TORCH_LIBRARY_IMPL(sbm_pyg, CPU, m) {
  m.impl("fastrg_plan", &sbm_pyg::fastrg_plan);
  m.impl("fastrg_sample", &sbm_pyg::fastrg_sample);
  m.impl("sparse_attention", &sbm_pyg::sparse_attention);
  m.impl("sparse_attention_backward", &sbm_pyg::sparse_attention_backward);
  m.impl("dense_attention", &sbm_pyg::dense_attention);
  m.impl("dense_attention_backward", &sbm_pyg::dense_attention_backward);
}
