"""Model presets, by the original release's names (e.g. 'ViT-B_16').

`models.get_model` builds an MlpMixer for names starting with 'Mixer-' and a
VisionTransformer otherwise.
"""

import ml_collections

MODEL_CONFIGS = {}


def _register(get_config):
  """Adds a preset to MODEL_CONFIGS under its `model_name`."""
  config = get_config().lock()
  MODEL_CONFIGS[config.model_name] = config
  return get_config


def _vit(name, hidden, mlp, heads, layers, patch, dropout=0.0,
         classifier='token', representation_size=None):
  """A ViT ConfigDict with the original's fields."""
  config = ml_collections.ConfigDict()
  config.model_name = name
  config.patches = ml_collections.ConfigDict({'size': (patch, patch)})
  config.hidden_size = hidden
  config.transformer = ml_collections.ConfigDict()
  config.transformer.mlp_dim = mlp
  config.transformer.num_heads = heads
  config.transformer.num_layers = layers
  config.transformer.attention_dropout_rate = 0.0
  config.transformer.dropout_rate = dropout
  config.classifier = classifier
  config.representation_size = representation_size
  # Position embedding (Appendix D.4) and stochastic depth options, at the
  # paper's values; listed so that they can be set on a locked preset.
  config.posemb = 'learn'
  config.transformer.relative_max_distance = 8
  config.transformer.stochastic_depth = 0.0
  return config


def _hybrid(config, name, patch, num_layers, width_factor=1):
  """Puts a ResNet (`num_layers` units per stage) under the ViT `config`."""
  config.model_name = name
  config.patches.size = (patch, patch)
  config.resnet = ml_collections.ConfigDict()
  config.resnet.num_layers = num_layers
  config.resnet.width_factor = width_factor
  return config


def _mixer(name, hidden, blocks, tokens_mlp, channels_mlp, patch):
  """An MLP-Mixer ConfigDict with the original's fields."""
  config = ml_collections.ConfigDict()
  config.model_name = name
  config.patches = ml_collections.ConfigDict({'size': (patch, patch)})
  config.hidden_dim = hidden
  config.num_blocks = blocks
  config.tokens_mlp_dim = tokens_mlp
  config.channels_mlp_dim = channels_mlp
  return config


@_register
def get_testing():
  return _vit('testing', 10, 10, 2, 1, 16, dropout=0.1)


@_register
def get_testing_unpooled():
  return _vit('testing-unpooled', 10, 10, 2, 1, 16, dropout=0.1,
              classifier='unpooled')


@_register
def get_ti16_config():
  return _vit('ViT-Ti_16', 192, 768, 3, 12, 16)


@_register
def get_s16_config():
  return _vit('ViT-S_16', 384, 1536, 6, 12, 16)


@_register
def get_s32_config():
  return _vit('ViT-S_32', 384, 1536, 6, 12, 32)


@_register
def get_b16_config():
  return _vit('ViT-B_16', 768, 3072, 12, 12, 16)


@_register
def get_b8_config():
  return _vit('ViT-B_8', 768, 3072, 12, 12, 8)


@_register
def get_b32_config():
  return _vit('ViT-B_32', 768, 3072, 12, 12, 32)


@_register
def get_l16_config():
  return _vit('ViT-L_16', 1024, 4096, 16, 24, 16, dropout=0.1)


@_register
def get_l32_config():
  return _vit('ViT-L_32', 1024, 4096, 16, 24, 32)


@_register
def get_h14_config():
  return _vit('ViT-H_14', 1280, 5120, 16, 32, 14, dropout=0.1)


@_register
def get_b16_gap_norep_config():
  return _vit('ViT-B_16-gap-norep', 768, 3072, 12, 12, 16, classifier='gap')


@_register
def get_b32_gap_norep_config():
  return _vit('ViT-B_32-gap-norep', 768, 3072, 12, 12, 32, classifier='gap')


@_register
def get_s16_gap_norep_config():
  return _vit('ViT-S_16-gap-norep', 384, 1536, 6, 12, 16, classifier='gap')


@_register
def get_s32_gap_norep_config():
  return _vit('ViT-S_32-gap-norep', 384, 1536, 6, 12, 32, classifier='gap')


# Hybrids. The ResNet root (stride-2 conv, stride-2 max-pool) downsamples 4x
# and each stage after the first another 2x.


@_register
def get_r_ti16_config():
  # Root alone with 8x8 patches: an effective patch of 32 (a 7x7 grid at
  # 224 px), as the original's preset, despite the name.
  return _hybrid(get_ti16_config(), 'R+ViT-Ti_16', 8, ())


@_register
def get_r26_s32_config():
  # Four stages of 2 units: 4 * 2**3 = 32.
  return _hybrid(get_s16_config(), 'R26+ViT-S_32', 1, (2, 2, 2, 2))


@_register
def get_r26_b32_config():
  return _hybrid(get_b32_config(), 'R26+ViT-B_32', 1, (2, 2, 2, 2))


@_register
def get_r50_b16_config():
  # (3, 4, 9) instead of ResNet-50's (3, 4, 6, 3) keeps the same depth at a
  # downsampling of 4 * 2**2 = 16.
  config = _hybrid(get_b16_config(), 'R50+ViT-B_16', 1, (3, 4, 9))
  config.transformer.dropout_rate = 0.1
  return config


@_register
def get_r50_l32_config():
  # The stages of ResNet-50: 4 * 2**3 = 32.
  return _hybrid(get_l16_config(), 'R50+ViT-L_32', 1, (3, 4, 6, 3))


# MLP-Mixer (Tolstikhin et al., 2021).


@_register
def get_mixer_testing_config():
  return _mixer('Mixer-testing', 16, 2, 8, 32, 16)


@_register
def get_mixer_b16_config():
  return _mixer('Mixer-B_16', 768, 12, 384, 3072, 16)


@_register
def get_mixer_b32_config():
  return _mixer('Mixer-B_32', 768, 12, 384, 3072, 32)


@_register
def get_mixer_l16_config():
  return _mixer('Mixer-L_16', 1024, 24, 512, 4096, 16)
