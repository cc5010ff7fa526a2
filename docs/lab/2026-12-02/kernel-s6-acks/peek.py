# Where does a receiver send its pure ACK for 4 x 4124 bytes: on arrival, in the read, or
# (peek) after the reply?  Run in a network namespace with lo at MTU 1500:
#   ip netns exec NS python3 peek.py read|peek RCVBUF ROUNDS
import socket, subprocess, time, re, sys
mode, rb, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rb); ls.bind(("127.0.0.1", 0)); ls.listen(1)
port = ls.getsockname()[1]
c = socket.create_connection(("127.0.0.1", port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s, _ = ls.accept()
def pure():
    out = subprocess.run(["ss", "-tinH", "sport", "= :%d" % port], capture_output=True, text=True).stdout
    m = re.search(r"segs_out:(\d+).*?data_segs_out:(\d+)", out.replace("\n", " "))
    return int(m.group(1)) - int(m.group(2)) if m else 0
ph = {"arrive": 0, "read": 0, "reply": 0, "trunc": 0}
for rnd in range(rounds):
    p0 = pure()
    c.sendall(b"x" * (4 * 4124)); time.sleep(0.003)
    p1 = pure(); ph["arrive"] += p1 - p0
    n = len(s.recv(65536, socket.MSG_PEEK if mode == "peek" else 0))
    p2 = pure(); ph["read"] += p2 - p1
    s.send(b"r" * 64)
    p3 = pure(); ph["reply"] += p3 - p2
    if mode == "peek":
        s.recv_into(bytearray(n), n, socket.MSG_TRUNC)
    p4 = pure(); ph["trunc"] += p4 - p3
    c.recv(64)
print(mode, rb, ph)
