"""Shared helpers for the tests/test-core-*.py integration tests.

The server under test is $BLKD (default $TOP/blkd).  With BLKD=/usr/bin/nbdkit
the same tests run against nbdkit; checks that only blkd must pass go through
blkd_only(), which prints a note on nbdkit instead of checking.

Exit status follows tests/run.sh: 0 pass, 77 skip (reason on the last line),
anything else fails.  Every server started here is killed at exit.

check() and check_eq() record a failure and go on, so one run reports every
check that fails; the test exits 1 at the end if any did.  fail() stops at
once, for when going on makes no sense (no server, a broken connection).
"""

import atexit
import errno
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(HERE))
BLKD = os.environ.get("BLKD") or os.path.join(TOP, "blkd")
if os.sep not in BLKD:
    BLKD = shutil.which(BLKD) or BLKD
SERVER_NAME = os.path.basename(BLKD)
IS_NBDKIT = SERVER_NAME == "nbdkit"


def nbdkit_dir(var):
    """nbdkit's plugindir or filterdir, from pkg-config (the path holds the
    architecture's triplet); "" when nbdkit's .pc file is missing."""
    try:
        r = subprocess.run(["pkg-config", "--variable=" + var, "nbdkit"],
                           capture_output=True, text=True)
    except OSError:
        return ""
    return r.stdout.strip()


FILTERDIR = nbdkit_dir("filterdir")
# nbdkit's plugin directory: tests/run.sh's $NBDKIT_PLUGINDIR, else
# pkg-config.
NBDKIT_PLUGINDIR = os.environ.get("NBDKIT_PLUGINDIR") or nbdkit_dir("plugindir")

TMP = tempfile.mkdtemp(prefix="blkd-test.")
_servers = []
_failures = []

# Output must interleave sensibly with the server log the runner captures.
sys.stdout.reconfigure(line_buffering=True)


def skip(reason):
    print("skipped: %s" % reason, flush=True)
    sys.exit(77)


def fail(msg):
    for s in _servers:
        s.dump_log()
    print("FAIL: %s" % msg, file=sys.stderr, flush=True)
    sys.exit(1)


def ok(what):
    print("ok: %s" % what)


def note(what):
    print("note: %s" % what)


def check_failed(msg):
    """Record a failed check and carry on; the test exits 1 at its end.
    The servers' logs are shown once, at the first failure."""
    if not _failures:
        for s in _servers:
            s.dump_log()
    _failures.append(msg)
    print("FAIL: %s" % msg, file=sys.stderr, flush=True)


def check(cond, what, detail=""):
    if not cond:
        check_failed(what + (": " + detail if detail else ""))
        return False
    ok(what)
    return True


def check_eq(actual, expected, what):
    if actual != expected:
        check_failed("%s: expected %r, got %r" % (what, expected, actual))
        return False
    ok("%s = %r" % (what, expected) if len(repr(expected)) < 80 else what)
    return True


def blkd_only(what, why):
    """True when the check must be made (server is blkd); on nbdkit print
    which check is left out and why."""
    if IS_NBDKIT:
        note("blkd-only check not made on nbdkit: %s (%s)" % (what, why))
        return False
    return True


def metric_value(fams, family, name, **labels):
    """The value of sample NAME with these labels in a parsed Prometheus
    family dict (family name -> prometheus_client Metric), or None."""
    fam = fams.get(family)
    if fam is None:
        return None
    for s in fam.samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def need_server():
    if not (os.path.isfile(BLKD) and os.access(BLKD, os.X_OK)):
        skip("no server binary at %s (build blkd, or set BLKD=/usr/bin/nbdkit)" % BLKD)


def tls_material():
    """CA, server and client certificates and PSK files in TMP/tls (the
    shell tests' make_tls_material); returns that directory."""
    t = os.path.join(TMP, "tls")
    subprocess.run(["bash", "-c", '. "$1/tests/lib.sh"; . "$1/tests/helpers/tls.sh"; '
                    'make_tls_material "$2"', "_", TOP, t], check=True)
    return t


def need_nbd():
    """Import and return the libnbd python module, or skip."""
    try:
        import nbd
    except ImportError:
        skip("python3-libnbd (the nbd module) is not installed for %s" % sys.executable)
    return nbd


def need_tls13():
    """Import and return the tests' TLS 1.3 record layer (tls13.py), or skip:
    it needs python3-cryptography."""
    try:
        import tls13
    except ImportError:
        skip("python3-cryptography is not installed (make deps)")
    return tls13


def listen_ports(pid):
    """The TCP ports process pid listens on, its first listener first (by
    file descriptor).  From /proc, so it works for any server; tests never
    pick a port themselves (a port picked, released and bound later is a
    race with every other test running at the same time)."""
    fd_of = {}
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]$", link)
            if m:
                fd_of[m.group(1)] = int(fd)
    except OSError:
        return []
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    w = line.split()
                    # local ADDR:PORT (hex), state 0A = LISTEN, inode
                    if w[3] == "0A" and w[9] in fd_of:
                        found.append((fd_of[w[9]], int(w[1].rsplit(":", 1)[1], 16)))
        except OSError:
            pass
    return [port for _, port in sorted(set(found))]


def _opt_value(opts, name):
    """The value of option name in opts (as "--name V" or "--name=V")."""
    opts = list(opts)
    for i, o in enumerate(opts):
        if o == name and i + 1 < len(opts):
            return opts[i + 1]
        if o.startswith(name + "="):
            return o[len(name) + 1:]
    return None


class Server:
    """The server under test, in the foreground (-f), on a TCP port the
    kernel picks (-p 0) or on a Unix socket.  args are the plugin and its
    parameters, opts server options.  With --metrics ADDR:0 in opts,
    metrics_port is the port the endpoint got."""

    def __init__(self, args, unix=False, opts=()):
        need_server()
        self.args = list(args)
        self.unix = unix
        n = len(_servers)
        self.log_path = os.path.join(TMP, "server%d.log" % n)
        self.metrics_port = None
        self._want_metrics = _opt_value(opts, "--metrics") is not None
        if unix:
            self.sock = os.path.join(TMP, "nbd%d.sock" % n)
            self.port = None
            cmd = [BLKD, "-f", "-U", self.sock] + list(opts) + self.args
        else:
            self.sock = None
            self.port = None
            cmd = [BLKD, "-f", "-i", "127.0.0.1", "-p", "0"] + list(opts) + self.args
        self.cmd = cmd
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        _servers.append(self)
        self._wait_ready()
        print("started: %s (pid %d)" % (" ".join(cmd), self.proc.pid))

    def _find_ports(self):
        """True once the ports are known.  blkd prints them in the
        foreground ("serving ... on nbd://HOST:PORT/", "metrics on
        http://HOST:PORT/metrics") -- with --metrics it listens twice, so
        its own words say which is which; nbdkit prints nothing, so /proc."""
        if IS_NBDKIT:
            ports = listen_ports(self.proc.pid)
            if ports:
                self.port = ports[0]
            return self.port is not None
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return False
        m = re.search(r"serving .* on nbds?://\S*:(\d+)/", text)
        if m:
            self.port = int(m.group(1))
        if self._want_metrics:
            m = re.search(r"metrics on http://\S*:(\d+)/metrics", text)
            if m:
                self.metrics_port = int(m.group(1))
            elif self.port is not None:
                return False
        return self.port is not None

    def _wait_ready(self, secs=20):
        deadline = time.time() + secs
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail("server exited with status %d at start-up: %s"
                     % (self.proc.returncode, " ".join(self.cmd)))
            if not self.unix and not self._find_ports():
                time.sleep(0.05)
                continue
            try:
                if self.unix:
                    if os.path.exists(self.sock):
                        s = socket.socket(socket.AF_UNIX)
                        s.connect(self.sock)
                        s.close()
                        return
                else:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=1)
                    s.close()
                    return
            except OSError:
                pass
            time.sleep(0.05)
        fail("server not accepting connections after %ds: %s" % (secs, " ".join(self.cmd)))

    @property
    def uri(self):
        if self.unix:
            return "nbd+unix:///?socket=%s" % self.sock
        return "nbd://127.0.0.1:%d" % self.port

    def uri_for(self, export):
        if self.unix:
            return "nbd+unix:///%s?socket=%s" % (export, self.sock)
        return "nbd://127.0.0.1:%d/%s" % (self.port, export)

    def connect_socket(self, timeout=10):
        if self.unix:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(timeout)
            s.connect(self.sock)
        else:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def alive(self):
        return self.proc.poll() is None

    def check_alive(self, what="server process still running"):
        if not self.alive():
            fail("%s: server exited with status %s" % (what, self.proc.returncode))
        ok(what)

    def dump_log(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace").splitlines()
        except OSError:
            return
        if text:
            print("--- last lines of %s ---" % self.log_path, file=sys.stderr)
            for line in text[-lines:]:
                print("    " + line, file=sys.stderr)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _cleanup():
    for s in _servers:
        try:
            s.stop()
        except Exception:
            pass
    shutil.rmtree(TMP, ignore_errors=True)
    if _failures:
        # Whatever status the script was leaving with, failed checks fail it.
        print("FAIL: %d check(s) failed:" % len(_failures), file=sys.stderr)
        for msg in _failures:
            print("    %s" % msg, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


atexit.register(_cleanup)
# The runner's timeout sends SIGTERM: still kill our servers.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))


def nbd_connect(server, export=None, strict=True):
    """A libnbd handle connected to server (optionally to an export)."""
    nbd = need_nbd()
    h = nbd.NBD()
    if export is not None:
        h.set_export_name(export)
        if server.unix:
            h.connect_unix(server.sock)
        else:
            h.connect_tcp("127.0.0.1", str(server.port))
    else:
        h.connect_uri(server.uri)
    if not strict:
        h.set_strict_mode(0)
    return h


def hammer_reads(handles, per_handle=8, rounds=4):
    """Keep per_handle 4 KiB reads in flight on each libnbd handle, rounds
    times over (offsets 4 KiB, 8 KiB, ...): load for thread-model checks."""
    nbd = need_nbd()
    for _ in range(rounds):
        cookies = []
        for h in handles:
            for i in range(per_handle):
                cookies.append((h, h.aio_pread(nbd.Buffer(4096), 4096 * (i + 1))))
        for h, ck in cookies:
            while not h.aio_command_completed(ck):
                h.poll(-1)


def nbd_errno(exc):
    """errno of an nbd.Error (libnbd gives it as a name or number)."""
    e = exc.errno
    if isinstance(e, str):
        return getattr(errno, e, -1)
    return e


def expect_nbd_error(fn, want, what):
    """fn() must fail with one of the errno values in want (an int or a
    collection); returns the errno it failed with."""
    nbd = need_nbd()
    wants = {want} if isinstance(want, int) else set(want)
    try:
        fn()
    except nbd.Error as e:
        got = nbd_errno(e)
        if got not in wants:
            check_failed("%s: expected %s, got %s (%s)" % (
                what, "/".join(errno.errorcode.get(w, str(w)) for w in sorted(wants)),
                errno.errorcode.get(got, str(got)), e.string))
            return got
        ok("%s fails with %s" % (what, errno.errorcode.get(got, str(got))))
        return got
    check_failed("%s: succeeded but must fail" % what)
    return None


# ---------------------------------------------------------------------------
# The NBD wire protocol by hand (numbers from include/nbd-proto.h).

NBD_MAGIC = 0x4e42444d41474943
NBD_OPTS_MAGIC = 0x49484156454f5054
NBD_REP_MAGIC = 0x3e889045565a9
NBD_REQUEST_MAGIC = 0x25609513
NBD_SIMPLE_REPLY_MAGIC = 0x67446698
NBD_STRUCTURED_REPLY_MAGIC = 0x668e33ef
NBD_EXTENDED_REQUEST_MAGIC = 0x21e41c71
NBD_EXTENDED_REPLY_MAGIC = 0x6e8a278c

NBD_FLAG_FIXED_NEWSTYLE = 1 << 0
NBD_FLAG_NO_ZEROES = 1 << 1

NBD_OPT_EXPORT_NAME = 1
NBD_OPT_ABORT = 2
NBD_OPT_LIST = 3
NBD_OPT_STARTTLS = 5
NBD_OPT_INFO = 6
NBD_OPT_GO = 7
NBD_OPT_STRUCTURED_REPLY = 8
NBD_OPT_LIST_META_CONTEXT = 9
NBD_OPT_SET_META_CONTEXT = 10
NBD_OPT_EXTENDED_HEADERS = 11

NBD_REP_ACK = 1
NBD_REP_SERVER = 2
NBD_REP_INFO = 3
NBD_REP_META_CONTEXT = 4
NBD_REP_ERR_UNSUP = 0x80000001
NBD_REP_ERR_POLICY = 0x80000002
NBD_REP_ERR_INVALID = 0x80000003
NBD_REP_ERR_UNKNOWN = 0x80000006
NBD_REP_ERR_TLS_REQD = 0x80000005
NBD_REP_ERR_EXT_HEADER_REQD = 0x8000000a

NBD_INFO_EXPORT = 0
NBD_INFO_NAME = 1
NBD_INFO_DESCRIPTION = 2
NBD_INFO_BLOCK_SIZE = 3

NBD_FLAG_HAS_FLAGS = 1 << 0
NBD_FLAG_READ_ONLY = 1 << 1
NBD_FLAG_SEND_FLUSH = 1 << 2
NBD_FLAG_SEND_FUA = 1 << 3
NBD_FLAG_SEND_TRIM = 1 << 5
NBD_FLAG_SEND_WRITE_ZEROES = 1 << 6
NBD_FLAG_SEND_DF = 1 << 7
NBD_FLAG_CAN_MULTI_CONN = 1 << 8
NBD_FLAG_SEND_CACHE = 1 << 10
NBD_FLAG_SEND_FAST_ZERO = 1 << 11

NBD_CMD_READ = 0
NBD_CMD_WRITE = 1
NBD_CMD_DISC = 2
NBD_CMD_FLUSH = 3
NBD_CMD_TRIM = 4
NBD_CMD_CACHE = 5
NBD_CMD_WRITE_ZEROES = 6
NBD_CMD_BLOCK_STATUS = 7

NBD_CMD_FLAG_FUA = 1 << 0
NBD_CMD_FLAG_DF = 1 << 2
NBD_CMD_FLAG_REQ_ONE = 1 << 3
NBD_CMD_FLAG_PAYLOAD_LEN = 1 << 5

NBD_REPLY_FLAG_DONE = 1
NBD_REPLY_TYPE_NONE = 0
NBD_REPLY_TYPE_OFFSET_DATA = 1
NBD_REPLY_TYPE_OFFSET_HOLE = 2
NBD_REPLY_TYPE_BLOCK_STATUS = 5
NBD_REPLY_TYPE_BLOCK_STATUS_EXT = 6
NBD_REPLY_TYPE_ERROR = (1 << 15) + 1
NBD_REPLY_TYPE_ERROR_OFFSET = (1 << 15) + 2

NBD_EPERM = 1
NBD_EIO = 5
NBD_EINVAL = 22
NBD_ENOSPC = 28
NBD_EOVERFLOW = 75
NBD_ENOTSUP = 95


class ProtocolError(Exception):
    pass


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def peer_closed(sock, timeout=5.0):
    """True when the peer closes (EOF or reset) within timeout with no more
    data; False if data arrives or the connection stays open."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return data == b""


class RawClient:
    """A hand-driven NBD client: handshake options and transmission requests
    sent byte by byte, so tests see exactly what the server answers."""

    def __init__(self, server, timeout=10):
        self.sock = server.connect_socket(timeout)
        self.structured = False
        self.extended = False      # 32-byte requests and replies once negotiated
        self.server_flags = None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def recv(self, n):
        return recv_exact(self.sock, n)

    # -- handshake ---------------------------------------------------------
    def greeting(self):
        magic, opts_magic, flags = struct.unpack(">QQH", self.recv(18))
        if magic != NBD_MAGIC:
            raise ProtocolError("bad greeting magic %#x" % magic)
        if opts_magic != NBD_OPTS_MAGIC:
            raise ProtocolError("not newstyle: second magic %#x" % opts_magic)
        self.server_flags = flags
        return flags

    def client_flags(self, flags=NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES):
        self.client_flag_bits = flags
        self.sock.sendall(struct.pack(">I", flags))

    def start(self):
        """Greeting and client flags (fixed newstyle, no zeroes)."""
        self.greeting()
        self.client_flags()

    def send_opt(self, opt, data=b""):
        self.sock.sendall(struct.pack(">QII", NBD_OPTS_MAGIC, opt, len(data)) + data)

    def recv_opt_reply(self):
        magic, opt, rtype, length = struct.unpack(">QIII", self.recv(20))
        if magic != NBD_REP_MAGIC:
            raise ProtocolError("bad option reply magic %#x" % magic)
        data = self.recv(length) if length else b""
        return opt, rtype, data

    def opt_replies(self, opt, data=b""):
        """Send an option, collect replies up to the final one (ACK or an
        error); returns (list of (type, data) before it, final type, data)."""
        self.send_opt(opt, data)
        infos = []
        while True:
            ropt, rtype, rdata = self.recv_opt_reply()
            if ropt != opt:
                raise ProtocolError("reply for option %d, expected %d" % (ropt, opt))
            if rtype == NBD_REP_ACK or rtype & 0x80000000:
                return infos, rtype, rdata
            infos.append((rtype, rdata))

    def structured_reply(self):
        _, rtype, _ = self.opt_replies(NBD_OPT_STRUCTURED_REPLY)
        if rtype == NBD_REP_ACK:
            self.structured = True
        return rtype

    def extended_headers(self, data=b""):
        _, rtype, _ = self.opt_replies(NBD_OPT_EXTENDED_HEADERS, data)
        if rtype == NBD_REP_ACK:
            self.extended = self.structured = True
        return rtype

    @staticmethod
    def info_go_payload(name=b"", infos=()):
        return (struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos))
                + b"".join(struct.pack(">H", i) for i in infos))

    def go(self, name=b"", infos=(), opt=NBD_OPT_GO):
        """NBD_OPT_GO (or INFO): returns (final reply type, {info type: data})."""
        replies, rtype, rdata = self.opt_replies(opt, self.info_go_payload(name, infos))
        got = {}
        for t, d in replies:
            if t != NBD_REP_INFO:
                raise ProtocolError("unexpected reply type %d to GO/INFO" % t)
            itype = struct.unpack(">H", d[:2])[0]
            got[itype] = d[2:]
        if rtype == NBD_REP_ACK and opt == NBD_OPT_GO:
            size, flags = struct.unpack(">QH", got[NBD_INFO_EXPORT])
            self.size, self.eflags = size, flags
        return rtype, got

    def export_name(self, name=b""):
        """Old-style end of negotiation: no reply header, just size, flags
        and (without NO_ZEROES) 124 zero bytes."""
        self.send_opt(NBD_OPT_EXPORT_NAME, name)
        self.size, self.eflags = struct.unpack(">QH", self.recv(10))
        if not (self.client_flag_bits & NBD_FLAG_NO_ZEROES):
            pad = self.recv(124)
            if pad != bytes(124):
                raise ProtocolError("EXPORT_NAME padding is not 124 zero bytes")
        return self.size, self.eflags

    def set_meta_context(self, name=b"", contexts=(b"base:allocation",),
                         opt=NBD_OPT_SET_META_CONTEXT):
        payload = struct.pack(">I", len(name)) + name + struct.pack(">I", len(contexts))
        for c in contexts:
            payload += struct.pack(">I", len(c)) + c
        replies, rtype, rdata = self.opt_replies(opt, payload)
        ctx = []
        for t, d in replies:
            if t != NBD_REP_META_CONTEXT:
                raise ProtocolError("unexpected reply type %d to META_CONTEXT" % t)
            ctx.append((struct.unpack(">I", d[:4])[0], d[4:]))
        return rtype, ctx

    def handshake(self, structured=True, meta=False, name=b"", extended=False):
        """Whole handshake up to transmission via GO."""
        self.start()
        if extended:
            if self.extended_headers() != NBD_REP_ACK:
                raise ProtocolError("EXTENDED_HEADERS refused")
        elif structured:
            if self.structured_reply() != NBD_REP_ACK:
                raise ProtocolError("STRUCTURED_REPLY refused")
        if meta:
            rtype, ctx = self.set_meta_context(name)
            if rtype != NBD_REP_ACK or len(ctx) != 1:
                raise ProtocolError("SET_META_CONTEXT failed")
            self.meta_id = ctx[0][0]
        rtype, _ = self.go(name)
        if rtype != NBD_REP_ACK:
            raise ProtocolError("GO failed with %#x" % rtype)
        return self.size, self.eflags

    # -- transmission ------------------------------------------------------
    @staticmethod
    def request(cmd, offset=0, length=0, cookie=1, flags=0, magic=NBD_REQUEST_MAGIC):
        return struct.pack(">IHHQQI", magic, flags, cmd, cookie, offset, length)

    @staticmethod
    def ext_request(cmd, offset=0, length=0, cookie=1, flags=0,
                    magic=NBD_EXTENDED_REQUEST_MAGIC):
        return struct.pack(">IHHQQQ", magic, flags, cmd, cookie, offset, length)

    def send_request(self, cmd, offset=0, length=0, cookie=1, flags=0, payload=b""):
        """Compact or extended, as negotiated; an extended WRITE carries
        NBD_CMD_FLAG_PAYLOAD_LEN as proto.md requires."""
        if self.extended:
            if cmd == NBD_CMD_WRITE:
                flags |= NBD_CMD_FLAG_PAYLOAD_LEN
            hdr = self.ext_request(cmd, offset, length, cookie, flags)
        else:
            hdr = self.request(cmd, offset, length, cookie, flags)
        self.sock.sendall(hdr + payload)

    def recv_reply(self, read_len=0):
        """One whole reply.  Returns (cookie, error, chunks, data) where
        chunks lists (type, flags, payload) for structured replies and data
        is the payload of a simple read reply (read_len bytes on success)."""
        magic = struct.unpack(">I", self.recv(4))[0]
        if magic == NBD_EXTENDED_REPLY_MAGIC:
            return self._recv_ext_reply()
        if magic == NBD_SIMPLE_REPLY_MAGIC:
            error, cookie = struct.unpack(">IQ", self.recv(12))
            data = self.recv(read_len) if (read_len and error == 0) else b""
            return cookie, error, None, data
        if magic != NBD_STRUCTURED_REPLY_MAGIC:
            raise ProtocolError("bad reply magic %#x" % magic)
        chunks, error = [], 0
        while True:
            flags, ctype, cookie, length = struct.unpack(">HHQI", self.recv(16))
            payload = self.recv(length) if length else b""
            chunks.append((ctype, flags, payload))
            if ctype & 0x8000:
                error = struct.unpack(">I", payload[:4])[0]
            if flags & NBD_REPLY_FLAG_DONE:
                return cookie, error, chunks, b""
            magic = struct.unpack(">I", self.recv(4))[0]
            if magic != NBD_STRUCTURED_REPLY_MAGIC:
                raise ProtocolError("bad chunk magic %#x" % magic)

    def _recv_ext_reply(self):
        """The rest of an extended reply whose first magic was read: chunks
        as recv_reply returns them; self.reply_offsets lists each chunk
        header's offset field (it must echo the request's)."""
        chunks, error = [], 0
        self.reply_offsets = []
        while True:
            flags, ctype, cookie, offset, length = struct.unpack(">HHQQQ", self.recv(28))
            if length > 1 << 32:
                raise ProtocolError("extended reply length %d" % length)
            payload = self.recv(length) if length else b""
            chunks.append((ctype, flags, payload))
            self.reply_offsets.append(offset)
            if ctype & 0x8000:
                error = struct.unpack(">I", payload[:4])[0]
            if flags & NBD_REPLY_FLAG_DONE:
                return cookie, error, chunks, b""
            magic = struct.unpack(">I", self.recv(4))[0]
            if magic != NBD_EXTENDED_REPLY_MAGIC:
                raise ProtocolError("bad extended chunk magic %#x" % magic)

    def disconnect(self):
        try:
            self.send_request(NBD_CMD_DISC, cookie=0xd15c)
        except OSError:
            pass
        self.close()


def read_via_chunks(chunks, offset, length):
    """Reassemble a structured read reply; returns the bytes (holes as
    zeros) and the list of chunk types, and checks the chunks tile the
    request exactly."""
    buf = bytearray(length)
    covered = []
    types = []
    for ctype, _flags, payload in chunks:
        types.append(ctype)
        if ctype == NBD_REPLY_TYPE_OFFSET_DATA:
            off = struct.unpack(">Q", payload[:8])[0] - offset
            data = payload[8:]
            buf[off:off + len(data)] = data
            covered.append((off, len(data)))
        elif ctype == NBD_REPLY_TYPE_OFFSET_HOLE:
            hoff, hlen = struct.unpack(">QI", payload[:12])
            covered.append((hoff - offset, hlen))
        elif ctype == NBD_REPLY_TYPE_NONE:
            pass
        else:
            raise ProtocolError("unexpected chunk type %d in read reply" % ctype)
    covered.sort()
    pos = 0
    for off, n in covered:
        if off != pos:
            raise ProtocolError("read chunks leave a gap or overlap at %d" % (offset + pos))
        pos += n
    if pos != length:
        raise ProtocolError("read chunks cover %d of %d bytes" % (pos, length))
    return bytes(buf), types


def strace_attach(srv, trace, calls, inject=None):
    """strace -f on the running server, tracing `calls` (e.g.
    "sendmsg") into the file `trace`, and failing the calls that the
    strace `inject` expression names (e.g. "setsockopt:error=ENOBUFS:when=2");
    returns the strace process once it has attached, or stops the server
    and skips where strace cannot attach (a container without ptrace)."""
    st = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=" + calls, "-o", trace]
                          + (["-e", "inject=" + inject] if inject else [])
                          + ["-p", str(srv.proc.pid)])
    for _ in range(100):                 # attached once it has written the file
        if os.path.exists(trace):
            break
        time.sleep(0.1)
    time.sleep(1)
    if st.poll() is not None:
        srv.stop()
        skip("strace cannot attach here")
    return st
