"""Builds the optional compiled kernels (``sbm_pyg._C``) with torch's
``cpp_extension``, as torch-scatter and torch-sparse do.

torch must already be installed and the build must not be isolated (an
isolated build would pull an unpinned torch): ``make test`` does this, or
``pip install --no-build-isolation .``. If the compiler fails, or with
``SBM_PYG_NO_EXT=1``, the package installs without ``sbm_pyg._C`` and runs
on its pure-PyTorch path. Either way the build ends with a line saying
which (pip shows it with ``-v``; at import, a missing ``_C`` is a
RuntimeWarning, and ``sbm_pyg.ops.backends()`` names the kernels in use).
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
                           "csrc/attention/attention.cpp",
                           "csrc/attention/dense.cpp"],
            include_dirs=["csrc"],
            # -fno-trapping-math: floating-point operations raise no traps
            # the kernels rely on, so GCC may if-convert the row loops'
            # selects (masked scores, clamps) and vectorize them.
            extra_compile_args=["-O3", "-fno-trapping-math"] + openmp,
            extra_link_args=openmp,
            optional=True))

        class BuildReportingExtension(BuildExtension):
            def run(self) -> None:
                super().run()
                # optional=True turns a compiler error into a warning deep in
                # the log: say plainly what was built.
                built = os.path.exists(self.get_ext_fullpath("sbm_pyg._C"))
                print("sbm_pyg: compiled kernels built (fastRG sampler, CPU "
                      "attention)" if built else "sbm_pyg: the compiled kernels "
                      "did NOT build; installing the pure-PyTorch path, several "
                      "times slower (see the compiler errors above)",
                      file=sys.stderr)

        cmdclass["build_ext"] = BuildReportingExtension.with_options(use_ninja=False)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
