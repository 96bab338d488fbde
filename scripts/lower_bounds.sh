#!/usr/bin/env bash
# Tests setup.py's lower bounds: a fresh venv (python3.11) with every
# requirement at its `>=` version, and the `convert` extra's safetensors (not
# torch); pip resolves the rest. Then a smoke set, run outside the checkout so
# that the installed package is the one imported: presets' forward passes and
# an .npz round trip, a few steps of the default job and a resume of it, a
# conversion of timm's weights and predictions, every module imported. Prints
# PASS or FAIL per item, then overall; exits 0 only when every item passes. A
# few minutes, plus the install (longer while pip's cache is cold).
#
#   scripts/lower_bounds.sh [NAME==VERSION ...]
#
# An argument pins NAME instead of setup.py's bound, for one run: how to try
# a higher bound before editing setup.py (a lower one conflicts with
# setup.py's range; edit it). KEEP=1 keeps the temp folder (the venv and each
# item's log) and prints its path.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
[[ "${KEEP:-}" == 1 ]] || trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

# `name==version` for each of REQUIRES' and safetensors' lower bounds, then
# TRANSITIVE, then the arguments; a later line for a name replaces an earlier
# one (setup.py read by scripts/declared_requirements.py).
python3.11 - "$repo" "$@" > "$tmp/constraints.txt" <<'EOF'
import re
import sys

sys.path.insert(0, f'{sys.argv[1]}/scripts')
import declared_requirements  # pylint: disable=g-import-not-at-top

# Transitive pins the lower set needs, each for an upstream's wrong metadata:
# tensorflow-metadata 1.21 declares protobuf>=4.25.2, but its generated code
# needs protobuf>=6.31, which TensorFlow<=2.19 refuses.
TRANSITIVE = ['tensorflow-metadata<1.21']

requires, extras = declared_requirements.declared()
convert = [r for r in extras['convert'] if r.startswith('safetensors')]
pins = {}
for i, requirement in enumerate(requires + convert + TRANSITIVE
                                + sys.argv[2:]):
  match = re.fullmatch(r'([A-Za-z0-9_.-]+)(\[.*\])?(==|>=|<=|<|>|~=)([^,;\s]+)',
                       requirement)
  if not match or (i < len(requires) + len(convert) and match[3] != '>='):
    sys.exit(f'No lower bound in {requirement!r}')
  name = re.sub(r'[-_.]+', '-', match[1]).lower()
  pins[name] = '==' if match[3] == '>=' else match[3], match[4]
for name, (op, version) in pins.items():
  print(f'{name}{op}{version}')
EOF

echo "== Install ($(wc -l < "$tmp/constraints.txt") pins)"
python3.11 -m venv "$tmp/venv"
py=$tmp/venv/bin/python
"$py" -m pip install -q -U pip > "$tmp/install.log" 2>&1
if ! "$py" -m pip install -q -c "$tmp/constraints.txt" "$repo" safetensors \
    >> "$tmp/install.log" 2>&1; then
  tail -n 30 "$tmp/install.log"
  echo "FAIL  install"
  exit 1
fi
echo "== pip freeze (the constrained, jaxlib, keras, protobuf), $("$py" -V)"
names=$(sed 's/[=<>~].*//; s/-/[-_.]/g' "$tmp/constraints.txt" | paste -sd'|')
"$py" -m pip freeze | grep -iE "^($names|jaxlib|keras|protobuf)==" \
  | sed 's/^/  /'
echo "   install took $((SECONDS - start)) s"

results=()
run_item() {  # run_item NAME COMMAND...: runs in $tmp, logs to $tmp/NAME.log
  local name=$1 t=$SECONDS status=PASS
  shift
  (cd "$tmp" && timeout 600 "$@") > "$tmp/$name.log" 2>&1 || status=FAIL
  if [[ $status == FAIL ]]; then
    tail -n 25 "$tmp/$name.log" | sed 's/^/  | /'
  fi
  printf '%s  %-8s %4d s\n' "$status" "$name" $((SECONDS - t))
  results+=("$status")
}

# Every module imports (what of each dependency's API vit_jax reaches at
# import); pandas reads an AugReg index; matplotlib draws a figure.
run_item imports "$py" - <<'EOF'
import importlib
import pkgutil

import numpy as np

import vit_jax
from vit_jax.analysis import figures
from vit_jax.checkpoints import pretrained

# Commands are left out; main's flags would clash with plan's (train runs it).
for module in pkgutil.walk_packages(vit_jax.__path__, 'vit_jax.'):
  if not module.name.endswith(('__main__', '.main')):
    importlib.import_module(module.name)
print('imported every vit_jax module')

with open('index.csv', 'w') as f:
  f.write('filename,ds,final_val\n'
          'Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03,i21k,0.5\n'
          'Ti_16-i21k-300ep-lr_0.001-aug_light0-wd_0.1,i21k,0.6\n'
          'Ti_16-i1k-300ep-lr_0.001-aug_light0-wd_0.1,i1k,0.9\n')
best = pretrained.augreg_filename('.', 'Ti_16')
assert best == 'Ti_16-i21k-300ep-lr_0.001-aug_light0-wd_0.1', best
figures.save(figures.attention_distance(np.ones((2, 3)), 0.5), 'fig.png')
print('pandas and matplotlib ok')
EOF

# Four families' presets (ViT, Mixer, the ResNet hybrid, EVA-02's RoPE and
# SwiGLU) forward, and the published .npz format written and read back; on
# two CPU devices, SigLIP's loss chunked over a mesh (shard_map) as unchunked.
run_item models env XLA_FLAGS=--xla_force_host_platform_device_count=2 \
  "$py" - <<'EOF'
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import losses
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.platform import sharding

for name, size in [('testing', 32), ('Mixer-testing', 32),
                   ('R+ViT-Ti_16', 64), ('EVA02-testing', 28)]:
  model = models.get_model(name, num_classes=3)
  images = jax.random.normal(jax.random.key(0), (2, size, size, 3))
  params = model.init(jax.random.key(1), images, train=False)['params']
  logits = model.apply({'params': params}, images, train=False)
  assert logits.shape == (2, 3) and jnp.isfinite(logits).all(), name
  files.save(params, f'{name}.npz')
  back = files.load(f'{name}.npz')
  again = model.apply({'params': back}, images, train=False)
  np.testing.assert_array_equal(again, logits, err_msg=name)
  print(name, 'ok', logits.shape)

mesh = sharding.make_mesh([('data', -1)])
zimg, ztxt = (z / jnp.linalg.norm(z, axis=-1, keepdims=True) for z in
              jax.random.normal(jax.random.key(2), (2, 8, 16)))
chunked = jax.jit(lambda *a: losses.sigmoid_loss_chunked(*a, mesh=mesh))
np.testing.assert_allclose(chunked(zimg, ztxt, 10., -10.),
                           losses.sigmoid_loss(zimg, ztxt, 10., -10.),
                           rtol=1e-5)
print('sigmoid_loss_chunked ok on', dict(mesh.shape))
EOF

# The default job (Fashion-MNIST from Debian's dataset-fashion-mnist,
# prepared into a fresh tfds folder), 20 steps then 10 more from its Orbax
# checkpoint (a longer run: --allow_config_change); the test split is
# evaluated at the end of each.
train=("$py" -m vit_jax.main "--config=$repo/configs/default.py"
       --workdir=wd --config.tfds_data_dir=tfds --config.batch=32
       --config.warmup_steps=5 --config.progress_every=10
       --config.checkpoint_every=10 --config.evals.test.every=0
       --config.shuffle_buffer=1000)
run_item train bash -c '"$@" --config.total_steps=20 \
  && grep -q "Done: 20 steps" train.log' _ "${train[@]}"
run_item resume bash -c '"$@" --config.total_steps=30 --allow_config_change \
  && grep -q "Resuming from step 20" resume.log \
  && grep -q "Done: 30 steps" resume.log' _ "${train[@]}"

run_item convert bash -c '"$1" -m vit_jax.convert --model_name=testing \
  "$2/tests/data/timm_vit.safetensors" timm_vit.npz && test -s timm_vit.npz' \
  _ "$py" "$repo"
run_item predict bash -c '"$1" -m vit_jax.predict --checkpoint=timm_vit.npz \
  "$2/tests/data/predict_image.jpg" && grep -q "predict_image.jpg:" predict.log' \
  _ "$py" "$repo"

overall=PASS
[[ " ${results[*]} " == *" FAIL "* ]] && overall=FAIL
echo "$overall  overall, $((SECONDS - start)) s"
[[ "${KEEP:-}" == 1 ]] && echo "Kept $tmp"
[[ $overall == PASS ]]
