"""The gateway's log (roles/gateway, the init script of nodes without systemd) holds every request's line and
the proxy's errors: root's only to read, 0640, not the 0644 a root shell's umask gives a new file. The script is
rendered from its template and its `start` run with stand-ins for start-stop-daemon and install."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import jinja2
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _render(tmp_path: Path) -> Path:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles/gateway/templates")), autoescape=False)  # noqa: S701 - a shell script
    env.filters["quote"] = lambda value: shlex.quote(str(value))  # Ansible's quote filter
    text = env.get_template("sparkops-gateway.init.j2").render(
        ansible_managed="managed",
        gateway_run_dir=str(tmp_path / "run"),
        gateway_pidfile=str(tmp_path / "run" / "gunicorn.pid"),
        gateway_log_file=str(tmp_path / "log" / "sparkops-gateway.log"),
        sparkops_gateway_user="sparkops-gw",
        gateway_home=str(tmp_path),
        gateway_argv=["/opt/venv/bin/gunicorn", "--pid", "x"],
        gateway_reload_argv=["/opt/venv/bin/python", "-m", "reload"],
        gateway_drain_timeout_s=30,
    )
    (tmp_path / "default").write_text("A=1\n")
    text = text.replace("/etc/default/$NAME", str(tmp_path / "default"))
    script = tmp_path / "sparkops-gateway"
    script.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for stub in ("start-stop-daemon", "install"):
        (bin_dir / stub).write_text("#!/bin/sh\necho started >&2\nexit 0\n")
        os.chmod(bin_dir / stub, 0o755)
    (tmp_path / "log").mkdir()
    return script


def _start(tmp_path: Path, script: Path) -> None:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    subprocess.run(  # noqa: S603 - the rendered script, stand-ins on PATH
        ["/bin/sh", "-c", f"umask 022; exec /bin/sh {shlex.quote(str(script))} start"],
        env=env,
        check=True,
        timeout=30,
    )


@pytest.mark.parametrize("existing", [False, True])
def test_the_gateway_log_is_0640(tmp_path, existing):
    script = _render(tmp_path)
    log = tmp_path / "log" / "sparkops-gateway.log"
    if existing:  # left 0644 by an earlier start
        log.write_text("old line\n")
        os.chmod(log, 0o644)
    _start(tmp_path, script)
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    assert "started" in log.read_text()  # the daemon's output still goes there
    if existing:
        assert log.read_text().startswith("old line\n")  # appended, not truncated
