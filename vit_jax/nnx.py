"""Every model and checkpoint of vit_jax as a Flax NNX module.

  module, transform = vit_nnx.from_pretrained('ViT-B_16.npz')
  logits = module(images, train=False)           # = model.apply
  module = vit_nnx.to_nnx(model, params, rngs=nnx.Rngs(dropout=0))
  opt = vit_nnx.optimizer(module, optim.make_optimizer(config))
  vit_nnx.update(opt, module, grads)             # grads of nnx.grad
  files.save(vit_nnx.params_of(module), path)  # and vit_nnx.model_of

The Linen modules stay the one source of truth: the NNX module is flax's
bridge (`nnx.bridge.ToNNX`) holding the Linen parameters as `nnx.Param`s,
the same arrays (their shardings kept), under the Linen names. Dropout and
stochastic depth draw from the module's `nnx.Rngs` (`dropout=`), or from
`rngs=` given to a call. The Linen methods are methods of the module
(`module.forward_intermediates(x)`), and `module(images=..., tokens=...)`
calls a two-tower model.
"""

import inspect
from typing import Any, Dict, Optional, Tuple

from flax import linen as nn
from flax import nnx
from flax.nnx import bridge
from flax.nnx.bridge import variables as bridge_variables
import jax
import optax

from vit_jax import pretrained
from vit_jax.convert import transform as transforms

# Where NNX changed across the flax versions setup.py allows (0.10 on):
# 0.12 asks that pytree data in a Module's attributes be marked, makes a
# State's `to_pure_dict` a function of nnx's and renames ToNNX's `module`
# `to_nnx__module`; 0.10's ToNNX reads only the attributes it recorded
# (`linen_attributes`); from 0.11 `Optimizer.update` takes the model.
_data = getattr(nnx, 'data', lambda value: value)
_to_pure_dict = getattr(nnx, 'to_pure_dict',
                        lambda state: state.to_pure_dict())
_UPDATE_TAKES_MODEL = 'model' in inspect.signature(
    nnx.Optimizer.update).parameters


def to_nnx(model: nn.Module, params: Dict[str, Any], *,
           rngs: Optional[nnx.Rngs] = None) -> nnx.Module:
  """The NNX module of the Linen `model` with its `params` (no copy).

  `module(x, train=...)` is `model.apply({'params': params}, x, train=...)`;
  `rngs` (e.g. `nnx.Rngs(dropout=0)`) feeds dropout and stochastic depth.
  """
  module = bridge.ToNNX(model, rngs=rngs)
  attrs = bridge_variables.linen_vars_to_nnx_attrs({'params': params})
  for name, value in attrs.items():
    if hasattr(bridge.ToNNX, name):  # a Linen name that NNX's Module uses
      raise ValueError(f'{type(model).__name__}: the parameter {name!r} '
                       'would hide the NNX attribute of that name.')
    setattr(module, name, _data(value))
  if 'linen_attributes' in vars(module):  # flax 0.10
    module.linen_attributes = tuple(attrs)
  return module


def params_of(module: nnx.Module) -> Dict[str, Any]:
  """The Linen parameter tree of `to_nnx`'s module: what `files.save`,
  Orbax and every command take."""
  return _to_pure_dict(nnx.state(module, nnx.Param))


def model_of(module: nnx.Module) -> nn.Module:
  """The Linen model of `to_nnx`'s module (for `model.clone`, a record)."""
  attrs = vars(module)
  return attrs['to_nnx__module' if 'to_nnx__module' in attrs else 'module']


def from_pretrained(src, *, rngs: Optional[nnx.Rngs] = None,
                    **kw) -> Tuple[nnx.Module, transforms.Transform]:
  """(NNX module, eval transform) of any checkpoint that
  `vit_jax.models.from_pretrained(src, **kw)` reads."""
  found = pretrained.from_pretrained(src, **kw)
  return to_nnx(found.model, found.params, rngs=rngs), found.transform


def _on_linen_trees(tx: optax.GradientTransformation
                    ) -> optax.GradientTransformation:
  """`tx` handed the Linen trees (plain dicts), which `make_optimizer`'s
  labels and layer decay read by their keys, rather than NNX's States."""
  def init(params):
    return tx.init(_to_pure_dict(params))

  def update(updates, state, params=None):
    new, state = tx.update(_to_pure_dict(updates), state,
                           None if params is None else _to_pure_dict(params))
    # A State flattens as a dict does, by sorted keys.
    return jax.tree.unflatten(jax.tree.structure(updates),
                              jax.tree.leaves(new)), state

  return optax.GradientTransformation(init, update)


def optimizer(module: nnx.Module,
              tx: optax.GradientTransformation) -> nnx.Optimizer:
  """`nnx.Optimizer` of `tx` (e.g. `run.optim.make_optimizer(config)`, its
  parameter labels included) over the module's parameters, as every flax
  version takes it."""
  return nnx.Optimizer(module, _on_linen_trees(tx), wrt=nnx.Param)


def update(opt: nnx.Optimizer, module: nnx.Module, grads) -> None:
  """One step of `opt` on `module` with `grads` (of `nnx.grad`)."""
  if _UPDATE_TAKES_MODEL:
    opt.update(module, grads)
  else:
    opt.update(grads)
