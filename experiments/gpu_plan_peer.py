"""jaxnet's train step beside the hand-written Flax step, both compiled on this CPU for GPUs.

    PYTHONPATH=.:PLUGIN_DIR python experiments/gpu_plan_peer.py --target=h100 --gpus=8 \
        [--model=resnet50] [--precision=bf16] [--batch=2048]

The peer is experiments/peers/flax_minimal.py's step (the same Flax module, everything
around it written by hand); jaxnet's is the one `python -m jaxnet.cli.gpu_plan` compiles,
with the config's optimizer replaced by the peer's (SGD, Nesterov momentum, weight decay
on kernels), so the difference is what jaxnet adds around the model: kernels per step,
HBM bytes and memory per GPU. Needs the CUDA plugin wheels (see docs/gpu_plan.md).
"""

import argparse
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"  # compile on this CPU; never start a CUDA backend
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))


def peer_step(model_name, precision, batch, image_size, devices):
  """flax_minimal's step compiled for `devices`: (Compiled, abstract params)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import flax_minimal
  from jaxnet.tools import gpu_plan as gpu_compile
  from jaxnet.core import models
  model = models.create(model_name, num_classes=1000, dtype=flax_minimal.DTYPES[precision])
  tx = flax_minimal.make_optimizer()
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                                jnp.zeros((1, image_size, image_size, 3)), train=False))
  mesh = Mesh(np.asarray(devices), ("data",))
  replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  state = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {}),
           "opt_state": jax.eval_shape(tx.init, variables["params"]),
           "scale": jax.ShapeDtypeStruct((), jnp.float32), "good": jax.ShapeDtypeStruct((), jnp.int32),
           "step": jax.ShapeDtypeStruct((), jnp.int32)}
  state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)
  images = jax.ShapeDtypeStruct((batch, image_size, image_size, 3), jnp.uint8, sharding=sharded)
  labels = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharded)
  step = jax.jit(flax_minimal.make_step(model, tx, precision, 1000), donate_argnums=0)
  with models.tracing_for("gpu"):
    compiled = gpu_compile.compile_step(step, state, images, labels)
  return compiled, variables["params"]


def row(name, compiled, analysis):
  from jaxnet.tools import hlo as hlo_analysis
  s = hlo_analysis.summary(analysis)
  return {"step": name, "kernels": s["kernels"], "fusions": s["fusions"],
          "hbm_gib": s["hbm_bytes"] / 2**30, "memory_gib": compiled.total / 2**30,
          "temporaries_gib": compiled.temporaries / 2**30,
          "weight_copies": s["weight_copies"], "all_reduces": s["collectives"].get("all-reduce", {}).get("count", 0)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="h100")
  parser.add_argument("--gpus", type=int, default=8)
  parser.add_argument("--model", default="resnet50")
  parser.add_argument("--precision", default="bf16")
  parser.add_argument("--batch", type=int, default=2048, help="global batch")
  parser.add_argument("--image-size", type=int, default=224)
  args = parser.parse_args()
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan as gpu_compile
  from jaxnet.tools import hlo as hlo_analysis
  gpu_compile.check_plugin()
  _, text = gpu_compile.target_text(args.target)
  devices = gpu_compile.topology_devices(text, args.gpus)
  per_gpu = args.batch // args.gpus

  config = config_io.load("configs/resnet50.py", {
      "model.name": args.model, "precision": args.precision, "image_size": args.image_size,
      "optim.name": "sgd", "optim.momentum": 0.9, "optim.nesterov": True,
      "optim.weight_decay": 5e-5, "label_smoothing": 0.0})
  config = gpu_compile.plan_config(config, per_gpu, args.gpus)
  exp, train, _ = gpu_compile.build(config, devices, eval_step=False)
  rows = [row("jaxnet", train, gpu_compile.analyse_step(train, exp.abstract_state, per_gpu))]

  compiled, params = peer_step(args.model, args.precision, args.batch, args.image_size, devices)
  import jax
  import numpy as np
  peer_analysis = hlo_analysis.analyse(
      compiled.hlo, weight_elements={int(np.prod(x.shape)) for x in jax.tree.leaves(params)},
      min_activation_elements=per_gpu * 1024)
  rows.append(row("flax_minimal", compiled, peer_analysis))
  j, p = rows
  print(f"{args.model} {args.precision} batch {args.batch} ({per_gpu}/GPU) on {args.gpus}x {args.target}, "
        f"compiled on a CPU, not run")
  print("| step | kernels/step | fusions | HBM GiB/step/GPU | memory GiB/GPU | weight copies | all-reduces |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['step']} | {r['kernels']} | {r['fusions']} | {r['hbm_gib']:.2f} | {r['memory_gib']:.2f} "
          f"| {r['weight_copies']} | {r['all_reduces']} |")
  print(f"jaxnet / hand-written: kernels {j['kernels'] / p['kernels']:.3f}, HBM bytes "
        f"{j['hbm_gib'] / p['hbm_gib']:.3f}, memory {j['memory_gib'] / p['memory_gib']:.3f}")
  print(json.dumps(rows))


if __name__ == "__main__":
  main()
