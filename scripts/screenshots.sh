#!/bin/bash
# Screenshots of the console's main pages with data in them (docs/screenshots/*.png), taken by Debian's
# chromium through Playwright from the accessibility tests' pages (tests/test_accessibility.py), so a
# screenshot is of a page that also passed axe-core's checks. Needs the set-up of scripts/bootstrap.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/screenshots
TCC_SCREENSHOTS=$PWD/docs/screenshots .venv/bin/pytest tests/test_accessibility.py -q -p no:cacheprovider \
  -k "test_every_page_has_no_serious" "$@"
ls -l docs/screenshots
