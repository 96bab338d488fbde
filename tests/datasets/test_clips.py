"""Clips from files (`vit_jax.data.clips`): what was written is read."""

import builtins

import numpy as np
from PIL import Image
import pytest

from vit_jax.data import clips


def _frames(count=6, side=16):
  """Frames of a bright square moving right by 2 px, on 4 gray levels (a
  GIF's palette holds them exactly)."""
  out = []
  for i in range(count):
    frame = np.full((side, side, 3), 40, np.uint8)
    frame[4:8, 2 * i:2 * i + 4] = (250, 120, 0)
    out.append(frame)
  return out


def test_a_folder_and_an_animated_image_give_their_frames(tmp_path):
  frames = _frames()
  folder = tmp_path / 'frames'
  folder.mkdir()
  for i, frame in enumerate(frames):  # names sort as the frames go
    Image.fromarray(frame).save(folder / f'{i:03d}.png')
  (folder / 'notes.txt').write_text('not a frame')
  images = [Image.fromarray(f) for f in frames]
  images[0].save(tmp_path / 'clip.gif', save_all=True,
                 append_images=images[1:])
  for path in (folder, tmp_path / 'clip.gif'):
    assert clips.is_clip(path)
    np.testing.assert_array_equal(
        np.stack([np.asarray(f) for f in clips.read_frames(path)]),
        np.stack(frames))


def test_a_video_file_through_pyav(tmp_path):
  av = pytest.importorskip('av')
  frames = _frames(count=8, side=32)
  path = tmp_path / 'clip.mp4'
  with av.open(str(path), 'w') as container:
    stream = container.add_stream('mpeg4', rate=8)
    stream.width = stream.height = 32
    stream.pix_fmt = 'yuv420p'
    stream.options = {'qscale': '1'}  # near lossless
    for frame in frames:
      container.mux(stream.encode(av.VideoFrame.from_ndarray(frame,
                                                             format='rgb24')))
    container.mux(stream.encode())
  got = np.stack([np.asarray(f, np.float32) for f in clips.read_frames(path)])
  assert clips.is_clip(path) and got.shape == (8, 32, 32, 3)
  # Lossy (4:2:0 chroma): close on average, and the square where it was.
  assert np.abs(got - np.stack(frames)).mean() < 8
  assert all(np.argmax(g[4:8].mean((0, 2))) in range(2 * i, 2 * i + 4)
             for i, g in enumerate(got))


def test_what_is_no_clip_is_refused_in_one_line(tmp_path, monkeypatch):
  Image.fromarray(_frames()[0]).save(tmp_path / 'still.png')
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'clip.mp4').write_bytes(b'not a video')
  assert not clips.is_clip(tmp_path / 'still.png')
  for name, why in (('still.png', 'is a still image, not a clip'),
                    ('empty', 'no image files in the folder'),
                    ('missing.gif', 'no such file or folder')):
    with pytest.raises(ValueError, match=why):
      clips.read_frames(tmp_path / name)
  real_import = builtins.__import__

  def no_av(name, *args, **kw):
    if name == 'av':
      raise ImportError(name)
    return real_import(name, *args, **kw)

  monkeypatch.setattr(builtins, '__import__', no_av)
  with pytest.raises(ValueError, match=r'needs PyAV \(pip install av\)'):
    clips.read_frames(tmp_path / 'clip.mp4')


def test_views_as_defined():
  """Evenly spaced starts from frame 0 to the last that fits, rounded."""
  length, frames, stride = 20, 4, 3  # a window spans 10 frames
  last = length - (frames - 1) * stride - 1
  for views in (1, 2, 3, 4):
    want = [last // 2] if views == 1 else [
        round(last * v / (views - 1)) for v in range(views)]
    np.testing.assert_array_equal(
        clips.test_offsets(length, frames, stride, views), want)
  with pytest.raises(ValueError, match='spans 10 frames; the clips have 9'):
    clips.test_offsets(9, frames, stride, 1)
