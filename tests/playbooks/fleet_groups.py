"""Which sandbox fleet a playbook test module uses, as its xdist group.

Every module shares the default fleet (one worker runs them in turn). With
ZEROLAYER_TEST_FLEETS=2 the modules marked SECOND_FLEET get a second fleet of their own, run
side by side in another worker: worth it on a machine with cores to spare. On the 2-core CI
machine it was slower (3 workers, two fleets: pytest 75-86 min, against 52-69 min on one
fleet and 2 workers), since vLLM on CPU, two fleets and the molecule nodes then share 2 cores.
"""

from __future__ import annotations

import os

DEFAULT_FLEET = "sandbox-fleet"
SECOND_FLEET = (
    "sandbox-second-fleet" if os.environ.get("ZEROLAYER_TEST_FLEETS") == "2" else DEFAULT_FLEET
)
