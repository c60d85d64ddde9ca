"""The nvidia filters against nvidia-smi outputs kept in tests/fixtures/nvidia-smi.

Those outputs are TEST DOUBLES written in NVIDIA's documented format (see the README
there): no GPU exists on the test machines.
"""

import os
import re

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.filter import nvidia

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "nvidia-smi")


def recorded(name):
    """A registered-result-like dict built from a fixture file (rc comes from its name)."""
    rc = int(re.search(r"\.rc(\d+)\.txt$", name).group(1))
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        stdout = handle.read()
    return {"rc": rc, "stdout": stdout, "stderr": ""}


def test_every_fixture_is_listed_in_the_readme():
    with open(os.path.join(FIXTURES, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    names = [name for name in os.listdir(FIXTURES) if name.endswith(".txt")]
    assert names
    assert [name for name in names if name not in readme] == []


class TestDriverCheck:
    def test_exact_version_on_every_gpu(self):
        report = nvidia.nvidia_driver_check(
            recorded("driver-version.hgx-h100-8gpu.rc0.txt"), "550", "550.127.05"
        )
        assert report["ok"] is True
        assert report["found"] == ["550.127.05"] * 8
        assert report["message"] == "all 8 GPU(s) run driver 550.127.05"

    def test_branch_only_accepts_any_release_of_the_branch(self):
        report = nvidia.nvidia_driver_check(
            recorded("driver-version.1gpu-550.90.07.rc0.txt"), "550", ""
        )
        assert report["ok"] is True
        assert report["expected"] == "550.*"

    def test_other_release_of_the_pinned_branch_is_refused(self):
        report = nvidia.nvidia_driver_check(
            recorded("driver-version.1gpu-550.90.07.rc0.txt"), "550", "550.127.05"
        )
        assert report["ok"] is False
        assert report["message"] == (
            "driver version mismatch: expected 550.127.05, nvidia-smi reports 550.90.07"
        )

    def test_other_branch_is_refused(self):
        report = nvidia.nvidia_driver_check(
            recorded("driver-version.2gpu-branch-535.rc0.txt"), "550", ""
        )
        assert report["ok"] is False
        assert report["found"] == ["535.183.01", "535.183.01"]
        assert "expected 550.*, nvidia-smi reports 535.183.01" in report["message"]

    def test_branch_prefix_is_not_a_string_prefix(self):
        # "5501.x" must not pass for branch 550.
        result = {"rc": 0, "stdout": "5501.10.01\n", "stderr": ""}
        assert nvidia.nvidia_driver_check(result, "550", "")["ok"] is False

    @pytest.mark.parametrize(
        ("fixture", "rc", "words"),
        [
            (
                "driver-version.driver-not-loaded.rc9.txt",
                9,
                "couldn't communicate with the NVIDIA driver",
            ),
            ("driver-version.library-mismatch.rc18.txt", 18, "Driver/library version mismatch"),
            ("driver-version.no-devices.rc6.txt", 6, "No devices were found"),
        ],
    )
    def test_tool_failure_is_reported_with_rc_and_output(self, fixture, rc, words):
        report = nvidia.nvidia_driver_check(recorded(fixture), "550", "550.127.05")
        assert report["ok"] is False
        assert report["message"].startswith(
            "nvidia-smi failed (rc=%d), expected driver 550.127.05: " % rc
        )
        assert words in report["message"]

    def test_missing_binary_reports_the_module_message(self):
        result = {
            "rc": 2,
            "stdout": "",
            "stderr": "",
            "msg": "[Errno 2] No such file or directory: b'nvidia-smi'",
        }
        report = nvidia.nvidia_driver_check(result, "550", "")
        assert report["ok"] is False
        assert "No such file or directory" in report["message"]

    def test_empty_output_is_not_success(self):
        report = nvidia.nvidia_driver_check(recorded("driver-version.empty.rc0.txt"), "550", "")
        assert report["ok"] is False
        assert report["message"] == "nvidia-smi listed no GPU, expected driver 550.* on every GPU"

    def test_garbage_is_not_a_version(self):
        result = {"rc": 0, "stdout": "[N/A]\n", "stderr": ""}
        report = nvidia.nvidia_driver_check(result, "550", "")
        assert report["ok"] is False
        assert "'[N/A]'" in report["message"]

    @pytest.mark.parametrize("bad", [None, "stdout text", {"stdout": "550.1.1"}])
    def test_input_must_be_a_registered_result(self, bad):
        with pytest.raises(AnsibleFilterError, match="registered result"):
            nvidia.nvidia_driver_check(bad, "550", "")

    def test_branch_must_be_digits(self):
        with pytest.raises(AnsibleFilterError, match="branch must be digits"):
            nvidia.nvidia_driver_check({"rc": 0, "stdout": ""}, "r550", "")


class TestSmiCsv:
    def test_several_fields(self):
        fields = ["index", "name", "uuid", "driver_version", "compute_mode", "pci.bus_id"]
        rows = nvidia.nvidia_smi_csv(
            recorded("query-gpu.index-name-uuid-driver-mode-bus.2gpu.rc0.txt")["stdout"], fields
        )
        assert rows == [
            {
                "index": "0",
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-0a7b3c11-52de-4b8e-8f30-6c2a9d1e4b70",
                "driver_version": "550.127.05",
                "compute_mode": "Default",
                "pci.bus_id": "00000000:18:00.0",
            },
            {
                "index": "1",
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-4c1e9a52-7d0b-4f3e-9a61-2b8d5e0f7c13",
                "driver_version": "550.127.05",
                "compute_mode": "Exclusive_Process",
                "pci.bus_id": "00000000:2A:00.0",
            },
        ]

    @pytest.mark.parametrize(
        ("fixture", "mode"),
        [
            ("compute-mode.default.rc0.txt", "Default"),
            ("compute-mode.exclusive-process.rc0.txt", "Exclusive_Process"),
        ],
    )
    def test_compute_mode(self, fixture, mode):
        assert nvidia.nvidia_smi_csv(recorded(fixture)["stdout"], ["compute_mode"]) == [
            {"compute_mode": mode}
        ]

    def test_unavailable_values_become_none(self):
        stdout = recorded("query-gpu.index-mig-mode.not-supported.rc0.txt")["stdout"]
        assert nvidia.nvidia_smi_csv(stdout, ["index", "mig.mode.current"]) == [
            {"index": "0", "mig.mode.current": None},
            {"index": "1", "mig.mode.current": None},
        ]

    @pytest.mark.parametrize(
        ("fixture", "disabled"),
        [
            ("query-gpu.index-persistence-mode.2gpu-enabled.rc0.txt", []),
            ("query-gpu.index-persistence-mode.2gpu-one-disabled.rc0.txt", ["1"]),
        ],
    )
    def test_persistence_mode(self, fixture, disabled):
        # The nvidia_driver role's verify.yml fails on any GPU whose mode is not Enabled.
        rows = nvidia.nvidia_smi_csv(recorded(fixture)["stdout"], ["index", "persistence_mode"])
        assert len(rows) == 2
        assert [row["index"] for row in rows if row["persistence_mode"] != "Enabled"] == disabled

    def test_wrong_field_count_names_the_line(self):
        with pytest.raises(AnsibleFilterError, match="line 1 has 6 values, expected 2"):
            nvidia.nvidia_smi_csv(
                recorded("query-gpu.index-name-uuid-driver-mode-bus.2gpu.rc0.txt")["stdout"],
                ["a", "b"],
            )

    def test_fields_required(self):
        with pytest.raises(AnsibleFilterError, match="fields must be a non-empty list"):
            nvidia.nvidia_smi_csv("0\n", [])


def sysfs(*functions):
    """The output of `grep -H "" .../vendor .../device .../class` for the given functions."""
    lines = []
    for address, vendor, device, pci_class in functions:
        base = "/sys/bus/pci/devices/" + address
        lines += [
            base + "/vendor:" + vendor,
            base + "/device:" + device,
            base + "/class:" + pci_class,
        ]
    return "\n".join(lines) + "\n"


class TestPciDevices:
    def test_hgx_h100_board(self):
        listing = sysfs(
            ("0000:00:00.0", "0x8086", "0x09a2", "0x060000"),  # host bridge
            ("0000:18:00.0", "0x10de", "0x2330", "0x030200"),  # H100 SXM
            ("0000:2a:00.0", "0x10de", "0x2330", "0x030200"),
            ("0000:05:00.0", "0x10de", "0x22a3", "0x068000"),  # NVSwitch gen3
            ("0000:c1:00.1", "0x10de", "0x22a4", "0x040300"),  # other NVIDIA function
        )
        devices = nvidia.nvidia_pci_devices(listing)
        assert [(d["address"], d["kind"]) for d in devices] == [
            ("0000:05:00.0", "nvswitch"),
            ("0000:18:00.0", "gpu"),
            ("0000:2a:00.0", "gpu"),
            ("0000:c1:00.1", "nvswitch"),
        ]
        assert all(d["open_modules_supported"] for d in devices if d["kind"] == "gpu")

    def test_pre_turing_gpu_cannot_use_open_modules(self):
        devices = nvidia.nvidia_pci_devices(
            sysfs(
                ("0000:3b:00.0", "0x10de", "0x1db5", "0x030200"),  # V100
                ("0000:3c:00.0", "0x10de", "0x1eb8", "0x030200"),  # T4 (Turing)
            )
        )
        assert [d["open_modules_supported"] for d in devices] == [False, True]

    def test_node_without_nvidia_devices(self):
        listing = sysfs(
            ("0000:00:00.0", "0x8086", "0x1237", "0x060000"),
            ("0000:00:01.0", "0x1af4", "0x1000", "0x020000"),
        )
        assert nvidia.nvidia_pci_devices(listing) == []
        assert nvidia.nvidia_pci_devices("") == []

    def test_extra_nvswitch_ids(self):
        listing = sysfs(("0000:05:00.0", "0x10de", "0x2901", "0x040000"))
        assert nvidia.nvidia_pci_devices(listing)[0]["kind"] == "other"
        assert nvidia.nvidia_pci_devices(listing, ["0x2901"])[0]["kind"] == "nvswitch"

    def test_nvidia_vga_controller_is_a_gpu(self):
        devices = nvidia.nvidia_pci_devices(sysfs(("0000:01:00.0", "0x10de", "0x2684", "0x030000")))
        assert devices == [
            {
                "address": "0000:01:00.0",
                "device_id": "2684",
                "class": "0300",
                "kind": "gpu",
                "open_modules_supported": True,
            }
        ]


def test_filters_are_registered():
    assert set(nvidia.FilterModule().filters()) == {
        "nvidia_smi_csv",
        "nvidia_driver_check",
        "nvidia_pci_devices",
        "cuda_mps_volatile_reason",
    }
