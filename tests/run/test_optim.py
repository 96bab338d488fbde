"""The optimizer (`optim`): a short run's warmup, the optimizer state's
dtypes, layer-wise learning-rate decay."""

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax.configs import common
from vit_jax.models import vit as models_vit

from vit_jax.run import checks
from vit_jax.run import optim


def test_warmup_longer_than_a_short_run_is_clamped(tiny_config):
  """A debug run shorter than the warmup warms up for a tenth of it."""
  tiny_config.total_steps, tiny_config.warmup_steps = 60, 200
  checks.validate(tiny_config, 8)
  schedule = optim.make_schedule(tiny_config)
  assert optim.warmup_steps(tiny_config) == 6
  np.testing.assert_allclose(float(schedule(6)), tiny_config.base_lr)
  assert float(schedule(3)) < float(schedule(6)) > float(schedule(30)) > 0
  tiny_config.warmup_steps = 5
  assert optim.warmup_steps(tiny_config) == 5


def test_momentum_dtype_sets_the_optimizer_state(tiny_config):
  params = {'w': np.zeros((4, 3), np.float32)}
  dtypes = {}
  for optimizer in ('sgd', 'adamw'):
    for dtype in ('float32', 'bfloat16'):
      tiny_config.optimizer, tiny_config.momentum_dtype = optimizer, dtype
      state = optim.make_optimizer(tiny_config).init(params)
      dtypes[optimizer, dtype] = sorted(
          {str(x.dtype) for x in jax.tree.leaves(state) if x.ndim})
  # AdamW's second moment stays float32.
  assert dtypes['sgd', 'float32'] == ['float32']
  assert dtypes['sgd', 'bfloat16'] == ['bfloat16']
  assert dtypes['adamw', 'float32'] == ['float32']
  assert dtypes['adamw', 'bfloat16'] == ['bfloat16', 'float32']
  state = optim.make_optimizer(tiny_config).init(params)
  assert optax.tree_utils.tree_get(state, 'mu')['w'].dtype == jax.numpy.bfloat16
  assert optax.tree_utils.tree_get(state, 'nu')['w'].dtype == np.float32
  # Accumulating micro-batches adds a float32 sum of the gradients.
  tiny_config.accum_steps = 2
  state = optim.make_optimizer(tiny_config).init(params)
  assert state.acc_grads['w'].dtype == np.float32


def _vit(scan):
  """A 3-block ViT with a class token and a head, as fine-tuning trains."""
  model = models_vit.VisionTransformer(
      num_classes=5, patches=dict(size=(4, 4)), hidden_size=8,
      transformer=dict(num_layers=3, mlp_dim=16, num_heads=2, scan=scan,
                       dropout_rate=0., attention_dropout_rate=0.))
  return model, model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)),
                           train=False)['params']


def _exponent(path, depth):
  """BEiT's rule, written out: the blocks count down from the head."""
  if path.startswith('Transformer/encoderblock_'):
    return depth - int(path.split('/')[1].split('_')[1])
  if path.split('/')[0] in ('embedding', 'cls') or 'posembed' in path:
    return depth + 1
  assert path.split('/')[0] in ('head', 'Transformer'), path  # encoder_norm
  return 0


def _grads(params, seed):
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return treedef.unflatten([jax.random.normal(k, x.shape)
                            for k, x in zip(keys, leaves)])


def test_layer_decay_gives_each_block_its_rate(tiny_config):
  """Two AdamW steps with layer decay equal, leaf by leaf, AdamW at
  base_lr * decay**exponent, the exponent by BEiT's rule (L = 3)."""
  tiny_config.update(optimizer='adamw', weight_decay=0.1, grad_norm_clip=0.,
                     layer_decay=0.65, total_steps=10, warmup_steps=2)
  _, params = _vit(scan=False)
  tx = optim.make_optimizer(tiny_config)
  state, new = tx.init(params), params
  for seed in (1, 2):
    updates, state = tx.update(_grads(params, seed), state, new)
    new = optax.apply_updates(new, updates)
  schedule = optim.make_schedule(tiny_config)
  flat = traverse_util.flatten_dict(params, sep='/')
  exponents = {k: _exponent(k, 3) for k in flat}
  assert sorted(set(exponents.values())) == [0, 1, 2, 3, 4]
  grads = [traverse_util.flatten_dict(_grads(params, s), sep='/')
           for s in (1, 2)]
  for path, value in flat.items():
    lr = lambda step, e=exponents[path]: schedule(step) * 0.65**e
    ref = optax.adamw(lr, b1=0.9, b2=0.999, weight_decay=0.1)
    ref_state, x = ref.init(value), value
    for g in grads:
      u, ref_state = ref.update(g[path], ref_state, x)
      x = x + u
    np.testing.assert_allclose(
        traverse_util.flatten_dict(new, sep='/')[path], x, rtol=1e-6,
        atol=1e-7, err_msg=path)


def test_layer_decay_of_scanned_blocks_is_per_block(tiny_config):
  """Scanned, block i's slice of the stacked parameters gets block i's
  factor; the embeddings and head as unscanned."""
  _, plain = _vit(scan=False)
  _, scanned = _vit(scan=True)
  factors = optim.layer_decay_factors(scanned, 0.5)
  stacked = factors['Transformer']['encoderblock']
  for leaf in jax.tree.leaves(stacked):
    np.testing.assert_allclose(leaf.reshape(-1), [0.5**3, 0.5**2, 0.5])
  assert factors['embedding']['kernel'] == 0.5**4
  assert factors['Transformer']['encoder_norm']['scale'] == 1.
  plain_factors = optim.layer_decay_factors(plain, 0.5)
  assert plain_factors['Transformer']['encoderblock_2']['MlpBlock_0'][
      'Dense_0']['kernel'] == 0.5
  # Under a prefix (a task's encoder), the same.
  nested = optim.layer_decay_factors({'encoder': plain, 'head': {}}, 0.5)
  assert nested['encoder']['cls'] == 0.5**4


def test_layer_decay_needs_one_vit(tiny_config):
  with pytest.raises(ValueError, match='one ViT encoder'):
    optim.layer_decay_factors({'w': np.zeros(3)}, 0.5)
  _, params = _vit(scan=False)
  with pytest.raises(ValueError, match='found 2'):
    optim.layer_decay_factors({'img': params, 'txt': params}, 0.5)
  tiny_config.layer_decay = 1.5
  with pytest.raises(ValueError, match=r'layer_decay=1.5 must be in \(0, 1\]'):
    checks.validate(tiny_config, 8)
  swin = common.with_model(common.get_config(), 'Swin-T').unlock()
  swin.layer_decay = 0.65
  with pytest.raises(ValueError, match='Swin-T is a Swin'):
    checks.check_layer_decay(swin)
