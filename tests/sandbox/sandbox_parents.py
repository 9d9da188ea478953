"""Test helpers: run sandbox calls from a root parent and from an unprivileged one, fake homes, process scans.

When the tests run as root, the "user" parent is the system interpreter started with ``setpriv`` as uid 65534
(the sandbox module needs only the standard library); when they run as non-root, only the "user" parent exists.
Fake secrets live in a fake HOME under /tmp owned by the parent's uid, never in the real home.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from recmas_ray.sandbox import SandboxConfig, SandboxResult, run_python

IS_ROOT = os.geteuid() == 0
NOBODY = 65534
ROOT = str(Path(__file__).resolve().parents[2])
_DRIVER = str(Path(__file__).with_name("as_user_driver.py"))
SYSTEM_PYTHON = "/usr/bin/python3"
SECRETS = {".ssh/id_rsa": "FAKE-SSH-PRIVATE-KEY-7f3a", ".npmrc": "//registry.npmjs.org/:_authToken=FAKE-NPM-9c1d",
           ".config/gh/hosts.yml": "github.com:\n  oauth_token: FAKE-GH-TOKEN-44e2",
           "tavily_keys.txt": "tv" "ly-FAKE-KEYFILE-0a1b2c3d", ".bashrc": "# original bashrc\n"}


def _setpriv_prefix() -> list[str]:
    return [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@dataclass
class Parent:
    """Where sandbox calls come from: ``root`` (this process, as root) or ``user`` (an unprivileged uid)."""

    name: str
    """"root" or "user"."""
    uid: int
    """Uid of the parent process that calls ``run_python``."""

    def run(self, code: str, *, stdin: str = "", tests: str | None = None, parent_env: dict | None = None,
            **config) -> SandboxResult:
        """One sandbox call made by this parent; ``parent_env`` is added to the parent's environment."""
        config.setdefault("timeout_s", 10)
        if self.uid == os.geteuid():
            saved = {k: os.environ.get(k) for k in parent_env or {}}
            os.environ.update(parent_env or {})
            try:
                return run_python(code, config=SandboxConfig(**config), stdin=stdin, tests=tests)
            finally:
                for k, v in saved.items():
                    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        req = json.dumps({"root": ROOT, "code": code, "stdin": stdin, "tests": tests, "config": config})
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", **(parent_env or {})}
        proc = subprocess.run([*_setpriv_prefix(), SYSTEM_PYTHON, "-I", _DRIVER], input=req, capture_output=True,
                              text=True, cwd="/", env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return SandboxResult(**json.loads(proc.stdout))

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        """A process running as this parent's uid (a victim for signal attacks)."""
        prefix = _setpriv_prefix() if self.uid != os.geteuid() else []
        return subprocess.Popen([*prefix, *argv], cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def fake_home(self) -> Path:
        """A fake HOME with fake secret files (0600, owned by the parent); the caller removes it."""
        home = Path(tempfile.mkdtemp(prefix="recmas_fakehome_", dir="/tmp"))
        for rel, text in SECRETS.items():
            path = home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o600)
        if self.uid != os.geteuid():
            for dirpath, dirnames, filenames in os.walk(home):
                for name in [*dirnames, *filenames, "."]:
                    os.chown(os.path.join(dirpath, name), self.uid, self.uid)
        return home


def parents() -> list:
    """Pytest params: every parent kind this machine can test."""
    out = []
    if IS_ROOT:
        out.append(pytest.param("root", id="root"))
    user_ok = not IS_ROOT or (shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON))
    out.append(pytest.param("user", id="user", marks=[] if user_ok else pytest.mark.skip("no setpriv or python3")))
    return out


def make_parent(name: str) -> Parent:
    return Parent(name, 0 if name == "root" else (NOBODY if IS_ROOT else os.geteuid()))


def processes_in_namespace(ns_link: str) -> list[int]:
    """Live (non-zombie) host processes whose PID namespace is ``ns_link`` (e.g. 'pid:[4026532]')."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != ns_link:
                continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(name))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

