#!/usr/bin/env bash
# The collection as a user gets it: built, installed next to only the collections
# galaxy.yml declares, and checked from there (never from the checkout).
#   tests/collection-checks.sh install   build the tarball, install it and its declared dependencies
#   tests/collection-checks.sh syntax    --syntax-check every playbook by FQCN
#   tests/collection-checks.sh docs      ansible-doc renders every role, filter and module
#   tests/collection-checks.sh sanity    ansible-test sanity on the installed collection
#   tests/collection-checks.sh units     ansible-test units on the installed collection
#   tests/collection-checks.sh env       print the variables a test needs to use the installed copy
# Galaxy is unreachable here: the dependencies are copied from the collections the
# `ansible` PyPI package bundles, then `ansible-galaxy collection install --offline`
# must find every declared dependency (and theirs) satisfied, or it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export PYTHONUNBUFFERED=1 ANSIBLE_FORCE_COLOR=0
# One work area per checkout, outside it (linters scan the checkout).
WORK=${SPARKOPS_COLLECTION_WORK:-${TMPDIR:-/tmp}/sparkops-collection-$(printf '%s' "$ROOT" | sha1sum | cut -c1-10)}
CPATH=$WORK/collections
INSTALLED=$CPATH/ansible_collections/sparkops/cluster
# A config of the installed tree's own: no checkout paths, and the `ansible`
# package's bundled collections (on the Python path) are NOT visible, so a
# dependency missing from galaxy.yml fails here as it would for a user.
export ANSIBLE_CONFIG=$WORK/ansible.cfg

write_config() {
    mkdir -p "$WORK"
    cat >"$ANSIBLE_CONFIG" <<EOF
[defaults]
collections_path = $CPATH
collections_scan_sys_path = False
roles_path = $WORK/no-roles
host_key_checking = True
retry_files_enabled = False
EOF
}

install() {
    write_config
    rm -rf "$WORK/dist" "$CPATH"
    mkdir -p "$WORK/dist" "$CPATH/ansible_collections"
    ansible-galaxy collection build --output-path "$WORK/dist" "$ROOT"
    local tarball
    tarball=$(ls "$WORK"/dist/sparkops-cluster-*.tar.gz)
    # The declared dependencies and theirs, taken from the ansible package's bundle.
    python3 - "$ROOT/galaxy.yml" "$CPATH" <<'EOF'
import json, shutil, sys
from pathlib import Path

import ansible_collections
import yaml

bundle = Path(list(ansible_collections.__path__)[0])
todo = list(yaml.safe_load(Path(sys.argv[1]).read_text())["dependencies"])
dest = Path(sys.argv[2]) / "ansible_collections"
done = set()
while todo:
    fqcn = todo.pop()
    if fqcn in done:
        continue
    done.add(fqcn)
    src = bundle.joinpath(*fqcn.split("."))
    manifest = src / "MANIFEST.json"
    if not manifest.is_file():
        sys.exit(f"{fqcn} is not in the ansible package's bundle ({bundle}): install it from Galaxy")
    info = json.loads(manifest.read_text())["collection_info"]
    print(f"dependency {fqcn} {info['version']} (from {src})")
    shutil.copytree(src, dest.joinpath(*fqcn.split(".")), ignore=shutil.ignore_patterns("__pycache__"))
    todo.extend(info.get("dependencies") or {})
EOF
    (cd "$WORK" && ansible-galaxy collection install --offline -p "$CPATH" "$tarball")
    [ -f "$INSTALLED/MANIFEST.json" ] || { echo "sparkops.cluster was not installed into $CPATH"; return 1; }
    echo "installed: $INSTALLED"
}

playbooks() {
    local pb
    for pb in "$INSTALLED"/playbooks/*.yml; do
        basename "$pb" .yml
    done
}

syntax() {
    local rc=0 name inv
    # One ansible-playbook per inventory for every playbook (it takes a list); an error names its playbook.
    for inv in "$ROOT/inventory/two-sparks" "$ROOT/inventory/sim"; do
        # shellcheck disable=SC2046 - one word per playbook name
        (cd "$WORK" && ansible-playbook --syntax-check -i "$inv" $(playbooks | sed 's/^/sparkops.cluster./') >/dev/null) \
            || { echo "syntax error ($inv): see above"; rc=1; }
    done
    [ "$rc" -eq 0 ] && echo "syntax ok: $(playbooks | sed 's/^/sparkops.cluster./' | tr '\n' ' ')"
    return $rc
}

docs() {
    local rc=0 kind names out
    for kind in role filter module; do
        names=$(cd "$WORK" && ansible-doc -t "$kind" -l sparkops.cluster --json | python3 -c \
            'import json,sys; print(" ".join(sorted(json.load(sys.stdin))))')
        if [ "$kind" = role ]; then
            # Every role directory must be listed.
            local dirs
            dirs=$(cd "$INSTALLED/roles" && ls -d */ | sed 's#/$##; s#^#sparkops.cluster.#' | sort | tr '\n' ' ')
            [ "${dirs% }" = "$names" ] || { echo "roles listed by ansible-doc: $names; in roles/: $dirs"; rc=1; }
        fi
        [ -n "$names" ] || { echo "ansible-doc lists no $kind in sparkops.cluster"; rc=1; continue; }
        # One call renders them all as text (an error or warning fails), one checks each has content.
        # shellcheck disable=SC2086
        if ! out=$(cd "$WORK" && ansible-doc -t "$kind" $names 2>&1) || grep -q 'WARNING\|ERROR' <<<"$out"; then
            echo "ansible-doc -t $kind does not render:"; echo "$out" | grep -B2 -A5 'WARNING\|ERROR' | head -30; rc=1
        fi
        # shellcheck disable=SC2086
        (cd "$WORK" && ansible-doc -t "$kind" --json $names) | python3 -c '
import json, sys
kind, docs, bad = sys.argv[1], json.load(sys.stdin), []
for name in sys.argv[2:]:
    doc = docs.get(name)
    if kind == "role":
        points = (doc or {}).get("entry_points") or {}
        if not points or not all(p.get("short_description") for p in points.values()):
            bad.append(name + " (no documented entry point: meta/argument_specs.yml)")
    elif not ((doc or {}).get("doc") or {}).get("short_description") or not (doc or {}).get("examples"):
        bad.append(name + " (no DOCUMENTATION/EXAMPLES)")
for line in bad:
    print("undocumented " + kind + ": " + line)
print("%s docs: %d of %d render with content" % (kind, len(sys.argv[2:]) - len(bad), len(sys.argv[2:])))
sys.exit(1 if bad else 0)' "$kind" $names || rc=1
    done
    return $rc
}

# ansible-test bootstraps pip in each venv it makes with a get-pip script it
# downloads from ci-files.testing.ansible.com, unreachable here. Give it, in its
# cache, a stand-in that does the same with the interpreter's own ensurepip and
# then pip from PyPI (PyPI is reachable).
pip_bootstrap_standin() {
    local version cache
    version=$(python3 -c 'import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="3"))["pip"])')
    cache=$HOME/.ansible/test/cache/get_pip_${version//./_}.py
    [ -f "$cache" ] && grep -q 'sparkops stand-in' "$cache" && return 0
    [ -f "$cache" ] && return 0  # the real script, fetched where the host is reachable
    mkdir -p "$(dirname "$cache")"
    cat >"$cache" <<'EOF'
"""sparkops stand-in for get-pip.py: ensurepip, then `pip install` with the given arguments."""
import subprocess
import sys

# get-pip.py takes pip-install arguments plus these two of its own.
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", *args])
EOF
    echo "pip bootstrap stand-in: $cache"
}

# The tests that apply to this collection's content; the rest (PowerShell,
# integration aliases, changelog with no fragments config for ansible-test...)
# have nothing to check here and cost minutes on 2 cores.
SANITY_SKIP=(--skip-test pslint)

sanity() {
    pip_bootstrap_standin
    local py
    py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    (cd "$INSTALLED" && ansible-test sanity --venv --python "$py" "${SANITY_SKIP[@]}" --color no)
}

units() {
    pip_bootstrap_standin
    local py
    py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    (cd "$INSTALLED" && ansible-test units --venv --python "$py" --requirements --color no)
}

env_vars() {
    echo "ANSIBLE_CONFIG=$ANSIBLE_CONFIG"
    echo "SPARKOPS_COLLECTION_PATH=$CPATH"
    echo "SPARKOPS_INSTALLED_COLLECTION=$INSTALLED"
}

case "${1:-}" in
    install) install ;;
    syntax) syntax ;;
    docs) docs ;;
    sanity) sanity ;;
    units) units ;;
    env) env_vars ;;
    *) echo "usage: $0 install|syntax|docs|sanity|units|env" >&2; exit 2 ;;
esac
