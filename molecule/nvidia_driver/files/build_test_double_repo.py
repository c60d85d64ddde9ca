"""Build the nvidia_driver scenario's local apt repositories of TEST DOUBLE packages.

Runs on the controller during prepare. The packages carry the real names the role installs
on Debian 12 (vars/Debian.yml) so the role's apt path runs for real, but hold no driver:
nvidia-smi and nvidia-persistenced ship this scenario's doubles, nvidia-fabricmanager-<B> a
sleeping stand-in daemon, the rest only a note saying they are TEST DOUBLES. There is also
a linux-headers package for the running kernel, which no archive has for the test machine's
kernel.

Two flat repositories (laid out like NVIDIA's debian12/<arch>/ one, signed by a throw-away
key published as 3bf863cc.pub, the name of NVIDIA's key file):
  OUT/first-release/  the driver at --first only
  OUT/next-release/   the driver at --first and --next (NVIDIA published a new release)

  build_test_double_repo.py --out DIR --kernel RELEASE --branch 550 --first V1 --next V2
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLES = os.path.join(HERE, "..", "doubles")
NOTE = "TEST DOUBLE built by molecule/nvidia_driver (zerolayer.fleet): no NVIDIA software.\n"

PERSISTENCED_UNIT = """\
# TEST DOUBLE unit. Like the unit NVIDIA packages, it starts the daemon without persistence
# mode; the nvidia_driver role's drop-in must turn it on.
[Unit]
Description=NVIDIA Persistence Daemon (TEST DOUBLE)

[Service]
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_UNIT = """\
# TEST DOUBLE unit of NVIDIA fabric manager.
[Unit]
Description=NVIDIA fabric manager (TEST DOUBLE)

[Service]
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_DAEMON = """\
#!/bin/sh
# TEST DOUBLE of nv-fabricmanager: no NVSwitch is managed, it only stays running.
exec sleep infinity
"""


def driver_packages(branch, version):
    """Package name -> {path: (content, mode)} for one driver release."""
    with open(os.path.join(DOUBLES, "nvidia-smi-double.py"), encoding="utf-8") as handle:
        smi = "#!/usr/bin/python3\n" + handle.read().replace("@DRIVER_VERSION@", version)
    with open(os.path.join(DOUBLES, "nvidia-persistenced-double.py"), encoding="utf-8") as handle:
        persistenced = "#!/usr/bin/python3\n" + handle.read()
    return {
        "nvidia-kernel-open-dkms": {},
        "firmware-nvidia-gsp": {},
        "libcuda1": {},
        "libnvidia-nscq-%s" % branch: {},
        "nvidia-smi": {"usr/bin/nvidia-smi": (smi, 0o755)},
        "nvidia-persistenced": {
            "usr/bin/nvidia-persistenced": (persistenced, 0o755),
            "lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT, 0o644),
        },
        "nvidia-fabricmanager-%s" % branch: {
            "usr/bin/nv-fabricmanager": (FABRICMANAGER_DAEMON, 0o755),
            "usr/share/nvidia/nvswitch/fabricmanager.cfg": ("# TEST DOUBLE\n", 0o644),
            "lib/systemd/system/nvidia-fabricmanager.service": (FABRICMANAGER_UNIT, 0o644),
        },
    }


def build_deb(workdir, pool, name, version, files):
    root = os.path.join(workdir, "%s_%s" % (name, version))
    os.makedirs(os.path.join(root, "DEBIAN"))
    files = dict(files)
    files["usr/share/doc/%s/TEST-DOUBLE" % name] = (NOTE, 0o644)
    for path, (content, mode) in files.items():
        target = os.path.join(root, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.chmod(target, mode)
    with open(os.path.join(root, "DEBIAN", "control"), "w", encoding="utf-8") as handle:
        handle.write(
            "Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: zerolayer.fleet tests"
            " <tests@zerolayer.invalid>\nSection: non-free/libs\nPriority: optional\n"
            "Description: TEST DOUBLE of %s\n %s" % (name, version, name, NOTE)
        )
    deb = os.path.join(pool, "%s_%s_all.deb" % (name, version))
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, deb],
        check=True,
        capture_output=True,
    )
    return deb


def control_of(deb):
    return subprocess.run(
        ["dpkg-deb", "--field", deb], check=True, capture_output=True, text=True
    ).stdout.rstrip("\n")


def digest(path, name):
    with open(path, "rb") as handle:
        return hashlib.new(name, handle.read()).hexdigest()


def write_repository(directory, debs, gnupghome):
    """A flat repository (Suites: /) like NVIDIA's: Packages, Release, InRelease, key."""
    os.makedirs(directory)
    entries = []
    for deb in sorted(debs):
        shutil.copy(deb, directory)
        name = os.path.basename(deb)
        entries.append(
            "%s\nFilename: ./%s\nSize: %d\nMD5sum: %s\nSHA256: %s\n"
            % (
                control_of(deb),
                name,
                os.path.getsize(deb),
                digest(deb, "md5"),
                digest(deb, "sha256"),
            )
        )
    packages = os.path.join(directory, "Packages")
    with open(packages, "w", encoding="utf-8") as handle:
        handle.write("\n".join(entries))
    size = os.path.getsize(packages)
    with open(os.path.join(directory, "Release"), "w", encoding="utf-8") as handle:
        handle.write(
            "Origin: zerolayer TEST DOUBLE\nLabel: zerolayer TEST DOUBLE\n"
            "Date: %s\nMD5Sum:\n %s %d Packages\nSHA256:\n %s %d Packages\n"
            % (
                time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()),
                digest(packages, "md5"),
                size,
                digest(packages, "sha256"),
                size,
            )
        )
    gpg = ["gpg", "--homedir", gnupghome, "--batch", "--yes", "--pinentry-mode", "loopback"]
    subprocess.run(
        [*gpg, "--clearsign", "-o", os.path.join(directory, "InRelease"), "Release"],
        cwd=directory,
        check=True,
        capture_output=True,
    )
    with open(os.path.join(directory, "3bf863cc.pub"), "wb") as handle:
        handle.write(
            subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True).stdout
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--branch", required=True)
    parser.add_argument("--first", required=True)
    parser.add_argument("--next", required=True)
    arguments = parser.parse_args()
    for tool in ("dpkg-deb", "gpg", "gpg-agent", "gpgconf"):
        if shutil.which(tool) is None:
            sys.exit("build_test_double_repo: %s is needed on the controller (bindep.txt)" % tool)

    workdir = tempfile.mkdtemp(prefix="zl-nvd-repo-")
    gnupghome = os.path.join(workdir, "gnupg")
    os.mkdir(gnupghome, 0o700)
    try:
        subprocess.run(
            [
                "gpg",
                "--homedir",
                gnupghome,
                "--batch",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--quick-gen-key",
                "zerolayer TEST DOUBLE of NVIDIA's CUDA repository key",
                "ed25519",
                "sign",
                "never",
            ],
            check=True,
            capture_output=True,
        )
        pool = os.path.join(workdir, "pool")
        os.mkdir(pool)
        headers = build_deb(workdir, pool, "linux-headers-%s" % arguments.kernel, "1.0", {})
        releases = {}
        for version in (arguments.first, arguments.next):
            releases[version] = [
                build_deb(workdir, pool, name, version + "-1", files)
                for name, files in driver_packages(arguments.branch, version).items()
            ]
        write_repository(
            os.path.join(arguments.out, "first-release"),
            [headers] + releases[arguments.first],
            gnupghome,
        )
        write_repository(
            os.path.join(arguments.out, "next-release"),
            [headers] + releases[arguments.first] + releases[arguments.next],
            gnupghome,
        )
    finally:
        # gpg started an agent for the throw-away home: stop it, leave nothing behind.
        subprocess.run(["gpgconf", "--homedir", gnupghome, "--kill", "all"], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
