"""Every config key jaxnet reads, with its default. Config files start from here.

A config file (configs/*.py) defines `get_config()` that calls `base_config()`
and overrides what its recipe needs. The returned dict is locked by the command
line, so an override of a key that does not exist (a typo) is an error.
"""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.batch_size = 256               # global, over all devices and hosts
  c.grad_accum_steps = 1           # > 1: each step sums the gradients of this many micro-batches
                                   # of batch_size / grad_accum_steps (less memory, same update)
  c.total_steps = 0                # > 0 caps the run; 0 means num_epochs
  c.num_epochs = 1.0
  c.image_size = 224
  # ((fraction_of_training, image_size), ...): train at smaller sizes early on.
  # Empty: always image_size. Evaluation always uses image_size.
  c.progressive_resizing = ()
  c.precision = "fp32"             # fp32 | bf16 | fp16
  c.label_smoothing = 0.0
  c.ema_decay = 0.0                # 0: no EMA of params (and no copy of them in the state); eval uses EMA params when on

  c.log_every_steps = 100
  c.eval_every_steps = 0           # 0: only the final eval
  c.eval_every_epochs = 0.0        # used when eval_every_steps is 0; both 0: only the final eval
  c.checkpoint_every_steps = 1000  # 0: only the final checkpoint
  c.checkpoint_every_epochs = 0.0  # used when checkpoint_every_steps is 0 (jaxnet/durations.py)
  c.keep_checkpoints = 3
  c.async_checkpointing = True
  # (first, last): trace steps first..last (1-based) with jax.profiler into
  # WORKDIR/tensorboard for TensorBoard's profile plugin. Empty: no trace.
  c.profile_steps = ()

  c.model = ml_collections.ConfigDict()
  c.model.name = "resnet50"
  c.model.num_classes = 0          # the classifier's width; 0: the dataset's class count
                                   # (a wider head is allowed, a narrower one is an error)
  c.model.bn_momentum = 0.9
  c.model.bn_epsilon = 1e-5
  c.model.bn_group_size = 0        # BN statistics over groups of this many devices; 0 = global batch
                                   # (the model gets it as bn_num_groups = devices / this)
  c.model.zero_init_last_bn = True
  c.model.freeze_bn_stats = False  # True: training too normalises with (and keeps) the BN running
                                   # statistics, e.g. to fine-tune with small batches

  # Initial weights (fine-tuning); used only when a run starts, never on resume.
  c.init = ml_collections.ConfigDict()
  c.init.weights = ""              # "": random init | FILE.safetensors | FILE.pth (needs torch) |
                                   # a jaxnet WORKDIR | hf-hub:timm/NAME (needs huggingface_hub)
  c.init.keep_head = True          # keep the source's classifier if its class count matches;
                                   # a different count always re-initialises it
  c.init.preprocessing = "weights"  # weights: data.mean/std/eval_crop_fraction/eval_interpolation
                                   # become what the weights expect | config: keep the config's
  # The bn_* and zero_init keys apply to models with batch norm (ResNets) and are
  # not passed to the others (AlexNet, ViT); bn_group_size != 0 there is an error.
  c.model.vit_flavour = "timm"     # ViTs: timm (class token, learned position embedding)
                                   # | plain (big_vision: global average pool, sin-cos)

  c.data = ml_collections.ConfigDict()
  c.data.source = "synthetic"      # digits | synthetic | imagefolder | tfds
  c.data.dir = ""                  # ImageFolder root or tfds data_dir
  c.data.name = "imagenet2012"     # tfds dataset name
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.data.workers = 0               # Grain worker processes (0: decode in the main process)
  c.data.read_threads = 0          # threads per worker reading records ahead; 0 reads inline,
                                   # cheapest from local disk; raise to ~16 for GCS/NFS
  c.data.eval_batch_size = 0       # 0: batch_size
  c.data.eval_crop_fraction = 0.875  # eval: resize to image_size / this, center-crop image_size
  c.data.eval_interpolation = "bilinear"  # eval resize filter (antialiased): bilinear | bicubic
  c.data.num_classes = 1000        # synthetic only: how many classes its labels draw from
  c.data.synthetic_size = 10_000   # synthetic only: examples per epoch
  c.data.mean = (0.485, 0.456, 0.406)  # per-channel, of pixels in [0, 1]
  c.data.std = (0.229, 0.224, 0.225)
  c.data.prefetch = 2              # batches placed on the devices ahead of the step
  c.data.randaug_num_ops = 0       # RandAugment: ops per train image (0: off); in the Grain
  c.data.randaug_magnitude = 10    # workers, on uint8 images; magnitude of 0..10

  # Mixup / CutMix, on the device inside the train step (soft targets); off by default.
  c.mix = ml_collections.ConfigDict()
  c.mix.mixup_alpha = 0.0          # Beta(alpha, alpha) mixing ratio; 0 turns mixup off
  c.mix.cutmix_alpha = 0.0         # 0 turns CutMix off
  c.mix.prob = 1.0                 # chance that a batch is mixed
  c.mix.switch_prob = 0.5          # with both on: chance of CutMix instead of mixup

  c.optim = ml_collections.ConfigDict()
  c.optim.name = "sgd"             # sgd | lars | adamw
  c.optim.learning_rate = 0.1      # peak LR at base_batch_size; scaled linearly with batch_size
  c.optim.base_batch_size = 256
  c.optim.schedule = "cosine"      # cosine | linear | poly2 | constant
  c.optim.warmup_epochs = 0.0
  c.optim.warmup_steps = 0         # overrides warmup_epochs when > 0
  c.optim.end_lr_fraction = 0.0
  c.optim.momentum = 0.9
  c.optim.nesterov = True
  c.optim.weight_decay = 5e-5      # conv/dense kernels only: not BN, LayerNorm, biases, embeddings
  c.optim.b1 = 0.9                 # adamw
  c.optim.b2 = 0.999               # adamw
  c.optim.mu_dtype = ""            # adamw: dtype of the first moment, e.g. "bfloat16"; "" = params'
  c.optim.grad_clip_norm = 0.0

  c.loss_scale = ml_collections.ConfigDict()  # fp16 only
  c.loss_scale.initial_scale = 2.0**15
  c.loss_scale.growth_interval = 2000

  c.mesh = ml_collections.ConfigDict()
  c.mesh.num_devices = 0           # 0: every device of every host
  # FSDP (jaxnet/fsdp.py, docs/scaling.md): params, gradients, optimizer state and EMA split
  # over devices instead of copied to each; for models whose state does not fit one device.
  c.mesh.fsdp = False
  c.mesh.fsdp_devices = 0          # devices each tensor is split over; 0: all. k: split within
                                   # groups of k consecutive devices (one host's), copied across
  c.mesh.fsdp_min_size = 2**18     # tensors with fewer elements (biases, norms) stay replicated

  c.distributed = ml_collections.ConfigDict()  # multi-host; see docs/multihost.md
  c.distributed.enabled = "auto"   # auto (Slurm / coordinator set) | true | false
  c.distributed.coordinator_address = ""
  c.distributed.num_processes = 0
  c.distributed.process_id = -1
  c.distributed.local_device_ids = ""
  c.distributed.heartbeat_timeout_sec = 100.0  # a process silent this long counts as dead: the
                                   # others stop with one line naming it (jaxnet/peers.py);
                                   # jax's own heartbeat timeout is set to twice this
  return c

