"""The gateopen test plugin's side of a test (tests/plugins/gateopen.c):
its gate directory, waiting for a held call to be entered, letting it go,
and blkd's connection count from /metrics.  Import after blkdtest."""

import os
import re
import time
import urllib.request

from blkdtest import IS_NBDKIT, TMP, TOP, check_eq, fail, skip

PLUGIN = os.path.join(TOP, "tests", "plugins", "nbdkit-gateopen-plugin.so")
if not IS_NBDKIT and not os.path.exists(PLUGIN):
    skip("tests/plugins/nbdkit-gateopen-plugin.so not built (make check-build)")

GATE = os.path.join(TMP, "gate")
os.makedirs(GATE, exist_ok=True)


def gate_file(name):
    return os.path.join(GATE, name)


def wait_entered(what, secs=20):
    """Until the plugin says it is holding `what` (bounded)."""
    deadline = time.time() + secs
    while not os.path.exists(gate_file(what + ".entered")):
        if time.time() > deadline:
            fail("the plugin never entered %s" % what)
        time.sleep(0.01)


def release(what):
    open(gate_file(what + ".release"), "w").close()


def connections(srv):
    url = "http://127.0.0.1:%d/metrics" % srv.metrics_port
    with urllib.request.urlopen(url, timeout=10) as r:
        m = re.search(r"^blkd_connections (\d+)", r.read().decode(), re.M)
    return int(m.group(1)) if m else -1


def wait_connections(srv, want, what, secs=10):
    deadline = time.time() + secs
    while connections(srv) != want and time.time() < deadline:
        time.sleep(0.05)
    check_eq(connections(srv), want, what)
