"""The config_files action plugin in a real ansible-playbook run on localhost (connection local).

It renders the role's templates (with ansible_managed), copies files/ entries byte for byte (a
Prometheus rule's `{{ $labels }}` is not Jinja to us), passes content through untouched, and a
second run changes nothing. No daemon, no remote host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]
RULE = 'summary: "{{ $labels.instance }} is down"\n'


def make_role_and_playbook(tmp_path: Path) -> Path:
    role = tmp_path / "roles" / "demo"
    (role / "templates").mkdir(parents=True)
    (role / "files").mkdir()
    (role / "tasks").mkdir()
    (role / "templates" / "app.conf.j2").write_text("# {{ ansible_managed }}\nport={{ demo_port }}\n")
    (role / "files" / "rule.yml").write_text(RULE)
    out = tmp_path / "out"
    task = {
        "name": "Write the demo files",
        "sparkops.cluster.config_files": {
            "directories": [{"path": str(out / "etc"), "mode": "0755"}],
            "files": [
                {"dest": str(out / "etc" / "app.conf"), "template": "app.conf.j2", "mode": "0644"},
                {"dest": str(out / "etc" / "rule.yml"), "src": "rule.yml", "mode": "0644"},
                {"dest": str(out / "etc" / "raw.txt"), "content": "{{ demo_raw }}", "mode": "0600"},
            ],
        },
    }
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump([task]))
    play = [
        {
            "name": "Demo",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"demo_port": 8123, "demo_raw": "{% raw %}{{ not templated }}{% endraw %}"},
            "roles": ["demo"],
        }
    ]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    return book


def run(book: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_ROLES_PATH"] = str(book.parent / "roles")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(
        # The module runs with this test's Python (interpreter discovery may find a shim elsewhere).
        ["ansible-playbook", "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"]
        + [str(book), *extra],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
    )


def changed(res: subprocess.CompletedProcess) -> int:
    return int(re.search(r"changed=(\d+)", res.stdout).group(1))


def test_renders_copies_and_then_changes_nothing(tmp_path):
    book = make_role_and_playbook(tmp_path)
    etc = tmp_path / "out" / "etc"
    check = run(book, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert changed(check) == 1 and not etc.exists()

    first = run(book)
    assert first.returncode == 0, first.stdout + first.stderr
    assert changed(first) == 1
    assert (etc / "app.conf").read_text() == "# Ansible managed\nport=8123\n"
    assert (etc / "rule.yml").read_text() == RULE
    assert (etc / "raw.txt").read_text() == "{{ not templated }}"
    assert (etc / "raw.txt").stat().st_mode & 0o777 == 0o600

    second = run(book)
    assert second.returncode == 0 and changed(second) == 0, second.stdout


def test_an_entry_with_two_sources_is_refused(tmp_path):
    book = make_role_and_playbook(tmp_path)
    tasks = tmp_path / "roles" / "demo" / "tasks" / "main.yml"
    data = yaml.safe_load(tasks.read_text())
    data[0]["sparkops.cluster.config_files"]["files"][0]["content"] = "x"
    tasks.write_text(yaml.safe_dump(data))
    res = run(book)
    assert res.returncode != 0
    assert "give exactly one of content, template or src" in res.stdout
    assert not (tmp_path / "out").exists()
