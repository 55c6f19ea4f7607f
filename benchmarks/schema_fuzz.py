"""A longer schemathesis run than CI's: every /api/v1 and v1beta1 operation with N generated
requests each (default 300; CI runs 10), printing the requests sent, failures and time.

Usage: .venv/bin/python benchmarks/schema_fuzz.py [N]
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/test_schema_fuzz.py"],
        cwd=ROOT,
        env={**os.environ, "SCHEMATHESIS_EXAMPLES": str(examples)},
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    operations = len(re.findall(r"^tests/test_schema_fuzz.py::.*\[", result.stdout, re.M)) or None
    print(f"examples per operation: {examples}")
    print(f"pytest: {summary}")
    print(f"server errors (ST101): {result.stdout.count('ST101')}")
    print(
        f"schema violations (ST1xx/ST2xx other than 101): {len(re.findall(r'ST(1(?!01)|2)[0-9][0-9]', result.stdout))}"
    )
    print(f"wall time: {seconds:.1f} s")
    if operations:
        print(f"operations: {operations}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
