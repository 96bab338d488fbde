"""The original release's `configs/models.py`: the model presets by name.

MODEL_CONFIGS holds every preset of `vit_jax.models.registry` (each family's, `vit_jax/models/families/`); AUGREG_CONFIGS
those of the AugReg checkpoints, by the first part of their filenames
('B_16', 'R_Ti_16', 'R26_S_32', ...), as the original names them.
"""

from vit_jax.models.registry import MODEL_CONFIGS

# The original's AugReg list: its ViTs and hybrids, but these.
_NOT_AUGREG = ('testing', 'testing-unpooled', 'ViT-L_32', 'R50+ViT-B_16',
               'ViT-H_14')
AUGREG_CONFIGS = {
    name.replace('ViT-', '').replace('+', '_'): config
    for name, config in MODEL_CONFIGS.items()
    if name.startswith(('ViT-', 'R+ViT-', 'R26+ViT-', 'R50+ViT-'))
    and name not in _NOT_AUGREG}
