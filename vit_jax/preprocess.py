"""How a checkpoint's source prepares an image for evaluation.

`convert` records the source's eval transform beside the `.npz` it writes,
in `<name>.transform.json`, with timm's `pretrained_cfg` keys:
`input_size` ([3, H, W]), `crop_pct`, `interpolation`, `mean`, `std` and
`crop_mode`. `predict` reads it back by default.
"""

import json
from typing import Any, Dict, Optional

from etils import epath

TRANSFORM_KEYS = ('input_size', 'crop_pct', 'interpolation', 'mean', 'std',
                  'crop_mode')


def transform_path(npz_path) -> epath.Path:
  """`<name>.transform.json` beside `<name>.npz`."""
  path = epath.Path(npz_path)
  stem = path.name[:-len('.npz')] if path.name.endswith('.npz') else path.name
  return path.parent / f'{stem}.transform.json'


def save_transform(npz_path, transform: Dict[str, Any]) -> None:
  """Writes the `TRANSFORM_KEYS` of `transform` beside `npz_path`."""
  kept = {k: transform[k] for k in TRANSFORM_KEYS if k in transform}
  transform_path(npz_path).write_text(json.dumps(kept, indent=1) + '\n')


def load_transform(npz_path) -> Optional[Dict[str, Any]]:
  """The transform recorded beside `npz_path`, or None if there is none."""
  path = transform_path(npz_path)
  if not path.exists():
    return None
  return json.loads(path.read_text())
