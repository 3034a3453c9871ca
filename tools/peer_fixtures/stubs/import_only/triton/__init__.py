"""Import-only stand-in for `triton` (not the compiler): decorating kernels works, launching one raises.

Only for importing SDAR's training-only fused loss module; never leave this on sys.path (torch would take it
for a real Triton install).
"""

__version__ = "0.0.0+peer-fixtures-import-only"

from . import language  # noqa: F401


class _Kernel:
    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError(f"import-only triton stand-in: cannot launch {self.__name__}")

        return launch

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"import-only triton stand-in: cannot call {self.__name__}")


def _wrap(f):
    return f if isinstance(f, _Kernel) else _Kernel(f)


def jit(fn=None, **kwargs):
    return _wrap if fn is None else _wrap(fn)


def autotune(configs=None, key=None, **kwargs):
    return _wrap


def heuristics(values):
    return _wrap


class Config:
    def __init__(self, kwargs=None, num_warps=4, num_stages=2, **extra):
        self.kwargs, self.num_warps, self.num_stages = kwargs or {}, num_warps, num_stages


def cdiv(x, y):
    return (x + y - 1) // y


def next_power_of_2(n):
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
