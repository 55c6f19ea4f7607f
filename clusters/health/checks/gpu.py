"""Running the node's GPU tools (nvidia-smi, dcgmi) and reading what `nvidia-smi -q` prints.

Only a tool that is not installed is a skip: a tool that runs and exits non-zero has still said
something (`dcgmi diag` exits non-zero exactly when a test fails), so its output is read whatever the
exit code. A node with an injected GPU fault (a rehearsal on a backend that takes faults) runs the
simulated tool for that fault instead (clusters/health/simulated/), through the same path.
"""

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Output:
    code: int
    stdout: str
    stderr: str

    def problem(self):
        """The exit code and the last line the tool wrote (stderr first): a failure's reason."""
        lines = [line for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        return f"exit {self.code}" + (f": {lines[-1].strip()[:200]}" if lines else "")


def run(argv, context, timeout=120):
    """The tool's Output, or None when the node does not have it."""
    simulated = (context.get("faults") or {}).get("gpu")
    if simulated:
        from .. import simulated as tools

        if tools.provides(simulated, argv[0]):
            argv = [sys.executable, "-m", "clusters.health.simulated", simulated, *argv]
    if argv[0] != sys.executable and shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Output(124, "", f"{argv[0]} did not finish in {timeout} s")
    return Output(result.returncode, result.stdout, result.stderr)


GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


def query_sections(text):
    """`nvidia-smi -q` as {bus id: nested dict}: an indented line "Key : Value" is a field, a line
    without a colon opens a section holding the lines indented below it."""
    gpus, stack = {}, []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        header = GPU_HEADER.match(raw.strip())
        if header:
            gpus[header[1]] = {}
            stack = [(len(raw) - len(raw.lstrip()), gpus[header[1]])]
            continue
        if not stack:
            continue  # the log's preamble (timestamp, driver version)
        indent = len(raw) - len(raw.lstrip())
        while len(stack) > 1 and indent <= stack[-1][0]:
            stack.pop()
        key, colon, value = raw.strip().partition(":")
        if colon:
            stack[-1][1][key.strip()] = value.strip()
        else:
            section = stack[-1][1].setdefault(key.strip(), {})
            stack.append((indent, section))
    return gpus


def number(value):
    """A counter's value; "N/A" (not supported on this GPU) and the like count as 0."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
