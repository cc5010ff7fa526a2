#!/usr/bin/python3
# The records blkd sends, decrypted by a TLS 1.3 key schedule of our own
# (tests/helpers/tls13.py: HKDF from hmac, AEAD from python3-cryptography),
# not by a TLS library: tests/helpers/tls-keyupdate (an OpenSSL client) records
# every byte it reads from the socket, its key log and the plaintext OpenSSL
# gave it; here the raw bytes are decrypted record by record, in sequence,
# and must give exactly that plaintext (NBD replies carrying known data).
#
# OpenSSL seals the records, but blkd decides what goes into each (small
# pieces gathered into one, large spans written in place), collects them
# for one send(2) (collect_bio) and starts its own key updates: this
# checks that what reaches the socket is one exact sequence of records,
# in order, under the key schedule a client expects.
#
# Matrix: AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305 x the client asking
# for key updates x the server updating its key every few records
# (BLKD_TLS_REKEY_RECORDS, a test-build knob) x max_fragment_length 512.
# Every session ends with the server's close_notify: it must decrypt in
# sequence too.
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import *  # noqa: E402,F401,F403

need_tls13()
from tls13 import (SUITES, HS_FINISHED, HS_KEY_UPDATE, HS_NEW_SESSION_TICKET,  # noqa: E402
                   Direction, read_keylog)

if IS_NBDKIT:
    skip("blkd's record batching and key update policy")
need_server()
KU = os.path.join(TOP, "tests", "helpers", "tls-keyupdate")
if not os.access(KU, os.X_OK):
    fail("no %s (make check builds it)" % KU)

T = tls_material()
CA = os.path.join(T, "client-ca", "ca-cert.pem")


def decrypt_session(prefix, mfl=None):
    """Decrypt PREFIX.raw; returns (application data, stats)."""
    raw = open(prefix + ".raw", "rb").read()
    secrets = read_keylog(prefix + ".keylog")
    records, i = [], 0
    while i < len(raw):
        if len(raw) - i < 5:
            fail("%s: a record header cut short at byte %d" % (prefix, i))
        rtype, length = raw[i], struct.unpack(">H", raw[i + 3:i + 5])[0]
        if length > 16384 + 256 or i + 5 + length > len(raw):
            fail("%s: record at byte %d: length %d" % (prefix, i, length))
        records.append((rtype, raw[i:i + 5], raw[i + 5:i + 5 + length]))
        i += 5 + length

    # ServerHello in clear: the suite.
    rtype, _, sh = records[0]
    check(rtype == 22 and sh[0] == 2, "the first record is a ServerHello")
    sid_len = sh[4 + 2 + 32]
    suite = struct.unpack(">H", sh[4 + 2 + 32 + 1 + sid_len:4 + 2 + 32 + 1 + sid_len + 2])[0]
    check(suite in SUITES, "a suite we know", "0x%04x" % suite)
    d = Direction(suite, secrets["SERVER_HANDSHAKE_TRAFFIC_SECRET"])
    app_phase = False
    stats = {"suite": SUITES[suite][0], "updates": 0, "tickets": 0, "records": 0,
             "alerts": [], "max_content": 0}
    hs_buf, data = b"", bytearray()
    for n, (rtype, header, body) in enumerate(records[1:], 1):
        if rtype == 20 and not app_phase:
            continue                              # middlebox-compatibility CCS
        if rtype != 23:
            fail("record %d is not sealed (outer type %d)" % (n, rtype))
        try:
            ctype, content = d.open(header, body)
        except Exception as e:
            fail("record %d of %d (%s, %s key, sequence %d, %d server key updates so far) "
                 "does not decrypt under our key schedule: %r"
                 % (n, len(records), stats["suite"], "application" if app_phase else
                    "handshake", d.seq, stats["updates"], e))
        if ctype == 23:
            if not app_phase:
                fail("application data before the server's Finished")
            data += content
            stats["records"] += 1
            stats["max_content"] = max(stats["max_content"], len(content))
            continue
        if ctype == 21:
            stats["alerts"].append(tuple(content))
            continue
        if ctype != 22:
            fail("record %d: content type %d" % (n, ctype))
        hs_buf += content
        while len(hs_buf) >= 4:
            mlen = int.from_bytes(hs_buf[1:4], "big")
            if len(hs_buf) < 4 + mlen:
                break
            mtype, msg, hs_buf = hs_buf[0], hs_buf[4:4 + mlen], hs_buf[4 + mlen:]
            if not app_phase:
                if mtype == HS_FINISHED:
                    if hs_buf:
                        fail("the server's Finished does not end its record")
                    d.set(secrets["SERVER_TRAFFIC_SECRET_0"])
                    app_phase = True
            elif mtype == HS_KEY_UPDATE:
                if hs_buf:
                    fail("a KeyUpdate does not end its record")
                d.next()
                stats["updates"] += 1
            elif mtype == HS_NEW_SESSION_TICKET:
                stats["tickets"] += 1
            else:
                fail("unexpected post-handshake message type %d" % mtype)
    check(app_phase, "the handshake finished")
    if mfl:
        check(stats["max_content"] <= mfl, "records within max_fragment_length %d" % mfl,
              "largest %d" % stats["max_content"])
    return bytes(data), stats


def server(rekey=None):
    env = {}
    if rekey:
        env["BLKD_TLS_REKEY_RECORDS"] = str(rekey)
    os.environ.update(env)
    try:
        s = Server(["memory", "8M"], opts=["-v", "--tls=require", "--tls-certificates="
                                           + os.path.join(T, "server")])
    finally:
        for k in env:
            del os.environ[k]
    log = open(s.log_path, "rb").read().decode(errors="replace")
    if rekey and "only test builds" in log:
        skip("%s was built without test hooks (make check, or make TEST_HOOKS=1)" % BLKD)
    return s


def session(s, tag, suite, every, mfl, rounds=6):
    prefix = os.path.join(TMP, tag)
    env = dict(os.environ, TLS_KU_CAPTURE=prefix, TLS_KU_SUITES=SUITES[suite][0])
    if mfl:
        env["TLS_KU_MFL"] = str(mfl)
    r = subprocess.run([KU, str(s.port), CA, str(rounds), str(every)], env=env,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        s.dump_log()
        fail("%s: client failed: %s" % (tag, r.stderr.strip()))
    sent = int(r.stdout.split("sent ")[1].split(",")[0])
    received = int(r.stdout.split("received ")[1])
    data, st = decrypt_session(prefix, mfl)
    plain = open(prefix + ".plain", "rb").read()
    check(data == plain, "%s: decrypted stream equals what OpenSSL returned" % tag,
          "%d bytes decrypted, %d received" % (len(data), len(plain)))
    check(len(plain) >= rounds * 64 * 1024, "%s: the replies carried the data" % tag)
    check(st["suite"] == SUITES[suite][0], "%s: negotiated suite" % tag, st["suite"])
    check(st["alerts"] == [(1, 0)], "%s: the session ends with one close_notify" % tag,
          str(st["alerts"]))
    check(st["updates"] == received, "%s: our count of server KeyUpdates is OpenSSL's" % tag,
          "%d against %d" % (st["updates"], received))
    return sent, st


for rekey in (None, 16):
    print("# server key updates: %s" % ("every %d records" % rekey if rekey else "none"))
    s = server(rekey)
    for suite in SUITES:
        for every in (0, 2):
            for mfl in (None, 512):
                tag = "%s-%s-ku%d-mfl%s" % (rekey or 0, SUITES[suite][0], every, mfl or 0)
                sent, st = session(s, tag, suite, every, mfl)
                if rekey:
                    check(st["updates"] >= st["records"] // rekey,
                          "%s: the server updated its key every %d records" % (tag, rekey),
                          "%d updates for %d records" % (st["updates"], st["records"]))
                else:
                    check(st["updates"] == sent, "%s: one KeyUpdate per request" % tag,
                          "%d for %d" % (st["updates"], sent))
                check(st["tickets"] == 0, "%s: no session tickets" % tag, str(st["tickets"]))
                ok("%s: %d records, %d server key updates, decrypted exactly"
                   % (tag, st["records"], st["updates"]))
    log = open(s.log_path, "rb").read().decode(errors="replace")
    check(log.count("records: sent sealed by OpenSSL,") == len(SUITES) * 4,
          "every session was sealed by OpenSSL")
    s.check_alive()
    s.stop()
