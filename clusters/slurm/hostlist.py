"""Slurm hostlist expressions: `gpu-[0-3,7]` for gpu-0, gpu-1, gpu-2, gpu-3 and gpu-7.

slurm.conf takes them for NodeName, NodeHostname (with as many entries as NodeName on its line),
Nodes= of a partition and gres.conf's NodeName (slurm.conf(5)). A 10,000-node pool is one short line
instead of 10,000, which keeps a gce cluster's slurm.conf within Compute's 256 KB metadata value.
"""

import re

NUMBERED = re.compile(r"(?P<stem>.*?)(?P<number>\d+)\Z")


def compress(names):
    """One hostlist expression for `names`: numbered names that share a stem become ranges."""
    stems, plain = {}, []
    for name in names:
        match = NUMBERED.match(name)
        # Zero-padded numbers ("n01") would need padded ranges: keep them as they are.
        if match and (match["number"] == "0" or not match["number"].startswith("0")):
            stems.setdefault(match["stem"], set()).add(int(match["number"]))
        else:
            plain.append(name)
    parts = [f"{stem}{ranges(numbers)}" for stem, numbers in stems.items()]
    return ",".join(parts + sorted(plain))


def ranges(numbers):
    """[0-3,7] for {0, 1, 2, 3, 7}; a lone number stays bare (Slurm reads `gpu-7` as one host)."""
    ordered = sorted(numbers)
    if len(ordered) == 1:
        return str(ordered[0])
    spans, start, last = [], ordered[0], ordered[0]
    for number in ordered[1:]:
        if number != last + 1:
            spans.append((start, last))
            start = number
        last = number
    spans.append((start, last))
    return "[" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) + "]"
