"""The loop's progress: clu's report, plus the mean loss since the last
one, the learning rate and images per second."""

import datetime
import time

from clu import periodic_actions
import jax
import tqdm.auto

from vit_jax.run import optim


class Progress(periodic_actions.ReportProgress):
  """clu's progress report, plus the mean loss since the last one.

  Losses stay on the device until a report fetches them; a NaN raises
  FloatingPointError. Prints a line per report, or moves a tqdm bar
  (`config.progress_bar`); writes loss, learning rate and img/s. A task
  whose batches hold a varying number of images (packed sequences) says
  how many in its step's `images` metric; otherwise a step is
  `config.batch` images.
  """

  def __init__(self, config, writer, start_step: int):
    # The first step is reported too: a short run still shows its start.
    super().__init__(num_train_steps=config.total_steps, writer=writer,
                     every_steps=config.progress_every or None,
                     every_secs=None, on_steps=[start_step + 1])
    self.config, self.schedule = config, optim.make_schedule(config)
    self.pending, self.images, self.extra = [], [], {}
    self.bar = tqdm.auto.tqdm(
        total=config.total_steps, initial=start_step, unit='step',
        disable=jax.process_index() > 0) if config.progress_bar else None
    self(start_step)  # the clock starts here

  def add(self, metrics):
    self.pending.append(metrics['loss'])  # no host round-trip until a report
    if 'images' in metrics:
      self.images.append(metrics['images'])
    self.extra = {k: v for k, v in metrics.items()
                  if k not in ('loss', 'images')}

  def restart_clock(self):
    """Leaves out of the speed what was not training (evaluation)."""
    self._previous_time = time.monotonic()

  def report_now(self, step: int):
    """Reports at `step` whether or not it is due (before a save)."""
    if self.pending:
      now = time.monotonic()
      self._apply(step, now)
      self._after_apply(step, now)

  def _apply(self, step: int, t: float):
    losses, images = jax.device_get((self.pending, self.images))
    self.pending, self.images = [], []
    loss = float(sum(losses)) / len(losses)
    if loss != loss or abs(loss) == float('inf'):
      raise FloatingPointError(f'Loss became {loss} by step {step}: training '
                               'stopped.')
    super()._apply(step, t)
    steps, seconds = step - self._previous_step, max(
        t - self._previous_time, 1e-9)
    img_s = (float(sum(images)) if images else
             steps * self.config.batch) / seconds
    lr = float(self.schedule(step - 1))
    eta = (self.config.total_steps - step) * seconds / max(steps, 1)
    if self.bar is not None:
      self.bar.update(step - self.bar.n)
      self.bar.set_postfix(loss=f'{loss:.4f}', lr=f'{lr:.3g}',
                           img_s=f'{img_s:.0f}')
    else:
      print(f'[{step}/{self.config.total_steps}] loss {loss:.4f}  lr '
            f'{lr:.3g}  {img_s:.0f} img/s  ETA '
            f'{datetime.timedelta(seconds=int(eta))}', flush=True)
    self._writer.write_scalars(step, {
        'train_loss': loss, 'learning_rate': lr, 'img_per_sec': img_s,
        **{k: float(v) for k, v in self.extra.items()}})

  def close(self):
    if self.bar is not None:
      self.bar.close()
