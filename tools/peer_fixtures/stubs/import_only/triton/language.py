"""Import-only stand-in for triton.language: `constexpr` exists (kernel signatures use it); nothing else does."""


class constexpr:
    def __init__(self, value=None):
        self.value = value


def __getattr__(name):
    raise AttributeError(f"import-only triton.language stand-in has no attribute {name!r}")
