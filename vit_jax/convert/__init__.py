r"""Weights in timm's or transformers' layout <-> the published .npz format.

  python -m vit_jax.convert hf_folder DINOv2-S_14.npz      # transformers
  python -m vit_jax.convert timm_folder ViT-B_16.npz       # timm -> .npz
  python -m vit_jax.convert model.safetensors ViT-B_16.npz
  python -m vit_jax.convert ViT-B_16.npz model.safetensors  # .npz -> timm
  python -m vit_jax.convert ViT-B_16.npz hf_folder --layout=transformers

`--layout=transformers` writes an .npz as a Hugging Face transformers
folder: `config.json`, `model.safetensors` (float32, transformers' names)
and `preprocessor_config.json` (the eval transform of the record beside
the .npz, else the preset's normalization at its native side). The preset
is `--model_name`, else the record's, else inferred from the shapes; the
architecture follows its family: ViTForImageClassification (a head),
ViTModel (none; its pooler is `pre_logits`), ViTMAEModel (MAE without a
head), DeiTForImageClassificationWithTeacher (DeiT's 'distilled'),
Dinov2Model, Dinov2WithRegistersModel, CLIPVisionModel[WithProjection],
SiglipVisionModel and SwinForImageClassification. What none computes
('gap' pooling, fc_norm, hybrids, Mixers, EVA-02, LayerScale outside
DINOv2, attention without all its biases, ...) is refused by name before
anything is written (`transformers_config.export_architecture`). A
transformers folder is read back as a timm one (`transformers_layout`).

A transformers folder (`config.json` with `model_type`/`architectures`) is
read through `convert.transformers_layout` (docs/checkpoints.md lists its
architectures); the rest of this is timm's.
A timm checkpoint is a folder holding `config.json` and `model.safetensors`
(or `pytorch_model.bin`): a Hugging Face hub download, `timm.models.
save_for_hf`'s output, or a weights file with `config.json` beside it.
`config.json` says how timm computes: each setting is either carried over
to vit_jax's model config (pooling, GELU's form) or refused, naming it;
nothing is written then. Without `config.json` timm's defaults are assumed,
as a note on stderr says. The preset is inferred from the shapes and the
heads (`--model_name` to choose it, refused if it does not fit). The eval
transform and the settings that differ from the preset go beside the `.npz`
(`preprocess.save_transform`). ViTs (DeiT's distilled ones too: `dist_token`
and `head_dist` become `dist` and `head_dist`; LayerScale, registers, a
table without the prefix entries, `fc_norm` and SwiGLU: DINOv2, DeiT III,
MAE), hybrids and (without `config.json`) MLP-Mixers are converted; so are Swin
Transformers (`convert_swin`, which lists the names). MAE's
encoder is a plain ViT: its `config.json` tag 'mae' (the hub's
`timm/vit_base_patch16_224.mae`) or `--model_name=MAE-B_16` picks the
preset. `.safetensors` is read with
safetensors' numpy API, a torch `.pth`/`.bin` with
`torch.load(weights_only=True)` (both optional: `pip install -e
'.[convert]'`).
"""

# pylint: disable=unused-import
from vit_jax.convert.converter import as_npz
from vit_jax.convert.converter import convert
from vit_jax.convert.hub import fetch
from vit_jax.convert.converter import from_timm
from vit_jax.convert.converter import locate
from vit_jax.convert.converter import read_timm
from vit_jax.convert.converter import Source
from vit_jax.convert.names import npz_to_timm
from vit_jax.convert.preset_inference import check_preset
from vit_jax.convert.preset_inference import infer_preset
from vit_jax.convert.names import timm_to_npz
from vit_jax.convert.timm_config import timm_settings
from vit_jax.convert.timm_config import vit_overrides
