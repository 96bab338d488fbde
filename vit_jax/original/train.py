"""The original's `vit_jax.train`: `train_and_evaluate` (the loop's, through
`vit_jax.launch`) and its data-parallel `make_update_fn`."""

from flax.training import train_state
import jax
import jax.numpy as jnp
import ml_collections
import optax

# pylint: disable=unused-import
from vit_jax.launch import evaluate
from vit_jax.launch import make_task
from vit_jax.launch import train_and_evaluate
# pylint: enable=unused-import
from vit_jax.tasks import classification


def make_update_fn(*, apply_fn, accum_steps, tx):
  """The original's data-parallel update: (params, opt_state, batch, rng) ->
  (params, opt_state, loss, rng), `jax.pmap`ped over the local devices
  (axis 'batch'), batches as `input_pipeline.get_data_from_tfds` gives them.

  It is the loop's own classification step (softmax cross-entropy), run on
  `accum_steps` micro-batches per device; their gradients are averaged over
  the devices, then over the micro-batches, before `tx` (optax) updates.
  """
  config = ml_collections.ConfigDict({'loss': 'softmax_xent'})
  # The state's optimizer around the caller's `tx`, whose state it keeps.
  mean_over_devices = optax.GradientTransformation(
      lambda params: optax.EmptyState(),
      lambda updates, state, params=None: (
          jax.lax.pmean(updates, 'batch'), state))
  step_tx = optax.chain(mean_over_devices,
                        optax.MultiSteps(tx, every_k_schedule=accum_steps))

  def update_fn(params, opt_state, batch, rng):
    _, new_rng = jax.random.split(rng)
    # Each device its own dropout (the index is unique across hosts).
    rng = jax.random.fold_in(rng, jax.lax.axis_index('batch'))
    state = train_state.TrainState(
        step=0, apply_fn=apply_fn, params=params, tx=step_tx,
        opt_state=(optax.EmptyState(), optax.MultiStepsState(
            mini_step=0, gradient_step=0, inner_opt_state=opt_state,
            acc_grads=jax.tree.map(jnp.zeros_like, params), skip_state=())))
    micro = jax.tree.map(
        lambda x: x.reshape(accum_steps, -1, *x.shape[1:]), batch)
    state, metrics = jax.lax.scan(
        lambda s, b: classification.train_step(s, b, rng=rng, config=config),
        state, micro)
    loss = jax.lax.pmean(metrics['loss'].mean(), 'batch')
    return (state.params, state.opt_state[1].inner_opt_state, loss, new_rng)

  return jax.pmap(update_fn, axis_name='batch', donate_argnums=(0,))
