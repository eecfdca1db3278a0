"""int8 for serving with XLA: qwix post-training quantization (`export --format=jax --int8`).

Every convolution and dense layer computes in int8: weights quantized once, one scale
per output channel; activations quantized on the fly, one scale per image from its own
range (dynamic quantization: no calibration set). The result is a Predictor whose
model and variables are qwix's, so `jaxnet.export` serializes it like any other.
"""

import jax
import jax.numpy as jnp

from jaxnet import errors

INSTALL = "pip install -e '.[onnx]'"  # the deploy extra holds qwix too
DESCRIPTION = ("int8 (qwix PTQ): weights one scale per output channel, activations one scale "
               "per image, dynamic")


def quantize(predictor):
  """The predictor with int8 weights and activations in every conv and dense layer."""
  try:
    import qwix
  except ImportError:
    raise errors.UserError(f"--format=jax --int8 needs the package qwix, which is not installed: "
                           f"{INSTALL}") from None
  from jaxnet.predictor import Predictor
  rule = qwix.QtRule(module_path=".*", weight_qtype="int8", act_qtype="int8")
  model = qwix.quantize_model(predictor.model, qwix.PtqProvider([rule]))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, *predictor.image_shape)), train=False))
  variables = dict(predictor.variables)
  variables["params"] = qwix.quantize_params(predictor.variables["params"], shapes["params"])
  return Predictor(predictor.config, model, variables, num_classes=predictor.num_classes,
                   class_names=predictor.class_names, step=predictor.step, workdir=predictor.workdir)
