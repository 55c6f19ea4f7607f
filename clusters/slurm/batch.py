"""The console's batch scripts: `render()` writes every one (health scans, recipe runs, serving
replicas), and `job_properties()` reads a script's `#SBATCH` directives as the job properties
slurmrestd's submit takes.

slurmrestd v0.0.38 (Slurm 22.05) runs the script it is given but ignores the `#SBATCH` lines in it:
the job's options must come in the request's "job" object. `job_properties(script)` reads the
directives the way sbatch does (from the top, until the first line that is not a comment or blank)
and maps each option the console knows to the key slurmrestd 22.05 accepts for it, every one of them
checked against a real slurmrestd (tests/test_slurm_rest.py). An option outside that list is refused
with its line number, never dropped: a job must not run with fewer constraints than its script asks.
"""

import re
import shlex

from ..spec.catalog import nccl_networks
from ..work import PermanentBackendError

# sbatch option (long name) -> slurmrestd v0.0.38 key. Flags (no value) map to True.
OPTIONS = {
    "job-name": "name",
    "partition": "partition",
    "nodes": "nodes",  # a string: "2" or "2-4"
    "ntasks": "tasks",
    "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task",
    "nodelist": "nodelist",  # documented "required_nodes" is a disabled key in 22.05; this one works
    "exclude": "exclude_nodes",
    "time": "time_limit",  # Slurm's time formats, as a string
    "output": "standard_output",
    "error": "standard_error",
    "input": "standard_input",
    "open-mode": "open_mode",
    "chdir": "current_working_directory",
    "reservation": "reservation",
    "gpus-per-node": "gpus_per_node",
    "gres": "gres",
    "mem": "memory_per_node",
    "mem-per-cpu": "memory_per_cpu",
    "account": "account",
    "qos": "qos",
    "constraint": "constraints",
    "dependency": "dependency",
    "array": "array",
    "comment": "comment",
    "signal": "signal",
    "exclusive": "exclusive",
}
FLAGS = {"requeue": "requeue", "no-requeue": "no_requeue", "hold": "hold", "exclusive": "exclusive"}
SHORT = {"J": "job-name", "p": "partition", "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "w": "nodelist",
         "x": "exclude", "t": "time", "o": "output", "e": "error", "i": "input", "D": "chdir", "A": "account",
         "q": "qos", "C": "constraint", "d": "dependency", "a": "array"}  # fmt: skip
INTEGERS = {"tasks", "tasks_per_node", "cpus_per_task"}
MEGABYTES = {"memory_per_node", "memory_per_cpu"}
UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class BatchScriptError(PermanentBackendError):
    """The script asks for something the console cannot pass on to Slurm."""


def directives(script):
    """(line number, [words]) of each `#SBATCH` line before the first command, as sbatch reads them."""
    for number, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            return
        if stripped.startswith("#SBATCH"):
            words = shlex.split(stripped[len("#SBATCH") :], comments=True)
            yield number, words


def options(words, number):
    """(long name, value or None) for each option on one directive line."""
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            name, equals, value = word[2:].partition("=")
            if not equals and name not in FLAGS and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value, i = words[i + 1], i + 1
            yield name, (value if equals or value else None)
        elif re.fullmatch(r"-[A-Za-z].*", word):
            name = SHORT.get(word[1])
            if name is None:
                raise BatchScriptError(f"line {number}: #SBATCH {word} is not an option the console can submit")
            value = word[2:].lstrip("=")
            if not value and i + 1 < len(words):
                value, i = words[i + 1], i + 1
            yield name, value or None
        else:
            raise BatchScriptError(f"line {number}: #SBATCH {word!r} is not an option")
        i += 1


def megabytes(value, number):
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", value.upper())
    if not match:
        raise BatchScriptError(f"line {number}: memory must be a number with K, M, G or T, not {value!r}")
    if int(match.group(1)) == 0:
        return 0  # --mem=0: all of each node's memory (sbatch(1)), not the 1 MB a rounding up would ask for
    return max(1, int(int(match.group(1)) * UNITS[match.group(2) or "M"]))


def job_properties(script):
    """The "job" object for slurmrestd's submit, from the script's directives."""
    job = {}
    for number, words in directives(script):
        for name, value in options(words, number):
            if value is None and name in FLAGS:
                if name in ("requeue", "no-requeue"):  # the last of the two wins, as in sbatch
                    job.pop("no_requeue" if name == "requeue" else "requeue", None)
                job[FLAGS[name]] = "exclusive" if name == "exclusive" else True
                continue
            key = OPTIONS.get(name)
            if key is None or value is None:
                reason = "needs a value" if key else "is not an option the console can submit through slurmrestd"
                raise BatchScriptError(f"line {number}: #SBATCH --{name} {reason}")
            if key in INTEGERS:
                if not value.isdigit():
                    raise BatchScriptError(f"line {number}: #SBATCH --{name} must be a whole number, not {value!r}")
                job[key] = int(value)
            elif key in MEGABYTES:
                job[key] = megabytes(value, number)
            else:
                job[key] = value
    return job


def render(options, *, body, environment=None, folder=None):
    """A batch script: `#SBATCH` lines from `options` (sbatch's long names without the dashes; a value
    of True is a flag, None or False leaves the option out), then `set -euo pipefail`, `environment`
    exported ({name: value}, each value quoted), `cd folder` when given, and the `body` lines.

    Every option is one the submit can pass on (OPTIONS, FLAGS): a script the console writes is never
    one that job_properties() would refuse."""
    lines = ["#!/bin/bash"]
    for name, value in options.items():
        if value is None or value is False:
            continue
        if name not in OPTIONS and name not in FLAGS:
            raise ValueError(f"--{name} is not an option the console can submit")
        if value is True:
            if name not in FLAGS:
                raise ValueError(f"--{name} needs a value")
            lines.append(f"#SBATCH --{name}")
        else:
            text = str(value)
            if not text or any(c.isspace() for c in text):
                raise ValueError(f"--{name} must be one word, not {text!r}")
            lines.append(f"#SBATCH --{name}={text}")
    lines.append("set -euo pipefail")
    if environment:
        lines.append("export " + " ".join(f"{key}={shlex.quote(str(value))}" for key, value in environment.items()))
    if folder:
        lines.append(f"cd {shlex.quote(str(folder))}")
    lines.extend(body)
    lines.append("")
    return "\n".join(lines)


def nccl_lines(fabric):
    """The lines a job script runs before srun so NCCL uses the machine type's GPU network (`fabric`
    from clusters/data/machine_types.json: rdma for gIB on A3 Ultra and A4, tcpxo for A3 Mega), as
    clusters/data/nccl.json says Google's examples set it up; [] for none (CPU nodes, the local
    backend). A plugin missing from the image is said on the job's output, and NCCL falls back to
    sockets rather than the job failing."""
    setup = nccl_networks().get(fabric) if fabric else None
    if not setup:
        return []
    profile = shlex.quote(setup["profile"])
    before = " ".join(f"{k}={shlex.quote(v)}" for k, v in setup.get("profile_environment", {}).items())
    lines = [
        f"# NCCL over the {fabric} GPU network (clusters/data/nccl.json)",
        f"if [ -r {profile} ]; then",
        # Vendor scripts read variables they may not find set: not under `set -u`.
        f"  set +u; {before + ' ' if before else ''}source {profile}; set -u",
        "else",
        f'  echo "warning: {setup["profile"]} is not on this node: NCCL uses TCP sockets" >&2',
        "fi",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in setup["environment"].items()]
    lines.append(f'export LD_LIBRARY_PATH={shlex.quote(setup["library_path"])}:"${{LD_LIBRARY_PATH:-}}"')
    return lines
