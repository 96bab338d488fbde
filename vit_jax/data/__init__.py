"""Data: tf.data pipelines, augmentations, packing, datasets, tokenizers."""
