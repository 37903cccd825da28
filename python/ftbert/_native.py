"""Loads the C++ engine (`ftbert._C`) and the libraries it needs at run time."""

from __future__ import annotations

import ctypes
import os


def _preload_openblas() -> None:
    # The CPU backend links OpenBLAS from the scipy-openblas32 wheel. Loading it by path first makes
    # the import independent of where pip put the two packages relative to each other.
    try:
        import scipy_openblas32
    except ImportError:  # the RPATH set at build time may still find it
        return
    lib = os.path.join(scipy_openblas32.get_lib_dir(), "lib" + scipy_openblas32.get_library() + ".so")
    if os.path.exists(lib):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def _preload_cublas() -> None:
    # The CUDA backend is opened on demand; with cuBLAS from the nvidia-cublas wheel (as PyTorch's
    # CUDA builds install it), load it by path so the loader finds it wherever the wheel lives.
    try:
        import nvidia
    except ImportError:
        return
    for base in getattr(nvidia, "__path__", []):
        for sub in ("cu13/lib", "cublas/lib"):
            for name in ("libcublasLt.so.13", "libcublas.so.13", "libcublasLt.so.12", "libcublas.so.12"):
                path = os.path.join(base, sub, name)
                if os.path.exists(path):
                    try:
                        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        pass


_preload_openblas()

from . import _C  # noqa: E402

_cublas_loaded = False


def ensure_cuda_libraries() -> None:
    """Called before the first CUDA encoder is made."""
    global _cublas_loaded
    if not _cublas_loaded:
        _preload_cublas()
        _cublas_loaded = True


__all__ = ["_C", "ensure_cuda_libraries"]
