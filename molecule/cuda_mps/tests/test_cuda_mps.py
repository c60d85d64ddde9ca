"""Verify the cuda_mps role on a GPU-less sandbox node.

nvidia-cuda-mps-control and nvidia-smi on the node are TEST DOUBLES (see ../doubles): they
record what they were asked into JSON-lines files, which these tests read. Everything
else (systemd, the unit, directories, environment files) is real.
"""

import json

import pytest

BASE = "/var/lib/zerolayer/mps"
ENV_DIR = "/etc/zerolayer/mps"
UNIT = "/etc/systemd/system/zerolayer-mps@.service"
MPS_RECORD = "/var/log/zerolayer-test-doubles/nvidia-cuda-mps-control.jsonl"
SMI_RECORD = "/var/log/zerolayer-test-doubles/nvidia-smi.jsonl"
SMI_STATE = "/var/lib/zerolayer-test-doubles/nvidia-smi-state.json"
VOLATILE_FSTYPES = {"tmpfs", "ramfs", "devtmpfs"}

INSTANCES = {
    "engine-a": {"gpus": ["0"], "client_devices": "0", "limit": "40G", "threads": "50"},
    "engine-b": {
        "gpus": ["GPU-4c1e9a52-7d0b-4f3e-9a61-2b8d5e0f7c13"],
        "client_devices": "GPU-4c1e9a52-7d0b-4f3e-9a61-2b8d5e0f7c13",
        "limit": "20480M",
        "threads": "25",
    },
    # One daemon over a GPU set: its server renumbers GPUs 2 and 3 as devices 0 and 1.
    "engine-c": {"gpus": ["2", "3"], "client_devices": "0,1", "limit": "30G", "threads": "75"},
}


def read_jsonl(host, path):
    content = host.file(path).content_string
    return [json.loads(line) for line in content.splitlines() if line.strip()]


def env_file(host, path):
    values = {}
    for line in host.file(path).content_string.splitlines():
        if line and not line.startswith("#"):
            key, _equals, value = line.partition("=")
            values[key] = value
    return values


def wait_for_active(host, unit):
    # systemctl blocks until the start job finished (ExecStartPost included).
    host.run_expect([0], "systemctl start %s" % unit)
    assert host.service(unit).is_running


def test_unit_template_is_installed(host):
    unit = host.file(UNIT)
    assert unit.is_file
    assert unit.user == "root"
    assert unit.mode == 0o644
    assert "ExecStop=/usr/local/libexec/zerolayer/mps-control-send quit" in unit.content_string


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_systemd_analyze_verify_is_clean(host, name):
    result = host.run("systemd-analyze verify zerolayer-mps@%s.service" % name)
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == ""
    assert result.stderr.strip() == ""


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_directories_on_persistent_disk(host, name):
    for leaf, mode in (("pipe", 0o755), ("log", 0o750)):
        directory = host.file("%s/%s/%s" % (BASE, name, leaf))
        assert directory.is_directory
        assert directory.user == "root"
        assert directory.mode == mode
        fstype = host.check_output("findmnt -n -o FSTYPE --target %s" % directory.path)
        assert fstype not in VOLATILE_FSTYPES


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_engine_env_file(host, name):
    path = "%s/%s.env" % (ENV_DIR, name)
    assert host.file(path).mode == 0o644
    assert env_file(host, path) == {
        "CUDA_MPS_PIPE_DIRECTORY": "%s/%s/pipe" % (BASE, name),
        "CUDA_MPS_LOG_DIRECTORY": "%s/%s/log" % (BASE, name),
        "CUDA_VISIBLE_DEVICES": INSTANCES[name]["client_devices"],
        # Indexes mean what nvidia-smi means by them (PCI bus order), not CUDA's fastest first.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_instance_is_enabled_and_running(host, name):
    service = host.service("zerolayer-mps@%s.service" % name)
    assert service.is_enabled
    assert service.is_running
    main_pid = host.check_output("systemctl show -P MainPID zerolayer-mps@%s.service" % name)
    pid_file = host.file("%s/%s/pipe/nvidia-cuda-mps-control.pid" % (BASE, name)).content_string
    assert main_pid == pid_file.strip()
    assert host.file("%s/%s/pipe/control" % (BASE, name)).is_pipe


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_daemon_started_with_its_gpu_only(host, name):
    pipe_dir = "%s/%s/pipe" % (BASE, name)
    events = read_jsonl(host, MPS_RECORD)
    starts = [e for e in events if e["event"] == "start" and e["pipe_dir"] == pipe_dir]
    assert starts, "the control daemon of %s never started" % name
    assert starts[-1]["cuda_visible_devices"] == ",".join(INSTANCES[name]["gpus"])
    assert starts[-1]["log_dir"] == "%s/%s/log" % (BASE, name)


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_limits_sent_through_control_interface(host, name):
    pipe_dir = "%s/%s/pipe" % (BASE, name)
    events = [e for e in read_jsonl(host, MPS_RECORD) if e["pipe_dir"] == pipe_dir]
    last_start = max(i for i, e in enumerate(events) if e["event"] == "start")
    commands = [e for e in events[last_start:] if e["event"] == "command"]
    # The memory limit once per device the server sees, then the thread share.
    devices = range(len(INSTANCES[name]["gpus"]))
    assert [(c["command"], c["accepted"]) for c in commands] == [
        *[
            ("set_default_device_pinned_mem_limit %d %s" % (d, INSTANCES[name]["limit"]), True)
            for d in devices
        ],
        ("set_default_active_thread_percentage %s" % INSTANCES[name]["threads"], True),
    ]


def test_gpus_in_exclusive_process_mode(host):
    state = json.loads(host.file(SMI_STATE).content_string)
    modes = [gpu["compute_mode"] for gpu in state["gpus"]]
    assert modes == ["Exclusive_Process"] * 4
    set_calls = [c["argv"] for c in read_jsonl(host, SMI_RECORD) if "-c" in c["argv"]]
    for name, instance in INSTANCES.items():
        for gpu in instance["gpus"]:
            assert ["-i", gpu, "-c", "EXCLUSIVE_PROCESS"] in set_calls, (name, gpu)


def test_compute_mode_set_once_by_ansible(host):
    # The role queries first and sets only when needed; the unit's ExecStartPre sets it on
    # every start. So the ansible-side query must precede the first set for each GPU.
    calls = [c["argv"] for c in read_jsonl(host, SMI_RECORD)]
    for gpu in [gpu for instance in INSTANCES.values() for gpu in instance["gpus"]]:
        query = ["-i", gpu, "--query-gpu=compute_mode", "--format=csv,noheader"]
        assert query in calls
        assert calls.index(query) < calls.index(["-i", gpu, "-c", "EXCLUSIVE_PROCESS"])


def test_stop_sends_quit_and_start_reapplies_limits(host):
    unit = "zerolayer-mps@engine-b.service"
    pipe_dir = "%s/engine-b/pipe" % BASE
    before = len(read_jsonl(host, MPS_RECORD))
    try:
        host.run_expect([0], "systemctl stop %s" % unit)
        assert not host.service(unit).is_running
        assert host.run("systemctl is-failed %s" % unit).stdout.strip() == "inactive"
        events = [e for e in read_jsonl(host, MPS_RECORD)[before:] if e["pipe_dir"] == pipe_dir]
        assert ("command", "quit") in [(e["event"], e.get("command")) for e in events]
        assert {"event": "exit", "reason": "quit"}.items() <= events[-1].items()
        signals = [e for e in events if e["event"] == "signal"]
        assert not signals, "the daemon was killed, not asked to quit"
        assert not host.file("%s/control" % pipe_dir).exists
    finally:
        wait_for_active(host, unit)
    events = [e for e in read_jsonl(host, MPS_RECORD)[before:] if e["pipe_dir"] == pipe_dir]
    commands = [e["command"] for e in events if e["event"] == "command"]
    assert commands[-2:] == [
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_active_thread_percentage 25",
    ]


def test_daemon_restarts_after_a_crash(host):
    unit = "zerolayer-mps@engine-a.service"
    old_pid = host.check_output("systemctl show -P MainPID %s" % unit)
    host.run_expect([0], "kill -KILL %s" % old_pid)
    # Restart=on-failure brings it back after RestartSec; wait for systemd's own job.
    wait = "timeout 60 sh -c 'until systemctl is-active -q %s; do sleep 1; done'" % unit
    host.run_expect([0], wait)
    new_pid = host.check_output("systemctl show -P MainPID %s" % unit)
    assert new_pid not in ("0", old_pid)
