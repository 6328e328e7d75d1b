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
copyright = "2026, sparknet developers"  # the footer
release = sparknet.__version__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ext"))
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "mdinclude",
              "reexports"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Every reference to sparknet's own objects must resolve (re-exported spellings resolve
# through _ext/reexports.py).  Without intersphinx (no network at build time) the other
# projects' names cannot; nor can the words Napoleon reads as types in prose-like type
# fields, the private bases that show-inheritance names, or the compiled kernels.
# torch is an optional extra: where it is absent, autodoc documents sparknet.interop against a
# stand-in (the classes' torch bases are named, not imported)
try:
    import torch  # noqa: F401
except ImportError:
    autodoc_mock_imports = ["torch"]

nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|pyspark|py4j|pandas|pyarrow|mlflow|os|pathlib|enum|threading|typing|collections)(\..*)?"),
    (r"py:.*", r"(SparkContext|SparkSession|DataFrame|RDD|Broadcast|Column|Row|Signature|ModelInfo)"),
    (r"py:.*", r"(onnx|onnxruntime|torch|nn|keras)(\..*)?"),     # sparknet.onnx, sparknet.interop
    (r"py:class", r"(Module|Tensor)"),
    (r"py:.*", r"[a-z][\w-]*"),                       # a word of a type field: "a", "whether", "params"
    (r"py:.*", r"(tuple|list|dict|set)\[.*|'.*'|\d+|[\w.]*\]"),
    (r"py:.*", r"sparknet(\.\w+)*\._\w+(\.\w+)*"),     # private modules and classes
    (r"py:.*", r"_\w+"),
    (r"py:.*", r".* .*"),                             # a phrase of a type field
]
# members that docstrings name but that have no docstring of their own (autodoc leaves them out)
nitpick_ignore = [
    ("py:meth", "BlockJob.run"), ("py:meth", "sparknet.cluster.model_parallel.jobs.BlockJob.run"),
    ("py:attr", "RoundResult.states"), ("py:attr", "Plan.ruled_out"), ("py:attr", "ModelParallel.last_step_bytes"),
    ("py:meth", "FitContext._tau"), ("py:meth", "FitContext._estimate"), ("py:meth", "Sequential.from_config"),
    ("py:class", "ChainJob"), ("py:class", "Piece"),
]
exclude_patterns = ["_build", "_ext"]
html_theme = "furo"
# Objects stay out of the pages' tables of contents: with every class and method in them,
# the theme copied the whole tree for each of the ~80 pages (37 of a 77 s build); the
# API page's headings are its modules, and each object keeps its anchor.
toc_object_entries = False
suppress_warnings = ["ref.python"]
