#!/usr/bin/python3
# The hostile suites' helpers (tests/helpers/hostile.py) checked against a
# server: the round trip works and the sampling reads sane numbers.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from hostile import *  # noqa: E402,F401,F403

need_server()
srv = Server(["ram", "size=64M"] if not IS_NBDKIT else ["memory", "size=64M"])
check(vmrss_mib(srv.proc.pid) > 0, "VmRSS of the server reads")
check(nfds(srv.proc.pid) >= 3, "fd count of the server reads")


def idle():
    c = RawClient(srv)
    c.start()
    c.close()


run_cases(srv, [("connect, negotiate flags, close", idle)] * 3, batch=2)
