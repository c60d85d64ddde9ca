"""Verify the model_engine role on a sandbox node, against real systemd, cgroups and sockets.

chat_sim is the CPU engine simulator (a test double for a GPU engine) and runs for real,
joined to its CUDA MPS instance zerolayer-mps@chat_sim, whose control daemon is the cuda_mps
scenario's TEST DOUBLE of nvidia-cuda-mps-control. llama_vllm, embed_triton and plain_vllm
need a GPU: their units are rendered and loaded by systemd (state: present) and checked as
systemd parsed them, never started.
The router's registration command is a recording TEST DOUBLE (see ../doubles).
"""

import json
import shlex
import time

import pytest

KEY = "sk-molecule-engine-key-0001"
SIM = "zerolayer-engine-chat_sim"
SIM_PORT = 8101
ADMIN_FILE = "/etc/zerolayer/engines/chat_sim/sim-admin.json"
SECRETS = "/etc/zerolayer/engine-secrets"
REGISTER_LOG = "/run/zerolayer-register-engine-double.log"
UNAUTHORIZED = '{"error":"Unauthorized"}'
RESTART_DEADLINE_S = 120
MPS_DIR = "/var/lib/zerolayer/mps"


def unit_properties(host, unit, *names):
    result = host.run("systemctl show --property=%s %s", ",".join(names), unit)
    assert result.rc == 0, result.stderr
    props = {}
    for line in result.stdout.splitlines():
        name, _sep, value = line.partition("=")
        # Commands such as ExecStartPost come once per command line.
        props[name] = props[name] + "\n" + value if name in props else value
    return props


def curl(host, path, *options, key=KEY, port=SIM_PORT):
    """Status line, headers and body of a request made inside the node."""
    argv = ["curl", "-sS", "-i", "--max-time", "60"]
    if key is not None:
        argv += ["-H", "Authorization: Bearer " + key]
    argv += [*options, "http://127.0.0.1:%d%s" % (port, path)]
    result = host.run(" ".join(shlex.quote(part) for part in argv))
    assert result.rc == 0, result.stderr
    head, _sep, body = result.stdout.replace("\r\n", "\n").partition("\n\n")
    lines = head.splitlines()
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _sep, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def chat(host, stream=False, key=KEY, port=SIM_PORT):
    body = json.dumps(
        {
            "model": "zerolayer/sim-chat-8b",
            "stream": stream,
            "messages": [{"role": "user", "content": "hello from molecule"}],
        }
    )
    return curl(
        host,
        "/v1/chat/completions",
        "-N",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
        key=key,
        port=port,
    )


@pytest.fixture
def restore_admin_file(host):
    original = host.file(ADMIN_FILE).content_string
    try:
        yield
    finally:
        host.run(
            "printf '%%s' %s > %s.tmp && mv %s.tmp %s", original, ADMIN_FILE, ADMIN_FILE, ADMIN_FILE
        )


def write_admin_file(host, settings):
    # Written then renamed, as a drill tool should, so the engine never reads half a file.
    result = host.run(
        "printf '%%s' %s > %s.tmp && mv %s.tmp %s",
        json.dumps(settings),
        ADMIN_FILE,
        ADMIN_FILE,
        ADMIN_FILE,
    )
    assert result.rc == 0, result.stderr


# -- slice and unit -------------------------------------------------------------------


def test_slice_carries_the_hardware_profile(host):
    props = unit_properties(
        host, SIM + ".slice", "MemoryMax", "CPUQuotaPerSecUSec", "IOWeight", "ActiveState"
    )
    assert props["MemoryMax"] == str(256 * 1024 * 1024)
    assert props["CPUQuotaPerSecUSec"] == "500ms"
    assert props["IOWeight"] == "200"
    assert props["ActiveState"] == "active"


def test_simulator_unit_runs_in_its_slice(host):
    props = unit_properties(
        host,
        SIM + ".service",
        "Slice",
        "ActiveState",
        "SubState",
        "Restart",
        "User",
        "Type",
        "UnitFileState",
        "Description",
    )
    assert props["Slice"] == SIM + ".slice"
    assert (props["ActiveState"], props["SubState"]) == ("active", "running")
    assert props["Restart"] == "on-failure"
    assert props["User"] == "zerolayer-engine"
    assert props["Type"] == "notify"
    assert props["UnitFileState"] == "enabled"
    assert "simulator" in props["Description"]


def test_unit_hardening_and_limits_take_effect(host):
    """systemd must parse what the templates write: a setting glued to the previous line
    is dropped with only a warning in the journal."""
    for engine in ("chat_sim", "llama_vllm", "plain_vllm"):
        props = unit_properties(
            host, "zerolayer-engine-%s.service" % engine, "LimitNOFILE", "NoNewPrivileges"
        )
        assert props == {"LimitNOFILE": "16384", "NoNewPrivileges": "yes"}, (engine, props)
    triton = unit_properties(host, "zerolayer-engine-embed_triton.service", "LimitNOFILE")
    assert triton["LimitNOFILE"] == "16384"


def cgroup_layout(host):
    return "v2" if host.file("/sys/fs/cgroup/cgroup.controllers").exists else "v1"


def test_slice_limits_reach_the_kernel(host):
    """What systemd reports must also be what the kernel enforces for the engine process.

    On a cgroup v2 host that is memory.max / cpu.max of the slice. This sandbox runs on a
    hybrid (v1 + v2) host, where the controllers live in the v1 hierarchies: the limits
    are memory.limit_in_bytes and cpu.cfs_quota_us of the slice there.
    """
    slice_cgroup = unit_properties(host, SIM + ".slice", "ControlGroup")["ControlGroup"]
    main_pid = unit_properties(host, SIM + ".service", "MainPID")["MainPID"]
    membership = host.file("/proc/%s/cgroup" % main_pid).content_string
    if cgroup_layout(host) == "v2":
        assert "0::%s/" % slice_cgroup in membership
        base = "/sys/fs/cgroup" + slice_cgroup
        assert host.file(base + "/memory.max").content_string.strip() == str(256 * 1024 * 1024)
        assert host.file(base + "/cpu.max").content_string.split()[0] == "50000"
        return
    by_controller = {}
    for line in membership.splitlines():
        _hierarchy, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            by_controller[controller] = path
    for controller in ("memory", "cpu"):
        path = by_controller[controller]
        assert path == slice_cgroup or path.startswith(slice_cgroup + "/"), (controller, path)
    memory_limit = host.file("/sys/fs/cgroup/memory%s/memory.limit_in_bytes" % slice_cgroup)
    assert memory_limit.content_string.strip() == str(256 * 1024 * 1024)
    cpu = "/sys/fs/cgroup/cpu%s/" % slice_cgroup
    assert host.file(cpu + "cpu.cfs_quota_us").content_string.strip() == "50000"
    assert host.file(cpu + "cpu.cfs_period_us").content_string.strip() == "100000"


def test_io_weight_reaches_systemd_and_the_kernel_where_it_can(host):
    """IOWeight 200 (the default is 100) must reach the slice's unit and its weight file.

    On cgroup v2 that is io.weight. On a hybrid host it is the v1 blkio.bfq.weight, which
    exists only where the kernel has the BFQ scheduler, and which the kernel applies only
    to devices using it (on the test machines' devices, scheduler "none", it has no effect:
    this test claims no more). A kernel built without BFQ has no file to write: there the
    setting reaches systemd only, which is all this test then claims.
    """
    properties = unit_properties(host, SIM + ".slice", "ControlGroup", "IOWeight")
    assert properties["IOWeight"] == "200", properties
    slice_cgroup = properties["ControlGroup"]
    if cgroup_layout(host) == "v2":
        weight = host.file("/sys/fs/cgroup%s/io.weight" % slice_cgroup)
        assert weight.content_string.split()[1] == "200"
        return
    assert host.file("/sys/fs/cgroup/blkio%s" % slice_cgroup).is_directory
    if not host.file("/sys/fs/cgroup/blkio/blkio.bfq.weight").exists:
        return  # no BFQ in this kernel: no weight file anywhere in the blkio hierarchy
    weight = host.file("/sys/fs/cgroup/blkio%s/blkio.bfq.weight" % slice_cgroup)
    assert weight.exists, "the kernel has BFQ but the slice got no weight file"
    # systemd scales IOWeight onto BFQ's range, whose default is also 100.
    assert int(weight.content_string.split()[-1]) > 100


def test_engine_listens_on_its_own_port(host):
    assert host.socket("tcp://0.0.0.0:%d" % SIM_PORT).is_listening
    owner = host.run("ss -Hltnp 'sport = :%d'" % SIM_PORT).stdout
    main_pid = unit_properties(host, SIM + ".service", "MainPID")["MainPID"]
    assert "pid=%s," % main_pid in owner


def test_secrets_are_private_to_the_engine_account(host):
    directory = host.file(SECRETS)
    assert (directory.user, directory.mode) == ("zerolayer-engine", 0o700)
    keys = host.file(SECRETS + "/api-keys")
    assert (keys.user, keys.mode) == ("zerolayer-engine", 0o600)
    assert keys.content_string.split() == [KEY]
    assert not host.file(SECRETS + "/tls.key").exists


# -- behaviour of the running simulator ---------------------------------------------------


def test_completion_with_a_valid_key(host):
    status, headers, body = chat(host)
    assert status == 200
    assert headers["x-zerolayer-engine"] == "simulator"
    assert headers["x-zerolayer-path"] == "direct"
    reply = json.loads(body)
    assert reply["model"] == "zerolayer/sim-chat-8b"
    assert "simulator" in reply["system_fingerprint"]
    assert reply["usage"]["completion_tokens"] == 8


def test_streaming_completion_ends_with_done(host):
    status, headers, body = chat(host, stream=True)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in body.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        json.loads(event)["choices"][0]["delta"].get("content", "") for event in events[:-1]
    )
    assert len(text.split()) == 8


@pytest.mark.parametrize("key", [None, "sk-molecule-engine-key-9999"])
def test_missing_or_wrong_key_gets_401(host, key):
    status, _headers, body = chat(host, key=key)
    assert status == 401
    assert body == UNAUTHORIZED


def test_metrics_carry_vllm_names_behind_the_key(host):
    chat(host)
    assert curl(host, "/metrics", key=None)[:3:2] == (401, UNAUTHORIZED)
    status, _headers, body = curl(host, "/metrics")
    assert status == 200
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:num_requests_running",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "zerolayer_sim_errors_total",
    ):
        assert name in body, name


def test_error_injection_switched_on_at_run_time(host, restore_admin_file):
    assert chat(host)[0] == 200
    pid_before = unit_properties(host, SIM + ".service", "MainPID")["MainPID"]
    write_admin_file(host, {"error_rate": 1.0, "error_status": 503})
    status, _headers, body = chat(host)
    assert status == 503
    assert "injected" in json.loads(body)["message"]
    write_admin_file(host, {"error_rate": 0.0})
    assert chat(host)[0] == 200
    # Faults switched without a restart.
    assert unit_properties(host, SIM + ".service", "MainPID")["MainPID"] == pid_before


def test_router_hook_ran_as_root_once_the_port_listened(host):
    log = host.file(REGISTER_LOG).content_string.splitlines()
    assert log, "the registration hook never ran"
    assert all(
        line == "args=chat 0 %d %s.service uid=0 listening=yes" % (SIM_PORT, SIM) for line in log
    ), log


def test_killed_engine_is_restarted_and_registered_again(host):
    before = unit_properties(host, SIM + ".service", "MainPID", "NRestarts")
    registrations = len(host.file(REGISTER_LOG).content_string.splitlines())
    assert host.run("systemctl kill --signal=SIGKILL %s.service" % SIM).rc == 0
    deadline = time.monotonic() + RESTART_DEADLINE_S
    while True:
        now = unit_properties(host, SIM + ".service", "MainPID", "NRestarts", "ActiveState")
        if now["ActiveState"] == "active" and now["MainPID"] not in ("0", before["MainPID"]):
            break
        assert time.monotonic() < deadline, "engine not restarted: %s" % now
        time.sleep(0.5)
    assert int(now["NRestarts"]) == int(before["NRestarts"]) + 1
    assert chat(host)[0] == 200
    assert len(host.file(REGISTER_LOG).content_string.splitlines()) == registrations + 1


# -- GPU engines: rendered and loaded, never started here ---------------------------------


def exec_start(host, unit):
    return unit_properties(host, unit, "ExecStart")["ExecStart"]


def test_vllm_unit_maps_the_spec_to_flags(host):
    unit = "zerolayer-engine-llama_vllm.service"
    props = unit_properties(
        host,
        unit,
        "LoadState",
        "ActiveState",
        "UnitFileState",
        "Slice",
        "Environment",
        "EnvironmentFiles",
        "User",
        "TimeoutStartUSec",
    )
    assert props["LoadState"] == "loaded"
    assert props["ActiveState"] == "inactive"
    assert props["UnitFileState"] == "disabled"
    assert props["Slice"] == "zerolayer-engine-llama_vllm.slice"
    assert props["User"] == "zerolayer-engine"
    assert props["TimeoutStartUSec"] == "30min"
    environment = props["Environment"].split()
    assert "VLLM_NO_USAGE_STATS=1" in environment
    # The weights were in place before the unit: the engine never downloads.
    assert "HF_HUB_OFFLINE=1" in environment
    # GPU indexes mean nvidia-smi's (PCI bus) order; the GPUs themselves and the MPS pipe
    # come from the instance's file, not from Environment=.
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in environment
    assert not [p for p in environment if p.startswith("CUDA_VISIBLE_DEVICES=")], environment
    assert "PYTHONPATH=/usr/local/lib/zerolayer" in environment
    assert "ZEROLAYER_ENGINE_PORT=8201" in environment
    # GPU engines size their memory by --gpu-memory-utilization, not the CPU profile's KV space.
    assert not [p for p in environment if p.startswith("VLLM_CPU_KVCACHE_SPACE=")], environment
    assert "/etc/zerolayer/engines/llama_vllm/engine.env" in props["EnvironmentFiles"]
    assert "/etc/zerolayer/mps/llama_vllm.env" in props["EnvironmentFiles"]
    argv = exec_start(host, unit)
    # The local model directory, served under the model's name, over the engine's two GPUs.
    assert (
        "/opt/zerolayer/engines/llama_vllm/venv/bin/vllm serve /srv/models/llama-tiny "
        "--served-model-name meta-llama/Llama-3.1-8B-Instruct " in argv
    )
    for flag in (
        "--tensor-parallel-size 2 ",
        # Only the service's API paths answer (files/zerolayer_vllm_paths.py).
        "--middleware zerolayer_vllm_paths.ServedPathsOnly",
        "--port 8201",
        "--max-num-seqs 128",
        "--max-model-len 8192",
        "--quantization fp8",
        "--host 0.0.0.0",
        "--gpu-memory-utilization 0.85",
        "--disable-fastapi-docs",
    ):
        assert flag in argv, flag
    # One key travels in VLLM_API_KEY (test_api_key_never_reaches_an_engine_command_line
    # reads the started process); no TLS in this scenario.
    assert "--api-key" not in argv and "--ssl-keyfile" not in argv


def test_vllm_key_file_is_root_only(host):
    env = host.file("/etc/zerolayer/engines/llama_vllm/engine.env")
    assert (env.user, env.mode) == ("root", 0o600)
    with host.sudo():
        assert "VLLM_API_KEY=" + KEY in env.content_string


def test_vllm_slice_and_start_gate(host):
    props = unit_properties(
        host, "zerolayer-engine-llama_vllm.slice", "MemoryMax", "CPUQuotaPerSecUSec", "IOWeight"
    )
    assert props == {"MemoryMax": str(64 * 1024**3), "CPUQuotaPerSecUSec": "8s", "IOWeight": "100"}
    post = unit_properties(host, "zerolayer-engine-llama_vllm.service", "ExecStartPost")[
        "ExecStartPost"
    ]
    assert "zerolayer_wait_port.py 8201" in post
    assert "zerolayer-register-engine chat 1 8201 zerolayer-engine-llama_vllm.service" in post


def test_triton_unit_runs_the_container_with_the_gpu(host):
    unit = "zerolayer-engine-embed_triton.service"
    props = unit_properties(host, unit, "LoadState", "ActiveState", "Slice", "Type")
    assert (props["LoadState"], props["ActiveState"]) == ("loaded", "inactive")
    assert props["Slice"] == "zerolayer-engine-embed_triton.slice"
    assert props["Type"] == "notify"
    argv = exec_start(host, unit)
    for part in (
        "/usr/bin/podman run",
        "--device nvidia.com/gpu=1",
        "--network host",
        "--cgroups=split",
        "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        "--http-port=8301",
        "--http-restricted-api=${ZEROLAYER_TRITON_RESTRICTED_API}",
        # Its MPS instance: the pipe and log directories, and the variables to reach them.
        "--volume {0}/pipe:{0}/pipe".format(MPS_DIR + "/embed_triton"),
        "--volume {0}/log:{0}/log".format(MPS_DIR + "/embed_triton"),
        "--env-file /etc/zerolayer/mps/embed_triton.env",
    ):
        assert part in argv, part
    deps = unit_properties(host, unit, "Requires", "After")
    assert "zerolayer-mps@embed_triton.service" in deps["Requires"].split()
    assert "zerolayer-mps@embed_triton.service" in deps["After"].split()
    io_weight = unit_properties(host, "zerolayer-engine-embed_triton.slice", "IOWeight")
    assert io_weight["IOWeight"] == "50"


def test_vllm_outside_mps_names_its_gpu_set(host):
    unit = "zerolayer-engine-plain_vllm.service"
    props = unit_properties(host, unit, "Environment", "EnvironmentFiles", "Requires")
    environment = props["Environment"].split()
    assert "CUDA_VISIBLE_DEVICES=3,5" in environment
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in environment
    assert "HF_HUB_OFFLINE=1" in environment
    assert "/etc/zerolayer/mps/" not in props["EnvironmentFiles"]
    assert "zerolayer-mps@" not in props["Requires"]
    argv = exec_start(host, unit)
    assert "--gpu-memory-utilization 0.9 " in argv
    assert "--tensor-parallel-size 2 " in argv
    assert (
        "vllm serve /var/lib/zerolayer/engines/plain_vllm/weights "
        "--served-model-name Qwen/Qwen2.5-0.5B-Instruct " in argv
    )


# -- weights: fetched by a task before the unit, never by the engine ------------------------

HF_TOKEN = "hf_moleculeThrowawayToken0001"  # noqa: S105 - the scenario's throwaway token
DOWNLOAD_LOG = "/var/lib/zerolayer/engines/plain_vllm/hf-download-double.log"
PLAIN_WEIGHTS = "/var/lib/zerolayer/engines/plain_vllm/weights"


def test_huggingface_token_is_a_private_file_of_the_engine_account(host):
    token = host.file(SECRETS + "/huggingface-token")
    assert (token.user, token.group, token.mode) == ("zerolayer-engine", "zerolayer-engine", 0o600)
    with host.sudo():
        assert token.content_string.strip() == HF_TOKEN
    # Only the downloads read it: no engine unit names it.
    for engine in ("llama_vllm", "plain_vllm"):
        unit = host.file("/etc/systemd/system/zerolayer-engine-%s.service" % engine)
        assert "huggingface-token" not in unit.content_string
        assert HF_TOKEN not in unit.content_string


def test_mirror_download_ran_once_as_the_engine_account_with_the_token_file(host):
    """The download (a TEST DOUBLE of the venv's python) ran before the unit existed, as
    the engine account, against the mirror, with the token by file, once across converge
    and idempotence."""
    lines = host.file(DOWNLOAD_LOG).content_string.splitlines()
    uid = host.user("zerolayer-engine").uid
    assert lines == [
        "repo=Qwen/Qwen2.5-0.5B-Instruct revision=v1 local_dir=%s uid=%d"
        " hf_endpoint=http://hf-mirror.invalid hf_token_path=%s/huggingface-token"
        " token_readable=yes hf_hub_offline=" % (PLAIN_WEIGHTS, uid, SECRETS)
    ]
    assert HF_TOKEN not in host.file(DOWNLOAD_LOG).content_string
    weights = host.file(PLAIN_WEIGHTS + "/config.json")
    assert weights.user == "zerolayer-engine"
    unit = host.file("/etc/systemd/system/zerolayer-engine-plain_vllm.service")
    assert weights.mtime <= unit.mtime, "the unit was written before the weights were there"
    marker = host.file(PLAIN_WEIGHTS + "/.zerolayer-model-source").content_string
    assert json.loads(marker) == {
        "kind": "mirror",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "revision": "v1",
        "url": "http://hf-mirror.invalid",
    }


def test_multi_gpu_engine_joins_one_mps_instance_over_its_set(host):
    env = host.file("/etc/zerolayer/mps/llama_vllm.env").content_string.splitlines()
    # The MPS server renumbers GPUs 0 and 4 as devices 0 and 1.
    assert "CUDA_VISIBLE_DEVICES=0,1" in env
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env
    daemon_env = host.file("/etc/zerolayer/mps/llama_vllm.daemon.env").content_string.splitlines()
    assert "CUDA_VISIBLE_DEVICES=0,4" in daemon_env
    assert unit_properties(host, "zerolayer-mps@llama_vllm.service", "ActiveState") == {
        "ActiveState": "active"
    }
    state = json.loads(
        host.file("/var/lib/zerolayer-test-doubles/nvidia-smi-state.json").content_string
    )
    modes = {gpu["index"]: gpu["compute_mode"] for gpu in state["gpus"]}
    assert modes[0] == modes[4] == "Exclusive_Process"
    assert modes[3] == modes[5] == "Default"


def test_vllm_joins_its_mps_instance(host):
    props = unit_properties(
        host, "zerolayer-engine-llama_vllm.service", "Requires", "After", "EnvironmentFiles"
    )
    assert "zerolayer-mps@llama_vllm.service" in props["Requires"].split()
    assert "zerolayer-mps@llama_vllm.service" in props["After"].split()
    # The instance's file comes after the engine's own: it has the last word on CUDA_*.
    files = [line.split()[0] for line in props["EnvironmentFiles"].splitlines()]
    assert files == [
        "/etc/zerolayer/engines/llama_vllm/engine.env",
        "/etc/zerolayer/mps/llama_vllm.env",
    ]


# Executables that cannot exist on these nodes: vLLM's venv is never installed here, and
# podman-in-podman is not; systemd-analyze names them and must find nothing else.
ABSENT_EXECUTABLES = (
    "/opt/zerolayer/engines/llama_vllm/venv/bin/vllm",
    "/opt/zerolayer/engines/plain_vllm/venv/bin/vllm",
    "/usr/bin/podman",
)


@pytest.mark.parametrize("engine", ["chat_sim", "llama_vllm", "embed_triton", "plain_vllm"])
def test_engine_unit_passes_systemd_analyze_verify(host, engine):
    unit = "/etc/systemd/system/zerolayer-engine-%s.service" % engine
    result = host.run("systemd-analyze verify %s", unit)
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip()
        and not any("Command %s is not executable" % path in line for path in ABSENT_EXECUTABLES)
    ]
    assert complaints == [], complaints
    if engine == "chat_sim":
        assert result.rc == 0, result.stderr


def sim_environment(host):
    main_pid = unit_properties(host, SIM + ".service", "MainPID")["MainPID"]
    with host.sudo():
        raw = host.run("cat /proc/%s/environ", main_pid).stdout
    return dict(pair.split("=", 1) for pair in raw.split("\0") if "=" in pair)


def test_simulator_runs_inside_its_mps_instance(host):
    props = unit_properties(host, SIM + ".service", "Requires", "After", "EnvironmentFiles")
    assert "zerolayer-mps@chat_sim.service" in props["Requires"].split()
    assert "zerolayer-mps@chat_sim.service" in props["After"].split()
    assert "/etc/zerolayer/mps/chat_sim.env" in props["EnvironmentFiles"]
    daemon = unit_properties(host, "zerolayer-mps@chat_sim.service", "ActiveState")
    assert daemon["ActiveState"] == "active"
    environment = sim_environment(host)
    assert environment["CUDA_MPS_PIPE_DIRECTORY"] == "/var/lib/zerolayer/mps/chat_sim/pipe"
    assert environment["CUDA_MPS_LOG_DIRECTORY"] == "/var/lib/zerolayer/mps/chat_sim/log"
    # The MPS server numbers its one GPU 0: the engine names device 0, not GPU 2.
    assert environment["CUDA_VISIBLE_DEVICES"] == "0"
    assert host.file("/var/lib/zerolayer/mps/chat_sim/pipe/control").is_pipe


def test_engine_start_brings_up_its_mps_instance_first(host):
    """Stopping the instance stops its engine (Requires=); starting the engine starts the
    instance again, and only once the daemon runs does the engine start (After=)."""
    mps = "zerolayer-mps@chat_sim.service"
    assert host.run("systemctl stop %s", mps).rc == 0
    assert unit_properties(host, SIM + ".service", "ActiveState")["ActiveState"] == "inactive"
    assert not host.file("/var/lib/zerolayer/mps/chat_sim/pipe/control").exists
    started = host.run("systemctl start %s.service", SIM)
    assert started.rc == 0, started.stderr
    daemon = unit_properties(host, mps, "ActiveState", "ActiveEnterTimestampMonotonic")
    engine = unit_properties(
        host, SIM + ".service", "ActiveState", "InactiveExitTimestampMonotonic"
    )
    assert (daemon["ActiveState"], engine["ActiveState"]) == ("active", "active")
    assert int(daemon["ActiveEnterTimestampMonotonic"]) <= int(
        engine["InactiveExitTimestampMonotonic"]
    )
    assert chat(host)[0] == 200


# -- the API key in the engines' real processes ----------------------------------------

VLLM_UNIT = "zerolayer-engine-llama_vllm.service"
VLLM_VENV = "/opt/zerolayer/engines/llama_vllm/venv"
# TEST DOUBLE of vLLM's `vllm` command, installed for one test and removed after it: it
# only waits, so the test reads the arguments and environment systemd started it with.
VLLM_DOUBLE = """#!/usr/bin/python3
# TEST DOUBLE of vLLM (zerolayer.fleet molecule model_engine): waits until stopped.
import time
while True:
    time.sleep(60)
"""


def process_of(host, unit):
    """argv and environment of the unit's main process, read from /proc as root."""
    main_pid = unit_properties(host, unit, "MainPID")["MainPID"]
    assert main_pid != "0", "%s has no main process" % unit
    with host.sudo():
        argv = host.run("cat /proc/%s/cmdline", main_pid).stdout.split("\0")
        raw = host.run("cat /proc/%s/environ", main_pid).stdout
    return argv, dict(pair.split("=", 1) for pair in raw.split("\0") if "=" in pair)


@pytest.fixture
def vllm_double(host):
    existed = host.file(VLLM_VENV).exists
    binary = VLLM_VENV + "/bin/vllm"
    installed = host.run(
        "mkdir -p %s && printf '%%s' %s > %s && chmod 0755 %s",
        VLLM_VENV + "/bin",
        VLLM_DOUBLE,
        binary,
        binary,
    )
    assert installed.rc == 0, installed.stderr
    try:
        yield binary
    finally:
        host.run("systemctl stop %s zerolayer-mps@llama_vllm.service", VLLM_UNIT)
        host.run("systemctl reset-failed %s", VLLM_UNIT)
        host.run("rm -rf %s", VLLM_VENV if not existed else binary)


def test_api_key_never_reaches_an_engine_command_line(host, vllm_double):
    """The key must not be in any process's arguments (world-readable in /proc): read the
    arguments systemd really gave the running simulator, and those of the vLLM unit started
    with a stand-in executable, after systemd expanded its environment files."""
    argv, environment = process_of(host, SIM + ".service")
    assert "--api-keys-file" in argv, argv
    assert not [arg for arg in argv if KEY in arg], argv

    assert host.run("systemctl start --no-block %s", VLLM_UNIT).rc == 0
    deadline = time.monotonic() + RESTART_DEADLINE_S
    while True:
        main_pid = unit_properties(host, VLLM_UNIT, "MainPID")["MainPID"]
        if main_pid != "0":
            argv, environment = process_of(host, VLLM_UNIT)
            if vllm_double in argv:  # exec'd, no longer systemd's fork
                break
        assert time.monotonic() < deadline, "%s never ran its executable" % VLLM_UNIT
        time.sleep(0.5)
    assert argv[argv.index(vllm_double) + 1 :][:6] == [
        "serve",
        "/srv/models/llama-tiny",
        "--served-model-name",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "0.0.0.0",
    ]
    assert "--tensor-parallel-size" in argv
    assert not [arg for arg in argv if KEY in arg], argv
    # The key reaches the engine, by its environment.
    assert environment.get("VLLM_API_KEY") == KEY
    # Offline, on the MPS server's two devices, numbered as nvidia-smi numbers GPUs.
    assert environment.get("HF_HUB_OFFLINE") == "1"
    assert environment.get("CUDA_VISIBLE_DEVICES") == "0,1"
    assert environment.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"


def test_engines_read_the_routers_direct_drain_marker_as_their_own_user(host):
    # The router writes /run/zerolayer/direct-drain.json when it lowers a weight (0644);
    # the simulator's account must be able to read it, with the rule installed beside it.
    props = unit_properties(host, SIM + ".service", "ExecStart")
    assert "--direct-drain-file /run/zerolayer/direct-drain.json" in props["ExecStart"]
    assert "--direct-idle-grace 0.5" in props["ExecStart"]
    rule = host.file("/usr/local/lib/zerolayer/zerolayer_direct_drain.py")
    assert rule.is_file and rule.mode == 0o644 and rule.user == "root"
    marker = {"version": 1, "all": {"since_unix": 1.0, "epoch": 1, "reason": "test"}}
    with host.sudo():
        host.run_expect([0], "install -d -m 0755 /run/zerolayer")
        host.run_expect([0], "printf %%s %s > /run/zerolayer/direct-drain.json", json.dumps(marker))
        host.run_expect([0], "chmod 0644 /run/zerolayer/direct-drain.json")
        read = host.run(
            "runuser -u zerolayer-engine -- python3 -c %s",
            "import sys; sys.path.insert(0, '/usr/local/lib/zerolayer'); "
            "import zerolayer_direct_drain as d; "
            "print(d.MarkerFile('/run/zerolayer/direct-drain.json').current()['all']['epoch'])",
        )
        host.run("rm -f /run/zerolayer/direct-drain.json")
    assert (read.rc, read.stdout.strip()) == (0, "1"), read.stderr
