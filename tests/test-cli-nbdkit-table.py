"""nbdkit's documented command lines give the same outcome under blkd.

Each line of tests/cli-nbdkit-examples.txt (its header says the format) is
run with nbdkit and with blkd; the exit status and the client's standard
output must match.  Rows for options the installed nbdkit lacks are
compared with the outcome the row writes down.
"""

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import BLKD, IS_NBDKIT, fail, free_port, need_server, ok, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "cli-nbdkit-examples.txt")
PLUGINS = os.path.join(HERE, "plugins")
NBDKIT = shutil.which("nbdkit")
LIMIT = 180                     # seconds for one command; generous under load

need_server()
if IS_NBDKIT:
    skip("compares blkd with nbdkit; BLKD is nbdkit already")
if not NBDKIT:
    skip("nbdkit is not installed")
for tool in ("nbdinfo", "nbdsh", "nbdcopy"):
    if not shutil.which(tool):
        skip("%s is not installed" % tool)
if not os.path.exists(os.path.join(PLUGINS, "nbdkit-debugflag-plugin.so")):
    skip("tests/plugins/nbdkit-debugflag-plugin.so is not built (make check builds it)")
NBDKIT_HELP = subprocess.run([NBDKIT, "--help"], capture_output=True, text=True).stdout


def vsock_bind():
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        s.close()
        return None
    except (AttributeError, OSError) as e:
        return "no AF_VSOCK sockets here (%s)" % e


def vsock_loopback():
    why = vsock_bind()
    if why:
        return why
    srv = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    srv.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
    srv.listen()
    port = srv.getsockname()[1]
    c = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    c.settimeout(5)
    try:
        c.connect((1, port))           # VMADDR_CID_LOCAL
        return None
    except OSError as e:
        return "the kernel has no vsock loopback transport (vsock_loopback): %s" % e
    finally:
        c.close()
        srv.close()


def parse_table():
    rows = []
    with open(TABLE) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("  ||  ")
            if len(fields) not in (3, 4):
                fail("%s:%d: want 3 or 4 fields, got %d" % (TABLE, n, len(fields)))
            tags = set() if fields[0] == "-" else set(fields[0].split(","))
            rows.append((n, tags, fields[1], fields[2], fields[3] if len(fields) == 4 else None))
    return rows


def setup_tmp():
    # Not under blkdtest's TMP (mode 0700): -u nobody must reach
    # $TMP/sock and $TMP/public, and nothing above them may stop it.
    tmp = tempfile.mkdtemp(prefix="blkd-cli.")
    atexit.register(shutil.rmtree, tmp, True)
    os.chmod(tmp, 0o755)
    with open(os.path.join(tmp, "keys.psk"), "w") as f:
        f.write("alice:" + os.urandom(32).hex() + "\n")
    os.chmod(os.path.join(tmp, "keys.psk"), 0o600)
    for name, mode in (("secret", 0o600), ("public", 0o644)):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(b"\0" * 4096)
        os.chmod(p, mode)
    return tmp


def normalize(text, env):
    text = text.replace(env["TMP"], "$TMP").replace(env["PORT"], "$PORT")
    return re.sub(r"/tmp/(nbdkit|blkd)[A-Za-z0-9]{6}", "$PRIVATE", text)


def wait_ready(proc, env, args):
    """Until the background server accepts (or exits: nbdkit and blkd both
    return once bound when they fork)."""
    sock = env["TMP"] + "/sock"
    deadline = time.time() + LIMIT
    while time.time() < deadline:
        if "$TMP/sock" in args and os.path.exists(sock):
            return
        if "$PORT" in args:
            for fam, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
                try:
                    with socket.socket(fam) as s:
                        s.settimeout(1)
                        s.connect((addr, int(env["PORT"])))
                        return
                except OSError:
                    pass
        if proc.poll() is not None and "$TMP/sock" not in args:
            return
        time.sleep(0.05)


def running(pid):
    """Alive and not a zombie (a reparented daemon may wait to be reaped)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop(proc, env):
    pids = [proc.pid]
    pidfile = env["TMP"] + "/pid"
    if os.path.exists(pidfile):
        pids.append(int(open(pidfile).read()))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    proc.wait(timeout=LIMIT)
    deadline = time.time() + LIMIT
    while time.time() < deadline and running(pids[-1]):
        time.sleep(0.05)


def run_row(server, tags, args, client):
    tmp = setup_tmp()
    env = dict(os.environ, SERVER=server, TMP=tmp, PORT=str(free_port()), PLUGINS=PLUGINS,
               HELPERS=os.path.join(HERE, "helpers"), PYTHON="/usr/bin/python3",
               PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
    env["SERVER_CMD"] = server + " " + args.replace("$TMP", tmp).replace("$PORT", env["PORT"])
    bash = ["bash", "-c"]
    if "captive" in tags:
        r = subprocess.run(bash + [client], env=env, capture_output=True, text=True,
                           timeout=LIMIT, stdin=subprocess.DEVNULL)
        return r.returncode, normalize(r.stdout, env), r.stderr
    if "client" not in tags:
        r = subprocess.run(bash + ['"$SERVER" ' + args], env=env, capture_output=True,
                           text=True, timeout=LIMIT, stdin=subprocess.DEVNULL)
        return r.returncode, normalize(r.stdout, env), r.stderr
    log = open(os.path.join(tmp, "server.log"), "w+")
    proc = subprocess.Popen(bash + ['exec "$SERVER" ' + args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_ready(proc, env, args)
        r = subprocess.run(bash + [client], env=env, capture_output=True, text=True,
                           timeout=LIMIT, stdin=subprocess.DEVNULL)
    finally:
        stop(proc, env)
    log.seek(0)
    return r.returncode, normalize(r.stdout, env), r.stderr + log.read()


rows = parse_table()
if len(rows) < 30:
    fail("the table has %d examples; it must hold at least 30" % len(rows))
is_root = os.geteuid() == 0
vsock_why, vsock_bind_why = vsock_loopback(), vsock_bind()
compared = skipped = 0
for n, tags, args, client, want in rows:
    what = "line %d: %s%s" % (n, args, "  [client: %s]" % client if client != "-" else "")
    why = None
    if "root" in tags and not is_root:
        why = "needs root for -u/-g"
    elif "vsock" in tags and vsock_why:
        why = vsock_why
    elif "vsock-bind" in tags and vsock_bind_why:
        why = vsock_bind_why
    if why:
        print("skip: %s: %s" % (what, why))
        skipped += 1
        continue
    got = run_row(BLKD, tags, args, client)
    new = "new" in tags and re.search(r"--\S+", args).group(0) not in NBDKIT_HELP
    if new:
        rc, out = want.split(":", 1)
        ref = (int(rc), out.replace("\\n", "\n") + "\n", "(the row's WANT)")
        against = "the row's WANT (nbdkit here lacks the option)"
    else:
        ref = run_row(NBDKIT, tags, args, client)
        against = "nbdkit"
    if got[:2] != ref[:2]:
        fail("%s\n  blkd:   exit %d, stdout %r\n  %s: exit %d, stdout %r\n"
             "  blkd stderr: %s\n  nbdkit stderr: %s"
             % (what, got[0], got[1], against, ref[0], ref[1], got[2][-2000:], ref[2][-2000:]))
    ok("%s -> exit %d, %r (same as %s)" % (what, got[0], got[1][:60], against))
    compared += 1

print("%d examples compared, %d skipped" % (compared, skipped))
