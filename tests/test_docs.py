"""The docs' shell blocks: each is run by this file or marked illustrative (the comment line before it says
which), every `recserve` command in any of them takes the options it is shown with, and the README's first
path, from a log to a shopper's answer, runs as written (on ML-100K, one epoch, on free ports)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import typer

from recserve.cli.main import app
from recserve.processes import free_ports

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(bash|sh|shell|console)\s*$")
RUN = "<!-- run by tests/test_docs.py -->"
RUN_ELSEWHERE = re.compile(r"^<!-- run by (tests/[\w/]+\.py)( [\w ]+)? -->$")  # a block another test file runs
ILLUSTRATIVE = re.compile(r"^<!-- illustrative: .+ -->$")
OPERATORS = {"&&", "||", ";", "|", "&", ">", "<", ">>"}


def shell_blocks() -> list[tuple[str, str, list[str]]]:
    """Every shell block of the docs: where it is (file:line), the line before it, and its commands (a line
    continued with a backslash joined to the next)."""
    blocks = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for start, line in enumerate(lines):
            if not FENCE.match(line):
                continue
            end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
            commands, pending = [], ""
            for text in lines[start + 1 : end]:
                if text.rstrip().endswith("\\"):
                    pending += text.rstrip()[:-1] + " "
                    continue
                commands.append(pending + text)
                pending = ""
            before = lines[start - 1].strip() if start else ""
            blocks.append((f"{path.relative_to(ROOT)}:{start + 1}", before, commands))
    return blocks


def recserve_invocations(command: str) -> list[list[str]]:
    """The `recserve ...` calls of one shell line, each as its words (comments, pipes and redirections cut)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # a here-document's or a JSON's quotes: no recserve call to read in it
        return []
    calls, current = [], []
    for word in [*words, ";"]:
        if word in OPERATORS:
            if current and Path(current[0]).name == "recserve":
                calls.append(current[1:])
            current = []
        else:
            current.append(word)
    return calls


def _problem(words: list[str]) -> str | None:
    """Why ``recserve WORDS`` would be refused for its command or options (not for its values), or None."""
    command = typer.main.get_command(app)
    rest = list(words)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):  # a group (typer's own click)
        found = command.commands.get(rest[0])
        if found is None:
            return f"no command {rest[0]!r} (recserve {' '.join(words)})"
        command, rest = found, rest[1:]
    known = {"--help"} | {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for word in rest:
        name = word.split("=")[0]
        if name.startswith("-") and not re.fullmatch(r"-\d[\d.]*", name) and name not in known:
            return f"{command.name} has no option {name} (recserve {' '.join(words)})"
    return None


def test_every_shell_block_is_run_by_a_test_or_marked_illustrative():
    unmarked = [
        where
        for where, before, _ in shell_blocks()
        if before != RUN
        and not ILLUSTRATIVE.match(before)
        and not ((m := RUN_ELSEWHERE.match(before)) and (ROOT / m.group(1)).is_file())
    ]
    assert not unmarked, f"blocks neither run nor marked '<!-- illustrative: why -->': {unmarked}"
    assert sum(before == RUN for _, before, _ in shell_blocks()) >= 1


def test_every_recserve_command_in_the_docs_takes_the_options_it_is_shown_with():
    problems, checked = [], 0
    for where, _, commands in shell_blocks():
        for command in commands:
            for words in recserve_invocations(command):
                checked += 1
                if problem := _problem(words):
                    problems.append(f"{where}: {problem}")
    assert checked > 60 and not problems, "\n".join(problems)


def test_the_option_check_finds_a_missing_option_and_command():
    assert "repo has no option --repo" in _problem(["repo", "--repo", "runs/repo"])
    assert "no command 'serv'" in _problem(["serv", "--repo", "x"])
    assert _problem(["sagemaker", "invoke", "50", "--k", "5", "--url", "http://h:1"]) is None


def _as_run_here(command: str, ports: tuple[int, int, int]) -> str:
    """A README line as the suite runs it: one epoch, the server on free ports and asked there."""
    http, grpc, metrics = ports
    command = command.replace("--epochs 20", "--epochs 1")
    words = recserve_invocations(command)
    if words and words[0][0] == "serve":
        command = command.split("#")[0] + f" --http-port {http} --grpc-port {grpc} --metrics-port {metrics}"
    if words and words[0][0] == "recommend":
        command = command.split("#")[0] + f" --url 127.0.0.1:{grpc}"
    return command


def test_the_readmes_path_from_a_log_to_a_shoppers_answer_runs_as_written(tmp_path):
    (block,) = [commands for where, before, commands in shell_blocks() if before == RUN and where.startswith("README")]
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RECSERVE_CACHE": str(tmp_path / "cache"),  # its embedded store and the server's record, not the user's
    }
    ports = free_ports(3)
    outputs = []
    try:
        for command in block:
            if command.startswith("make setup"):
                continue  # the suite's own set-up
            run = subprocess.run(
                _as_run_here(command, ports),
                shell=True,
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            outputs.append(run.stdout)
            assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
    finally:
        subprocess.run(
            "recserve stop --all; recserve store stop", shell=True, env=env, capture_output=True, timeout=120
        )
    assert "ready: HTTP" in outputs[-2] and "detached" in outputs[-2]
    assert "shopper-1" in outputs[-1] and re.search(r"\b\d+\b", outputs[-1])
