"""The package's shape: no import circle, no private name imported across modules, a light ``import refusion``."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "refusion"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], list[str]]:
    """Every refusion module ``name`` imports (module level and inside functions), and the private names it takes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out, private = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "refusion")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            if base.split(".")[0] != "refusion":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                    continue
                out.add(base)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    private.append(f"{name} imports {base}.{alias.name}")
    return {m for m in out if m in known and m != name}, private


def test_no_import_circle_and_no_private_name_taken_across_modules():
    known = modules()
    graph, private = {}, []
    for name, path in known.items():
        graph[name], taken = imports(name, path, known)
        private += taken
    assert not private, private
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_importing_refusion_loads_no_search_training_or_model_code():
    probe = ("import sys, refusion; loaded = [m for m in sys.modules if m.startswith('refusion.')]; "
             "print(sorted(loaded)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    loaded = eval(out[0])
    assert not any(m.startswith(("refusion.sweep", "refusion.training")) for m in loaded), loaded
    assert out[1] == "False", "import refusion imports torch"


def test_the_public_names_resolve():
    import refusion

    for name in refusion.__all__:
        assert getattr(refusion, name) is not None, name


def test_the_names_plugin_authors_import_keep_working():
    from refusion.plugins import hookimpl  # noqa: F401
    from refusion.protocol import BlockReuse, Branch, Extend, ModelCall  # noqa: F401
    from refusion.strategies.base import CacheReorderer, Infiller, SlotPartitioner, SlotSelector  # noqa: F401
    from refusion.testing import check_part  # noqa: F401
    from refusion.validators import one_of, positive_int, probability  # noqa: F401
