"""bench/dns.sh's driver, run inside the client namespace: it fills the appliance (machines,
a role spec with DNS ports, instances), waits for the zone, writes the query file, and
measures how soon a change is answered. Standard library only.

  python3 bench/dns.py fill URL MACHINES SERVICES PER_SERVICE
  python3 bench/dns.py queries OUT MACHINES SERVICES COUNT
  python3 bench/dns.py updates URL DNS_IP CHANGES
"""

import json
import random
import socket
import struct
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ZONE = "paddock.internal"


def mac(i):
    return "52:54:0d:%02x:%02x:%02x" % (i >> 16 & 255, i >> 8 & 255, i & 255)


def call(url, path, body):
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    for attempt in range(5):
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raise SystemExit(f"{path} {body}: {e.code} {e.read()[:300]!r}")
        except OSError:
            # A connection reset under load: try again.
            time.sleep(0.2 * (attempt + 1))
    raise SystemExit(f"{path}: no answer after 5 tries")


def fill(url, machines, services, per):
    t0 = time.time()
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda i: call(url, "/api/v1/nodes", {"macs": [mac(i)], "name": f"m{i:05d}"}),
                range(machines),
            )
        )
    t1 = time.time()
    print(f"# enrolled {machines} machines in {t1 - t0:.1f} s", file=sys.stderr)
    roles = []
    for s in range(services):
        roles.append(
            f'[roles.svc{s:04d}]\nstart = {{ hook = "svc.sh" }}\nstop = {{ hook = "svc.sh" }}\n'
            f"dns = {{ ports = [{{ port = {8000 + s % 1000}, priority = 10, weight = 5 }}] }}\n"
        )
    call(url, "/api/v1/spec", {"file": "spec/bench.toml", "text": "".join(roles)})
    regs = [
        {
            "role": f"svc{s:04d}",
            "instance": f"svc{s:04d}-{k}",
            "host": f"m{(s * per + k) % machines:05d}",
            "ttl_secs": 3600,
        }
        for s in range(services)
        for k in range(per)
    ]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda r: call(url, "/api/v1/census/register", r), regs))
    print(
        f"# {services} services with {per} instances each registered in {time.time() - t1:.1f} s",
        file=sys.stderr,
    )


def queries(out, machines, services, count):
    rnd = random.Random(7)
    with open(out, "w") as f:
        for _ in range(count):
            r = rnd.random()
            if r < 0.6:
                f.write(f"m{rnd.randrange(machines):05d}.{ZONE} A\n")
            elif r < 0.8:
                f.write(f"_svc{rnd.randrange(services):04d}._tcp.{ZONE} SRV\n")
            elif r < 0.9:
                f.write(f"svc{rnd.randrange(services):04d}.svc.{ZONE} A\n")
            else:
                f.write(f"nobody{rnd.randrange(1000)}.{ZONE} A\n")


def ask(sock, server, name, qid):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    sock.sendto(q, (server, 53))
    while True:
        data, _ = sock.recvfrom(4096)
        rid, flags, _, ancount = struct.unpack(">HHHH", data[:8])
        if rid == qid:
            return flags & 0xF, ancount


def updates(url, server, changes):
    """Registers and revokes instance `probe` of svc0000 by turns: each a hard change that
    DNS must show at once. The time from the API's answer to the first DNS answer that shows
    the change, per change."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(2)
    name = f"probe.inst.{ZONE}"
    waits = []
    lease = None
    for i in range(changes):
        if lease is None:
            r = call(url, "/api/v1/census/register",
                     {"role": "svc0000", "instance": "probe", "host": "m00000", "ttl_secs": 3600})
            lease, want = r["lease"], lambda rc, an: rc == 0 and an > 0
        else:
            call(url, "/api/v1/census/revoke", {"lease": lease})
            lease, want = None, lambda rc, an: rc == 3
        t0 = time.time()
        qid = 0
        while True:
            qid = (qid + 1) & 0xFFFF
            if want(*ask(sock, server, name, qid)):
                break
            if time.time() - t0 > 10:
                raise SystemExit(f"change {i} not answered within 10 s")
            time.sleep(0.001)
        waits.append((time.time() - t0) * 1000)
    waits.sort()
    p = lambda q: waits[min(len(waits) - 1, int(len(waits) * q))]
    print(f"{p(0.5):.1f} {p(0.99):.1f} {waits[-1]:.1f}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "fill":
        fill(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif cmd == "queries":
        queries(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif cmd == "updates":
        updates(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(__doc__)
