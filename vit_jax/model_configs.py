"""Model presets, by the original release's names (e.g. 'ViT-B_16')."""

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
