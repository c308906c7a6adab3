#!/usr/bin/python
"""Documentation of the cluster_facts action plugin (plugins/action/cluster_facts.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: cluster_facts
short_description: Build the sparkops cluster model from the inventory, on the controller
description:
  - Reads the groups C(spark_cluster) and C(spark_head), every node's C(sparkops_fast_links) and
    C(ansible_host), and the cluster-wide settings (C(sparkops_topology), C(sparkops_fast_mtu), image,
    endpoint and path variables), checks them and computes the model every role reads.
  - Sets C(sparkops_cluster) (the whole model) and C(sparkops_node) (this host's entry).
  - Contacts no host; runs as an action plugin on the controller.
  - On a broken inventory it fails with every problem at once, each naming the host, link or address
    and how to fix it.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options: {}
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Compute the cluster model for this play
  sparkops.cluster.cluster_facts:
"""

RETURN = r"""
ansible_facts:
  description: The model.
  returned: success
  type: dict
  contains:
    sparkops_cluster:
      description: topology, head, workers, ranks, nodes, segments, cables, ray, endpoint, image, weights, paths.
      type: dict
    sparkops_node:
      description: This host's entry of sparkops_cluster.nodes (links, primary, hcas, peers, pings, routes, env).
      type: dict
problems:
  description: Every problem found in the inventory, one sentence each.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.fail_json(msg="cluster_facts runs on the controller as an action plugin; it is never sent to a host.")


if __name__ == "__main__":
    main()
