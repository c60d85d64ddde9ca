"""Every command the documentation shows must run as written.

Reads the fenced code blocks of README.md, docs/*.md and bench/README.md and checks each
command line it knows: `ansible-playbook` (the playbook exists, every -e variable is a
setting the collection reads, and ansible-playbook --syntax-check accepts the line),
`zerolayer-routectl` (the subcommand exists), `make` (the target exists) and
`.venv/bin/python bench/...` (the script exists and its --help runs).
`inventories/<fleet>` stands for the sandbox inventory.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    REPO / "README.md",
    REPO / "bench" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
# Variables a person gives on the command line that no defaults file declares.
RUN_ONLY_VARIABLES = {"drill_id", "restore_hosts", "rollback_reason", "rollback_report_path"}


def code_lines(document):
    """(document, line) for each command line of the fenced blocks, continuations joined."""
    inside, pending = False, ""
    for raw in document.read_text().splitlines():
        if raw.strip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        # A comment, or a note after a run of spaces (diagrams), is not part of the command.
        line = re.split(r"\s{2,}|\s#\s", line)[0].strip()
        if line:
            yield document, line


def commands(prefixes):
    found = []
    for document in DOCUMENTS:
        for where, line in code_lines(document):
            words = line.split()
            if words and words[0] == "sudo":
                words = words[1:]
            if words and any(words[0].endswith(prefix) for prefix in prefixes):
                found.append(pytest.param(" ".join(words), id="%s: %s" % (where.name, line)))
    return found


def known_variables():
    names = set(RUN_ONLY_VARIABLES)
    for defaults in (REPO / "roles").glob("*/defaults/main.yml"):
        names.update(yaml.safe_load(defaults.read_text()) or {})
    for defaults in (REPO / "roles").glob("*/defaults/main/*.yml"):
        names.update(yaml.safe_load(defaults.read_text()) or {})
    return names


PLAYBOOK_COMMANDS = commands(["ansible-playbook"])


def test_the_documentation_shows_commands_of_every_kind():
    # Guards the parser above: an empty parametrisation would pass silently.
    assert len(PLAYBOOK_COMMANDS) >= 5
    assert commands(["zerolayer-routectl"]) and commands(["make"])


@pytest.mark.parametrize("line", PLAYBOOK_COMMANDS)
def test_ansible_playbook_line_is_accepted(line, ansible_env):
    argv = shlex.split(line.replace("inventories/<fleet>", "inventories/sandbox"))
    playbooks = [word for word in argv if word.endswith(".yml") and not word.startswith("@")]
    assert playbooks and all((REPO / word).is_file() for word in playbooks), line
    variables = [
        argv[index + 1].split("=", 1)[0]
        for index, word in enumerate(argv[:-1])
        if word in ("-e", "--extra-vars") and not argv[index + 1].startswith(("@", "{"))
    ]
    unknown = sorted(set(variables) - known_variables())
    assert not unknown, "%s sets variables the collection does not read: %s" % (line, unknown)
    result = subprocess.run(
        [*argv, "--syntax-check"],
        cwd=REPO,
        env=ansible_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("line", commands(["zerolayer-routectl"]))
def test_routectl_subcommand_exists(line):
    sys.path.insert(0, str(REPO / ".collections"))
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_cli import build_parser

    subcommand = line.split()[1]
    parser = build_parser()
    known = set()
    for action in parser._actions:  # argparse keeps subcommands in its subparsers action
        known.update(getattr(action, "choices", None) or {})
    assert subcommand in known, (line, sorted(known))


@pytest.mark.parametrize("line", commands(["make"]))
def test_make_target_exists(line):
    target = line.split()[1] if len(line.split()) > 1 else "all"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^%s:" % re.escape(target), makefile, re.M), line


@pytest.mark.parametrize("line", commands([".venv/bin/python"]))
def test_bench_script_help_runs(line):
    script = REPO / line.split()[1]
    assert script.is_file(), line
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
