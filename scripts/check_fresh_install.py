"""The first minute of a new user, proven from scratch (run by ``.ci/run``).

1. ``quickstart``: the README's first set-up command, read out of README.md
   and run verbatim in a copy of the checkout with a brand-new virtualenv that
   shares nothing with the tests' environment. Within 90 s the log must show
   routines sent and tasks succeeded; then SIGINT must end the worker (and its
   embedded beat) cleanly within 20 s.
2. ``matrix``: a brand-new virtualenv per extra alone (and none), each of
   which imports the package, runs ``celery routines --help`` and exercises the
   path that extra enables (``extra_paths.py`` beside this script).

Usage: ``python scripts/check_fresh_install.py [quickstart] [matrix] [--extras a,b]``.
Exit status 0 when everything held; every failure is printed with the log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("postgres", "mysql", "redis", "metrics", "web", "solar", "holidays", "yaml")
SENT = re.compile(r"INFO/Beat\] sent \S+")
SUCCEEDED = re.compile(r"Task \S+\[[0-9a-f-]+\] succeeded")
START_WITHIN = 90.0
STOP_WITHIN = 20.0
# celery.apps.worker installs SIGINT as a warm shutdown with EX_FAILURE.
SIGINT_STATUS = 1
# One step of the install matrix (pip install included): a hung step fails
# the check instead of holding CI until its own limit.
STEP_WITHIN = 300.0


def readme_first_command(readme: Path = ROOT / "README.md") -> str:
    """The quickstart command: the first code block of "The two commands"."""
    text = readme.read_text()
    section = text.split("## The two commands", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)\n```", section, re.S)
    if block is None:
        raise SystemExit("README.md: no code block under 'The two commands'")
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    if len(lines) != 1:
        raise SystemExit(f"README.md: the quickstart should be one command, got {lines!r}")
    return lines[0]


def copy_checkout(into: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) in ``into``: the
    quickstart writes examples/var, which must not be this tree's."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        source = ROOT / os.fsdecode(raw)
        if not source.is_file():
            continue  # deleted in the work tree
        target = into / os.fsdecode(raw)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return into


def fresh_venv(where: Path, python: str = sys.executable) -> dict[str, str]:
    """A new virtualenv with no site packages; the environment that uses it
    (as `. venv/bin/activate` would), nothing inherited from the tests' one."""
    subprocess.run([python, "-m", "venv", str(where)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["VIRTUAL_ENV"] = str(where)
    env["PATH"] = f"{where / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def check_quickstart(work: Path) -> list[str]:
    command = readme_first_command()
    tree = copy_checkout(work / "checkout")
    env = fresh_venv(work / "venv")
    log_path = work / "quickstart.log"
    print(f"quickstart: {command}", flush=True)
    return run_quickstart(["bash", "-c", command], tree, env, log_path)


def run_quickstart(argv: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> list[str]:
    """Start the quickstart, watch it send and succeed, stop it with SIGINT."""
    with log_path.open("wb") as log:
        # Its own session: SIGINT goes to the worker alone, as Ctrl-C in a
        # terminal reaches the foreground job (the pip before it has ended).
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        failures = _watch_quickstart(process, log_path)
    if failures:
        print(log_path.read_text(errors="replace")[-6000:])
    return failures


def _watch_quickstart(process: subprocess.Popen[bytes], log_path: Path) -> list[str]:
    started = time.monotonic()
    installed_at: float | None = None
    sent = succeeded = 0
    while True:
        text = log_path.read_text(errors="replace")
        if installed_at is None and ("celery@" in text or "[config]" in text):
            installed_at = time.monotonic()  # pip is done: the minute starts now
        sent, succeeded = len(SENT.findall(text)), len(SUCCEEDED.findall(text))
        if sent >= 2 and succeeded >= 2:
            break
        if process.poll() is not None:
            return [f"quickstart ended with status {process.returncode} before sending"]
        waited = time.monotonic() - (installed_at or started)
        limit = START_WITHIN if installed_at else 600.0  # pip install included
        if waited > limit:
            _kill_group(process)
            return [f"quickstart: {sent} sent, {succeeded} succeeded after {waited:.0f} s"]
        time.sleep(0.5)
    ready = time.monotonic() - (installed_at or started)
    worker = _worker_pid(process.pid)
    os.kill(worker, signal.SIGINT)
    told = time.monotonic()
    try:
        status = process.wait(timeout=STOP_WITHIN)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return [f"quickstart: still running {STOP_WITHIN:.0f} s after SIGINT"]
    stopped = time.monotonic() - told
    leftovers = _group_alive(process.pid)
    _kill_group(process)
    after_signal = log_path.read_text(errors="replace").split("Warm shutdown", 1)[-1]
    print(
        f"quickstart: {sent} sent and {succeeded} succeeded {ready:.1f} s after start-up; "
        f"SIGINT -> exit {status} in {stopped:.1f} s",
        flush=True,
    )
    failures = []
    # A clean Ctrl-C: Celery's warm shutdown, which exits 1 for SIGINT (a plain
    # Celery worker does too; SIGTERM's warm shutdown exits 0), nothing left
    # running, no error on the way out.
    if status != SIGINT_STATUS:
        failures.append(f"quickstart: exit status {status} after SIGINT")
    if leftovers:
        failures.append(f"quickstart: processes left after exit: {leftovers}")
    if "Traceback" in after_signal or "ERROR/" in after_signal:
        failures.append("quickstart: an error was logged while it stopped")
    return failures


def _worker_pid(shell_pid: int) -> int:
    """The celery process under ``bash -c "pip ... && celery ..."``."""
    for pid in _group_alive(shell_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"celery") for part in cmdline[:2]) and b"worker" in cmdline:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == shell_pid or not _is_celery(parent):
                return pid
    return shell_pid


def _is_celery(pid: int) -> bool:
    try:
        return b"celery" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def check_extra(work: Path, extra: str | None) -> list[str]:
    """A new venv with the package and one extra (or none): the package
    imports, ``celery routines --help`` works, and the extra's path runs."""
    name = extra or "base"
    env = fresh_venv(work / f"venv-{name}")
    target = f"{ROOT}[{extra}]" if extra else str(ROOT)
    started = time.monotonic()
    steps = [
        ["pip", "install", "--quiet", target],
        [
            "python",
            "-c",
            "import celery_routines, celery_routines.beat; from celery_routines import Routines",
        ],
        ["celery", "routines", "--help"],
        ["python", str(ROOT / "scripts" / "extra_paths.py"), name],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, env=env, cwd=work, capture_output=True, text=True, timeout=STEP_WITHIN
            )
        except subprocess.TimeoutExpired as late:
            output = (_text(late.stdout) + _text(late.stderr))[-4000:]
            return [
                f"[{name}] {' '.join(step[:3])} still running after {STEP_WITHIN:.0f} s:\n{output}"
            ]
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-4000:]
            return [f"[{name}] {' '.join(step[:3])} failed ({done.returncode}):\n{output}"]
    print(f"install matrix: [{name}] ok in {time.monotonic() - started:.0f} s", flush=True)
    return []


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checks", nargs="*", default=["quickstart", "matrix"])
    parser.add_argument("--extras", default=",".join(("base", *EXTRAS)))
    args = parser.parse_args()
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="routines-fresh-") as tmp:
        work = Path(tmp)
        if "quickstart" in args.checks:
            failures += check_quickstart(work)
        if "matrix" in args.checks:
            for extra in args.extras.split(","):
                failures += check_extra(work, None if extra == "base" else extra)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
