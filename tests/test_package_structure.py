"""The package's shape: no import circle, no private name imported across modules, a light ``import refusion``."""

import ast
import re
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
                circle = path[path.index(nxt) :] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_importing_refusion_loads_no_search_training_or_model_code():
    probe = (
        "import sys, refusion; loaded = [m for m in sys.modules if m.startswith('refusion.')]; "
        "print(sorted(loaded)); print('torch' in sys.modules)"
    )
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


# -- one owner per concept (issue 30) --------------------------------------------------------------------------------

#: modules of the decode core, redesigned on their own branch; their argument checks move to validators there
CORE = {"refusion/decoding/session.py", "refusion/decoding/types.py"}


def sources() -> dict[str, str]:
    root = PACKAGE.parent
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_every_exception_lives_in_errors_py_under_refusion_error():
    import refusion.errors as errors

    outside = []
    for path, text in sources().items():
        for node in ast.walk(ast.parse(text)):
            # a private signal (trace.py's _Bad) never leaves its module; every exception a caller can see does
            if isinstance(node, ast.ClassDef) and path != "refusion/errors.py" and not node.name.startswith("_"):
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith(("Error", "Exception", "Exit", "Interrupt")) for b in bases):
                    outside.append(f"{path}: {node.name}({', '.join(bases)})")
    assert not outside, outside
    for name in dir(errors):
        value = getattr(errors, name)
        if (
            isinstance(value, type)
            and issubclass(value, Exception)
            and not issubclass(value, Warning)
            and value.__module__ == errors.__name__
        ):
            assert issubclass(value, errors.RefusionError), name


def test_parameters_are_checked_by_validators_not_by_hand():
    pattern = re.compile(r"isinstance\(\w+, bool\) or not isinstance|not isinstance\(\w+, bool\) and isinstance")
    found = [
        f"{path}:{number}"
        for path, text in sources().items()
        if path not in CORE | {"refusion/validators.py"}
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_the_dtype_rule_and_the_limits_have_one_place_each():
    rule = re.compile(r"torch\.float64 if .*dtype == torch\.float64 else torch\.float32")
    found = [path for path, text in sources().items() if rule.search(text)]
    assert set(found) <= {"refusion/dtypes.py"} | CORE, found
    assert sorted(p for p in sources() if p.endswith("/limits.py")) == ["refusion/limits.py"]
    for path in ("refusion/limits.py", "refusion/validators.py", "refusion/errors.py"):
        tree = ast.parse(sources()[path])
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        assert not {
            m for m in imported if m.startswith("refusion.") and m not in ("refusion.errors", "refusion.validators")
        }, (path, imported)  # the bottom layer imports only itself


def test_packages_are_named_as_their_commands_and_are_plain_modules():
    import types

    import refusion

    assert isinstance(refusion.batch, types.ModuleType) and type(refusion.batch) is types.ModuleType
    assert isinstance(refusion.sweep, types.ModuleType) and not callable(refusion.sweep)
    assert callable(refusion.run_batch) and callable(refusion.run_sweep)
    assert not (PACKAGE / "search").exists()
    assert not [p for p, t in sources().items() if "__class__ = " in t and "sys.modules" in t]


def test_create_app_builds_the_app_from_route_modules():
    tree = ast.parse(sources()["refusion/serve/app.py"])
    create_app = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_app")
    assert create_app.end_lineno - create_app.lineno < 50
    routes = [
        n.name
        for n in ast.walk(create_app)
        if isinstance(n, ast.AsyncFunctionDef) and any(ast.unparse(d).startswith("app.") for d in n.decorator_list)
    ]
    assert not routes, routes  # no routes or handlers as closures


def test_the_kv_manager_is_on_the_ground_floor_and_the_decode_core_knows_no_entry_point():
    """``cache/`` (pages, tables, the prefix cache, the key/value manager) imports nothing of the decoder; the decode
    loop, its forms and the engines import no scheduler, generator, server or command line."""
    known = modules()
    graph = {name: imports(name, path, known)[0] for name, path in known.items()}
    cache = {m: sorted(i for i in graph[m] if i.startswith("refusion.decoding")) for m in graph if ".cache" in m}
    assert not any(cache.values()), cache
    entry = ("refusion.scheduler", "refusion.generator", "refusion.serve", "refusion.cli", "refusion.batch")
    core = [m for m in graph if m.startswith(("refusion.decoding.loop", "refusion.decoding.forms", "refusion.engines"))]
    taken = {m: sorted(i for i in graph[m] if i.startswith(entry)) for m in core}
    assert not any(taken.values()), taken
