"""The model families, one module each; importing one registers it
(`registry.register`). Adding a family: its module here, and one line below.
The order is the presets' order in `MODEL_CONFIGS`."""

# pylint: disable=unused-import
from vit_jax.models.families import vit
from vit_jax.models.families import deit
from vit_jax.models.families import dinov2
from vit_jax.models.families import deit3
from vit_jax.models.families import mae
from vit_jax.models.families import clip
from vit_jax.models.families import siglip
from vit_jax.models.families import siglip2
from vit_jax.models.families import eva02
from vit_jax.models.families import dinov3
from vit_jax.models.families import internvit
from vit_jax.models.families import aimv2
from vit_jax.models.families import pe
from vit_jax.models.families import beit
from vit_jax.models.families import bit
from vit_jax.models.families import mixer
from vit_jax.models.families import swin
from vit_jax.models.families import lit
from vit_jax.models.families import vivit
from vit_jax.models.families import timesformer
from vit_jax.models.families import videomae
from vit_jax.models.families import sam
