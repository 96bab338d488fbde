r"""Writes the golden folders of transformers' SigLIP 2 (NaFlex) models.

Needs torch and transformers 5.23 (in a venv of their own); the tests need
neither.

  python scripts/make_siglip2_golden.py

writes into tests/data:
- transformers/siglip2_vision: a small random `Siglip2VisionModel` (the
  shapes of vit_jax's SigLIP2-testing: width 32, 2 layers, 2 heads, patch
  16, a 16 x 16 position table; every parameter moved off its init by
  N(0, 0.3)), saved by `save_pretrained`, with a `Siglip2ImageProcessor`'s
  preprocessor_config.json (max_num_patches 32).
- transformers/siglip2: a small random `Siglip2Model` (both towers, the
  text tower 16 tokens long) and a tiny Gemma-like tokenizer: a
  SentencePiece BPE model (`tokenizer.model`: <pad> 0, <eos> 1, <bos> 2,
  <unk> 3, <mask> 4, byte fallback, no dummy prefix, as Gemma's) and
  transformers' `Siglip2Tokenizer` of it (`tokenizer.json`), which adds
  <eos> and no <bos>, as the hub's google/siglip2-* folders.
- siglip2_golden.npz: `images` (uint8 (2, 64, 96, 3): the second image's
  48 x 48 top-left corner is the second input), the processor's
  `pixel_values` (2, 32, 768), `pixel_attention_mask` and `spatial_shapes`
  of them ([4, 6]: 64 x 96 as it is, and [5, 5]: resized to 80 x 80; 8
  and 7 padding tokens), and
  transformers' outputs: `vision/pooler_output`, `vision/last_hidden_state`;
  `towers/input_ids` of PROMPTS, `towers/image_embeds`,
  `towers/text_embeds`, `towers/logits_per_image` (the first image and the
  first two prompts); `tokenizer/input_ids` (TOKENIZED, max_length 16) and
  `tokenizer/input_ids_64` (max_length 64, the processor's).
"""

import io
import json
import os
import shutil

import numpy as np
from PIL import Image
import sentencepiece as spm
import torch
import transformers
from transformers.tokenization_utils_base import generate_merges

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
OUT = os.path.join(DATA, 'transformers')
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64)
MAX_PATCHES = 32
PROMPTS = ['a photo of a Dog.', 'A PICTURE of a T-shirt, sitting!']
TOKENIZED = PROMPTS + [
    'an ankle boot', 'ÉCOLE of sneakers 2024', '  two  spaces ',
    'a very long caption of a pullover and a dress and a coat and a bag '
    'and a sandal and a shirt']
_WORDS = ('dog', 'cat', 'bird', 'ship', 'truck', 'horse', 'frog', 'deer',
          't-shirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal',
          'shirt', 'sneaker', 'bag', 'ankle boot')


def _shift(model, scale=0.3):
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def _tokenizer(folder):
  """A Gemma-like SentencePiece model and transformers' Siglip2Tokenizer
  of it (vocabulary and merges as transformers' Gemma converter makes
  them, which needs no protobuf)."""
  model = io.BytesIO()
  texts = [f'a photo of a {w}.' for w in _WORDS]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts * 20), model_writer=model, vocab_size=320,
      model_type='bpe', pad_id=0, eos_id=1, bos_id=2, unk_id=3,
      pad_piece='<pad>', eos_piece='<eos>', bos_piece='<bos>',
      unk_piece='<unk>', user_defined_symbols=['<mask>'], byte_fallback=True,
      add_dummy_prefix=False, remove_extra_whitespaces=False,
      normalization_rule_name='identity', split_digits=True,
      hard_vocab_limit=False, minloglevel=2, num_threads=1)
  path = os.path.join(folder, 'tokenizer.model')
  with open(path, 'wb') as f:
    f.write(model.getvalue())
  sp = spm.SentencePieceProcessor(model_file=path)
  vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
  tokenizer = transformers.Siglip2Tokenizer(
      vocab=vocab, merges=generate_merges(vocab), add_bos_token=False,
      add_eos_token=True, padding_side='right', model_max_length=64)
  tokenizer.save_pretrained(folder)
  return transformers.AutoTokenizer.from_pretrained(folder), len(vocab)


def _images():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (2, 64, 96, 3), np.uint8)
  return images, [Image.fromarray(images[0]), Image.fromarray(images[1, :48,
                                                                      :48])]


def _processor(folder, pil_images, golden):
  processor = transformers.Siglip2ImageProcessorPil(
      patch_size=16, max_num_patches=MAX_PATCHES)
  processor.save_pretrained(folder)
  inputs = processor(images=pil_images, return_tensors='pt')
  assert inputs['spatial_shapes'].tolist() == [[4, 6], [5, 5]]
  for key, value in inputs.items():
    golden[key] = value.numpy()
  return inputs


def main():
  torch.manual_seed(0)
  golden = {}
  images, pil_images = _images()
  golden['images'] = images

  folder = os.path.join(OUT, 'siglip2_vision')
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  model = transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(
      **SMALL, patch_size=16, num_patches=256)).eval()
  _shift(model)
  model.save_pretrained(folder)
  inputs = _processor(folder, pil_images, golden)
  with torch.no_grad():
    out = model(**inputs)
  golden['vision/pooler_output'] = out.pooler_output.numpy()
  golden['vision/last_hidden_state'] = out.last_hidden_state.numpy()

  folder = os.path.join(OUT, 'siglip2')
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  tokenizer, vocab_size = _tokenizer(folder)
  config = transformers.Siglip2Config(
      text_config=dict(SMALL, vocab_size=vocab_size,
                       max_position_embeddings=16),
      vision_config=dict(SMALL, patch_size=16, num_patches=256))
  model = transformers.Siglip2Model(config).eval()
  _shift(model)
  model.save_pretrained(folder)
  inputs = _processor(folder, pil_images, {})
  tokens = tokenizer(PROMPTS, padding='max_length', truncation=True,
                     max_length=16, return_tensors='pt')['input_ids']
  with torch.no_grad():
    out = model(input_ids=tokens, **{k: v[:1] for k, v in inputs.items()})
  golden['towers/input_ids'] = tokens.numpy().astype(np.int32)
  for key in ('image_embeds', 'text_embeds', 'logits_per_image'):
    golden[f'towers/{key}'] = getattr(out, key).numpy()
  for suffix, length in (('', 16), ('_64', 64)):
    golden[f'tokenizer/input_ids{suffix}'] = np.asarray(tokenizer(
        TOKENIZED, padding='max_length', truncation=True,
        max_length=length)['input_ids'], np.int32)
  np.savez_compressed(os.path.join(DATA, 'siglip2_golden.npz'), **golden)
  with open(os.path.join(DATA, 'siglip2_golden.json'), 'w') as f:
    json.dump({'prompts': PROMPTS, 'tokenized': TOKENIZED}, f, indent=1)
  print(sorted(golden), tokenizer.convert_ids_to_tokens(
      golden['tokenizer/input_ids'][1]))


if __name__ == '__main__':
  main()
