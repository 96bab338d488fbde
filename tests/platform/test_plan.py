"""vit_jax.plan: the loop's step compiled for a TPU slice on this CPU."""

import importlib.util
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from vit_jax import models
from vit_jax import plan


HAS_LIBTPU = importlib.util.find_spec('libtpu') is not None
needs_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU, reason="libtpu: pip install -e '.[tpu]' (CI installs it)")


# plan's command lines (module, args), each test's own; those that need
# libtpu only where it is installed.
PLAN_RUNS = {
    'testing': ['--config=configs/vit.py:testing,cifar10',
                '--topology=v5e:2x2', '--config.batch=64'],
    'v9:2x2': ['--config=configs/default.py', '--topology=v9:2x2'],
    'v5e': ['--config=configs/default.py', '--topology=v5e'],
    'v5e:3x7': ['--config=configs/default.py', '--topology=v5e:3x7'],
    'lit': ['--config=configs/lit_fmnist.py:softmax', '--topology=v5e:2x2'],
    'too big': ['--config=configs/default.py', '--config.batch=40000000',
                '--topology=v5e:2x2'],
}
NEED_LIBTPU = ('testing', 'v5e:3x7', 'lit', 'too big')
# One worker runs the tests of `plan_runs`' process, so that it starts once.
plan_cli = pytest.mark.xdist_group('plan_cli')


@pytest.fixture(scope='module')
def plan_runs():
  """{name: (exit code, stdout, stderr)} of `python -m vit_jax.plan` with
  each of PLAN_RUNS' flags, all in one process (`helpers.cli_runs`)."""
  names = [n for n in PLAN_RUNS if HAS_LIBTPU or n not in NEED_LIBTPU]
  results = helpers.cli_runs([('vit_jax.plan', PLAN_RUNS[n]) for n in names])
  return {n: (r['code'], r['stdout'], r['stderr'])
          for n, r in zip(names, results)}


def _figure(text, label):
  """The number after `label` in plan's output, with its decimal prefix."""
  number, prefix = re.search(re.escape(label) + r'\s+([\d.]+) ?([kMGT]?)',
                             text).groups()
  return float(number) * 10.0**(3 * ' kMGT'.index(prefix or ' '))


# What plan prints.


@needs_libtpu
@plan_cli
def test_plan_of_the_testing_preset_on_v5e(plan_runs):
  code, out, stderr = plan_runs['testing']
  assert code == 0, stderr[-3000:]
  assert 'testing on TPU v5e, 4 chips (1 host); global batch 64 = 4 x 16' in out
  assert 'of 16 GiB HBM: fits' in out
  # The roofline, from the printed FLOPs, bytes and v5e's published peaks.
  flops = _figure(out, 'FLOPs per step')
  traffic = _figure(out, 'HBM bytes per step')
  seconds = max(flops / 197e12, traffic / 819e9)  # 3 digits each
  assert _figure(out, 'step time') == pytest.approx(seconds * 1e3, rel=0.01)
  assert _figure(out, 'images/s') == pytest.approx(16 / seconds, rel=0.01)
  cores = 16 / seconds * 4 / 500  # 4 chips on one host, 500 img/s a core
  assert _figure(out, 'host cores') == pytest.approx(np.ceil(cores), abs=1)


@pytest.mark.parametrize('topology,message', [
    ('v9:2x2', "--topology='v9:2x2'; expected GENERATION:SHAPE"),
    ('v5e', "--topology='v5e'; expected GENERATION:SHAPE"),
    ('v5e:3x7', 'libtpu refuses --topology=v5e:3x7: '),
])
@plan_cli
def test_bad_topology_is_one_line(plan_runs, topology, message):
  if 'libtpu' in message and not HAS_LIBTPU:
    pytest.skip('libtpu judges the shape')
  code, stdout, stderr = plan_runs[topology]
  assert code == 1
  lines = stderr.strip().splitlines()
  assert lines[0].startswith('Error: ') and message in lines[0], lines
  assert not stdout


@pytest.mark.parametrize('name,message', [
    ('lit', "config.trainer='lit': vit_jax.plan compiles the steps of"),
    ('too big', "The step does not fit TPU v5e's 16 GiB: RESOURCE_EXHAUSTED: "),
])
@needs_libtpu
@plan_cli
def test_step_plan_cannot_build_is_one_line(plan_runs, name, message):
  code, stdout, stderr = plan_runs[name]
  assert code == 1
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('Error: '), lines
  assert message in lines[0] and not stdout


def test_missing_libtpu_says_how_to_install(monkeypatch):
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[tpu\]'"):
    plan.topology_devices('v5e:2x2')


def test_chips_are_the_published_figures():
  """Cloud TPU's spec pages: bf16 peak, HBM capacity and bandwidth, chips
  per host of a multi-host slice."""
  assert [(c.peak_tflops, c.hbm_gib, c.hbm_gbps, c.chips_per_host)
          for c in plan.CHIPS.values()] == [
              (275, 32, 1200, 4), (197, 16, 819, 8), (459, 95, 2765, 4),
              (918, 32, 1640, 8)]
  assert plan.parse_topology('v4:4x4x8') == (plan.CHIPS['v4'], 128)
  assert plan.parse_topology('v6e:16x16') == (plan.CHIPS['v6e'], 256)


# The compiled step's figures against counts from the equations.


def _small_vit_config(strategy='replicate'):
  """A 3-block ViT whose products dominate its FLOPs, blocks scanned."""
  from vit_jax.configs import common  # pylint: disable=import-outside-toplevel
  config = common.with_model(common.get_config(), 'small', dict(
      patches=dict(size=(4, 4)), hidden_size=128, classifier='token',
      representation_size=None, posemb='learn', dtype='float32',
      transformer=dict(mlp_dim=512, num_heads=4, num_layers=3,
                       dropout_rate=0.0, attention_dropout_rate=0.0,
                       remat_policy='none', scan=True)))
  config.pp.crop, config.batch = 32, 128
  config.optimizer, config.sharding_strategy = 'adamw', strategy
  return config


def _vit_flops_per_image(d=128, mlp=512, layers=3, tokens=65, patches=64,
                         patch_pixels=48, classes=10):
  """Forward FLOPs of a ViT from its matrix products (2 per multiply-add)."""
  block = tokens * (4 * d * d + 2 * d * mlp) + 2 * tokens * tokens * d
  return 2 * (layers * block + patches * patch_pixels * d + d * classes)


@needs_libtpu
def test_compiled_step_figures_match_the_equations():
  """A scanned step: XLA counts a loop's body once, plan counts every
  block (from 1- and 2-block unrolled compiles)."""
  devices = plan.topology_devices('v5e:2x2')
  info = plan.dataset_info(None, num_classes=10)
  config = _small_vit_config()
  compiled = plan.compile_step(config, devices, info)
  assert compiled.micro_batch == 32
  # Parameters, AdamW's two moments, float32, on every chip.
  params = jax.eval_shape(
      lambda: models.model_class('small')(num_classes=10, **config.model)
      .init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))
  n = sum(x.size for x in jax.tree.leaves(params))
  assert compiled.state_bytes == pytest.approx(3 * 4 * n, abs=64)
  # Forward and backward: 3x the forward's products, per chip.
  products = 3 * 32 * _vit_flops_per_image()
  assert compiled.model_flops == pytest.approx(products, rel=0.1)
  e = plan.estimate(compiled, plan.CHIPS['v5e'], 1)
  assert e.flops == pytest.approx(products, rel=0.1)
  assert e.total_gib < 16 and e.temp_gib > 0
  # FSDP splits the large leaves over the 4 chips.
  _, _, state, _ = plan.sharded_state(_small_vit_config('fsdp'), devices,
                                      info)
  assert plan.per_chip_bytes(state) < 0.3 * compiled.state_bytes


def test_fit_finds_the_largest_multiple_of_eight(monkeypatch):
  """A memory line of 2 + 0.1 GiB per image on a 16 GiB chip: 136 fit
  (144 would take 16.4 GiB)."""
  chip = plan.CHIPS['v5e']
  tried = []

  def fake(config, devices, info, chip, per_chip):
    del config, devices, info
    tried.append(per_chip)
    total = 2 + 0.1 * per_chip
    fits = total <= chip.hbm_gib
    return total, ((None, plan.Estimate(0, 0, total, 0, 0, 1, '', per_chip,
                                        0), None) if fits else None)

  monkeypatch.setattr(plan, 'try_batch', fake)
  batch, found = plan.fit_batch(None, None, None, chip, start=16)
  assert batch == 136 and found[1].total_gib <= 16
  assert tried == [16, 32, 136, 144]  # the line, its answer, the next
  tried.clear()
  batch, _ = plan.fit_batch(None, None, None, chip, start=256)  # too big
  assert batch == 136 and tried == [256, 128, 136, 144]
  tried.clear()
  # Memory that does not grow at first: the batch doubles until it does.
  monkeypatch.setattr(plan, 'try_batch', lambda c, d, i, chip, b: (
      tried.append(b), fake(c, d, i, chip, b))[1] if b > 64 else (
          tried.append(b), (2.0, (None, None, None)))[1])
  batch, _ = plan.fit_batch(None, None, None, chip, start=32)
  assert batch == 136


@needs_libtpu
def test_captioning_step_lowers_for_a_slice():
  """The captioner's step (encoder, decoder, parallel prediction) on a
  v5e:2x2 mesh, lowered as plan compiles it (the compile itself, 84 s here,
  is docs/captioning.md's)."""
  from vit_jax import tpu_slices  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import captioning_fmnist  # pylint: disable=g-import-not-at-top
  config = captioning_fmnist.get_config('cappa')
  devices = tpu_slices.topology_devices('v5e:2x2')
  lowered, state, data = plan._lowered_step(
      config, devices, plan.dataset_info(config, num_classes=10))
  assert data == 4
  assert 'text' in state.params and 'encoder' in state.params
  text = lowered.as_text()
  assert 'mhlo.num_partitions = 4' in text
  assert 'tensor<128x24xi32>' in text  # the global batch of captions


def test_a_video_plan_counts_clips_and_each_clips_frames_for_the_host():
  from configs import vivit_fmnist  # pylint: disable=g-import-not-at-top
  config = vivit_fmnist.get_config('scratch')
  chip, chips = plan.parse_topology('v5e:2x2')
  compiled = plan.Compiled(executable=None, micro_batch=8, state_bytes=0,
                           model_flops=0., flops=0., hbm_bytes=0.)
  e = plan.Estimate(state_gib=0., temp_gib=0., total_gib=0., flops=1e9,
                    hbm_bytes=1e9, seconds=0.01, bound='HBM bandwidth',
                    img_per_s=800., mfu=0.)
  text = '\n'.join(plan.describe(config, chip, chips, compiled, e,
                                 img_per_core=1000))
  assert _figure(text, 'clips/s') == 800 and 'images/s' not in text
  # 800 clips/s per chip of 8 frames, 4 chips a host, 1000 frames a core.
  assert _figure(text, 'host cores') == np.ceil(800 * 8 * 4 / 1000)
  assert '8 frames a clip' in text
