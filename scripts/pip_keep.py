r"""`pip install`, keeping what the environment already has.

Colab's runtimes, TPU VM images and GPU containers come with their own jax
(matched to a CUDA plugin or libtpu), TensorFlow, pandas, numpy and torch.
A plain `pip install -e .` keeps them whenever they satisfy the package's
ranges, but replaces one that does not, and a replaced jax no longer
matches its plugin. Here the installed versions of those packages become
constraints: pip installs the rest, or fails naming the package that is too
old, and changes none of them.

  python scripts/pip_keep.py -e '.[convert]'     # any `pip install` arguments
"""

import importlib.metadata
import re
import subprocess
import sys
import tempfile

# Distributions that a runtime's accelerator stack or other libraries are
# built against (PEP 503 normalized names).
KEEP = re.compile(r'jax|jaxlib|jax-cuda\d+-(plugin|pjrt)|libtpu|'
                  r'tensorflow|tensorflow-cpu|tf-nightly|pandas|numpy|torch')


def normalized(name: str) -> str:
  return re.sub(r'[-_.]+', '-', name).lower()


def kept(distributions) -> list[str]:
  """`name==version` of each installed distribution in KEEP, sorted."""
  return sorted({f'{normalized(d.metadata["Name"])}=={d.version}'
                 for d in distributions
                 if KEEP.fullmatch(normalized(d.metadata['Name']))})


def tensorflow_conflict(pins) -> str | None:
  """An error if TensorFlow is installed under another distribution name
  than the `tensorflow` the package asks for: pip would install that one
  too, over the same files."""
  names = {pin.split('==')[0] for pin in pins}
  other = sorted(names & {'tensorflow-cpu', 'tf-nightly'})
  if other and 'tensorflow' not in names:
    return (f'Error: {other[0]} is installed and vit_jax asks for '
            'tensorflow; pip would install it over the same files. Run '
            f'`pip uninstall -y {other[0]}` first (docs/install.md).')
  return None


def main(args):
  pins = kept(importlib.metadata.distributions())
  if error := tensorflow_conflict(pins):
    print(error, file=sys.stderr)
    return 1
  print('Keeping', ', '.join(pins) or 'nothing (none installed)')
  with tempfile.NamedTemporaryFile('w', suffix='.txt') as constraints:
    constraints.write('\n'.join(pins) + '\n')
    constraints.flush()
    return subprocess.run([sys.executable, '-m', 'pip', 'install', '-c',
                           constraints.name, *args]).returncode


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
