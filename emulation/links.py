"""Emulated network links from published figures: a worker's bandwidth and latency where its
peers sit in the same zone, in another zone of its region, or in another region.

Each preset's bandwidth is one flow's limit on AWS (the ring's hops are single flows), and
its latency one round trip (what a collective waits at least once). Sources, as published:

- bandwidth: Amazon EC2 User Guide, "Amazon EC2 instance network bandwidth": single-flow
  traffic is limited to 5 Gbps outside a cluster placement group and reaches 10 Gbps inside
  one; traffic to other Regions is limited to 5 Gbps for an instance of under 32 vCPUs.
- same zone: 0.25 ms, the least best-of-50 ping between instances of one AZ that K. Rush
  measured ("Measuring AWS Region and AZ Latency", xkyle.com).
- cross-zone: 1 ms, inside the 0.25-3.37 ms range of the same measurement across AZs, and
  AWS's own "single-digit millisecond latency" between the AZs of a Region (AWS whitepaper
  "AWS Fault Isolation Boundaries", Availability Zones).
- cross-region: 79 ms, the measured ping between eu-west-1 and ca-central-1 that F. Charette
  reports ("Tool: AWS region to region latency calculator", Medium, 2021).

    >>> LINKS["cross-region"].latency_ms
    79.0
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkPreset:
    """A worker's emulated link: bandwidth (Gbit/s) and latency per collective (ms)."""

    name: str
    gbps: float
    latency_ms: float


LINKS: dict[str, LinkPreset] = {
    p.name: p
    for p in (
        LinkPreset("same-zone", 10.0, 0.25),
        LinkPreset("cross-zone", 5.0, 1.0),
        LinkPreset("cross-region", 5.0, 79.0),
    )
}
