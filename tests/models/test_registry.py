"""`models.registry`: each preset has the family that registered it; a
custom model the first family whose class takes its fields; a name or
family registered twice is refused."""

import pytest

from vit_jax import models
from vit_jax.models import registry


def test_presets_have_the_family_that_registered_them():
  for family in registry.FAMILIES.values():
    for config in family.presets:
      assert registry.family(config.model_name) is family


@pytest.mark.parametrize('preset, family', [
    ('BiT-R50x1', 'BiT'), ('Mixer-B_16', 'Mixer'), ('Swin-T', 'Swin'),
    ('LiT-B16B', 'LiT'), ('ViT-B_16', 'ViT')])
def test_custom_model_by_its_fields(preset, family):
  """A name that is no preset, whatever its prefix, gets the family whose
  class takes its config; a config no class takes gets ViT's."""
  config = models.MODEL_CONFIGS[preset].to_dict()
  assert registry.family('my-model', config).name == family
  assert registry.family('DeiT-custom', config).name == family
  assert registry.family('my-model').name == registry.DEFAULT
  assert registry.family('my-model', {'max_grid': 16}).name == 'ViT'


def test_timm_family():
  assert registry.timm_family('vit_base_patch16_clip_224').name == 'CLIP'
  assert registry.timm_family('eva02_tiny_patch14_224').name == 'EVA02'
  assert registry.timm_family('vit_base_patch16_224', 'mae').name == 'MAE'
  assert registry.timm_family('vit_base_patch16_224', 'augreg') is None


def test_registered_twice_is_refused():
  vit = registry.FAMILIES['ViT']
  with pytest.raises(ValueError, match='Family ViT is registered twice'):
    registry.register(vit)
  copy = registry.Family('ViT-again', vit.model, [vit.presets[0]])
  with pytest.raises(ValueError, match='Preset testing is registered twice'):
    registry.register(copy)
  assert 'ViT-again' not in registry.FAMILIES  # nothing half-registered
