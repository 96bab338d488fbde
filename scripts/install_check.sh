#!/usr/bin/env bash
# The README's install command in an environment that already has its own
# TensorFlow and pandas, as Colab's runtime does: a fresh venv with
# `tensorflow` (not -cpu) and pandas 2 installed first, then `pip install -e .`.
# Checks that no tensorflow-cpu comes in, that the TensorFlow, pandas and jax
# there stay, and that a few steps of the default job then run.
#
#   scripts/install_check.sh [PRE-INSTALLED REQUIREMENTS...]
#   (default: tensorflow==2.21.0 'pandas<3')
set -euo pipefail
cd "$(dirname "$0")/.."
pre=("$@")
[[ ${#pre[@]} -eq 0 ]] && pre=(tensorflow==2.21.0 'pandas<3')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip)
"${pip[@]}" install -q "${pre[@]}"
"${pip[@]}" freeze | sort > "$tmp/before"
echo "before: $(grep -iE '^(jax|jaxlib|tensorflow|tensorflow-cpu|pandas|numpy)==' "$tmp/before" | tr '\n' ' ')"
"${pip[@]}" install -q -e .  # the README's command
"${pip[@]}" freeze --exclude-editable | sort > "$tmp/after"
echo "after:  $(grep -iE '^(jax|jaxlib|tensorflow|tensorflow-cpu|pandas|numpy)==' "$tmp/after" | tr '\n' ' ')"
changed=$(comm -23 "$tmp/before" "$tmp/after")
[[ -z "$changed" ]] || { echo "FAIL: replaced: $changed"; exit 1; }
! grep -qi '^tensorflow[-_]cpu==' "$tmp/after" || { echo 'FAIL: tensorflow-cpu installed'; exit 1; }
echo 'PASS: nothing there before was replaced; no tensorflow-cpu'
(cd "$tmp" && "$tmp/venv/bin/python" -m vit_jax.main \
    --config="$OLDPWD/configs/default.py" --workdir="$tmp/run" \
    --config.total_steps=20 --config.warmup_steps=5 --config.batch=32 \
    --config.evals.test.every=20 --config.checkpoint_every=20 \
    --config.progress_every=10 --config.shuffle_buffer=1000) 2>&1 | tail -4
test -f "$tmp/run/results.json" || { echo 'FAIL: no results.json'; exit 1; }
echo "PASS: the default job ran 20 steps: $(cat "$tmp/run/results.json" | head -c 200)"
