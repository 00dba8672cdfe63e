"""The real node's cluster DNS, the least a training job needs:
``<service>.<namespace>.svc.<domain>`` answers the ready addresses of the service's
EndpointSlices (the training operator's headless ``<job>-master-0`` service: MASTER_ADDR), read
from the API server at each query. Every other name is NXDOMAIN (no upstream: these pods reach
nothing outside); AAAA is an empty answer.

``python -m devcluster.nodedns --listen IP --server URL --ca F --cert F --key F``: UDP on
``IP:53``, started and stopped by PID with the real node (devcluster/realnode.py).
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import struct
import sys
import urllib.parse
import urllib.request

TTL = 2
A, AAAA = 1, 28


def _question(packet: bytes) -> tuple[str, int, int]:
    """The query's name, type, and the offset just past its question."""
    labels, i = [], 12
    while packet[i]:
        length = packet[i]
        labels.append(packet[i + 1 : i + 1 + length].decode("ascii", "replace"))
        i += 1 + length
    qtype = struct.unpack("!H", packet[i + 1 : i + 3])[0]
    return ".".join(labels).lower(), qtype, i + 5


def answer(packet: bytes, lookup) -> bytes:
    """The reply to one query; ``lookup(name)`` gives its IPv4 addresses, or None (NXDOMAIN)."""
    ident, flags = struct.unpack("!HH", packet[:4])
    name, qtype, end = _question(packet)
    ips = lookup(name)
    rcode = 3 if ips is None else 0
    records = [ip for ip in (ips or []) if qtype == A]
    header = struct.pack(
        "!HHHHHH", ident, 0x8000 | (flags & 0x0100) | 0x0400 | rcode, 1, len(records), 0, 0
    )
    body = packet[12:end]
    for ip in records:
        body += struct.pack("!HHHIH", 0xC00C, A, 1, TTL, 4) + socket.inet_aton(ip)
    return header + body


class Resolver:
    """Names of the cluster's services, from the API server."""

    def __init__(self, server: str, context: ssl.SSLContext, domain: str = "cluster.local"):
        self.server, self.context, self.domain = server, context, domain

    def __call__(self, name: str) -> list[str] | None:
        suffix = f".svc.{self.domain}"
        if not name.endswith(suffix):
            return None
        parts = name[: -len(suffix)].split(".")
        if len(parts) != 2:
            return None
        service, namespace = parts
        selector = urllib.parse.quote(f"kubernetes.io/service-name={service}")
        url = (
            f"{self.server}/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
            f"?labelSelector={selector}"
        )
        try:
            with urllib.request.urlopen(url, timeout=3, context=self.context) as r:
                slices = json.loads(r.read())["items"]
        except (OSError, ValueError, KeyError):
            return None
        ips = [
            address
            for piece in slices
            for endpoint in piece.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready", True)
            for address in endpoint.get("addresses") or []
        ]
        return ips or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.nodedns")
    parser.add_argument("--listen", required=True)
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--domain", default="cluster.local")
    args = parser.parse_args(argv)
    context = ssl.create_default_context(cafile=args.ca)
    context.load_cert_chain(args.cert, args.key)
    resolve = Resolver(args.server, context, args.domain)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.listen, args.port))
    print(f"nodedns: serving {args.domain} on {args.listen}:{args.port}", flush=True)
    while True:
        packet, peer = sock.recvfrom(1500)
        try:
            reply = answer(packet, resolve)
        except (IndexError, struct.error, UnicodeError):
            continue
        sock.sendto(reply, peer)


if __name__ == "__main__":
    sys.exit(main())
