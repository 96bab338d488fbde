"""vit_jax: Vision Transformer research code in JAX/Flax.

`install_requires` gives ranges, so that the package installs into the
environment a user already has (Colab, a TPU VM, a GPU machine) and keeps
its jax, TensorFlow and pandas: each lower bound is a version the smoke set
passed at (`scripts/lower_bounds.sh`, docs/install.md); an upper bound only
where a known break exists. The exact tested set is `requirements.txt`, a
lock that CI installs as constraints (`pip install -c requirements.txt`).
"""

import pathlib

import setuptools

here = pathlib.Path(__file__).parent

REQUIRES = [
    'absl-py>=1.0.0',
    'chex>=0.1.86',
    'clu>=0.0.11',
    'etils[epath,epy]>=1.5.0',
    'filelock>=3.0',
    'flax>=0.10.0',
    # tensorflow-datasets imports it to prepare a dataset (4.9.10's
    # dataset_builder.py) but asks for it on Python < 3.9 only.
    'importlib_resources>=6.0',
    'jax>=0.5.3',
    'matplotlib>=3.6.0',  # vit_jax.analysis's figures
    'ml_collections>=0.1.1',
    'ml_dtypes>=0.4.0',  # bfloat16 arrays in big_vision's .npz
    'numpy>=1.26',
    'optax>=0.2.3',
    'orbax-checkpoint>=0.11.1',
    'pandas>=1.5.0',  # checkpoints.pretrained.augreg_index
    'pillow>=9.2.0',
    'scipy>=1.11.1',
    'sentencepiece>=0.1.99',
    # The input pipeline's. `tensorflow`, not `tensorflow-cpu`: the name
    # Colab and TensorFlow's images install, so that theirs is kept (two
    # distributions of one module overwrite each other's files); a fresh
    # environment gets a build that runs on any CPU. The package hides GPUs
    # from it (main.py): TensorFlow only reads data.
    'tensorflow>=2.17',
    'tensorflow-datasets>=4.9.4',
    'tensorboard>=2.17',  # clu's summary writer (TensorFlow no longer brings it)
    'tokenizers>=0.19',
    'tqdm>=4.60',
]

setuptools.setup(
    name='vit_jax',
    version='0.1.0',
    description='Vision Transformer (ViT) in JAX/Flax, with the original '
    'release\'s parameter names and checkpoint format.',
    long_description=(here / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['vit_jax', 'vit_jax.*']),
    package_data={'vit_jax.data': ['*.txt']},  # ImageNet class names
    python_requires='>=3.10',
    install_requires=REQUIRES,
    extras_require={
        'test': ['pytest>=8.0', 'pytest-xdist>=3.5', 'safetensors>=0.4',
                 'scikit-learn>=1.3',  # tests/evaluators/test_fewshot.py's reference
                 # Notebooks run in the tests (papermill, SMOKE = True).
                 'papermill>=2.5', 'ipykernel>=6.0',
                 # tests/original/test_notebook.py runs a notebook directly.
                 'nbclient>=0.9', 'nbformat>=5.9',
                 'ipython>=8.0',  # notebooks' IPython.display
                 'av>=12.0'],  # vit_jax.predict's video files
        # vit_jax.convert: .safetensors, torch's .pth/.bin, hub downloads.
        'convert': ['safetensors>=0.4', 'torch>=2.1', 'huggingface_hub>=0.23'],
        # vit_jax.predict: video files (.mp4, .webm, ...; PyAV bundles FFmpeg).
        'video': ['av>=12.0'],
        # A TPU VM, and vit_jax.plan (libtpu compiles for TPU slices here).
        'tpu': ['jax[tpu]>=0.5.3'],
        # NVIDIA GPUs: jax's CUDA 12 wheels (CUDA and cuDNN from pip).
        'gpu': ['jax[cuda12]>=0.5.3'],
        # benchmarks/speed.py's side-by-side run (torch and timm on the CPU).
        'bench': ['torch>=2.1', 'torchvision>=0.16', 'timm>=1.0'],
    },
    license='Apache 2.0',
)
