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
  - Moves the controller's state (credentials, reports, lock file, plan, wheelhouse) that an older release
    kept inside the inventory folder to the state folder beside it (C(sparkops_controller_state_dir)), once,
    and says what it moved (not in check mode).
  - Warns (the same text from every host, so Ansible prints it once) when the listening address and
    C(sparkops_client_networks) do not fit, of Sparks that serve nothing, of inventory variables with a
    sparkops prefix that no role declares (with the closest known name), and of an empty gateway wheelhouse.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  fail_on_problems:
    description:
      - Fail on a broken inventory. With V(false) the task succeeds and returns the problems (RV(problems), RV(msg)),
        so that a later C(run_once) task can refuse them once for the whole play (the cluster_facts role does).
    type: bool
    default: true
  require_image:
    description:
      - Refuse (as a problem, see O(fail_on_problems)) when the serving plan cannot name the image without a build
        (a branch or tag ref and no lock file recording its commit) and no earlier play of the run set
        C(sparkops_image). The stages that run the image but do not build it set it.
    type: bool
    default: false
  make_state_dirs:
    description:
      - Make the controller's missing state folders (the state folder, the reports' folder and the lock file's
        folder) with mode 0700, on the control node, once per play (by its first host). Not in check mode.
    type: bool
    default: false
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Computes the model in check mode too; it moves and makes no folder there.
  diff_mode:
    support: none
    details: Changes no file's content; it lists the folders it moves (warnings) and makes (RV(state_dirs_made)).
"""

EXAMPLES = r"""
- name: Compute the cluster model for this play
  sparkops.cluster.cluster_facts:

- name: Compute it, and refuse a broken inventory once for the play
  sparkops.cluster.cluster_facts:
    fail_on_problems: false
  register: built

- name: Refuse once
  ansible.builtin.fail:
    msg: "{{ built.msg }}"
  run_once: true
  when: built.problems | length > 0
"""

RETURN = r"""
ansible_facts:
  description: The model.
  returned: success
  type: dict
  contains:
    sparkops_cluster:
      description:
        - topology, head, workers, ranks, nodes, segments, cables, ray, endpoint, image, weights, paths (state_dir
          among them), serving, clients (the plan's Clients block as lines, its warnings and the client URLs).
      type: dict
    sparkops_node:
      description: This host's entry of sparkops_cluster.nodes (links, primary, hcas, peers, pings, routes, env).
      type: dict
problems:
  description: Every problem found in the inventory, one sentence each (empty when there is none).
  returned: always
  type: list
  elements: str
state_dirs_made:
  description: The controller's state folders this task made (with O(make_state_dirs), on the play's first host).
  returned: when O(make_state_dirs) is set, on the play's first host, not in check mode
  type: list
  elements: str
headline:
  description: One line that says what is wrong, without the list (for the task that stops the play).
  returned: when there are problems
  type: str
msg:
  description: The problems as one numbered block.
  returned: when there are problems
  type: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec={
            "fail_on_problems": {"type": "bool", "default": True},
            "require_image": {"type": "bool", "default": False},
            "make_state_dirs": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    module.fail_json(msg="cluster_facts runs on the controller as an action plugin; it is never sent to a host.")


if __name__ == "__main__":
    main()
