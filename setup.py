"""Build the Cython kernels: every ``src/sparknet/**/*.pyx`` becomes an extension."""
import glob
import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def extensions():
    exts = []
    compile_args = [] if sys.platform == "win32" else ["-O3", "-fno-math-errno"]
    for pyx in sorted(glob.glob(os.path.join("src", "sparknet", "**", "*.pyx"), recursive=True)):
        rel = os.path.relpath(pyx, "src")
        name = os.path.splitext(rel)[0].replace(os.sep, ".")
        exts.append(Extension(name, [pyx], include_dirs=[os.path.join(HERE, "csrc")],
                              extra_compile_args=compile_args))
    return exts


setup(
    ext_modules=cythonize(
        extensions(),
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
        include_path=["src"],
    ),
)
