#!/usr/bin/python3
# Raw NBD handshake and transmission checks, byte by byte: fixed newstyle
# with NO_ZEROES, LIST, INFO then GO with INFO_NAME/DESCRIPTION/BLOCK_SIZE,
# unknown options, STRUCTURED_REPLY, meta contexts, STARTTLS without TLS,
# ABORT, EXPORT_NAME (both paddings), a bad request magic and an unknown
# command.  Server: memory plugin, 64 MiB.
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

SIZE = 64 * 1024 * 1024
srv = Server(["memory", "size=64M"])

# --- greeting ---------------------------------------------------------------
print("# greeting: NBDMAGIC IHAVEOPT, FIXED_NEWSTYLE and NO_ZEROES offered")
c = RawClient(srv)
flags = c.greeting()
check(flags & NBD_FLAG_FIXED_NEWSTYLE, "server offers FIXED_NEWSTYLE")
check(flags & NBD_FLAG_NO_ZEROES, "server offers NO_ZEROES")
check(flags & ~3 == 0, "no unknown handshake flags", "flags=%#x" % flags)
c.client_flags(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES)

# --- NBD_OPT_LIST -----------------------------------------------------------
print("# NBD_OPT_LIST: SERVER replies then ACK")
replies, rtype, _ = c.opt_replies(NBD_OPT_LIST)
check_eq(rtype, NBD_REP_ACK, "LIST ends with ACK")
check(len(replies) >= 1, "LIST returns at least one export")
names = []
for t, d in replies:
    check_eq(t, NBD_REP_SERVER, "LIST reply type")
    n = struct.unpack(">I", d[:4])[0]
    check(4 + n <= len(d), "REP_SERVER name length fits the reply")
    names.append(d[4:4 + n])
print("  exports listed: %r" % names)

# --- unknown option keeps the connection in sync ---------------------------
print("# unknown option 0x1234 with a payload -> ERR_UNSUP, connection stays in sync")
_, rtype, _ = c.opt_replies(0x1234, b"some payload the server must skip")
check_eq(rtype, NBD_REP_ERR_UNSUP, "option 0x1234 answer")

# --- STRUCTURED_REPLY ---------------------------------------------------------
print("# NBD_OPT_STRUCTURED_REPLY -> ACK")
check_eq(c.structured_reply(), NBD_REP_ACK, "STRUCTURED_REPLY answer")

print("# STRUCTURED_REPLY with a payload is invalid -> ERR_INVALID")
_, rtype, _ = c.opt_replies(NBD_OPT_STRUCTURED_REPLY, b"xx")
check_eq(rtype, NBD_REP_ERR_INVALID, "STRUCTURED_REPLY with payload answer")

# --- meta contexts ------------------------------------------------------------
print("# LIST_META_CONTEXT base:allocation")
rtype, ctx = c.set_meta_context(b"", (b"base:allocation",), opt=NBD_OPT_LIST_META_CONTEXT)
check_eq(rtype, NBD_REP_ACK, "LIST_META_CONTEXT ends with ACK")
check_eq([n for _, n in ctx], [b"base:allocation"], "LIST_META_CONTEXT contexts")

print("# LIST_META_CONTEXT with no queries lists what the server has")
rtype, ctx = c.set_meta_context(b"", (), opt=NBD_OPT_LIST_META_CONTEXT)
check_eq(rtype, NBD_REP_ACK, "LIST_META_CONTEXT (all) ends with ACK")
check(b"base:allocation" in [n for _, n in ctx], "base:allocation is among all contexts")

# --- STARTTLS when TLS is not configured --------------------------------------
print("# STARTTLS without TLS configured -> ERR_POLICY (proto.md NOTLS mode allows POLICY or UNSUP)")
_, rtype, _ = c.opt_replies(NBD_OPT_STARTTLS)
check(rtype in (NBD_REP_ERR_POLICY, NBD_REP_ERR_UNSUP),
      "STARTTLS is refused with ERR_POLICY or ERR_UNSUP", "got %#x" % rtype)
if blkd_only("STARTTLS refusal is ERR_POLICY exactly", "nbdkit's answer is only noted"):
    check_eq(rtype, NBD_REP_ERR_POLICY, "STARTTLS answer")
else:
    note("nbdkit answered STARTTLS with %#x" % rtype)

# --- INFO then GO ---------------------------------------------------------------
want = (NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE)
print("# NBD_OPT_INFO with INFO_NAME/DESCRIPTION/BLOCK_SIZE requests")
rtype, info = c.go(b"", want, opt=NBD_OPT_INFO)
check_eq(rtype, NBD_REP_ACK, "INFO ends with ACK")
check(NBD_INFO_EXPORT in info, "INFO sends INFO_EXPORT")
size, eflags = struct.unpack(">QH", info[NBD_INFO_EXPORT])
check_eq(size, SIZE, "INFO export size")
check(eflags & NBD_FLAG_HAS_FLAGS, "transmission flags have HAS_FLAGS")
check(not eflags & NBD_FLAG_READ_ONLY, "export is writable")
for bit, name in ((NBD_FLAG_SEND_FLUSH, "SEND_FLUSH"), (NBD_FLAG_SEND_FUA, "SEND_FUA"),
                  (NBD_FLAG_SEND_TRIM, "SEND_TRIM"), (NBD_FLAG_SEND_WRITE_ZEROES, "SEND_WRITE_ZEROES"),
                  (NBD_FLAG_SEND_DF, "SEND_DF"), (NBD_FLAG_CAN_MULTI_CONN, "CAN_MULTI_CONN"),
                  (NBD_FLAG_SEND_FAST_ZERO, "SEND_FAST_ZERO")):
    check(eflags & bit, "memory export advertises %s" % name, "eflags=%#x" % eflags)
if NBD_INFO_NAME in info:
    print("  INFO_NAME = %r" % info[NBD_INFO_NAME])
if NBD_INFO_DESCRIPTION in info:
    print("  INFO_DESCRIPTION = %r" % info[NBD_INFO_DESCRIPTION])


def check_block_size(info, what):
    if blkd_only("%s: INFO_BLOCK_SIZE sent, max request 32 MiB" % what,
                 "nbdkit sends it only when the plugin has .block_size"):
        check(NBD_INFO_BLOCK_SIZE in info, "%s sends INFO_BLOCK_SIZE" % what)
    if NBD_INFO_BLOCK_SIZE in info:
        bmin, bpref, bmax = struct.unpack(">III", info[NBD_INFO_BLOCK_SIZE])
        print("  block size min/pref/max = %d/%d/%d" % (bmin, bpref, bmax))
        check(bmin >= 1 and bmin & (bmin - 1) == 0 and bmin <= 65536,
              "minimum block size is a power of 2 up to 64 KiB")
        check(bpref >= max(bmin, 512) and bpref & (bpref - 1) == 0,
              "preferred block size is a power of 2 >= max(min, 512)")
        check(bmax >= bpref, "maximum block size >= preferred")
        if not IS_NBDKIT:
            check_eq(bmax, 32 * 1024 * 1024, "maximum request size")


check_block_size(info, "INFO")

print("# INFO on a name the server cannot serve is not fatal: the next option works")
# (Servers may serve any name -- nbdkit's memory plugin does -- so only the
# reply framing and the connection's health are checked here.)
rtype, _ = c.go(b"x" * 300, (), opt=NBD_OPT_INFO)
check(rtype == NBD_REP_ACK or rtype & 0x80000000, "INFO on a long name gets ACK or an error")

print("# SET_META_CONTEXT base:allocation plus an unknown one (right before GO: INFO on\n"
      "# another name may reset the selection, as in nbdkit)")
rtype, ctx = c.set_meta_context(b"", (b"base:allocation", b"nosuch:context"))
check_eq(rtype, NBD_REP_ACK, "SET_META_CONTEXT ends with ACK")
check_eq([n for _, n in ctx], [b"base:allocation"], "only base:allocation is selected")
meta_id = ctx[0][0]
print("  base:allocation id = %d" % meta_id)

print("# NBD_OPT_GO")
rtype, info = c.go(b"", want)
check_eq(rtype, NBD_REP_ACK, "GO ends with ACK")
check_eq(c.size, SIZE, "GO export size")
check_block_size(info, "GO")
c.structured = True

# --- transmission on the negotiated connection --------------------------------
print("# write then structured read, exact data")
payload = bytes(range(256)) * 16
c.send_request(NBD_CMD_WRITE, 8192, len(payload), cookie=11, payload=payload)
cookie, err, _, _ = c.recv_reply()
check_eq((cookie, err), (11, 0), "WRITE reply (cookie, error)")
c.send_request(NBD_CMD_READ, 8192, len(payload), cookie=12)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err), (12, 0), "READ reply (cookie, error)")
check(chunks is not None, "READ reply is structured after STRUCTURED_REPLY")
data, _ = read_via_chunks(chunks, 8192, len(payload))
check(data == payload, "READ returns what was written")

print("# BLOCK_STATUS for base:allocation uses the negotiated id")
c.send_request(NBD_CMD_BLOCK_STATUS, 0, 1 << 20, cookie=13, flags=NBD_CMD_FLAG_REQ_ONE)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err), (13, 0), "BLOCK_STATUS reply (cookie, error)")
bs = [p for t, _, p in chunks if t == NBD_REPLY_TYPE_BLOCK_STATUS]
check_eq(len(bs), 1, "number of BLOCK_STATUS chunks")
check_eq(struct.unpack(">I", bs[0][:4])[0], meta_id, "BLOCK_STATUS context id")
check_eq((len(bs[0]) - 4) // 8, 1, "descriptors with REQ_ONE")
elen, estate = struct.unpack(">II", bs[0][4:12])
check_eq(estate & 3, 0, "first extent (written data) state")
check(0 < elen <= 1 << 20, "extent length within the request", "len=%d" % elen)

print("# unknown command type 9 -> EINVAL, connection stays usable")
c.send_request(9, 0, 512, cookie=14)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err), (14, NBD_EINVAL), "command 9 reply (cookie, error)")
c.send_request(NBD_CMD_READ, 8192, 16, cookie=15)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err), (15, 0), "READ after command 9")
check(read_via_chunks(chunks, 8192, 16)[0] == payload[:16], "READ after command 9 returns the data")

print("# NBD_CMD_DISC closes the connection")
c.send_request(NBD_CMD_DISC, cookie=16)
check(peer_closed(c.sock), "server closes after DISC")
c.close()

# --- simple replies without STRUCTURED_REPLY ------------------------------------
print("# without STRUCTURED_REPLY: simple replies; unknown command -> EINVAL simple error")
c = RawClient(srv)
c.handshake(structured=False)
c.send_request(NBD_CMD_READ, 8192, len(payload), cookie=21)
cookie, err, chunks, data = c.recv_reply(len(payload))
check(chunks is None, "READ reply is simple")
check_eq((cookie, err), (21, 0), "simple READ reply (cookie, error)")
check(data == payload, "simple READ returns the data")
c.send_request(9, 0, 512, cookie=22)
cookie, err, chunks, _ = c.recv_reply()
check(chunks is None, "command 9 reply is simple")
check_eq((cookie, err), (22, NBD_EINVAL), "command 9 simple reply (cookie, error)")
c.send_request(NBD_CMD_FLUSH, cookie=23)
check_eq(c.recv_reply()[:2], (23, 0), "FLUSH after command 9")
c.disconnect()

# --- ABORT ----------------------------------------------------------------------
print("# NBD_OPT_ABORT -> ACK (or plain close) and the server closes")
c = RawClient(srv)
c.start()
c.send_opt(NBD_OPT_ABORT)
try:
    _, rtype, _ = c.recv_opt_reply()
    check_eq(rtype, NBD_REP_ACK, "ABORT answer")
except EOFError:
    # proto.md: the server SHOULD send ACK, the client must cope with a close.
    if blkd_only("ABORT is acknowledged", "nbdkit closed without a reply"):
        fail("server closed on ABORT without sending ACK")
check(peer_closed(c.sock), "server closes after ABORT")
c.close()

# --- EXPORT_NAME, the old-style ending --------------------------------------------
print("# EXPORT_NAME with NO_ZEROES: size + flags, no padding")
c = RawClient(srv)
c.start()
size, eflags = c.export_name(b"")
check_eq(size, SIZE, "EXPORT_NAME size")
check(eflags & NBD_FLAG_HAS_FLAGS, "EXPORT_NAME transmission flags have HAS_FLAGS")
c.send_request(NBD_CMD_READ, 8192, 16, cookie=31)
cookie, err, chunks, data = c.recv_reply(16)
check(chunks is None, "no structured replies unless negotiated")
check_eq((cookie, err, data), (31, 0, payload[:16]), "READ after EXPORT_NAME")
c.disconnect()

print("# EXPORT_NAME without NO_ZEROES: 124 zero bytes of padding")
c = RawClient(srv)
c.greeting()
c.client_flags(NBD_FLAG_FIXED_NEWSTYLE)
size, eflags = c.export_name(b"")       # raises unless exactly 124 zeroes follow
check_eq(size, SIZE, "EXPORT_NAME size (with padding)")
c.send_request(NBD_CMD_READ, 8192, 16, cookie=32)
check_eq(c.recv_reply(16)[3], payload[:16], "READ right after the padding")
c.disconnect()

# --- a bad request magic ------------------------------------------------------------
print("# bad request magic in transmission -> server closes that connection")
c = RawClient(srv)
c.handshake(structured=True)
c.sock.sendall(RawClient.request(NBD_CMD_READ, 0, 512, cookie=41, magic=0xdeadbeef))
closed = peer_closed(c.sock, timeout=5)
check(closed, "server hangs up on a bad request magic")
c.close()
srv.check_alive("server still running after the bad magic")

print("# a new client works afterwards")
c = RawClient(srv)
c.handshake(structured=True)
c.send_request(NBD_CMD_READ, 8192, len(payload), cookie=42)
cookie, err, chunks, _ = c.recv_reply()
check_eq((cookie, err), (42, 0), "READ on a new connection")
check(read_via_chunks(chunks, 8192, len(payload))[0] == payload, "new connection reads the data")
c.disconnect()

print("# GO on an option stream cut short: server survives")
c = RawClient(srv)
c.start()
c.sock.sendall(struct.pack(">QII", NBD_OPTS_MAGIC, NBD_OPT_GO, 100) + b"\0\0")
c.close()
c = RawClient(srv)
c.handshake()
c.disconnect()
srv.check_alive()
print("all handshake checks passed")
