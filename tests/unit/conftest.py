"""Unit tests import the collection through the checkout's collections path, which
tests/conftest.py puts on sys.path for every test folder.

tests/unit mirrors the collection: a plugin's test lies at tests/unit/<the plugin's folder>/
test_<name>.py, a role's at tests/unit/roles/<role>/ (test_layout.py holds the tree to it,
README.md says it for people). Every folder here has an empty __init__.py, as tests/store
and tests/dataplane have: pytest's default ("prepend") import mode then names a test module
by its path from tests/ (unit.plugins.module_utils.test_rollout), so two test files of one
name in two folders (a module's and its module_utils') do not collide.
--import-mode=importlib would do it too, but would change how every other test folder
imports its neighbours. The shared helpers are the package unit.helpers: tests/ is on
sys.path, where pytest puts the root of these packages (and of tests/conftest.py).
"""
