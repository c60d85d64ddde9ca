"""TEST DOUBLE of nvidia-cuda-mps-control for GPU-less sandbox nodes.

Not NVIDIA's program. It imitates just enough of the control daemon for systemd and the
cuda_mps role to be tested without a GPU:
  -d            fork a daemon that owns CUDA_MPS_PIPE_DIRECTORY/control (a FIFO) and
                nvidia-cuda-mps-control.pid, and writes CUDA_MPS_LOG_DIRECTORY/control.log;
  (no option)   client: send each stdin line to the daemon and wait for its answer.
Every start, command and exit is appended as a JSON line to RECORD for the tests to read.
"""

import json
import os
import re
import signal
import sys
import time

RECORD = "/var/log/zerolayer-test-doubles/nvidia-cuda-mps-control.jsonl"
PIPE_DIR = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOG_DIR = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
CONTROL = os.path.join(PIPE_DIR, "control")
PID_FILE = os.path.join(PIPE_DIR, "nvidia-cuda-mps-control.pid")

COMMANDS = {
    "set_default_device_pinned_mem_limit": re.compile(r"^[0-9]+ [1-9][0-9]*[KMGT]?$"),
    "set_default_active_thread_percentage": re.compile(r"^([1-9][0-9]?|100)$"),
    "get_server_list": re.compile(r"^$"),
    "quit": re.compile(r"^$"),
}


def record(event, **fields):
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    entry = {"event": event, "pid": os.getpid(), "pipe_dir": PIPE_DIR}
    entry.update(fields)
    with open(RECORD, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def log(line):
    with open(os.path.join(LOG_DIR, "control.log"), "a", encoding="utf-8") as handle:
        handle.write("[%s] %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), line))


def read_daemon_pid():
    try:
        with open(PID_FILE, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def process_alive(pid):
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def daemon_running():
    return process_alive(read_daemon_pid())


def answer(command_line):
    name, _space, arguments = command_line.partition(" ")
    pattern = COMMANDS.get(name)
    if pattern is None or not pattern.match(arguments):
        return "error: unrecognized or malformed command: %s" % command_line
    return ""


def serve():
    def on_signal(number, _frame):
        # End by the signal itself, as a daemon without a handler would: systemd counts
        # SIGTERM during a stop as a clean end, an exit status of 1 as a failure.
        record("signal", signal=signal.Signals(number).name)
        cleanup()
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    signal.signal(signal.SIGTERM, on_signal)
    with open(PID_FILE, "w", encoding="ascii") as handle:
        handle.write("%d\n" % os.getpid())
    record("start", cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), log_dir=LOG_DIR)
    log("Startup")
    control = os.open(CONTROL, os.O_RDWR)  # held open for reading and writing: never sees EOF
    buffered = b""
    while True:
        buffered += os.read(control, 4096)
        while b"\n" in buffered:
            raw, buffered = buffered.split(b"\n", 1)
            reply_path, _space, command_line = raw.decode().partition(" ")
            reply = answer(command_line.strip())
            record("command", command=command_line.strip(), accepted=not reply)
            log("Received: %s" % command_line.strip())
            with open(reply_path, "w", encoding="utf-8") as handle:
                handle.write(reply)
            if command_line.strip() == "quit" and not reply:
                record("exit", reason="quit")
                log("Shutdown")
                cleanup()
                os._exit(0)


def cleanup():
    for path in (CONTROL, PID_FILE):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def start_daemon():
    if daemon_running():
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    os.makedirs(PIPE_DIR, exist_ok=True)
    os.makedirs(LOG_DIR, exist_ok=True)
    cleanup()
    os.mkfifo(CONTROL, 0o600)
    if os.fork() > 0:
        # Parent: return once the daemon has written its pid file, like a forking daemon.
        for _attempt in range(100):
            if daemon_running():
                return 0
            time.sleep(0.1)
        return 1
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    serve()
    return 0


def client():
    if not os.path.exists(CONTROL) or not daemon_running():
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    status = 0
    daemon_pid = read_daemon_pid()
    for line in sys.stdin:
        command_line = line.strip()
        if not command_line:
            continue
        reply_path = os.path.join(PIPE_DIR, "reply.%d" % os.getpid())
        os.mkfifo(reply_path, 0o600)
        try:
            with open(CONTROL, "w", encoding="utf-8") as handle:
                handle.write("%s %s\n" % (reply_path, command_line))
            with open(reply_path, encoding="utf-8") as handle:
                reply = handle.read()
        finally:
            os.unlink(reply_path)
        if reply:
            print(reply)
            status = 1
        if command_line == "quit":
            # Return once the daemon process is gone, not only its pid file: systemd sends
            # SIGTERM to whatever is left in the unit once this stop command returns.
            for _attempt in range(100):
                if not process_alive(daemon_pid):
                    break
                time.sleep(0.1)
    return status


def main(argv):
    if argv == ["-d"]:
        return start_daemon()
    if argv == []:
        return client()
    print("test double: unsupported arguments %r" % (argv,), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
