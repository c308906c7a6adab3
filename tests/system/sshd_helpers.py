"""A throw-away sshd on loopback (and a free port) for the weight sync system tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackSshd:
    """sshd on 127.0.0.2:<port> accepting one generated key, from 127.0.0.1 only (like the fabric key)."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.port = free_port()
        self.address = "127.0.0.2"
        self.key = workdir / "id_ed25519"
        self.known_hosts = workdir / "known_hosts"
        self.proc = None

    def start(self) -> LoopbackSshd:
        d = self.dir
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        pub = (d / "id_ed25519.pub").read_text().strip()
        (d / "authorized_keys").write_text(f'from="127.0.0.1" {pub}\n')
        os.chmod(d / "authorized_keys", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        (d / "sshd_config").write_text(
            f"ListenAddress {self.address}:{self.port}\nHostKey {d / 'host_key'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n"
            f"PidFile {d / 'sshd.pid'}\nUsePAM no\nMaxStartups 50\nMaxSessions 50\n"
        )
        self.listen()
        host_pub = (d / "host_key.pub").read_text().split()
        self.known_hosts.write_text(f"[{self.address}]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        return self

    def listen(self) -> None:
        """Start sshd on the configuration start() wrote (again, after a test killed it: the same keys and port)."""
        d = self.dir
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.address, self.port), timeout=0.5):
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd did not start: {self.proc.stderr.read().decode()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def module_args(self) -> dict:
        return {
            "source_address": "127.0.0.1",
            "targets": [self.address],
            "ssh_user": os.environ.get("USER", "root") if os.geteuid() != 0 else "root",
            "ssh_key": str(self.key),
            "ssh_extra_args": [
                "-p",
                str(self.port),
                "-o",
                f"UserKnownHostsFile={self.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
            ],
        }


def sshd_available() -> str | None:
    """None when a loopback sshd can run here, else the reason it cannot."""
    for exe in ("ssh", "ssh-keygen", "rsync"):
        if not shutil.which(exe):
            return f"{exe} is not installed"
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")):
        return "sshd is not installed (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "a throw-away sshd needs root here"
    return None
