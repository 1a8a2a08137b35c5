"""hetflow: data-parallel PyTorch training on heterogeneous instances, orchestrated by Prefect.

The layers live in the checkout's top-level folders (`flows/`, `tasks/`, `training/`,
`infra/`), which setuptools' `package-dir` installs as `hetflow.flows`, `hetflow.tasks`,
`hetflow.training` and `hetflow.infra`.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# With the checkout's root itself on sys.path (`python -m ...` or pytest, run from the root),
# Python finds this folder as a plain package and never asks setuptools' mapping for the
# layers; searching the root too finds them in the same folders.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "training" / "__init__.py").is_file():
    __path__.append(str(_root))
