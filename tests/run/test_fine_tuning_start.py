"""Fine-tuning draws only the new head (`Task.drawn_keys`): its first state
is the one of drawing every parameter, then loading the checkpoint."""

import os

import chex
import jax

from tests import helpers
from vit_jax import convert
from vit_jax import launch
from vit_jax import run_config
from vit_jax.configs import default
from vit_jax.run import loop


def test_the_state_is_that_of_drawing_all(fmnist_dirs, tmp_path, capsys):
  npz = str(tmp_path / 'w.npz')
  convert.convert(os.path.join(helpers.DATA, 'timm_ssl/dinov2'), npz)
  flags = {'tfds_manual_dir': fmnist_dirs[0], 'tfds_data_dir': fmnist_dirs[1],
           'pretrained_path': npz, 'model_name': 'DINOv2-testing',
           'pp.crop': 28, 'batch': 8}
  argv, held = run_config.held_model_flags(
      [f'--config.{k}={v}' for k, v in flags.items()])
  given = {k: v for k, v in flags.items() if f'--config.{k}={v}' in argv}
  config = default.get_config()
  config.update_from_flattened_dict(given)
  config = run_config.resolve(config, given, held)
  task = launch.make_task(config, str(tmp_path / 'wd'))
  assert task.drawn_keys() is not None
  manager = loop.make_manager(config, str(tmp_path / 'wd'))
  state, _, start = loop.create_state(task, config, task.mesh,
                                              manager)
  manager.close()
  assert start == 0 and 'new head' in capsys.readouterr().err

  init, _, shardings = loop.abstract_state(task, config, task.mesh)
  everything = jax.jit(init, out_shardings=shardings)()
  params = task.initial_params(jax.device_get(everything.params))
  expected = everything.replace(
      params=jax.device_put(params, shardings.params))
  for field in ('step', 'params', 'opt_state'):
    got, want = getattr(state, field), getattr(expected, field)
    chex.assert_trees_all_equal(jax.device_get(got), jax.device_get(want))
    assert all(jax.tree.leaves(jax.tree.map(
        lambda a, b: a.sharding.is_equivalent_to(b.sharding, a.ndim),
        got, want))), field
