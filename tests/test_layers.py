"""Imports run one way: formats -> kernels (core -> reference -> cpu, cuda -> triton -> dispatch -> ops) -> planner ->
passes -> pipeline -> backend -> api, with no import cycles, lazy imports included (docs/development.md)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"autoprec": ROOT / "autoprec", "autoprec.kernels": ROOT / "kernels", "autoprec.passes": ROOT / "passes"}
LAYERS = [  # lowest first; a module may import its own layer and the ones before it
    ("autoprec.formats", "autoprec.roles", "autoprec.model_root", "autoprec.quant_spec"),
    ("autoprec.kernels.core",),
    ("autoprec.kernels.reference",),
    ("autoprec.kernels.cpu", "autoprec.kernels.cuda"),
    ("autoprec.kernels.triton",),
    ("autoprec.kernels.dispatch",),
    ("autoprec.kernels",),
    ("autoprec.planner",),
    ("autoprec.passes",),
    ("autoprec.pipeline", "autoprec.inner_compiles", "autoprec.cache_key"),
    ("autoprec.backend",),
    ("autoprec.api",),
    ("autoprec.export",),
    ("autoprec",),
]


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found.setdefault(name, path)
    return found


def rank(module: str) -> int:
    best = None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{module} is in no layer"
    return best[0]


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """autoprec modules ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def test_imports_run_one_way():
    known = modules()
    upward = [(name, target) for name, path in known.items() for target in imports(name, path, known)
              if rank(target) > rank(name)]
    assert upward == []


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    graph = {n: {t for t in ts if not n.startswith(t + ".")} for n, ts in graph.items()}  # a package's own init
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []
