"""Every file of this repository that the code's help and the docs name exists (a help text or a page that
cites a missing file sends a user nowhere)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMED = re.compile(r"(?<![\w/.-])((?:docs|scripts|benchmarks|deploy|native|src|tests)/[\w./{},*-]*\w)")


def _named_paths(text: str) -> set[str]:
    # a brace pattern (run{3,5}-*) or a wildcard names several files, checked by their common folder
    return {m.rstrip(".") for m in NAMED.findall(text) if "*" not in m and "<" not in m and "{" not in m}


def test_every_repository_path_the_code_and_the_docs_name_exists():
    sources = [*(ROOT / "src").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    missing = []
    for source in sources:
        for named in sorted(_named_paths(source.read_text())):
            if not (ROOT / named).exists():
                missing.append(f"{source.relative_to(ROOT)} names {named}")
    assert not missing, "\n".join(missing)
