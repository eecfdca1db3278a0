"""Mutation check: break each documented behaviour in a copy of the repository, run the
tests that claim it, and report every break those tests do not notice.

    python tests/mutations.py            # all of them (about 15 minutes on 2 cores)
    python tests/mutations.py --ci       # the quick subset .ci/run runs (about 3 minutes)
    python tests/mutations.py --jobs 2   # two at a time, each in its own copy
    python tests/mutations.py --list     # names, files and tests, nothing run
    python tests/mutations.py NAME ...   # only these

A mutation is an exact piece of a file's text and what to put in its place, and the
tests (pytest node ids) that claim the behaviour it breaks. The repository is copied
once per job to a temporary directory (the working tree is only read), the named tests are run
there unmutated first (they must pass, or a failure would prove nothing), then each
mutation is applied alone, its tests run with `-x`, and the file put back. A mutation
is *killed* when its tests fail, and *survives* when they pass. A mutation whose text
is not in its file exactly once is an error, so the list cannot silently rot when the
code changes: update its text. Exit status 0 only when every mutation was killed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import queue
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
  name: str
  path: str            # relative to the repository root
  old: str             # must occur exactly once in the file
  new: str
  tests: tuple         # pytest node ids that must fail once `old` is replaced
  ci: bool = False     # in the quick subset (tests of seconds, no CLI training runs)


TOOLS = "tests/test_tools.py::"
PARALLEL = "tests/test_parallel.py::"
EXPERIMENTS = "tests/test_experiments.py::"
RECIPE = "tests/test_imagenet_recipe.py::"
DATA = "tests/test_data_reliability.py::"
ONNX = "tests/test_onnx_export.py::"
DETECTION = "tests/test_detection.py::"
LAUNCH = "tests/test_launch.py::"

MUTATIONS = [
    # --- the training loop -------------------------------------------------------
    Mutation("progressive_resizing_new_loader", "jaxnet/core/data/pipeline.py",
             "      self.iterator = iter(self._make_loader(image_size))\n", "",
             (RECIPE + "test_fast_recipe_trains_evaluates_checkpoints_and_counts_corrupt_jpegs",)),
    Mutation("progressive_resizing_same_position", "jaxnet/core/data/pipeline.py",
             "      self.iterator.set_state(self.position)\n", "",
             (RECIPE + "test_fast_recipe_trains_evaluates_checkpoints_and_counts_corrupt_jpegs",)),
    Mutation("iterator_position_after_consumed_batch", "jaxnet/core/train.py",
             "self.state, self.batches.position, self.config_dict,",
             "self.state, self.batches.iterator.get_state(), self.config_dict,",
             ("tests/test_train.py::test_resume_is_exact",)),
    Mutation("final_step_logged", "jaxnet/core/train.py",
             "  if step == total:\n    return last\n", "  if step == total:\n    return False\n",
             ("tests/test_train.py::test_periodic_actions_run_every_n_steps_and_at_the_last_step_only_when_asked",),
             ci=True),
    Mutation("final_eval_and_save_not_in_the_loop", "jaxnet/core/train.py",
             "  if step == total:\n    return last\n", "  if step == total:\n    return True\n",
             ("tests/test_train.py::test_periodic_actions_run_every_n_steps_and_at_the_last_step_only_when_asked",),
             ci=True),
    Mutation("iterator_position_restored", "jaxnet/core/checkpoint.py",
             '      self._restore_position(step, iterator, saved.get("process_count"))\n', "      pass\n",
             ("tests/test_train.py::test_resume_is_exact",
              PARALLEL + "test_resumed_two_process_run_continues_exactly")),
    # A workdir whose data was moved (regenerated elsewhere) resumes: Grain's saved position
    # names the data's old path. Only tests/data/workdir_6a228ef_retinanet's test moves data.
    Mutation("data_position_of_moved_data_restores", "jaxnet/core/adapters/grain.py",
             '      saved = {**saved, "data_source": new}\n', "      pass\n",
             (DETECTION + "test_a_detection_workdir_written_by_an_earlier_jaxnet_evaluates_resumes_and_predicts",)),
    # A whole-batches position saved by another worker count (data.workers=-1 on another
    # node) resumes at the next batch: the conversion a batch late repeats none but skips one.
    Mutation("data_position_other_workers_next_batch", "jaxnet/core/adapters/grain.py",
             "return int(position[_LAST_SEEN][str(turn)]) + lanes\n",
             "return int(position[_LAST_SEEN][str(turn)]) + lanes + 1\n",
             ("tests/test_pipeline.py::test_a_whole_batches_position_resumes_at_the_next_batch_with_another_worker_count",)),
    Mutation("sigterm_stops_the_run", "jaxnet/core/train.py",
             "  if jax.process_count() == 1:\n    return control.stop_requested()",
             "  if jax.process_count() == 1:\n    return False",
             ("tests/test_train.py::test_sigterm_saves_and_resume_matches_uninterrupted_run",)),
    Mutation("sigterm_stops_every_process", "jaxnet/core/train.py",
             "return sync and sharding.any_process(control.stop_requested())",
             "return sync and control.stop_requested()",
             (PARALLEL + "test_sigterm_to_one_process_stops_both_at_the_same_step",)),
    Mutation("environment_json_revision", "jaxnet/core/metrics.py",
             '"git_revision": revision,', '"git_revision": "",',
             (TOOLS + "test_environment_json_records_versions_devices_and_revision",)),
    Mutation("environment_json_devices", "jaxnet/core/provenance.py",
             '"devices": [str(d) for d in devices]', '"devices": []',
             (TOOLS + "test_environment_json_records_versions_devices_and_revision",)),
    Mutation("environment_json_versions", "jaxnet/core/metrics.py",
             '"optax": optax.__version__', '"optax": flax.__version__',
             (TOOLS + "test_environment_json_records_versions_devices_and_revision",)),
    Mutation("label_smoothing_from_config", "jaxnet/core/tasks/classification/__init__.py",
             "classification_loss(num_classes, config.label_smoothing, mix)", "classification_loss(num_classes, 0.0, mix)",
             (RECIPE + "test_standard_recipe_loss_is_label_smoothed_and_skips_masked_images",)),
    Mutation("eval_uses_ema", "jaxnet/core/steps.py",
             "state.batch_stats, options.ema_decay > 0)", "state.batch_stats, False)",
             ("tests/test_ema.py::test_ema_tracks_params_and_eval_uses_it",), ci=True),

    # --- the steps: loss, masking, loss scaling ----------------------------------
    Mutation("label_smoothing_applied", "jaxnet/core/tasks/classification/__init__.py",
             "  if label_smoothing:\n", "  if False:\n",
             (RECIPE + "test_standard_recipe_loss_is_label_smoothed_and_skips_masked_images",)),
    Mutation("masked_examples_out_of_the_loss", "jaxnet/core/tasks/classification/__init__.py",
             'return jnp.sum(per_example * real), {"train/accuracy": correct}',
             'return jnp.sum(per_example), {"train/accuracy": correct}',
             (RECIPE + "test_standard_recipe_loss_is_label_smoothed_and_skips_masked_images",)),
    Mutation("exact_eval_masks_padding", "jaxnet/core/tasks/classification/__init__.py",
             'mask = batch["mask"].astype(jnp.float32)', 'mask = jnp.ones_like(batch["mask"], jnp.float32)',
             ("tests/test_train.py::test_quick_start_learns_and_records_everything",)),
    Mutation("eval_top5", "jaxnet/core/tasks/classification/__init__.py",
             '"top5": jnp.sum(in_top5 * mask),',
             '"top5": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * mask),',
             ("tests/test_train.py::test_quick_start_learns_and_records_everything",
              TOOLS + "test_evaluate_and_restore_agree_with_training_eval")),
    Mutation("loss_scale_unscales_gradients", "jaxnet/core/steps.py",
             "grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)", "grads = grads",
             ("tests/test_precision.py::test_fp16_finite_steps_update_and_grow_the_scale",), ci=True),
    Mutation("loss_scale_skips_non_finite_steps", "jaxnet/core/steps.py",
             "    params = select_tree(finite, params, state.params)\n", "",
             ("tests/test_precision.py::test_fp16_non_finite_step_is_skipped",), ci=True),
    Mutation("loss_scale_halves_on_overflow", "jaxnet/core/state.py",
             "jnp.maximum(self.scale / 2, 1.0)", "jnp.maximum(self.scale, 1.0)",
             ("tests/test_precision.py::test_loss_scale_update_rule",), ci=True),
    Mutation("loss_scale_checkpointed", "jaxnet/core/checkpoint.py",
             "STATE: ocp.args.StandardSave(state),",
             "STATE: ocp.args.StandardSave(state.replace(loss_scale=type(state.loss_scale).create())),",
             ("tests/test_precision.py::test_loss_scale_is_saved_in_checkpoints",), ci=True),

    # --- the three layers (pyproject.toml's import-linter contracts) ----------------
    Mutation("core_never_imports_the_shell", "jaxnet/core/train.py",
             "from jaxnet.core.state import TrainState\n",
             "from jaxnet.core.state import TrainState\nfrom jaxnet.cli import process  # noqa: F401\n",
             ("tests/test_layers.py::test_the_layering_contracts_hold",), ci=True),
    Mutation("tools_never_import_the_shell", "jaxnet/tools/onnx/__init__.py",
             "from jaxnet.core.errors import UserError\n",
             "from jaxnet.core.errors import UserError\nfrom jaxnet.cli import process  # noqa: F401\n",
             ("tests/test_layers.py::test_the_layering_contracts_hold",), ci=True),

    # --- data parallelism and batch norm -----------------------------------------
    Mutation("gradient_all_reduce", "jaxnet/core/sharding.py",
             "return NamedSharding(mesh, P(BATCH_AXES))", "return NamedSharding(mesh, P())",
             (PARALLEL + "test_compiled_step_all_reduces_gradients_and_stays_on_device",)),
    Mutation("bn_groups", "jaxnet/core/sharding.py",
             "return devices // bn_group_size", "return 1",
             (PARALLEL + "test_bn_group_size_validation",), ci=True),
    Mutation("bn_group_statistics_averaged", "jaxnet/core/models/batchnorm.py",
             "jnp.mean(var.reshape(groups, features), 0)", "var.reshape(groups, features)[0]",
             (PARALLEL + "test_bn_groups_of_four_devices",)),

    # --- FSDP --------------------------------------------------------------------
    Mutation("fsdp_splits_large_tensors", "jaxnet/core/sharding.py",
             'return P(*[FSDP_AXIS if a == axis else None for a in range(len(shape))])', "return P()",
             ("tests/test_fsdp.py::test_each_device_holds_an_eighth_of_the_params_and_optimizer_state",)),
    Mutation("fsdp_state_sharding_used", "jaxnet/core/experiment.py",
             "sharding.state_shardings(abstract_state, self.mesh, m.fsdp, m.fsdp_min_size)",
             "sharding.state_shardings(abstract_state, self.mesh, False, m.fsdp_min_size)",
             ("tests/test_fsdp.py::test_fsdp_on_eight_devices_trains_like_one_device",)),

    # --- optimizers --------------------------------------------------------------
    Mutation("weight_decay_mask", "jaxnet/core/optim.py",
             "optax.add_decayed_weights(wd, mask=_is_kernel)", "optax.add_decayed_weights(wd)",
             ("tests/test_optim.py::test_weight_decay_skips_bn_and_biases",), ci=True),
    Mutation("lars_trust_ratio_mask", "jaxnet/core/optim.py",
             "trust_ratio_mask=_is_kernel, ", "",
             ("tests/test_optim.py::test_lars_trust_ratio_scales_kernels_only",), ci=True),

    # --- input pipeline ----------------------------------------------------------
    Mutation("read_threads", "jaxnet/core/data/pipeline.py",
             "    if not self.read_threads:\n", "    if True:\n",
             ("tests/test_pipeline.py::test_read_threads_read_ahead_without_changing_the_batches",), ci=True),
    Mutation("train_batches_take_the_samplers_positions", "jaxnet/core/data/pipeline.py",
             "self.sampler[p * self._shard_count + self._shard_index]", "self.sampler[p]",
             ("tests/test_pipeline.py::test_batches_are_a_record_level_loaders",), ci=True),
    Mutation("batch_arrays_reused_only_when_free", "jaxnet/core/data/pipeline.py",
             "if sys.getrefcount(self._kept[i]) == 2 and", "if",
             ("tests/test_pipeline.py::test_batch_arrays_reuse_only_an_array_nothing_else_holds",), ci=True),
    Mutation("worker_segments_reused_only_when_unlinked", "jaxnet/core/adapters/grain.py",
             ".st_nlink == 1:", ".st_nlink >= 1:",
             ("tests/test_adapters.py::test_a_workers_kept_segment_is_handed_over_through_grains_protocol_and_reused_once_unlinked",),
             ci=True),
    Mutation("record_level_position_resumes_in_its_loader", "jaxnet/core/experiment.py",
             'whole_batches=self.data_elements == "batches")', "whole_batches=True)",
             ("tests/test_reliability.py::test_a_workdir_written_by_jaxnet_before_the_redesign_restores_and_resumes",)),
    Mutation("eval_sees_every_example", "jaxnet/core/data/pipeline.py",
             "grain.Batch(batch, drop_remainder=False)", "grain.Batch(batch, drop_remainder=True)",
             ("tests/test_pipeline.py::test_eval_covers_every_example_once",), ci=True),
    Mutation("corrupt_jpeg_masked", "jaxnet/core/data/transforms.py",
             'return _output(blank, element, ok=False)',
             'return _output(blank, element, ok=True)',
             ("tests/test_imagefolder.py::test_corrupt_files_are_masked_not_raised",), ci=True),

    # --- prediction and export ---------------------------------------------------
    # The workdir never loses or poisons its model (docs/reliability.md).
    Mutation("workdir_lock", "jaxnet/core/workdir.py",
             "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass",
             ("tests/test_reliability.py::test_second_run_on_a_held_workdir_exits_naming_the_holder",)),
    Mutation("checksums_verified_at_restore", "jaxnet/core/checkpoint.py",
             "    verify(state, saved, step, self.directory)\n", "    pass\n",
             ("tests/test_reliability.py::test_damaged_checkpoints_are_reported_and_skipped",)),
    Mutation("checksums_cover_every_bit", "jaxnet/core/checkpoint.py",
             "    h ^= words[start:start + h.size]\n", "",
             ("tests/test_reliability.py::test_checksums_detect_a_flipped_bit",), ci=True),
    Mutation("device_checksums_are_the_hosts", "jaxnet/core/checkpoint.py",
             "return jnp.sum(_fmix32(words ^ salt), dtype=jnp.uint32)",
             "return jnp.sum(_fmix32(words), dtype=jnp.uint32)",
             ("tests/test_reliability.py::test_checksums_on_the_host_are_the_devices_bit_for_bit",)),
    Mutation("non_finite_state_never_saved", "jaxnet/core/checkpoint.py",
             "    if not finite:\n      raise NonFiniteError(", "    if False:\n      raise NonFiniteError(",
             ("tests/test_reliability.py::test_non_finite_state_is_never_saved",)),
    Mutation("config_change_refused_on_resume", "jaxnet/core/workdir.py",
             "  if refused:\n", "  if False:\n",
             ("tests/test_reliability.py::test_resume_with_a_changed_config",)),
    Mutation("bad_values_refused", "jaxnet/core/config.py",
             "  if problems:\n    raise InvalidConfigError(", "  if False:\n    raise InvalidConfigError(",
             ("tests/test_reliability.py::test_bad_values_are_refused_before_anything_is_written",), ci=True),
    Mutation("head_never_narrower_than_the_data", "jaxnet/core/experiment.py",
             "  if model_num_classes < data_num_classes:\n", "  if False:\n",
             ("tests/test_train.py::test_model_num_classes_is_the_head_width_and_never_narrower_than_the_data",),
             ci=True),
    Mutation("export_with_the_family_names", "jaxnet/tools/weights/export.py",
             "  return pretrained.names_of(model, names).to_torch(flat)",
             "  return pretrained.names_of('resnet').to_torch(flat)",
             ("tests/test_alexnet_vit.py::test_export_writes_back_the_reference_state_dict",), ci=True),
    Mutation("timm_convnext_stage_names", "jaxnet/tools/weights/convnext_names.py",
             '    lambda stage: f"stages.{stage - 1}.downsample",', '    lambda stage: f"stages.{stage}.downsample",',
             ("tests/test_convnext_efficientnet.py::test_timm_names_are_timms_state_dict[convnext_tiny]",
              "tests/test_convnext_efficientnet.py::test_timm_named_weights_give_torchvisions_logits[convnext_mini]"),
             ci=True),
    Mutation("timm_efficientnet_block_names", "jaxnet/tools/weights/efficientnet_names.py",
             '"depthwise1": ("conv_dw", "bn2")', '"depthwise1": ("conv_dw", "bn1")',
             ("tests/test_convnext_efficientnet.py::test_timm_names_are_timms_state_dict[efficientnet_b0]",)),
    Mutation("weights_import_reads_the_files_naming", "jaxnet/tools/weights/pretrained.py",
             "  return max(read, key=lambda r: len(r[1]))", "  return read[0]",
             ("tests/test_convnext_efficientnet.py::test_timm_named_weights_give_torchvisions_logits[convnext_mini]",),
             ci=True),
    Mutation("weights_layout_way_back_derived", "jaxnet/tools/weights/torch_names.py",
             ".transpose(np.argsort(self.axes))", ".transpose(self.axes)",
             ("tests/test_alexnet_vit.py::test_weights_names_and_layouts_invert",
              "tests/test_weights.py::test_round_trip_gives_identical_tensors"), ci=True),
    Mutation("weights_misshapen_kernel_reported_in_jaxnet_layout", "jaxnet/tools/weights/torch_names.py",
             "return _kernel_axes_back(array) if path[-1] == \"kernel\" else array", "return array",
             ("tests/test_weights.py::test_unknown_and_misshapen_tensors_are_reported",), ci=True),
    Mutation("weights_bn_counter_written_and_skipped", "jaxnet/tools/weights/resnet_names.py",
             "  if not name.endswith(\".running_var\"):\n    return {}", "  return {}",
             ("tests/test_weights.py::test_round_trip_gives_identical_tensors",), ci=True),
    Mutation("weights_start_keeps_the_inits_head", "jaxnet/core/experiment.py",
             "      leaves[i] = value\n", "      leaves[i] = jnp.zeros_like(value)\n",
             ("tests/test_weights.py::test_an_imported_state_is_the_one_a_fine_tune_from_the_weights_starts_from",)),
    Mutation("eval_applies_recorded_preprocessing", "jaxnet/tools/weights/pretrained.py",
             "  return _with(config, _recorded(config, workdir))", "  return config",
             ("tests/test_finetune.py::test_eval_applies_the_record_and_never_reads_the_weights",), ci=True),
    Mutation("damaged_read_noise_dropped", "jaxnet/core/adapters/orbax.py",
             "          or str(exc).startswith(READ_ERROR))", "          or False)",
             ("tests/test_adapters.py::test_reported_failures_leave_no_orbax_tracebacks_behind",),
             ci=True),
    Mutation("failed_save_late_partials_removed", "jaxnet/core/checkpoint.py",
             "        remove_partials(self.directory, step, settle_sec=0.5)\n",
             "        pass\n",
             ("tests/test_reliability.py::test_a_failed_saves_late_writes_are_removed_at_close",),
             ci=True),
    Mutation("metrics_dropped_past_the_restored_step", "jaxnet/core/train.py",
             "  gate.drop_records_after(start_step)\n", "",
             ("tests/test_reliability.py::test_metrics_have_one_line_per_step_after_a_resume",)),
    Mutation("predict_eval_crop_fraction", "jaxnet/core/tasks/classification/__init__.py",
             "EvalDecodeCrop(size, config.data.eval_crop_fraction, config.data.eval_interpolation, warn=False)",
             "EvalDecodeCrop(size, 0.875, config.data.eval_interpolation, warn=False)",
             ("tests/test_preprocess.py::test_jpeg_file_is_preprocessed_like_the_eval_pipeline",), ci=True),
    Mutation("digits_record_whole_image_eval", "jaxnet/configs/digits.py",
             "  c.data.eval_crop_fraction = 1.0\n", "  c.data.eval_crop_fraction = 0.875\n",
             (TOOLS + "test_prediction_resizes_array_source_images_to_image_size",)),
    Mutation("restore_uses_ema", "jaxnet/tools/predictor.py",
             "use_ema=config.ema_decay > 0)", "use_ema=False)",
             (TOOLS + "test_restore_uses_the_ema_params_the_run_kept", TOOLS + "test_export_round_trips_logits")),
    Mutation("restore_step", "jaxnet/tools/predictor.py",
             "tree, step = ckpt.load_arrays(workdir, step)", "tree, step = ckpt.load_arrays(workdir)",
             (TOOLS + "test_predict_command_on_a_png", TOOLS + "test_export_round_trips_logits")),
    Mutation("predict_step", "jaxnet/cli/predict.py",
             "api.restore(args.workdir, step=args.step)", "api.restore(args.workdir)",
             (TOOLS + "test_predict_command_on_a_png",)),
    Mutation("predict_top", "jaxnet/cli/predict.py",
             "_predict_readable(model, images, args.top, args.min_score)",
             "_predict_readable(model, images, 5, args.min_score)",
             (TOOLS + "test_predict_command_on_a_png",)),
    Mutation("export_step", "jaxnet/cli/export.py",
             "api.restore(args.workdir, step=args.step)", "api.restore(args.workdir)",
             (TOOLS + "test_export_round_trips_logits",)),
    Mutation("export_platforms", "jaxnet/cli/export.py",
             'platforms = args.platforms.split(",") if args.platforms else None', "platforms = None",
             (TOOLS + "test_export_round_trips_logits",)),

    # --- ONNX export (docs/deploy.md) ----------------------------------------------
    Mutation("onnx_alexnet_adaptive_pool", "jaxnet/tools/onnx/alexnet.py",
             "  if side != POOL:", "  if side > POOL:",
             (ONNX + "test_onnxruntime_matches_fp32_eval[alexnet_mini]",), ci=True),
    Mutation("onnx_alexnet_fc1_rows_as_nchw", "jaxnet/tools/onnx/alexnet.py",
             ".transpose(2, 0, 1, 3)", ".transpose(0, 1, 2, 3)",
             (ONNX + "test_onnxruntime_matches_fp32_eval[alexnet_mini-bf16]",), ci=True),
    Mutation("onnx_alexnet_normalization_folded", "jaxnet/tools/onnx/alexnet.py",
             "kernel = kernel * scale[:, None]", "kernel = kernel",
             (ONNX + "test_onnxruntime_matches_fp32_eval[alexnet_mini]",), ci=True),
    Mutation("onnx_written_graphs_dynamic_batch", "jaxnet/tools/onnx/graph.py",
             '"images", TensorProto.UINT8, ["batch", size', '"images", TensorProto.UINT8, [11, size',
             (ONNX + "test_onnxruntime_matches_fp32_eval[vit_mini-plain]",), ci=True),
    Mutation("onnx_alexnet_convolutions_padded", "jaxnet/tools/onnx/alexnet.py",
             "pads=[pad] * 4)", "pads=[0] * 4)",
             (ONNX + "test_onnxruntime_matches_fp32_eval[alexnet_mini]",), ci=True),
    Mutation("onnx_batch_norm_folded_with_its_mean", "jaxnet/tools/onnx/resnet.py",
             'np.asarray(bn["bias"]) - np.asarray(running["mean"]) * s', 'np.asarray(bn["bias"])',
             (ONNX + "test_onnxruntime_matches_fp32_eval[resnet18]",), ci=True),
    Mutation("onnx_vit_attention_scaled", "jaxnet/tools/onnx/vit.py",
             "np.full(width, head_dim ** -0.5)", "np.ones(width)",
             (ONNX + "test_onnxruntime_matches_fp32_eval[vit_ti16]",)),
    Mutation("onnx_vit_normalization_folded", "jaxnet/tools/onnx/vit.py",
             '"patch_embed", kernel * scale[:, None], bias', '"patch_embed", kernel, bias',
             (ONNX + "test_onnxruntime_matches_fp32_eval[vit_mini-plain]",)),
    Mutation("onnx_detector_upsampling_floor", "jaxnet/tools/onnx/retinanet.py",
             'nearest_mode="floor")', 'nearest_mode="round_prefer_ceil")',
             (ONNX + "test_a_detectors_graph_gives_its_head_outputs_and_anchors[72]",)),
    # segmentation models (issue 55): torchvision's dilation rule, its bilinear sampling, ONNX's Resize
    Mutation("segmentation_dilated_stage_first_block", "jaxnet/core/models/resnet.py",
             "dilation=previous if b == 0 else dilation,", "dilation=dilation,",
             ("tests/test_segmentation_models.py::test_logits_equal_torchvision_and_export_writes_its_state_dict_back"
              "[fcn_resnet50]",)),
    Mutation("segmentation_bilinear_half_pixel", "jaxnet/core/models/segmentation.py",
             "scale * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5)",
             "scale * np.arange(out_size, dtype=np.float32)",
             ("tests/test_segmentation_models.py::test_bilinear_upsampling_is_torchs_interpolate",), ci=True),
    Mutation("onnx_segmentation_resize_half_pixel", "jaxnet/tools/onnx/segmentation.py",
             'coordinate_transformation_mode="half_pixel"', 'coordinate_transformation_mode="asymmetric"',
             (ONNX + "test_a_segmenters_graph_gives_per_pixel_logits[fcn_tiny-36-dilations0-True]",)),
    # the segmentation task (issue 55): torchvision's mean IoU, exact eval, the ignore label, mask and image together
    Mutation("segmentation_miou_nanmean", "jaxnet/core/tasks/segmentation/metrics.py",
             '"mean_iou": float(iou.mean())', '"mean_iou": float(np.nanmean(iou))',
             ("tests/test_segmentation.py::test_metrics_are_torchvisions_on_hand_checked_cases",), ci=True),
    Mutation("segmentation_padded_examples_counted", "jaxnet/core/tasks/segmentation/__init__.py",
             'valid = (labels != ignore) & (labels < num_classes) & batch["mask"][:, None, None]',
             'valid = (labels != ignore) & (labels < num_classes)',
             ("tests/test_segmentation.py::test_metrics_over_many_images_and_padding_equal_the_reference_over_them_all",),
             ci=True),
    Mutation("segmentation_ignore_label_trained", "jaxnet/core/tasks/segmentation/__init__.py",
             "valid = (labels != ignore_label) & (labels < num_classes)", "valid = (labels >= 0)",
             ("tests/test_segmentation.py::test_loss_is_torchvisions_pixel_mean_over_the_batch_plus_half_the_aux",),
             ci=True),
    Mutation("segmentation_padded_pixels_trained", "jaxnet/core/tasks/segmentation/__init__.py",
             "(labels < num_classes) & real[:, None, None]", "(labels < num_classes)",
             ("tests/test_segmentation.py::test_loss_is_torchvisions_pixel_mean_over_the_batch_plus_half_the_aux",)),
    Mutation("segmentation_loss_not_times_the_image_count", "jaxnet/core/tasks/segmentation/__init__.py",
             "per_pixel = jnp.sum(real.astype(jnp.float32)) / jnp.maximum", "per_pixel = 1.0 / jnp.maximum",
             ("tests/test_segmentation.py::test_loss_is_torchvisions_pixel_mean_over_the_batch_plus_half_the_aux",
              "tests/test_segmentation.py::test_train_steps_loss_is_the_pixel_mean_over_8_devices_and_per_micro_batch_"
              "with_accumulation")),
    Mutation("report_best_picks_nan", "jaxnet/tools/report.py",
             "numbers = np.flatnonzero(~np.isnan(evals.values))", "numbers = np.arange(len(evals.values))",
             (TOOLS + "test_report_summary_s_best_skips_evals_whose_metric_is_nan",), ci=True),
    Mutation("segmentation_flip_image_only", "jaxnet/core/tasks/segmentation/transforms.py",
             "image, labels = image[:, ::-1], labels[:, ::-1]", "image = image[:, ::-1]",
             ("tests/test_segmentation.py::test_train_transform_moves_the_mask_with_the_pixels_and_pads_with_the_ignore_label",),
             ci=True),
    Mutation("onnx_int8_layer_norm_fp32", "jaxnet/tools/onnx/int8.py",
             'if not first_layer_seen or node.op_type in ("LayerNormalization", "Resize"):',
             'if not first_layer_seen or node.op_type in ("Resize",):',
             (ONNX + "test_vit_int8_quantizes_its_matmuls_and_keeps_top1",)),
    Mutation("onnx_unconvertible_model_one_line", "jaxnet/tools/onnx/__init__.py",
             "  if module is None:", "  if False:",
             (ONNX + "test_unconvertible_model_and_missing_package_are_one_line",)),
    Mutation("onnx_missing_package_install_line", "jaxnet/tools/onnx/__init__.py",
             'f"installed: {ONNX_INSTALL}"', '"installed"',
             (ONNX + "test_unconvertible_model_and_missing_package_are_one_line",)),
    Mutation("onnx_preprocessing_metadata", "jaxnet/tools/onnx/__init__.py",
             "  onnx.helper.set_model_props(model, metadata(predictor))\n", "",
             (ONNX + "test_cli_fp32_matches_eval_with_ema_and_records_preprocessing",)),
    Mutation("written_atomically", "jaxnet/core/metrics.py",
             "    write(tmp)\n    os.replace(tmp, path)", "    write(path)",
             (ONNX + "test_a_failed_write_leaves_nothing_at_out",), ci=True),
    Mutation("onnx_int8_per_channel", "jaxnet/tools/onnx/int8.py",
             "per_channel=True", "per_channel=False",
             (ONNX + "test_int8_top1_within_one_point_of_fp32",)),
    Mutation("onnx_int8_qdq_format", "jaxnet/tools/onnx/int8.py",
             "quant_format=quantization.QuantFormat.QDQ", "quant_format=quantization.QuantFormat.QOperator",
             (ONNX + "test_int8_top1_within_one_point_of_fp32",)),
    Mutation("jax_int8_quantizes", "jaxnet/cli/export.py",
             "        predictor = export.qwix_quantize(predictor)\n", "",
             (ONNX + "test_jax_int8_export_computes_in_int8_within_one_point_of_fp32",)),
    Mutation("onnx_calibration_set_too_small", "jaxnet/tools/onnx/int8.py",
             "  if len(source) < num_images:\n", "  if False:\n",
             (ONNX + "test_bad_options_are_one_line_and_write_nothing",)),

    # --- benchmarks --------------------------------------------------------------
    Mutation("bench_train_fails_on_failed_cells", "experiments/bench_train.py",
             "  if failures:\n", "  if False:\n",
             (EXPERIMENTS + "test_bench_train_exits_non_zero_when_a_cell_fails",), ci=True),
    Mutation("bench_train_skipped_steps", "experiments/bench_train.py",
             "skipped_steps=int(state.loss_scale.skipped_steps)", "skipped_steps=0",
             (EXPERIMENTS + "test_bench_train_reports_the_skipped_fp16_steps",), ci=True),
    Mutation("bench_scaling_efficiency", "experiments/bench_scaling.py",
             "rate / (n * base)", "rate / base",
             (EXPERIMENTS + "test_bench_scaling_quick",)),
    Mutation("time_to_accuracy_rows_as_they_finish", "experiments/time_to_accuracy.py",
             'print("\\n" + TABLE_HEADER + "\\n" + table_row(result), flush=True)', "pass",
             (EXPERIMENTS + "test_time_to_accuracy_quick_reaches_both_targets",)),
    # --- reliability, third round (issue 27) --------------------------------------
    Mutation("config_json_restored_from_checkpoints", "jaxnet/core/workdir.py",
             "  step, config = newest_saved_config(workdir)\n", "  step, config = None, None\n",
             ("tests/test_reliability.py::test_a_deleted_config_json_is_restored_from_the_checkpoints",)),
    Mutation("invalid_config_json_named", "jaxnet/core/config.py",
             "  except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError\n    saved = e\n",
             "  except ValueError:\n    raise\n",
             ("tests/test_reliability.py::test_an_invalid_config_json_is_one_line_naming_it",)),
    Mutation("refused_run_leaves_no_workdir", "jaxnet/core/workdir.py",
             "    if set(os.listdir(workdir)) <= {LOCK_FILE}:\n", "    if False:\n",
             ("tests/test_reliability.py::test_a_refused_run_leaves_no_workdir_behind",), ci=True),
    Mutation("metrics_writer_starts_a_fresh_line", "jaxnet/core/metrics.py",
             "      _end_line(self._jsonl)\n", "",
             ("tests/test_reliability.py::test_a_torn_last_metrics_line_is_skipped_and_never_joined",)),
    Mutation("metrics_readers_skip_a_torn_line", "jaxnet/core/metrics.py",
             "      except ValueError:\n        record = None\n", "      except KeyError:\n        record = None\n",
             ("tests/test_reliability.py::test_a_torn_last_metrics_line_is_skipped_and_never_joined",)),
    Mutation("peer_watch_reports_a_silent_process", "jaxnet/cli/heartbeat.py",
             "and now - self._changed[p] > self.timeout_s]", "and False]",
             (PARALLEL + "test_peer_watch_names_the_process_that_stopped_answering",), ci=True),
    Mutation("peer_watch_ignores_a_process_that_is_done", "jaxnet/cli/heartbeat.py",
             "if p != self._me and self._values.get(p) != DONE", "if p != self._me",
             (PARALLEL + "test_peer_watch_names_the_process_that_stopped_answering",), ci=True),
    Mutation("jax_heartbeat_longer_than_jaxnets", "jaxnet/cli/heartbeat.py",
             "return max(2, int(2 * timeout_s))", "return max(2, int(timeout_s))",
             (PARALLEL + "test_initialize_distributed_modes",), ci=True),
    Mutation("full_disk_under_the_records_is_one_line", "jaxnet/core/train.py",
             "      raise e.stopped_at(control.step, control.checkpoint_sentence()) from None\n",
             "      raise\n",
             ("tests/test_reliability.py::test_a_full_disk_under_config_or_run_info_is_one_line",)),
    Mutation("second_sigterm_exits_at_once", "jaxnet/cli/process.py",
             "    if self.received == name:\n", "    if self.received == name == 'SIGINT':\n",
             ("tests/test_reliability.py::test_a_second_sigterm_exits_at_once",), ci=True),
    Mutation("a_close_failure_never_replaces_the_first_error", "jaxnet/core/train.py",
             "  if first is not None and not failing:\n", "  if first is not None:\n",
             ("tests/test_reliability.py::test_a_failed_save_is_the_error_reported_when_closing_fails_too",)),
    Mutation("library_installs_no_process_hooks", "jaxnet/core/checkpoint.py",
             "    self.workdir = os.path.abspath(workdir)\n",
             "    __import__('jaxnet.cli.process').cli.process.quiet_reported_failures()\n"
             "    self.workdir = os.path.abspath(workdir)\n",
             ("tests/test_reliability.py::test_the_library_leaves_the_process_hooks_loggers_and_warnings_alone",)),
    Mutation("only_jaxnet_errors_become_one_line", "jaxnet/cli/process.py",
             "  except (UserError, *also) as e:", "  except (UserError, ValueError, *also) as e:",
             ("tests/test_reliability.py::test_only_jaxnet_errors_become_one_line",), ci=True),
    Mutation("no_ema_no_second_copy", "jaxnet/core/steps.py",
             "      ema = None  # no EMA: no second copy of the params\n", "      ema = new_params\n",
             ("tests/test_ema.py::test_without_ema_the_state_holds_no_second_copy_of_the_params",), ci=True),
    Mutation("ema_dropped_when_restored_into_a_run_without", "jaxnet/core/state.py",
             "    return restored.replace(ema_params=None)\n", "    return restored\n",
             ("tests/test_ema.py::test_checkpoints_restore_across_ema_settings",), ci=True),
    # --- the GPU program (compiled on the CPU for H100s). The first needs the CUDA plugin
    # wheels in the interpreter itself (as .ci/run installs them; PYTHONPATH is dropped here):
    # without them its test skips and the mutation reads as survived.
    Mutation("nchw_transpose_in_resnet_block", "jaxnet/core/models/resnet.py",
             "    y = self.conv(self.filters * 4, (1, 1))(y)\n",
             "    y = self.conv(self.filters * 4, (1, 1))(y.transpose(0, 3, 1, 2).reshape(y.shape))\n",
             ("tests/test_gpu_plan.py::test_resnet50_bf16_on_8_h100s_is_cudnn_nhwc_without_activation_transposes",)),
    Mutation("fp16_max_pool_in_fp16", "jaxnet/core/models/__init__.py",
             "  if x.dtype == jnp.float16:\n", "  if False:\n",
             ("tests/test_gpu_plan.py::test_fp16_max_pool_gradient_stays_sharded_over_8_h100s",)),
    Mutation("scatter_free_pool_sums_overlapping_windows_out_of_order", "jaxnet/core/models/__init__.py",
             "  for p in reversed(placed):", "  for p in placed:",
             ("tests/test_models.py::test_scatter_free_max_pool_gradient_is_jax_s_own_bit_for_bit",)),
    Mutation("scatter_free_pool_breaks_ties_at_the_last_maximum", "jaxnet/core/models/__init__.py",
             "  for k in reversed(range(len(offsets) - 1)):", "  for k in range(len(offsets) - 1):",
             ("tests/test_models.py::test_scatter_free_max_pool_gradient_is_jax_s_own_bit_for_bit",)),
    Mutation("hlo_analysis_misses_transposes_in_fusions", "jaxnet/tools/hlo.py",
             '      if i.opcode in ("transpose", "copy"):\n', '      if False:\n',
             ("tests/test_gpu_plan.py::test_transposes_are_sized_against_weights_and_activations",), ci=True),
    # --- image folders: odd contents, odd pixels, shared memory (issue 27: 1, 4, 7) ----
    Mutation("hidden_folders_are_not_classes", "jaxnet/core/data/imagefolder.py",
             "    if entry.is_dir() and not is_hidden(entry.name):", "    if entry.is_dir():",
             (DATA + "test_hidden_entries_and_non_images_are_never_classes_or_examples",), ci=True),
    Mutation("hidden_files_are_not_examples", "jaxnet/core/data/imagefolder.py",
             "  return not is_hidden(name) and name.lower().endswith(IMAGE_EXTENSIONS)",
             "  return name.lower().endswith(IMAGE_EXTENSIONS)",
             (DATA + "test_hidden_entries_and_non_images_are_never_classes_or_examples",), ci=True),
    Mutation("ignored_files_are_listed", "jaxnet/core/data/imagefolder.py",
             "    else:\n      ignored.append(_shown(where, entry))", "    else:\n      pass",
             (DATA + "test_hidden_entries_and_non_images_are_never_classes_or_examples",), ci=True),
    Mutation("ignored_entries_are_said_by_training", "jaxnet/core/train.py",
             "  if is_chief and exp.data_note:\n    _REPORT.info(exp.data_note)\n",
             "  if is_chief and exp.data_note:\n    pass\n",
             (DATA + "test_the_command_line_says_what_it_ignored_in_one_line",)),
    Mutation("ignored_entries_are_said_by_eval", "jaxnet/core/train.py",
             "      if exp.process_index == 0 and exp.data_note:\n        _REPORT.info(exp.data_note)\n",
             "      if exp.process_index == 0 and exp.data_note:\n        pass\n",
             (DATA + "test_the_command_line_says_what_it_ignored_in_one_line",)),
    Mutation("empty_class_folder_refused", "jaxnet/core/data/imagefolder.py",
             "      if not files:\n", "      if False:\n",
             (DATA + "test_an_empty_class_folder_is_an_error_naming_it",)),
    Mutation("val_class_train_lacks_refused", "jaxnet/core/data/imagefolder.py",
             "    if unknown:\n", "    if False:\n",
             (DATA + "test_a_val_class_that_train_lacks_is_an_error_naming_it",)),
    Mutation("webp_is_an_image", "jaxnet/core/data/imagefolder.py",
             '(".jpg", ".jpeg", ".png", ".webp")', '(".jpg", ".jpeg", ".png")',
             (DATA + "test_webp_files_are_images",), ci=True),
    Mutation("sixteen_bit_scaled_in_the_decode", "jaxnet/core/data/decode.py",
             'np.asarray(to_8bit(image).convert("RGB"))', 'np.asarray(image.convert("RGB"))',
             (DATA + "test_16_bit_pngs_are_scaled_to_8_bits_not_clipped",), ci=True),
    Mutation("sixteen_bit_rounded_to_nearest", "jaxnet/core/data/bit_depth.py",
             "((values + 128) // 257)", "(values // 257)",
             (DATA + "test_16_bit_pngs_are_scaled_to_8_bits_not_clipped",), ci=True),
    Mutation("predict_names_a_folder", "jaxnet/tools/predictor.py",
             "  if os.path.isdir(path):\n", "  if False:\n",
             (DATA + "test_predict_says_a_folder_is_not_an_image_and_the_cli_predicts_its_images",), ci=True),
    Mutation("predict_cli_expands_folders", "jaxnet/cli/predict.py",
             "    if not os.path.isdir(path):\n", "    if True:\n",
             (DATA + "test_predict_says_a_folder_is_not_an_image_and_the_cli_predicts_its_images",), ci=True),
    Mutation("train_loader_closed_when_the_run_ends", "jaxnet/core/data/pipeline.py",
             "    grain_adapter.close_iterator(self.iterator, self._workers)\n\n  def __enter__", "\n  def __enter__",
             (DATA + "test_runs_with_workers_leave_no_shared_memory_behind",
              DATA + "test_a_stopped_run_frees_its_shared_memory")),
    Mutation("read_ahead_batches_dropped_on_the_way_out", "jaxnet/core/train.py",
             "      batch = None  # noqa: F841\n", "      pass\n",
             (DATA + "test_a_stopped_run_frees_its_shared_memory",)),
    Mutation("loader_cycles_collected", "jaxnet/core/adapters/grain.py",
             "  if workers:\n    gc.collect()\n", "",
             (DATA + "test_runs_with_workers_leave_no_shared_memory_behind",
              DATA + "test_a_stopped_run_frees_its_shared_memory")),
    Mutation("closing_waits_for_the_unlinks", "jaxnet/core/adapters/grain.py",
             "    wait_for_unlinks()\n", "",
             (DATA + "test_closing_a_loader_returns_once_its_segments_are_unlinked",)),
    Mutation("eval_loader_closed", "jaxnet/core/data/pipeline.py",
             "    grain_adapter.close_iterator(batches, workers)\n", "    pass\n",
             (DATA + "test_runs_with_workers_leave_no_shared_memory_behind",)),
    Mutation("read_ahead_batches_dropped_at_close", "jaxnet/core/data/pipeline.py",
             "    self._ahead.clear()\n    grain_adapter.close_iterator", "    grain_adapter.close_iterator",
             (DATA + "test_a_stopped_run_frees_its_shared_memory",)),
    Mutation("mixup_pairs_within_each_device", "jaxnet/core/tasks/classification/__init__.py",
             "    return _partner_in_groups(x, self.groups)\n", "    return jnp.roll(x, 1, axis=0)\n",
             ("tests/test_augment.py::test_mixup_on_eight_devices_moves_no_image_between_them",)),
    Mutation("grad_norm_in_one_reduction_is_the_norm", "jaxnet/core/steps.py",
             "  return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate([x.ravel() for x in leaves]))))",
             "  return jnp.sum(jnp.abs(jnp.concatenate([x.ravel() for x in leaves])))",
             ("tests/test_precision.py::test_global_norm_in_one_reduction_is_optaxs_norm",), ci=True),
    Mutation("exposed_collectives_counted", "jaxnet/tools/hlo.py",
             '      if i.opcode in ("fusion", "custom-call", "convolution", "dot"):\n        return True',
             '      if i.opcode in ("fusion", "custom-call", "convolution", "dot"):\n        return False',
             ("tests/test_gpu_plan.py::test_a_collective_is_exposed_unless_compute_is_scheduled_between_its_start_and_done",),
             ci=True),
    Mutation("fsdp_shards_are_weight_sized", "jaxnet/tools/gpu_plan.py",
             "      sizes.add(int(np.prod(x.sharding.shard_shape(x.shape))))\n", "      pass\n",
             ("tests/test_gpu_plan.py::test_fsdp_weight_shards_are_weight_sized_not_activations",), ci=True),
    Mutation("batch_search_counts_the_prefetched_batches", "jaxnet/tools/gpu_plan.py",
             "  return (step_bytes + config.data.prefetch * batch_bytes(config, per_gpu_batch, channels)",
             "  return (step_bytes + 0 * batch_bytes(config, per_gpu_batch, channels)",
             ("tests/test_gpu_plan.py::test_largest_batch_doubles_then_bisects",), ci=True),
    Mutation("dali_position_restored", "jaxnet/core/data/dali.py",
             '    self.pipe = self.loader.pipeline(base64.b64decode(saved["dali"]))\n', "    pass\n",
             ("tests/test_dali.py::test_dali_on_prepared_shards_resumes_exactly_and_shuffles_each_epoch",
              "tests/test_dali.py::test_a_resumed_dali_run_sees_the_batches_an_uninterrupted_one_sees")),
    # --- prepared shards: raw records, DALI over shards (issue 56) ----------------
    Mutation("dali_shards_new_order_each_epoch", "jaxnet/core/data/dali.py",
             "np.random.default_rng([self.seed, epoch])", "np.random.default_rng([self.seed, 0])",
             ("tests/test_dali.py::test_shard_samples_read_every_record_of_the_share_once_per_epoch",), ci=True),
    Mutation("prepare_stores_the_raw_fraction", "jaxnet/core/data/prepared.py",
             "  return (index * 2654435761 % 2**32) < raw_fraction * 2**32\n", "  return False\n",
             ("tests/test_prepare.py::test_raw_records_hold_the_bounded_pixels_and_both_transforms_take_them",),
             ci=True),
    Mutation("raw_record_cut_short_is_corrupt", "jaxnet/core/data/decode.py",
             "  if height * width > MAX_PIXELS or len(data) - header.end() < height * width * 3:",
             "  if height * width > MAX_PIXELS:",
             ("tests/test_prepare.py::test_raw_records_hold_the_bounded_pixels_and_both_transforms_take_them",),
             ci=True),
    # --- reliability, fourth round (issue 36) ------------------------------------
    Mutation("eval_refuses_config_changes", "jaxnet/core/workdir.py",
             "changes = check_config(self.path, config_dict, with_moves, changes_what_eval_sees)",
             "changes = check_config(self.path, config_dict, with_moves, lambda key: False)",
             ("tests/test_reliability.py::test_eval_refuses_a_config_that_changes_what_the_model_sees",)),
    Mutation("export_written_atomically", "jaxnet/tools/export.py",
             "  write_file_atomically(path, write_bytes)\n", "  write_bytes(path)\n",
             ("tests/test_reliability.py::test_exports_are_written_whole_or_not_at_all",)),
    Mutation("rotated_checkpoint_read_again", "jaxnet/core/checkpoint.py",
             "        if step is None and attempt < _LISTING_TRIES - 1:\n", "        if False:\n",
             ("tests/test_reliability.py::test_a_checkpoint_rotated_away_while_it_is_read_is_not_damaged",),
             ci=True),
    # --- detection (issue 32) ------------------------------------------------------
    Mutation("nms_per_class", "jaxnet/core/tasks/detection/__init__.py",
             "  shifted = boxes + ((jnp.max(boxes) + 1) * labels.astype(boxes.dtype))[:, None]\n",
             "  shifted = boxes\n",
             (DETECTION + "test_nms_keeps_what_greedy_nms_keeps",), ci=True),
    Mutation("detection_low_quality_matches", "jaxnet/core/tasks/detection/__init__.py",
             "  return jnp.where(low_quality, best_box, matches)\n", "  return matches\n",
             (DETECTION + "test_matching_thresholds_and_best_anchor_of_each_box",), ci=True),
    Mutation("detection_ignored_anchors_out_of_the_loss", "jaxnet/core/tasks/detection/__init__.py",
             "  cls = jnp.sum(focal * valid[:, None]) / count\n", "  cls = jnp.sum(focal) / count\n",
             (DETECTION + "test_focal_and_box_losses_follow_their_formulas",), ci=True),
    Mutation("detection_boxes_move_with_flip", "jaxnet/core/tasks/detection/coco.py",
             "      boxes = np.stack([size - boxes[:, 2], boxes[:, 1], size - boxes[:, 0], boxes[:, 3]], axis=1)\n",
             "      pass\n", (DETECTION + "test_transform_moves_boxes_with_the_pixels",), ci=True),
    Mutation("detection_boxes_in_source_pixels", "jaxnet/core/tasks/detection/coco.py",
             "  return np.clip(np.asarray(boxes) / scale, 0, [width, height, width, height])",
             "  return np.asarray(boxes)",
             (DETECTION + "test_transform_moves_boxes_with_the_pixels",), ci=True),
    Mutation("retinanet_p7_from_relu_p6", "jaxnet/core/models/retinanet.py",
             'name="p7")(nn.relu(p6))', 'name="p7")(p6)',
             (DETECTION + "test_torchvision_retinanet_weights_give_torchvisions_outputs",)),
    Mutation("retinanet_anchor_ratio_order", "jaxnet/core/models/retinanet.py",
             "    ws = (w_ratios[:, None] * scales[None, :]).reshape(-1)\n",
             "    ws = (w_ratios[None, :] * scales[:, None]).reshape(-1)\n",
             (DETECTION + "test_anchors_are_torchvisions",), ci=True),
    Mutation("crowd_boxes_left_out", "jaxnet/core/tasks/detection/coco.py",
             "        if a.get(\"iscrowd\", 0):\n", "        if False:\n",
             (DETECTION + "test_coco_source_counts_what_it_changes_and_refuses_unknown_categories",), ci=True),
    Mutation("tfds_detection_boxes_as_x_y", "jaxnet/core/tasks/detection/coco.py",
             "pixels = boxes[:, [1, 0, 3, 2]] * np.array", "pixels = boxes * np.array",
             (DETECTION + "test_a_tfds_detection_dataset_gives_the_coco_folders_records_and_trains",)),
    Mutation("detector_restored_by_model_task", "jaxnet/tools/predictor.py",
             "self.task = tasks.for_model(config.model.name)",
             'self.task = tasks.get("detection" if config.data.source == "coco" else "classification")',
             (DETECTION + "test_a_tfds_detection_dataset_gives_the_coco_folders_records_and_trains",)),
    Mutation("detector_class_layer_reinitialised", "jaxnet/tools/weights/retinanet_names.py",
             'class_layer=("cls_logits", 9)', 'class_layer=("head", 1)',
             (DETECTION + "test_a_detectors_weights_of_another_class_count_fine_tune_with_a_fresh_class_layer",)),
    # --- tasks as plug-ins, the workdir's gate (issue 41) ------------------------------
    Mutation("a_task_branch_outside_the_tasks", "jaxnet/tools/predictor.py",
             "self.task = tasks.for_model(config.model.name)",
             'self.task = tasks.get("detection" if models.task(config.model.name) == "detection" else "classification")',
             ("tests/test_layers.py::test_no_file_outside_the_tasks_branches_on_the_task",), ci=True),
    Mutation("a_task_decided_by_its_metric_outside_the_tasks", "jaxnet/tools/report.py",
             "  task = tasks.for_records(records)\n",
             "  task = tasks.all_tasks()[1 if any(\"eval/mAP\" in r for r in records) else 0]\n",
             ("tests/test_layers.py::test_no_file_outside_the_tasks_branches_on_the_task",), ci=True),
    Mutation("a_model_family_named_outside_the_model_files", "jaxnet/tools/gpu_plan.py",
             'if models.declared(config.model.name, "ATTENTION") else ""', 'if "vit" in config.model.name else ""',
             ("tests/test_layers.py::test_no_file_outside_the_tasks_branches_on_the_task",), ci=True),
    Mutation("the_data_never_imports_a_tasks_module", "jaxnet/core/data/sources.py",
             "import hashlib\n", "import hashlib\nfrom jaxnet.core.tasks.detection import coco  # noqa: F401\n",
             ("tests/test_layers.py::test_the_layering_contracts_hold",), ci=True),
    Mutation("predict_draw_refused_before_predicting", "jaxnet/cli/predict.py",
             "      model.task.check_draw()\n", "      pass\n",
             (TOOLS + "test_predict_draw_of_a_model_that_does_not_draw_is_refused_before_predicting",), ci=True),
    Mutation("a_tasks_data_sources_checked", "jaxnet/core/tasks/__init__.py",
             "    if self.sources and source not in self.sources:\n", "    if False:\n",
             ("tests/test_task_plugin.py::test_a_task_refuses_the_data_it_does_not_read_naming_the_tasks_that_do",),
             ci=True),
    Mutation("carried_integers_as_int32", "jaxnet/core/data/transforms.py",
             "  return {k: np.int32(v) if isinstance(v, (int, np.integer))", "  return {k: v if isinstance(v, (int, np.integer))",
             ("tests/test_transforms.py::test_train_output_contract",), ci=True),
    Mutation("a_workdir_writer_beside_the_gate", "jaxnet/core/train.py",
             "  writer = gate.metric_writer()\n", "  writer = metrics_lib.MetricWriter(workdir)\n",
             ("tests/test_layers.py::test_only_the_workdir_gate_writes_a_workdirs_files",), ci=True),
    Mutation("import_takes_the_workdirs_lock", "jaxnet/core/workdir.py",
             "          gate._lock(stack)\n", "          pass\n",
             ("tests/test_finetune.py::test_a_weights_import_into_a_held_workdir_is_refused_and_writes_nothing",
              "tests/test_tools.py::test_an_eval_goes_through_the_workdirs_gate"), ci=True),
    Mutation("eval_checks_its_data_dir", "jaxnet/core/workdir.py",
             '"data.name", "data.dir",', '"data.name",',
             (DETECTION + "test_a_detection_workdir_written_by_an_earlier_jaxnet_evaluates_resumes_and_predicts",)),
    Mutation("eval_checks_the_detection_keys", "jaxnet/core/tasks/detection/__init__.py",
             'eval_keys=("detection.",),', 'eval_keys=(),',
             (DETECTION + "test_a_small_detector_learns_scores_every_val_image_once_and_predicts_as_the_api_does",)),
    Mutation("api_predict_on_a_detector", "jaxnet/core/tasks/detection/__init__.py",
             "  def postprocess(self, outputs, examples, class_names, min_score: float = 0.3, **unused)",
             "  def _postprocess(self, outputs, examples, class_names, min_score: float = 0.3, **unused)",
             (DETECTION + "test_a_small_detector_learns_scores_every_val_image_once_and_predicts_as_the_api_does",)),
    Mutation("the_core_prints", "jaxnet/core/metrics.py",
             "    _REPORT.info(f\"step {step:>7}", "    print(f\"step {step:>7}",
             ("tests/test_layers.py::test_the_core_reports_and_the_shell_prints",), ci=True),
    # --- issue 46: malformed COCO files, unreadable sets, imports, preprocessing, one-line errors ---
    Mutation("coco_bbox_of_four_numbers_checked", "jaxnet/core/tasks/detection/coco.py",
             "    if (not isinstance(box, list) or len(box) != 4\n",
             "    if (not isinstance(box, list) or len(box) < 3\n",
             (DATA + "test_malformed_coco_annotations_are_one_line_naming_the_file_and_entry",), ci=True),
    Mutation("coco_annotations_not_json_named", "jaxnet/core/tasks/detection/coco.py",
             "  except ValueError as e:  # not JSON, not UTF-8\n", "  except KeyError as e:  # not JSON, not UTF-8\n",
             (DATA + "test_malformed_coco_annotations_are_one_line_naming_the_file_and_entry",), ci=True),
    Mutation("coco_all_images_missing_refused", "jaxnet/core/tasks/detection/coco.py",
             "    if images and len(missing) == len(images):\n", "    if False:\n",
             (DATA + "test_a_coco_folder_whose_train_images_are_all_missing_stops_before_its_first_step",)),
    Mutation("coco_boxes_clipped_to_the_files_size", "jaxnet/core/tasks/detection/coco.py",
             "      if size and size != (width, height):\n", "      if False:\n",
             (DATA + "test_coco_sizes_that_differ_from_the_file_and_missing_images_are_counted_and_named",), ci=True),
    Mutation("missing_image_said_not_found", "jaxnet/core/data/decode.py",
             '    return {"image": b"", "read_error": "not found"}\n', '    return {"image": b""}\n',
             (DATA + "test_an_image_folder_file_gone_since_listing_is_named_not_found",
              DATA + "test_coco_sizes_that_differ_from_the_file_and_missing_images_are_counted_and_named"), ci=True),
    Mutation("no_readable_example_stops_before_step_1", "jaxnet/core/data/pipeline.py",
             '  check_some_example_reads(source, "train")\n', "",
             (DATA + "test_an_image_folder_with_no_readable_image_stops_before_its_first_step",)),
    Mutation("no_readable_eval_example_stops_before_step_1", "jaxnet/core/experiment.py",
             '    pipeline.check_some_example_reads(self.eval_source, "eval")\n', "",
             (DATA + "test_an_image_folder_with_no_readable_image_stops_before_its_first_step",)),
    Mutation("truncated_pth_is_one_line", "jaxnet/tools/weights/tensor_files.py",
             "  except (RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError, OSError) as e:",
             "  except pickle.UnpicklingError as e:",
             ("tests/test_weights.py::test_a_truncated_pth_is_one_line_naming_the_file",)),
    Mutation("import_counts_the_arrays_it_loaded", "jaxnet/tools/weights/pretrained.py",
             "    loaded.update(arrays=len(values), of=len(target), head=reason,",
             "    loaded.update(arrays=len(target), of=len(target), head=reason,",
             ("tests/test_weights.py::test_an_import_with_another_class_count_says_how_many_arrays_came_from_the_weights",)),
    Mutation("import_of_another_architecture_one_line", "jaxnet/tools/weights/pretrained.py",
             "    except WeightsMismatchError as e:  # the import and init.weights in training: one line\n"
             "      raise InvalidValueError(_another_architecture(spec, config, str(e), e.hint)) from None\n",
             "    except WeightsMismatchError as e:  # the import and init.weights in training: one line\n"
             "      raise\n",
             ("tests/test_weights.py::test_an_import_of_another_architecture_is_one_line_naming_both_and_leaves_nothing",)),
    Mutation("failed_import_leaves_nothing", "jaxnet/tools/weights/pretrained.py",
             "    if not existed:\n      shutil.rmtree(workdir, ignore_errors=True)\n",
             "    if False:\n      shutil.rmtree(workdir, ignore_errors=True)\n",
             ("tests/test_weights.py::test_an_import_of_another_architecture_is_one_line_naming_both_and_leaves_nothing",)),
    # An import without data (--no-data): a checkpoint without a data position, the weights' head.
    Mutation("import_without_data_restores_a_position", "jaxnet/core/checkpoint.py",
             '    if iterator is not None and saved.get("data_position", True) is False:\n',
             '    if False:\n',
             ("tests/test_weights.py::test_a_fine_tune_of_an_import_without_data_starts_its_data_afresh_and_records_the_names",)),
    Mutation("import_without_data_head_from_the_recipe", "jaxnet/tools/weights/pretrained.py",
             "                      classes_without_data=config.model.num_classes or classes_of(spec, config))",
             "                      classes_without_data=config.model.num_classes or 1000)",
             ("tests/test_weights.py::test_an_import_without_data_predicts_by_index_exports_and_its_eval_names_the_data",)),
    Mutation("imported_head_of_other_classes_unchecked", "jaxnet/core/train.py",
             "  if imported == exp.num_classes:\n    return\n",
             "  return\n",
             ("tests/test_weights.py::test_a_fine_tune_of_an_import_without_data_starts_its_data_afresh_and_records_the_names",)),
    Mutation("eval_without_data_the_sources_message", "jaxnet/core/train.py",
             "    if ckpt.holds_data_position(workdir, step):\n      raise\n",
             "    raise\n",
             ("tests/test_weights.py::test_an_import_without_data_predicts_by_index_exports_and_its_eval_names_the_data",)),
    Mutation("truncated_safetensors_named", "jaxnet/tools/weights/tensor_files.py",
             "      return dict(f.metadata() or {})\n  except (SafetensorError, OSError) as e:\n",
             "      return dict(f.metadata() or {})\n  except KeyError as e:\n",
             ("tests/test_weights.py::test_a_truncated_or_empty_safetensors_is_one_line_naming_the_file",), ci=True),
    Mutation("one_eval_preprocessing_whatever_the_source", "jaxnet/core/tasks/classification/__init__.py",
             "    size = config.image_size\n",
             "    size = config.image_size\n    if config.data.source == \"synthetic\":\n"
             "      import io\n      return {\"image\": np.asarray(Image.open(io.BytesIO(data)).convert(\"RGB\")"
             ".resize((size, size), Image.BILINEAR)), \"mask\": True}\n",
             ("tests/test_preprocess.py::test_predict_eval_export_metadata_and_calibration_see_the_same_pixels",), ci=True),
    Mutation("predict_names_the_unreadable_file", "jaxnet/core/tasks/classification/__init__.py",
             "config.data.eval_interpolation, warn=False)", "config.data.eval_interpolation)",
             (DATA + "test_predicts_unreadable_image_error_names_the_file_and_why",), ci=True),
    Mutation("detector_predict_names_the_unreadable_file", "jaxnet/core/tasks/detection/__init__.py",
             "    transform = coco.DetectionTransform(config.image_size, 1, train=False, warn=False)\n",
             "    transform = coco.DetectionTransform(config.image_size, 1, train=False)\n",
             (DATA + "test_predicts_unreadable_image_error_names_the_file_and_why",), ci=True),
    Mutation("install_plugin_replaces_a_mismatched_folder", "jaxnet/cli/gpu_plan.py",
             "  if install and not gpu_plan.folder_matches(folder):\n",
             "  if install and not os.path.isdir(folder):\n",
             ("tests/test_gpu_plan.py::test_install_plugin_replaces_a_folder_of_another_jaxlibs_plugin",), ci=True),
    Mutation("torch_export_full_disk_one_line", "jaxnet/tools/weights/tensor_files.py",
             '  def write(tmp):\n    with open(tmp, "wb") as f:\n      f.write(data)\n',
             "  def write(tmp):\n    from safetensors.numpy import save_file\n    save_file(arrays, tmp, metadata=metadata)\n",
             ("tests/test_reliability.py::test_a_torch_export_onto_a_full_disk_is_one_line_and_keeps_the_old_file",)),
    Mutation("half_deleted_newest_is_rotated_not_damaged", "jaxnet/core/checkpoint.py",
             "    return any(s > step and os.path.isdir(os.path.join(self.directory, str(s), CHECKSUMS))\n",
             "    return False and any(s > step and os.path.isdir(os.path.join(self.directory, str(s), CHECKSUMS))\n",
             ("tests/test_reliability.py::test_a_checkpoint_whose_deletion_is_under_way_is_rotated_not_damaged",)),
    Mutation("listing_racing_rotation_lists_again", "jaxnet/core/checkpoint.py",
             "      except FileNotFoundError:\n        if attempt == _LISTING_TRIES - 1:\n",
             "      except KeyError:\n        if attempt == _LISTING_TRIES - 1:\n",
             ("tests/test_reliability.py::test_a_checkpoint_whose_deletion_is_under_way_is_rotated_not_damaged",)),
    Mutation("dali_names_the_file_it_cannot_decode", "jaxnet/core/data/dali.py",
             "    culprit = unreadable_file(files)\n", "    culprit = None\n",
             ("tests/test_dali.py::test_a_file_dali_cannot_decode_is_one_line_naming_it",), ci=True),
    Mutation("int8_calibration_refuses_random_pixels", "jaxnet/tools/onnx/int8.py",
             '  if config.data.source == "synthetic":\n    # Random pixels', '  if False:\n    # Random pixels',
             ("tests/test_preprocess.py::test_int8_calibration_refuses_random_pixels_of_a_synthetic_workdir",), ci=True),
    Mutation("data_position_names_the_loader", "jaxnet/core/checkpoint.py",
             "Resume with the same data.loader (grain or \"", "Resume with the same (\"",
             ("tests/test_reliability.py::test_a_data_position_of_another_loader_names_data_loader",)),
    # --- cluster launch files and the H100 profile (issue 44) ----------------------------
    Mutation("cluster_profile_overrides_the_user", "jaxnet/cli/process.py",
             "    os.environ.setdefault(key, value)\n", "    os.environ[key] = value\n",
             (LAUNCH + "test_cluster_profile_sets_its_flags_and_variables_unless_the_user_did",), ci=True),
    Mutation("cluster_profile_duplicates_default_flags", "jaxnet/core/adapters/xla.py",
             "[f for f in GPU_XLA_FLAGS if flag_name(f) not in named]", "list(GPU_XLA_FLAGS)",
             (LAUNCH + "test_cluster_profile_sets_its_flags_and_variables_unless_the_user_did",), ci=True),
    Mutation("gpu_plan_ignores_the_profile", "jaxnet/tools/gpu_plan.py",
             "  for flag in xla.profile_flags(profile):\n", "  for flag in xla.profile_flags(\"\"):\n",
             (LAUNCH + "test_this_xla_knows_every_flag_of_the_profile",), ci=True),
    Mutation("job_hosts_disagree", "launch/k8s/job.yaml",
             "  completions: 2                   # hosts\n", "  completions: 3                   # hosts\n",
             (LAUNCH + "test_manifest_parameters_agree",), ci=True),
    Mutation("nms_pads_fewer_candidates", "jaxnet/core/tasks/detection/__init__.py",
             "  if scores.shape[0] < max_detections:\n", "  if False:\n",
             (DETECTION + "test_nms_keeps_what_greedy_nms_keeps",), ci=True),
    Mutation("damaged_checkpoint_is_not_rotated", "jaxnet/core/checkpoint.py",
             "    if all(os.path.exists(os.path.join(step_dir, item)) for item in (STATE, CHECKSUMS)):\n      return False\n",
             "",
             ("tests/test_reliability.py::test_damaged_checkpoints_are_reported_and_skipped",)),
    # --- reproducibility (docs/reproducibility.md) ------------------------------------------
    Mutation("checkpoint_read_onto_the_saving_devices", "jaxnet/core/checkpoint.py",
             "    tree, checksums = checkpoints.read(step, _on_one_device(checkpoints.saved_tree(step)))\n",
             "    tree, checksums = checkpoints.read(step)\n",
             (TOOLS + "test_a_bundle_of_an_eight_device_run_evaluates_to_its_numbers_on_one_device",)),
    Mutation("data_identity_on_every_process", "jaxnet/core/workdir.py",
             "    self.data_identity = provenance.data_identity(sources, kind, recorded) if self.chief else None\n",
             "    self.data_identity = provenance.data_identity(sources, kind, recorded)\n",
             (TOOLS + "test_only_process_0_computes_the_data_identity_and_its_refusal_stops_every_process",), ci=True),
    Mutation("data_refused_on_process_0_only", "jaxnet/core/workdir.py",
             "    self._refuse_on_every_process(refused)\n",
             "    if refused:\n      raise refused\n",
             (TOOLS + "test_only_process_0_computes_the_data_identity_and_its_refusal_stops_every_process",), ci=True),
    Mutation("resume_overwrites_the_previous_start", "jaxnet/core/train.py",
             "  gate.keep_previous_start()  # before this start's records replace the previous start's\n", "",
             (TOOLS + "test_a_resume_keeps_the_previous_start_s_records",)),
    Mutation("init_weights_sha256_not_compared", "jaxnet/tools/weights/pretrained.py",
             "  if now != recorded:\n", "  if False:\n",
             (TOOLS + "test_retrain_of_a_run_from_init_weights_refuses_a_missing_or_other_weights_file",)),
    Mutation("retrain_does_not_check_the_init_weights", "jaxnet/tools/verify.py",
             "  if retrain and config.init.weights:", "  if False:",
             (TOOLS + "test_retrain_of_a_run_from_init_weights_refuses_a_missing_or_other_weights_file",)),
    Mutation("retrain_starts_from_random_init", "jaxnet/tools/verify.py",
             "      init_params = pretrained.initialiser(config)\n", "      init_params = None\n",
             (TOOLS + "test_verify_retrain_of_a_run_from_init_weights_starts_from_them",)),
    Mutation("verify_skips_the_records_sha256", "jaxnet/tools/verify.py",
             "    checks += record_checks(workdir, environment)\n", "",
             (TOOLS + "test_verify_finds_each_record_edited_deleted_or_unreadable_and_names_a_held_workdir",)),
    Mutation("verify_trusts_config_json", "jaxnet/tools/verify.py",
             "  checks += config_checks(workdir, kept)\n", "",
             (TOOLS + "test_verify_finds_each_record_edited_deleted_or_unreadable_and_names_a_held_workdir",)),
    Mutation("verify_misses_a_deleted_final_checkpoint", "jaxnet/tools/verify.py",
             "    checks += final_checkpoint_checks(records[\"metrics\"], kept)\n", "    pass\n",
             (TOOLS + "test_verify_finds_each_record_edited_deleted_or_unreadable_and_names_a_held_workdir",)),
    Mutation("bundle_takes_unlisted_files", "jaxnet/tools/bundle.py",
             "  if unlisted:\n", "  if False:\n",
             (TOOLS + "test_a_bundle_is_exactly_its_manifest_and_nothing_writes_into_it",)),
    Mutation("bundle_without_manifest_is_a_workdir", "jaxnet/tools/bundle.py",
             "  return any(os.path.isfile(os.path.join(path, name)) for name in (MANIFEST, CARD))\n",
             "  return os.path.isfile(os.path.join(path, MANIFEST))\n",
             (TOOLS + "test_a_bundle_is_exactly_its_manifest_and_nothing_writes_into_it",)),
    Mutation("data_identity_rewritten_when_missing", "jaxnet/core/workdir.py",
             "        if problem:  # never rewritten from this data unasked: it is what the data is checked against\n",
             "        if False:\n",
             ("tests/test_reliability.py::test_a_missing_or_unreadable_data_identity_is_refused_never_rewritten_from_this_data",)),
    Mutation("eval_holds_the_lock_while_it_reads", "jaxnet/core/workdir.py",
             "        if purpose != EVAL:\n          gate._lock(stack)\n", "        gate._lock(stack)\n",
             ("tests/test_reliability.py::test_an_eval_takes_no_lock_while_it_reads_and_records_only_where_no_training_holds_the_workdir",)),
    Mutation("other_init_weights_noted_as_the_same", "jaxnet/tools/verify.py",
             '  if now == record["sha256"]:\n', "  if now:\n",
             (TOOLS + "test_verify_notes_the_init_weights_file_and_only_warns_where_it_changed",)),
]


def check_texts(mutations, root: str) -> list[str]:
  """Errors for mutations whose text is not in their file exactly once, or that name no test."""
  errors = []
  for m in mutations:
    try:
      with open(os.path.join(root, m.path)) as f:
        count = f.read().count(m.old)
    except FileNotFoundError:
      count = None
    if count != 1:
      found = "file missing" if count is None else f"found {count} times"
      errors.append(f"{m.name}: its text is not in {m.path} exactly once ({found}); update the mutation")
    if not m.tests:
      errors.append(f"{m.name}: names no test")
  return errors


def _ignore(directory, names):
  skip = {".git", ".pytest_cache", "__pycache__", ".ci-venv", ".venv", "build", "workdirs", ".whl",
          ".gl", "jaxnet-report", "jaxnet-src", "gpu-results"}
  return [n for n in names if n in skip or n.endswith(".egg-info")]


def make_copy() -> str:
  """The repository (built C extension included) in a fresh directory, as a new git repository,
  so that what records the git revision sees one."""
  root = os.path.join(tempfile.mkdtemp(prefix="jaxnet-mutations-"), "repo")
  shutil.copytree(REPO, root, ignore=_ignore)
  git = ["git", "-c", "user.name=mutations", "-c", "user.email=mutations@localhost"]
  for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
    subprocess.run(git + cmd, cwd=root, check=True, capture_output=True)
  return root


def _env() -> dict:
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # no stale .pyc between mutations
  env.pop("PYTHONPATH", None)
  return env


def run_tests(root: str, tests, timeout: float) -> tuple[int | None, str]:
  """(pytest's exit status or None on timeout, the tail of its output)."""
  # -n 0: a mutation's few tests in one process, without pytest-xdist's workers to start;
  # -m "": the named tests whatever their marks (slow ones included).
  cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-m", "", "-p", "no:cacheprovider", *tests]
  try:
    proc = subprocess.run(cmd, cwd=root, env=_env(), capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return None, out[-1500:]
  return proc.returncode, (proc.stdout + proc.stderr)[-1500:]


def run_mutation(root: str, m: Mutation, timeout: float) -> tuple[str, float, str]:
  """(verdict, seconds, pytest's one-line reason or its output's tail) of mutation `m` applied
  alone in the copy `root`, its file put back after."""
  path = os.path.join(root, m.path)
  with open(path) as f:
    original = f.read()
  with open(path, "w") as f:
    f.write(original.replace(m.old, m.new, 1))
  t0 = time.perf_counter()
  try:
    status, tail = run_tests(root, m.tests, timeout)
  finally:
    with open(path, "w") as f:
      f.write(original)
  seconds = time.perf_counter() - t0
  reason = next((line for line in tail.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
  if status == 0:
    return "SURVIVED", seconds, ""
  if status in (1, 2):   # a test failed, or the mutated code broke collection
    return "killed", seconds, reason
  if status is None:
    return "killed (timed out)", seconds, ""
  # 3-5: pytest's own error, a node id that does not exist, no tests
  return f"ERROR (pytest exit {status})", seconds, f"pytest exit {status}:\n{tail}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("names", nargs="*", help="run only these mutations")
  parser.add_argument("--ci", action="store_true", help="only the quick subset")
  parser.add_argument("--list", action="store_true", help="print the mutations and exit")
  parser.add_argument("--no-baseline", action="store_true",
                      help="skip the unmutated run of the tests (when they were just run)")
  parser.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
  parser.add_argument("--jobs", type=int, default=1, help="mutations run at a time, each in its own copy")
  args = parser.parse_args(argv)

  selected = [m for m in MUTATIONS if (not args.names or m.name in args.names) and (m.ci or not args.ci)]
  unknown = set(args.names) - {m.name for m in MUTATIONS}
  if unknown:
    parser.error(f"no mutation named {', '.join(sorted(unknown))}; see --list")
  if args.list:
    for m in selected:
      print(f"{m.name}{' [ci]' if m.ci else ''}: {m.path}\n  " + "\n  ".join(m.tests))
    print(f"{len(selected)} mutations, {sum(m.ci for m in selected)} of them in the --ci subset")
    return 0

  errors = check_texts(selected, REPO)
  runnable = [m for m in selected if not any(e.startswith(m.name + ":") for e in errors)]
  roots = [make_copy() for _ in range(max(1, min(args.jobs, len(runnable))))]
  start = time.perf_counter()
  survived, killed = [], []
  try:
    # The mutated code must be what the tests import, not an installed jaxnet.
    where = subprocess.run([sys.executable, "-c", "import jaxnet; print(jaxnet.__file__)"], cwd=roots[0],
                           env=_env(), capture_output=True, text=True).stdout.strip()
    if not where.startswith(roots[0]):
      print(f"mutations: `import jaxnet` in the copy finds {where!r}, not the copy; stopping")
      return 1
    tests = sorted({t for m in runnable for t in m.tests})
    if not args.no_baseline:
      print(f"baseline: {len(tests)} tests, unmutated ...", flush=True)
      status, tail = run_tests(roots[0], tests, args.timeout * 2)
      if status != 0:
        print(f"the tests fail without any mutation (pytest exit {status}); fix them first:\n{tail}")
        return 1
      print(f"baseline passed in {time.perf_counter() - start:.0f} s", flush=True)
    # Each job takes the next mutation and runs it in its own copy.
    pending = queue.SimpleQueue()
    for m in runnable:
      pending.put(m)
    lock = threading.Lock()

    def job(root):
      while True:
        try:
          m = pending.get_nowait()
        except queue.Empty:
          return
        verdict, seconds, detail = run_mutation(root, m, args.timeout)
        with lock:
          (survived if verdict == "SURVIVED" else killed if verdict.startswith("killed") else []).append(m.name)
          if verdict.startswith("ERROR"):
            errors.append(f"{m.name}: {detail}")
          print(f"{m.name:42s} {verdict:20s} {seconds:6.0f} s", flush=True)
          if verdict == "SURVIVED":
            print("  survived: " + ", ".join(m.tests), flush=True)
          elif detail:  # how it was killed: pytest's one-line reason
            print("  " + detail.splitlines()[0][:160], flush=True)
    threads = [threading.Thread(target=job, args=(root,)) for root in roots]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  finally:
    for root in roots:
      shutil.rmtree(os.path.dirname(root), ignore_errors=True)
  for e in errors:
    print("ERROR " + e)
  print(f"{len(killed)} of {len(selected)} mutations killed, {len(survived)} survived, "
        f"{len(errors)} errors, in {time.perf_counter() - start:.0f} s")
  return 1 if survived or errors else 0


if __name__ == "__main__":
  sys.exit(main())
