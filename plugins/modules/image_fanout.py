#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_fanout
short_description: Stream a Docker image from the build host to many nodes at once along a tree of ssh hops
description:
  - Runs on the build host. Saves the image once (C(docker save | zstd)) and streams the compressed bytes along
    I(edges) (the cluster model's C(sparkops_cluster.image.fanout)); every node on the way pipes what it receives
    to C(zstd -d | docker load) and, at the same time, to an ssh into each of its children, which do the same.
    A chain of N nodes therefore takes about the time of one copy, not N-1 copies one after another.
  - The relay (a short Python program, standard library only) travels inside the ssh command; nothing is installed
    on the nodes. Every node needs C(python3) and C(zstd), and ssh from each node to its children's addresses
    (the fabric_ssh role gives every node its own key, accepted by every node from the fast-link subnets).
  - Only nodes in I(need) load the image. A node that already holds it still relays when a node below it needs
    it; a subtree that needs nothing gets nothing.
  - Bounded by I(timeout_s). A failed hop fails the module naming the hop (from, to, address) and the end of
    its stderr; what the other nodes loaded stays loaded.
version_added: "0.3.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  image:
    description: The image (name:tag) to stream. It must be on the build host.
    type: str
    required: true
  source:
    description: Inventory name of the build host (this host), the root of I(edges).
    type: str
    required: true
  edges:
    description:
      - The copy tree, a list of C({from, to, ip, wave}) (C(sparkops_cluster.image.fanout)); C(ip) is the
        receiver's address on the link it shares with the sender.
      - Each node is reached once, from the source or from a node reached before.
    type: list
    elements: dict
    required: true
  need:
    description: Inventory names of the nodes that lack the image (they load it); the others only relay.
    type: list
    elements: str
    default: []
  ssh_user:
    description: The user the hops log in as.
    type: str
    default: root
  ssh_args:
    description: ssh and its options for every hop (key, known hosts, batch mode), as an argv list.
    type: list
    elements: str
    default: [ssh, -o, BatchMode=yes]
  docker:
    description: The docker executable on every node.
    type: str
    default: docker
  python:
    description: The Python interpreter that runs the relay on the other nodes.
    type: str
    default: python3
  zstd_level:
    description: zstd compression level of the stream (1-3 keeps up with 200 Gb/s).
    type: int
    default: 3
  timeout_s:
    description: Seconds the whole transfer may take; every relay stops at this bound too.
    type: int
    default: 3600
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Returns the plan (hops, which nodes load, which only relay); starts nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Stream the image along the cluster's fan-out tree
  sparkops.cluster.image_fanout:
    image: "{{ sparkops_image }}"
    source: "{{ sparkops_cluster.image.build_host }}"
    edges: "{{ sparkops_cluster.image.fanout }}"
    need: [spark-2, spark-3]
    ssh_args: "{{ ['ssh'] + fabric_ssh_args.split() }}"
  delegate_to: "{{ sparkops_cluster.image.build_host }}"
  run_once: true
"""

RETURN = r"""
plan:
  description: The hops that carry the stream (C(from), C(to), C(ip), C(wave), C(load)), the nodes that load, the
    nodes that only relay, and needed nodes no edge reaches.
  returned: always
  type: dict
  sample: {"hops": [{"from": "spark-1", "to": "spark-2", "ip": "192.168.100.11", "wave": 1, "load": true}],
           "loads": ["spark-2"], "relay_only": [], "unreachable": []}
hops:
  description: Each hop's result (C(ok), C(loaded), C(bytes), C(rc), C(error), C(stderr)).
  returned: when something was streamed
  type: list
  elements: dict
loaded:
  description: Nodes that loaded the image in this run.
  returned: always
  type: list
  elements: str
bytes:
  description: Size of the compressed stream the build host sent.
  returned: when something was streamed
  type: int
seconds:
  description: Wall time of the transfer.
  returned: when something was streamed
  type: float
"""

import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import image_fanout


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            source=dict(type="str", required=True),
            edges=dict(type="list", elements="dict", required=True),
            need=dict(type="list", elements="str", default=[]),
            ssh_user=dict(type="str", default="root"),
            ssh_args=dict(type="list", elements="str", default=["ssh", "-o", "BatchMode=yes"]),
            docker=dict(type="str", default="docker"),
            python=dict(type="str", default="python3"),
            zstd_level=dict(type="int", default=3),
            timeout_s=dict(type="int", default=3600),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problems = image_fanout.tree_problems(p["source"], p["edges"])
    if problems:
        module.fail_json(
            msg="edges is not a copy tree rooted at "
            + p["source"]
            + ": "
            + "; ".join(problems)
            + ". Pass sparkops_cluster.image.fanout, and set the build host with sparkops_image_build_host "
            "(the model roots the tree there).",
        )
    if p["timeout_s"] < 1 or not 1 <= p["zstd_level"] <= 19:
        module.fail_json(msg="timeout_s must be at least 1 and zstd_level 1-19")
    the_plan = image_fanout.plan(p["source"], p["edges"], p["need"])
    if the_plan["unreachable"]:
        module.fail_json(
            msg=f"no edge reaches {', '.join(the_plan['unreachable'])} from {p['source']}: every node that needs "
            "the image must be in the cluster model (sparkops_cluster.image.fanout); check the inventory groups.",
            plan=the_plan,
            loaded=[],
        )
    if not the_plan["hops"] or module.check_mode:
        module.exit_json(changed=bool(the_plan["loads"]), plan=the_plan, loaded=[])
    for tool in ("zstd", p["docker"]):
        if shutil.which(tool) is None:
            module.fail_json(msg=f"{tool} is not installed on {p['source']}: install it (the image transfer needs it)")

    spec = image_fanout.relay_spec(
        the_plan,
        ssh=p["ssh_args"],
        user=p["ssh_user"],
        docker=p["docker"],
        python=p["python"],
        timeout_s=p["timeout_s"],
    )
    try:
        run = image_fanout.stream_from_source(
            docker=p["docker"], image=p["image"], zstd_level=p["zstd_level"], source=p["source"], spec=spec
        )
    except image_fanout.TransferTimeout:
        module.fail_json(
            msg=f"the image transfer did not finish in {p['timeout_s']} s; raise spark_vllm_image_transfer_timeout_s "
            "or check the fast links",
            plan=the_plan,
        )
    report, save_rc, zstd_rc, seconds = run["report"], run["save_rc"], run["zstd_rc"], run["seconds"]
    if report is None:
        module.fail_json(
            msg=f"the relay on {p['source']} gave no report (exit {run['relay_rc']}): {run['relay_stderr']}",
            plan=the_plan,
        )
    result = image_fanout.flatten(report, the_plan["loads"])
    out = dict(
        changed=bool(result["loaded"]),
        plan=the_plan,
        hops=result["hops"],
        loaded=result["loaded"],
        bytes=report.get("bytes", 0),
        seconds=seconds,
    )
    if save_rc != 0 or zstd_rc != 0:
        module.fail_json(
            msg=f"docker save {p['image']} | zstd on {p['source']} failed (exit {save_rc}/{zstd_rc}): "
            f"{run['save_stderr']}. Is the image on the build host, and is there room in its temporary directory?",
            **out,
        )
    if report.get("timeout"):
        module.fail_json(
            msg=f"the image transfer did not finish in {p['timeout_s']} s; raise spark_vllm_image_transfer_timeout_s "
            "or check the fast links",
            **out,
        )
    if result["failed"]:
        module.fail_json(
            msg="the image did not reach every node: "
            + "; ".join(image_fanout.describe_failure(h) for h in result["failed"])
            + ". Check that hop's fast link, ssh between the two nodes (fabric_ssh) and free disk in /var/lib/docker, "
            "then rerun (nodes that loaded keep the image).",
            **out,
        )
    module.exit_json(**out)


if __name__ == "__main__":
    main()
