"""docs/architecture.md's layers are the imports the code has: every module of src/recserve belongs to one
layer of its table, and imports (at its top or inside a function) only the layers that its row allows, those
layers' own, the floor (the names and artifacts layers) and its own; the floor imports nothing above it."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
FLOOR = ("names", "artifacts")  # every layer may import these (artifacts only the names below it)


def _layers() -> tuple[dict[str, str], dict[str, set[str]]]:
    """From the table of docs/architecture.md: package -> layer, and layer -> the layers it names as imported."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Layers", 1)[1].split("\n\n", 2)[1]
    packages: dict[str, str] = {}
    imports: dict[str, set[str]] = {}
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:] if line.startswith("|")]
    for layer, package_cell, imports_cell in (tuple(cell.strip() for cell in row) for row in rows):
        for package in re.findall(r"`(recserve[\w.]*)`", package_cell):
            packages[package] = layer
        named = re.sub(r"\([^)]*\)", "", imports_cell)  # "export (reading only)" names export
        imports[layer] = {word.strip() for word in named.split(",") if word.strip() and word.strip() != "nothing"}
    return packages, imports


def _layer_of(module: str, packages: dict[str, str]) -> str | None:
    matches = [p for p in packages if module == p or module.startswith(p + ".")]
    return packages[max(matches, key=len)] if matches else None


def _allowed(layer: str, imports: dict[str, set[str]]) -> set[str] | None:
    """The layers ``layer`` may import: those its row names and theirs in turn, the floor, its own."""
    floor = FLOOR[: FLOOR.index(layer)] if layer in FLOOR else FLOOR
    seen, todo = {layer, *floor}, list(imports.get(layer, ()))
    while todo:
        named = todo.pop()
        if named == "all":
            return None
        if named not in seen:
            seen.add(named)
            todo.extend(imports.get(named, ()))
    return seen


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("recserve"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("recserve"))
    return found


def test_every_module_belongs_to_a_layer_of_the_map_and_imports_only_what_its_layer_may():
    packages, imports = _layers()
    unmapped, crossing = [], []
    for path in sorted((SRC / "recserve").rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        if module == "recserve":
            continue
        layer = _layer_of(module, packages)
        if layer is None:
            unmapped.append(module)
            continue
        allowed = _allowed(layer, imports)
        if allowed is None:
            continue
        for target in _imported(path):
            target_layer = _layer_of(target, packages)
            if target_layer is not None and target_layer not in allowed and target_layer != layer:
                crossing.append(f"{module} ({layer}) imports {target} ({target_layer})")
    assert not unmapped, f"modules in no layer of docs/architecture.md: {unmapped}"
    assert not crossing, "imports that the layers of docs/architecture.md do not allow:\n" + "\n".join(crossing)


def _contract_table() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Where each contract is defined") :]
    return section[: section.index("\n## ", 5)]


def test_the_contract_tables_names_resolve_and_every_artifact_module_has_its_row():
    """Every dotted name the table gives under a recserve module resolves (a renamed or moved function fails
    here), and each module of the floor of artifacts is named in it."""
    import importlib
    import pkgutil

    import recserve

    table = _contract_table()
    top = {module.name for module in pkgutil.iter_modules(recserve.__path__)}
    unresolved = []
    for token in re.findall(r"`([A-Za-z_][\w.]*)`", table):
        parts = token.split(".")
        if parts[0] not in top or len(parts) < 2 or parts[-1] in FILE_SUFFIXES:
            continue
        for cut in range(len(parts), 0, -1):
            try:
                found = importlib.import_module("recserve." + ".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        for name in parts[cut:]:
            found = getattr(found, name, None)
        if found is None:
            unresolved.append(token)
    assert not unresolved, f"docs/architecture.md names what the code no longer has: {unresolved}"
    artifacts = ROOT / "src" / "recserve" / "artifacts"
    missing = [p.stem for p in artifacts.glob("*.py") if p.stem != "__init__" and f"artifacts.{p.stem}" not in table]
    assert not missing, f"artifact modules without a row in docs/architecture.md: {missing}"


FILE_SUFFIXES = ("json", "npy", "npz", "pt", "parquet", "pbtxt", "md", "png", "onnx", "yml", "yaml", "sh", "cc")


def test_no_verb_imports_another_verbs_module():
    """A verb's module (each module `recserve.cli.main` registers, and the optional groups) imports what verbs
    share (console, options, store_access, metrics_report, ...), never another verb: a group's own parts
    (sagemaker_*) are the group's."""
    cli = SRC / "recserve" / "cli"
    verbs = {m.removeprefix("recserve.cli.") for m in _imported(cli / "main.py") if m.count(".") == 2}
    verbs |= {"sagemaker", "deploy"}
    shared = {"console", "options", "env"}  # main.py's own helpers: the console, the version
    verbs -= shared
    found = []
    for name in sorted(verbs):
        for module in sorted(_imported(cli / f"{name}.py")):
            other = module.removeprefix("recserve.cli.")
            if module.startswith("recserve.cli.") and other in verbs and other != name:
                found.append(f"cli/{name}.py imports the verb {other}")
            if other.startswith("sagemaker_") and name != "sagemaker":
                found.append(f"cli/{name}.py imports the sagemaker group's part {other}")
    assert len(verbs) >= 15 and "events" in verbs and "store" in verbs
    assert not found, found
