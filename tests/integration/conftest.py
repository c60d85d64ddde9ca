"""Integration tests import the collection through the checkout's collections path."""

import os
import sys

COLLECTIONS_PATH = os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
if os.path.abspath(COLLECTIONS_PATH) not in sys.path:
    sys.path.insert(0, os.path.abspath(COLLECTIONS_PATH))
