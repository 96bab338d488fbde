"""Helpers shared by the tests.

Paths: the repository (`ROOT`) and its golden files (`DATA`), the same from
every folder of tests/. Parameters: random draws of `jax.eval_shape`'s
shapes, since initializing costs more than applying on CPU. References:
numpy code written from the papers' equations, independent of `vit_jax`.
"""

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.extend
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'tests', 'data')


def param_shapes(module, *args, **kw):
  """`module.init(key, *args, **kw)['params']` as shapes, without running it."""
  return jax.eval_shape(
      lambda: module.init(jax.random.key(0), *args, **kw))['params']


def random_params(module, *args, seed=0, scale=0.5, dtype=np.float32, **kw):
  """N(0, scale^2) parameters of `module`'s shapes, from numpy's `seed`.

  The leaves are drawn in `jax.tree.flatten`'s order, one generator for all.
  """
  leaves, treedef = jax.tree.flatten(param_shapes(module, *args, **kw))
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(
      treedef, [rng.normal(0, scale, l.shape).astype(dtype) for l in leaves])


def eqns(jaxpr):
  """The equations of a (closed) jaxpr in program order, those of its
  sub-jaxprs (jit, scan, remat, custom_vjp...) in place of their caller's."""
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from eqns(sub)


# Numpy references.


def layernorm(x, p, eps=1e-6):
  """LayerNorm over the last axis, with `p`'s scale and bias."""
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu)**2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p['scale'] + p['bias']


def gelu(x):  # tanh approximation, as flax's nn.gelu
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def mlp(x, p):
  """Two dense layers with a GELU between: `Dense_0`, `Dense_1` of `p`."""
  h = gelu(x @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])
  return h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


def patch_embed(images, p, patch):
  """Linear projection of the flattened patch x patch patches, row-major.

  `p` holds the (patch, patch, channels, width) kernel and the bias of the
  stride-`patch` convolution that the models use for it.
  """
  n, h, w, c = images.shape
  gh, gw = h // patch, w // patch
  x = images.reshape(n, gh, patch, gw, patch, c).transpose(0, 1, 3, 2, 4, 5)
  x = x.reshape(n, gh * gw, patch * patch * c)
  return x @ p['kernel'].reshape(-1, p['kernel'].shape[-1]) + p['bias']


def smooth_1d(n, channels=5):
  """Known smooth channels at entry centers (i + .5) / n; two quadratic."""
  u = (np.arange(n) + .5) / n
  return np.stack([1 + 2 * u - 3 * u * u, u * u - .5 * u, np.sin(2 * u),
                   np.cos(3 * u), np.exp(-u)][:channels], -1)


def cubic_taps_inside(old, new):
  """New cells whose four cubic taps (half-pixel centers) lie in the grid."""
  x = (np.arange(new) + .5) * old / new - .5
  return (np.floor(x) >= 1) & (np.floor(x) + 2 <= old - 1)


def tiny_image_text(config, fmnist_dirs):
  """An image-text config (configs/lit_fmnist.py's or siglip_fmnist.py's)
  on the tests' Fashion-MNIST, with the 'testing' ViT and a one-block text
  tower."""
  from vit_jax.models import registry  # pylint: disable=g-import-not-at-top
  with config.unlocked():
    config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
    config.pp.crop = 32
    config.model.image = registry.MODEL_CONFIGS['testing'].to_dict()
    config.model.text = dict(width=16, num_layers=1, mlp_dim=32, num_heads=2,
                             vocab_size=256)
    config.model.pp.max_len = 8
    config.model.out_dim = (None, 10)  # the 'testing' ViT's width
  return config


def assert_npz_close(actual_path, expected_path):
  """Two .npz files hold the same arrays, to float32 rounding."""
  expected, actual = np.load(expected_path), np.load(actual_path)
  assert sorted(expected.files) == sorted(actual.files)
  for key in expected.files:
    np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5,
                               atol=1e-6, err_msg=key)


def predict_golden():
  """(the picture, timm's outputs for it, the record `convert` writes for
  its checkpoint) of scripts/make_predict_golden.py."""
  image = os.path.join(DATA, 'predict_image.jpg')  # 300 x 200
  golden = np.load(os.path.join(DATA, 'timm_predict.npz'))
  with open(os.path.join(DATA, 'timm_predict.transform.json')) as f:
    return image, golden, json.load(f)


def kill_9_and_rerun(command, env, step: int) -> str:
  """Runs `command` (in ROOT) until it reports `step`, SIGKILLs it (no
  chance to save anything), runs it again to the end; that run's stdout."""
  proc = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  for line in proc.stdout:
    if line.startswith(f'[{step}/'):
      proc.kill()
      break
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, 'the run ended before the kill'
  return subprocess.run(command, check=True, cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300).stdout


# `python -m MODULE ARGS...` for each (MODULE, ARGS) in turn, in one process
# (one start and import of the package and TensorFlow, not one each): each
# run's exit code, stdout and stderr (file descriptors 1 and 2, so that
# absl's and TensorFlow's lines would show too) and whether TensorFlow was
# imported by then. The flags a run defines are dropped after it, as a new
# process would not have them.
_CLI_RUNS = textwrap.dedent('''
    import json, os, runpy, sys, tempfile
    from absl import app, flags, logging
    app.define_help_flags()  # absl's own flags stay
    root = os.getcwd()
    sys.path.insert(0, root)
    out = []
    for module, args, cwd in json.loads(sys.argv[1]):
      os.chdir(cwd or root)
      sys.argv = [module, *args]
      defined = set(flags.FLAGS)
      sys.stdout.flush()
      sys.stderr.flush()
      saved = os.dup(1), os.dup(2)
      with tempfile.TemporaryFile('w+') as o, tempfile.TemporaryFile('w+') as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        try:
          runpy.run_module(module, run_name='__main__')
          code = 0
        except SystemExit as exit_:
          code = exit_.code
          if code is None:
            code = 0
          elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        finally:
          sys.stdout.flush()
          sys.stderr.flush()
          os.dup2(saved[0], 1)
          os.dup2(saved[1], 2)
        o.seek(0)
        e.seek(0)
        out.append(dict(code=code, stdout=o.read(), stderr=e.read(),
                        tensorflow='tensorflow' in sys.modules))
      os.chdir(root)
      for name in set(flags.FLAGS) - defined:
        delattr(flags.FLAGS, name)
      flags.FLAGS.unparse_flags()
    print(json.dumps(out))
''')


def cli_runs(commands, env=None):
  """[{code, stdout, stderr, tensorflow}] of `python -m MODULE *ARGS` for
  each (MODULE, ARGS) or (MODULE, ARGS, CWD) of `commands` (CWD default
  ROOT), in order, all in one process (`_CLI_RUNS`): for checks of command
  lines that need no fresh process each."""
  commands = [(c[0], [str(a) for a in c[1]], str(c[2]) if c[2:] else None)
              for c in commands]
  result = subprocess.run(
      [sys.executable, '-c', _CLI_RUNS, json.dumps(commands)],
      capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout)


def _flag_value(text):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # a path


def run_here(argv, get_config=None, devices=None):
  """`python -m vit_jax.main`'s run of `argv` (its `--workdir=` and
  `--config.KEY=VALUE` flags over `get_config`'s config, default
  configs/default.py's), in this process, as main runs it: settled by
  `run_config`, checked, trained on `devices` (default all)."""
  # Here, not above: the models' tests import this module without the
  # training and data stack.
  # pylint: disable=g-import-not-at-top
  from vit_jax import launch
  from vit_jax import run_config
  from vit_jax.configs import default
  from vit_jax.platform import sharding
  # pylint: enable=g-import-not-at-top
  argv, held = run_config.held_model_flags(argv)
  given = dict(a[len('--config.'):].split('=', 1) for a in argv
               if a.startswith('--config.'))
  given = {k: _flag_value(v) for k, v in given.items()}
  workdir = next(a.split('=', 1)[1] for a in argv
                 if a.startswith('--workdir='))
  config = (get_config or default.get_config)()
  config.update_from_flattened_dict(given)
  config.lock()
  config = run_config.resolve(config, given, held)
  mesh = launch.check(config, devices and sharding.make_mesh(config.mesh,
                                                             devices))
  return launch.train_and_evaluate(config, workdir, mesh=mesh)
