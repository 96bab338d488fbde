"""`target.attention_implementation`: cuDNN's flash attention only on the
GPUs, dtypes and head dims it takes, splash attention only for long
sequences on TPUs (devices faked), and `attention()` following it."""

import importlib.util
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import plan
from vit_jax.models import attention
from vit_jax.platform import sharding
from vit_jax.platform import target


def gpu(capability=None, kind='NVIDIA GPU'):
  """A faked CUDA device; without `capability`, one that has none."""
  device = types.SimpleNamespace(platform='gpu', device_kind=kind)
  if capability is not None:
    device.compute_capability = capability
  return device


T4, A100, H100 = gpu('7.5', 'Tesla T4'), gpu('8.0'), gpu('9.0')

# (devices, dtype, head dim, bias or mask, implementation)
CASES = {
    'T4 fp16': (T4, 'float16', 64, False, 'xla'),
    'A100 bf16': (A100, 'bfloat16', 64, False, 'cudnn'),
    'A100 fp16': (A100, 'float16', 64, False, 'cudnn'),
    'H100 bf16': (H100, 'bfloat16', 64, False, 'cudnn'),
    'A100 head 256': (A100, 'bfloat16', 256, False, 'xla'),
    'H100 head 256': (H100, 'bfloat16', 256, False, 'cudnn'),
    'H100 head 264': (H100, 'bfloat16', 264, False, 'xla'),
    'head 60, not a multiple of 8': (H100, 'bfloat16', 60, False, 'xla'),
    'float32': (H100, 'float32', 64, False, 'xla'),
    'mask or bias': (H100, 'bfloat16', 64, True, 'xla'),
    'no capability': (gpu(), 'bfloat16', 64, False, 'xla'),
    'ROCm': (gpu('gfx90a'), 'bfloat16', 64, False, 'xla'),
    '10.3, cuDNN unknown': (gpu('10.3'), 'bfloat16', 64, False, 'xla'),
    'GPU by name, CPU host': ('gpu', 'bfloat16', 64, False, 'xla'),
    'CPU': ('cpu', 'bfloat16', 64, False, 'heads_first'),
    'CPU masked': ('cpu', 'float32', 64, True, 'heads_first'),
    'TPU': ('tpu', 'bfloat16', 64, False, 'xla'),
    'TPU masked': ('tpu', 'bfloat16', 64, True, 'xla'),
}


@pytest.mark.parametrize('case', CASES.values(), ids=CASES.keys())
def test_implementation(case):
  devices, dtype, head_dim, masked, expected = case
  with target.compiling_for(devices if isinstance(devices, str)
                            else [devices]):
    assert target.attention_implementation(
        jnp.dtype(dtype), head_dim, masked) == expected


def test_gpu_by_name_takes_this_hosts_capability(monkeypatch):
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  monkeypatch.setattr(jax, 'devices', lambda *a: [H100])
  assert target.capability() == (9, 0)
  with target.compiling_for('gpu'):
    assert target.attention_implementation(jnp.bfloat16, 64, False) == 'cudnn'
  with target.compiling_for([T4]):  # the target, not this host
    assert target.capability() == (7, 5)


def _reference(q, k, v):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', weights, v)


@pytest.mark.parametrize('device,dtype,cudnn,atol', [
    (T4, jnp.float16, False, 2e-3), (A100, jnp.bfloat16, True, 3e-2)],
                         ids=['T4', 'A100'])
def test_attention_follows_the_choice(monkeypatch, device, dtype, cudnn,
                                      atol):
  """fp16 attention traced for a T4 never asks for cuDNN and still computes
  softmax(q k^T / sqrt(d)) v; for an A100 it does ask (XLA runs it here:
  the CPU has no fp16 products into float32, so that one is bf16)."""
  calls = []
  plain = jax.nn.dot_product_attention

  def recorded(*args, implementation=None, **kwargs):
    calls.append(implementation)
    return plain(*args, implementation='xla', **kwargs)

  monkeypatch.setattr(jax.nn, 'dot_product_attention', recorded)
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 2, 16), dtype)
             for i in range(3))
  with target.compiling_for([device]):  # a new function: traced anew
    out = jax.jit(lambda *x: attention.attention(*x))(q, k, v)
  assert calls == (['cudnn'] if cudnn else [])
  assert out.dtype == dtype
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             _reference(q, k, v), atol=atol)


def test_float16_logits_beyond_its_range():
  """XLA's attention in float16 (a T4's) keeps logits past 65504 finite:
  the softmax of numpy's float64 logits."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(0, 1, (1, 8, 2, 64)) for _ in range(3))
  q, k = 250 * q, 250 * k  # logits up to ~1e5
  logits = np.einsum('bqhd,bkhd->bhqk', q / 8, k)
  assert np.abs(logits).max() > 65504
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  expected = np.einsum('bhqk,bkhd->bqhd',
                       weights / weights.sum(-1, keepdims=True), v)
  got = attention._accelerator_attention(
      *(jnp.asarray(x, jnp.float16) for x in (q, k, v)))
  np.testing.assert_allclose(np.asarray(got, np.float64), expected, atol=1e-2)


# Splash attention on TPUs: long sequences, where its inputs are placed.

TPU = types.SimpleNamespace(platform='tpu', device_kind='TPU v5 lite')
LONG, SHORT = target.SPLASH_MIN_TOKENS, target.SPLASH_MIN_TOKENS - 1

# (devices, tokens, bias or mask, segment ids, implementation)
SPLASH_CASES = {
    'TPU, long': ([TPU], LONG, False, False, 'splash'),
    'TPU, 4097 tokens': ([TPU], 4097, False, False, 'splash'),
    'TPU, short': ([TPU], SHORT, False, False, 'xla'),
    'TPU, long, packed': ([TPU], LONG, False, True, 'splash'),
    'TPU, long, masked': ([TPU], LONG, True, False, 'xla'),
    'TPU, long, 4 devices without a mesh': ([TPU] * 4, LONG, False, False,
                                            'xla'),
    'TPU by name, CPU host': ('tpu', LONG, False, False, 'xla'),
    'CPU, long': ('cpu', LONG, False, False, 'heads_first'),
    'A100, long': ([A100], LONG, False, False, 'cudnn'),
    'A100, long, packed': ([A100], LONG, False, True, 'xla'),
    'T4, long': ([T4], LONG, False, False, 'xla'),
}


@pytest.mark.parametrize('case', SPLASH_CASES.values(),
                         ids=SPLASH_CASES.keys())
def test_splash_on_long_tpu_sequences(case):
  devices, tokens, masked, segmented, expected = case
  with target.compiling_for(devices):
    assert target.attention_implementation(
        jnp.bfloat16, 64, masked, tokens=tokens,
        segmented=segmented) == expected


def test_splash_by_name_in_a_tpu_process(monkeypatch):
  """A user's own jit in a one-chip TPU process (no target) gets it."""
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
  monkeypatch.setattr(jax, 'device_count', lambda *a: 1)
  assert target.attention_implementation(jnp.bfloat16, 64, False,
                                         tokens=LONG) == 'splash'
  monkeypatch.setattr(jax, 'device_count', lambda *a: 8)  # no mesh known
  assert target.attention_implementation(jnp.bfloat16, 64, False,
                                         tokens=LONG) == 'xla'


@pytest.mark.parametrize('tokens,calls', [(LONG, 1), (SHORT, 0)])
def test_attention_asks_for_splash_on_a_tpu(monkeypatch, tokens, calls):
  """Traced for a TPU, long self-attention goes to the kernel (recorded
  here, the plain path standing in for it)."""
  seen = []

  def recorded(query, key, value, segment_ids=None):
    seen.append(query.shape)
    return attention._accelerator_attention(query, key, value)

  monkeypatch.setattr(attention, 'splash_attention', recorded)
  x = jax.ShapeDtypeStruct((1, tokens, 2, 64), jnp.bfloat16)
  with target.compiling_for([TPU]):
    jax.eval_shape(lambda *a: attention.attention(*a), x, x, x)
  assert len(seen) == calls


HAS_LIBTPU = importlib.util.find_spec('libtpu') is not None


@pytest.mark.skipif(not HAS_LIBTPU, reason='libtpu compiles for TPUs')
def test_kernel_runs_on_each_devices_batch():
  """Compiled for a v5e:2x2 mesh, the kernel takes each chip's part of the
  batch: no all-gather of the activations, and a fraction of the plain
  path's temporaries (the (tokens x tokens) logits)."""
  devices = plan.topology_devices('v5e:2x2')
  mesh = sharding.make_mesh([('data', -1)], devices)
  x = jax.ShapeDtypeStruct((8, 4097, 12, 64), jnp.bfloat16,
                           sharding=sharding.batch_sharding(mesh))
  programs = {}
  for implementation in ('splash', 'xla'):
    loss = lambda q, k, v: attention.attention(q, k, v).astype(
        jnp.float32).sum()  # a new function: traced anew
    grad = target.traced_for(mesh, jax.grad(loss, argnums=(0, 1, 2)))
    with target.using_attention(implementation):
      programs[implementation] = jax.jit(grad).lower(x, x, x).compile()
  text = programs['splash'].as_text()
  assert 'tpu_custom_call' in text and 'all-gather' not in text
  temp = {k: p.memory_analysis().temp_size_in_bytes
          for k, p in programs.items()}
  assert temp['splash'] < temp['xla'] / 4
