r"""The pretraining table of docs/performance.md, from `vit_jax.plan`.

For each model and TPU slice: the AugReg/big_vision ImageNet-21k recipe
(`configs/augreg.py:VARIANT,none,i21k`: Adam with a bfloat16 first moment,
global batch 4096, 224 px, 21,843 classes), bfloat16 matmuls, the blocks
unrolled, compiled for the slice by the TPU compiler on this CPU.
The first setting of `LADDER` that fits the chip's HBM is kept: replicated
parameters without remat, then FSDP, then remat policies. Every figure is
the compiler's count and the roofline estimate of `vit_jax.plan`, not a
measurement on a TPU.

  pip install -e '.[tpu]'
  python benchmarks/pretraining_plan.py --models=b16,l16,h14 \
      --topologies=v4:4x4x8,v5e:16x16,v5p:4x4x8,v6e:16x16
"""

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax import plan  # pylint: disable=g-import-not-at-top  (sets JAX_PLATFORMS first)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from vit_jax.configs import augreg

flags.DEFINE_list('models', ['b16', 'l16', 'h14'],
                  "configs/augreg.py's variants, and g14 (ViT-g/14).")
flags.DEFINE_list('topologies', ['v4:4x4x8', 'v5e:16x16', 'v5p:4x4x8',
                                 'v6e:16x16'], 'TPU slices.')
flags.DEFINE_integer('batch', augreg.BATCH, 'Global batch.')
flags.DEFINE_bool('scan', False, 'Blocks under nn.scan (faster to compile; '
                  'without remat, 3.5x the temporaries of the unrolled step '
                  'on a TPU: docs/performance.md).')
FLAGS = flags.FLAGS

IMAGENET21K = 14_197_122  # images in one epoch
# Tried in order; the first that fits is the table's.
LADDER = (('replicate', 'none'), ('fsdp', 'none'),
          ('fsdp', 'dots_no_batch'), ('fsdp', 'full'))


# ViT-g/14 of "Scaling Vision Transformers" (Zhai et al., 2022; big_vision's
# 'g'): no preset of the original's, so H/14's config with its sizes.
GIANT = {'model.hidden_size': 1408, 'model.transformer.mlp_dim': 6144,
         'model.transformer.num_heads': 16, 'model.transformer.num_layers': 40,
         'model_name': 'ViT-g_14'}


def config_for(variant: str):
  config = augreg.get_config(f'{"h14" if variant == "g14" else variant},'
                             'none,i21k')
  return plan._with(config, batch=FLAGS.batch,  # pylint: disable=protected-access
                    **{'model.dtype': 'bfloat16',
                       'model.transformer.scan': FLAGS.scan},
                    **(GIANT if variant == 'g14' else {}))


def first_fit(config, devices, info, chip):
  """(strategy, remat, Compiled, Estimate) of the first LADDER rung that
  fits; None if none does."""
  for strategy, remat in LADDER:
    tried = plan._with(config, sharding_strategy=strategy,  # pylint: disable=protected-access
                       **{'model.transformer.remat_policy': remat})
    try:
      compiled = plan.compile_step(tried, devices, info, count=False)
    except Exception as e:  # pylint: disable=broad-except
      if plan._out_of_memory(e):  # pylint: disable=protected-access
        continue
      raise
    if plan.estimate(compiled, chip, 1).total_gib <= chip.hbm_gib:
      compiled = plan.count_flops(compiled, tried, devices, info)
      return strategy, remat, compiled, plan.estimate(compiled, chip, 1)
  return None


def main(argv):
  del argv
  print('| model | slice | chips | batch/chip | sharding | remat | memory/chip '
        '| step (est.) | img/s/chip (est.) | MFU (est.) | bound | '
        'ImageNet-21k epoch (est.) | host cores/host |')
  print('|---' * 13 + '|', flush=True)
  for variant in FLAGS.models:
    config = config_for(variant)
    info = plan.dataset_info(config, 21_843)
    for topology in FLAGS.topologies:
      chip, chips = plan.parse_topology(topology)
      devices = plan.topology_devices(topology)
      t = time.perf_counter()
      found = first_fit(config, devices, info, chip)
      seconds = time.perf_counter() - t
      if found is None:
        print(f'| {config.model_name} | {topology} | {chips} | nothing in '
              f'{LADDER} fits |', flush=True)
        continue
      strategy, remat, compiled, e = found
      per_host = min(chips, chip.chips_per_host)
      cores = math.ceil(e.img_per_s * per_host / plan.HOST_IMG_PER_CORE[
          plan.host_recipe(config)])
      minutes = IMAGENET21K / (e.img_per_s * chips) / 60
      print(f'| {config.model_name.split("-augreg")[0]} | {topology} | '
            f'{chips} | {compiled.micro_batch} | {strategy} | {remat} | '
            f'{e.total_gib:.1f} of {chip.hbm_gib:g} GiB | '
            f'{e.seconds * 1e3:.0f} ms | {e.img_per_s:.0f} | '
            f'{100 * e.mfu:.0f}% | {e.bound} | {minutes:.0f} min | '
            f'{cores} of {per_host} chips |', flush=True)
      print(f'  ({topology}: {seconds:.0f} s of compiling)', file=sys.stderr,
            flush=True)


if __name__ == '__main__':
  app.run(main)
