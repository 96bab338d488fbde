"""vit_jax: Vision Transformer research code in JAX/Flax."""

import pathlib

import setuptools

here = pathlib.Path(__file__).parent
requirements = [
    line.split('#')[0].strip()
    for line in (here / 'requirements.txt').read_text().splitlines()
    if line.split('#')[0].strip()
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
    install_requires=requirements,
    extras_require={
        'test': ['pytest==9.0.3', 'pytest-xdist==3.8.0', 'safetensors==0.8.0',
                 'scikit-learn==1.9.1',  # tests/evaluators/test_fewshot.py's reference
                 # Notebooks run in the tests (papermill, SMOKE = True).
                 'papermill==2.7.0', 'ipykernel==7.4.0',
                 # tests/original/test_notebook.py runs a notebook directly.
                 'nbclient==0.11.0', 'nbformat==5.11.1',
                 'ipython==9.18.1'],  # notebooks' IPython.display
        # vit_jax.convert: .safetensors, torch's .pth/.bin, hub downloads.
        'convert': ['safetensors==0.8.0', 'torch==2.14.1',
                    'huggingface_hub==2.4.0'],
        # vit_jax.plan: libtpu compiles for TPU slices, here or on a TPU VM.
        'tpu': ['jax[tpu]==0.10.2'],
        # benchmarks/speed.py's side-by-side run (torch and timm on the CPU).
        'bench': ['torch==2.14.1', 'torchvision==0.29.1', 'timm==1.0.31'],
    },
    license='Apache 2.0',
)
