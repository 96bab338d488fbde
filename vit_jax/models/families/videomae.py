"""VideoMAE (Tong et al., NeurIPS 2022): ViViT's unfactorised encoder on
16 frames of 224 px in tubelets of 2x16x16 (`vivit.ViViT` with VideoMAE's
options), as transformers' VideoMAEForVideoClassification computes its
published weights (MCG-NJU/videomae-*): a fixed sinusoid table, no class
token, query and value biases only, exact GELU, LayerNorm epsilon 1e-12
in the blocks, and the mean of the tokens through `fc_norm` (torch's
default epsilon 1e-5) without a final norm. The pre-trained encoders
(VideoMAEForPreTraining) have the final norm instead of `fc_norm`: their
record says so. Inputs: ImageNet's mean and std.

Parameters for Kinetics-400 (400 classes), `jax.eval_shape`, equal to
transformers' VideoMAEForVideoClassification of the same config
(tests/data/videomae_param_counts.json): see that file.
"""

from vit_jax.models import registry
from vit_jax.models import vivit
from vit_jax.models.families import vivit as vivit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, tubelet)
_VIDEOMAES = {
    'VideoMAE-testing': (32, 64, 2, 2, 8, 2),
    'VideoMAE-S_16x2': (384, 1536, 6, 12, 16, 2),
    'VideoMAE-B_16x2': (768, 3072, 12, 12, 16, 2),
    'VideoMAE-L_16x2': (1024, 4096, 16, 24, 16, 2),
    'VideoMAE-H_16x2': (1280, 5120, 16, 32, 16, 2),
}


def videomae_config(name, hidden, mlp, heads, layers, patch, tubelet):
  """A ViViT ConfigDict with VideoMAE's options (fine-tuned: `fc_norm`)."""
  config = vivit_families.vivit_config(name, hidden, mlp, heads, layers,
                                       patch, tubelet, None)
  config.update(temporal_posemb='sincos', classifier='gap', fc_norm=True,
                fc_norm_eps=1e-5)
  config.transformer.update(qkv_bias='qv', gelu_approximate=False,
                            layer_norm_eps=1e-12, final_norm=False)
  return config


registry.register(registry.Family(
    'VideoMAE', vivit.ViViT,
    [videomae_config(name, *row) for name, row in _VIDEOMAES.items()],
    weights='timm'))
