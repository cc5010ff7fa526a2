# A TLS 1.3 record layer of our own for tests (RFC 8446 5.2, 7.1-7.3):
# HKDF from hmac, AEAD from python3-cryptography, no TLS library.  Tests
# use it to check what blkd seals and to seal records a library would
# never write (a handshake message split across records).
import hashlib
import hmac
import ssl
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

# suite: (OpenSSL name, hash, key length, AEAD)
SUITES = {
    0x1301: ("TLS_AES_128_GCM_SHA256", hashlib.sha256, 16, AESGCM),
    0x1302: ("TLS_AES_256_GCM_SHA384", hashlib.sha384, 32, AESGCM),
    0x1303: ("TLS_CHACHA20_POLY1305_SHA256", hashlib.sha256, 32, ChaCha20Poly1305),
}
SUITE_BY_NAME = {v[0]: k for k, v in SUITES.items()}
HS_FINISHED, HS_KEY_UPDATE, HS_NEW_SESSION_TICKET = 20, 24, 4
CT_ALERT, CT_HANDSHAKE, CT_APPLICATION_DATA = 21, 22, 23


def expand_label(hashmod, secret, label, length):
    """HKDF-Expand-Label(secret, label, "", length), RFC 8446 7.1."""
    full = b"tls13 " + label
    info = struct.pack(">HB", length, len(full)) + full + b"\x00"
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(secret, block + info + bytes([i]), hashmod).digest()
        out += block
        i += 1
    return out[:length]


class Direction:
    """One sending direction: traffic secret, key, IV, sequence number."""

    def __init__(self, suite, secret, seq=0):
        self.name, self.hash, self.keylen, self.aead = SUITES[suite]
        self.set(secret)
        self.seq = seq

    def set(self, secret):
        self.secret = secret
        self.cipher = self.aead(expand_label(self.hash, secret, b"key", self.keylen))
        self.iv = expand_label(self.hash, secret, b"iv", 12)
        self.seq = 0

    def next(self):
        """The key after a KeyUpdate (RFC 8446 7.2)."""
        self.set(expand_label(self.hash, self.secret, b"traffic upd",
                              self.hash().digest_size))

    def _nonce(self):
        return bytes(a ^ b for a, b in zip(self.iv, self.seq.to_bytes(12, "big")))

    def open(self, header, body):
        """Decrypt one record: (content type, content); raises on a bad tag."""
        inner = self.cipher.decrypt(self._nonce(), body, header)
        self.seq += 1
        inner = inner.rstrip(b"\x00")
        if not inner:
            raise ValueError("record with no content type")
        return inner[-1], inner[:-1]

    def seal(self, ctype, content):
        """One whole record (header and sealed body) carrying content."""
        inner = content + bytes([ctype])
        header = struct.pack(">BHH", CT_APPLICATION_DATA, 0x0303, len(inner) + 16)
        body = self.cipher.encrypt(self._nonce(), inner, header)
        self.seq += 1
        return header + body


def read_keylog(path):
    """{label: secret} from an SSLKEYLOGFILE with one session in it."""
    secrets = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            label, _, secret = line.split()
            secrets[label] = bytes.fromhex(secret)
    return secrets


class BioClient:
    """A TLS 1.3 client whose handshake and reading are Python's ssl (over
    memory BIOs on a plain socket), while the records it writes are
    counted: a test can then seal records of its own in sequence behind
    them with client_direction().  Socket-like enough for RawClient
    (sendall, recv, settimeout, close, fileno)."""

    def __init__(self, sock, ctx, keylog):
        ctx.keylog_filename = keylog
        self.raw, self.keylog = sock, keylog
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inc, self.out, server_hostname="localhost")
        self.app_records = None          # counted once the handshake is done
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
        self._flush()                    # our Finished, under handshake keys
        self.app_records = 0

    def _flush(self):
        data = self.out.read()
        if not data:
            return
        if self.app_records is not None:
            i = 0
            while i < len(data):         # OpenSSL writes whole records
                length = struct.unpack(">H", data[i + 3:i + 5])[0]
                self.app_records += 1
                i += 5 + length
        self.raw.sendall(data)

    def _fill(self):
        d = self.raw.recv(65536)
        if not d:
            raise ConnectionResetError("server closed the connection")
        self.inc.write(d)

    def sendall(self, data):
        self.obj.write(data)
        self._flush()

    def recv(self, n):
        while True:
            try:
                return self.obj.read(n)
            except ssl.SSLWantReadError:
                self._fill()
            except ssl.SSLZeroReturnError:
                return b""

    def settimeout(self, t):
        self.raw.settimeout(t)

    def fileno(self):
        return self.raw.fileno()

    def close(self):
        self.raw.close()

    def client_direction(self):
        """Our sending direction, in sequence after what ssl wrote."""
        suite = SUITE_BY_NAME[self.obj.cipher()[0]]
        d = Direction(suite, read_keylog(self.keylog)["CLIENT_TRAFFIC_SECRET_0"])
        d.seq = self.app_records
        return d
