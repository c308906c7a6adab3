"""Inventory builders for the cluster-model tests: pair, switch and ring of any size.

Names and interfaces as on real Sparks (spark-facts.md): each QSFP port is two PCIe functions
("twins"), port 0 = enp1s0f0np0 / enP2p1s0f0np0, port 1 = enp1s0f1np1 / enP2p1s0f1np1.
"""

from __future__ import annotations

import copy

PORT0 = [("enp1s0f0np0", "rocep1s0f0"), ("enP2p1s0f0np0", "roceP2p1s0f0")]
PORT1 = [("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")]


def _link(twin, address):
    netdev, rdma = twin
    return {"netdev": netdev, "rdma_device": rdma, "address": address}


def _inputs(names, links, topology, **settings):
    base = {
        "sparkops_topology": topology,
        "sparkops_hardware": "dgx_spark",
        "sparkops_fast_mtu": 9000,
        "sparkops_nvidia_driver_branch": "580",
        "nvidia_driver_version": "",
        "spark_vllm_image_name": "vllm-node",
        "spark_vllm_image_repo": "https://github.com/eugr/spark-vllm-docker.git",
        "spark_vllm_image_ref": "74c02c37c280c64d07119350a7d42225f1b154ba",
        "inventory_dir": "/srv/inv",
    }
    base.update(settings)
    return {
        "groups": {"spark_cluster": list(names), "spark_head": [names[0]], "spark_workers": list(names[1:])},
        "hostvars": {
            h: {"ansible_host": f"10.0.0.{11 + i}", "sparkops_fast_links": links[h]} for i, h in enumerate(names)
        },
        "settings": base,
    }


def names_of(n):
    return [f"spark-{i + 1}" for i in range(n)]


def pair(**settings):
    names = names_of(2)
    links = {
        h: [_link(PORT1[0], f"192.168.100.{11 + i}/24"), _link(PORT1[1], f"192.168.101.{11 + i}/24")]
        for i, h in enumerate(names)
    }
    return _inputs(names, links, "pair", **settings)


def switch(n, **settings):
    names = names_of(n)
    links = {
        h: [_link(PORT1[0], f"192.168.100.{11 + i}/24"), _link(PORT1[1], f"192.168.101.{11 + i}/24")]
        for i, h in enumerate(names)
    }
    return _inputs(names, links, "switch", **settings)


def ring(n, **settings):
    """Node i's port 0 to node i+1's port 1 (the closing cable back to the head); each cable two
    subnets, one per twin: 10.<cable>.<twin>.0/24 (hosts .1 and .2)."""
    names = names_of(n)
    links = {h: [] for h in names}
    for c in range(n):
        a, b = names[c], names[(c + 1) % n]
        for t in range(2):
            links[a].append(_link(PORT0[t], f"10.{c + 1}.{t}.1/24"))
            links[b].append(_link(PORT1[t], f"10.{c + 1}.{t}.2/24"))
    return _inputs(names, links, "ring", **settings)


def mutate(inputs, fn):
    out = copy.deepcopy(inputs)
    fn(out)
    return out
