"""Paths in a bucket or at a URL: the whole flow, offline.

TensorFlow's in-memory filesystem (`ram://`) stands in for a bucket. It is
registered with epath the way gs:// is, and tf.io.gfile (TensorBoard, tfds,
tf.data) serves it natively. Orbax writes its arrays with tensorstore, whose
own gs:// driver has no in-memory stand-in: its directory is redirected to
local disk, and only that.
"""

import functools
import http.server
import os
import signal
import threading

from etils.epath import backend
from etils.epath import gpath
from etils.epath import register
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow as tf

from tests.conftest import interrupt_at
from vit_jax.checkpoints import files
from vit_jax import launch
from vit_jax.data import pipeline
from vit_jax.checkpoints import storage


@pytest.fixture
def bucket(monkeypatch, tmp_path, request):
  """A fresh `ram://` "bucket"; Orbax's directories in it map to tmp_path."""
  monkeypatch.setattr(gpath, '_URI_SCHEMES', gpath._URI_SCHEMES | {'ram'})
  monkeypatch.setattr(gpath, '_URI_PREFIXES',
                      gpath._URI_PREFIXES + ('ram://',))
  monkeypatch.setitem(gpath._URI_MAP_ROOT, 'ram://', '/ram/')
  monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, 'ram', backend.tf_backend)
  monkeypatch.setitem(register._URI_PREFIXES_TO_CLS, 'ram://',
                      gpath.PosixGPath)
  monkeypatch.setattr(storage, 'CACHE_DIR', str(tmp_path / 'cache'))
  root = f'ram://{request.node.name}'
  manager = ocp.CheckpointManager

  def local_manager(directory, *args, **kw):
    if str(directory).startswith(root + '/'):
      directory = tmp_path / 'orbax' / str(directory)[len(root) + 1:]
    return manager(str(directory), *args, **kw)

  monkeypatch.setattr(ocp, 'CheckpointManager', local_manager)
  yield root
  tf.io.gfile.rmtree(root)


def _copy_tree(src, dst):
  for folder, _, names in tf.io.gfile.walk(src):
    target = os.path.join(dst, os.path.relpath(folder, src))
    tf.io.gfile.makedirs(target)
    for name in names:
      tf.io.gfile.copy(os.path.join(folder, name), os.path.join(target, name))


def test_train_resume_export_fine_tune_in_a_bucket(bucket, tiny_config,
                                                   tmp_path, monkeypatch,
                                                   capsys):
  pipeline.get_builder(tiny_config)  # prepared here, then copied
  _copy_tree(tiny_config.tfds_data_dir, f'{bucket}/tfds')
  reference = launch.train_and_evaluate(tiny_config.copy_and_resolve_references(),
                                       str(tmp_path / 'local'))

  config = tiny_config.copy_and_resolve_references()
  config.tfds_data_dir = f'{bucket}/tfds'
  with monkeypatch.context() as m:
    interrupt_at(m, 3, lambda batch: os.kill(os.getpid(), signal.SIGTERM))
    launch.train_and_evaluate(config, f'{bucket}/run')
  assert 'Preempted: saved step' in capsys.readouterr().out
  assert not tf.io.gfile.exists(f'{bucket}/run/results.json')
  params = launch.train_and_evaluate(config, f'{bucket}/run')
  assert 'Done: 6 steps' in capsys.readouterr().out
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert tf.io.gfile.glob(f'{bucket}/run/events.out.tfevents.*')
  with tf.io.gfile.GFile(f'{bucket}/run/results.json') as f:
    assert '"count": 37' in f.read()
  exported = files.load(f'{bucket}/run/testing.npz')
  np.testing.assert_array_equal(exported['head']['kernel'],
                                params['head']['kernel'])

  config.pretrained_dir = f'{bucket}/run'
  config.pp.crop = 48
  config.total_steps = 2
  launch.train_and_evaluate(config, f'{bucket}/fine_tune')
  assert f'Fine-tuning from {bucket}/run/testing.npz' in capsys.readouterr().out
  assert tf.io.gfile.exists(f'{bucket}/fine_tune/testing.npz')
  assert len(os.listdir(storage.CACHE_DIR)) == 1  # fetched once


def test_image_folder_in_a_bucket(bucket, tiny_config):
  for split in ('train', 'test'):
    for label in range(3):
      folder = f'{bucket}/images/{split}/class{label}'
      tf.io.gfile.makedirs(folder)
      for i in range(4):
        png = tf.io.encode_png(np.full((8, 8, 3), 80 * label, np.uint8))
        with tf.io.gfile.GFile(f'{folder}/{i}.png', 'wb') as f:
          f.write(png.numpy())
  tiny_config.dataset = f'{bucket}/images'
  info = pipeline.dataset_info(
      pipeline.get_builder(tiny_config), tiny_config)
  assert (info.num_classes, info.num_train, info.num_test) == (3, 12, 12)
  batch = next(pipeline.train_iterator(info, tiny_config, batch_size=8))
  assert batch['image'].shape == (8, 32, 32, 3)


class _Files(http.server.SimpleHTTPRequestHandler):
  requests = []

  def do_GET(self):
    self.requests.append(self.path)
    super().do_GET()

  def log_message(self, *args):
    pass


def test_checkpoint_from_a_url_is_cached_once(tmp_path, monkeypatch):
  monkeypatch.setattr(storage, 'CACHE_DIR', str(tmp_path / 'cache'))
  served = tmp_path / 'served'
  served.mkdir()
  params = {'head': {'kernel': np.arange(6, dtype=np.float32).reshape(2, 3)}}
  files.save(params, served / 'ViT-B_16.npz')
  server = http.server.ThreadingHTTPServer(
      ('127.0.0.1', 0), functools.partial(_Files, directory=str(served)))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  url = f'http://127.0.0.1:{server.server_address[1]}'
  try:
    for _ in range(2):
      loaded = files.load(f'{url}/ViT-B_16.npz')
      np.testing.assert_array_equal(loaded['head']['kernel'],
                                    params['head']['kernel'])
    assert _Files.requests == ['/ViT-B_16.npz']
    with pytest.raises(FileNotFoundError, match='missing.npz'):
      files.load(f'{url}/missing.npz')
  finally:
    server.shutdown()
  assert len(os.listdir(storage.CACHE_DIR)) == 1  # no partial file left


def test_save_is_atomic_in_a_bucket(bucket):
  path = f'{bucket}/out/params.npz'
  tf.io.gfile.makedirs(f'{bucket}/out')
  files.save({'cls': np.ones((1, 1, 4), np.float32)}, path)
  assert tf.io.gfile.listdir(f'{bucket}/out') == ['params.npz']
  np.testing.assert_array_equal(files.load(path)['cls'],
                                np.ones((1, 1, 4)))
