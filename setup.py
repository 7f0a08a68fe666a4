"""The package's one build step: the CPU expert kernels (app/kernels/cpu/*.c), a plain C shared library with no
Python or torch headers (build isolation never pulls torch), called through ctypes. It is optional: where no C
compiler exists the package still installs and the experts run on the torch reference; app/kernels/cpu/library.py
then says so once at run time."""

from pathlib import Path

from setuptools import Extension, setup

KERNELS = Path("app/kernels/cpu")

setup(ext_modules=[Extension(
    "app.kernels.cpu._experts",
    sources=sorted(str(path) for path in KERNELS.glob("*.c")),
    depends=sorted(str(path) for path in KERNELS.glob("*.h")),
    extra_compile_args=["-O3", "-std=c11", "-fopenmp"],
    extra_link_args=["-fopenmp"],
    libraries=["m"],
    optional=True,
)])
