"""After converge drained node-1 and side_effect undrained it: node-1 serves again as before.

Only node-1 is looked at; node-2 was its peer while it was drained.
"""

import json
import os

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(
    os.environ["MOLECULE_INVENTORY_FILE"]
).get_hosts("zl-mol-node_drain-1")

ROUTECTL = "/usr/local/sbin/zerolayer-routectl"
KEY = "sk-molecule-drain-key-0001"


def test_the_engine_runs_again(host):
    assert host.service("zerolayer-engine-chat.service").is_running


def test_the_weight_the_drain_found_is_back_with_the_engine_socket(host):
    shown = json.loads(host.check_output(ROUTECTL + " show"))
    (chat,) = [route for route in shown["routes"] if route["name"] == "chat"]
    assert chat["weight_bp"] == 10000
    assert chat["slots"], "no engine socket registered in the chat route"


def test_the_proxy_forwards_to_the_nodes_own_engine_again(host):
    config = host.file("/etc/nginx/nginx.conf").content_string
    assert "server 127.0.0.1:8101 max_fails=0;" in config
    assert "Drained" not in config


def test_the_drain_record_is_gone(host):
    assert not host.file("/var/lib/zerolayer/drain.json").exists


def test_new_connections_take_the_direct_path_again(host):
    answer = host.check_output(
        "curl -sS -k -o /dev/null -D - -H 'Authorization: Bearer %s' "
        "-H 'Content-Type: application/json' "
        '-d \'{"model": "zerolayer/sim-chat", "messages": [{"role": "user", '
        '"content": "hi"}], "max_tokens": 2}\' '
        "https://$(hostname -I | cut -d' ' -f1):8000/v1/chat/completions" % KEY
    )
    assert " 200 " in answer.splitlines()[0], answer
    assert "X-Zerolayer-Path: direct" in answer, answer
