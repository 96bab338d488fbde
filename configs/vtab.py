r"""VTAB-1k (Zhai et al., 2019) as the paper fine-tunes on it (Table 2, App.
B.1.1): each of the 19 tasks from 1,000 labelled images, one setting for all.

The paper's setting: SGD momentum 0.9, learning rate 0.01, 2,500 steps,
batch 512, cosine decay, clipping at 1, 384 px for every task. The splits are
task_adaptation's: `train800` and `val200` to choose settings, then the
reported run trains on `train800val200` and tests on `test`. No crops or
flips: several structured tasks' labels (orientation, position, distance)
change under them.

  python -m vit_jax.main --config=configs/vtab.py:b16,caltech101 \
      --config.pretrained_dir=PATH --workdir=/tmp/vtab/caltech101
  python -m vit_jax.main --config=configs/vtab.py:b16,caltech101,val ...

The third argument `val` trains on train800 and tests on val200. Tasks on
other labels than the tfds feature 'label' name a `vit_jax.data.labels`
task in `pp.label`.
"""

import ml_collections

from vit_jax.configs import vit

# task: (tfds name, val200 split, test split, pp.label). The val200 split
# starts where task_adaptation's "val" part of the data starts.
TASKS = {
    # Natural.
    'caltech101': ('caltech101:3.*.*', 'train[2754:2954]', 'test', ''),
    'cifar100': ('cifar100:3.*.*', 'train[45000:45200]', 'test', ''),
    'dtd': ('dtd:3.*.*', 'validation[:200]', 'test', ''),
    'oxford_flowers102': ('oxford_flowers102:2.*.*', 'validation[:200]',
                          'test', ''),
    'oxford_iiit_pet': ('oxford_iiit_pet:3.*.*', 'train[2944:3144]', 'test',
                        ''),
    'svhn': ('svhn_cropped:3.*.*', 'train[65931:66131]', 'test', ''),
    'sun397': ('sun397/tfds:4.*.*', 'validation[:200]', 'test', ''),
    # Specialized.
    'patch_camelyon': ('patch_camelyon:2.*.*', 'validation[:200]', 'test',
                       ''),
    'eurosat': ('eurosat/rgb:2.*.*', 'train[16200:16400]', 'train[21600:]',
                ''),
    'resisc45': ('resisc45:3.*.*', 'train[18900:19100]', 'train[25200:]', ''),
    'diabetic_retinopathy': (
        'diabetic_retinopathy_detection/btgraham-300:3.*.*',
        'validation[:200]', 'test', ''),
    # Structured.
    'clevr_count': ('clevr:3.*.*', 'train[63000:63200]', 'validation',
                    'clevr_count_all'),
    'clevr_distance': ('clevr:3.*.*', 'train[63000:63200]', 'validation',
                       'clevr_closest_object_distance'),
    'dmlab': ('dmlab:2.0.1', 'validation[:200]', 'test', ''),
    'kitti_distance': ('kitti:3.*.*', 'validation[:200]', 'test',
                       'kitti_closest_vehicle_distance'),
    'dsprites_location': ('dsprites:2.*.*', 'train[589824:590024]',
                          'train[663552:]', 'dsprites_x_position'),
    'dsprites_orientation': ('dsprites:2.*.*', 'train[589824:590024]',
                             'train[663552:]', 'dsprites_orientation'),
    'smallnorb_azimuth': ('smallnorb:2.*.*', 'test[:200]', 'test[50%:]',
                          'smallnorb_azimuth'),
    'smallnorb_elevation': ('smallnorb:2.*.*', 'test[:200]', 'test[50%:]',
                            'smallnorb_elevation'),
}


def splits(task: str, validation: bool = False):
  """(train, test) splits of `task`: the final run's, or for `validation`,
  train800 and val200."""
  _, val200, test, _ = TASKS[task]
  if validation:
    return 'train[:800]', val200
  return f'train[:800]+{val200}', test


def get_config(arg: str = 'b16,caltech101') -> ml_collections.ConfigDict:
  model, task, *rest = arg.split(',')
  if task not in TASKS or rest not in ([], ['val']):
    raise ValueError(f'Expected MODEL,TASK[,val] with TASK one of '
                     f'{sorted(TASKS)}; got {arg!r}.')
  config = vit.get_config(f'{model},cifar10').unlock()
  config.dataset, config.pp.label = TASKS[task][0], TASKS[task][3]
  config.pp.train, config.pp.test = splits(task, validation=bool(rest))
  config.pp.crop = 384
  config.pp.area_min, config.pp.flip = 1.0, False
  config.base_lr = 0.01
  config.total_steps = 2_500
  config.warmup_steps = 200
  config.batch = 512
  config.shuffle_buffer = 1_000
  return config.lock()
