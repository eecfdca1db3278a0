"""What each kind of data identity costs (config.data.identity, docs/reproducibility.md).

  python experiments/bench_identity.py [--files 20000] [--size 110000] [--repeats 2] [--dir /tmp/x]

Writes an image folder of FILES files of SIZE bytes (ImageNet's train files average ~110 KB),
then times ImageFolderSource.identity(kind) for each kind: listing (a stat per file),
sampled (and three 4 KiB blocks of each file) and content (every byte). Prints the time per
file and what that comes to for ImageNet's 1,281,167 train files (extrapolated linearly:
the per-file cost does not depend on the count). The files were just written, so their
pages are in the page cache: these are the costs of the CPU and the system calls. From a
cold disk, content reads all the bytes at the disk's speed (ImageNet's 140 GB at 1 GB/s
is 140 s more), sampled three small random reads per file.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

IMAGENET_TRAIN_FILES = 1_281_167


def write_folder(root: str, files: int, size: int, classes: int = 100) -> None:
  block = os.urandom(size)
  for i in range(files):
    folder = os.path.join(root, "train", f"class_{i % classes:03d}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{i:08d}.jpg"), "wb") as f:
      f.write(i.to_bytes(8, "little") + block[8:])  # distinct files of the same size


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--files", type=int, default=20_000)
  parser.add_argument("--size", type=int, default=110_000, help="bytes per file")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
  args = parser.parse_args(argv)

  from jaxnet.core import provenance
  from jaxnet.core.data.imagefolder import ImageFolderSource
  root = tempfile.mkdtemp(prefix="bench-identity-", dir=args.dir)
  try:
    write_folder(root, args.files, args.size)
    source = ImageFolderSource(root, "train")
    print(benchlib.date_line())
    print(benchlib.cpu_line())
    print(benchlib.load_line())
    print(f"{args.files} files of {args.size} bytes ({args.files * args.size / 1e9:.2f} GB), in the page cache")
    print(f"{'kind':<8}  {'seconds (each repeat)':<24}  {'us per file':>11}  {'ImageNet train (s)':>18}")
    for kind in provenance.IDENTITY_KINDS:
      times = []
      for _ in range(args.repeats):
        start = time.perf_counter()
        source.identity(kind)
        times.append(time.perf_counter() - start)
      per_file = min(times) / args.files
      shown = ", ".join(f"{t:.2f}" for t in times)
      print(f"{kind:<8}  {shown:<24}  {per_file * 1e6:11.1f}  {per_file * IMAGENET_TRAIN_FILES:18.0f}")
  finally:
    shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
