"""Model cost report (jaxnet/tools/summary.py): parameters, FLOPs, activation memory.

  python -m jaxnet.cli.summary resnet50 [--image-size 224] [--batch-size 32] \
      [--num-classes 1000] [--precision fp32] [--channels 3] [--no-train-step]
"""

import difflib
import sys

from jaxnet import cli
from jaxnet.cli import process


def main(argv=None) -> int:
  from jaxnet.core import models
  from jaxnet.tools.summary import format_table, summarize
  p = cli.parser("summary", __doc__.split("\n")[0])
  p.add_argument("model", help=f"one of: {', '.join(models.names())}")
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--num-classes", type=int, default=1000)
  p.add_argument("--channels", type=int, default=3)
  p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
  p.add_argument("--no-train-step", action="store_true",
                 help="skip compiling the train step (its temp memory and FLOPs)")
  a = p.parse_args(argv)
  from jaxnet.core.errors import UserError
  with process.one_line_errors():
    if a.model not in models.names():
      close = difflib.get_close_matches(a.model, models.names(), n=3)
      raise UserError(f"no model {a.model!r}; "
                      + (f"did you mean {' or '.join(close)}? " if close else "")
                      + f"pass one of: {', '.join(models.names())}")
    multiple = models.image_multiple(models.create(a.model, num_classes=a.num_classes))
    if a.image_size % multiple:
      fit = max(multiple, round(a.image_size / multiple) * multiple)
      raise UserError(f"{a.model} takes image sides that are multiples of {multiple}: --image-size="
                      f"{a.image_size} is not; use e.g. --image-size={fit}")
    try:
      s = summarize(a.model, image_size=a.image_size, batch_size=a.batch_size, num_classes=a.num_classes,
                    channels=a.channels, precision_name=a.precision, train_step=not a.no_train_step)
    except UserError as e:  # a size the model refuses (AlexNet under 63 px), told in this command's flags
      raise UserError(f"{a.model} at --image-size={a.image_size}: "
                      f"{str(e).replace('config.image_size', '--image-size')}") from e
  print(format_table(s))
  return 0


if __name__ == "__main__":
  sys.exit(main())
