"""`zerolayer completion`: the bash completion made from the command's own parser, run in a
real bash with the words a person has typed so far."""

import shutil
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils import rollout_cli

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
    assert complete("zerolayer", "") == ["completion", "config", "notifications", "rollout"]
    assert complete("zerolayer", "ro") == ["rollout"]
    assert complete("zerolayer", "rollout", "st") == ["status"]
    assert "list" in complete("zerolayer", "rollout", "")
    assert complete("zerolayer", "notifications", "s") == ["set", "show"]


def test_an_option_s_value_is_not_taken_for_the_noun():
    assert complete("zerolayer", "-o", "json", "rollout", "pa") == ["pause"]
    assert complete("zerolayer", "--store-config", "f.json", "ro") == ["rollout"]


def test_options_anywhere_and_nothing_after_the_verb():
    assert complete("zerolayer", "rollout", "list", "--li") == ["--limit"]
    assert "--store-config" in complete("zerolayer", "rollout", "status", "--st")
    assert complete("zerolayer", "rollout", "status", "chat") == []
