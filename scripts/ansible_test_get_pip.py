"""Offline stand-in for the pip bootstrap script that ansible-test downloads.

ansible-test creates each sanity venv without pip and then runs a "get-pip" script that it
fetches from a host this machine cannot reach. This script does the same job with what is
here: the interpreter's bundled pip (ensurepip), then pip from the package index configured
for this machine, at the version ansible-test asks for.
"""

import ensurepip
import os
import subprocess
import sys

GET_PIP_ONLY_FLAGS = {"--no-setuptools", "--no-wheel"}


def main() -> None:
    # ensurepip points PIP_CONFIG_FILE at /dev/null for the rest of this process; the real
    # install below must see the machine's pip configuration (index, CA bundle) again.
    environment = dict(os.environ)
    ensurepip.bootstrap(upgrade=True, default_pip=True)
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY_FLAGS]
    command = [sys.executable, "-m", "pip", "install", *args]
    sys.exit(subprocess.call(command, env=environment))


if __name__ == "__main__":
    main()
