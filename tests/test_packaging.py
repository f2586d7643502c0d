"""The install a stranger gets: locked runtime dependencies without test tools or PyTorch, a
package with a `kb` command, and an image that runs as an unprivileged user with a health check."""

import re
import tomllib

from django.core.management import get_commands

from kb.cli import COMMANDS
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEV_ONLY = {"pytest", "pytest-django", "pytest-timeout", "hypothesis", "schemathesis", "playwright", "ruff"}


def locked(path: str) -> dict[str, str]:
    text = (ROOT / path).read_text()
    return {name.lower(): version for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)}


def pins(requirements: list[str]) -> dict[str, str]:
    pairs = (re.match(r"([A-Za-z0-9_.\-]+)(?:\[.*\])?==(\S+)", line).groups() for line in requirements)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


def test_the_runtime_lock_holds_the_pinned_dependencies():
    runtime = locked("requirements.txt")
    for name, version in pins(PYPROJECT["project"]["dependencies"]).items():
        assert runtime.get(name) == version, name


def test_the_runtime_lock_holds_nothing_for_tests_or_torch():
    runtime = locked("requirements.txt")
    assert runtime
    assert not (set(runtime) & (DEV_ONLY | {"torch", "sentence-transformers", "transformers"}))


def test_the_runtime_lock_pins_every_dependency_with_hashes():
    entries = re.split(r"\n(?=\S)", (ROOT / "requirements.txt").read_text().strip())
    assert all("--hash=sha256:" in entry for entry in entries if "==" in entry)


def test_the_dev_lock_adds_the_test_tools_to_the_same_runtime():
    runtime, dev = locked("requirements.txt"), locked("requirements-dev.txt")
    assert {name: dev.get(name) for name in runtime} == runtime
    for name, version in pins(PYPROJECT["project"]["optional-dependencies"]["dev"]).items():
        assert dev.get(name) == version, name


def test_the_kb_command_wraps_existing_management_commands():
    assert PYPROJECT["project"]["scripts"] == {"kb": "kb.cli:main"}
    ours = {name for name, app in get_commands().items() if app in ("kb", "mcp_endpoint")}
    assert set(COMMANDS.values()) == ours  # every one of ours, and only those


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_the_image_is_built_on_a_pinned_release():
    base = re.search(r"^FROM (\S+)", dockerfile(), re.M).group(1)
    assert re.search(r":\d+\.\d+\.\d+", base), base  # a pinned release, not a moving tag


def test_the_image_holds_the_runtime_only():
    text = dockerfile()
    assert "requirements.txt" in text and "requirements-dev" not in text and "torch" not in text


def test_the_image_runs_unprivileged():
    user = re.findall(r"^USER (\S+)", dockerfile(), re.M)
    assert user and user[-1] not in ("root", "0")


def test_the_image_has_a_health_check():
    assert re.search(r"^HEALTHCHECK .*", dockerfile(), re.M)


def test_compose_pins_every_image():
    images = re.findall(r"image: (\S+)", (ROOT / "docker-compose.yml").read_text())
    assert images and all(re.search(r":[^:]*\d", image) and not image.endswith(":latest") for image in images)
