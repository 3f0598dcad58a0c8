"""The package as users install it: the built sdist and wheel, on every Python
the package claims (run by ``.ci/run``).

1. Build the sdist and the wheel from this checkout (``python -m build``) and
   check their metadata (``twine check --strict``): a README that PyPI would
   not render, or a missing field, fails here instead of at upload.
2. For each Python (pyenv's 3.11, 3.12 and 3.13 where present, else the ones
   named with ``--pythons``): a brand-new virtualenv with the **wheel**
   installed (not the tree, not editable) with the ``web``, ``holidays`` and
   ``solar`` extras, then
   - the quickstart (examples/quickstart.py, copied out of the tree so that
     nothing imports the checkout): two routines sent and two tasks succeeded
     within 90 s, and a clean exit on SIGINT;
   - a panel page: ``routines web`` on a free loopback port serves the
     routines page with the quickstart's routines on it;
   - on 3.12 and 3.13, the pure unit tests (schedules and policy: no server),
     run from a copy of ``tests/`` against the installed package.

Usage: ``python scripts/check_wheel.py [--pythons 3.11,3.12,3.13] [--tests-on 3.12,3.13]``
(the pure unit tests run on the ``--tests-on`` Pythons: CI runs the whole suite
on 3.11).
Exit status 0 when everything held; every failure is printed with its output.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from check_fresh_install import ROOT, _kill_group, fresh_venv, run_quickstart

PYTHONS = ("3.11", "3.12", "3.13")
# Installing celery and its dependencies from the registry dominates a step.
STEP_WITHIN = 420.0
PANEL_WITHIN = 60.0
# The unit tests that need no server: schedule math and pure decisions.
PURE_TESTS = ("tests/schedules", "tests/policy")
TEST_TOOLS = ("pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.2", "hypothesis>=6")


def quickstart_app(examples: Path) -> list[str]:
    return ["celery", "--workdir", str(examples), "-A", "quickstart"]


def find_pythons(wanted: list[str]) -> list[tuple[str, str]]:
    """(version, interpreter) for each wanted version: pyenv's build, else
    ``pythonX.Y`` on PATH. A version that is missing is a failure, not a skip."""
    found = []
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in wanted:
        builds = sorted(glob.glob(str(pyenv / f"{version}.*" / "bin" / "python")))
        interpreter = builds[-1] if builds else shutil.which(f"python{version}")
        if interpreter is None:
            raise SystemExit(f"check_wheel: no Python {version} here (pyenv or PATH)")
        found.append((version, interpreter))
    return found


def run(step: list[str], *, env: dict[str, str] | None = None, cwd: Path) -> str | None:
    """None when the step succeeded, else the failure with its output's tail."""
    try:
        done = subprocess.run(
            step, env=env, cwd=cwd, capture_output=True, text=True, timeout=STEP_WITHIN
        )
    except subprocess.TimeoutExpired:
        return f"{' '.join(step[:4])} still running after {STEP_WITHIN:.0f} s"
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        return f"{' '.join(step[:4])} failed ({done.returncode}):\n{output}"
    return None


def build(work: Path) -> tuple[list[str], Path | None]:
    """Build and check the distributions; (failures, the wheel)."""
    tools = fresh_venv(work / "venv-build")
    dist = work / "dist"
    for step in (
        ["pip", "install", "--quiet", "build", "twine"],
        ["python", "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(ROOT)],
    ):
        failure = run(step, env=tools, cwd=work)
        if failure:
            return [f"build: {failure}"], None
    built = sorted(dist.iterdir())
    failure = run(["twine", "check", "--strict", *map(str, built)], env=tools, cwd=work)
    if failure:
        return [f"twine check: {failure}"], None
    wheels = [path for path in built if path.suffix == ".whl"]
    sdists = [path for path in built if path.name.endswith(".tar.gz")]
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"build: expected one wheel and one sdist, got {[p.name for p in built]}"], None
    print(f"wheel: built and checked {', '.join(p.name for p in built)}", flush=True)
    return [], wheels[0]


def check_python(work: Path, version: str, interpreter: str, wheel: Path, tests: bool) -> list[str]:
    started = time.monotonic()
    here = work / f"py{version}"
    here.mkdir()
    env = fresh_venv(here / "venv", python=interpreter)
    tools = [*TEST_TOOLS] if tests else []
    failure = run(
        ["pip", "install", "--quiet", f"{wheel}[web,holidays,solar]", *tools], env=env, cwd=here
    )
    if failure:
        return [f"[{version}] install: {failure}"]
    # The wheel, not a tree: the package must come from site-packages.
    where = subprocess.run(
        ["python", "-c", "import celery_routines; print(celery_routines.__file__)"],
        env=env,
        cwd=here,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if "site-packages" not in where:
        return [f"[{version}] celery_routines imported from {where!r}, not the installed wheel"]
    examples = here / "examples"
    shutil.copytree(
        ROOT / "examples", examples, ignore=shutil.ignore_patterns("var", "__pycache__")
    )
    failures = quickstart(here, examples, env, version)
    failures += panel_page(here, examples, env, version)
    if tests:
        failures += pure_tests(here, env, version)
    print(f"wheel: [{version}] done in {time.monotonic() - started:.0f} s", flush=True)
    return failures


def quickstart(here: Path, examples: Path, env: dict[str, str], version: str) -> list[str]:
    argv = [*quickstart_app(examples), "worker", "-B", "--loglevel=INFO"]
    failures = run_quickstart(argv, here, env, here / "quickstart.log")
    return [f"[{version}] {failure}" for failure in failures]


def panel_page(here: Path, examples: Path, env: dict[str, str], version: str) -> list[str]:
    """The routines page lists what the quickstart stored (its SQLite file)."""
    port = _free_port()
    log_path = here / "web.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*quickstart_app(examples), "routines", "web", "--port", str(port)],
            cwd=here,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status, body = _wait_for_page(f"http://127.0.0.1:{port}/", process)
        finally:
            _kill_group(process)
    if status != 200 or "heartbeat" not in body:
        output = log_path.read_text(errors="replace")[-4000:]
        return [
            f"[{version}] panel: / answered {status} without the quickstart's routines:\n{output}"
        ]
    print(f"wheel: [{version}] panel page lists the quickstart's routines", flush=True)
    return []


def _wait_for_page(url: str, process: subprocess.Popen[bytes]) -> tuple[int | None, str]:
    deadline = time.monotonic() + PANEL_WITHIN
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode(errors="replace")
        except OSError:
            time.sleep(0.3)
    return None, ""


def pure_tests(here: Path, env: dict[str, str], version: str) -> list[str]:
    """The server-free unit tests, from a copy of tests/ beside no package tree."""
    suite = here / "suite"
    suite.mkdir()
    shutil.copytree(ROOT / "tests", suite / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    # The suite's own pytest settings (markers, xdist, timeout, the warnings
    # that fail a test), read from pyproject.toml as in the checkout.
    shutil.copy2(ROOT / "pyproject.toml", suite / "pyproject.toml")
    failure = run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *PURE_TESTS], env=env, cwd=suite
    )
    if failure:
        return [f"[{version}] pure tests: {failure}"]
    print(f"wheel: [{version}] pure unit tests passed", flush=True)
    return []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythons", default=",".join(PYTHONS))
    # CI runs the whole suite on 3.11 (editable) and the fast tests on the others.
    parser.add_argument(
        "--tests-on", default="3.12,3.13", help="the Pythons that run the pure unit tests"
    )
    args = parser.parse_args()
    pythons = find_pythons(args.pythons.split(","))
    with tempfile.TemporaryDirectory(prefix="routines-wheel-") as tmp:
        work = Path(tmp)
        failures, wheel = build(work)
        if wheel is not None:
            for version, interpreter in pythons:
                tests = version in args.tests_on.split(",")
                failures += check_python(work, version, interpreter, wheel, tests)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
