"""The workload on real accelerators, honestly: attention kernels agree with the einsum
reference, a GPU/TPU manifest on a CPU-only JAX refuses to train, failures are classified
infrastructure (restartable) or user (not), a dead peer makes the survivor exit restartable,
and the contract's line formats (step numbers, header fields, phases) read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from workload_helpers import TEST_XLA_FLAGS, TIMEOUT_SCALE, jax_cache_env, launch, metrics, wait_for_line

from workload.config import load_config, parse_overrides
from xrun_contract import (
    DEFAULT_RESTARTABLE_EXIT_CODES,
    FAILURE_RE,
    PHASE_LINE,
    PHASE_RE,
    PLATFORM_MISMATCH_EXIT_CODE,
    RESTARTABLE_EXIT_CODE,
    STEP_RE,
    Env,
    exit_code_for_signal,
    format_header_fields,
    format_step_line,
    header_fields,
    significant,
)

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------
# Attention kernels


def _qkv(seq: int, dtype="float32"):
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    b, n, kv, h = 2, 4, 2, 16  # grouped: 2 query heads per KV head
    return tuple(jnp.asarray(rng.normal(size=(b, seq, heads, h)), dtype)
                 for heads in (n, kv, kv))


def test_xla_and_splash_kernels_agree_with_einsum_forward_and_backward():
    """jax.nn.dot_product_attention (xla) everywhere; the Pallas TPU splash kernel in the
    Pallas interpreter on CPU (seq 128: its smallest block). cuDNN needs a GPU."""
    import jax

    from workload import attention

    q, k, v = _qkv(128)

    def grads(fn):
        return jax.jit(jax.grad(lambda q, k, v: (fn(q, k, v) ** 2).sum(), argnums=(0, 1, 2)))(q, k, v)

    ref, ref_grads = attention.einsum(q, k, v), grads(attention.einsum)
    kernels = {
        "xla": lambda q, k, v: attention.dot_product(q, k, v, "xla"),
        "splash": lambda q, k, v: attention.splash(q, k, v, interpret=True),
    }
    for name, fn in kernels.items():
        np.testing.assert_allclose(jax.jit(fn)(q, k, v), ref, rtol=1e-5, atol=1e-5, err_msg=name)
        for g, r in zip(grads(fn), ref_grads, strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=name)
    if jax.default_backend() == "gpu":
        qb, kb, vb = (x.astype("bfloat16") for x in (q, k, v))
        np.testing.assert_allclose(
            attention.dot_product(qb, kb, vb, "cudnn").astype("float32"),
            attention.einsum(qb, kb, vb).astype("float32"), atol=2e-2)
    else:
        with pytest.raises(RuntimeError, match="cuDNN is not detected"):
            attention.dot_product(q.astype("bfloat16"), k.astype("bfloat16"),
                                  v.astype("bfloat16"), "cudnn")


def test_model_with_xla_attention_matches_einsum_and_auto_resolves_by_platform():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from workload.attention import resolve
    from workload.model import Transformer

    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
    logits = {}
    for kind in ("einsum", "xla"):
        graphdef, params = nnx.split(Transformer(load_config("tiny", [f"attention={kind}"]),
                                                 nnx.Rngs(0)))
        assert graphdef is not None
        logits[kind] = jax.jit(lambda p, t, g=graphdef: nnx.merge(g, p)(t))(params, tokens)
    np.testing.assert_allclose(logits["xla"], logits["einsum"], rtol=1e-5, atol=1e-5)
    assert resolve("auto", "cpu", "float32", 64) == "einsum"
    assert resolve("auto", "tpu", "bfloat16", 2048) == "splash"
    assert resolve("auto", "tpu", "bfloat16", 100) == "xla"
    assert resolve("auto", "gpu", "bfloat16", 2048) == "cudnn"
    assert resolve("auto", "gpu", "float32", 2048) == "xla"
    assert resolve("einsum", "tpu", "bfloat16", 2048) == "einsum"


def test_attention_config_is_validated_without_jax():
    assert parse_overrides(["attention=splash"]) == {"attention": "splash"}
    with pytest.raises(ValueError, match="attention: unknown 'flash'; allowed: auto, einsum, xla, "
                                         "cudnn, splash"):
        parse_overrides(["attention=flash"])
    with pytest.raises(ValueError, match="splash needs seq_len a multiple of 128"):
        load_config("tiny", ["attention=splash"])
    with pytest.raises(ValueError, match="cudnn needs compute_dtype=bfloat16"):
        load_config("tiny", ["attention=cudnn"])
    assert load_config("1b", ["attention=splash"]).attention == "splash"
    assert load_config("tiny").attention == "auto"


# ---------------------------------------------------------------------------------------
# Exit codes and failure classification


def test_exit_codes_platform_mismatch_is_final_signals_are_restartable():
    assert exit_code_for_signal(signal.SIGKILL) == 137
    assert exit_code_for_signal(signal.SIGABRT) == 134 and exit_code_for_signal(signal.SIGSEGV) == 139
    assert {134, 139, 137, 143, RESTARTABLE_EXIT_CODE} <= set(DEFAULT_RESTARTABLE_EXIT_CODES)
    assert PLATFORM_MISMATCH_EXIT_CODE not in DEFAULT_RESTARTABLE_EXIT_CODES
    assert 1 not in DEFAULT_RESTARTABLE_EXIT_CODES


def _raised(make):
    """An exception as Python raises it (traceback, __context__), not just constructed."""
    try:
        make()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


def test_infrastructure_failures_are_restartable():
    import gcsfs.retry
    from google.api_core import exceptions as gexc
    from jax.errors import JaxRuntimeError

    from workload.failures import classify

    cases = [
        # Coordination service: a peer stopped heartbeating (coordination_service.cc).
        JaxRuntimeError("UNAVAILABLE: The following tasks are unhealthy (stopped sending "
                        "heartbeats):\n/job:jax_worker/replica:0/task:1\nThe tasks have crashed."),
        # A barrier whose peer never came (jax/_src/test_multiprocess.py matches the prefix).
        JaxRuntimeError("DEADLINE_EXCEEDED: Barrier timed out. Id: step_10. # of tasks that "
                        "reached the barrier: 1/2."),
        # A restarted peer reconnecting with a new incarnation.
        JaxRuntimeError("ABORTED: /job:jax_worker/replica:0/task:1 unexpectedly tried to "
                        "connect with a different incarnation. It has likely restarted."),
        # Observed here: a gloo collective when the peer process was SIGKILLed.
        JaxRuntimeError("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/"
                        "pair.cc:538] Read error [127.0.0.1]:8860: Connection reset by peer"),
        # Storage after the clients' own retries.
        gexc.ServiceUnavailable("GET https://storage.googleapis.com/b/o: backend error"),
        gexc.TooManyRequests("rate limit exceeded"),
        gexc.InternalServerError("internal error"),
        gcsfs.retry.HttpError({"code": 503, "message": "Service Unavailable"}),
        gcsfs.retry.HttpError({"code": 429, "message": "Too Many Requests"}),
        # TensorStore's GCS driver after its retries (as measured, see the test below).
        ValueError("ABORTED: All 32 retry attempts failed: backend error "
                   "[http_response_code='503'] [http_response_body='{}']"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out"),
    ]
    for exc in cases:
        verdict = classify(exc)
        assert verdict.kind == "infrastructure" and verdict.restartable, (exc, verdict)

    def wrapped():  # Orbax re-raises inside its own handler: the cause decides
        try:
            raise gexc.ServiceUnavailable("503 backend error")
        except Exception as e:
            raise RuntimeError("Checkpoint save failed") from e

    assert classify(_raised(wrapped)).restartable
    assert classify(ExceptionGroup("async save", [ValueError("x"), TimeoutError()])).restartable


def _tensorstore_gcs_error(status: int, monkeypatch) -> BaseException:
    """The exception TensorStore's GCS driver (what Orbax writes through) raises when the
    server answers ``status`` to everything: a real one, from a server on 127.0.0.1."""
    import http.server
    import threading

    import tensorstore as ts

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self):
            body = json.dumps({"error": {"code": status, "message": "backend error"}}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:1")  # no credentials lookup outside
    context = ts.Context({"gcs_request_retries": {"max_retries": 1, "initial_delay": "10ms",
                                                  "max_delay": "20ms"}})
    try:
        store = ts.KvStore.open({"driver": "gcs", "bucket": "xrun-bucket"}, context=context).result()
        store.write("ckpt/8/manifest.ocdbt", b"x").result()
    except Exception as e:  # noqa: BLE001
        return e
    finally:
        server.shutdown()
    raise AssertionError("TensorStore wrote to a server that answers only errors")


def test_tensorstore_gcs_errors_after_retries(monkeypatch):
    from workload.failures import classify

    for status, kind in ((503, "infrastructure"), (429, "infrastructure"), (403, "user")):
        exc = _tensorstore_gcs_error(status, monkeypatch)
        assert f"http_response_code='{status}'" in str(exc)
        assert classify(exc).kind == kind, (status, str(exc))


def test_user_failures_are_not_restartable():
    import gcsfs.retry
    from google.api_core import exceptions as gexc

    from workload.failures import classify

    def shape_bug():
        import jax.numpy as jnp

        jnp.ones((2, 3)) @ jnp.ones((4, 5))

    cases = [
        _raised(shape_bug),  # TypeError from jax: the user's model
        ValueError("global batch 6 does not split over 4 devices"),
        FileNotFoundError(2, "No such file or directory", "/data/tokens.bin"),
        KeyError("params"),
        gexc.NotFound("bucket does not exist"),
        gexc.Forbidden("no storage.objects.create permission"),
        gcsfs.retry.HttpError({"code": 404, "message": "Not Found"}),
        ZeroDivisionError("division by zero"),
    ]
    for exc in cases:
        verdict = classify(exc)
        assert verdict.kind == "user" and not verdict.restartable, (exc, verdict)


# ---------------------------------------------------------------------------------------
# Processes


def test_gpu_manifest_on_cpu_only_jax_refuses_to_train(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.update({"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", Env.PLATFORM: "gpu",
                Env.ACCELERATOR: "h100-80gb-8", Env.DEVICES_PER_HOST: "8",
                Env.STORAGE: str(tmp_path), Env.RUN_NAME: "gpu"})
    t0, cpu0 = time.monotonic(), _children_cpu()
    r = subprocess.run([sys.executable, "-m", "workload.train", "--preset", "tiny"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    assert r.returncode == PLATFORM_MISMATCH_EXIT_CODE, r.stderr[-3000:]
    line = next(x for x in r.stderr.splitlines() if x.startswith("xrun: asked for"))
    assert line.startswith("xrun: asked for gpu (XRUN_ACCELERATOR=h100-80gb-8) but JAX found "
                           "only cpu devices: 1 x cpu:cpu (JAX_PLATFORMS=cpu)")
    assert "Traceback" not in r.stderr and not STEP_RE.search(r.stdout)
    records = metrics(tmp_path, "gpu")
    assert records[-1]["kind"] == "end" and records[-1]["failure"] == "platform"
    assert records[-1]["exit_code"] == PLATFORM_MISMATCH_EXIT_CODE
    assert not (tmp_path / "runs/gpu/checkpoints").exists()
    # Refused at once: its time went into work (imports, finding the devices), not a wait.
    # The bound scales with the CPU seconds the process used (a loaded machine stretches
    # both), so load cannot break it while a hang of a minute still does.
    assert wall < 20 + 8 * cpu, (wall, cpu)


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def test_dead_peer_makes_the_survivor_exit_restartable(tmp_path):
    # The reference run's program (tiny, steps=10: same schedule, so the session's
    # compilation cache serves it); slowed steps leave seconds to kill mid-run.
    hosts = launch("peer", tmp_path, tmp_path / "logs",
                   args=("--preset", "tiny", "steps=10", "checkpoint_every=0"),
                   XRUN_TEST_STEP_DELAY="0.4")
    try:
        wait_for_line(hosts[0], "completed step: 2,")
        hosts[1].signal(signal.SIGKILL)
        t0 = time.monotonic()
        try:
            code = hosts[0].wait(timeout=30)
        except subprocess.TimeoutExpired:
            hosts[0].signal(signal.SIGUSR1)  # faulthandler: every thread's stack to the log
            time.sleep(2)
            raise AssertionError("survivor did not exit:\n" + hosts[0].output()[-8000:]) from None
        waited = time.monotonic() - t0
    finally:
        for h in hosts:
            h.signal(signal.SIGKILL)
            h.proc.wait(timeout=30)
    out = hosts[0].output()
    assert code == RESTARTABLE_EXIT_CODE, out[-3000:]
    assert waited < 30
    m = FAILURE_RE.search(out)
    assert m and m["kind"] == "infrastructure" and m["code"] == "42", out[-2000:]
    end = metrics(tmp_path, "peer")[-1]
    assert end["kind"] == "end" and end["failure"] == "infrastructure" and end["exit_code"] == 42
    wl = json.loads((tmp_path / "runs/peer/run.json").read_text())["workload"]
    assert wl["failure"] == "infrastructure" and wl["exit_code"] == 42


# ---------------------------------------------------------------------------------------
# Line formats


def test_step_line_has_significant_digits_and_parses():
    assert significant(0.0012345) == "0.001234" and significant(12.3456) == "12.35"
    assert significant(123456.7) == "123457" and significant(0.0) == "0"
    assert significant(float("nan")) == "nan" and significant(-0.5) == "-0.5000"
    line = format_step_line(7, 0.01694, 0.00123, 30220.4, 512, 5.63141)
    assert line == ("completed step: 7, seconds: 0.01694, TFLOP/s/device: 0.001230, "
                    "Tokens/s/device: 30220, total_weights: 512, loss: 5.6314")
    m = STEP_RE.search(line)
    assert (m["step"], float(m["seconds"]), float(m["tflops"]), float(m["loss"])) == (
        "7", 0.01694, 0.00123, 5.6314)


def test_header_fields_and_phase_lines_read_back():
    fields = {"jax": "0.10.2", "device_kind": "TPU v6 lite", "mesh": '{"data":1,"fsdp":4}',
              "image": ""}
    text = format_header_fields(fields)
    assert text == 'jax=0.10.2 device_kind=TPU_v6_lite mesh={"data":1,"fsdp":4}'
    assert header_fields("versions", text) == {"jax": "0.10.2", "device_kind": "TPU_v6_lite",
                                               "mesh": '{"data":1,"fsdp":4}'}
    assert header_fields("jax", "0.10.2") == {"jax": "0.10.2"}  # one key per line: older logs
    m = PHASE_RE.search(PHASE_LINE.format(activity="restoring step 40", seconds=5.1))
    assert (m["activity"], m["step"], m["seconds"]) == ("restoring", "40", "5.100")
    m = PHASE_RE.search(PHASE_LINE.format(activity="initializing distributed", seconds=1.25))
    assert (m["activity"], m["step"]) == ("initializing distributed", None)


def test_tensorboard_files_per_flush_and_restarts_replace_redone_steps(tmp_path):
    """Complete event files per flush (no appends); TensorBoard's reader sees every file of
    the folder; a restarted attempt's SessionLog.START drops the steps it redoes."""
    from tensorboard.compat.proto import event_pb2
    from workload_helpers import tensorboard_scalars

    from workload.tensorboard import EventWriter
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    store = open_storage(str(tmp_path))
    first = EventWriter(store, "tb", attempt=0, interval=3600)
    for step in range(1, 7):
        first.scalars(step, {"learning/loss": 10.0 - step})
        if step == 3:
            first.flush()
    first.close()
    time.sleep(1.0)  # the next attempt's files sort after (seconds in the name)
    second = EventWriter(store, "tb", attempt=1, interval=3600)
    for step in range(5, 9):
        second.scalars(step, {"learning/loss": 100.0 + step})
    second.close()
    folder = tmp_path / Layout.tensorboard("tb")
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 3 and all(".tfevents." in f for f in files)
    data = (folder / files[0]).read_bytes()
    length = int.from_bytes(data[:8], "little")
    head = event_pb2.Event.FromString(data[12:12 + length])
    assert head.file_version == "brain.Event:2"
    loss = tensorboard_scalars(str(folder))["learning/loss"]
    assert loss == {1: 9.0, 2: 8.0, 3: 7.0, 4: 6.0, 5: 105.0, 6: 106.0, 7: 107.0, 8: 108.0}


_SPLASH_TRAINING = """
import json, numpy as np, jax
from workload.config import load_config
from workload.distributed import make_mesh
from workload.train import Program
from workload import data

mesh = make_mesh(1)
out = {}
for kind in ("einsum", "splash"):
    cfg = load_config("tiny", ["seq_len=128", f"attention={kind}"])
    program = Program(cfg, mesh, 8)
    source = data.make_source("synthetic", "uint16", 0, cfg.seq_len, cfg.vocab_size)
    state, losses = program.init(), []
    for step in range(3):
        batch = data.make_batch(source, step * 8, 8, cfg.seq_len, program.batch_sharding)
        state, o = program.train_step(state, batch)
        losses.append(float(o["loss"]))
    out[kind] = losses
print(json.dumps(out))
"""


def test_splash_inside_fsdp_training_matches_einsum():
    """The splash kernel (Pallas interpreter on CPU) in the real train step: shard_map over
    the batch on a 4-device FSDP mesh, under scan and grad; same losses as einsum."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",  # compiled as the hosts of tests are
               XLA_FLAGS=f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count=4",
               **jax_cache_env())
    r = subprocess.run([sys.executable, "-c", _SPLASH_TRAINING], env=env, capture_output=True,
                       text=True, timeout=300 * TIMEOUT_SCALE, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    losses = json.loads(r.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(losses["splash"], losses["einsum"], rtol=1e-5)
    assert losses["einsum"][2] < losses["einsum"][0]


@pytest.mark.parametrize("env,expected", [
    # One process started by xrun on a TPU VM whose metadata server does not answer.
    ({Env.COORDINATOR_ADDRESS: "127.0.0.1:1", "TPU_WORKER_HOSTNAMES": "localhost"}, None),
    # `python -m workload.train` by hand on a single-host TPU VM.
    ({"TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "true"}, None),
    # Two processes from xrun: xrun's env only, never JAX's own detection.
    ({Env.COORDINATOR_ADDRESS: "10.0.0.2:8476", Env.HOSTS_PER_SLICE: "2", Env.HOST_INDEX: "0",
      "TPU_WORKER_HOSTNAMES": "a,b"},
     {"coordinator_address": "10.0.0.2:8476", "num_processes": 2, "process_id": 0,
      "cluster_detection_method": "deactivate"}),
    # A multi-host TPU VM outside xrun: JAX's detection, as its docs run it.
    ({"TPU_WORKER_HOSTNAMES": "a,b"}, {}),
], ids=["xrun-one-process", "tpu-vm-one-host", "xrun-two-hosts", "tpu-vm-two-hosts"])
def test_a_single_process_starts_no_distributed_service(monkeypatch, env, expected):
    """#37: a single-process run must not call jax.distributed.initialize(), which on a TPU VM
    asks the metadata server; several processes from xrun use xrun's env alone."""
    import jax

    from workload.distributed import Cluster, initialize

    for k in [k for k in os.environ if k.startswith(("XRUN_", "TPU_"))]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    calls: list[dict] = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr("workload.distributed.wait_for_coordinator", lambda *a, **k: None)
    started = initialize(Cluster.from_env())
    assert calls == ([] if expected is None else [expected])
    assert started is (expected is not None)
