"""The one bootstrap of the repository's commands (issue 39): a command in tools/ imports it first (`import
repo_path`: tools/ is the command's own directory, so sys.path[0]), and the collection's Python then imports as
Ansible ships it to the hosts, `from ansible_collections.b300.rollout.plugins.module_utils... import ...`. The tests
get the same directories from pytest.ini's `pythonpath`; a shell wrapper may set PYTHONPATH=collections instead.
What runs on the target hosts (roles/*/files) or in the sandbox carries its own lookup (it does not have this file)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
