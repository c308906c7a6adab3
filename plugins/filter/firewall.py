"""The rules file of a chain the cluster model lists rule by rule (SPARKOPS-FWD), for the boot restore.

The format and the restore are in module_utils/firewall.py (rules_file_from) and roles/firewall_boot.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.module_utils.firewall import rules_file_from


def firewall_rules_file(entries, chain, family=4, writer="sparkops"):
    try:
        return rules_file_from(str(chain), 6 if str(family) in ("6", "ipv6") else 4, list(entries or []), str(writer))
    except (ValueError, KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"firewall_rules_file {chain}: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"firewall_rules_file": firewall_rules_file}
