"""`pytest -p warm_plugin`: the detaudit plugin's repeats forked from the warm servers (tests/warm/server.py), for
the plugin's own tests run by pytester (tests/e2e/test_pytest_plugin.py copies this file into the pytester folder).
DETAUDIT_TEST_WARM holds tests/warm's path and the servers' folder, comma-separated."""

import os
import sys

code, servers = os.environ["DETAUDIT_TEST_WARM"].split(",")
sys.path.insert(0, code)
from warm_launch import start_repeats_on  # noqa: E402

start_repeats_on(servers)
