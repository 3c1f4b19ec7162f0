"""Writes docs/api.md from the public API (each module's ``__all__``) and its
docstrings: ``python docs/make_api.py``; ``--check`` exits 1 if the file is
out of date (the test suite runs it)."""
from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

MODULES = {
    "sbm_pyg.sampling": "Sampling attention graphs (fastRG) and the sampled graph",
    "sbm_pyg.nn": "Layers",
    "sbm_pyg.nn.functional": "Functional attention",
    "sbm_pyg.sparse": "Sparse kernels (CSR, segment softmax)",
    "sbm_pyg.models": "Models",
    "sbm_pyg.experiments": "Experiments: tasks, training, runs",
    "sbm_pyg.theory": "Theory: the universal-approximation conditions",
}
OUT = Path(__file__).with_name("api.md")


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def _members(cls) -> list:
    # Public methods and properties written in the class's own module (PyG
    # adds generated ones, e.g. `propagate`, when a layer is instantiated).
    out = []
    for name, value in vars(cls).items():
        target = value.fget if isinstance(value, property) else value
        if (not name.startswith("_") and inspect.isfunction(target)
                and target.__module__ == cls.__module__):
            out.append((name, value))
    return out


def render() -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings by `python docs/make_api.py` (the "
             "test suite checks it is current). Everything listed is in its "
             "module's `__all__`; the top-level `sbm_pyg` re-exports the "
             "sampler, the layers and the functional attention.", ""]
    for module_name, title in MODULES.items():
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`: {title}", ""]
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
                continue
            kind = "class" if inspect.isclass(obj) else "function"
            lines += [f"### `{name}{_signature(obj)}`", "", f"*{kind}*", "",
                      "```text", inspect.getdoc(obj) or "(undocumented)", "```", ""]
            if inspect.isclass(obj):
                for member, value in _members(obj):
                    target = value.fget if isinstance(value, property) else value
                    sig = "" if isinstance(value, property) else _signature(value)
                    doc = (inspect.getdoc(target) or "(undocumented)").split("\n\n")[0]
                    lines.append(f"- `{name}.{member}{sig}`: {' '.join(doc.split())}")
                if _members(obj):
                    lines.append("")
    return "\n".join(lines)


def main(argv) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python docs/make_api.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
