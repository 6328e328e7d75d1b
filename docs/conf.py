"""Sphinx configuration for sparknet's documentation (built with -W: warnings are errors)."""
import os
import sys

# Document the installed package (its Cython kernels are compiled there); fall back to src/.
try:
    import sparknet  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))
    import sparknet  # noqa: F401

project = "sparknet"
author = "sparknet developers"
release = sparknet.__version__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ext"))
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "mdinclude"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
nitpicky = False
exclude_patterns = ["_build", "_ext"]
html_theme = "furo"
suppress_warnings = ["ref.python"]
