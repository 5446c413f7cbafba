#!/usr/bin/env python3
"""Sends a corpus of broken DHCP packets to a server, then a good relayed DISCOVER/REQUEST
with option 82, and prints the address the server ACKed. Run inside the client namespace,
acting as a relay at GIADDR (it listens on port 67, where servers answer relays)."""
import random
import socket
import struct
import sys

server, giaddr = sys.argv[1], sys.argv[2]
MAGIC = bytes([99, 130, 83, 99])
MAC = bytes([0x52, 0x54, 0x00, 0xC0, 0xFF, 0xEE])


def packet(opts, op=1, hlen=6, xid=0x1234, chaddr=MAC, gi=giaddr, magic=MAGIC):
    hdr = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", op, 1, hlen, 1, xid, 0, 0,
                      bytes(4), bytes(4), bytes(4), socket.inet_aton(gi),
                      chaddr.ljust(16, b"\0"), bytes(64), bytes(128))
    return hdr + magic + opts


def opt(code, data):
    return bytes([code, len(data)]) + data


discover = opt(53, b"\x01") + opt(93, b"\x00\x00") + opt(60, b"PXEClient:Arch:00000") + b"\xff"
corpus = [
    b"", b"\x01", bytes(239), packet(b"\xff")[:239],
    packet(discover, op=2), packet(discover, hlen=255), packet(discover, hlen=0),
    packet(discover, magic=b"XXXX"),
    packet(opt(53, b"\x01") + opt(94, b"") + b"\xff"),
    packet(opt(53, b"\x01") + opt(94, b"\x01\x02") + b"\xff"),
    packet(opt(53, b"\x01") + opt(94, bytes(10)) + b"\xff"),
    packet(opt(53, b"\x01") + opt(80, b"\x00") + b"\xff"),
    packet(opt(53, b"\x01") + opt(151, b"") + b"\xff"),
    packet(opt(53, b"\x01") + opt(93, b"\x00") + b"\xff"),
    packet(opt(53, b"") + b"\xff"), packet(opt(53, b"\x63") + b"\xff"),
    packet(opt(53, b"\x01") + b"\x0c\xff" + b"abc"),
    packet(opt(53, b"\x01") + opt(82, b"\x01\xff\x00") + b"\xff"),
    packet(opt(53, b"\x03") + opt(50, b"\x01\x02") + b"\xff"),
    packet(opt(53, b"\x01") + b"\x00" * 2000),
    packet(opt(53, b"\x01") + opt(55, bytes(range(255))) + b"\xff"),
]
rng = random.Random(4242)
good = packet(discover)
for _ in range(3000):
    b = bytearray(good)
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    corpus.append(bytes(b[: rng.randint(200, len(b))]))
for _ in range(500):
    corpus.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 600))))

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 67))
s.setblocking(False)
for p in corpus:
    s.sendto(p, (server, 67))
    try:
        while True:
            s.recvfrom(4096)  # the server may answer some of them; drain
    except BlockingIOError:
        pass


def exchange(opts, want_type, xid):
    s.settimeout(3)
    s.sendto(packet(opts, xid=xid), (server, 67))
    while True:
        data, _ = s.recvfrom(4096)
        if len(data) < 240 or struct.unpack("!I", data[4:8])[0] != xid:
            continue
        i, found = 240, {}
        while i < len(data) and data[i] != 255:
            if data[i] == 0:
                i += 1
                continue
            found[data[i]] = data[i + 2:i + 2 + data[i + 1]]
            i += 2 + data[i + 1]
        assert found.get(53) == bytes([want_type]), f"wanted type {want_type}, got {found.get(53)}"
        assert 82 in found, "option 82 not echoed"
        return socket.inet_ntoa(data[16:20]), found


agent = opt(82, opt(1, b"eth7/1") + opt(2, b"switch-9"))
yiaddr, found = exchange(opt(53, b"\x01") + agent + b"\xff", 2, 0xABC1)
sid = found[54]
yiaddr2, _ = exchange(opt(53, b"\x03") + opt(50, socket.inet_aton(yiaddr)) + opt(54, sid) + agent + b"\xff", 5, 0xABC2)
assert yiaddr == yiaddr2

# Longer than the server reads (4096 bytes): cut short there it would still be a whole
# DISCOVER, with options missing. It must go unanswered.
big = packet(opt(53, b"\x01") + agent + b"\x00" * 4800 + b"\xff", xid=0xABC0)
s.sendto(big, (server, 67))
s.settimeout(2)
try:
    while True:
        data, _ = s.recvfrom(4096)
        assert struct.unpack("!I", data[4:8])[0] != 0xABC0, "a packet cut short was answered"
except socket.timeout:
    pass
print(yiaddr, len(corpus))
