"""The base install runs every verb that needs only it, and a verb whose extra is missing says which one in
one line: the CLI run on a copy of this environment's packages without any extra's modules (as `pip install
recserve` leaves a machine), each of them really not there, not faked."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from recserve.extras import EXTRA_OF

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def base_site(tmp_path_factory) -> Path:
    """This environment's site-packages less every module an extra brings (their folders, files and
    metadata), as links."""
    site = Path(sysconfig.get_paths()["purelib"])
    out = tmp_path_factory.mktemp("base-site")
    for entry in site.iterdir():
        module = entry.name.split(".")[0].split("-")[0]
        if module in EXTRA_OF or module.lower().replace("-", "_") in EXTRA_OF or entry.suffix == ".pth":
            continue
        (out / entry.name).symlink_to(entry)
    return out


def _base(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """recserve ARGS under the base install: no site processing (so no .pth), this source and the site."""
    command = [
        sys.executable,
        "-S",
        "-c",
        "import sys; from recserve.cli.main import app; sys.argv[0] = 'recserve'; app()",
    ]
    env = {"PYTHONPATH": f"{SRC}:{site}", "PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(cwd or site)}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=600, cwd=cwd)


def test_no_extra_is_importable_in_the_base_site(base_site):
    code = f"import importlib.util as u; print(sorted(m for m in {sorted(EXTRA_OF)!r} if u.find_spec(m)))"
    found = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(base_site)}
    )
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def test_the_base_install_prepares_data_and_trains(base_site, tmp_path):
    helped = _base(base_site, "--help")
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr
    data = _base(base_site, "data", "ml-100k", "--out", str(tmp_path / "data"))
    assert data.returncode == 0, data.stdout + data.stderr
    train = [
        "train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--epochs", "1", "--hidden", "16",
        "--layers", "1", "--window", "20",
    ]  # fmt: skip
    trained = _base(base_site, *train)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    assert (tmp_path / "run" / "model.pt").is_file()


@pytest.mark.parametrize(
    ("args", "extra", "package"),
    [
        (["repo", "--run", "RUN", "--out", "REPO"], "serve", "protobuf"),
        (["recommend", "1", "2"], "serve", "tritonclient"),
        (["store", "status"], "sessions", "redis"),
        (["items", "list"], "sessions", "redis"),
        (["deploy", "k8s", "--repo", "REPO"], "deploy", "pydantic_settings"),
        (["sagemaker", "package", "--export", "X"], "sagemaker", "pydantic_settings"),
    ],
)
def test_a_verb_whose_extra_is_missing_names_it_in_one_line(base_site, tmp_path, args, extra, package):
    result = _base(base_site, *args, cwd=tmp_path)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1 and "Traceback" not in said, said
    assert f"this needs recserve's {extra} extra ({package} is not installed): pip install 'recserve[{extra}]'" in said
    assert len((result.stdout + result.stderr).strip().splitlines()) <= 2, said


def test_every_extra_named_is_one_of_pyproject_and_the_readme_says_what_it_is_for():
    import tomllib

    extras = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (SRC.parent / "README.md").read_text()
    for extra in set(EXTRA_OF.values()):
        assert extra in extras, extra
        assert f"| `{extra}` |" in readme, extra


def test_an_optional_group_names_its_extra_whichever_of_its_dependencies_is_missing():
    """A GPU machine's Python had pydantic-settings' own dependency missing (pydantic): the sagemaker and deploy
    groups then say their extra, and the other verbs run; recserve's own modules and strays are never blamed on
    an extra."""
    from recserve.extras import missing_extra

    deep = ModuleNotFoundError("No module named 'pydantic'", name="pydantic")
    assert missing_extra(deep, "sagemaker") == (
        "this needs recserve's sagemaker extra (pydantic is not installed): pip install 'recserve[sagemaker]'"
    )
    assert missing_extra(deep) is None
    assert missing_extra(ModuleNotFoundError("x", name="recserve.nothing"), "deploy") is None
