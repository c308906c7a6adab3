"""Who sends the weights to whom: the cluster model's fan-out edges grouped by sender (pure)."""

from __future__ import annotations

import ipaddress


class FanoutError(ValueError):
    """The model's fan-out cannot be turned into copies (a bug in the model, or a hand-edited one)."""


def _address_facing(node: dict, ip: str) -> str:
    """The sender's own address on the subnet that holds ``ip`` (the cable it shares with the receiver)."""
    want = ipaddress.ip_address(ip)
    for link in node.get("links", []):
        if want in ipaddress.ip_network(link["cidr"], strict=False):
            return link["ip"]
    raise FanoutError(
        f"no link of this node is on the subnet of {ip}: the fan-out edge does not run along a cable "
        "(check the links the inventory gives each node)"
    )


def weight_senders(model: dict, fanout: list | None = None) -> dict:
    """Per sending host: its targets (receiver addresses on the shared cable), its own address on each
    of those cables, and whether it must follow an upstream (every sender but the source).

    ``{host: {"targets": [ip], "source_addresses": {ip: own ip}, "source_address": own ip of the first
    target, "receivers": [host], "upstream": host or None, "upstream_ip": ip or None, "follow": bool}}``.
    ``fanout`` defaults to ``model["weights"]["fanout"]``; every receiver has one sender, and every sender
    other than the source is itself a receiver (so it can forward while it receives).
    """
    edges = model["weights"]["fanout"] if fanout is None else fanout
    source = model["weights"]["source"]
    upstream: dict = {}
    for e in edges:
        if e["to"] in upstream or e["to"] == source:
            raise FanoutError(f"{e['to']} receives the weights twice (or is the source) in the fan-out: {edges}")
        upstream[e["to"]] = e
    out: dict = {}
    for e in sorted(edges, key=lambda e: (e["wave"], e["from"], e["to"])):
        sender = e["from"]
        if sender != source and sender not in upstream:
            raise FanoutError(f"{sender} sends the weights but never receives them: {edges}")
        own = _address_facing(model["nodes"][sender], e["ip"])
        entry = out.setdefault(
            sender,
            {
                "targets": [],
                "source_addresses": {},
                "source_address": own,
                "receivers": [],
                "upstream": upstream[sender]["from"] if sender in upstream else None,
                "upstream_ip": upstream[sender]["ip"] if sender in upstream else None,
                "follow": sender != source,
            },
        )
        entry["targets"].append(e["ip"])
        entry["source_addresses"][e["ip"]] = own
        entry["receivers"].append(e["to"])
    return out


class FilterModule:
    def filters(self):
        return {"weight_senders": weight_senders}
