#!/usr/bin/env bash
# Remakes requirements.txt, the lock of the tested set: a fresh venv, the
# package with its `test` and `tpu` extras, then `pip freeze`. The current lock
# is kept as constraints where it still fits; `--upgrade` drops it, so pip
# takes the newest versions setup.py's ranges allow. Run the tests after.
#
#   scripts/lock.sh [--upgrade]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
constraints=(-c requirements.txt)
[[ "${1:-}" == --upgrade ]] && constraints=()
"$venv/bin/pip" install -q "${constraints[@]}" -e '.[test,tpu]'
{
  sed -n '1,/^# Remade/p' requirements.txt
  "$venv/bin/pip" freeze --exclude-editable
} > requirements.txt.new
mv requirements.txt.new requirements.txt
rm -rf "$(dirname "$venv")"
git diff --stat requirements.txt
