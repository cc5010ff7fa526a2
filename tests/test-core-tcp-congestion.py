#!/usr/bin/python3
# --tcp-congestion NAME: every accepted TCP connection uses that
# congestion control (ss shows it on the server's side of the socket),
# and data moves both ways on it; without the option the connection
# keeps the system's default.  A name the kernel does not have, or an
# empty one, is refused at start (exit 1, the option named), and so is,
# as root with -u nobody, one only CAP_NET_ADMIN may pick.
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

if IS_NBDKIT:
    skip("--tcp-congestion is blkd's")
if not shutil.which("ss"):
    skip("ss (iproute2) is not installed")


def sysctl(name):
    with open("/proc/sys/net/ipv4/" + name) as f:
        return f.read().split()


default = sysctl("tcp_congestion_control")[0]
# Without CAP_NET_ADMIN a process may only pick the allowed ones.
usable = sysctl("tcp_available_congestion_control" if os.geteuid() == 0
                else "tcp_allowed_congestion_control")
others = [a for a in usable if a != default]
if not others:
    skip("only %s is usable here: nothing to tell the option's choice from the default"
         % default)
# reno is built into every kernel; prefer it.
alg = "reno" if "reno" in others else others[0]


def server_side_alg(srv):
    """The congestion control ss reports for the server's end of the one
    established connection on srv's port."""
    out = subprocess.run(["ss", "-tinH", "state", "established", "sport", "=",
                          ":%d" % srv.port], capture_output=True, text=True,
                         timeout=10).stdout
    names = [a for a in sysctl("tcp_available_congestion_control")
             if re.search(r"(^|\s)%s(\s|:)" % re.escape(a), out)]
    check_eq(len(names), 1, "ss names one congestion control for the server's socket (%r)"
             % out.strip())
    return names[0]


def connection_uses(opts, want, what):
    srv = Server(["memory", "1M"], opts=opts)
    c = RawClient(srv)
    c.handshake(structured=False)
    payload = os.urandom(256 * 1024)
    c.send_request(NBD_CMD_WRITE, 0, len(payload), cookie=1, payload=payload)
    check_eq(c.recv_reply()[:2], (1, 0), "%s: the WRITE succeeds" % what)
    c.send_request(NBD_CMD_READ, 0, len(payload), cookie=2)
    cookie, error, _, data = c.recv_reply(len(payload))
    check((cookie, error, data) == (2, 0, payload), "%s: the READ returns what was written"
          % what)
    check_eq(server_side_alg(srv), want, "%s: the connection's congestion control" % what)
    c.close()
    srv.stop()


for bad in ("no-such-algorithm", ""):
    r = subprocess.run([BLKD, "--tcp-congestion", bad, "memory", "1M"], capture_output=True,
                       text=True, timeout=10)
    check(r.returncode == 1 and "--tcp-congestion" in r.stderr,
          "--tcp-congestion %r is refused at start" % bad, r.stderr.strip())

connection_uses([], default, "no option")
connection_uses(["--tcp-congestion", alg], alg, "--tcp-congestion %s" % alg)
ok("--tcp-congestion sets accepted connections' congestion control; the default is kept "
   "without it")


def as_user():
    """Started as root with -u, blkd serves as that user, whose rights
    decide what each connection's setsockopt may pick: a congestion
    control only CAP_NET_ADMIN may use (available, not allowed) must be
    refused at start, as a typo is, not taken as root and then missed on
    every connection (and by a live restart's image, which starts as the
    user already and would refuse it then); an allowed one is set."""
    if os.geteuid() != 0:
        note("not root: -u not tried")
        return
    import pwd
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        note("no user nobody: -u not tried")
        return
    allowed = sysctl("tcp_allowed_congestion_control")
    privileged = [a for a in sysctl("tcp_available_congestion_control") if a not in allowed]
    if not privileged:
        note("every available congestion control is allowed to all users: -u not tried")
        return
    what = "-u nobody --tcp-congestion %s (not in tcp_allowed_congestion_control)" % privileged[0]
    p = subprocess.Popen([BLKD, "-f", "-i", "127.0.0.1", "-p", "0", "-u", "nobody",
                          "--tcp-congestion", privileged[0], "memory", "1M"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate(timeout=10)
        check(False, "%s is refused at start" % what, "it started and served: " + err.strip())
        return
    check(p.returncode == 1 and "--tcp-congestion" in err, "%s is refused at start" % what,
          "exit %d: %s" % (p.returncode, err.strip()))
    if alg in allowed:
        connection_uses(["-u", "nobody", "--tcp-congestion", alg], alg,
                        "-u nobody --tcp-congestion %s" % alg)


as_user()
