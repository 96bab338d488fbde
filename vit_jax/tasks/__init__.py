"""The tasks: what differs between runs of the one loop (`base.Task`).
Importing one registers it (`registry.register`); adding a task is its
module here and one line below."""

# pylint: disable=unused-import
from vit_jax.tasks import classification
from vit_jax.tasks import distillation
from vit_jax.tasks import lit
from vit_jax.tasks import mae
from vit_jax.tasks import dino
from vit_jax.tasks import navit
from vit_jax.tasks import inference_time
from vit_jax.tasks import segmentation
from vit_jax.tasks import captioning
from vit_jax.tasks import beit
from vit_jax.tasks import video
from vit_jax.tasks import videomae
from vit_jax.tasks import siglip2
