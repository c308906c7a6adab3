# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
name: preload_plugins
type: aggregate
short_description: Load this collection's controller-side plugins once, before the first task
description:
  - Ansible runs every task of every host in a worker process forked from C(ansible-playbook). A
    worker that templates a C(sparkops.cluster) filter, or runs one of its action plugins, imports
    the collection's filter files, action plugins and their helpers from source; the import dies
    with the worker, so the next task pays it again (measured about 0.3 s per worker on 2 cores).
  - This callback imports them once in the main process when the playbook starts. Every worker is
    a fork of it and finds them already imported. It changes no result, only the time a run takes
    (a no-op C(site.yml) asks for about 230 tasks).
  - It also reads once what the cluster model's checks read from the roles' files (the variables every role
    declares, the settings' spec) and the recorded vLLM contracts it checks every profile against, which a worker
    would otherwise read again in every play.
  - Enable it with C(callbacks_enabled = sparkops.cluster.preload_plugins) in C(ansible.cfg) (the
    checkout's ansible.cfg does). Without it everything works the same, only slower.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
requirements:
  - enable in C(callbacks_enabled)
"""

import importlib
import pkgutil

from ansible.plugins.callback import CallbackBase

# Plugins of other collections that the roles template on most runs (the fast links' addresses).
OTHER_FILTERS = ("ansible.utils.ipaddr",)
PACKAGES = (
    "ansible_collections.sparkops.cluster.plugins.filter",
    "ansible_collections.sparkops.cluster.plugins.action",
    "ansible_collections.sparkops.cluster.plugins.plugin_utils",
)

# What a worker would otherwise read from files in every play: read once here, inherited by every fork.
WARM = (
    ("ansible_collections.sparkops.cluster.plugins.action.cluster_facts", "warm_caches"),
    ("ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract", "warm_contracts"),
)


def preload() -> list:
    """Import every module of PACKAGES and OTHER_FILTERS; return what could not be imported.

    A module that fails to import here is left for the worker to import (and report) as before.
    """
    from ansible.plugins.loader import filter_loader  # noqa: PLC0415 - needs the initialised loader

    missed = []
    for package in PACKAGES:
        try:
            pkg = importlib.import_module(package)
        except ImportError as exc:
            missed.append(f"{package}: {exc}")
            continue
        for info in pkgutil.iter_modules(pkg.__path__):
            name = f"{package}.{info.name}"
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - preloading must never stop a run
                missed.append(f"{name}: {exc}")
    for name, warm in WARM:
        try:
            getattr(importlib.import_module(name), warm)()
        except Exception as exc:  # noqa: BLE001 - preloading must never stop a run
            missed.append(f"{name}.{warm}: {exc}")
    for name in OTHER_FILTERS:
        try:
            filter_loader.get(name)
        except Exception as exc:  # noqa: BLE001 - a missing collection is reported where it is used
            missed.append(f"{name}: {exc}")
    return missed


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkops.cluster.preload_plugins"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        for problem in preload():
            self._display.vvv(f"preload_plugins: left for the workers: {problem}")
