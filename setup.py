"""Builds the optional compiled kernels (``sbm_pyg._C``) with torch's
``cpp_extension``, as torch-scatter and torch-sparse do.

torch must already be installed and the build must not be isolated (an
isolated build would pull an unpinned torch): ``make test`` does this, or
``pip install --no-build-isolation .``. If the compiler fails, or with
``SBM_PYG_NO_EXT=1``, the package installs without ``sbm_pyg._C`` and runs
on its pure-PyTorch path.
"""
import os
import sys

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("SBM_PYG_NO_EXT", "0") != "1":
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # no torch in the build environment
        print("sbm_pyg: torch not importable, skipping the compiled kernels",
              file=sys.stderr)
    else:
        openmp = [] if sys.platform == "darwin" else ["-fopenmp"]
        ext_modules.append(CppExtension(
            "sbm_pyg._C", ["csrc/bindings.cpp", "csrc/sampler/fastrg.cpp",
                           "csrc/attention/attention.cpp"],
            include_dirs=["csrc"],
            extra_compile_args=["-O3"] + openmp,
            extra_link_args=openmp,
            optional=True))
        cmdclass["build_ext"] = BuildExtension.with_options(use_ninja=False)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
