"""Prepare a data set for fast input: its images re-encoded with a bounded side, in ArrayRecord
shards that data.source=prepared reads (jaxnet/core/data/prepared.py):

    python -m jaxnet.cli.prepare --dir /data/imagenet --out /data/imagenet-256
    python -m jaxnet.cli.prepare --source tfds --dir $TFDS_DATA_DIR --out /data/imagenet-256
    jaxnet train --config=resnet50:fast --workdir=W --config.data.dir=/data/imagenet-256

Train splits get their shorter side bounded (--short-side, default 256), 3/4 of their images
stored as raw pixels and the rest as JPEGs (--raw-fraction, default 0.75); the eval split keeps
its images' sizes by default (--eval-short-side 0), so eval's resize to 256 and center crop
see the original pixels. Safe to stop at any time: the same command resumes, keeping every
finished shard. Images that cannot be read are left out and listed in OUT/prepared.json;
more than --max-unreadable of a split stops it.
"""

import argparse
import os
import sys

from jaxnet.core.data import pipeline, prepared
from jaxnet.core.errors import UserError


def _source(kind: str, root: str, name: str, split: str):
  if kind == "imagefolder":
    from jaxnet.core.data.imagefolder import ImageFolderSource
    return ImageFolderSource(root, split)
  from jaxnet.core.data.tfds_source import TfdsSource
  return TfdsSource(name, split, root or None)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="jaxnet prepare", description=__doc__.split("\n\n")[0])
  parser.add_argument("--source", choices=("imagefolder", "tfds"), default="imagefolder",
                      help="imagefolder: DIR/train/<class>/*.jpg (default); tfds: a tfds data set "
                           "prepared as ArrayRecord in DIR (--name)")
  parser.add_argument("--dir", required=True, help="the image folder's root, or the tfds data_dir")
  parser.add_argument("--name", default="imagenet2012", help="tfds data set (--source tfds)")
  parser.add_argument("--out", required=True, help="output folder (resumes what is there)")
  parser.add_argument("--splits", default=None,
                      help="comma list; default train,val (imagefolder) or train,validation (tfds)")
  parser.add_argument("--short-side", type=int, default=prepared.Options.short_side,
                      help="train splits: shorter side bound in pixels, 0 keeps sizes (default "
                           "%(default)s; FFCV's ResNet-50 results bound the longer side at 500)")
  parser.add_argument("--eval-short-side", type=int, default=0,
                      help="the other splits' bound (default 0: sizes kept)")
  parser.add_argument("--quality", type=int, default=prepared.Options.quality,
                      help="JPEG quality of re-encoded images (default %(default)s, as FFCV's)")
  parser.add_argument("--raw-fraction", type=float, default=prepared.Options.raw_fraction,
                      help="train splits: this fraction of the images stored as raw pixels, which "
                           "need no decode, ~9x a JPEG's bytes (default %(default)s: ~200 KiB an "
                           "image at --short-side 256, ~270 GB for ImageNet's train split; 0: "
                           "~28 KiB, ~37 GB, less than half as fast; FFCV's ResNet-50 results: 0.5)")
  parser.add_argument("--shard-images", type=int, default=prepared.Options.shard_images,
                      help="images per shard (default %(default)s)")
  parser.add_argument("--workers", type=int, default=None,
                      help="processes encoding shards (default: the cores this process may use)")
  parser.add_argument("--max-unreadable", type=float, default=0.001,
                      help="fraction of a split's images that may be unreadable (left out, listed) "
                           "before prepare stops (default %(default)s)")
  args = parser.parse_args(argv)
  splits = (args.splits or ("train,val" if args.source == "imagefolder" else "train,validation")).split(",")
  workers = args.workers if args.workers is not None else pipeline.cores_available()
  try:
    os.makedirs(args.out, exist_ok=True)
    finished, class_names = {}, None
    for split in splits:
      source = _source(args.source, args.dir, args.name, split)
      class_names = class_names or source.class_names or [str(i) for i in range(source.num_classes)]
      side = args.short_side if split == "train" else args.eval_short_side
      raw = args.raw_fraction if split == "train" else 0.0
      options = prepared.Options(side, args.quality, args.shard_images, raw)
      print(f"{split}: {len(source):,} images from {source!r} -> {args.out}/{split} "
            f"(shorter side <= {side or 'as is'}, quality {args.quality}"
            f"{f', {raw:.0%} raw pixels' if raw else ''}, {workers} workers)", flush=True)
      entry = prepared.prepare_split(source, args.out, split, options, workers=workers,
                                     max_unreadable=args.max_unreadable,
                                     report=lambda line: print(line, flush=True))
      finished[split] = entry
      prepared.write_manifest(args.out, {split: entry}, class_names, options)
      skipped = entry["unreadable"]
      note = (f"; {len(skipped)} unreadable image(s) left out, listed in {args.out}/prepared.json "
              f"(e.g. {skipped[0]['image']}: {skipped[0]['why']})" if skipped else "")
      print(f"{split}: {entry['examples']:,} images in {len(entry['files'])} shards, "
            f"{entry['bytes'] / 2**20:,.1f} MiB{note}", flush=True)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f"interrupted: finished shards stay in {args.out}; rerun the same command to resume",
          file=sys.stderr)
    return 130
  print(f"done: train with --config.data.source=prepared --config.data.dir={args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
