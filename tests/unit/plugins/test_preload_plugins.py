"""preload_plugins imports every filter, action plugin and controller helper of the collection.

What it buys is measured by a whole run (docs/collection.md, "Faster runs"); what can break is
the list: a new filter file that does not import, or a package left out. The first test runs in a
fresh interpreter, so that modules other tests imported cannot make it pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.callback import preload_plugins

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.sparkops.cluster.plugins.callback import preload_plugins
missed = preload_plugins.preload()
print(json.dumps({"missed": missed, "modules": sorted(m for m in sys.modules if m.startswith("ansible_collections."))}))
"""


def test_every_filter_action_and_helper_module_is_imported():
    out = subprocess.run(
        # The folder that holds ansible_collections/: collections/ in a checkout, the install tree under
        # ansible-test.
        [sys.executable, "-c", PROBE, str(Path(preload_plugins.__file__).parents[5])],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    # ansible.utils needs the plugin loader ansible-playbook initialises; a bare interpreter has none.
    assert [m for m in found["missed"] if not m.startswith("ansible.utils.")] == []
    wanted = {
        f"ansible_collections.sparkops.cluster.plugins.{folder}.{source.stem}"
        for folder in ("filter", "action", "plugin_utils")
        for source in (ROOT / "plugins" / folder).glob("*.py")
        if source.stem != "__init__"
    }
    assert len(wanted) > 15
    assert wanted <= set(found["modules"]), sorted(wanted - set(found["modules"]))


def test_a_module_that_fails_to_import_is_reported_not_raised(monkeypatch):
    real = preload_plugins.importlib.import_module

    def broken(name, *args):
        if name.endswith(".filter.lockfile"):
            raise ImportError("simulated")
        return real(name, *args)

    monkeypatch.setattr(preload_plugins.importlib, "import_module", broken)
    missed = preload_plugins.preload()
    assert any("filter.lockfile" in m and "simulated" in m for m in missed)
