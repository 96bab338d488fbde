"""Settings shared by every experiment config, and dataset presets."""

import ml_collections

from vit_jax.models import registry


def get_config() -> ml_collections.ConfigDict:
  """Defaults of everything but the model and dataset."""
  config = ml_collections.ConfigDict()
  # A tfds name, or a folder of {train,test}/<class_name>/<image> files.
  config.dataset = ''
  # A folder's files that are no images: left out, with a note of how many
  # (False: the first one stops the run, named).
  config.skip_bad_images = False
  config.tfds_data_dir = ml_collections.config_dict.placeholder(str)  # tensorflow_datasets folder (tfds default)
  config.tfds_manual_dir = ml_collections.config_dict.placeholder(str)  # files placed by hand, for tfds builders
  # Download and prepare a tfds dataset once when it is not prepared and the
  # network answers (checked in seconds); else fail fast with instructions.
  config.tfds_download = True
  config.pp = ml_collections.ConfigDict()
  config.pp.train = 'train'  # split
  config.pp.test = 'test'  # split
  config.pp.crop = 384  # image side fed to the model
  config.pp.resize = ml_collections.config_dict.placeholder(int) # eval: resize to this, then central crop
  # eval, timm's meaning: short side to crop / crop_pct, then a central crop
  config.pp.crop_pct = ml_collections.config_dict.placeholder(float)
  config.pp.interpolation = 'bilinear'  # of that resize (tf.image.resize)
  # None: pixels in [-1, 1] (Google's weights); timm's: ImageNet mean/std
  config.pp.mean = ml_collections.config_dict.placeholder(tuple)
  config.pp.std = ml_collections.config_dict.placeholder(tuple)
  config.pp.area_min = 0.05  # inception crop: smallest area kept
  config.pp.flip = True  # random horizontal flips in training
  # Training: RandAugment (num_layers, magnitude), e.g. (2, 15); None: off.
  config.pp.randaug = ml_collections.config_dict.placeholder(tuple)
  config.pp.erasing = 0.0  # training: random erasing probability (DeiT: 0.25)
  config.pp.label = ''  # a vit_jax.data.labels task; '' is the feature 'label'

  config.model_name = ''  # set with `with_model`, as config.model
  # Fine-tune from `pretrained_path`, or `{pretrained_dir}/{model_name}.npz`
  # (a finished workdir holds one); neither: train from scratch.
  config.pretrained_dir = ml_collections.config_dict.placeholder(str)
  config.pretrained_path = ml_collections.config_dict.placeholder(str)
  config.model = None  # a ConfigDict, e.g. from vit_jax.models.registry

  config.total_steps = 10_000
  config.warmup_steps = 500
  config.base_lr = 0.03
  config.decay_type = 'cosine'  # or 'linear'
  config.optimizer = 'sgd'  # momentum 0.9; or 'adamw'
  # SGD momentum / AdamW first moment; 'bfloat16' (the original's) halves it.
  config.momentum_dtype = 'float32'
  config.weight_decay = 0.0  # adamw only
  config.grad_norm_clip = 1.0  # 0 disables clipping
  # Layer-wise learning-rate decay of a ViT (BEiT's fine-tuning: 0.65, MAE's
  # 0.75): block i of L learns at decay**(L - i) of the rate, the embeddings
  # at decay**(L + 1), the head and final norm at the full rate. None: off.
  config.layer_decay = ml_collections.config_dict.placeholder(float)
  config.loss = 'softmax_xent'  # or 'sigmoid_xent'
  # trainer='distill' (DeiT): a frozen teacher, the preset `teacher_model`
  # loaded from `teacher_path`; 'hard' (its argmax) or 'soft' (temperature);
  # `alpha`: the teacher's weight for a student with a single head.
  config.distill = ml_collections.ConfigDict(dict(
      teacher_path='', teacher_model='', kind='hard', alpha=0.5,
      temperature=1.0))
  # On the device, per micro-batch, each example mixed with its neighbour
  # (vit_jax/data/mixing.py). Mixup: `p` is the Beta(p, p) concentration (0: off;
  # big_vision's AugReg: 0.2-0.8). CutMix: Beta(cutmix_alpha, cutmix_alpha)
  # (0: off). Both on: CutMix with probability switch_prob, else Mixup
  # (DeiT: p=0.8, cutmix_alpha=1.0, switch_prob=0.5).
  config.mixup = ml_collections.ConfigDict(dict(
      p=0.0, cutmix_alpha=0.0, switch_prob=0.5))
  config.label_smoothing = 0.0  # eps: y (1 - eps) + eps / classes (DeiT: 0.1)
  config.batch = 512
  config.batch_eval = 512
  config.accum_steps = 1  # micro-batches per update (saves memory)
  config.shuffle_buffer = 50_000
  config.prefetch = 2
  config.seed = 0

  config.progress_every = 10
  config.progress_bar = False  # a tqdm bar (notebooks) instead of lines
  config.checkpoint_every = 1_000  # 0: only at the end
  config.max_to_keep = 3
  # 'train' (supervised classification), 'distill' (DeiT), 'lit', 'mae'
  # (configs/mae_fmnist.py) or 'navit' (configs/navit_fmnist.py) trains a
  # task; 'evaluate'
  # runs the evaluators below on a checkpoint, no training ('fewshot' and
  # 'zeroshot': only those of that type); 'inference_time': forward img/s.
  config.trainer = 'train'
  # Evaluators, as big_vision's: name -> type, `every` (steps; 0: at the end
  # only; None: never in training, only trainer='evaluate') and settings.
  config.evals = ml_collections.ConfigDict()
  config.evals.test = ml_collections.ConfigDict(dict(
      type='classification', every=100,
      dataset='', split=''))  # '': config.dataset and pp.test
  config.evals.fewshot = fewshot_evaluator()

  # Devices: [(axis, size)], one size may be -1; sharding rules are
  # [(regex over parameter paths, PartitionSpec tuple)], unmatched = replicated.
  config.mesh = [('data', -1)]
  config.sharding_rules = []
  # Leaves no rule matches: 'replicate', or 'fsdp' (large parameters and
  # their optimizer state split over `data`, to fit bigger models).
  config.sharding_strategy = 'replicate'

  # The original release's keys, the same fields by its names.
  config.eval_every = config.evals.test.get_ref('every')
  config.optim_dtype = config.get_ref('momentum_dtype')
  # An AugReg checkpoint in `pretrained_dir`: its filename, or a model name
  # (the best of its i21k pre-trainings, by index.csv's `final_val`).
  config.model_or_filename = ml_collections.config_dict.placeholder(str)
  return config


def fewshot_evaluator(every=None) -> ml_collections.ConfigDict:
  """Few-shot linear evaluation of the pre-logits (paper, Sec. 4.1)."""
  return ml_collections.ConfigDict(dict(
      type='fewshot',
      every=ml_collections.config_dict.placeholder(int) if every is None
      else every,
      dataset='',  # a tfds name; '' is config.dataset
      train='train',  # split the shots are drawn from
      test='test',
      shots=(1, 5, 10, 25),
      seeds=3,  # numpy seeds 0 .. seeds-1 draw the shots
      l2_reg=2.0**10))  # fixed, as big_vision's and the paper's


def knn_evaluator(every=None) -> ml_collections.ConfigDict:
  """DINO's weighted k-NN classification of the pre-logits (Caron et al.,
  2021): `config.evals.knn = knn_evaluator()`."""
  return ml_collections.ConfigDict(dict(
      type='knn',
      every=ml_collections.config_dict.placeholder(int) if every is None
      else every,
      dataset='',  # a tfds name; '' is config.dataset
      train='train',  # split of the memory bank
      test='test',
      k=20,
      temperature=0.07))  # DINO's defaults


# The paper's fine-tuning setups (Appendix B.1.1): steps per dataset at 384 px.
DATASET_PRESETS = {
    'cifar10': dict(total_steps=10_000, pp=dict(train='train[:98%]',
                                                test='test', crop=384)),
    'cifar100': dict(total_steps=10_000, pp=dict(train='train[:98%]',
                                                 test='test', crop=384)),
    'imagenet2012': dict(total_steps=20_000, pp=dict(
        train='train[:99%]', test='validation', crop=384)),
    # ImageNet ReaL: evaluate an ImageNet checkpoint (trainer='evaluate');
    # its one split, 'validation', stands in for the unused train split.
    'imagenet2012_real': dict(pp=dict(train='validation', test='validation',
                                      crop=384, label='imagenet2012_real')),
    'oxford_iiit_pet': dict(total_steps=500, warmup_steps=100, pp=dict(
        train='train[:90%]', test='test', crop=384)),
    'oxford_flowers102': dict(total_steps=500, warmup_steps=100, pp=dict(
        train='train', test='test', crop=384)),
}


def with_dataset(config: ml_collections.ConfigDict,
                 dataset: str) -> ml_collections.ConfigDict:
  if dataset not in DATASET_PRESETS:
    raise ValueError(f'Unknown dataset preset {dataset!r}; known: '
                     f'{sorted(DATASET_PRESETS)}.')
  config.dataset = dataset
  config.update(DATASET_PRESETS[dataset])  # merges into nested fields
  return config


def with_model(config: ml_collections.ConfigDict, model_name: str,
               model=None) -> ml_collections.ConfigDict:
  """Sets the model: the preset `model_name`, or `model` under that name,
  and the input normalization its weights expect (`registry.set_model`).

  `config.model.model_name` refers to `config.model_name`, so the name has
  one source: `--config.model_name` sets both (a preset's name brings its
  whole model: `run_config.resolve`).
  """
  return registry.set_model(config, model_name, model)
