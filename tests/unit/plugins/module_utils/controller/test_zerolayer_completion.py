"""`zerolayer completion`: the bash completion made from the command's own parser, run in a
real bash with the words a person has typed so far."""

import shutil
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli

SCRIPT = rollout_cli.bash_completion(rollout_cli.build_parser())


def complete(*words):
    """What bash offers for the last of words (the first is `zerolayer`)."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.fail("bash is needed: apt-get install bash")
    quoted = " ".join("'%s'" % word for word in words)
    program = (
        '%s\nCOMP_WORDS=(%s)\nCOMP_CWORD=%d\n_zerolayer\nprintf "%%s\\n" "${COMPREPLY[@]}"\n'
        % (
            SCRIPT,
            quoted,
            len(words) - 1,
        )
    )
    done = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line]


def test_nouns_then_verbs():
    assert complete("zerolayer", "") == [
        "completion", "config", "notifications", "rollback", "rollout"]  # fmt: skip
    assert complete("zerolayer", "ro") == ["rollback", "rollout"]
    assert complete("zerolayer", "rollo") == ["rollout"]
    assert complete("zerolayer", "rollout", "st") == ["status"]
    assert "list" in complete("zerolayer", "rollout", "")
    assert complete("zerolayer", "notifications", "s") == ["set", "show"]


def test_an_option_s_value_is_not_taken_for_the_noun():
    assert complete("zerolayer", "-o", "json", "rollout", "pa") == ["pause"]
    assert complete("zerolayer", "--store-config", "f.json", "rollo") == ["rollout"]
    assert complete("zerolayer", "-i", "inv", "rollb") == ["rollback"]


def test_options_anywhere_and_nothing_after_the_verb():
    assert complete("zerolayer", "rollout", "list", "--li") == ["--limit"]
    assert "--store-config" in complete("zerolayer", "rollout", "status", "--st")
    assert complete("zerolayer", "rollout", "status", "chat") == []
    assert complete("zerolayer", "rollback", "--de") == ["--deep"]


def test_watch_redraws_only_the_lines_that_changed():
    first = ["fence epoch 2", "ROLLOUT ...", "chat-a gpu_nodes running 1/3 5 pass 40", "owner"]
    assert rollout_cli.redraw(None, first) == "\x1b[2J\x1b[H" + "\n".join(first) + "\n"
    moved = [*first[:2], "chat-a gpu_nodes running 1/3 5 pass 38", "owner"]
    assert rollout_cli.redraw(first, moved) == (
        "\x1b[3;1H\x1b[2Kchat-a gpu_nodes running 1/3 5 pass 38" + "\x1b[5;1H"
    )
    assert rollout_cli.redraw(moved, moved) == "\x1b[5;1H", "nothing changed: nothing rewritten"
    # A wave gone: its line and everything below it cleared, one line added elsewhere.
    fewer = ["fence epoch 3", "ROLLOUT ..."]
    assert (
        rollout_cli.redraw(moved, fewer) == "\x1b[1;1H\x1b[2Kfence epoch 3\x1b[3;1H\x1b[J\x1b[3;1H"
    )
    more = [*fewer, "chat-b gpu_nodes running 1/3 1 - 7200"]
    assert rollout_cli.redraw(fewer, more) == (
        "\x1b[3;1H\x1b[2Kchat-b gpu_nodes running 1/3 1 - 7200\x1b[4;1H"
    )
