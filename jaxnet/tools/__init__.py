"""Tools built on the core, never imported by it: a restored model for prediction
(predictor.py), exports (export.py: jax, int8, ONNX), pretrained weights in and out
(weights/), the GPU plan and the HLO reading under it (gpu_plan.py, hlo.py), reports of a
run's metrics (report.py), a model's cost (summary.py), generated image folders
(make_imagefolder.py)."""
